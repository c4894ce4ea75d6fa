# Baseline: the left-to-right GPT-2 Small architecture (layer norm, tied head, tanh GELU, no QK-norm),
# trained with the same data, optimizer and schedule as AO-GPT-Small.
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_small.py
out_dir = 'out-gpt2-small'
wandb_run_name = 'gpt2-small'
cond = 'none'
order = 'l2r'
norm = 'layer'
qk_norm = False
tie_head = True
head_bias = False
gelu = 'tanh'
