# AO-GPT-Medium (paper Table 4): 24 layers, 16 heads, 1024 wide; otherwise as AO-GPT-Small.
#   torchrun --standalone --nproc_per_node=8 train.py config/train_ao_gpt_medium.py
out_dir = 'out-ao-gpt-medium'
wandb_run_name = 'ao-gpt-medium'
n_layer = 24
n_head = 16
n_embd = 1024
learning_rate = 3e-4
min_lr = 6e-5  # as in the paper's code (not lr/10)
adaln_table = True  # as in train_ao_gpt_small.py: the same function, less activation memory
