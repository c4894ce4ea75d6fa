"""
Sample from a checkpoint: AO-GPT / sigma-GPT with the KV-cached any-order sampler, an encoder MDM with
the masked-diffusion reverse process, or an L2R GPT with plain KV-cache decoding (dispatched on
model.config). EMA weights by default.

    python sample.py --steps 1024                                        # from out/ckpt.pt
    python sample.py --prompt "The company said" --length 64 --steps 64  # a prefix
    python sample.py --template "The [BLANK] sat on the [BLANK:3] mat."  # infilling
    python sample.py --steps 256 --batch_size 32 --gen_ppl out-l2r      # + generative perplexity
    python sample.py --order blocks:64 --steps 256                       # semi-AR: blocks left to right
    python sample.py --order confidence --steps 64                       # the surest positions first
    python sample.py --order confidence --threshold 0.9                  # all with top prob >= 0.9 per step

The reverse process (paper eq. 8 and Lemma 1). Time runs over a grid t_0 = 1 > t_1 > ... > t_T = 0
(linear, or cosine) where t is the fraction of positions still masked. From t to s each still-masked
position is revealed with probability 1 - s/t, independently, and then draws its token from the model
given everything revealed *before* the step. Which positions get revealed does not depend on the model,
so we draw it up front: a uniformly random order, and per step k ~ Binomial(#masked, 1 - s/t) (drawn
jointly as the multinomial of n reveal times U ~ U[0,1) over the grid's bins). A step that reveals
nothing needs no forward pass. `fixed_counts` instead uses the paper code's deterministic counts.
The counts are shared across the batch, so the KV cache stays rectangular; each sample's own process is
still exactly the MDM reverse process (its revealed set is a uniform subset of the size the lemma says).

The KV-cached decoder step. Slot 0 is [None], slot j >= 1 holds the j-th revealed token; slot j predicts
position order[j]. With m tokens revealed and the cache holding slots 0..c-1, a step revealing k tokens
feeds the pending slots c..m-1 (their targets chain along the order) and k copies of slot m, each copy
with one new target order[m..m+k-1]. The copies cannot see each other (model.forward_slots' parallel
block), so every copy computes exactly the conditional the model was trained on. The cache then keeps
the pending slots and the first copy (c becomes m + 1). A token goes through the network as a query (a
copy carrying its target) and then as context; the first copy is both. So a run costs n + sum over all
steps but the last of (k - 1) token-passes: n when every step reveals one token, under 2n for any T.

Orders. random is the MDM reverse process above. l2r, blocks:K (semi-autoregressive: blocks of K
positions left to right, a uniform order inside each) and a file of positions change only the order,
so the sampler stays exact for the mixture over the orders they allow. confidence / margin / entropy
(LLaDA's and Dream's) choose the positions from the model's own scores: each step queries every masked
position (one copy each) and reveals the k surest, or every one whose top probability reaches
--threshold; the cache stays exact, at about n T / 2 token-passes (generate_confident).

Randomness, from one CPU torch.Generator in a fixed order (reproducible on any device): first one
float64 uniform per token, consumed by inverse-CDF sampling in reveal order; then the order; then the
counts. So `--order l2r --fixed_counts --steps n` reproduces generate_ar (uncached or cached L2R
decoding) token for token, and the encoder sampler with and without `cache_trick` gives identical
samples under the same seed.
"""

import json
import math
import os
import re
import sys
import time
import unicodedata

import torch
from torch.nn import functional as F

from configurator import die, namespace, print_config
from model import GPT, parallel_mask, random_orders
from runtime import autocast, resolve_device

# -----------------------------------------------------------------------------
# CLI config (python sample.py --help lists these with their comments)
out_dir = 'out'            # checkpoint directory (its ckpt.pt)
ckpt = ''                  # checkpoint file or dir, export.py folder, or hf:owner/repo[/path.pt]; overrides out_dir
use_ema: bool = None       # None: the EMA weights if the checkpoint has them; True/False to force
dataset = ''               # a data dir or name to check the codec against; '' = the checkpoint's codec
batch_size = 4             # samples per batch (they share the per-step counts, see the docstring)
num_batches = 1            # batches to draw (more samples for --gen_ppl)
steps = 256                # T: diffusion steps (a GPT ignores it: one token per step)
length = -1                # total length n; -1: block_size (with --template: the template's length)
order = 'auto'             # auto | random | l2r | blocks:K | confidence | margin | entropy | FILE of positions
threshold = 0.0            # confidence orders: reveal every position whose top probability is >= this (0: counts)
fixed_counts = False       # the paper code's deterministic counts instead of Binomial draws
schedule = 'linear'        # linear | cosine (t = cos(pi/2 (1 - u))): fraction still masked per step
temperature = 1.0          # softmax temperature, >= 0; 0 = greedy
top_p = 1.0                # nucleus sampling, in (0, 1]: keep the most likely tokens up to this mass
prompt = ''                # text the samples start with
suffix = ''                # text the samples end with
template = ''              # text with [BLANK] (blank_len tokens) or [BLANK:k] (k tokens) spans to fill
blank_len = 8              # tokens per [BLANK], >= 1
speculative = ''           # K (draft length >= 2) or auto: exact speculative sampling along --order (speculative.py)
stepper = 'dynamic'        # forward calls: dynamic | static (fixed padded shapes) | cuda_graph (static, replayed)
cache_trick = True         # encoder MDM: a step that reveals nothing reuses the last pass (MDLM)
mdm_counts = 'shared'      # encoder MDM: shared (one count per step for the batch) | independent (per sample)
gen_ppl = ''               # judge: a checkpoint of ours (any --ckpt form), or HF GPT-2 (a dir or hf:owner/repo)
gen_ppl_mode = 'auto'      # none: all n scored after [None]; hf: no BOS, token 0 unscored; auto: hf for HF
judge_batch_size = 16      # judge forward batch, >= 1
trace = ''                 # write an HTML page of how each sample (of the last batch) filled in, step by step
save = ''                  # write the samples (ids, text) and stats as JSON to this file (its folder must exist)
seed = 1337
device = 'auto'            # auto | cpu | cuda | cuda:1 | mps
dtype = 'auto'             # auto (bfloat16 autocast on CUDA, float32 elsewhere) | float32 | bfloat16 | float16
quiet = False              # do not print the samples
# -----------------------------------------------------------------------------

_CHUNK = 1 << 25  # float64 elements per sampling chunk (256 MiB): bounds memory when a step reveals a lot


# ----------------------------------------------------------------------------- the schedule

def time_grid(steps, schedule='linear'):
    """(T + 1,) float64: t_0 = 1 > ... > t_T = 0, the fraction of positions still masked after step i."""
    u = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    if schedule == 'linear':
        t = u
    elif schedule == 'cosine':  # reveals slowly at first, fast at the end (the paper code's option)
        t = torch.cos((1.0 - u) * math.pi / 2)
    else:
        raise ValueError(f"schedule must be 'linear' or 'cosine', got {schedule!r}")
    t[0], t[-1] = 1.0, 0.0
    return t


def reveal_step(U, t):
    """The step i with t[i+1] <= U < t[i] in which a position with reveal time U in [0, 1) unmasks."""
    T = t.numel() - 1
    return T - torch.searchsorted(t.flip(0), U, right=True)


def reveal_counts(n, steps, schedule='linear', fixed=False, generator=None):
    """(T,) LongTensor: how many of n masked positions each step reveals; sums to n.

    Lemma 1: from t to s a masked position unmasks with probability 1 - s/t. That is the same as giving
    each position a reveal time U ~ U[0, 1) (masked at time t iff U < t), so the per-step counts are
    the multinomial of n uniforms over the grid's bins: k_i ~ Binomial(#still masked, 1 - t_{i+1}/t_i).
    fixed: the paper code's counts, cumulative max(int(n (1 - t_{i+1})), previous + 1), capped at n.
    """
    t = time_grid(steps, schedule)
    if fixed:
        cum, prev = [], 0
        for ti in t[1:].tolist():
            prev = min(n, max(int(n * (1.0 - ti)), prev + 1))
            cum.append(prev)
        cum[-1] = n
        return torch.diff(torch.tensor([0] + cum))
    U = torch.rand(n, dtype=torch.float64, generator=generator)
    return torch.bincount(reveal_step(U, t), minlength=steps)


# ----------------------------------------------------------------------------- drawing tokens

def sample_tokens(logits, u, temperature=1.0, top_p=1.0, vocab_size=None, ban=None, score=None):
    """One token per row of logits (..., V), by inverse-CDF sampling with the uniforms u (...).

    float64 throughout: low-precision (bf16/fp32) Gumbel noise lowers the effective temperature, this
    cannot. Ids >= vocab_size (the head's padding rows) and `ban` (the encoder's [MASK]) are never drawn.
    temperature 0 is greedy; top_p < 1 keeps the smallest set of most likely tokens whose mass reaches
    top_p (the HF convention: the token that crosses top_p is kept).
    score: None, or how sure the model is of each row, for the confidence orders; then returns
    (tokens, scores, top probabilities), each (...). Scores are computed on the distribution the token
    was drawn from (after temperature and top_p; at temperature 0 the plain softmax): 'confidence' the
    probability of the drawn token, 'margin' the top probability minus the second, 'entropy' the
    negative entropy (higher is surer in every mode).
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    shape = logits.shape[:-1]
    V = logits.size(-1) if vocab_size is None else min(vocab_size, logits.size(-1))
    logits = logits.reshape(-1, logits.size(-1))[:, :V]
    u = u.reshape(-1).to(device=logits.device, dtype=torch.float64)
    rows = max(1, _CHUNK // V)
    parts = [_sample_rows(logits[a:a + rows], u[a:a + rows], temperature, top_p, ban, score)
             for a in range(0, logits.size(0), rows)]  # bounded memory when a step draws many rows
    if score is None:
        return torch.cat(parts).view(shape)
    return tuple(torch.cat(p).view(shape) for p in zip(*parts))


def _sample_rows(logits, u, temperature, top_p, ban, score=None):
    logp = logits.double()
    if ban is not None and ban < logp.size(1):
        logp = logp.index_fill(1, torch.tensor([ban], device=logp.device), -math.inf)
    if temperature == 0:
        tok = logp.argmax(1)
        return tok if score is None else (tok, *_scores(torch.softmax(logp, dim=1), tok[:, None], score))
    p = torch.softmax(logp if temperature == 1 else logp / temperature, dim=1)  # (R, V) float64
    idx = None
    if top_p < 1.0:
        p, idx = _sorted_nucleus(p, top_p)
    cdf = p.cumsum(1)
    total = cdf[:, -1:]
    # the first index whose cdf exceeds u * total; clamping below total keeps the index at or before the
    # last token with positive probability, and a zero-probability token can never be the first to exceed
    v = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    j = torch.searchsorted(cdf, v, right=True)  # (R, 1)
    tok = (idx.gather(1, j) if idx is not None else j).squeeze(1)
    return tok if score is None else (tok, *_scores(p / total, j, score))


def _scores(p, j, score):
    """(scores (R,), top probabilities (R,)) for rows of normalised probabilities p (R, V) whose drawn
    tokens sit at columns j (R, 1) of p."""
    top2 = p.topk(min(2, p.size(1)), dim=1).values
    if score == 'confidence':
        s = p.gather(1, j).squeeze(1)
    elif score == 'margin':
        s = top2[:, 0] - (top2[:, 1] if top2.size(1) > 1 else 0)
    elif score == 'entropy':
        s = (p * p.clamp(min=1e-300).log()).sum(1)
    else:
        raise ValueError(f"score must be confidence, margin or entropy, got {score!r}")
    return s, top2[:, 0]


def _sorted_nucleus(p, top_p):
    """p (R, V) sorted in descending order with every token after the nucleus zeroed (a token is dropped
    once the mass before it reaches top_p), and the sorted ids. A full sort of a 50k vocab is slow on a
    CPU and the nucleus is usually small, so there the top 64, then 1024 are tried first: exact whenever
    they already hold top_p of the mass. On a GPU we sort directly (no host sync)."""
    for k in ((64, 1024) if not p.is_cuda else ()):
        if k >= p.size(1):
            break
        ps, idx = p.topk(k, dim=1)
        cum = ps.cumsum(1)
        if bool((cum[:, -1] >= top_p).all()):
            return ps.masked_fill(cum - ps >= top_p, 0.0), idx
    ps, idx = p.sort(dim=1, descending=True)
    return ps.masked_fill(ps.cumsum(1) - ps >= top_p, 0.0), idx


# ----------------------------------------------------------------------------- orders and given tokens

def split_given(given, n):
    """given: None or a LongTensor (n,) of token ids with -1 at the positions to generate (shared by
    the batch). Returns (given positions ascending, their tokens, free positions ascending)."""
    if given is None:
        given = torch.full((n,), -1, dtype=torch.long)
    given = torch.as_tensor(given, dtype=torch.long).cpu()
    if given.shape != (n,):
        raise ValueError(f"given must have shape ({n},), got {tuple(given.shape)}")
    is_given = given >= 0
    pos = is_given.nonzero().squeeze(1)
    free = (~is_given).nonzero().squeeze(1)
    if free.numel() == 0:
        raise ValueError("nothing to generate: every position is given")
    return pos, given[pos], free


ORDERS = ('random', 'l2r', 'blocks:K', 'confidence', 'margin', 'entropy')
_ADAPTIVE = ('confidence', 'margin', 'entropy')  # chosen step by step from the model's own scores


def check_order(order):
    """A generation order spec, checked: one of ORDERS (K a positive integer), or a permutation tensor.
    Raises ValueError naming what is accepted."""
    if not isinstance(order, str):
        return order
    if order in ('random', 'l2r') or order in _ADAPTIVE:
        return order
    if order.startswith('blocks:') and order[7:].isdigit() and int(order[7:]) >= 1:
        return order
    raise ValueError(f"unknown order {order!r}: use random, l2r, blocks:K (K >= 1: blocks of K positions "
                     f"left to right, a random order inside each), confidence, margin or entropy")


def free_order(order, free, batch_size, generator=None):
    """(B, n_free) generation order of the free positions: 'random' (uniform per sample), 'l2r',
    'blocks:K' (positions in blocks of K, blocks left to right, a uniform order inside each block:
    semi-autoregressive decoding), or a permutation (n,) / (B, n) of all positions, of which the free
    ones are taken in its order."""
    B, nf = batch_size, free.numel()
    if isinstance(order, str):
        if order == 'random':
            return free[random_orders(B, nf, generator=generator)]
        if order == 'l2r':
            return free.expand(B, nf).clone()
        if check_order(order).startswith('blocks:'):
            # block index + a uniform in [0, 1): sorting puts blocks in order and shuffles inside each
            keys = (free // int(order[7:])).double() + torch.rand(B, nf, dtype=torch.float64, generator=generator)
            return free[keys.argsort(dim=1)]
        raise ValueError(f"free_order takes random, l2r, blocks:K or a permutation, not {order!r}")
    o = torch.as_tensor(order, dtype=torch.long).cpu()
    o = o.expand(B, -1) if o.dim() == 1 else o
    n = o.size(1)
    if o.size(0) != B or not torch.equal(o.sort(1).values, torch.arange(n).expand(B, n)):
        raise ValueError(f"order must be a permutation of range({n}) per sample")
    is_free = torch.zeros(n, dtype=torch.bool)
    is_free[free] = True
    return o[is_free[o]].view(B, nf)


# ----------------------------------------------------------------------------- the samplers

_STEPPERS = ('dynamic', 'static', 'cuda_graph')
KV_BUCKET = 128  # fixed-shape calls attend over the cache up to a multiple of this many slots (SlotStepper)


class KVCache:
    """The sampler's K/V: per-layer buffers of block_size slots, preallocated and written in place (no copy
    of the cache per step). It is the model's `kv` hook: update(layer, k, v) stores a call's rows and
    returns what the call attends over.

    `len` counts the committed slots. A call writes its r rows after them, at [len, len + r), and
    attends over [0, len + r); keep(j) then commits the first j of those rows, and the rest (the
    throw-away parallel copies) are simply overwritten by the next call. The live length never exceeds
    n: committed slots plus the rows of one call is at most the number of tokens in the sequence.

    static=True is the fixed-shape layout of SlotStepper's 'static' and 'cuda_graph' modes: a call
    writes at the rows named in `write_idx` and attends over the first `span` slots under a mask (span is
    the live length rounded up to a bucket, so that it takes a few values per run); the buffers are
    zeroed (a masked NaN would still poison the output through 0 * NaN) and one slot longer than
    block_size, so that padding rows have a scratch row to write.
    """

    @staticmethod
    def static_len(block_size):
        """Slots of a static cache: past block_size (a scratch row), 16-aligned (mask rows for SDPA)."""
        return (block_size // 16 + 1) * 16

    def __init__(self, model, batch_size, static=False):
        cfg = model.config
        S = self.static_len(cfg.block_size) if static else cfg.block_size
        self.shape = (batch_size, cfg.n_head, S, cfg.n_embd // cfg.n_head)
        self.n_layer, self.static = cfg.n_layer, static
        self.k = self.v = None
        self.len = 0
        self.write_idx = None  # static: (R,) cache rows of the current call's R rows
        self.span = S          # static: the slots the current call attends over, [0, span)

    def allocate(self, device, dtype):
        new = torch.zeros if self.static else torch.empty
        self.k = [new(self.shape, device=device, dtype=dtype) for _ in range(self.n_layer)]
        self.v = [new(self.shape, device=device, dtype=dtype) for _ in range(self.n_layer)]

    def update(self, layer, k, v):
        """Store one call's K/V (B, nh, r, hd) for a layer; return the keys and values to attend over."""
        if self.k is None:  # allocated lazily, so the dtype follows autocast
            self.allocate(k.device, k.dtype)
        K, V = self.k[layer], self.v[layer]
        if self.static:  # not cut at the live length (new every call): a span of a few sizes, and a mask
            K.index_copy_(2, self.write_idx, k.to(K.dtype))
            V.index_copy_(2, self.write_idx, v.to(V.dtype))
            return K[:, :, :self.span], V[:, :, :self.span]
        L, r = self.len, k.size(2)
        if L + r > self.shape[2]:
            raise ValueError(f"KV cache overflow: {L} cached + {r} new rows > block_size {self.shape[2]}")
        K[:, :, L:L + r] = k.to(K.dtype)
        V[:, :, L:L + r] = v.to(V.dtype)
        return K[:, :, :L + r], V[:, :, :L + r]

    def keep(self, rows, chosen=None):
        """Commit the first `rows` rows of the last call; rows=None empties the cache for a new run (the
        slots are always written before anyone reads them). chosen (B,): the last kept row is not the
        call's row rows - 1 but, per sample, the parallel copy `chosen` places after it (the confidence
        orders keep whichever copy the model was surest of)."""
        if rows is None:
            self.len = 0
            return
        if chosen is not None:
            dst = self.len + rows - 1
            b = torch.arange(self.shape[0], device=chosen.device)
            for buf in self.k + self.v:
                buf[b, :, dst] = buf[b, :, dst + chosen]
        self.len += rows


def _stepper_device(model, mode):
    """The model's device, after checking that a stepper can run there in this mode."""
    if mode not in _STEPPERS:
        raise ValueError(f"stepper must be one of {', '.join(_STEPPERS)}, got {mode!r}")
    dev = next(model.parameters()).device
    if mode == 'cuda_graph' and dev.type != 'cuda':
        raise ValueError(f"stepper='cuda_graph' needs the model on a CUDA device (it is on {dev}); "
                         "use 'static' or 'dynamic'")
    return dev


def capture_graph(fn, dev, pool):
    """fn() captured as a CUDA graph: (graph, fn's output tensors, which each replay rewrites). fn must
    read its inputs from, and write its outputs to, tensors that outlive the graph."""
    # Autocast's weight-cast cache would hand the graph tensors freed after capture: disable it.
    ac, adt = torch.is_autocast_enabled('cuda'), torch.get_autocast_dtype('cuda')
    actx = lambda: torch.autocast('cuda', dtype=adt, enabled=ac, cache_enabled=False)  # noqa: E731
    # Warm up on a side stream first (lazy inits, cuBLAS/attention setup): replays must find them done.
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side), actx():
        for _ in range(2):
            fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool), actx():
        out = fn()
    return g, out


class SlotStepper:
    """One decoder call of the KV-cached samplers: r slot rows in (r - k pending slots, then k copies of
    the last revealed slot, each with its own target), logits (B, k, V) of the copies out. The caller
    then commits what the cache keeps (stepper.cache.keep): the pending slots and one copy.

    mode 'dynamic': model.forward_slots at the call's own shape (r rows attending over L + r slots).
    'static': a few fixed shapes: r padded up to two sizes per octave (1, 2, 3, 4, 6, 8, 12, 16, 24, ...;
        rows_for), every row attending over the cache up to a span under a mask, the span being L + r
        rounded up to a multiple of kv_bucket slots (0: the whole cache, one span). More arithmetic
        (1-17% more rows for the plans in bench/sample_roofline.py, and up to kv_bucket more K/V slots
        read per call); the same samples. It exists for:
    'cuda_graph': static, and each (padded rows, span) shape is captured once as a CUDA graph and then
        replayed. A forward call of a deep model at a few rows per sample is launch-bound on a GPU
        (hundreds of small kernels issued from Python; BENCHMARKS.md), and every new (rows, cache length)
        shape pays kernel setup; a replayed graph pays neither. All graphs share one memory pool, which is
        safe because one graph's output is consumed (lm_head) before any other graph is replayed.
    lm_head and the token draws run outside the graph on just the k copies.
    A stepper can serve many runs (generate_ao/generate_ar take one for `stepper` and empty its cache,
    see make), so the graphs are captured once per padded shape, not once per batch.
    Why spans: reading the whole cache in every call makes the fixed-shape floor 1.4-1.7x the dynamic
    one at n = 1024, B = 32 (K/V reads dominate most calls, and most see a short live cache); with
    128-slot buckets it is 1.08-1.16x, for 8-52 graphs per run instead of 1-9 (bench/sample_roofline.py
    counts both).
    """

    def __init__(self, model, batch_size, mode='dynamic', kv_bucket=KV_BUCKET):
        dev = _stepper_device(model, mode)
        if kv_bucket < 0 or kv_bucket % 16:
            raise ValueError(f"kv_bucket must be 0 (the whole cache) or a positive multiple of 16 (the SDPA mask "
                             f"alignment), got {kv_bucket}")
        self.model, self.mode, self.B, self.dev, self.kv_bucket = model, mode, batch_size, dev, kv_bucket
        self.cache = KVCache(model, batch_size, static=mode != 'dynamic')
        if mode != 'dynamic':
            self.scalars = torch.zeros(3, dtype=torch.long, device=dev)  # L, blk, r: read at replay
            self.bufs, self.graphs, self.outs = {}, {}, {}
            self.pool = torch.cuda.graph_pool_handle() if mode == 'cuda_graph' else None
        if mode == 'cuda_graph':
            # A call's scalars go up from pinned buffers, asynchronously: a copy from pageable memory waits
            # for the GPU to finish everything queued, so the host could never run ahead of the replays.
            # Each buffer is rewritten only after the copy that last read it is done (its event).
            self.staging = [(torch.zeros(3, dtype=torch.long, pin_memory=True), torch.cuda.Event())
                            for _ in range(4)]
            self.turn = 0

    @classmethod
    def make(cls, model, batch_size, stepper):
        """A fresh stepper for a mode name, or the given stepper emptied for a new run."""
        if not isinstance(stepper, SlotStepper):
            return cls(model, batch_size, stepper)
        if stepper.model is not model or stepper.B != batch_size:
            raise ValueError(f"this SlotStepper was built for another model or batch size ({stepper.B})")
        stepper.cache.keep(None)
        return stepper

    @staticmethod
    def rows_for(r):
        """The padded row count for r rows: the next of 1, 2, 3, 4, 6, 8, 12, ... (under 1.5 r). On the
        plans in bench/sample_roofline.py powers of two alone pad 15-38% more token-passes in all, these
        1-17%, for a few more shapes (graphs) per run."""
        R = 1 << (r - 1).bit_length()
        return R * 3 // 4 if R >= 4 and r <= R * 3 // 4 else R

    @staticmethod
    def span_for(L, R, S, kv_bucket):
        """The slots a fixed-shape call attends over: L cached + R padded rows, rounded up to kv_bucket,
        at most the whole cache S (kv_bucket 0: always S). Every row a real row writes is inside it."""
        return S if not kv_bucket else min(S, -(-(L + R) // kv_bucket) * kv_bucket)

    def __call__(self, tok, pos, tgt, k, n_logits=None):
        # n_logits: logits of the last n_logits rows instead of the k copies' (speculative's verify call)
        B, r = tok.shape
        nl = k if n_logits is None else n_logits
        if self.mode == 'dynamic':
            mask = parallel_mask(r, k, self.cache.len, tok.device) if k > 1 else None  # None: causal
            return self.model.forward_slots(tok, pos, tgt, mask=mask, kv=self.cache, n_logits=nl)
        R = self.rows_for(r)
        key = R, self.span_for(self.cache.len, R, self.cache.shape[2], self.kv_bucket)
        if R not in self.bufs:
            self.bufs[R] = torch.empty(3, B, R, dtype=torch.long, device=self.dev)
        buf = self.bufs[R]                                                # (3, B, R): tok, pos, tgt
        buf[:, :, :r] = torch.stack([tok, pos, tgt])
        buf[:, :, r:] = buf[:, :, r - 1:r]                                # padding: repeat the last row
        if self.mode == 'static':
            self.scalars.copy_(torch.tensor([self.cache.len, r - k, r]))
            h = self._forward(*key)
        else:
            host, done = self.staging[self.turn % len(self.staging)]
            self.turn += 1
            done.synchronize()                                            # its last copy has finished
            host[0], host[1], host[2] = self.cache.len, r - k, r
            self.scalars.copy_(host, non_blocking=True)
            done.record()
            if key not in self.graphs:
                self._capture(*key)
            self.graphs[key].replay()
            h = self.outs[key]
        return self.model.lm_head(h[:, r - nl:r])                         # (B, nl, V)

    def _forward(self, R, span):
        """The fixed-shape call: final-norm hidden states (B, R, C) of R rows (blk pending slots, then
        r - blk copies, then padding), with L, blk and r read from device tensors, so that a captured
        graph reads their values at replay. Every row attends over the first `span` cache slots under a
        mask (no shape depends on L itself): a pending row sees the cache and the pending rows up to
        itself, a copy sees the cache, the pending rows and itself, a padding row the same plus slot 0:
        never an empty softmax, which some kernels turn into 0 and others into NaN, and a NaN anywhere in
        the cache poisons every row through 0 * NaN. Real rows are written at L + i; padding rows past
        the buffer share its last (scratch) row, which no real row ever sees."""
        buf, (L, blk, r), S = self.bufs[R], self.scalars, self.cache.shape[2]
        i = torch.arange(R, device=self.dev)[:, None]                    # (R, 1) row
        j = torch.arange(span, device=self.dev)[None, :]                 # (1, span) cache slot
        vis = (j < L + torch.minimum(i + 1, blk)) | (j == L + i) | ((i >= r) & (j == 0))   # (R, span)
        self.cache.write_idx = (L + i[:, 0]).clamp(max=S - 1)             # (R,)
        self.cache.span = span
        try:
            return self.model.hidden_slots(buf[0], buf[1], buf[2], mask=vis, kv=self.cache)
        finally:
            self.cache.write_idx, self.cache.span = None, S

    def _capture(self, R, span):
        if self.cache.k is None:  # the K/V dtype is what c_attn returns: the autocast dtype or the weights'
            ac = torch.is_autocast_enabled('cuda')
            self.cache.allocate(self.dev, torch.get_autocast_dtype('cuda') if ac
                                else next(self.model.parameters()).dtype)
        # The warm-up calls write the same K/V rows the replay will, so they change nothing.
        self.graphs[R, span], self.outs[R, span] = capture_graph(lambda: self._forward(R, span), self.dev,
                                                                 self.pool)


class EncoderStepper:
    """The encoder MDM's forward pass, (B, n) ids -> final-norm hidden states (B, n, C). Its shape never
    changes, so 'cuda_graph' captures it once and replays it at every step: the graphed encoder is the
    fair baseline for the graphed AO sampler (bench/sample_speed.py). 'static' runs the same plumbing
    (a fixed input buffer) eagerly, which is what the CPU tests check."""

    def __init__(self, model, batch_size, n, mode='dynamic'):
        dev = _stepper_device(model, mode)
        self.model, self.mode, self.B, self.n = model, mode, batch_size, n
        self.x = torch.empty(batch_size, n, dtype=torch.long, device=dev) if mode != 'dynamic' else None
        self.graph = self.out = None
        self.pool = torch.cuda.graph_pool_handle() if mode == 'cuda_graph' else None
        self.dev = dev

    @classmethod
    def make(cls, model, batch_size, n, stepper):
        if not isinstance(stepper, EncoderStepper):
            return cls(model, batch_size, n, stepper)
        if stepper.model is not model or (stepper.B, stepper.n) != (batch_size, n):
            raise ValueError(f"this EncoderStepper was built for another model or shape ({stepper.B}, {stepper.n})")
        return stepper

    def __call__(self, x):
        if self.mode == 'dynamic':
            return self.model.encoder_hidden(x)
        self.x.copy_(x)
        if self.mode == 'static':
            return self.model.encoder_hidden(self.x)
        if self.graph is None:
            self.graph, self.out = capture_graph(lambda: self.model.encoder_hidden(self.x), self.dev, self.pool)
        self.graph.replay()
        return self.out


def draw_plan(n, batch_size, steps, order='random', fixed_counts=False, schedule='linear', given=None,
              generator=None):
    """Everything generate_ao decides before its first forward pass, in its fixed order of draws: one
    float64 uniform per token (consumed in reveal order by the token draws), the order, the counts.
    Returns (u (B, n), reveal (B, n) positions in reveal order (the given ones first, ascending),
    counts (T,) tokens revealed per step, the given positions, their tokens)."""
    B = batch_size
    gpos, gtok, free = split_given(given, n)
    u = torch.rand(B, n, dtype=torch.float64, generator=generator)
    reveal = torch.cat([gpos.expand(B, gpos.numel()), free_order(order, free, B, generator)], 1)
    counts = reveal_counts(free.numel(), steps, schedule, fixed_counts, generator)
    return u, reveal, counts, gpos, gtok


def ao_calls(counts, n_given=0):
    """The AO sampler's forward calls for per-step counts, as (r rows, L cached slots, k copies): a call
    feeds the slots revealed at the previous step but the first (pending, their targets chained along
    the order), then k copies of the last revealed slot; a step that reveals nothing makes no call. The
    given tokens are pending at the first call."""
    calls, c, m = [], 0, n_given
    for k in counts:
        if k:
            calls.append((m - c + k, c, k))
            c, m = m + 1, m + k
    return calls


@torch.no_grad()
def generate_ao(model, n, batch_size, steps, order='random', fixed_counts=False, schedule='linear',
                temperature=1.0, top_p=1.0, vocab_size=None, given=None, generator=None, stepper='dynamic',
                threshold=0.0):
    """KV-cached any-order sampling from an AO-GPT / sigma-GPT. Returns (tokens (B, n), stats).

    order: 'random' (the MDM reverse process), 'l2r', 'blocks:K' (semi-autoregressive) or a permutation,
    all fixed before the first pass; or 'confidence' / 'margin' / 'entropy', chosen step by step from
    the model's scores (generate_confident; threshold applies there).
    given: LongTensor (n,) with -1 at the positions to generate; the given tokens enter the cache first
    (ascending positions, in the first pass), the rest follow `order`. stats: steps, forward_calls,
    token_passes (rows through the network per sample), tokens_generated, counts (the per-step counts
    of the steps that ran), order (B, n) positions in reveal order.
    stepper: how each forward call runs: 'dynamic', 'static' or 'cuda_graph', or a SlotStepper to reuse
    (its captured graphs); the samples are the same up to float rounding.
    """
    if not model.any_order:
        raise ValueError("generate_ao needs an any-order decoder (cond='adaln' or 'sigma'); "
                         "use generate_ar for a GPT and generate_mdm for an encoder")
    if n > model.config.block_size:
        raise ValueError(f"n = {n} > block_size {model.config.block_size}")
    if isinstance(check_order(order), str) and order in _ADAPTIVE:
        return generate_confident(model, n, batch_size, steps, order, fixed_counts, schedule, threshold,
                                  temperature, top_p, vocab_size, given, generator, stepper)
    if threshold:
        raise ValueError("threshold applies to the confidence orders (confidence, margin, entropy) only")
    dev = next(model.parameters()).device
    B = batch_size
    u, reveal, counts, gpos, gtok = draw_plan(n, B, steps, order, fixed_counts, schedule, given, generator)
    g = gpos.numel()
    calls = ao_calls(counts.tolist(), g)
    slot_tok = torch.full((B, n + 1), -1, dtype=torch.long)               # slot j: the j-th revealed token
    slot_tok[:, 1:g + 1] = gtok
    slot_tok = slot_tok.to(dev)
    slot_pos = torch.cat([torch.full((B, 1), -1), reveal], 1).to(dev)      # its position; [None] is -1
    reveal, u = reveal.to(dev), u.to(dev)

    rows = []  # every call's slots (the pending ones, then k copies of the last), up front: one copy to
    for r, L, k in calls:  # the device, not one per call
        rows += list(range(L, L + r - k)) + [L + r - k] * k
    rows = torch.tensor(rows, device=dev)
    step = SlotStepper.make(model, B, stepper)
    a = 0
    for r, L, k in calls:
        m = L + r - k                                                     # tokens revealed so far
        slots = rows[a:a + r]
        logits = step(slot_tok[:, slots], slot_pos[:, slots], reveal[:, L:m + k], k)  # (B, k, V)
        step.cache.keep(r - k + 1)                                        # the pending slots and the first copy
        slot_tok[:, m + 1:m + k + 1] = sample_tokens(logits, u[:, m:m + k], temperature, top_p, vocab_size)
        a += r
    tokens = torch.empty(B, n, dtype=torch.long, device=dev).scatter_(1, reveal, slot_tok[:, 1:])
    stats = dict(steps=steps, forward_calls=len(calls), token_passes=sum(r for r, _, _ in calls),
                 tokens_generated=n - g, counts=[k for _, _, k in calls], order=reveal)
    return tokens, stats


@torch.no_grad()
def generate_confident(model, n, batch_size, steps, score='confidence', fixed_counts=False, schedule='linear',
                       threshold=0.0, temperature=1.0, top_p=1.0, vocab_size=None, given=None, generator=None,
                       stepper='dynamic'):
    """Confidence-ordered decoding (LLaDA's low-confidence remasking, Dream's margin and entropy) on the
    exact KV cache. Each step scores every still-masked position in one pass (one query copy per masked
    position, the parallel block), draws a candidate token for each, and reveals the k surest: k from
    the Lemma-1 counts (as generate_ao), or with threshold > 0 every position whose top probability is
    at least threshold (and at least one). The revealed tokens enter the cache in that order, surest
    first, so the cache holds exactly what a cache-free pass over the same order would compute. A step
    costs its pending slots plus one row per masked position: about n T / 2 token-passes for T equal
    steps, against under 2n for the fixed orders (stats token_passes).
    Randomness: the counts first (when used), then per step one float64 uniform per masked position.
    With a threshold the number of steps differs between samples, so each sample is decoded on its own
    (batch 1, one after another); stats then give the mean calls and token-passes per sample.
    """
    if threshold and batch_size > 1:
        runs = [generate_confident(model, n, 1, steps, score, fixed_counts, schedule, threshold, temperature,
                                   top_p, vocab_size, given, generator,
                                   stepper if isinstance(stepper, str) else stepper.mode) for _ in range(batch_size)]
        stats = dict(steps=None, tokens_generated=runs[0][1]['tokens_generated'],
                     forward_calls=sum(st['forward_calls'] for _, st in runs) / batch_size,
                     token_passes=sum(st['token_passes'] for _, st in runs) / batch_size,
                     counts=[st['counts'] for _, st in runs], order=torch.cat([st['order'] for _, st in runs]))
        return torch.cat([x for x, _ in runs]), stats
    dev = next(model.parameters()).device
    B = batch_size
    gpos, gtok, free = split_given(given, n)
    g = gpos.numel()
    counts = [] if threshold else [k for k in reveal_counts(free.numel(), steps, schedule, fixed_counts,
                                                              generator).tolist() if k]
    reveal = torch.empty(B, n, dtype=torch.long, device=dev)             # positions in reveal order
    reveal[:, :g] = gpos.to(dev)
    slot_tok = torch.full((B, n + 1), -1, dtype=torch.long, device=dev)  # slot j: the j-th revealed token
    slot_pos = torch.full((B, n + 1), -1, dtype=torch.long, device=dev)  # and its position
    slot_tok[:, 1:g + 1], slot_pos[:, 1:g + 1] = gtok.to(dev), gpos.to(dev)
    masked = torch.zeros(B, n, dtype=torch.bool, device=dev)
    masked[:, free.to(dev)] = True
    ar = torch.arange(n, device=dev)
    step = SlotStepper.make(model, B, stepper)
    m, passes, ks = g, 0, []
    while m < n:
        c, nm = step.cache.len, n - m                                    # cached slots, masked positions
        qpos = torch.where(masked, ar, n).sort(dim=1).values[:, :nm]     # (B, nm) the masked positions
        tok = torch.cat([slot_tok[:, c:m], slot_tok[:, m:m + 1].expand(B, nm)], 1)
        pos = torch.cat([slot_pos[:, c:m], slot_pos[:, m:m + 1].expand(B, nm)], 1)
        logits = step(tok, pos, torch.cat([reveal[:, c:m], qpos], 1), nm)  # (B, nm, V): one query each
        u = torch.rand(B, nm, dtype=torch.float64, generator=generator)
        cand, sure, top = sample_tokens(logits, u, temperature, top_p, vocab_size, score=score)
        k = max(1, int((top >= threshold).sum())) if threshold else counts[len(ks)]
        j = sure.topk(k, dim=1).indices                                  # (B, k), surest first
        step.cache.keep(m - c + 1, chosen=j[:, 0])                       # pending slots, the surest copy
        new = qpos.gather(1, j)
        reveal[:, m:m + k], slot_pos[:, m + 1:m + k + 1] = new, new
        slot_tok[:, m + 1:m + k + 1] = cand.gather(1, j)
        masked.scatter_(1, new, False)
        m, passes = m + k, passes + tok.size(1)
        ks.append(k)
    tokens = torch.empty(B, n, dtype=torch.long, device=dev).scatter_(1, reveal, slot_tok[:, 1:])
    stats = dict(steps=len(ks) if threshold else steps, forward_calls=len(ks), token_passes=passes,
                 tokens_generated=n - g, counts=ks, order=reveal)
    return tokens, stats


@torch.no_grad()
def generate_ar(model, n, batch_size, temperature=1.0, top_p=1.0, vocab_size=None, prompt=None,
                generator=None, stepper='dynamic'):
    """Plain left-to-right KV-cache decoding, one token per forward call (the AR baseline).

    Works for any decoder (a GPT, or an AO-GPT in L2R order). prompt: a list/LongTensor of ids that the
    samples start with (fed in the first call). Returns (tokens (B, n), stats) like generate_ao.
    stepper: as in generate_ao (a call here is the prompt, then one row at a time).
    """
    if not model.config.causal:
        raise ValueError("generate_ar needs a decoder; use generate_mdm for an encoder MDM")
    if n > model.config.block_size:
        raise ValueError(f"n = {n} > block_size {model.config.block_size}")
    dev = next(model.parameters()).device
    B = batch_size
    prompt = torch.as_tensor([] if prompt is None else prompt, dtype=torch.long)
    g = prompt.numel()
    if g >= n:
        raise ValueError(f"the prompt ({g} tokens) leaves nothing to generate in n = {n}")
    u = torch.rand(B, n, dtype=torch.float64, generator=generator).to(dev)  # same stream as generate_ao
    tok = torch.full((B, n + 1), -1, dtype=torch.long)                       # slot j holds x_{j-1}
    tok[:, 1:g + 1] = prompt
    tok = tok.to(dev)
    pos = torch.arange(-1, n, device=dev).expand(B, n + 1)                  # slot j sits at position j-1
    tgt = torch.arange(0, n + 1, device=dev).expand(B, n + 1)               # and predicts position j
    step = SlotStepper.make(model, B, stepper)
    logits = step(tok[:, :g + 1], pos[:, :g + 1], tgt[:, :g + 1], 1)         # the prompt: a causal block
    step.cache.keep(g + 1)
    for i in range(g, n):
        if i > g:
            logits = step(tok[:, i:i + 1], pos[:, i:i + 1], tgt[:, i:i + 1], 1)
            step.cache.keep(1)
        tok[:, i + 1] = sample_tokens(logits[:, -1], u[:, i], temperature, top_p, vocab_size)
    stats = dict(steps=n - g, forward_calls=n - g, token_passes=n, tokens_generated=n - g)
    return tok[:, 1:], stats


@torch.no_grad()
def generate_mdm(model, n, batch_size, steps, cache_trick=False, counts='shared', order='random',
                 fixed_counts=False, schedule='linear', temperature=1.0, top_p=1.0, vocab_size=None,
                 given=None, generator=None, stepper='dynamic'):
    """The encoder MDM's reverse process: a full pass over all n positions ([MASK] where not yet
    revealed) per step, the same Lemma-1 schedule as generate_ao. Returns (tokens (B, n), stats).

    counts='shared': one Binomial count per step for the whole batch and a random order per sample,
    exactly generate_ao's plan (same seed, same revealed positions and uniforms). 'independent': MDLM's
    sampler, every position of every sample draws its own reveal time. Both are the exact reverse
    process per sample; with 'independent' a step reveals nothing only if it does so for every sample,
    so the caching trick saves far fewer passes at large batch sizes.
    cache_trick (MDLM's ddpm_cache): a step whose input did not change since the last pass reuses it.
    The pass is deterministic, so this changes the cost, never the samples.
    The head runs only on the positions revealed at a step (the others' logits are never used).
    stepper: 'dynamic', 'static' or 'cuda_graph' (the one pass captured once), or an EncoderStepper to reuse.
    """
    cfg = model.config
    if cfg.causal:
        raise ValueError("generate_mdm needs an encoder MDM (causal=False)")
    if n > cfg.block_size:
        raise ValueError(f"n = {n} > block_size {cfg.block_size}")
    dev = next(model.parameters()).device
    B = batch_size
    gpos, gtok, free = split_given(given, n)
    g, nf = gpos.numel(), free.numel()
    u = torch.rand(B, n, dtype=torch.float64, generator=generator)
    if counts == 'shared':
        forder = free_order(order, free, B, generator)                     # (B, nf)
        k = reveal_counts(nf, steps, schedule, fixed_counts, generator)     # (T,)
        step_of_rank = torch.repeat_interleave(torch.arange(steps), k)      # (nf,) step of the j-th reveal
        step = torch.empty(B, n, dtype=torch.long).scatter_(1, forder, step_of_rank.expand(B, nf))
    elif counts == 'independent':
        if fixed_counts or not (isinstance(order, str) and order == 'random'):
            raise ValueError("counts='independent' draws per-position reveal times: no fixed_counts/order")
        U = torch.rand(B, nf, dtype=torch.float64, generator=generator)
        s = reveal_step(U, time_grid(steps, schedule))                     # (B, nf)
        step = torch.empty(B, n, dtype=torch.long).scatter_(1, free.expand(B, nf), s)
        forder = free[(s * n + free).argsort(dim=1)]  # reveal order: by step, then position
    else:
        raise ValueError(f"counts must be 'shared' or 'independent', got {counts!r}")
    reveal = torch.cat([gpos.expand(B, g), forder], 1)                      # (B, n)
    u_pos = torch.empty_like(u).scatter_(1, reveal, u)                      # the uniform of each position
    step[:, gpos] = -1
    # every (sample, position) to reveal, sorted by step, with the step boundaries: no syncs in the loop
    bb, pp = (step >= 0).nonzero(as_tuple=True)
    s = step[bb, pp]
    perm = (s * (B * n) + bb * n + pp).argsort()
    bb, pp = bb[perm].to(dev), pp[perm].to(dev)
    bounds = [0] + torch.bincount(s, minlength=steps).cumsum(0).tolist()
    u_pos = u_pos.to(dev)

    x = torch.full((B, n), cfg.mask_token_id, dtype=torch.long)
    x[:, gpos] = gtok
    x = x.to(dev)
    encode = EncoderStepper.make(model, B, n, stepper)
    h, passes, stale = None, 0, True  # stale: x changed since the last pass
    for i in range(steps):
        lo, hi = bounds[i], bounds[i + 1]
        # without the trick every step runs the network; with it only a step that reveals something and
        # whose input differs from the last pass's (MDLM reuses the output; nothing else needs it)
        if not cache_trick or (hi > lo and stale):
            h = encode(x)                                                   # (B, n, C)
            passes += 1
            stale = False
        if hi == lo:
            continue
        bi, pi = bb[lo:hi], pp[lo:hi]
        logits = model.lm_head(h[bi, pi])                                   # (R, V): revealed rows only
        x[bi, pi] = sample_tokens(logits, u_pos[bi, pi], temperature, top_p, vocab_size,
                                  ban=cfg.mask_token_id)
        stale = True
    stats = dict(steps=steps, forward_calls=passes, token_passes=passes * n, tokens_generated=nf,
                 order=reveal.to(dev), step_of=step)  # step_of (B, n): each position's step, -1 if given
    return x, stats


# ----------------------------------------------------------------------------- generative perplexity

@torch.no_grad()
def judge_token_nll(judge, seqs, mode='none', batch_size=16, windows=False):
    """-log p of every token the judge scores, per sequence: a list of 1-D float tensors. seqs: id
    sequences (lists or 1-D tensors) of any lengths, each read left to right.

    mode 'none': every token is scored, the first from [None] (for a GPT-2 loaded with
    GPT.from_pretrained, [None] is <|endoftext|>): up to block_size tokens in one pass.
    mode 'hf': the paper code's recipe (HF GPT-2 on the raw sample): no BOS, the first token is only
    context: up to block_size + 1 tokens (1024 for GPT-2).
    A longer sequence is an error, or with windows=True is scored in consecutive windows, each read from
    scratch (re-tokenized text has a length nobody chose).
    """
    cfg = judge.config
    if not cfg.causal:
        raise ValueError("the judge must be a decoder (an L2R GPT, GPT-2, or an AO-GPT read L2R)")
    if mode not in ('none', 'hf'):
        raise ValueError(f"mode must be 'none' or 'hf', got {mode!r}")
    W = cfg.block_size if mode == 'none' else cfg.block_size + 1
    dev = next(judge.parameters()).device
    pieces = []  # (sequence index, ids of one pass)
    for i, s in enumerate(seqs):
        s = torch.as_tensor(s, dtype=torch.long).view(-1)
        if len(s) > W and not windows:
            raise ValueError(f"{len(s)} tokens do not fit the judge's context ({W} in mode {mode!r})")
        pieces += [(i, s[a:a + W]) for a in range(0, len(s), W)]
    out = [[] for _ in seqs]
    for a in range(0, len(pieces), batch_size):
        batch = pieces[a:a + batch_size]
        n = max(len(p) for _, p in batch)
        x = torch.zeros(len(batch), n, dtype=torch.long)                    # padded at the end: a causal
        y = torch.full((len(batch), n), -1, dtype=torch.long)               # judge never reads the pads
        for j, (_, p) in enumerate(batch):
            x[j, :len(p)] = y[j, :len(p)] = p
        x, y = x.to(dev), y.to(dev)
        if mode == 'none':
            _, nll = judge(x, targets=y, reduction='none')                  # (b, n)
        else:
            pos = torch.arange(-1, n - 1, device=dev).expand(len(batch), n)  # token i at GPT-2's wpe[i]
            logits = judge.forward_slots(x, pos, pos + 1)[:, :-1]
            nll = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y[:, 1:].reshape(-1),
                                  ignore_index=-1, reduction='none').view(len(batch), n - 1)
        skip = 0 if mode == 'none' else 1                                   # hf: the first token is context
        for j, (i, p) in enumerate(batch):
            out[i].append(nll[j, :max(0, len(p) - skip)].float().cpu())
    return [torch.cat(parts) if parts else torch.zeros(0) for parts in out]


def judge_nll(judge, tokens, mode='none', batch_size=16):
    """Per-sample mean NLL (B,) of tokens (B, n) under a decoder judge, each sample in one pass (the
    paper code's protocol; see judge_token_nll for the modes)."""
    return torch.stack([t.mean() for t in judge_token_nll(judge, list(tokens), mode, batch_size)])


def generative_ppl(judge, judge_codec, samples, codec, mode='none', batch_size=16):
    """Both generative perplexities of samples (N, n) under a judge, with the samples' unigram entropy:
      per_sequence  the mean over samples of exp(mean NLL of the sample), read as the sampler's own ids
                    (the paper's code and SEDD; with another judge codec, on the re-tokenized text);
      token         one token-weighted exp(total NLL / total tokens), after decoding each sample,
                    dropping what follows its first end of document, and re-tokenizing with the judge's
                    codec (MDLM and DUO). A sample that ends early counts for fewer tokens, not for a
                    perplexity as large as a full one.
    Low-temperature and repetitive samples flatter both; the unigram entropy (nats, mean over samples
    of the entropy of each sample's token histogram) shows it."""
    from evalsets import doc_end
    from tokenizer import DataError
    eos, texts = doc_end(codec)[0], []
    for row in samples.tolist():
        cut = row.index(eos) if eos in row else None
        texts.append((codec.decode(row[:cut]), cut is not None))
    try:
        retok = [judge_codec.encode(t) + (doc_end(judge_codec) if ended else []) for t, ended in texts]
    except DataError as e:
        raise ValueError(f"the judge's {judge_codec.name} codec cannot encode the samples: {e.msg}")
    same = judge_codec.record() == codec.record()
    per_seq = judge_token_nll(judge, list(samples) if same else retok, mode, batch_size, windows=not same)
    tok = judge_token_nll(judge, retok, mode, batch_size, windows=True)
    n_tok = sum(len(t) for t in tok)
    seq_ppl = torch.stack([t.double().mean().exp() for t in per_seq if len(t)])
    H = unigram_entropy(samples)
    return dict(per_sequence=seq_ppl.mean().item(), per_sequence_std=seq_ppl.std().item() if len(seq_ppl) > 1 else 0.0,
                per_sequence_tokens='sample ids' if same else 're-tokenized',
                token=math.exp(sum(t.double().sum().item() for t in tok) / max(1, n_tok)), tokens_scored=n_tok,
                ended_early=sum(ended for _, ended in texts), unigram_entropy=H.mean().item(), mode=mode,
                per_sample=seq_ppl.tolist())


def unigram_entropy(tokens):
    """Per-sample entropy (nats) of the token histogram (B,): low values expose degenerate repetition."""
    out = []
    for row in tokens.cpu():
        p = torch.bincount(row).double()
        p = p[p > 0] / row.numel()
        out.append(-(p * p.log()).sum().item())
    return torch.tensor(out, dtype=torch.float64)


# ----------------------------------------------------------------------------- CLI helpers

_BLANK = re.compile(r'\[BLANK(?::([^\[\]]*))?\]')


def encode_template(text, codec, blank_len):
    """Template text -> ids with -1 for each position to fill. `[BLANK]` is blank_len tokens and
    `[BLANK:k]` is k tokens, k >= 1. Whitespace before a blank is left to the blank: with GPT-2's BPE a
    word carries its leading space, so "The [BLANK] sat" gives "The", k free tokens, " sat". A malformed
    blank ([BLANK:-2], [BLANK:x], an unclosed [BLANK) is an error, never kept as literal text."""
    if blank_len < 1:
        raise ValueError(f"--blank_len must be >= 1, got {blank_len}")
    ids, at = [], 0
    for m in _BLANK.finditer(text):
        k = blank_len if m.group(1) is None else int(m.group(1)) if m.group(1).isdigit() else 0
        if k < 1:
            raise ValueError(f"{m.group(0)}: a blank is [BLANK] or [BLANK:k] with k >= 1 tokens")
        piece = text[at:m.start()].rstrip()
        ids += (codec.encode(piece) if piece else []) + [-1] * k
        at = m.end()
    if '[BLANK' in text[at:] or any('[BLANK' in text[a:b] for a, b in _gaps(text)):
        raise ValueError("an unclosed or malformed [BLANK in the template: write [BLANK] or [BLANK:k]")
    return ids + (codec.encode(text[at:]) if text[at:] else [])


def _gaps(text):
    """The stretches of text between blanks (where a stray '[BLANK' would be a typo)."""
    at = 0
    for m in _BLANK.finditer(text):
        yield at, m.start()
        at = m.end()


def read_order_file(path, n):
    """A generation order from a file (.npy, or text of integers): a permutation of range(L), L >= n;
    positions >= n are dropped, the rest keep their order."""
    import numpy as np
    try:
        vals = np.load(path).reshape(-1).tolist() if path.endswith('.npy') else \
            [int(v) for v in re.split(r'[\s,]+', open(path).read().strip()) if v]
    except (ValueError, OSError) as e:
        die(f"--order {path}: cannot read a list of integers ({e})")
    return order_for_length(vals, n, f"--order {path}")


def order_for_length(vals, n, what):
    vals = [int(v) for v in vals]
    if sorted(vals) != list(range(len(vals))) or len(vals) < n:
        die(f"{what}: not a permutation of range(L) with L >= length {n}")
    return torch.tensor([v for v in vals if v < n])


def load_judge(path, device):
    """A judge model, its codec, and whether it is an HF GPT-2 folder (local or hf:; else a checkpoint of ours)."""
    from checkpoint import checkpoint_codec, is_export, load_model, resolve_path
    from tokenizer import gpt2_codec
    where = resolve_path(path)
    if os.path.isdir(where) and not is_export(where):
        return GPT.from_pretrained(where).to(device).eval(), gpt2_codec(), True
    model, ck, _ = load_model(where, device)
    return model, checkpoint_codec(ck), False


def printable(text):
    """Sample text for a terminal: control characters (an untrained model emits them) as escapes, so
    they cannot move the cursor or clear the screen; newlines and tabs stay."""
    return ''.join(ch if ch in '\n\t' or unicodedata.category(ch)[0] != 'C' else
                   ch.encode('unicode_escape').decode('ascii') for ch in text)


# ----------------------------------------------------------------------------- main

def main(argv=None):
    c = read_config(argv)
    print_config(c.config)
    model, ck, used_ema, codec, family = load_for_sampling(c)
    given, n = layout(c, codec, model.config.block_size, family)
    order = generation_order(c, ck, family, n)
    judge = load_judge_for(c, codec) if c.gen_ppl else None  # before sampling: a bad judge costs seconds
    samples, stats, wall = draw(c, model, family, n, given, order, codec)
    texts = [codec.decode(row.tolist()) for row in samples]
    if not c.quiet:
        for i, text in enumerate(texts):
            print(f"---------- sample {i}\n{printable(text)}")
        print("----------")
    N = samples.size(0)
    steps = 'threshold-chosen' if stats['steps'] is None else stats['steps']
    print(f"{N} samples x {n} tokens ({stats['tokens_generated']} generated each), {steps} steps: "
          f"{wall:.2f} s wall, {N * stats['tokens_generated'] / wall:.1f} tokens/s; per sample "
          f"{stats['token_passes']:g} token-passes ({stats['token_passes'] / n:.2f} n) in "
          f"{stats['forward_calls']:g} forward calls (last batch)")
    if c.speculative:
        print(f"speculative (k={c.speculative}): {stats['tokens_generated'] / stats['forward_calls']:.2f} tokens per "
              f"forward call of the batch, {stats['tokens_generated'] / stats['calls_per_sample']:.2f} per call a "
              f"sample needs on its own ({stats['calls_per_sample']:.1f} calls); {stats['rounds_per_sample']:.1f} "
              f"rounds per sample (the batch: {stats['rounds']}), "
              f"{stats['tokens_generated'] / stats['rounds_per_sample']:.2f} tokens committed per round; drafts "
              f"accepted in {stats['accept_rate']:.1%} of the tests")
    if c.trace:
        import tracepage
        what = f"speculative k={c.speculative}" if c.speculative else f"{family}, {stats['steps']} steps"
        tracepage.write(c.trace, samples[-c.batch_size:], stats, int((given >= 0).sum()),
                        lambda t: codec.decode([t]), f"{c.ckpt or c.out_dir}: {what}")
        print(f"trace: {c.trace}")
    result = dict(config=c.config, n=n, wall_s=wall, stats={k: v for k, v in stats.items()
                                                            if k not in ('order', 'events', 'step_of')},
                  samples=samples.tolist(), texts=texts)
    if judge is not None:
        result['gen_ppl'] = score(c, judge, samples, codec)
    if c.save:
        with open(c.save, 'w') as f:
            json.dump(result, f)
        print(f"saved {c.save}")


def read_config(argv=None):
    """The resolved config (a namespace; the module's defaults stay untouched), every value and every
    destination checked before anything loads or samples."""
    c = namespace(globals(), argv)
    for key, ok in (('schedule', c.schedule in ('linear', 'cosine')), ('top_p', 0 < c.top_p <= 1),
                    ('mdm_counts', c.mdm_counts in ('shared', 'independent')), ('temperature', c.temperature >= 0),
                    ('gen_ppl_mode', c.gen_ppl_mode in ('auto', 'none', 'hf')), ('steps', c.steps >= 1),
                    ('batch_size', c.batch_size >= 1), ('num_batches', c.num_batches >= 1),
                    ('stepper', c.stepper in _STEPPERS), ('blank_len', c.blank_len >= 1),
                    ('judge_batch_size', c.judge_batch_size >= 1), ('length', c.length == -1 or c.length >= 1),
                    ('speculative', c.speculative in ('', 'auto') or
                     c.speculative.isdigit() and int(c.speculative) >= 2)):
        if not ok:
            die(f"invalid --{key}={getattr(c, key)!r} (see --help for the valid values)")
    try:
        c.device = resolve_device(c.device)
        c.ctx, c.precision = autocast(c.device, c.dtype)
    except ValueError as e:
        die(f"--{e}")
    if c.stepper == 'cuda_graph' and not c.device.startswith('cuda'):
        die(f"--stepper cuda_graph needs a CUDA device (got --device {c.device}); use static or dynamic")
    if c.save:
        d = os.path.dirname(os.path.abspath(c.save))
        if not os.path.isdir(d):
            die(f"--save {c.save}: the folder {d} does not exist; create it first")
        if not os.access(d, os.W_OK) or (os.path.exists(c.save) and not os.access(c.save, os.W_OK)):
            die(f"--save {c.save}: not writable")
    return c


def load_for_sampling(c):
    """The model (EMA weights by default), its checkpoint dict, its codec, and which sampler it takes:
    'ao' (an any-order decoder), 'mdm' (an encoder) or 'ar' (a left-to-right GPT)."""
    from checkpoint import checkpoint_codec, load_model
    model, ck, used_ema = load_model(c.ckpt or c.out_dir, c.device, c.use_ema)
    mc = model.config
    codec = checkpoint_codec(ck, c.dataset)
    family = 'mdm' if not mc.causal else ('ao' if model.any_order else 'ar')
    print(f"model: {dict(mdm='encoder MDM', ao='any-order decoder', ar='L2R GPT')[family]} "
          f"(cond={mc.cond!r}), {model.get_num_params() / 1e6:.2f}M params, "
          f"{'EMA' if used_ema else 'raw'} weights; codec {codec.name} (vocab {codec.vocab_size})")
    if codec.vocab_size > mc.vocab_size:
        die(f"codec vocab {codec.vocab_size} > model vocab {mc.vocab_size}: the checkpoint's codec does not fit it")
    return model, ck, used_ema, codec, family


def layout(c, codec, block_size, family):
    """(given (n,) LongTensor: the token ids given by --prompt/--suffix/--template, -1 where to generate; n)."""
    if c.template and (c.prompt or c.suffix):
        die("use either --template or --prompt/--suffix, not both")
    try:
        lay = encode_template(c.template, codec, c.blank_len) if c.template else []
    except ValueError as e:
        die(f"--template: {e}")
    n = (len(lay) if c.template else block_size) if c.length == -1 else c.length
    if n > block_size:
        die(f"length {n} exceeds the model's block_size {block_size}" + (": the template is too long"
                                                                         if c.template else ""))
    if c.template:
        if len(lay) > n:
            die(f"the template is {len(lay)} tokens but --length is {n}")
        lay += [-1] * (n - len(lay))  # free positions after the template
    else:
        p, s = codec.encode(c.prompt) if c.prompt else [], codec.encode(c.suffix) if c.suffix else []
        if len(p) + len(s) >= n:
            die(f"the prompt and suffix take {len(p) + len(s)} tokens of length {n}: no room left to "
                f"generate; raise --length (at most block_size {block_size}) or shorten them")
        lay = p + [-1] * (n - len(p) - len(s)) + s
    if n < 1 or all(v >= 0 for v in lay):
        die("no position left to generate: add a [BLANK] or raise --length")
    if family == 'ar' and (c.suffix or c.template):
        die("a GPT (cond='none') can only continue a prompt: --suffix/--template need an any-order "
            "model or an encoder MDM")
    return torch.tensor(lay), n


def generation_order(c, ck, family, n):
    """An order spec (see ORDERS) or a (n,) permutation. auto: the order the model was trained on, when
    it was trained on one (a fixed order saved in the checkpoint, or L2R), else random."""
    o = c.order
    if o == 'auto':
        fixed = ck.get('order')
        trained_l2r = (ck.get('config') or {}).get('order_mode') == 'l2r'
        o = 'l2r' if family == 'ar' or (trained_l2r and family == 'ao') else 'random'
        if fixed is not None and family == 'ao':
            o = order_for_length(torch.as_tensor(fixed).view(-1).tolist(), n, "the checkpoint's fixed order")
            print("order: the checkpoint's fixed training order")
    elif os.path.exists(o):
        o = read_order_file(o, n)
    else:
        try:
            check_order(o)
        except ValueError as e:
            die(f"--order: {e}, or a file of positions")
    adaptive = isinstance(o, str) and o in _ADAPTIVE
    if not 0 <= c.threshold <= 1 or (c.threshold and not adaptive):
        die(f"invalid --threshold={c.threshold!r}: a probability in (0, 1], for --order confidence, margin or "
            f"entropy (0: take the counts from the Lemma-1 schedule)")
    if family == 'mdm' and adaptive:
        die(f"--order {o} is the any-order decoder's (it scores every masked position on the exact KV cache); "
            f"the encoder MDM takes random, l2r, blocks:K or a file")
    if c.speculative and (family != 'ao' or adaptive):
        die("--speculative needs an any-order decoder (AO-GPT or sigma-GPT) and an order fixed before the draws "
            "(random, l2r, blocks:K or a file): " + (f"--order {o} is chosen from the drawn values, so it would "
            "not be exact" if adaptive else "an encoder MDM or an L2R GPT cannot verify drafts in one pass"))
    if family == 'ar':
        if isinstance(o, torch.Tensor) or o != 'l2r':
            die("a GPT (cond='none') generates left to right only: use --order l2r (or auto)")
        print("note: a GPT decodes one token per forward call; --steps is not used")
    if family == 'mdm' and c.mdm_counts == 'independent' and (c.fixed_counts or not isinstance(o, str) or
                                                            o != 'random'):
        die("--mdm_counts independent draws a reveal time per position: no --fixed_counts or --order")
    return o


def load_judge_for(c, codec):
    judge, judge_codec, is_hf = load_judge(c.gen_ppl, c.device)
    if judge.config.vocab_size < judge_codec.vocab_size:
        die(f"judge {c.gen_ppl}: its {judge_codec.name} codec has {judge_codec.vocab_size} symbols, the model "
            f"only {judge.config.vocab_size}")
    mode = c.gen_ppl_mode if c.gen_ppl_mode != 'auto' else ('hf' if is_hf else 'none')
    if mode == 'hf' and not is_hf:
        die("--gen_ppl_mode hf is the HF GPT-2 recipe (no BOS); our checkpoints score from [None] (none)")
    judge.mode, judge.codec = mode, judge_codec
    if judge_codec.record() != codec.record():
        print(f"note: the judge reads {judge_codec.name}, the samples are {codec.name}: both perplexities are "
              f"computed on the re-tokenized text")
    return judge


def draw(c, model, family, n, given, order, codec):
    """num_batches batches of batch_size samples: (tokens (N, n) on the CPU, the last batch's stats,
    wall seconds). One CPU generator drives every draw, so a seed fixes the samples on any device."""
    from tqdm import tqdm
    g = torch.Generator().manual_seed(c.seed)
    common = dict(temperature=c.temperature, top_p=c.top_p, vocab_size=codec.vocab_size, generator=g)
    samples, stats = [], None
    sync = torch.cuda.synchronize if c.device.startswith('cuda') else (lambda: None)
    sync()
    t0 = time.time()
    with c.ctx:
        stp = (EncoderStepper(model, c.batch_size, n, c.stepper) if family == 'mdm' else
               SlotStepper(model, c.batch_size, c.stepper))  # one for all batches: its graphs are kept
        if c.speculative:
            from speculative import generate_speculative, row_stepper
            k = 'auto' if c.speculative == 'auto' else int(c.speculative)
            stp = c.stepper if c.stepper == 'dynamic' else row_stepper(model, c.batch_size, c.stepper, n, k,
                                                                       int((given >= 0).sum()))
        for _ in tqdm(range(c.num_batches), desc='batches', unit='batch', disable=c.num_batches == 1,
                      file=sys.stderr):
            if c.speculative:  # each sample commits what it accepted (per-sample cache masks)
                x, stats = generate_speculative(model, n, c.batch_size, k=k, order=order, given=given, stepper=stp,
                                                batch_commit='per_row', trace=bool(c.trace), **common)
            elif family == 'ao':
                x, stats = generate_ao(model, n, c.batch_size, c.steps, order=order, fixed_counts=c.fixed_counts,
                                       schedule=c.schedule, given=given, stepper=stp, threshold=c.threshold,
                                       **common)
            elif family == 'mdm':
                x, stats = generate_mdm(model, n, c.batch_size, c.steps, cache_trick=c.cache_trick,
                                        counts=c.mdm_counts, order=order, fixed_counts=c.fixed_counts,
                                        schedule=c.schedule, given=given, stepper=stp, **common)
            else:
                prefix = given[:int((given >= 0).sum())]
                x, stats = generate_ar(model, n, c.batch_size, prompt=prefix, stepper=stp, **common)
            samples.append(x.cpu())
    sync()
    return torch.cat(samples), stats, time.time() - t0


def score(c, judge, samples, codec):
    """Generative perplexity of the samples under the judge, both averages, with their unigram entropy."""
    try:
        r = generative_ppl(judge, judge.codec, samples, codec, judge.mode, c.judge_batch_size)
    except ValueError as e:
        die(f"--gen_ppl: {e}")
    print(f"gen ppl ({c.gen_ppl}, mode {judge.mode}): per-sequence mean {r['per_sequence']:.3f} (the paper's "
          f"code, SEDD), token-weighted {r['token']:.3f} after re-tokenizing and cutting at the first end of "
          f"document (MDLM, DUO; {r['tokens_scored']} tokens, {r['ended_early']} samples ended early); "
          f"unigram entropy {r['unigram_entropy']:.3f} nats per sample")
    return dict(judge=c.gen_ppl, **r)


if __name__ == '__main__':
    main()
