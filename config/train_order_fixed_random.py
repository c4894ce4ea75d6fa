# Order experiment (paper Fig. 1/2a): AO-GPT-Small trained on one kind of order for 20k steps of ~0.5M
# tokens, LR 6e-4 held nearly constant after warmup (lr_decay_iters 500k, as in the paper's configs).
#   torchrun --standalone --nproc_per_node=8 train.py config/train_order_fixed_random.py
out_dir = 'out-order-fixed_random'
wandb_run_name = 'order-fixed_random'
order = 'fixed:0'  # the permutation of seed 0 (saved in the checkpoint); the paper ran three, e.g. fixed:0, 1, 2
max_iters = 20000
eval_interval = 1000
