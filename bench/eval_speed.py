"""
The cost of context-order ensembling (x M) against plain any-order evaluation, for both ensemble modes,
measured side by side in one run on random chunks (speed does not depend on the data or the weights).

    python bench/eval_speed.py                                              # CPU, small defaults
    python bench/eval_speed.py --device=cuda --n_layer=12 --n_embd=768 --n_head=12 --n=1024 \
        --chunks=16 --exact_chunks=1 --batch_size=64                       # AO-GPT-small, 1024-token chunks

plain = one random order per chunk (model.forward); fast = one Monte Carlo draw per chunk, M
forward_queries passes; exact = the paper's per-token form, n*M full passes per chunk. Target for the
fast mode: at most about M+1 times plain. Exact mode is timed on `exact_chunks` chunks and reported per
100 chunks by proportion (its cost is exactly linear in the number of chunks).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from aogpt.configurator import configure, print_config  # noqa: E402
from aogpt.errors import exit_in_one_line  # noqa: E402
from bench.common import append_benchmark, check_settings  # noqa: E402
from aogpt.likelihood import nll_any_order, nll_ensemble  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

device = 'cpu'
dtype = 'bfloat16'           # CUDA: weights cast to this dtype; CPU: fp32
n_layer = 2
n_head = 4
n_embd = 128
vocab_size = 50304
n = 64                       # chunk length
chunks = 16                  # chunks timed for plain and fast
exact_chunks = 2             # chunks timed for exact (n*M passes each)
members = 8                  # M, the ensemble size
batch_size = 16              # rows per forward pass
seed = 0
write = False
exit_in_one_line()  # from here on a UserError is its one line, not a traceback
config = configure(globals())
print_config(config)
check_settings(config, at_least=dict(n=2, chunks=1, exact_chunks=1, members=1, batch_size=1),
               one_of=dict(dtype=('bfloat16', 'float32')),
               model=dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=n, vocab_size=vocab_size))

cuda = device.startswith('cuda')
if not cuda:
    torch.set_flush_denormal(True)
ptdtype = {'bfloat16': torch.bfloat16, 'float32': torch.float32}[dtype] if cuda else torch.float32
torch.manual_seed(seed)
model = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=n, vocab_size=vocab_size))
model = model.to(device=device, dtype=ptdtype).eval()
data = torch.randint(0, 50257, (chunks, n))


def timed(fn, x):
    g = torch.Generator().manual_seed(seed)
    fn(x[:1], g)  # warm-up
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(x, g)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / len(x)


per_chunk = {
    'plain': timed(lambda x, g: nll_any_order(model, x, 1, g, batch_size=batch_size), data),
    f'fast x{members}': timed(lambda x, g: nll_ensemble(model, x, members, 'fast', g, batch_size=batch_size), data),
    f'exact x{members}': timed(lambda x, g: nll_ensemble(model, x, members, 'exact', g, batch_size=batch_size),
                         data[:exact_chunks]),
}
base = per_chunk['plain']
lines = ['| mode | s per 100 chunks | vs plain |', '|---|---|---|']
for k, v in per_chunk.items():
    lines.append(f"| {k} | {100 * v:.2f} | {v / base:.1f}x |")
table = '\n'.join(lines)
print(table)

if write:
    append_benchmark('Eval speed', cuda,
                     f"{n_layer}L/{n_embd}d/{n_head}H, {n}-token chunks, M = {members}, {dtype if cuda else 'fp32'} "
                     f"weights; exact timed on {exact_chunks} chunk(s).", table)
