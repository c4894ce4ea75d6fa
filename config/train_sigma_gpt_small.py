# Baseline: sigma-GPT Small, as the paper re-implemented it: GPT-2's blocks (layer norm, tied head, no
# QK-norm, exact GELU) with a full-width target-position embedding added at the input, trained on
# uniform random orders. sigma-GPT's L2R -> random curriculum: --order=l2r --l2r_frac_end=0.0
#   torchrun --standalone --nproc_per_node=8 train.py config/train_sigma_gpt_small.py
out_dir = 'out-sigma-gpt-small'
wandb_run_name = 'sigma-gpt-small'
cond = 'sigma'
order = 'random'
norm = 'layer'
qk_norm = False
tie_head = True
head_bias = False
