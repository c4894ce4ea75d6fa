"""
The memory a training step's loss takes with and without loss_chunk (model.head_loss), on a vocabulary-heavy,
narrow model where the head's logits are most of the step's memory (as a 151k-vocabulary head is at any width).

    python bench/loss_memory.py                       # CPU: 32k vocabulary, width 64, 8 x 256 rows
    python bench/loss_memory.py --write=True          # append the table to BENCHMARKS.md

Each setting runs in its own process (tracemalloc does not see torch's allocations): it builds the model, runs
one forward + backward (torch's lazy set-up, the gradients), resets the process's high-water mark
(/proc/self/clear_refs), runs one more, and reports the peak resident memory above what it held before that step,
and the loss (the same value for every chunk, up to summation order). The process runs with glibc's
MALLOC_MMAP_THRESHOLD_ fixed at 128 KiB, so that every tensor but the smallest is its own mapping, returned when
freed: the resident memory is then what is alive, not what glibc kept for reuse. The ratio is the
unchunked step's peak over the chunked one's. On CUDA, torch.cuda.max_memory_allocated instead of the RSS.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from aogpt.configurator import configure, print_config, split_list  # noqa: E402
from aogpt.errors import UserError, exit_in_one_line  # noqa: E402
from bench.common import append_benchmark, check_settings  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

device = 'cpu'
n_layer = 2
n_head = 2
n_embd = 64
vocab_size = 32768
block_size = 256
batch_size = 8
chunks = '0,256'             # loss_chunk settings measured; the first is the baseline of the ratio
one = -1                     # (internal) measure this loss_chunk in this process and print its JSON
seed = 0
write = False                # append the table to BENCHMARKS.md
exit_in_one_line()  # from here on a UserError is its one line, not a traceback
config = configure(globals())
CHUNKS = split_list('chunks', chunks, int, lambda c: c >= 0, 'loss_chunk settings >= 0 (0: off)')
MODEL = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size, block_size=block_size)
check_settings(config, at_least=dict(batch_size=1), model=MODEL)
cuda = device.startswith('cuda')


def rss():
    """(resident bytes now, the process's peak resident bytes) from /proc/self/status."""
    fields = dict(line.split(':', 1) for line in open('/proc/self/status'))
    return tuple(int(fields[k].split()[0]) * 1024 for k in ('VmRSS', 'VmHWM'))


def measure(chunk):
    """One forward + backward at loss_chunk=chunk: (the step's peak bytes above what was held before it, the loss)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**MODEL, loss_chunk=chunk)).to(device).train()
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab_size, (batch_size, block_size), generator=g).to(device)
    order = torch.stack([torch.randperm(block_size, generator=g) for _ in range(batch_size)]).to(device)
    model(x, order=order, targets=x)[1].backward()  # the gradients stay allocated, held as in training
    if cuda:
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')  # the high-water mark back to the current RSS (Linux >= 4.0)
        held = rss()[0]
    _, loss = model(x, order=order, targets=x)
    loss.backward()
    peak = torch.cuda.max_memory_allocated() if cuda else rss()[1]
    return peak - held, loss.item()


if one >= 0:
    peak, loss = measure(one)
    print(json.dumps(dict(chunk=one, peak=peak, loss=loss)))
    sys.exit(0)
if not cuda and not os.path.exists('/proc/self/clear_refs'):
    raise UserError("measuring a CPU step's peak memory needs Linux's /proc/self/clear_refs: run it on Linux")
print_config(config)
rows = []
for c in CHUNKS:
    r = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], f'--one={c}'],
                       capture_output=True, text=True, env={**os.environ, 'MALLOC_MMAP_THRESHOLD_': str(2**17)})
    if r.returncode:
        raise UserError(f"the loss_chunk={c} measurement failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
logits = batch_size * block_size * vocab_size * 4
lines = [f'| loss_chunk | step peak over held (MiB) | loss | peak vs loss_chunk={CHUNKS[0]} |', '|---|---|---|---|']
for r in rows:
    lines.append(f"| {r['chunk']} | {r['peak'] / 2**20:.0f} | {r['loss']:.6f} | {rows[0]['peak'] / r['peak']:.2f}x "
                 f"smaller |" if r is not rows[0] else f"| {r['chunk']} | {r['peak'] / 2**20:.0f} | {r['loss']:.6f} "
                 f"| 1 |")
table = '\n'.join(lines)
print(table)
if write:
    append_benchmark('Loss memory, loss_chunk', cuda,
                     f"{n_layer}L/{n_embd}d/{n_head}H, vocabulary {vocab_size}, {batch_size} x {block_size} rows, "
                     f"fp32, AO-GPT (adaln) in random orders: one forward + backward, peak "
                     f"{'allocated' if cuda else 'resident'} memory above what was held before it (weights, "
                     f"grads), after one such step, each setting in its own process" + ('' if cuda else " (glibc's mmap threshold "
                     f"fixed at 128 KiB: freed tensors leave the resident set)") + f". Float32 logits alone: "
                     f"{logits / 2**20:.0f} MiB.",
                     table)
