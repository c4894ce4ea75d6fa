# SmolLM2-135M (hf:HuggingFaceTB/SmolLM2-135M, a Llama: 30 layers, 576 wide, 9 query / 3 key-value heads, SwiGLU
# 1536, rotary theta 1e5, tied head, 49,152 ids) adapted into AO-GPT: cond='adaln' starts the AdaLN Linears at zero
# with their gates open, so at step 0 the model computes exactly SmolLM2's distribution in every order, then learns
# to read the target position. The shape comes from the source (leave the model keys out). On one 80 GB GPU,
# bf16 autocast, compiled, the loss's head in chunks of 2,048 rows: about 33 GB by bench/memory_budget.py
# (docs/training.md, "Adapting a source model on one GPU"). Not run at this size yet.
#   python data/openwebtext/prepare.py --tokenizer=hf:HuggingFaceTB/SmolLM2-135M --eot_token='<|endoftext|>'
#   python train.py config/adapt_smollm2_135m.py
init_from = 'hf:HuggingFaceTB/SmolLM2-135M'
dataset = 'openwebtext_SmolLM2-135M'  # prepare.py's out_dir for this tokenizer
out_dir = 'out-smollm2-135m'
wandb_run_name = 'ao-smollm2-135m'
cond = 'adaln'
block_size = 1024  # the training length; the model keeps SmolLM2's positions (config.json: 8,192)
# 32 x 1024 x 16 micro-steps = 524,288 tokens per step, the card's, on one GPU
batch_size = 32
gradient_accumulation_steps = 16
loss_chunk = 2048  # 2,048 x 49,152 logits at a time, not 32,768 x 49,152 (about 25 GB less at the peak)
# AdaLN as a table of SmolLM2's 8,192 target positions (+ none), fewer than the 32,768 tokens of a micro-step: less work and
# 17 GB less activation memory than per token (bench/memory_budget.py); Qwen3's 40,961 positions are not
adaln_table = True
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
