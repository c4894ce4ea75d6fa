"""
Training throughput, MFU and memory of AO-GPT against a GPT and an encoder MDM of the same size, measured
side by side in one run (absolute CPU times are noise; the ratios are the result: on the CPU the models' steps
are interleaved, and each row is a median step).

    python bench/train_speed.py                                   # CPU, small defaults
    python bench/train_speed.py --device=cuda --n_layer=12 --n_embd=768 --n_head=12 \
        --block_size=1024 --batch_size=16 --compile=True         # AO-GPT-small on a GPU
    ... --write=True                                              # append the table to BENCHMARKS.md
    python bench/train_speed.py --fsdp_ac=True                    # and each model sharded, recomputed (a world of 1)
    python bench/train_speed.py --optimizer                       # the optimizer step: AdamW against Muon
    ... --optimizer --json_out=f.json                             # the same rows as JSON (findings/optimizers.py)

Models (same backbone: RMSNorm, QK-norm, untied head):
  ao        AO-GPT, per-token AdaLN: each block runs Linear(128 -> 6d) on every token
  ao_table  AO-GPT, AdaLN as a table: the modulation depends only on the target position, so each block
            computes block_size rows once per step and gathers them (same parameters, same function)
  gpt       the same backbone with no target conditioning, L2R
  mdm       the encoder MDM (full attention) on masked input
  NAME:rope any of these on the Llama/Qwen block instead (the "block" column): rotary positions (no wpe), a SwiGLU
            MLP 3 n_embd wide, grouped-query attention with n_head/2 key/value heads. At equal parameters: GQA's
            attention holds 3 d^2 (q, o: d^2 each; k, v: d^2/2 each) against 4 d^2, and SwiGLU's three matrices
            d x 3d hold 9 d^2 against GELU's 8 d^2, so each block holds 12 d^2 either way (the totals differ by the
            learned wpe the rotary model lacks and a few biases; the table prints both)
Activation memory = peak memory during forward+backward minus the memory held before the forward
(weights, grads, optimizer state), on CUDA only; peak memory is the whole of it.

--fsdp_ac: each model also as train.py trains it with fsdp=True and activation_checkpointing=True, in a world of one
(aogpt/parallel.build: sharded over one rank, bfloat16 compute from float32 shards, each block recomputed in
backward), beside it: what sharding and recomputation cost one GPU, in tokens/s and in memory.

--optimizer: each model trained with each of `optimizers`: train.py's optimizer=adamw, optimizer=muon (Muon
for the blocks' hidden matrices and AdaLN Linears, AdamW for the rest; muon: torch's bfloat16 Newton-Schulz,
muon_fp32: muon_dtype=float32), timing the optimizer step (synchronised on both sides) apart from the whole
step: its cost against AdamW's, and its share of a training step.
"""
import json
import os
import sys
import time
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from aogpt.checkpoint import atomic_write  # noqa: E402
from aogpt.configurator import configure, print_config, split_list  # noqa: E402
from aogpt.errors import UserError, exit_in_one_line  # noqa: E402
from aogpt.likelihood import mdm_corrupt  # noqa: E402
from aogpt.optim import configure_optimizers  # noqa: E402
from aogpt.orders import random_orders  # noqa: E402
from aogpt.parallel import build  # noqa: E402
from aogpt.paths import check_writable  # noqa: E402
from aogpt.runtime import fast_math  # noqa: E402
from bench.common import append_benchmark, check_settings, measure_matmul_peak  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

device = 'cpu'
dtype = 'bfloat16'           # autocast dtype on CUDA; CPU runs fp32
n_layer = 4
n_head = 4
n_embd = 128
target_dim = 128             # width of the AdaLN target table
block_size = 128
vocab_size = 50304
batch_size = 8
iters = 10                   # timed steps per model
warmup = 3                   # untimed steps (compile happens here)
compile = False
models = 'ao,ao_table,gpt,mdm'
peak_flops: float = None     # FLOP/s for MFU; None: measure a bf16 matmul on CUDA, skip MFU on CPU
sdpa = 'default'             # attention kernel on CUDA: default | flash | cudnn | efficient
write = False                # append the table to BENCHMARKS.md
profile = False              # after timing, profile 3 steps of each model and print where the time goes
fsdp_ac = False              # also each model under fsdp=True (a world of one) with activation_checkpointing
optimizer = False            # time the optimizer step of AdamW and of Muon (+ AdamW for the rest) instead
optimizers = 'adamw,muon,muon_fp32'  # --optimizer: which (muon: bf16 Newton-Schulz; muon_fp32: muon_dtype=float32)
json_out = ''                # --optimizer: also write the rows to this JSON file
seed = 0
exit_in_one_line()  # from here on a UserError is its one line, not a traceback
config = configure(globals())
print_config(config)
check_settings(config, at_least=dict(batch_size=1, iters=1, warmup=0),
               one_of=dict(dtype=('bfloat16', 'float16', 'float32'), sdpa=('default', 'flash', 'cudnn', 'efficient')),
               model=dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, target_dim=target_dim, block_size=block_size,
                          vocab_size=vocab_size))
MODELS = split_list('models', models, str, lambda m: m.removesuffix(':rope') in ('ao', 'ao_table', 'gpt', 'mdm'),
                    'models among ao, ao_table, gpt, mdm (NAME:rope on the Llama/Qwen block)')
if any(m.endswith(':rope') for m in MODELS) and n_head % 2:
    raise UserError(f"--n_head must be even for a :rope model (n_head/2 key/value heads), got {n_head}")
MUON_DTYPE = {'adamw': None, 'muon': 'bfloat16', 'muon_fp32': 'float32'}  # --optimizer's names: Muon's NS dtype
OPTIMIZERS = split_list('optimizers', optimizers, str, lambda o: o in MUON_DTYPE,
                        'optimizers among adamw, muon, muon_fp32')
if optimizer and OPTIMIZERS[0] != 'adamw':
    raise UserError("--optimizers must start with adamw, the baseline the others are compared with")
if json_out:
    check_writable(json_out, 'json_out', 'optimizers.json', create=True)
if fsdp_ac and optimizer:
    raise UserError("--fsdp_ac times training steps; --optimizer times optimizer steps: pass one of them")
SHARDED = '+fsdp_ac'  # a model name's suffix: that model under fsdp=True and activation_checkpointing=True

torch.manual_seed(seed)
fast_math(device)  # as train.py: TF32 on CUDA, denormals flushed on the CPU
cuda = device.startswith('cuda')
ptdtype = {'bfloat16': torch.bfloat16, 'float16': torch.float16, 'float32': torch.float32}[dtype]
ctx = torch.autocast('cuda', dtype=ptdtype) if cuda else torch.autocast('cpu', enabled=False)
if sdpa != 'default':
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {'flash': SDPBackend.FLASH_ATTENTION, 'cudnn': SDPBackend.CUDNN_ATTENTION,
               'efficient': SDPBackend.EFFICIENT_ATTENTION}[sdpa]
    sdpa_kernel(backend).__enter__()  # for the whole run


def sync():
    if cuda:
        torch.cuda.synchronize()


if peak_flops is None and cuda:
    peak_flops = measure_matmul_peak(device)
    print(f"measured bf16 matmul peak: {peak_flops / 1e12:.0f} TFLOP/s")

# kernel (GPU) or op (CPU) names -> what they do; the first match wins, the rest is 'other'
KINDS = [('matmul', ('gemm', 'cutlass', 'nvjet', 'xmma', 'aten::mm', 'aten::addmm', 'aten::bmm', 'matmul')),
         ('attention', ('flash', 'fmha', 'attention', 'cudnn', 'scaled_dot_product')),
         ('fused elementwise (triton)', ('triton',)),
         ('softmax / cross-entropy', ('softmax', 'nll_loss', 'cross_entropy')),
         ('optimizer', ('adam', 'foreach', 'multi_tensor')),
         ('copy/cast', ('copy', 'cast', 'to_copy', 'memcpy'))]


def where_time_goes(name, step, steps=3):
    """Profile `steps` training steps: the share of kernel time (CPU: op time) by kind, and the top ops."""
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        sync()
    key = 'self_device_time_total' if cuda else 'self_cpu_time_total'
    evs = [(e.key, getattr(e, key)) for e in prof.key_averages() if getattr(e, key, 0) > 0]
    total = sum(t for _, t in evs)
    kinds = {}
    for k, t in evs:
        kind = next((kind for kind, words in KINDS if any(w in k.lower() for w in words)), 'other')
        kinds[kind] = kinds.get(kind, 0) + t
    print(f"profile {name}: {total / steps / 1e3:.1f} ms of {'GPU kernel' if cuda else 'CPU op'} time per step: "
          + ', '.join(f"{kind} {100 * t / total:.0f}%" for kind, t in sorted(kinds.items(), key=lambda kv: -kv[1])))
    for k, t in sorted(evs, key=lambda kv: -kv[1])[:10]:
        print(f"profile {name}: {100 * t / total:5.1f}%  {k[:100]}")


VARIANTS = {
    'ao': dict(cond='adaln'),
    'ao_table': dict(cond='adaln', adaln_table=True),
    'gpt': dict(cond='none'),
    'mdm': dict(cond='none', causal=False),
}
ROPE = dict(pos='rope', mlp='swiglu', n_kv_head=n_head // 2, mlp_hidden=3 * n_embd)  # 12 d^2 a block, as the paper's


def make_step(name, opt_name='adamw'):
    """(model, its training step, the list each step appends its optimizer seconds to when --optimizer)."""
    sharded, name = name.endswith(SHARDED), name.removesuffix(SHARDED)
    cfg = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, target_dim=target_dim, block_size=block_size,
                    vocab_size=vocab_size, **VARIANTS[name.removesuffix(':rope')],
                    **(ROPE if name.endswith(':rope') else {}))
    if sharded:  # train.py's model: built on meta, sharded (a world of one), its blocks compiled and recomputed
        model, fwd = build(asdict(cfg), None, device, fsdp=True, activation_checkpointing=True,
                           dtype=dtype if cuda else 'float32', compile=compile)
    else:
        model = GPT(cfg).to(device)
        fwd = torch.compile(model) if compile else model
    muon_dtype = MUON_DTYPE[opt_name]
    opts = configure_optimizers(model, 0.05, 3e-4, (0.9, 0.95), 'cuda' if cuda else 'cpu',  # train.py's defaults
                                optimizer='muon' if muon_dtype else 'adamw', muon_lr=0.02,
                                muon_dtype=muon_dtype or 'bfloat16')
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randint(0, min(vocab_size, 50257), (batch_size, block_size), device=device, generator=g)
    opt_s = []

    def step():
        with ctx:
            if cfg.causal:
                order = random_orders(batch_size, block_size, device, g) if cfg.cond != 'none' else None
                _, loss = fwd(x, order=order, targets=x)
            else:
                xt, t = mdm_corrupt(x, cfg.mask_token_id, g)
                _, loss = fwd(xt, targets=x, t=t)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if optimizer:  # only then: a synchronisation on each side of the optimizer step
            sync()
            t = time.perf_counter()
        for opt in opts:
            opt.step()
        if optimizer:
            sync()
            opt_s.append(time.perf_counter() - t)
        for opt in opts:
            opt.zero_grad(set_to_none=False)  # keep grads allocated so "held" memory is stable
    return model, step, opt_s


def bench(name):
    model, step, _ = make_step(name)
    for _ in range(warmup):
        step()
    sync()
    act_mem = peak = None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    dt = (time.perf_counter() - t0) / iters
    if cuda:
        peak = torch.cuda.max_memory_allocated()
        act_mem = peak - held
    if profile:
        where_time_goes(name, step)
    row = dict(result(name, model, dt, act_mem), peak=peak)
    del model, step
    if cuda:
        torch.cuda.empty_cache()
    return row


def bench_interleaved(names):
    """On the CPU, where other work shares the cores: every model built first, their steps interleaved (a load
    that drifts hits all alike), the median step of each. (On CUDA each model alone: its activation memory.)"""
    runs = {m: make_step(m)[:2] for m in names}
    for _ in range(warmup):
        for _, step in runs.values():
            step()
    times = {m: [] for m in names}
    for _ in range(iters):
        for m, (_, step) in runs.items():
            t0 = time.perf_counter()
            step()
            times[m].append(time.perf_counter() - t0)
    if profile:
        for m, (_, step) in runs.items():
            where_time_goes(m, step)
    return [dict(result(m, runs[m][0], sorted(times[m])[len(times[m]) // 2], None), peak=None) for m in names]


def result(name, model, dt, act_mem):
    """A table row: the model, its sizes, dt seconds a step, activation memory (CUDA) or None."""
    tok_s = batch_size * block_size / dt
    mfu = model.estimate_flops_per_token(block_size) * tok_s / peak_flops if peak_flops else None
    block = sum(p.numel() for p in model.transformer.h[0].parameters())  # AdaLN's Linear included
    return dict(model=name, params=model.get_num_params(), block_params=block, ms=dt * 1e3, tok_s=tok_s, mfu=mfu,
                act_mem=act_mem, flops_tok=model.estimate_flops_per_token(block_size))


def bench_optimizers(name):
    """--optimizer: the model once per optimizer, their steps interleaved (a drifting load, CPU or GPU clocks,
    hits all alike); medians over iters steps of each."""
    runs = {o: make_step(name, o) for o in OPTIMIZERS}
    for _ in range(warmup):
        for _, step, _ in runs.values():
            step()
    step_s = {o: [] for o in runs}
    for _, _, opt_s in runs.values():
        opt_s.clear()
    for _ in range(iters):
        for o, (_, step, _) in runs.items():
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            step_s[o].append(time.perf_counter() - t0)
    med = lambda xs: sorted(xs)[len(xs) // 2] * 1e3  # noqa: E731
    rows = [dict(model=name, optimizer=o, ms=med(step_s[o]), opt_ms=med(runs[o][2])) for o in runs]
    del runs
    if cuda:
        torch.cuda.empty_cache()
    return rows


def optimizer_table(rows):
    """Per model, AdamW's row then Muon's: the optimizer step's time, its share of the training step, and the
    ratios to AdamW's (medians; the step timed with a synchronisation on each side of the optimizer step)."""
    lines = ['| model | optimizer | ms/step | optimizer ms/step | optimizer share of step | optimizer step vs AdamW '
             '| step vs AdamW |', '|---|---|---|---|---|---|---|']
    for r in rows:
        a = next(x for x in rows if x['model'] == r['model'] and x['optimizer'] == 'adamw')
        lines.append(f"| {r['model']} | {r['optimizer']} | {r['ms']:.1f} | {r['opt_ms']:.2f} | "
                     f"{r['opt_ms'] / r['ms']:.1%} | {r['opt_ms'] / a['opt_ms']:.2f}x | {r['ms'] / a['ms']:.3f}x |")
    return '\n'.join(lines)


if optimizer:
    rows = [r for m in MODELS for r in bench_optimizers(m)]
    table = optimizer_table(rows)
    print(table)
    if json_out:
        record = dict(rows=rows, torch=torch.__version__, capability=torch.backends.cpu.get_cpu_capability(),
                      threads=torch.get_num_threads())
        atomic_write(json_out, lambda f: json.dump(record, f, indent=1), 'w')
    if write:
        append_benchmark('Optimizer step, AdamW against Muon', cuda, f"{n_layer}L/{n_embd}d/{n_head}H, block "
                         f"{block_size}, batch {batch_size}, {dtype if cuda else 'fp32'}, compile={compile}; Muon "
                         f"(muon: torch.optim.Muon's bf16 Newton-Schulz; muon_fp32: muon_dtype=float32) for the "
                         f"blocks' hidden matrices and AdaLN Linears, AdamW for the rest, as train.py's "
                         f"optimizer=muon.", table)
    sys.exit(0)

if fsdp_ac:
    from aogpt.runtime import start_ranks
    start_ranks(device, group=True)  # a world of one: FSDP shards over a process group
NAMES = MODELS + [m + SHARDED for m in MODELS] * fsdp_ac
rows = [bench(m) for m in NAMES] if cuda else bench_interleaved(NAMES)
base = next((r for r in rows if r['model'] == 'gpt'), None)
lines = ['| model | block | how | params | params a block | ms/step | tokens/s | MFU | act. mem (GiB) | peak mem (GiB) '
         '| tok/s vs gpt | act. mem vs gpt | tok/s vs paper block | tok/s vs one GPU |',
         '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
gib = lambda b: f"{b / 2**30:.2f}" if b is not None else 'n/a'  # noqa: E731
for r in rows:
    mfu = f"{100 * r['mfu']:.1f}%" if r['mfu'] is not None else 'n/a'
    rt = f"{r['tok_s'] / base['tok_s']:.3f}" if base else 'n/a'
    rm = f"{r['act_mem'] / base['act_mem']:.3f}" if base and r['act_mem'] is not None else 'n/a'
    plain, sharded = r['model'].removesuffix(SHARDED), r['model'].endswith(SHARDED)
    name, rope = plain.removesuffix(':rope'), plain.endswith(':rope')
    paper = next((x for x in rows if x['model'] == name), None)  # the same model on the paper's block
    rb = f"{r['tok_s'] / paper['tok_s']:.3f}" if rope and paper and not sharded else 'n/a'
    one = next(x for x in rows if x['model'] == plain)  # the same model unsharded, recomputing nothing
    rs = f"{r['tok_s'] / one['tok_s']:.3f}" if sharded else 'n/a'
    lines.append(f"| {name} | {'rope+swiglu+gqa' if rope else 'paper'} | "
                 f"{'fsdp + recompute (world 1)' if sharded else 'one GPU'} | {r['params'] / 1e6:.1f}M | "
                 f"{r['block_params']:,} | {r['ms']:.1f} | {r['tok_s']:,.0f} | {mfu} | {gib(r['act_mem'])} | "
                 f"{gib(r['peak'])} | {rt} | {rm} | {rb} | {rs} |")
table = '\n'.join(lines)
print(table)

if write:
    peak = f", MFU against a measured bf16 matmul peak of {peak_flops / 1e12:.0f} TFLOP/s" if peak_flops else ''
    append_benchmark('Training speed', cuda,
                     f"{n_layer}L/{n_embd}d/{n_head}H, block {block_size}, batch {batch_size}, "
                     f"{dtype if cuda else 'fp32'}, compile={compile}, sdpa={sdpa}{peak}.", table)
