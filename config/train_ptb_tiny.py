# A tiny AO-GPT on the embedded Penn Treebank corpus with GPT-2 BPE, on a laptop CPU.
#   python data/ptb/prepare.py && python train.py config/train_ptb_tiny.py
# 240 steps of 16 x 128 tokens, about 5 minutes on 2 idle CPU cores (results/notes.md): the 50k-token
# head is most of the cost at this width. Cores shared with other work make it several times longer. Random orders learn much more slowly than left to right (the paper's Finding 1),
# so this short run uses sigma-GPT's curriculum: all sequences L2R at first, then linearly down to the
# paper's 10% L2R at the end.
out_dir = 'out-ptb-tiny'
wandb_run_name = 'ao-gpt-ptb-tiny'
dataset = 'ptb'
n_layer = 4
n_head = 4
n_embd = 128
target_dim = 64
block_size = 128
batch_size = 16
gradient_accumulation_steps = 1
max_iters = 240
lr_decay_iters = 240
warmup_iters = 20
learning_rate = 2e-3  # small models take a larger step; 3e-3 was unstable on random orders
min_lr = 2e-4
weight_decay = 0.1
ema_decay = 0.99
order = 'l2r'
l2r_frac_end = 0.1  # the L2R weight moves from 1 (l2r) to 0.1 (the paper's mix) at lr_decay_iters
eval_interval = 80
eval_iters = 8  # 128 val windows, 16k tokens
eval_orders = 2
log_interval = 20
