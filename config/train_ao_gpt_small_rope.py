# AO-GPT-Small (config/train_ao_gpt_small.py, the paper's card) on the Llama/Qwen block: rotary positions instead of
# wpe (each slot's q and k turned by its own position + 1, [None]'s by 0), a SwiGLU MLP 2048 wide (8/3 x 768 rounded
# up to 64: about the 4d GELU MLP's parameters), grouped-query attention with 4 key/value heads (a KV cache a third
# the size), no biases; qk_norm and RMSNorm as the card. Everything else is the card's. Not run at this size yet.
#   torchrun --standalone --nproc_per_node=8 train.py config/train_ao_gpt_small_rope.py
out_dir = 'out-rope'
wandb_run_name = 'ao-gpt-small-rope'
adaln_table = True  # as the card
pos = 'rope'
mlp = 'swiglu'
mlp_hidden = 2048
n_kv_head = 4
bias = False
