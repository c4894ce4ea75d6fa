"""
Sample from a checkpoint: AO-GPT / sigma-GPT with the KV-cached any-order sampler, an encoder MDM with
the masked-diffusion reverse process, or an L2R GPT with plain KV-cache decoding (dispatched on
model.config). EMA weights by default.

    python sample.py --steps 1024                                        # from out/ckpt.pt
    python sample.py --prompt "The company said" --length 64 --steps 64  # a prefix
    python sample.py --template "The [BLANK] sat on the [BLANK:3] mat."  # infilling
    python sample.py --steps 256 --batch_size 32 --gen_ppl out-l2r      # + generative perplexity

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
import time
from contextlib import nullcontext

import torch
from torch.nn import functional as F

from model import GPT, KVCache

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
order = 'auto'             # auto | random | l2r | FILE of positions (.npy/text); auto: the training order
fixed_counts = False       # the paper code's deterministic counts instead of Binomial draws
schedule = 'linear'        # linear | cosine (t = cos(pi/2 (1 - u))): fraction still masked per step
temperature = 1.0          # softmax temperature; 0 = greedy
top_p = 1.0                # nucleus sampling: keep the most likely tokens up to this mass
prompt = ''                # text the samples start with
suffix = ''                # text the samples end with
template = ''              # text with [BLANK] (blank_len tokens) or [BLANK:k] (k tokens) spans to fill
blank_len = 8              # tokens per [BLANK]
stepper = 'dynamic'        # decoder calls: dynamic | static (fixed padded shapes) | cuda_graph
cache_trick = True         # encoder MDM: a step that reveals nothing reuses the last pass (MDLM)
mdm_counts = 'shared'      # encoder MDM: shared (one count per step for the batch) | independent (per sample)
gen_ppl = ''               # judge: a checkpoint of ours (any --ckpt form), or HF GPT-2 (a dir or hf:owner/repo)
gen_ppl_mode = 'auto'      # none: all n scored after [None]; hf: no BOS, token 0 unscored; auto: hf for HF
judge_batch_size = 16      # judge forward batch
save = ''                  # write the samples (ids, text) and stats as JSON to this file
seed = 1337
device = 'auto'            # auto | cpu | cuda | cuda:1 | mps
dtype = 'auto'             # auto (bfloat16 on CUDA, else float32) | float32 | bfloat16 | float16
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

def sample_tokens(logits, u, temperature=1.0, top_p=1.0, vocab_size=None, ban=None):
    """One token per row of logits (..., V), by inverse-CDF sampling with the uniforms u (...).

    float64 throughout: low-precision (bf16/fp32) Gumbel noise lowers the effective temperature, this
    cannot. Ids >= vocab_size (the head's padding rows) and `ban` (the encoder's [MASK]) are never drawn.
    temperature 0 is greedy; top_p < 1 keeps the smallest set of most likely tokens whose mass reaches
    top_p (the HF convention: the token that crosses top_p is kept).
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
    if logits.size(0) <= rows:
        return _sample_rows(logits, u, temperature, top_p, ban).view(shape)
    out = torch.empty(logits.size(0), dtype=torch.long, device=logits.device)
    for a in range(0, logits.size(0), rows):
        out[a:a + rows] = _sample_rows(logits[a:a + rows], u[a:a + rows], temperature, top_p, ban)
    return out.view(shape)


def _sample_rows(logits, u, temperature, top_p, ban):
    logp = logits.double()
    if ban is not None and ban < logp.size(1):
        logp = logp.index_fill(1, torch.tensor([ban], device=logp.device), -math.inf)
    if temperature == 0:
        return logp.argmax(1)
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
    return (idx.gather(1, j) if idx is not None else j).squeeze(1)


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


def free_order(order, free, batch_size, generator=None):
    """(B, n_free) generation order of the free positions: 'random' (uniform per sample), 'l2r', or a
    permutation (n,) / (B, n) of all positions, of which the free ones are taken in its order."""
    B, nf = batch_size, free.numel()
    if isinstance(order, str):
        if order == 'random':
            # float64 keys: ties (which would bias argsort) are practically impossible
            return free[torch.rand(B, nf, dtype=torch.float64, generator=generator).argsort(dim=1)]
        if order == 'l2r':
            return free.expand(B, nf).clone()
        raise ValueError(f"order must be 'random', 'l2r' or a permutation tensor, got {order!r}")
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


class SlotStepper:
    """One decoder call of the KV-cached samplers: r slot rows in (blk = r - k pending slots, then k
    copies of the last revealed slot, each with its own target), logits (B, k, V) of the copies out.

    mode 'dynamic': model.forward_slots at the call's own shape (r rows attending over L + r slots).
    'static': model.forward_static at a few fixed shapes: r padded up to two sizes per octave (1, 2, 3, 4,
        6, 8, 12, 16, 24, ...; rows_for), every row attending over the whole cache under a mask. More
        arithmetic (1-17% more rows for the plans in bench/sample_roofline.py); same samples. It exists for:
    'cuda_graph': static, and each padded shape is captured once as a CUDA graph and then replayed.
        A forward call of a deep model at a few rows per sample is launch-bound on a GPU (hundreds of
        small kernels issued from Python; BENCHMARKS.md), and every new (rows, cache length) shape pays
        kernel setup; a replayed graph pays neither. All graphs share one memory pool, which is safe
        because one graph's output is consumed (lm_head) before any other graph is replayed.
    lm_head and the token draws run outside the graph on just the k copies.
    A stepper can serve many runs (generate_ao/generate_ar take one for `stepper` and empty its cache,
    see make), so the graphs are captured once per padded shape, not once per batch.
    """

    def __init__(self, model, batch_size, mode='dynamic'):
        if mode not in _STEPPERS:
            raise ValueError(f"stepper must be one of {', '.join(_STEPPERS)}, got {mode!r}")
        dev = next(model.parameters()).device
        if mode == 'cuda_graph' and dev.type != 'cuda':
            raise ValueError(f"stepper='cuda_graph' needs the model on a CUDA device (it is on {dev}); "
                             "use 'static' or 'dynamic'")
        self.model, self.mode, self.B, self.dev = model, mode, batch_size, dev
        self.cache = KVCache(model, batch_size, static=mode != 'dynamic')
        if mode != 'dynamic':
            self.scalars = torch.zeros(3, dtype=torch.long, device=dev)  # L, blk, r: read at replay
            self.bufs, self.graphs, self.outs = {}, {}, {}
            self.pool = torch.cuda.graph_pool_handle() if mode == 'cuda_graph' else None

    @classmethod
    def make(cls, model, batch_size, stepper):
        """A fresh stepper for a mode name, or the given stepper emptied for a new run."""
        if not isinstance(stepper, SlotStepper):
            return cls(model, batch_size, stepper)
        if stepper.model is not model or stepper.B != batch_size:
            raise ValueError(f"this SlotStepper was built for another model or batch size ({stepper.B})")
        stepper.cache.len = 0  # slots are always written before anyone sees them
        return stepper

    @staticmethod
    def rows_for(r):
        """The padded row count for r rows: the next of 1, 2, 3, 4, 6, 8, 12, ... (under 1.5 r). On the
        plans in bench/sample_roofline.py powers of two alone pad 15-38% more token-passes in all, these
        1-17%, for a few more shapes (graphs) per run."""
        R = 1 << (r - 1).bit_length()
        return R * 3 // 4 if R >= 4 and r <= R * 3 // 4 else R

    def __call__(self, tok, pos, tgt, k):
        if self.mode == 'dynamic':
            return self.model.forward_slots(tok, pos, tgt, cache=self.cache, n_parallel=k, n_logits=k)
        B, r = tok.shape
        R = self.rows_for(r)
        if R not in self.bufs:
            self.bufs[R] = torch.empty(3, B, R, dtype=torch.long, device=self.dev)
        buf = self.bufs[R]                                                # (3, B, R): tok, pos, tgt
        buf[:, :, :r] = torch.stack([tok, pos, tgt])
        buf[:, :, r:] = buf[:, :, r - 1:r]                                # padding: repeat the last row
        L = self.cache.len
        self.scalars.copy_(torch.tensor([L, r - k, r]))
        if self.mode == 'static':
            h = self._forward(R)
        else:
            if R not in self.graphs:
                self._capture(R)
            self.graphs[R].replay()
            h = self.outs[R]
        self.cache.len = L + r - k + 1
        return self.model.lm_head(h[:, r - k:r])                          # (B, k, V)

    def _forward(self, R):
        buf, (L, blk, r) = self.bufs[R], self.scalars
        return self.model.forward_static(buf[0], buf[1], buf[2], self.cache, L, blk, r)

    def _capture(self, R):
        # Autocast's weight-cast cache would hand the graph tensors freed after capture: disable it.
        ac, adt = torch.is_autocast_enabled('cuda'), torch.get_autocast_dtype('cuda')
        actx = lambda: torch.autocast('cuda', dtype=adt, enabled=ac, cache_enabled=False)  # noqa: E731
        if self.cache.k is None:  # the K/V dtype is what c_attn returns: the autocast dtype or the weights'
            self.cache.allocate(self.dev, adt if ac else next(self.model.parameters()).dtype)
        # Warm up on a side stream first (lazy inits, cuBLAS/attention setup). The warm-up calls write the
        # same K/V rows the replay will, so they change nothing.
        side = torch.cuda.Stream(device=self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side), actx():
            for _ in range(2):
                self._forward(R)
        torch.cuda.current_stream(self.dev).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool), actx():
            self.outs[R] = self._forward(R)
        self.graphs[R] = g


@torch.no_grad()
def generate_ao(model, n, batch_size, steps, order='random', fixed_counts=False, schedule='linear',
                temperature=1.0, top_p=1.0, vocab_size=None, given=None, generator=None, stepper='dynamic'):
    """KV-cached any-order sampling from an AO-GPT / sigma-GPT. Returns (tokens (B, n), stats).

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
    dev = next(model.parameters()).device
    B = batch_size
    gpos, gtok, free = split_given(given, n)
    g = gpos.numel()
    u = torch.rand(B, n, dtype=torch.float64, generator=generator)      # one per token, in reveal order
    reveal = torch.cat([gpos.expand(B, g), free_order(order, free, B, generator)], 1)  # (B, n)
    counts = reveal_counts(n - g, steps, schedule, fixed_counts, generator)

    # The whole plan as slot indices, precomputed: per step the pending slots c..m-1, then k copies of m.
    rows, offs, ks, c, m = [], [0], [], 0, g
    for k in counts.tolist():
        if k == 0:
            continue  # nothing revealed: no pass
        rows += list(range(c, m)) + [m] * k
        offs.append(len(rows))
        ks.append(k)
        c, m = m + 1, m + k
    rows = torch.tensor(rows, device=dev)
    slot_tok = torch.full((B, n + 1), -1, dtype=torch.long)               # slot j: the j-th revealed token
    slot_tok[:, 1:g + 1] = gtok
    slot_tok = slot_tok.to(dev)
    slot_pos = torch.cat([torch.full((B, 1), -1), reveal], 1).to(dev)      # its position; [None] is -1
    reveal, u = reveal.to(dev), u.to(dev)

    step = SlotStepper.make(model, B, stepper)
    c, m = 0, g
    for i, k in enumerate(ks):
        r = rows[offs[i]:offs[i + 1]]
        logits = step(slot_tok[:, r], slot_pos[:, r], reveal[:, c:m + k], k)  # (B, k, V)
        slot_tok[:, m + 1:m + k + 1] = sample_tokens(logits, u[:, m:m + k], temperature, top_p, vocab_size)
        c, m = m + 1, m + k
    tokens = torch.empty(B, n, dtype=torch.long, device=dev).scatter_(1, reveal, slot_tok[:, 1:])
    stats = dict(steps=steps, forward_calls=len(ks), token_passes=len(rows), tokens_generated=n - g,
                 counts=ks, order=reveal)
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
    for i in range(g, n):
        if i > g:
            logits = step(tok[:, i:i + 1], pos[:, i:i + 1], tgt[:, i:i + 1], 1)
        tok[:, i + 1] = sample_tokens(logits[:, -1], u[:, i], temperature, top_p, vocab_size)
    stats = dict(steps=n - g, forward_calls=n - g, token_passes=n, tokens_generated=n - g)
    return tok[:, 1:], stats


@torch.no_grad()
def generate_mdm(model, n, batch_size, steps, cache_trick=False, counts='shared', order='random',
                 fixed_counts=False, schedule='linear', temperature=1.0, top_p=1.0, vocab_size=None,
                 given=None, generator=None):
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
    h, passes, stale = None, 0, True  # stale: x changed since the last pass
    for i in range(steps):
        lo, hi = bounds[i], bounds[i + 1]
        # without the trick every step runs the network; with it only a step that reveals something and
        # whose input differs from the last pass's (MDLM reuses the output; nothing else needs it)
        if not cache_trick or (hi > lo and stale):
            h = model.encoder_hidden(x)                                     # (B, n, C)
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
                 order=reveal.to(dev))
    return x, stats


# ----------------------------------------------------------------------------- generative perplexity

@torch.no_grad()
def judge_nll(judge, tokens, mode='none', batch_size=16):
    """Per-sample mean NLL (B,) of tokens (B, n) under a decoder judge, read left to right.

    mode 'none': every one of the n tokens is scored, the first from [None] (for a GPT-2 loaded with
    GPT.from_pretrained, [None] is <|endoftext|>), so needs n <= judge block_size.
    mode 'hf': the paper code's recipe (HF GPT-2 on the raw sample): no BOS, token 0 is only context,
    tokens 1..n-1 are scored (n - 1 predictions), so n <= block_size + 1 (1024 for GPT-2).
    """
    cfg = judge.config
    if not cfg.causal:
        raise ValueError("the judge must be a decoder (an L2R GPT, GPT-2, or an AO-GPT read L2R)")
    B, n = tokens.shape
    dev = next(judge.parameters()).device
    out = []
    for a in range(0, B, batch_size):
        x = tokens[a:a + batch_size].to(dev)
        if mode == 'none':
            if n > cfg.block_size:
                raise ValueError(f"n = {n} tokens + [None] exceed the judge's block_size {cfg.block_size}")
            _, nll = judge(x, targets=x, reduction='none')                  # (b, n)
        elif mode == 'hf':
            if n > cfg.block_size + 1:
                raise ValueError(f"n = {n} > the judge's {cfg.block_size + 1} positions")
            b = x.size(0)
            pos = torch.arange(-1, n - 1, device=dev).expand(b, n)  # token i at GPT-2's position i (wpe[i])
            logits = judge.forward_slots(x, pos, pos + 1)[:, :-1]
            nll = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1),
                                  reduction='none').view(b, n - 1)
        else:
            raise ValueError(f"mode must be 'none' or 'hf', got {mode!r}")
        out.append(nll.float().mean(1).cpu())
    return torch.cat(out)


def unigram_entropy(tokens):
    """Per-sample entropy (nats) of the token histogram (B,): low values expose degenerate repetition."""
    out = []
    for row in tokens.cpu():
        p = torch.bincount(row).double()
        p = p[p > 0] / row.numel()
        out.append(-(p * p.log()).sum().item())
    return torch.tensor(out, dtype=torch.float64)


# ----------------------------------------------------------------------------- CLI helpers

def encode_template(text, codec, blank_len):
    """Template text -> ids with -1 for each position to fill. `[BLANK]` is blank_len tokens and
    `[BLANK:k]` is k tokens. Whitespace before a blank is left to the blank: with GPT-2's BPE a word
    carries its leading space, so "The [BLANK] sat" gives "The", k free tokens, " sat"."""
    parts = re.split(r'\[BLANK(?::(\d+))?\]', text)  # text, k, text, k, ..., text
    ids = []
    for i in range(0, len(parts), 2):
        piece = parts[i]
        if i + 1 < len(parts):
            piece = piece.rstrip()
        ids += codec.encode(piece) if piece else []
        if i + 1 < len(parts):
            k = int(parts[i + 1]) if parts[i + 1] is not None else blank_len
            if k < 1:
                raise ValueError("a [BLANK:k] needs k >= 1")
            ids += [-1] * k
    return ids


def read_order_file(path, n):
    """A generation order from a file (.npy, or text of integers): a permutation of range(L), L >= n;
    positions >= n are dropped, the rest keep their order."""
    import numpy as np
    from configurator import die
    if not os.path.exists(path):
        die(f"--order: {path!r} is not random|l2r|auto nor an existing file")
    try:
        vals = np.load(path).reshape(-1).tolist() if path.endswith('.npy') else \
            [int(v) for v in re.split(r'[\s,]+', open(path).read().strip()) if v]
    except (ValueError, OSError) as e:
        die(f"--order {path}: cannot read a list of integers ({e})")
    return order_for_length(vals, n, f"--order {path}")


def order_for_length(vals, n, what):
    from configurator import die
    vals = [int(v) for v in vals]
    if sorted(vals) != list(range(len(vals))) or len(vals) < n:
        die(f"{what}: not a permutation of range(L) with L >= length {n}")
    return torch.tensor([v for v in vals if v < n])


def load_judge(path, device):
    """A judge model and the name of its tokenizer: an HF GPT-2 folder (local or hf:), or a checkpoint of ours."""
    from checkpoint import checkpoint_codec, is_export, load_model, resolve_path
    where = resolve_path(path)
    if os.path.isdir(where) and not is_export(where):
        return GPT.from_pretrained(where).to(device).eval(), 'gpt2', True
    model, ck, _ = load_model(where, device)
    return model, checkpoint_codec(ck).name, False


# ----------------------------------------------------------------------------- main

def main():
    from configurator import configure, print_config, die
    from checkpoint import checkpoint_codec, load_model
    cfg = configure(globals())
    print_config(cfg)
    torch.manual_seed(seed)

    dev = ('cuda' if torch.cuda.is_available() else 'cpu') if device == 'auto' else device
    dt = dtype
    if dt == 'auto':
        dt = 'bfloat16' if dev.startswith('cuda') and torch.cuda.is_bf16_supported() else 'float32'
    if dt not in ('float32', 'bfloat16', 'float16'):
        die(f"--dtype must be auto|float32|bfloat16|float16, got {dt!r}")
    ptdtype = getattr(torch, dt)
    if stepper == 'cuda_graph' and not dev.startswith('cuda'):
        die(f"--stepper cuda_graph needs a CUDA device (got --device {dev}); use static or dynamic")
    ctx = nullcontext() if dt == 'float32' or dev == 'cpu' else \
        torch.autocast(device_type=dev.split(':')[0], dtype=ptdtype)
    for key, ok in (('schedule', schedule in ('linear', 'cosine')), ('top_p', 0 < top_p <= 1),
                    ('mdm_counts', mdm_counts in ('shared', 'independent')), ('temperature', temperature >= 0),
                    ('gen_ppl_mode', gen_ppl_mode in ('auto', 'none', 'hf')), ('steps', steps >= 1),
                    ('batch_size', batch_size >= 1), ('num_batches', num_batches >= 1),
                    ('stepper', stepper in _STEPPERS)):
        if not ok:
            die(f"invalid --{key}={cfg[key]!r} (see --help)")

    model, ck, used_ema = load_model(ckpt or out_dir, dev, use_ema)
    mc = model.config
    codec = checkpoint_codec(ck, dataset)
    kind = 'mdm' if not mc.causal else ('ao' if model.any_order else 'ar')
    print(f"model: {dict(mdm='encoder MDM', ao='any-order decoder', ar='L2R GPT')[kind]} "
          f"(cond={mc.cond!r}), {model.get_num_params() / 1e6:.2f}M params, "
          f"{'EMA' if used_ema else 'raw'} weights; codec {codec.name} (vocab {codec.vocab_size})")
    if codec.vocab_size > mc.vocab_size:
        die(f"codec vocab {codec.vocab_size} > model vocab {mc.vocab_size}: wrong --dataset?")

    # the layout: given token ids, and -1 at the positions to generate
    bs = mc.block_size
    if template and (prompt or suffix):
        die("use either --template or --prompt/--suffix, not both")
    lay = encode_template(template, codec, blank_len) if template else []
    n = (len(lay) if template else bs) if length == -1 else length
    if n > bs:
        die(f"length {n} exceeds the model's block_size {bs}" + (": the template is too long" if template
                                                                  else ""))
    if template:
        if len(lay) > n:
            die(f"the template is {len(lay)} tokens but --length is {n}")
        lay += [-1] * (n - len(lay))  # free positions after the template
    else:
        p, s = codec.encode(prompt) if prompt else [], codec.encode(suffix) if suffix else []
        if len(p) + len(s) >= n:
            die(f"the prompt and suffix take {len(p) + len(s)} tokens of length {n}: no room left to "
                f"generate; raise --length (at most block_size {bs}) or shorten them")
        lay = p + [-1] * (n - len(p) - len(s)) + s
    if n < 1 or all(v >= 0 for v in lay):
        die("no position left to generate: add a [BLANK] or raise --length")
    given = torch.tensor(lay)

    # the generation order
    o = order
    if o == 'auto':  # the order the model was trained on, when it was trained on one
        fixed = ck.get('order')
        trained_l2r = (ck.get('config') or {}).get('order_mode') == 'l2r'
        o = 'l2r' if kind == 'ar' or (trained_l2r and kind == 'ao') else 'random'
        if fixed is not None and kind == 'ao':
            o = order_for_length(torch.as_tensor(fixed).view(-1).tolist(), n, "the checkpoint's fixed order")
            print("order: the checkpoint's fixed training order")
    elif o not in ('random', 'l2r'):
        o = read_order_file(o, n)
    if kind == 'ar':
        if isinstance(o, torch.Tensor) or o != 'l2r':
            die("a GPT (cond='none') generates left to right only: use --order l2r (or auto)")
        if suffix or template:
            die("a GPT (cond='none') can only continue a prompt: --suffix/--template need an any-order "
                "model or an encoder MDM")
        print("note: a GPT decodes one token per forward call; --steps is not used")

    g = torch.Generator().manual_seed(seed)
    common = dict(temperature=temperature, top_p=top_p, vocab_size=codec.vocab_size, generator=g)
    samples, stats = [], None
    if dev.startswith('cuda'):
        torch.cuda.synchronize()
    t0 = time.time()
    per_position = kind == 'mdm' and mdm_counts == 'independent'
    if per_position and (fixed_counts or not isinstance(o, str) or o != 'random'):
        die("--mdm_counts independent draws a reveal time per position: no --fixed_counts or --order")
    with ctx:
        stp = SlotStepper(model, batch_size, stepper) if kind != 'mdm' else None  # one for all batches
        for _ in range(num_batches):
            if kind == 'ao':
                x, stats = generate_ao(model, n, batch_size, steps, order=o, fixed_counts=fixed_counts,
                                       schedule=schedule, given=given, stepper=stp, **common)
            elif kind == 'mdm':
                x, stats = generate_mdm(model, n, batch_size, steps, cache_trick=cache_trick,
                                        counts=mdm_counts, order=o, fixed_counts=fixed_counts,
                                        schedule=schedule, given=given, **common)
            else:
                prefix = given[:int((given >= 0).sum())]
                x, stats = generate_ar(model, n, batch_size, prompt=prefix, stepper=stp, **common)
            samples.append(x.cpu())
    if dev.startswith('cuda'):
        torch.cuda.synchronize()
    wall = time.time() - t0
    samples = torch.cat(samples)
    texts = [codec.decode(row.tolist()) for row in samples]

    if not quiet:
        for i, text in enumerate(texts):
            print(f"---------- sample {i}")
            print(text)
        print("----------")
    N = samples.size(0)
    print(f"{N} samples x {n} tokens ({stats['tokens_generated']} generated each), {stats['steps']} steps: "
          f"{wall:.2f} s wall, {N * stats['tokens_generated'] / wall:.1f} tokens/s; per sample "
          f"{stats['token_passes']} token-passes ({stats['token_passes'] / n:.2f} n) in "
          f"{stats['forward_calls']} forward calls (last batch)")

    result = dict(config=cfg, n=n, wall_s=wall, stats={k: v for k, v in stats.items() if k != 'order'},
                  samples=samples.tolist(), texts=texts)
    if gen_ppl:
        judge, judge_codec, is_hf = load_judge(gen_ppl, dev)
        if judge_codec != codec.name or judge.config.vocab_size < codec.vocab_size:
            die(f"judge {gen_ppl} uses the {judge_codec} tokenizer, the samples {codec.name}: "
                "retokenisation is not supported, pick a judge trained on the same tokenizer")
        mode = gen_ppl_mode if gen_ppl_mode != 'auto' else ('hf' if is_hf else 'none')
        if mode == 'hf' and not is_hf:
            die("--gen_ppl_mode hf is the HF GPT-2 recipe (no BOS); our checkpoints score from [None] (none)")
        try:
            nll = judge_nll(judge, samples, mode, judge_batch_size)
        except ValueError as e:
            die(f"--gen_ppl: {e}")
        ppl = nll.exp()
        H = unigram_entropy(samples)
        std = ppl.std().item() if N > 1 else float('nan')
        print(f"gen ppl ({gen_ppl}, mode {mode}): {ppl.mean().item():.3f} mean over {N} samples "
              f"(std {std:.3f}); unigram entropy {H.mean().item():.3f} nats per sample")
        result['gen_ppl'] = dict(judge=gen_ppl, mode=mode, mean=ppl.mean().item(), std=std,
                                 per_sample=ppl.tolist(), unigram_entropy=H.mean().item())
    if save:
        with open(save, 'w') as f:
            json.dump(result, f)
        print(f"saved {save}")


if __name__ == '__main__':
    main()
