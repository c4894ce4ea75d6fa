"""
Does the speculative sampler draw from the T = n sampler's law on a trained model? The mean judge NLL per
token of many samples from each (with its standard error), side by side: exact samplers of one law agree
within a few standard errors; a biased one drifts. Needs the runs `make findings` trains (out-reproduce:
`ao` and the L2R `judge`). A statistical companion of the enumeration tests in tests/test_speculative.py,
at a size enumeration cannot reach.

    python bench/spec_law.py                       # n = 32, 8 batches of 256 samples per sampler
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from aogpt.checkpoint import load_model  # noqa: E402
from aogpt.configurator import configure, print_config  # noqa: E402
from aogpt.errors import exit_in_one_line  # noqa: E402
from aogpt.generate import generate_ao  # noqa: E402
from aogpt.samplers import Sampling  # noqa: E402
from aogpt.genppl import judge_token_nll  # noqa: E402
from aogpt.speculative import Speculation, generate_speculative  # noqa: E402

runs_dir = 'out-reproduce'   # where make findings trained `ao` and `judge`
n = 32                       # sequence length (the findings' block_size)
batch_size = 256
batches = 8                  # seeds 100, 101, ...: batches x batch_size samples per sampler
exit_in_one_line()  # from here on a UserError is its one line, not a traceback
config = configure(globals())
print_config(config)

model, _, _, codec = load_model(os.path.join(runs_dir, 'ao'), 'cpu', dataset='')  # its codec, checked to fit
judge = load_model(os.path.join(runs_dir, 'judge'), 'cpu')[0]
V = codec.vocab_size
SAMPLERS = {
    'T = n, random': lambda g: generate_ao(model, n, batch_size, n, Sampling(vocab_size=V, generator=g,
                                                                             fixed_counts=True)),
    'speculative k=4, random, per-sample commits':
        lambda g: generate_speculative(model, n, batch_size, Sampling(vocab_size=V, generator=g),
                                       speculation=Speculation(4)),
    'speculative k=auto, random, per-sample commits':
        lambda g: generate_speculative(model, n, batch_size, Sampling(vocab_size=V, generator=g),
                                       speculation=Speculation('auto')),
    'speculative k=4, random, batch-minimum commits':
        lambda g: generate_speculative(model, n, batch_size, Sampling(vocab_size=V, generator=g),
                                       speculation=Speculation(4, batch_commit='min')),
    'speculative fused k=4, random':
        lambda g: generate_speculative(model, n, batch_size, Sampling(vocab_size=V, generator=g),
                                       speculation=Speculation(4, fused=True)),
    'speculative fused k=auto, random':
        lambda g: generate_speculative(model, n, batch_size, Sampling(vocab_size=V, generator=g),
                                       speculation=Speculation('auto', fused=True)),
}
print('| sampler | mean judge NLL per token | standard error | forward calls per sample |')
print('|---|---|---|---|')
for name, fn in SAMPLERS.items():
    nll = []
    for i in range(batches):
        x, st = fn(torch.Generator().manual_seed(100 + i))
        nll += [t.mean().item() for t in judge_token_nll(judge, list(x), 'none', batch_size)]
    v = torch.tensor(nll, dtype=torch.float64)
    calls = st.get('calls_per_sample', st['forward_calls'])
    print(f"| {name} | {v.mean().item():.4f} | {v.std().item() / math.sqrt(len(v)):.4f} | {calls:.1f} |", flush=True)
