"""
Forward calls that sample.py --until_eot saves, by order, on a checkpoint trained with end-of-document
symbols (EOT; a char codec's newline). A sample stops once its first document is settled: an end symbol
with every position before it drawn (aogpt/generate.py, settled). Along blocks left to right that is the
end of the block holding the end symbol; along a uniform order the positions before it are rarely all
drawn early, so it saves little. Per order the table gives:

  doc        mean tokens of the first document (without its end symbol), and how many samples ended
             inside the window (the others ran to its end and could not stop early)
  own        mean forward calls a sample makes before it stops: its cost where it can leave the batch
             (sample.py --batch_size 1, or the speculative sampler, whose samples leave the rounds)
  full       mean calls of the full draw of the same samples (the same plan, not stopped), and the saving
  batch      mean calls of a batch of batch_size with shared Lemma-1 counts: it stops when all its
             samples have, so it pays its slowest sample

--steps 0 (the default) is one token a call (fixed counts, T = n): the calls are then the tokens drawn, as
for an L2R GPT. --speculative K adds, for each order, exact speculative decoding along it (per-sample
commits): its own calls per sample with and without the stop.

    python bench/doc_calls.py --ckpt=out-ptb-eot --samples=256
    python bench/doc_calls.py --ckpt=out-ptbchar-eot --orders=l2r,semiar:16,semiar:64,random --speculative=auto
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from aogpt.checkpoint import load_model  # noqa: E402
from aogpt.configurator import configure, print_config, split_list  # noqa: E402
from aogpt.errors import UserError, exit_in_one_line  # noqa: E402
from aogpt.evalsets import doc_end  # noqa: E402
from aogpt.generate import doc_lengths, generate_ao  # noqa: E402
from aogpt.samplers import Sampling  # noqa: E402
from aogpt.orders import parse_order  # noqa: E402
from aogpt.speculative import Speculation, generate_speculative  # noqa: E402

ckpt = 'out-ptb-eot'   # a checkpoint trained on documents with end symbols (e.g. data/ptb: EOT after each sentence)
orders = 'l2r,semiar:4,semiar:8,semiar:16,nearl2r:4,random'
samples = 256          # samples per order
batch_size = 32        # samples per batch (the 'batch' column's size)
length = -1            # n; -1: the model's block_size
steps = 0              # T; 0: n with fixed counts (one token a call)
speculative = ''       # '' or a draft length K >= 2 or auto: add exact speculative decoding along each order
temperature = 1.0
seed = 1337
device = 'cpu'
exit_in_one_line()
print_config(configure(globals()))
order_list = split_list('orders', orders)
for o in order_list:
    parse_order(o)
if samples < 1 or batch_size < 1 or samples % batch_size:
    raise UserError(f"--samples ({samples}) must be a positive multiple of --batch_size ({batch_size})")

model, _, _, codec = load_model(ckpt, device, dataset='')  # its codec, checked to fit
try:
    end = doc_end(codec)[0]
except UserError:
    raise UserError(f"{ckpt}: its {codec.name} codec has no end symbol (no EOT, no newline)") from None
n = model.config.block_size if length == -1 else length
T, fixed = (n, True) if steps == 0 else (steps, False)
print(f"{ckpt}: {codec.name} codec, end symbol {end} ({codec.decode([end])!r}), n = {n}, "
      f"T = {T}{' (fixed counts)' if fixed else ''}, {samples} samples per order, batches of {batch_size}")

rows = [("order", "doc tokens", "ended", "own calls", "full calls", "saved", f"batch of {batch_size}")]
for o in order_list:
    g = torch.Generator().manual_seed(seed)
    own, full, batch, L = [], [], [], []
    for _ in range(samples // batch_size):
        x, st = generate_ao(model, n, batch_size, T, Sampling(temperature=temperature, vocab_size=codec.vocab_size,
                                                              generator=g, fixed_counts=fixed, until=end), order=o)
        own += st['stop_call']
        full += [st['calls_full']] * batch_size
        batch.append(st['forward_calls'])
        L.append(doc_lengths(x.cpu(), end))
    L = torch.cat(L).double()
    rows.append((o, f"{L.mean():.1f}", f"{int((L < n).sum())}/{samples}", f"{sum(own) / samples:.1f}",
                 f"{sum(full) / samples:.1f}", f"{1 - sum(own) / sum(full):.0%}", f"{sum(batch) / len(batch):.1f}"))
    if speculative:
        k = speculative if speculative == 'auto' else int(speculative)
        calls = {}
        for stop in (end, None):
            g = torch.Generator().manual_seed(seed)
            s = Sampling(temperature=temperature, vocab_size=codec.vocab_size, generator=g, until=stop)
            sp = Speculation(k)
            c = [generate_speculative(model, n, batch_size, s, speculation=sp, order=o)[1]['calls_per_sample']
                 for _ in range(samples // batch_size)]
            calls[stop] = sum(c) / len(c)
        rows.append((f"{o} + speculative k={k}", "", "", f"{calls[end]:.1f}", f"{calls[None]:.1f}",
                     f"{1 - calls[end] / calls[None]:.0%}", ""))
w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
for i, r in enumerate(rows):
    print("| " + " | ".join(v.ljust(w[j]) for j, v in enumerate(r)) + " |")
    if i == 0:
        print("|" + "|".join("-" * (x + 2) for x in w) + "|")
