"""
Sampling wall time vs. the number of steps T, for one backbone size, measured side by side in one run:
  ao         AO-GPT's KV-cached sampler (Lemma 1, parallel copies of the last token): ~2n token-passes
  mdm        the encoder MDM: one full pass over all n positions per step (T passes)
  mdm_cache  the encoder MDM with MDLM's trick: a step that reveals nothing reuses the last pass
  ar         plain L2R KV-cache decoding of a GPT, one token per call (independent of T)
Speed does not depend on the weights, so the models are random. The ratios are the result.

    python bench/sample_speed.py                                           # CPU, small defaults
    python bench/sample_speed.py --device=cuda --n_layer=24 --n_embd=1024 --n_head=16 \
        --n=1024 --batch_size=32 --steps=64,128,256,512,1024              # the paper's setting, medium
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from bench.common import append_benchmark  # noqa: E402
from configurator import configure, print_config  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from sample import generate_ao, generate_ar, generate_mdm  # noqa: E402

device = 'cpu'
dtype = 'bfloat16'           # CUDA: weights cast to this dtype (no autocast casts per call); CPU: fp32
n_layer = 4
n_head = 4
n_embd = 128
vocab_size = 50304
n = 128                      # sequence length
batch_size = 4
steps = '16,32,64,128'       # comma-separated T values
samplers = 'ao,mdm,mdm_cache,ar'
seed = 0
repeats = 1                  # run each setting this many times and time the last (2: shapes already seen)
sdpa = 'default'             # CUDA attention kernels: default (torch's choice) | nocudnn (flash, efficient, math)
write = False                # append the table to BENCHMARKS.md
config = configure(globals())
print_config(config)

cuda = device.startswith('cuda')
if not cuda:
    torch.set_flush_denormal(True)
ptdtype = {'bfloat16': torch.bfloat16, 'float16': torch.float16, 'float32': torch.float32}[dtype] \
    if cuda else torch.float32
Ts = [int(s) for s in steps.split(',')]
if sdpa == 'nocudnn':
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]).__enter__()
want = samplers.split(',')


def build(**kw):
    torch.manual_seed(seed)
    m = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=n, vocab_size=vocab_size, **kw))
    return m.to(device=device, dtype=ptdtype).eval()


def timed(fn):
    for _ in range(repeats - 1):
        fn()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    _, stats = fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0, stats


def gen():
    return torch.Generator().manual_seed(seed)


res = {}  # (sampler, T) -> (seconds, token_passes per sample, forward calls)
if 'ao' in want:
    ao = build(cond='adaln')
    generate_ao(ao, n, batch_size, min(Ts), generator=gen())  # warm-up (kernels, allocator)
    for T in Ts:
        s, st = timed(lambda: generate_ao(ao, n, batch_size, T, generator=gen(), vocab_size=50257))
        res['ao', T] = (s, st['token_passes'], st['forward_calls'])
    del ao
if 'mdm' in want or 'mdm_cache' in want:
    enc = build(cond='none', causal=False)
    generate_mdm(enc, n, batch_size, min(Ts), generator=gen())
    for T in Ts:
        for name, trick in (('mdm', False), ('mdm_cache', True)):
            if name in want:
                s, st = timed(lambda: generate_mdm(enc, n, batch_size, T, cache_trick=trick, generator=gen(),
                                                   vocab_size=50257))
                res[name, T] = (s, st['token_passes'], st['forward_calls'])
    del enc
if 'ar' in want:
    gpt = build(cond='none')
    generate_ar(gpt, n, batch_size, generator=gen())
    s, st = timed(lambda: generate_ar(gpt, n, batch_size, generator=gen(), vocab_size=50257))
    for T in Ts:
        res['ar', T] = (s, st['token_passes'], st['forward_calls'])
    del gpt

cols = [c for c in ('ao', 'mdm', 'mdm_cache', 'ar') if c in want]
head = '| T | ' + ' | '.join(f'{c} s' for c in cols) + ' | ' + \
       ' | '.join(f'{c} passes/calls' for c in cols) + ' | mdm / ao | mdm_cache / ao | ao / ar |'
lines = [head, '|' + '---|' * (head.count('|') - 1)]
for T in Ts:
    secs = ' | '.join(f"{res[c, T][0]:.2f}" for c in cols)
    work = ' | '.join(f"{res[c, T][1]}/{res[c, T][2]}" for c in cols)

    def ratio(a, b):
        return f"{res[a, T][0] / res[b, T][0]:.1f}x" if (a, T) in res and (b, T) in res else 'n/a'
    lines.append(f"| {T} | {secs} | {work} | {ratio('mdm', 'ao')} | {ratio('mdm_cache', 'ao')} | "
                 f"{res['ao', T][0] / res['ar', T][0]:.2f} |" if ('ao', T) in res and ('ar', T) in res else
                 f"| {T} | {secs} | {work} | {ratio('mdm', 'ao')} | {ratio('mdm_cache', 'ao')} | n/a |")
table = '\n'.join(lines)
print(table)

if write:
    append_benchmark('Sampling speed', cuda,
                     f"{n_layer}L/{n_embd}d/{n_head}H, n = {n}, batch {batch_size}, {dtype if cuda else 'fp32'} "
                     f"weights, random init, sdpa={sdpa}, timing run {repeats} of {repeats}. passes = token-passes "
                     f"per sample; calls = forward calls.", table)
