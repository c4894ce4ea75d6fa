# Order experiment (paper Fig. 1/2a): AO-GPT-Small trained on one kind of order for 20k steps of ~0.5M
# tokens, LR 6e-4 held nearly constant after warmup (lr_decay_iters 500k, as in the paper's configs).
#   torchrun --standalone --nproc_per_node=8 train.py config/train_order_random.py
out_dir = 'out-order-random'
wandb_run_name = 'order-random'
order = 'random'  # pure uniform random orders (the default mixes in 10% L2R)
max_iters = 20000
eval_interval = 1000
