# make demo's model: a tiny AO-GPT (10% L2R, EMA) on character-level Penn Treebank, a few CPU minutes.
#   python data/ptb/prepare.py --char=True && python train.py config/train_demo.py
# Small, with many steps, on purpose: an any-order model sits at the unigram loss until it has learned
# to match target positions to context positions, which takes ~1000-1500 optimizer steps here. On GPT-2
# BPE the 50k-way head makes each step far dearer: config/train_ptb_tiny.py affords 240 steps, and
# its any-order loss is still at the unigram level there. About 3 minutes on 2 idle CPU cores.
out_dir = 'out-demo'
wandb_run_name = 'ao-gpt-demo'
dataset = 'ptb_char'
n_layer = 2
n_head = 4
n_embd = 64
target_dim = 32
block_size = 64
batch_size = 32  # 2,048 characters per step
gradient_accumulation_steps = 1
max_iters = 5000
lr_decay_iters = 5000
warmup_iters = 100
learning_rate = 3e-3  # small models take a larger step
min_lr = 3e-4
weight_decay = 0.1
ema_decay = 0.99
eval_interval = 1000
eval_iters = 8  # 256 val windows, 16k characters
eval_orders = 2
log_interval = 100
