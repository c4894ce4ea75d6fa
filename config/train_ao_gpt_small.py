# AO-GPT-Small (paper Table 4): 12 layers, 12 heads, 768 wide, context 1024, OpenWebText, 10% L2R orders.
# These are train.py's defaults, spelled out. One node of 8 GPUs:
#   torchrun --standalone --nproc_per_node=8 train.py config/train_ao_gpt_small.py
out_dir = 'out'  # train.py's default, where eval_ppl.py and sample.py look unless told otherwise
wandb_run_name = 'ao-gpt-small'
dataset = 'openwebtext'
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
# ~0.5M tokens per step: 16 x 1024 x 32 micro-steps over all ranks (4 per GPU on 8 GPUs). The paper's
# released code used 64 micro-steps (1M tokens/step); the paper's text says 0.5M.
batch_size = 16
gradient_accumulation_steps = 32
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 2000
max_iters = 500000
lr_decay_iters = 500000
weight_decay = 0.05
beta1 = 0.9
beta2 = 0.95
ema_decay = 0.9999
order = 'mix:0.1*l2r+0.9*random'  # each sequence takes the L2R order with probability 0.1, else a uniform random order
# dtype 'auto' = bfloat16 autocast on CUDA
# AdaLN as a per-position table, gathered: the same parameters and function, faster and +5.9% activation
# memory over the GPT instead of +21% (BENCHMARKS.md, training on one H100)
adaln_table = True
