"""
The samplers: the masked-diffusion reverse process on an AO-GPT / sigma-GPT (generate_ao, with the KV
cache), confidence-ordered decoding on the same cache (generate_confident), plain left-to-right KV-cache
decoding (generate_ar) and the encoder MDM's reverse process (generate_mdm); with the schedule, the token
draws and the orders they share. Every draw, the speculative sampler's too, is from logits_to_probs (the
vocabulary cut, temperature and nucleus) by inverse_cdf. How a forward call runs (cache, fixed shapes,
CUDA graphs) is engine.py's.

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

Orders. random is the MDM reverse process above. The other order distributions of orders.py (l2r,
semiar:K: blocks of K positions left to right, a uniform order inside each; nearl2r:W; mixtures; a fixed
order fixed:S) and a file of positions change only the order, so the sampler stays exact for the mixture
over the orders they allow. The confidence samplers (confidence / margin / entropy, LLaDA's and
Dream's; generate_confident) are samplers of their own, not orders: they choose the positions from the
model's own scores, each step querying every masked position (one copy each) and revealing the k surest,
or every one whose top probability reaches the threshold; the cache stays exact, at about n T / 2
token-passes.

Settings. Every sampler, the speculative one too, takes one Sampling (samplers.py: the token draw,
temperature, top_p, vocab_size, the generator; the schedule and fixed_counts; threshold; until), checked
when it is made, and begins with one prologue (prologue: the model kind and the settings it reads, by the
one table samplers.SAMPLERS; sizes and given tokens):

    s = Sampling(temperature=0.9, top_p=0.95, vocab_size=50257, generator=torch.Generator().manual_seed(0))
    x, stats = generate_ao(model, 256, 4, 64, s, order='semiar:16')

Randomness, from one CPU torch.Generator in a fixed order (reproducible on any device): first one
float64 uniform per token, consumed by inverse-CDF sampling in reveal order; then the order; then the
counts. So `--order l2r --fixed_counts --steps n` reproduces generate_ar (uncached or cached L2R
decoding) token for token, and the encoder sampler with and without `cache_trick` gives identical
samples under the same seed.
"""

if __name__ == '__main__':  # run as a script (python aogpt/generate.py): one line, not an ImportError
    raise SystemExit("error: aogpt/generate.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import math
from dataclasses import fields

import torch

from aogpt.engine import EncoderStepper, SlotStepper
from aogpt.errors import UserError
from aogpt.orders import GRAMMAR, Order, parse_order
from aogpt.samplers import SAMPLERS, SCORES, EncoderPlan, Sampling, unread

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
    if not (isinstance(n, int) and n >= 0 and isinstance(steps, int) and steps >= 1):
        raise UserError(f"reveal_counts: n is an integer >= 0 and steps one >= 1, got n={n!r}, steps={steps!r}")
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

def logits_to_probs(logits, temperature=1.0, top_p=1.0, vocab_size=None, ban=None, ids=False):
    """The distribution every sampler draws a token from, as float64 probabilities (..., V') that sum to
    1: ids >= vocab_size (the head's padding rows) cut and `ban` (the encoder's [MASK]) never drawn, then
    temperature (0: one-hot on the argmax), then the nucleus: top_p < 1 keeps the smallest set of most
    likely tokens whose mass reaches top_p (the HF convention: the token that crosses top_p is kept).
    float64 throughout: low-precision (bf16/fp32) Gumbel noise lowers the effective temperature, this
    cannot. The speculative sampler's accept test reads these numbers for q and p alike.

    ids=True, for a draw (sample_tokens): (p, ids) instead, p (..., W) neither normalised nor scattered
    back (inverse_cdf needs neither): under the nucleus the kept tokens most likely first, as
    sorted_nucleus leaves them, ids (..., W) the token of each column; else ids is None (column j is
    token j)."""
    Sampling.check(temperature=temperature, top_p=top_p)  # the settings' rules, for a direct call
    V = logits.size(-1) if vocab_size is None else min(vocab_size, logits.size(-1))
    shape = logits.shape[:-1]
    logp = logits.reshape(-1, logits.size(-1))[:, :V].double()            # (R, V)
    if ban is not None and ban < V:
        logp = logp.index_fill(1, torch.tensor([ban], device=logp.device), -math.inf)
    idx = None
    if temperature == 0:
        p = torch.zeros_like(logp).scatter_(1, logp.argmax(1, keepdim=True), 1.0)
    else:
        p = torch.softmax(logp if temperature == 1 else logp / temperature, dim=1)
        if top_p < 1.0:
            p, idx = sorted_nucleus(p, top_p)                               # (R, W) each
    if ids:
        return p.view(*shape, -1), None if idx is None else idx.view(*shape, -1)
    if idx is not None:
        p = torch.zeros_like(logp).scatter_(1, idx, p)
    return (p / p.sum(1, keepdim=True)).view(*shape, V)


def sample_tokens(logits, u, temperature=1.0, top_p=1.0, vocab_size=None, ban=None, score=None):
    """One token per row of logits (..., V), by inverse-CDF sampling with the uniforms u (...) from the
    distribution logits_to_probs gives (temperature 0 is greedy).
    score: None, or how sure the model is of each row, for the confidence samplers; then returns
    (tokens, scores, top probabilities), each (...). Scores are computed on the distribution the token
    was drawn from (after temperature and top_p; at temperature 0 the plain softmax): 'confidence' the
    probability of the drawn token, 'margin' the top probability minus the second, 'entropy' the
    negative entropy (higher is surer in every mode).
    """
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
    p, ids = logits_to_probs(logits, temperature, top_p, ban=ban, ids=True)    # (R, W), None or (R, W)
    j, total = inverse_cdf(p, u)
    tok = j if ids is None else ids.gather(1, j[:, None]).squeeze(1)
    if score is None:
        return tok
    if temperature == 0:  # a one-hot says nothing of how sure the model was: score the plain softmax
        p, total = logits_to_probs(logits, 1.0, 1.0, ban=ban, ids=True)[0], 1.0
    return (tok, *_scores(p / total, j[:, None], score))


def inverse_cdf(p, u):
    """One index per row of p (..., V) (non-negative, not necessarily normalised) from the uniforms u (...),
    and each row's total mass (..., 1): the first index whose cdf exceeds u * total. Clamping below the
    total keeps the index at or before the last token with positive probability, so a zero-probability
    token can never be the first to exceed it."""
    cdf = p.cumsum(-1)
    total = cdf[..., -1:]
    if not bool(((total > 0) & torch.isfinite(total)).all()):  # NaN mass would draw an id past the vocabulary
        raise UserError("the model's probabilities are NaN or inf (non-finite logits: an overflow in float16, or "
                        "non-finite weights); no token is drawn from them (try --dtype float32 or bfloat16)")
    v = torch.minimum(u.to(cdf)[..., None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf.contiguous(), v.contiguous(), right=True).squeeze(-1), total


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


def sorted_nucleus(p, top_p):
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

def check_run(model, n, batch_size, steps=None, tokens=None):
    """A sampler's sizes and given tokens against the model, each in one line rather than a torch error deep in
    the run: n in [1, block_size], batch_size >= 1, steps >= 1 (the samplers that take them), and every given
    token id (tokens: the given or prompt ids, -1 where free) in the model's vocabulary."""
    V, limits = model.config.vocab_size, dict(n=model.config.block_size, batch_size=None, steps=None)
    for name, v in (('n', n), ('batch_size', batch_size), ('steps', steps)):
        if (name != 'steps' or v is not None) and not (isinstance(v, int) and 1 <= v <= (limits[name] or v)):
            raise UserError(f"{name} must be an integer >= 1" + (f" and <= block_size {limits[name]}" if limits[name]
                                                                 else "") + f", got {v!r}")
    ids = torch.as_tensor([] if tokens is None else tokens).reshape(-1)
    bad = ids[(ids >= V) | (ids < -1)]
    if bad.numel():
        raise UserError(f"given token id {bad[0].item()!r} is not in the model's vocabulary (ids 0..{V - 1}, and -1 "
                        f"where a token is to be generated)")


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


def check_order(order):
    """A generation order, checked: an order distribution (orders.GRAMMAR, defined in orders.py; a spec string
    comes back parsed, the orders.Order the sampler carries) or a permutation tensor. Raises ValueError
    (UserError) naming what is wrong and what is accepted. The confidence rules are samplers of their own
    (generate_confident), not orders: they pick positions from the drawn values."""
    if not isinstance(order, str):
        return order
    if order in SCORES:
        raise UserError(f"{order!r} is a sampler of its own (generate_confident(score={order!r})), which picks the "
                        f"positions from the drawn values, not an order fixed before the draws: an order is "
                        f"{GRAMMAR}, or a permutation")
    return parse_order(order)


def free_order(order, free, batch_size, generator=None, n=None):
    """(B, n_free) generation order of the free positions: drawn from an order distribution (orders.GRAMMAR,
    defined in orders.py), or a permutation (n,) / (B, n) of all positions, of which the free ones are taken
    in its order (n: the sequence's length, which the permutation must have; by default one past the last
    free position at least)."""
    B, nf = batch_size, free.numel()
    order = check_order(order)
    n = int(free.max()) + 1 if n is None and nf else n
    if isinstance(order, Order):
        if not order.fixed:
            return order.draw(B, positions=free, generator=generator)
        order = order.permutation(n)  # one order of all n positions: taken below as a permutation
    try:
        o = torch.as_tensor(order)
    except (TypeError, ValueError, RuntimeError):
        o = None
    if o is None or o.dim() not in (1, 2) or o.is_floating_point() or o.dtype == torch.bool:
        raise UserError(f"order must be an order distribution ({GRAMMAR}) or a permutation of the positions, "
                        f"a (n,) or (B, n) integer tensor; got {order!r:.60}")
    shape, o = tuple(o.shape), o.long().cpu()
    o = o.expand(B, -1) if o.dim() == 1 else o
    m = o.size(1)
    if o.size(0) != B or (n is not None and m != n) or not torch.equal(o.sort(1).values, torch.arange(m).expand(B, m)):
        N = m if n is None else n
        raise UserError(f"order must be a permutation of range({N}), ({N},) or one per sample ({B}, {N}): got " +
                        (f"shape {shape}" if shape not in ((N,), (B, N)) else "a tensor of that shape that is not one"))
    is_free = torch.zeros(m, dtype=torch.bool)
    is_free[free] = True
    return o[is_free[o]].view(B, nf)


# ----------------------------------------------------------------------------- documents

def doc_start(given, n):
    """Where a sample's own document may end: the position after the last given token (0 without any).
    An end symbol drawn before it (into a blank of a template) is inside the given text's document."""
    gpos = split_given(given, n)[0]
    return int(gpos.max()) + 1 if gpos.numel() else 0


def doc_lengths(x, end, start=0):
    """(B,) the length of each row's first document: the index of the first end symbol at or after
    start in x (B, n), or n where there is none (the document runs past the window)."""
    n = x.size(1)
    hit = (x == end) & (torch.arange(n, device=x.device) >= start)
    return torch.where(hit.any(1), hit.long().argmax(1), n)


def settled(x, end, start=0):
    """(B,) whether each row's first document is fixed: x (B, n) holds -1 where nothing is drawn yet.
    True when an end symbol sits at some e >= start with every position before e drawn: the first end
    symbol at or after start is then at or before e, among drawn positions, and a sampler that never
    changes a drawn token cannot move it. So a row may stop here, and its document is the one the
    full draw would have cut (the same tokens, from the same draws)."""
    n = x.size(1)
    hit = (x == end) & (torch.arange(n, device=x.device) >= start)
    first = (hit | (x < 0)).long().argmax(1)                             # the first end symbol or hole
    return hit.gather(1, first[:, None]).squeeze(1)


# ----------------------------------------------------------------------------- the samplers

def prologue(model, n, batch_size, steps, settings, sampler, given=None):
    """Every sampler's prologue, before its first draw (it draws nothing): the model kind, the settings
    (None: the defaults) against what `sampler` reads (SAMPLERS), n, batch_size, steps and the given
    tokens against the model (check_run). given: as generate_ao's; for 'ar' the prompt, a prefix.
    Returns (settings, device, the given positions ascending, their tokens, the free positions)."""
    if not SAMPLERS[sampler].needs(model):
        raise UserError(SAMPLERS[sampler].lacks)
    settings = Sampling() if settings is None else settings
    if not isinstance(settings, Sampling):
        raise UserError(f"settings must be a samplers.Sampling (or None for the defaults), got "
                        f"{type(settings).__name__}")
    chosen = {} if steps is None else dict(steps=steps)  # steps and the settings away from their defaults
    chosen.update((f.name, getattr(settings, f.name)) for f in fields(Sampling)
                  if getattr(settings, f.name) != f.default)
    bad = unread(sampler, **chosen)
    if bad:
        raise UserError(f"the {sampler} sampler does not read {bad[0]}={chosen[bad[0]]!r}: {bad[1]}")
    check_run(model, n, batch_size, steps, given)
    if sampler == 'ar':  # the prompt: the first tokens given, the rest free
        prompt = torch.as_tensor([] if given is None else given, dtype=torch.long).reshape(-1)
        if prompt.numel() >= n:
            raise UserError(f"the prompt ({prompt.numel()} tokens) leaves nothing to generate in n = {n}")
        given = torch.cat([prompt, torch.full((n - prompt.numel(),), -1, dtype=torch.long)])
    return (settings, next(model.parameters()).device) + split_given(given, n)


def slot_tables(gtok, reveal, n, device, room=0):
    """The KV-cached samplers' slots: slot 0 is [None] at position -1, slot j >= 1 the j-th revealed token
    (the given ones first) and its position. gtok (g,): the given tokens; reveal (B, m), m >= g: the
    positions known so far, in reveal order. Returns (tokens (B, n + 1 + room): -1 where not drawn yet, room
    past n for the speculative sampler's done samples; positions (B, n + 1): -1 past m)."""
    B, m, g = reveal.size(0), reveal.size(1), gtok.numel()
    slot_tok = torch.full((B, n + 1 + room), -1, dtype=torch.long)
    slot_tok[:, 1:g + 1] = gtok
    slot_pos = torch.full((B, n + 1), -1, dtype=torch.long)
    slot_pos[:, 1:m + 1] = reveal.cpu()
    return slot_tok.to(device), slot_pos.to(device)


def draw_plan(n, batch_size, steps, settings=None, *, order='random', given=None):
    """Everything generate_ao decides before its first forward pass, in its fixed order of draws: one
    float64 uniform per token (consumed in reveal order by the token draws), the order, the counts (the
    settings' schedule and fixed_counts; settings None: the defaults).
    Returns (u (B, n), reveal (B, n) positions in reveal order (the given ones first, ascending),
    counts (T,) tokens revealed per step, the given positions, their tokens)."""
    B, s = batch_size, Sampling() if settings is None else settings
    gpos, gtok, free = split_given(given, n)
    u = s.rand(B, n)
    reveal = torch.cat([gpos.expand(B, gpos.numel()), free_order(order, free, B, s.generator, n)], 1)
    counts = reveal_counts(free.numel(), steps, s.schedule, s.fixed_counts, s.generator)
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
def generate_ao(model, n, batch_size, steps, settings=None, *, order='random', given=None, stepper='dynamic'):
    """KV-cached any-order sampling from an AO-GPT / sigma-GPT. Returns (tokens (B, n), stats).

    settings: a Sampling (None: the defaults): the token draw, the schedule, and until (below).

    order: an order distribution (orders.GRAMMAR, defined in aogpt/orders.py: 'random' is the MDM reverse
    process) or a permutation, fixed before the first pass (positions chosen step by step from the model's
    scores are the confidence samplers, generate_confident).
    given: LongTensor (n,) with -1 at the positions to generate; the given tokens enter the cache first
    (ascending positions, in the first pass), the rest follow `order`. stats: steps (those that revealed a
    token, at most min(steps, tokens generated): a step that reveals none makes no call), forward_calls,
    token_passes (rows through the network per sample), tokens_generated, counts (the per-step counts
    of the steps that ran), order (B, n) positions in reveal order.
    stepper: how each forward call runs: 'dynamic', 'static' or 'cuda_graph', or a SlotStepper to reuse
    (its captured graphs); the samples are the same up to float rounding.
    settings.until: an end-of-document id, or None. A sample stops once its first document is settled (see
    settled: an end symbol after the given text with every position before it drawn): with an order
    that fills blocks left to right that is the end of the block holding it, with a uniform order
    rarely before the end. The batch shares its calls, so it stops when every sample has; a sample
    that stopped rides along until then, and is returned as it stood when it stopped (-1 where
    nothing was drawn). Every draw is fixed before the first call, so the documents are token for
    token those of the full draw cut by doc_lengths. stats then also hold calls_full (the full
    draw's calls), and per sample stop_call (the calls it needed) and generated (tokens drawn by then).
    """
    order = check_order(order)  # a spec string parsed once, here
    settings, dev, gpos, gtok, _ = prologue(model, n, batch_size, steps, settings, 'ao', given)
    B, g, until = batch_size, gpos.numel(), settings.until
    u, reveal, counts, _, _ = draw_plan(n, B, steps, settings, order=order, given=given)
    calls = ao_calls(counts.tolist(), g)
    slot_tok, slot_pos = slot_tables(gtok, reveal, n, dev)                # the j-th revealed token, its position
    reveal, u = reveal.to(dev), u.to(dev)

    rows = []  # every call's slots (the pending ones, then k copies of the last), up front: one copy to
    for r, L, k in calls:  # the device, not one per call
        rows += list(range(L, L + r - k)) + [L + r - k] * k
    rows = torch.tensor(rows, device=dev)
    step = SlotStepper.make(model, B, stepper)
    if until is not None:  # each sample's tokens by position (-1: not drawn yet), for the stop rule
        x, start = torch.full((B, n), -1, dtype=torch.long, device=dev), doc_start(given, n)
        x[:, gpos.to(dev)] = gtok.to(dev)
        stop_call, generated = torch.full((B,), len(calls)), torch.full((B,), n - g)
        at_stop = x.clone()                                               # each stopped sample's tokens
    a, made = 0, 0
    for r, L, k in calls:
        m = L + r - k                                                     # tokens revealed so far
        slots = rows[a:a + r]
        logits = step(slot_tok[:, slots], slot_pos[:, slots], reveal[:, L:m + k], k)  # (B, k, V)
        step.cache.keep(r - k + 1)                                        # the pending slots and the first copy
        slot_tok[:, m + 1:m + k + 1] = sample_tokens(logits, u[:, m:m + k], **settings.transform)
        a, made = a + r, made + 1
        if until is not None and made < len(calls):
            x.scatter_(1, reveal[:, m:m + k], slot_tok[:, m + 1:m + k + 1])
            now = settled(x, until, start).cpu() & (stop_call == len(calls))  # the samples that stop here
            stop_call[now], generated[now] = made, m + k - g
            at_stop[now.to(dev)] = x[now.to(dev)]
            if bool((stop_call < len(calls)).all()):
                break
    tokens = torch.empty(B, n, dtype=torch.long, device=dev).scatter_(1, reveal, slot_tok[:, 1:])
    if until is not None:  # a sample that stopped is what it held then: its later draws were never its own
        tokens = torch.where((stop_call < len(calls)).to(dev)[:, None], at_stop, tokens)
    stats = dict(steps=made, forward_calls=made, token_passes=sum(r for r, _, _ in calls[:made]),
                 tokens_generated=n - g, counts=[k for _, _, k in calls[:made]], order=reveal)
    if until is not None:
        stats.update(calls_full=len(calls), stop_call=stop_call.tolist(), generated=generated.tolist())
    return tokens, stats


@torch.no_grad()
def generate_confident(model, n, batch_size, steps, settings=None, *, score='confidence', given=None,
                       stepper='dynamic'):
    """Confidence-ordered decoding (LLaDA's low-confidence remasking, Dream's margin and entropy) on the
    exact KV cache: the samplers SCORES names (score: 'confidence', 'margin' or 'entropy', how sure a position
    is, see sample_tokens). Each step scores every still-masked position in one pass (one query copy per masked
    position, the parallel block), draws a candidate token for each, and reveals the k surest: k from
    the Lemma-1 counts over `steps` (as generate_ao), or with settings.threshold > 0 every position whose top
    probability is at least threshold (and at least one); steps is then None (there is no step schedule).
    The revealed tokens enter the cache in that order, surest first, so the cache holds exactly what a
    cache-free pass over the same order would compute. A step costs its pending slots plus one row per masked
    position: about n T / 2 token-passes for T equal steps, against under 2n for the fixed orders (stats
    token_passes).
    Randomness: the counts first (when used), then per step one float64 uniform per masked position.
    With a threshold the number of steps differs between samples, so each sample is decoded on its own
    (batch 1, one after another, on one batch-1 stepper: the caller's stepper's sibling, kept with it, so
    its graphs are captured once); stats then give the mean calls and token-passes per sample.
    """
    if score not in SCORES:
        raise UserError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    settings, dev, gpos, gtok, free = prologue(model, n, batch_size, steps, settings, score, given)
    threshold = settings.threshold
    if threshold and batch_size > 1:
        solo = stepper.for_batch(1) if isinstance(stepper, SlotStepper) else SlotStepper(model, 1, stepper)
        runs = [generate_confident(model, n, 1, steps, settings, score=score, given=given, stepper=solo)
                for _ in range(batch_size)]
        stats = dict(steps=None, tokens_generated=runs[0][1]['tokens_generated'],
                     forward_calls=sum(st['forward_calls'] for _, st in runs) / batch_size,
                     token_passes=sum(st['token_passes'] for _, st in runs) / batch_size,
                     counts=[st['counts'] for _, st in runs], order=torch.cat([st['order'] for _, st in runs]))
        return torch.cat([x for x, _ in runs]), stats
    B, g = batch_size, gpos.numel()
    counts = [] if threshold else [k for k in reveal_counts(free.numel(), steps, settings.schedule,
                                                              settings.fixed_counts, settings.generator).tolist() if k]
    reveal = torch.empty(B, n, dtype=torch.long, device=dev)             # positions in reveal order
    reveal[:, :g] = gpos.to(dev)
    slot_tok, slot_pos = slot_tables(gtok, gpos.expand(B, g), n, dev)    # the given slots; the rest as revealed
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
        cand, sure, top = sample_tokens(logits, settings.rand(B, nm), score=score, **settings.transform)
        k = counts[len(ks)] if not threshold else max(1, int((top >= threshold).sum()))  # (B is 1 with a threshold)
        if threshold and (top >= threshold).any():  # exactly the positions whose top probability reaches it, surest
            sure = torch.where(top >= threshold, sure, -math.inf)  # first (by margin or entropy: other positions)
        j = sure.topk(k, dim=1).indices                                  # (B, k), surest first
        step.cache.keep(m - c + 1, chosen=j[:, 0])                       # pending slots, the surest copy
        new = qpos.gather(1, j)
        reveal[:, m:m + k], slot_pos[:, m + 1:m + k + 1] = new, new
        slot_tok[:, m + 1:m + k + 1] = cand.gather(1, j)
        masked.scatter_(1, new, False)
        m, passes = m + k, passes + tok.size(1)
        ks.append(k)
    tokens = torch.empty(B, n, dtype=torch.long, device=dev).scatter_(1, reveal, slot_tok[:, 1:])
    stats = dict(steps=len(ks), forward_calls=len(ks), token_passes=passes,
                 tokens_generated=n - g, counts=ks, order=reveal)
    return tokens, stats


@torch.no_grad()
def generate_ar(model, n, batch_size, settings=None, *, prompt=None, order=None, stepper='dynamic'):
    """Plain KV-cache decoding, one token per forward call, left to right (the AR baseline) or along one fixed
    order (a GPT trained on it: train.py --cond=none --order=fixed:S).

    Works for any decoder (a GPT, or an AO-GPT in that order). order: None or 'l2r' (left to right), or one fixed
    order of all n positions: a fixed order spec (fixed:S, fixedblocks:K:S) or a permutation (n,); a GPT is never
    told which position comes next, so it samples right only along the order it was trained on. prompt: a
    list/LongTensor of the ids at the order's first positions (left to right: a prefix), fed in the first call.
    Returns (tokens (B, n) by position, stats) like generate_ao.
    stepper: as in generate_ao (a call here is the prompt, then one row at a time).
    settings: a Sampling (None: the defaults): the token draw, and until: an end-of-document id, or None:
    as in generate_ao, a sample stops once its first document after the prompt is settled (left to right: at its
    first end symbol; later positions -1), the batch once every sample has.
    """
    settings, dev, _, gtok, _ = prologue(model, n, batch_size, None, settings, 'ar', prompt)
    B, g, until = batch_size, gtok.numel(), settings.until
    order = check_order('l2r' if order is None else order)
    if isinstance(order, Order) and not (order.is_l2r or order.fixed):
        raise UserError(f"generate_ar decodes along one fixed order (l2r, fixed:S, fixedblocks:K:S or a permutation "
                        f"of the n positions), not the distribution {order}: use generate_ao for an any-order decoder")
    perm = torch.arange(n) if isinstance(order, Order) and order.is_l2r else \
        free_order(order, torch.arange(n), 1, n=n)[0]                        # (n,) the positions in decoding order
    u = settings.rand(B, n).to(dev)                                          # same stream as generate_ao
    tok, pos = slot_tables(gtok, perm.expand(B, n), n, dev)                  # slot j: the token at position perm[j-1]
    tgt = torch.cat([pos[:, 1:], pos[:, -1:]], 1)                            # and predicts position perm[j]
    step = SlotStepper.make(model, B, stepper)
    logits = step(tok[:, :g + 1], pos[:, :g + 1], tgt[:, :g + 1], 1)         # the prompt: a causal block
    step.cache.keep(g + 1)
    stop_call, perm_dev = torch.full((B,), n - g), perm.to(dev)
    if until is not None:  # each sample's tokens by position (-1: not drawn yet), for the stop rule
        x, start = torch.full((B, n), -1, dtype=torch.long, device=dev), int(perm[:g].max()) + 1 if g else 0
        x[:, perm_dev[:g]] = gtok.to(dev)
    for i in range(g, n):
        if i > g:
            logits = step(tok[:, i:i + 1], pos[:, i:i + 1], tgt[:, i:i + 1], 1)
            step.cache.keep(1)
        tok[:, i + 1] = sample_tokens(logits[:, -1], u[:, i], **settings.transform)
        if until is not None and i + 1 < n:
            x[:, perm_dev[i]] = tok[:, i + 1]
            now = settled(x, until, start).cpu() & (stop_call == n - g)   # left to right: the end symbol just drawn
            stop_call[now] = i + 1 - g
            if bool((stop_call < n - g).all()):
                break
    made = i + 1 - g
    if until is not None:
        tok[:, 1:][(torch.arange(n)[None] >= g + stop_call[:, None]).to(dev)] = -1
    stats = dict(steps=made, forward_calls=made, token_passes=g + made, tokens_generated=n - g,
                 order=perm_dev.expand(B, n))
    if until is not None:
        stats.update(calls_full=n - g, stop_call=stop_call.tolist(), generated=stop_call.tolist())
    return torch.empty_like(tok[:, 1:]).scatter_(1, perm_dev.expand(B, n), tok[:, 1:]), stats


@torch.no_grad()
def generate_mdm(model, n, batch_size, steps, settings=None, *, order='random', given=None, stepper='dynamic',
                 plan=None):
    """The encoder MDM's reverse process: a full pass over all n positions ([MASK] where not yet
    revealed) per step, the same Lemma-1 schedule as generate_ao. Returns (tokens (B, n), stats).
    settings: a Sampling (None: the defaults): the token draw and the schedule. plan: an EncoderPlan
    (None: the defaults, shared counts without the caching trick): how the reveal times are drawn and
    whether an unchanged input reuses the last pass.
    The head runs only on the positions revealed at a step (the others' logits are never used).
    stepper: 'dynamic', 'static' or 'cuda_graph' (the one pass captured once), or an EncoderStepper to reuse.
    """
    order = check_order(order)  # a spec string parsed once, here
    settings, dev, gpos, gtok, free = prologue(model, n, batch_size, steps, settings, 'mdm', given)
    cfg, s, B = model.config, settings, batch_size
    g, nf = gpos.numel(), free.numel()
    plan = EncoderPlan() if plan is None else plan
    if not isinstance(plan, EncoderPlan):
        raise ValueError(f"plan must be a samplers.EncoderPlan (or None for the defaults), got {type(plan).__name__}")
    u = s.rand(B, n)
    if plan.counts == 'shared':
        forder = free_order(order, free, B, s.generator, n)                # (B, nf)
        k = reveal_counts(nf, steps, s.schedule, s.fixed_counts, s.generator)  # (T,)
        step_of_rank = torch.repeat_interleave(torch.arange(steps), k)      # (nf,) step of the j-th reveal
        step = torch.empty(B, n, dtype=torch.long).scatter_(1, forder, step_of_rank.expand(B, nf))
    else:  # independent
        if s.fixed_counts or not (isinstance(order, Order) and order.spec == 'random'):
            raise ValueError("counts='independent' draws per-position reveal times: no fixed_counts/order")
        U = s.rand(B, nf)
        t = reveal_step(U, time_grid(steps, s.schedule))                   # (B, nf)
        step = torch.empty(B, n, dtype=torch.long).scatter_(1, free.expand(B, nf), t)
        forder = free[(t * n + free).argsort(dim=1)]  # reveal order: by step, then position
    reveal = torch.cat([gpos.expand(B, g), forder], 1)                      # (B, n)
    u_pos = torch.empty_like(u).scatter_(1, reveal, u)                      # the uniform of each position
    step[:, gpos] = -1
    # every (sample, position) to reveal, sorted by step, with the step boundaries: no syncs in the loop
    bb, pp = (step >= 0).nonzero(as_tuple=True)
    st = step[bb, pp]
    perm = (st * (B * n) + bb * n + pp).argsort()
    bb, pp = bb[perm].to(dev), pp[perm].to(dev)
    bounds = [0] + torch.bincount(st, minlength=steps).cumsum(0).tolist()
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
        if not plan.cache_trick or (hi > lo and stale):
            h = encode(x)                                                   # (B, n, C)
            passes += 1
            stale = False
        if hi == lo:
            continue
        bi, pi = bb[lo:hi], pp[lo:hi]
        logits = model.lm_head(h[bi, pi])                                   # (R, V): revealed rows only
        x[bi, pi] = sample_tokens(logits, u_pos[bi, pi], ban=cfg.mask_token_id, **s.transform)
        stale = True
    stats = dict(steps=sum(b > a for a, b in zip(bounds, bounds[1:])), forward_calls=passes,
                 token_passes=passes * n, tokens_generated=nf,
                 order=reveal.to(dev), step_of=step)  # step_of (B, n): each position's step, -1 if given
    return x, stats
