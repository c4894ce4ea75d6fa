"""
The memory budget per GPU of training an adapted source model (config/adapt_*.py), from its shape alone (no
download): weights, gradients, AdamW's two moments and the EMA, all float32, from the parameter count; the
activations from what autograd saves for backward, counted on this CPU under bfloat16 autocast (the storages the
saved tensors hold, once each) for 1 and 2 blocks at 1 and 2 rows of block_size tokens: a block's bytes per token,
and what it saves once whatever the batch (its weights' bfloat16 copies); and the loss's head at loss_chunk rows against all of them (bench/loss_memory.py
measured a step's peak there at about 4.2 times the float32 logits: the logits, log-softmax's output, their
gradients). Eager torch: torch.compile saves less (it recomputes cheap elementwise ops), so this is an upper bound.

Past one GPU (--fsdp=True, train.py's FSDP2 over --world GPUs): the float32 weights, gradients, moments and EMA are
cut into world shards; what a rank gathers to compute is counted beside them: the root's weights (embedding, head)
in bfloat16 through the whole step with their bfloat16 gradients until the reduce-scatter, and three blocks' worth
of bfloat16 (the running block's weights, the next one's prefetched, one block's gradients); the autocast copies of
the weights are then not made (the weights are bfloat16 already). --activation_checkpointing=True: autograd keeps
only each block's input (its residual stream, float32 under autocast, bfloat16 under FSDP), plus one block's whole
activations while it is recomputed.

    python bench/memory_budget.py --source=qwen3_0p6b --batch_size=8 --loss_chunk=1024
    python bench/memory_budget.py --source=smollm2_135m --batch_size=32 --loss_chunk=2048 --adaln_table=True
    python bench/memory_budget.py --source=qwen3_8b --world=8 --fsdp=True --activation_checkpointing=True
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from aogpt.configurator import configure, print_config  # noqa: E402
from aogpt.errors import exit_in_one_line  # noqa: E402
from bench.common import check_settings  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

# the sources' shapes (their config.json), as aogpt/families.py reads them, adapted to cond='adaln'
BLOCK = dict(pos='rope', mlp='swiglu', bias=False, norm='rms', tie_head=True, head_bias=False, cond='adaln')
SOURCES = {
    'qwen3_0p6b': dict(n_layer=28, n_embd=1024, n_head=16, n_kv_head=8, head_dim=128, mlp_hidden=3072,
                       vocab_size=151936, block_size=40960, qk_norm=True, rope_theta=1e6, norm_eps=1e-6),
    'smollm2_135m': dict(n_layer=30, n_embd=576, n_head=9, n_kv_head=3, mlp_hidden=1536, vocab_size=49152,
                         block_size=8192, qk_norm=False, rope_theta=1e5),
    'qwen3_8b': dict(n_layer=36, n_embd=4096, n_head=32, n_kv_head=8, head_dim=128, mlp_hidden=12288,
                     vocab_size=151936, block_size=40960, qk_norm=True, rope_theta=1e6, norm_eps=1e-6, tie_head=False),
    'llama3_8b': dict(n_layer=32, n_embd=4096, n_head=32, n_kv_head=8, mlp_hidden=14336, vocab_size=128256,
                      block_size=131072, qk_norm=False, rope_theta=5e5, tie_head=False,
                      rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                        original_max_position_embeddings=8192)),
}
source = 'qwen3_0p6b'
batch_size = 8               # sequences per micro-step
block_size = 1024            # the training length
loss_chunk = 1024            # rows of the head + cross-entropy at a time (0: all)
adaln_table = False          # AdaLN per target position, gathered (train.py's key)
ema = True                   # train.py's EMA of the weights (ema_decay > 0): one more float32 copy
world = 1                    # GPUs the run spans (torchrun ranks)
fsdp = False                 # train.py's fsdp: weights, gradients, moments and EMA cut into world shards
activation_checkpointing = False  # train.py's: each block recomputed in backward, keeping only its input
seed = 0
exit_in_one_line()  # from here on a UserError is its one line, not a traceback
config = configure(globals())
print_config(config)
check_settings(config, at_least=dict(batch_size=1, block_size=2, loss_chunk=0, world=1),
               one_of=dict(source=tuple(SOURCES)))


def saved_bytes(n_layer, rows):
    """Bytes autograd saves for backward in the trunk (embedding, n_layer blocks, final norm) on rows of
    block_size tokens in random orders, under bfloat16 autocast: each storage once. (A small vocabulary: the
    embedding saves only the ids.)"""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**dict(BLOCK, **dict(SOURCES[source], n_layer=n_layer, vocab_size=1000)),
                          adaln_table=adaln_table)).train()
    order = torch.stack([torch.randperm(block_size) for _ in range(rows)])
    x = torch.randint(0, 1000, (rows, block_size))
    none = torch.full((rows, 1), -1)
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast('cpu', dtype=torch.bfloat16):
        model.hidden_slots(torch.cat([none, x[:, :-1]], 1), torch.cat([none, order[:, :-1]], 1), order)
    return sum(seen.values())


cfg = GPTConfig(**dict(BLOCK, **SOURCES[source]))
with torch.device('meta'):
    meta = GPT(cfg)
params = meta.get_num_params()
root = params - sum(p.numel() for p in meta.transformer.h.parameters())  # embeddings, head, final norm: the root
block_params = sum(p.numel() for p in meta.transformer.h[0].parameters())
s = {(L, r): saved_bytes(L, r) for L in (1, 2) for r in (1, 2)}
per_layer = (s[2, 2] - s[1, 2] - s[2, 1] + s[1, 1]) / block_size    # one block, per token
once = s[2, 1] - s[1, 1] - per_layer * block_size                     # one block, whatever the batch
rest = (s[1, 2] - s[1, 1]) / block_size - per_layer                   # embedding, final norm, per token
tokens = batch_size * block_size
rows = loss_chunk or tokens
GB = 1e9
TABLE = " and AdaLN's table"
shards = world if fsdp else 1
held = '' if shards == 1 else f', 1/{world} of each'
keep = 2 if fsdp else 4  # a block's input under activation checkpointing: bf16 under FSDP, the float32 stream else
if activation_checkpointing:
    acts = (f'activations: {cfg.n_layer} block inputs ({cfg.n_embd:,} x {keep} B/token) x {tokens:,} tokens, + one '
            f'block recomputed ({per_layer / 1e3:.1f} kB/token), + embedding and norm',
            cfg.n_layer * cfg.n_embd * keep * tokens + per_layer * tokens + once * (not fsdp) + rest * tokens)
elif fsdp:
    acts = (f'activations: {cfg.n_layer} blocks x {per_layer / 1e3:.1f} kB/token x {tokens:,} tokens, + embedding and '
            f'norm', cfg.n_layer * per_layer * tokens + rest * tokens)
else:
    acts = (f'activations: {cfg.n_layer} blocks x ({per_layer / 1e3:.1f} kB/token x {tokens:,} tokens + {once / 1e6:.0f} '
            f'MB of bf16 weights{TABLE if adaln_table else ""}), + embedding and norm',
            cfg.n_layer * (per_layer * tokens + once) + rest * tokens)
budget = [
    (f'weights, gradients, AdamW m and v (float32, 16 B/param){held}', 16 * params / shards),
    (f'EMA of the weights (float32){held}', 4 * params / shards if ema else 0),
]
if fsdp:
    budget.append((f"gathered in bf16: the root ({root / 1e6:.0f}M: embedding, head) and its gradients, 3 blocks' "
                   f"worth ({block_params / 1e6:.0f}M each)", 2 * 2 * root + 3 * 2 * block_params))
budget += [acts, (f'the head: ~4.2 x float32 logits of {rows:,} rows x {cfg.vocab_size:,}',
                  4.2 * 4 * rows * cfg.vocab_size)]
print(f"{source}: {params / 1e6:.1f}M parameters (adapted: + AdaLN); batch {batch_size} x {block_size}, "
      f"loss_chunk {loss_chunk}, adaln_table {adaln_table}" + (f"; FSDP over {world} GPUs" if fsdp else
                                                                f"; DDP, every GPU holds the whole model" if world > 1
                                                                else "") +
      ("; activation checkpointing" if activation_checkpointing else ""))
print('| part | GB |\n|---|---|')
for what, b in budget:
    print(f"| {what} | {b / GB:.1f} |")
print(f"| total | {sum(b for _, b in budget) / GB:.1f} |")
if loss_chunk:
    print(f"(without loss_chunk the head would take {4.2 * 4 * tokens * cfg.vocab_size / GB:.1f} GB)")
