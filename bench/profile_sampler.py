"""
Where the AO-GPT sampler's time goes: a per-call split of model pass vs. token drawing, and the torch
profiler's top ops, for one setting. A diagnostic companion of bench/sample_speed.py. The sampler runs
once at the same T before anything is timed, so a --stepper cuda_graph run times replays, not captures.

    python bench/profile_sampler.py --device=cuda --n_layer=24 --n_embd=1024 --n_head=16 --n=1024 \
        --batch_size=32 --steps=128 [--stepper=cuda_graph]
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from aogpt import (
    engine,  # noqa: E402
    generate,  # noqa: E402
    samplers,  # noqa: E402
)
from aogpt.configurator import configure  # noqa: E402
from aogpt.errors import exit_in_one_line  # noqa: E402
from bench.common import check_settings  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

device = 'cpu'
n_layer = 4
n_head = 4
n_embd = 128
n = 128
batch_size = 4
steps = 16
stepper = 'dynamic'          # dynamic | static | cuda_graph (engine.SlotStepper)
kv_bucket = engine.KV_BUCKET  # fixed shapes: attend over the cache up to a multiple of this (0: all of it)
exit_in_one_line()  # from here on a UserError is its one line, not a traceback
config = configure(globals())
check_settings(config, at_least=dict(n=1, batch_size=1, steps=1, kv_bucket=0),
               one_of=dict(stepper=('dynamic', 'static', 'cuda_graph')),
               model=dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=n))

cuda = device.startswith('cuda')
dt = torch.bfloat16 if cuda else torch.float32
torch.manual_seed(0)
model = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=n)).to(device=device, dtype=dt).eval()


def sync():
    if cuda:
        torch.cuda.synchronize()


# split each call's time between the model pass and the token draw (synchronising, so it is a diagnostic)
spent = {'model pass': 0.0, 'sample_tokens': 0.0}


def wrap(obj, name, key):
    f = getattr(obj, name)

    def g(*a, **k):
        sync()
        t0 = time.perf_counter()
        out = f(*a, **k)
        sync()
        spent[key] += time.perf_counter() - t0
        return out
    setattr(obj, name, g)
    return f


step = engine.SlotStepper(model, batch_size, stepper, kv_bucket=kv_bucket)  # one for every run: its graphs


def run():
    return generate.generate_ao(model, n, batch_size, steps, samplers.Sampling(
        vocab_size=50257, generator=torch.Generator().manual_seed(0)), stepper=step)


run()  # warm-up at this T: kernels, allocator, attention plans, and the graphs of every shape it uses
orig_call = wrap(engine.SlotStepper, '__call__', 'model pass')  # the forward call (lm_head on the copies too)
orig_st = wrap(generate, 'sample_tokens', 'sample_tokens')
sync()
t0 = time.perf_counter()
_, st = run()
sync()
total = time.perf_counter() - t0
calls = st['forward_calls']
print(f"stepper {stepper}: total {total:.2f} s over {calls} calls: model pass {spent['model pass']:.2f} s, "
      f"sample_tokens {spent['sample_tokens']:.2f} s, other {total - sum(spent.values()):.2f} s")
engine.SlotStepper.__call__, generate.sample_tokens = orig_call, orig_st

acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
with torch.profiler.profile(activities=acts) as prof:
    run()
    sync()
key = 'self_cuda_time_total' if cuda else 'self_cpu_time_total'
print(prof.key_averages().table(sort_by=key, row_limit=15, max_name_column_width=60))
