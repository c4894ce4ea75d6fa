"""
Sampling wall time vs. the number of steps T, for one backbone size, measured side by side in one run:
  ao         AO-GPT's KV-cached sampler (Lemma 1, parallel copies of the last token): ~2n token-passes
  mdm        the encoder MDM: one full pass over all n positions per step (T passes)
  mdm_cache  the encoder MDM with MDLM's trick: a step that reveals nothing reuses the last pass
  ar         plain L2R KV-cache decoding of a GPT, one token per call (independent of T)
  ao_static, ar_static   the same with fixed padded shapes (engine.SlotStepper 'static')
  ao_graph, ar_graph     those shapes captured once and replayed as CUDA graphs ('cuda_graph'; CUDA only)
  spec       exact speculative sampling (aogpt/speculative.py, draft length spec_k, random order; T is not used):
             per-sample commits (engine.RowStepper on fixed shapes: spec_static, spec_graph);
  spec_fused one call a round (aogpt/speculative.py's fused rounds): spec_fused, spec_fused_static, spec_fused_graph.
             Its calls depend on the acceptance, and a random model's is not a trained one's: the row says
             the calls it took (bench/sample_roofline.py counts the floor at stated acceptance rates)
  mdm_graph, mdm_cache_graph   the encoder's one pass captured once and replayed (engine.EncoderStepper);
             mdm_cache_graph is the best encoder baseline we can build: graphed, and skipping empty steps
Speed does not depend on the weights, so the models are random. The ratios are the result. Each decoder
sampler is warmed up at the smallest T and then run `repeats` times per T (the last one timed), so the
graphs of the shapes a T uses are captured before the timed run; an encoder sampler has one shape, which
its warm-up sees, so it runs once per T.

    python bench/sample_speed.py                                           # CPU, small defaults
    python bench/sample_speed.py --device=cuda --n_layer=24 --n_embd=1024 --n_head=16 \
        --n=1024 --batch_size=32 --steps=64,128,256,512,1024              # the paper's setting, medium
    python bench/sample_speed.py --device=cuda ... --samplers=ao_graph,ar_graph,mdm,mdm_cache_graph --repeats=2
"""
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from aogpt.configurator import configure, print_config, split_list  # noqa: E402
from aogpt.engine import KV_BUCKET, EncoderStepper, SlotStepper  # noqa: E402
from aogpt.errors import UserError, exit_in_one_line  # noqa: E402
from aogpt.generate import generate_ao, generate_ar, generate_mdm  # noqa: E402
from aogpt.samplers import EncoderPlan, Sampling  # noqa: E402
from aogpt.speculative import Speculation, generate_speculative, row_stepper  # noqa: E402
from bench.common import append_benchmark, check_settings  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

device = 'cpu'
dtype = 'bfloat16'           # CUDA: weights cast to this dtype (no autocast casts per call); CPU: fp32
n_layer = 4
n_head = 4
n_embd = 128
vocab_size = 50304
n = 128                      # sequence length
batch_size = 4
steps = '16,32,64,128'       # comma-separated T values
samplers = 'ao,mdm,mdm_cache,ar'  # each optionally with _static or _graph (see above)
spec_k = '4'                 # spec*: the draft length (an int >= 2, or auto)
spec_order = 'random'        # spec*: random | l2r
seed = 0
repeats = 1                  # decoders: run each T this many times and time the last (2: shapes already seen)
kv_bucket = KV_BUCKET         # fixed-shape decoders: attend over the cache up to a multiple of this (0: all of it)
sdpa = 'default'             # CUDA attention kernels: default (torch's choice) | nocudnn (flash, efficient, math)
encoder_passes = 0           # > 0: an encoder is timed over this many passes of its one shape, and its time at a T
                             # is that per-pass time x its passes there (counted on a 1-layer stand-in), labelled
write = False                # append the table to BENCHMARKS.md
exit_in_one_line()  # from here on a UserError is its one line, not a traceback
config = configure(globals())
print_config(config)
check_settings(config, at_least=dict(n=1, batch_size=1, repeats=1, encoder_passes=0, kv_bucket=0, vocab_size=50257),
               one_of=dict(dtype=('bfloat16', 'float16', 'float32'), sdpa=('default', 'nocudnn'),
                           spec_order=('random', 'l2r')),
               model=dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=n, vocab_size=vocab_size))
if not (spec_k == 'auto' or spec_k.isdigit() and int(spec_k) >= 2):
    raise UserError(f"--spec_k must be an int >= 2 or auto, got {spec_k!r}")

cuda = device.startswith('cuda')
if not cuda:
    torch.set_flush_denormal(True)
ptdtype = {'bfloat16': torch.bfloat16, 'float16': torch.float16, 'float32': torch.float32}[dtype] \
    if cuda else torch.float32
Ts = split_list('steps', steps, int, lambda t: t >= 1, 'step counts >= 1')
if sdpa == 'nocudnn':
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]).__enter__()
want = samplers.split(',')


def build(**kw):
    torch.manual_seed(seed)
    m = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=n, vocab_size=vocab_size, **kw))
    return m.to(device=device, dtype=ptdtype).eval()


def timed(fn, reps):
    """(seconds of the last of `reps` runs, its stats)."""
    for _ in range(reps - 1):
        fn()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    _, stats = fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0, stats


def settings():
    """Every run's settings: GPT-2's vocabulary, drawn from the same seed."""
    return Sampling(vocab_size=50257, generator=torch.Generator().manual_seed(seed))


res = {}  # (sampler, T) -> (seconds, stats)
SUFFIX = {'': 'dynamic', '_static': 'static', '_graph': 'cuda_graph'}
ENCODERS = {'mdm': False, 'mdm_cache': True}  # name -> MDLM's skip-empty-steps trick
named = {}  # sampler -> (family, stepper mode): ao*/ar* decoders, mdm*/mdm_cache* encoders
for name in want:
    for base in ('ao', 'ar', 'spec', 'spec_fused', 'mdm_cache', 'mdm'):
        if name.startswith(base) and name[len(base):] in SUFFIX:  # mdm_cache*: never mdm + a suffix
            named[name] = base, SUFFIX[name[len(base):]]
unknown = [w for w in want if w not in named]
if unknown:
    sys.exit(f"error: unknown samplers {unknown}; choose from ao, ar, spec, spec_fused, mdm, mdm_cache, each optionally with "
             f"_static or _graph")
if not cuda and any(mode == 'cuda_graph' for _, mode in named.values()):
    sys.exit("error: the _graph samplers need --device=cuda")
extrapolated = set()  # encoders timed per pass (encoder_passes) and multiplied by their counted passes
failed = {}  # sampler -> its error: one sampler's crash (a capture that fails on a new GPU, say) must not
#              cost the other samplers' numbers, which a device call of a few minutes went to measure


def measure(name, setup, Ts_timed, reps):
    """run = setup(); warm up at the smallest T, then time run(T) at each T. On an error, record it and drop
    the sampler."""
    try:
        run = setup()
        run(min(Ts))  # warm-up: kernels, allocator, and the graphs of the shapes T = min(Ts) uses
        for T in Ts_timed:
            res[name, T] = timed(lambda: run(T), reps)
            secs, st = res[name, T]  # as it goes: a call cut off by its time limit keeps what it measured
            print(f"{name} T={T}: {secs:.2f} s, {st['token_passes']}/{st['forward_calls']} passes/calls", flush=True)
    except Exception as e:  # noqa: BLE001 (reported below the table, the traceback on stderr)
        traceback.print_exc()
        failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        for T in Ts:
            res.pop((name, T), None)


for kind in ('ao', 'ar', 'spec', 'spec_fused'):
    mine = [(name, mode) for name, (k, mode) in named.items() if k == kind]
    if not mine:
        continue
    model = build(cond='none' if kind == 'ar' else 'adaln')
    for name, mode in mine:
        def setup(mode=mode):
            st = SlotStepper(model, batch_size, mode, kv_bucket=kv_bucket)  # one for all runs: its graphs
            fused = kind == 'spec_fused'
            if kind.startswith('spec'):
                sp = Speculation(spec_k if spec_k == 'auto' else int(spec_k), fused=fused)
                st = mode if mode == 'dynamic' else row_stepper(model, batch_size, mode, n, sp, kv_bucket=kv_bucket)
            if kind == 'ao':
                return lambda T: generate_ao(model, n, batch_size, T, settings(), stepper=st)
            if kind.startswith('spec'):
                return lambda T: generate_speculative(model, n, batch_size, settings(), speculation=sp,
                                                      order=spec_order, stepper=st)
            return lambda T: generate_ar(model, n, batch_size, settings(), stepper=st)
        measure(name, setup, Ts if kind == 'ao' else Ts[:1], repeats)
        for T in Ts[1:] if kind != 'ao' and name not in failed else ():  # AR and spec do not depend on T
            res[name, T] = res[name, Ts[0]]
    del model
mine = [(name, ENCODERS[k], mode) for name, (k, mode) in named.items() if k in ENCODERS]
if mine:
    enc = build(cond='none', causal=False)
    for name, trick, mode in mine:
        def setup(mode=mode, trick=trick, model=enc):
            st = EncoderStepper(model, batch_size, n, mode)
            return lambda T: generate_mdm(model, n, batch_size, T, settings(), stepper=st,
                                                 plan=EncoderPlan(cache_trick=trick))
        if not encoder_passes:
            measure(name, setup, Ts, 1)  # one shape, seen in the warm-up
            continue
        # An encoder pass has one shape whatever T is: time encoder_passes of them (no skipped step), and count
        # the passes each T takes on a 1-layer stand-in (the plan does not depend on the weights).
        measure(name, lambda mode=mode: setup(mode, False), [encoder_passes], 1)
        if name in failed:
            continue
        secs, st = res.pop((name, encoder_passes))
        per_pass = secs / st['forward_calls']
        torch.manual_seed(seed)
        stand_in = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=16, block_size=n, vocab_size=vocab_size,
                                 causal=False, cond='none')).to(device).eval()
        count = setup('dynamic', trick, stand_in)
        for T in Ts:
            _, plan = count(T)
            res[name, T] = per_pass * plan['forward_calls'], plan
            extrapolated.add(name)
            print(f"{name} T={T}: {per_pass * 1000:.1f} ms a pass (over {st['forward_calls']}) x "
                  f"{plan['forward_calls']} passes = {res[name, T][0]:.2f} s", flush=True)
    del enc

cols = [c for c in want if any(c == k for k, _ in res)]
aos = [c for c in cols if c.startswith('ao')]
# the ratios: every encoder sampler over every AO variant, every AO variant over its AR twin, and each
# speculative variant over its AR and AO twins
specs = [c for c in cols if c.startswith('spec')]
pairs = [(m, a) for a in aos for m in cols if named[m][0] in ENCODERS] + \
        [(a, 'ar' + a[2:]) for a in aos if 'ar' + a[2:] in cols] + \
        [(s_, t + sfx) for s_ in specs for t in ('ar', 'ao') for sfx, md in SUFFIX.items()
         if md == named[s_][1] and t + sfx in cols]
head = ('| T | ' + ' | '.join(f'{c} s' + (' (per pass x passes)' if c in extrapolated else '') for c in cols)
        + ' | ' + ' | '.join(f'{c} passes/calls' for c in cols) + ''.join(f' | {a} / {b}' for a, b in pairs) + ' |')
lines = [head, '|' + '---|' * (head.count('|') - 1)]
for T in Ts:
    secs = ' | '.join(f"{res[c, T][0]:.2f}" for c in cols)
    work = ' | '.join(f"{res[c, T][1]['token_passes']}/{res[c, T][1]['forward_calls']}" for c in cols)
    ratios = ''.join(f" | {res[a, T][0] / res[b, T][0]:.2f}" for a, b in pairs)
    lines.append(f"| {T} | {secs} | {work}{ratios} |")
table = '\n'.join(lines)
print(table)
for name, err in failed.items():
    print(f"FAILED {name}: {err} (traceback above)")

if write:
    append_benchmark('Sampling speed', cuda,
                     f"{n_layer}L/{n_embd}d/{n_head}H, n = {n}, batch {batch_size}, {dtype if cuda else 'fp32'} "
                     f"weights, random init, sdpa={sdpa}; decoders: timing run {repeats} of {repeats} per T, "
                     f"encoders: one run per T after a warm-up. passes = token-passes per sample; calls = forward "
                     f"calls; _static = fixed padded shapes (decoders: spans of kv_bucket = {kv_bucket} slots), "
                     f"_graph = the same replayed as CUDA graphs (engine.SlotStepper, engine.EncoderStepper).",
                     table + ''.join(f"\n\nFAILED {name}: {err}" for name, err in failed.items()))
if failed:
    sys.exit(1)
