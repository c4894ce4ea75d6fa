# The demo model: a tiny AO-GPT on the embedded Penn Treebank corpus (GPT-2 BPE), on a laptop CPU.
#   python data/ptb/prepare.py && python train.py config/train_ptb_tiny.py
# About 4 minutes on 2 CPU cores; the 50k-token head dominates the cost at this width.
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
learning_rate = 3e-3  # small models take a larger step
min_lr = 3e-4
weight_decay = 0.1
ema_decay = 0.99
eval_interval = 80
eval_iters = 8  # 128 val windows, 16k tokens
eval_orders = 2
log_interval = 20
