"""
The sampling floor on a GPU, counted before it is measured. For each sampler's exact plan (the per-step
counts sample.py draws, same seed), every forward call's FLOPs and HBM bytes, and per call the larger of
FLOPs / peak and bytes / bandwidth. The sum is the time no implementation of that plan can beat; the
measured times in BENCHMARKS.md sit above it by what launch overhead and kernel efficiency cost. The
fixed-shape columns are the floors of the CUDA-graph path, which pads rows and attends over the cache up
to a span (the live length rounded up to kv_bucket slots); a second table compares span buckets: the
floor they cost and the graphs a run captures.

    python bench/sample_roofline.py                       # medium, n = 1024, B = 32, the H100's ceilings
    python bench/sample_roofline.py --device=cuda --write=True   # at this GPU's ceilings, measured first

The ceilings: a bf16 matmul's FLOP/s and HBM bytes/s. --peak_flops and --hbm_bandwidth set them; left out,
they are measured on --device=cuda (bench/common.py: an 8192^3 product, a 2 GiB copy), and on the CPU, where
nothing measured would mean anything for a GPU, they are H100_CEILINGS (the matmul rate BENCHMARKS.md measured
on an H100, and its datasheet bandwidth). The count itself runs on the CPU in seconds; a GPU adds only the two
measurements, so a floor and the timings it explains can come from one session on one device.

The exact speculative sampler (aogpt/speculative.py) is counted last. Its calls depend on how many drafts the
model accepts, which a count cannot know: each sample is taken to accept each draft independently with
probability alpha (spec_alphas, an assumption, not a measurement), simulated with a fixed seed;
per-sample commits (keys counted as the sampler's buffer holds them, holes included; compaction not
counted), dynamic and fixed shapes, and for contrast the batch minimum's calls. It is compared at the
same law: against AR (L2R order, one token a call) and generate_ao at T = n (random order, likewise).

What a call costs (bf16, B samples, a call of r rows with L slots cached, k of them to predict):
  decoder FLOPs  2 B (r P_trunk + k d V) + 4 B n_layer d r (L + r)   (matmuls, then scores and values)
  decoder bytes  2 (P_trunk + d V) + 4 B n_layer d (L + 2r)          (weights once, K/V read + written)
  encoder pass   2 B n P_trunk + 4 B n_layer d n^2 + 2 B k d V, weights once; compute-bound at B n = 32k
P_trunk: the matmul parameters a token passes through (blocks, and per-token AdaLN for AO-GPT).
Activations are not counted: in a call of a few rows per sample (most calls at large T) they are far
smaller than the weights, and the calls with many rows, like every encoder pass, are compute-bound even
with them. Neither is the token draw (a float64 softmax over the k predicted rows).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from aogpt.configurator import configure, print_config, split_list  # noqa: E402
from aogpt.engine import KV_BUCKET, KVCache, SlotStepper  # noqa: E402
from aogpt.errors import UserError, exit_in_one_line  # noqa: E402
from aogpt.generate import ao_calls, draw_plan  # noqa: E402
from aogpt.runtime import resolve_device  # noqa: E402
from aogpt.samplers import Sampling  # noqa: E402
from aogpt.speculative import Speculation, row_slots  # noqa: E402
from bench.common import append_benchmark, check_settings, measure_copy_bandwidth, measure_matmul_peak  # noqa: E402

n_layer = 24
n_embd = 1024
vocab_size = 50304
target_dim = 128             # AO-GPT's per-token AdaLN: Linear(target_dim -> 6 n_embd) per block
n = 1024                     # sequence length
batch_size = 32
steps = '64,128,256,512,1024'
device = 'cpu'               # cuda: measure the ceilings left out on this GPU (the count runs on the CPU)
peak_flops: float = None     # bf16 matmul FLOP/s; None: measured on cuda, the H100's (H100_CEILINGS) on the CPU
hbm_bandwidth: float = None  # HBM bytes/s; None: likewise
write = False                # append the tables to BENCHMARKS.md (device, date, command, the ceilings used)
seed = 0                     # the sampler's seed: the same plans bench/sample_speed.py times
kv_bucket = KV_BUCKET         # the fixed-shape spans: the sampler's own default
buckets = '0,64,128,256'     # span buckets to compare (0: attend over the whole cache)
spec_ks = '4,8'              # speculative: draft lengths
spec_alphas = '0.5,0.7,0.8,0.9'  # speculative: assumed per-draft acceptance probabilities
exit_in_one_line()  # from here on a UserError is its one line, not a traceback
config = configure(globals())
print_config(config)
check_settings(config, at_least=dict(n_layer=1, n_embd=1, vocab_size=1, target_dim=1, n=1, batch_size=1, kv_bucket=0,
                                     **{k: 1 for k in ('peak_flops', 'hbm_bandwidth') if config[k] is not None}))
H100_CEILINGS = (792e12, 3.35e12)  # bf16 matmul measured on an H100 on 2026-11-22 (BENCHMARKS.md); HBM3 datasheet
device = resolve_device(device)  # 'auto' -> cuda where there is one
cuda = device.startswith('cuda')
if not cuda and device != 'cpu':
    raise UserError(f"--device must be cpu (the H100's ceilings) or cuda (this GPU's, measured), got {device!r}: "
                    f"the count runs on the CPU, and only a CUDA GPU's ceilings are measured")
source = dict(peak_flops='given', hbm_bandwidth='given')
for key, measure, h100 in (('peak_flops', measure_matmul_peak, H100_CEILINGS[0]),
                           ('hbm_bandwidth', measure_copy_bandwidth, H100_CEILINGS[1])):
    if config[key] is None:
        config[key], source[key] = (measure(device), 'measured') if cuda else (h100, "the H100's")
peak_flops, hbm_bandwidth = config['peak_flops'], config['hbm_bandwidth']
ceilings = (f"{peak_flops / 1e12:.0f} TFLOP/s bf16 matmul ({source['peak_flops']}), {hbm_bandwidth / 1e12:.2f} TB/s "
            f"HBM ({source['hbm_bandwidth']})")
print(f"ceilings: {ceilings}")
tables = []  # what --write appends: every table, with the line above it


def show(text):
    print(text)
    tables.append(text)
Ts = split_list('steps', steps, int, lambda t: t >= 1, 'step counts >= 1')
bks = split_list('buckets', buckets, int, lambda b: b >= 0, 'span buckets >= 0')
KS = split_list('spec_ks', spec_ks, int, lambda k: k >= 2, 'draft lengths >= 2')
ALPHAS = split_list('spec_alphas', spec_alphas, float, lambda a: 0 < a < 1, 'acceptance probabilities in (0, 1)')

d, V, B, nl = n_embd, vocab_size, batch_size, n_layer
P_block = nl * 12 * d * d
P_adaln = nl * target_dim * 6 * d + target_dim * 2 * d
W = 2  # bytes per bf16 value
S = KVCache.slots(n)  # slots of the fixed-shape path's cache


def call_cost(rows, keys, k, P):
    """(FLOPs, bytes) of one decoder call: `rows` through the trunk attending over `keys` slots, the head
    on the k predicted rows, the weights read once and K/V read for `keys` slots and written for `rows`."""
    f = 2 * B * (rows * P + k * d * V) + 4 * B * nl * d * rows * keys
    y = W * (P + d * V) + 2 * W * B * nl * d * (keys + rows)
    return f, y


def call_time(flops, nbytes):
    return max(flops / peak_flops, nbytes / hbm_bandwidth)


def decoder_time(plan, adaln, fixed=False, bucket=0, slots=S):
    """plan: [(r rows, L cached, k predicted)] -> (seconds, FLOPs, bytes, shapes) summed over the calls.
    fixed: the fixed-shape path (engine.SlotStepper 'static' / 'cuda_graph'): rows padded by rows_for,
    every row attending over the cache up to the span of kv_bucket = bucket (0: the whole cache);
    shapes: the distinct (rows, span) shapes, i.e. the CUDA graphs one run captures."""
    P = P_block + (P_adaln if adaln else 0)
    s = F = Y = 0.0
    shapes = set()
    for r, L, k in plan:
        R = SlotStepper.rows_for(r)
        shape = (R, SlotStepper.span_for(L, R, slots, bucket)) if fixed else (r, L + r)
        f, y = call_cost(*shape, k, P)
        s, F, Y = s + call_time(f, y), F + f, Y + y
        shapes.add(shape)
    return s, F, Y, len(shapes)


def encoder_time(counts, skip_empty):
    s = F = 0.0
    for k in counts:
        if skip_empty and not k:
            continue  # MDLM's caching trick: nothing revealed, no pass
        f = 2 * B * n * P_block + 4 * B * nl * d * n * n + 2 * B * k * d * V
        s, F = s + call_time(f, W * (P_block + d * V)), F + f
    return s, F


ar_plan = [(1, L, 1) for L in range(n)]  # one row per call over L cached slots (the first call: [None])
ar_s, ar_F, ar_Y, _ = decoder_time(ar_plan, adaln=False)
ar_fixed = decoder_time(ar_plan, adaln=False, fixed=True, bucket=kv_bucket)[0]
cols = ['T', 'AO calls / token-passes', 'AO floor s', 'AO fixed-shape floor s', 'AR floor s',
        'AR fixed-shape floor s', 'encoder floor s', 'encoder+cache floor s', 'encoder / AO',
        'encoder+cache / AO', 'AO / AR', 'AO / AR, fixed shapes', 'AO: compute-bound calls']
lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
plans = {}  # T -> generate_ao's own counts and calls
for T in Ts:
    counts = draw_plan(n, B, T, Sampling(generator=torch.Generator().manual_seed(seed)))[2].tolist()
    plans[T] = counts, ao_calls(counts)
for T, (counts, plan) in plans.items():
    ao_s = decoder_time(plan, adaln=True)[0]
    bound = sum(1 for r, L, k in plan  # matmul time over weight-read time, as in the docstring's counts
                if 2 * B * (r * (P_block + P_adaln) + k * d * V) / peak_flops >
                W * (P_block + P_adaln + d * V) / hbm_bandwidth)
    mdm_s, _ = encoder_time(counts, skip_empty=False)
    mdmc_s, _ = encoder_time(counts, skip_empty=True)
    ao_fixed = decoder_time(plan, adaln=True, fixed=True, bucket=kv_bucket)[0]
    lines.append(f"| {T} | {len(plan)} / {sum(r for r, _, _ in plan)} | {ao_s:.3f} | {ao_fixed:.3f} | "
                 f"{ar_s:.3f} | {ar_fixed:.3f} | {mdm_s:.2f} | {mdmc_s:.2f} | {mdm_s / ao_s:.1f}x | "
                 f"{mdmc_s / ao_s:.1f}x | {ao_s / ar_s:.2f} | {ao_fixed / ar_fixed:.2f} | "
                 f"{bound} of {len(plan)} |")
show(f"Fixed shapes with kv_bucket = {kv_bucket}:\n\n" + '\n'.join(lines))
print(f"AR: {n} calls, each reading the {W * (P_block + d * V) / 1e9:.2f} GB of weights: "
      f"{ar_Y / 1e9:.0f} GB and {ar_F / 1e12:.1f} TFLOP in all")

# What the span buckets buy: the fixed-shape floor over the dynamic one, and the graphs a run captures
head = ['T'] + [f'kv_bucket {b}: floor / dynamic, graphs' for b in bks]
lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
for name, plan, adaln in [(f'AO, T = {T}', p, True) for T, (_, p) in plans.items()] + [('AR', ar_plan, False)]:
    dyn = decoder_time(plan, adaln)[0]
    cells = [decoder_time(plan, adaln, fixed=True, bucket=b) for b in bks]
    lines.append(f"| {name} | " + ' | '.join(f"{c[0] / dyn:.2f}x, {c[3]}" for c in cells) + ' |')
show('What the span buckets buy (the fixed-shape floor over the dynamic one, and the CUDA graphs a run captures):\n\n'
     + '\n'.join(lines))


def spec_plan(k, alpha, commit, rng):
    """The speculative sampler's calls [(r rows, keys attended, logits)] for B samples of n tokens, each
    accepting each draft with probability alpha; commit 'per_row' (RowCache: the buffer advances by the
    longest kept run), 'min' (every sample commits the batch minimum; the cache is the tokens so far) or
    'fused' (per_row, one call a round: the chain and k copies off each chain row, every draft tested)."""
    if commit == 'fused':
        return fused_plan(k, alpha, rng)
    m, L, plan = torch.zeros(B, dtype=torch.long), 0, []
    while bool((m < n).any()):
        live = m < n
        kk = min(k, int((n - m).max()))
        kb = torch.clamp(n - m, max=kk)
        plan.append((kk, L + kk, kk))                                   # draft: kk copies of the last slot
        L += 1
        if kk == 1:
            m += live.long()
            continue
        nb = int(bool((m + kk < n).any()))
        nv = kk - 1 + nb
        plan.append((nv, L + nv, nv))                                   # verify: every row's logits
        ok = (torch.rand(B, kk - 1, generator=rng) < alpha) & (torch.arange(1, kk)[None] < kb[:, None])
        a = ok.long().cumprod(1).sum(1)
        full = a == kb - 1
        t = torch.where(full, kb + (full & (m + kb < n)).long(), a + 2) * live
        if commit == 'min':
            A = int(a[live].min())
            t = torch.full_like(t, A + 2 if A < kk - 1 else kk + nb) * live
        L += int((t - 1).clamp(min=0).max())
        if commit == 'min':
            L = int(m.max()) + int(t.max())
        m += t
    return plan


def fused_plan(k, alpha, rng):
    m, kd, L, plan = torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long), 0, []
    while bool((m < n).any()):
        live = m < n
        K, K2 = int(kd.max()), max(0, min(k, int((n - m - 2)[live].max())))
        r = (K + 1) * (K2 + 1)
        plan.append((r, L + r, r))                                      # every row's logits
        ok = (torch.rand(B, K, generator=rng) < alpha) & (torch.arange(K)[None] < kd[:, None])
        t = (ok.long().cumprod(1).sum(1) + 1) * live
        L += int(t.max())
        m += t
        kd = torch.clamp(n - m - 1, min=0, max=K2) * (m < n)
    return plan


ao_n = ao_calls([1] * n)  # generate_ao at T = n: the random-order law, one token a call
ao_n_s = decoder_time(ao_n, adaln=True)[0]
ao_n_fixed = decoder_time(ao_n, adaln=True, fixed=True, bucket=kv_bucket)[0]
cols = ['round', 'k', 'alpha (assumed)', 'calls / token-passes', 'floor s', 'fixed-shape floor s',
        'calls (batch minimum)', 'vs AR floor (L2R)', 'vs AR fixed-shape floor', 'vs AO T = n floor (random)',
        'vs AO T = n fixed-shape floor']
lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
for fused, k, alpha in [(f, k, a) for f in (False, True) for k in KS for a in ALPHAS]:
    per = spec_plan(k, alpha, 'fused' if fused else 'per_row', torch.Generator().manual_seed(seed))
    mn = '-' if fused else len(spec_plan(k, alpha, 'min', torch.Generator().manual_seed(seed)))
    # decoder_time reads (r, L cached, k): keys = L + r, so hand it L = keys - r
    dyn = decoder_time([(r, keys - r, lg) for r, keys, lg in per], adaln=True)[0]
    fix = decoder_time([(r, keys - r, lg) for r, keys, lg in per], adaln=True, fixed=True, bucket=kv_bucket,
                       slots=KVCache.slots(row_slots(n, Speculation(k, fused=fused))))[0]  # RowStepper's longer buffer
    lines.append(f"| {'fused' if fused else 'two calls'} | {k} | {alpha} | {len(per)} / "
                 f"{sum(r for r, _, _ in per)} | {dyn:.3f} | {fix:.3f} | {mn} | "
                 f"{ar_s / dyn:.2f}x | {ar_fixed / fix:.2f}x | {ao_n_s / dyn:.2f}x | {ao_n_fixed / fix:.2f}x |")
show(f"Exact speculative sampling, n = {n}, B = {B} (AR floor {ar_s:.3f} s, fixed {ar_fixed:.3f} s; AO at T = n "
     f"floor {ao_n_s:.3f} s, fixed {ao_n_fixed:.3f} s):\n\n" + '\n'.join(lines))
if write:
    append_benchmark('Sampling floor, counted', cuda,
                     f"A count, not a timing: {n_layer}L/{n_embd}d, n = {n}, B = {B}, bf16 weights and K/V, each call "
                     f"the larger of its FLOPs and its HBM bytes over the ceilings: {ceilings}.", '\n\n'.join(tables))
    print("appended the tables to BENCHMARKS.md")
