# Qwen3-8B (hf:Qwen/Qwen3-8B: 36 layers, 4096 wide, 32 query / 8 key-value heads of 128, SwiGLU 12288, rotary theta
# 1e6, q/k norms, untied head, 151,936 ids) adapted into AO-GPT (cond='adaln': exactly Qwen3-8B at step 0, in every
# order), on one node of 8 x 80 GB GPUs. One GPU cannot hold it: the float32 weights, gradients, AdamW's moments and
# the EMA are 166 GB. fsdp=True cuts them into 8 shards (21 GB a GPU) and activation_checkpointing recomputes each
# block in backward: about 42 GB a GPU by bench/memory_budget.py (docs/training.md, "Past one GPU"). Each rank reads
# only its rows of the weights. Not run at this size yet.
#   python data/openwebtext/prepare.py --tokenizer=hf:Qwen/Qwen3-8B --eot_token='<|endoftext|>'
#   torchrun --standalone --nproc_per_node=8 train.py config/adapt_qwen3_8b.py
# Two nodes (16 GPUs, the same tokens per step; out_dir on a filesystem both nodes write), on each node:
#   torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 train.py config/adapt_qwen3_8b.py
init_from = 'hf:Qwen/Qwen3-8B'
dataset = 'openwebtext_Qwen3-8B'  # prepare.py's out_dir for this tokenizer (uint32 ids)
out_dir = 'out-qwen3-8b'
wandb_run_name = 'ao-qwen3-8b'
cond = 'adaln'
fsdp = True
activation_checkpointing = True
block_size = 2048  # the training length; the model keeps Qwen3's 40,960 positions
# 8 x 2048 x 32 micro-steps = 524,288 tokens per step, the card's: 4 micro-steps on each of 8 GPUs (2 on 16)
batch_size = 8
gradient_accumulation_steps = 32
loss_chunk = 1024  # 1,024 x 151,936 logits at a time, not 16,384 x 151,936 (about 39 GB less at the peak)
adaln_table = False  # per token: a table would compute Qwen3's 40,961 target positions per block per micro-step
dtype = 'bfloat16'  # FSDP computes from bfloat16 copies of its float32 shards, and reduces in float32
compile = True
# a fine-tune: lower than the 0.6B config's, a guess for this size (not measured), with its warmup and length
learning_rate = 3e-5
min_lr = 3e-6
warmup_iters = 500
max_iters = 20000
lr_decay_iters = 20000
eval_interval = 1000
# finding 11's recipe (results/README.md), as config/adapt_qwen3_0p6b.py carries it, its warmup over this window
target_std = 1.0
order_warmup = 'semiar:1:2048'
order_warmup_iters = 1000
