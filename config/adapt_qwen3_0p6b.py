# Qwen3-0.6B (hf:Qwen/Qwen3-0.6B: 28 layers, 1024 wide, 16 query / 8 key-value heads of 128, SwiGLU 3072, rotary
# theta 1e6, q/k norms, tied head, 151,936 ids) adapted into AO-GPT: cond='adaln' starts the AdaLN Linears at zero
# with their gates open, so at step 0 the model computes exactly Qwen3's distribution in every order, then learns
# to read the target position. The shape comes from the source (leave the model keys out). On one 80 GB GPU,
# bf16 autocast, compiled, the loss's 151,936-wide head in chunks of 1,024 rows: about 44 GB by
# bench/memory_budget.py (docs/training.md, "Adapting a source model on one GPU"). Not run at this size yet.
#   python data/openwebtext/prepare.py --tokenizer=hf:Qwen/Qwen3-0.6B --eot_token='<|endoftext|>'
#   python train.py config/adapt_qwen3_0p6b.py
init_from = 'hf:Qwen/Qwen3-0.6B'
dataset = 'openwebtext_Qwen3-0.6B'  # prepare.py's out_dir for this tokenizer (uint32 ids)
out_dir = 'out-qwen3-0p6b'
wandb_run_name = 'ao-qwen3-0p6b'
cond = 'adaln'
block_size = 1024  # the training length; the model keeps Qwen3's 40,960 positions
# 8 x 1024 x 64 micro-steps = 524,288 tokens per step, the card's, on one GPU
batch_size = 8
gradient_accumulation_steps = 64
loss_chunk = 1024  # 1,024 x 151,936 logits at a time, not 8,192 x 151,936 (about 18 GB less at the peak)
# per-token AdaLN: a table would compute all 40,961 target positions per block per micro-step, 5x the 8,192 tokens,
# and hold more (51 GB in all instead of 44: bench/memory_budget.py --adaln_table=True)
adaln_table = False
dtype = 'bfloat16'
compile = True
# a fine-tune: a tenth of the card's peak, a shorter warmup and run (10B tokens)
learning_rate = 6e-5
min_lr = 6e-6
warmup_iters = 500
max_iters = 20000
lr_decay_iters = 20000
eval_interval = 1000
# finding 11's recipe (results/README.md): the target table drawn at std 1 (the Linears still zero: exact at step 0)
# and a semi-AR warmup whose block grows 1 -> the whole window before the paper's orders. At the findings' scale it
# reached the paper-default scratch AO-GPT's loss in 0.25x its steps (the same keys help scratch as much); its
# length here (1,000 steps, 100 a doubling) is a guess, not measured at this size.
target_std = 1.0
order_warmup = 'semiar:1:1024'
order_warmup_iters = 1000
