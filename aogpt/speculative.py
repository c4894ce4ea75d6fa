"""
Exact parallel decoding for an any-order decoder: self-speculative sampling (ASSD, Guo & Ermon,
arXiv 2504.20456) on the KV-cached slot sampler of generate.py and engine.py.

The law we want is sequential sampling along an order sigma fixed before any token is drawn:
x_sigma(j) ~ p(. | x_sigma(<j)) for j = 0..n-1, each conditional after the same temperature / top-p
transform. A round at m revealed tokens does it for several j at once with two forward calls:

  draft   one call: k copies of the last slot behind the parallel mask, copy j carrying target
          sigma(m+j). Copy j sees only the m committed tokens, so it gives q_j = p(x_sigma(m+j) | x_sigma(<m)),
          a guess that ignores the tokens between. Draw d_j ~ q_j, independently. Copy 0 is the causal
          slot m itself: q_0 is the true conditional, so d_0 is committed at once, and its row stays
          in the cache (as in generate_ao).
  verify  one call: d_0..d_{k-2} as causal slots m+1..m+k-1 with chained targets sigma(m+1..m+k-1) give
          the true conditionals p_j = p(x_sigma(m+j) | x_sigma(<m), d_0..d_{j-1}) for j = 1..k-1; one more
          slot (d_{k-1}, target sigma(m+k)) gives p_k, the bonus conditional when every draft is kept.
  accept  for j = 1, 2, ...: keep d_j with probability min(1, p_j(d_j) / q_j(d_j)). At the first
          rejection draw y ~ norm(max(p_j - q_j, 0)) in its place and end the round; if every draft is
          kept, draw the bonus y ~ p_k.

Why it is exact. Given the committed prefix, d_j is proposed from q_j and kept with probability
min(1, p_j/q_j); otherwise the replacement comes from the residual. The kept-or-replaced token then has
law sum_x q(x) min(1, p(x)/q(x)) [at x] + (1 - sum_x min(q, p)) norm(p - q)+ = min(p, q) + (p - q)+ = p,
exactly p_j, whatever q_j is (Leviathan et al. 2022; Chen et al. 2023). The tokens after a rejection are
thrown away, so every committed token has its true conditional given the tokens committed before it,
and the chain rule gives the joint along sigma. The proposal only moves the acceptance rate: a draft
copy with a wrong target is still exact (it is just a worse q), except copy 0, which is committed
untested and must be the true conditional. With sigma drawn uniformly per sample (independent of the
drafts) the law is the mixture over sigma, that of generate_ao at T = n. Orders chosen from the drawn
values (confidence) change sigma after the fact: not exact, refused.

The cache. A slot's K/V depend on its token, its position and its target (AdaLN or sigma-GPT's input),
so a row may stay only if both its token and its target's token are committed. After a accepted drafts
and a replacement y the verify rows of slots m+1..m+a+1 qualify (the last one's target is where y
lands); y's own slot is the last slot of the next round, whose draft copy 0 computes it.

Batches. Rows accept different counts, but the cache is rectangular: every row commits the batch
minimum A (+2 tokens: d_0..d_A, then row b's replacement y_b if it stopped at A, else its accepted
d_{A+1}). This is exact: for row b, the minimum over the *other* rows is independent of row b's draws,
and committing min(a_b, that) is exactly a round with the shorter draft length A + 2 (no bonus).
batch_commit='per_row' wastes nothing instead: every sample commits its own count, the cache buffer stays
rectangular with holes that each sample masks out (attention does not care where a key sits, as
positions enter through the slot embeddings), compacted when it runs out; on fixed shapes too
(RowStepper), so that the CUDA-graph path gets it.

Cost: a round is 2 calls and commits >= 2 tokens (d_0, then a kept draft or a replacement), so calls <=
tokens; a last lone token costs the draft call alone. Token-passes per round: the draft's pending +
k copies, then k - 1 (+1 bonus) verify rows.

Fused rounds (fused=True, per-sample commits): one call a round. The verify call also carries the next
round's draft copies, k of them hung off every row of its chain (which row's copies are used depends on
where the round's tests stop), under a tree mask (fused_mask). Those drafts miss the round's last token,
so the next round tests every draft, the first too, against its chain; the round commits the kept
drafts and a replacement or bonus (>= 1 token a call). Still exact: each draft is drawn before its test
from a proposal that is a function of the past. Rows per call (k + 1)^2, so it pays where a call's cost
is its latency, not its rows (bench/sample_roofline.py counts both).

Randomness, from one CPU torch.Generator in a fixed order: first the order (free_order), then per
round: k uniforms per sample for the drafts, k - 1 for the accept tests, 1 for the replacement / bonus
(a round with k = 1, the last lone token, draws only its draft uniform). All float64, inverse CDF.
"""

import torch

from aogpt.engine import KV_BUCKET, KVCache, SlotStepper
from aogpt.generate import ADAPTIVE, check_order, free_order, inverse_cdf, logits_to_probs, split_given
from model import parallel_mask

K_MAX = 16   # the largest draft length k='auto' goes to
K_FUSED = 8  # the same for fused rounds, whose calls carry (k + 1)^2 rows


def draw(p, u):
    """One token per row of p (..., V) by generate.inverse_cdf (sample_tokens' draw) with the uniforms u
    (...); the clamp only guards the last index against rounding."""
    return inverse_cdf(p, u)[0].clamp(max=p.size(-1) - 1)


def _residual(p, q):
    """max(p - q, 0) per row (R, V); a rejection needs p(d) < q(d), so the mass is positive but for float
    rounding when p and q agree to the last bit, where p itself is the answer."""
    r = (p - q).clamp(min=0)
    return torch.where(r.sum(-1, keepdim=True) > 0, r, p)


def auto_k(accepted, rounds, k_max=K_MAX):
    """k for the next round from the past ones (a function of the past only, so still exact): about
    twice the mean tokens a round has committed, so the drafts rarely run out, at most k_max."""
    if not rounds:
        return 4
    return max(2, min(k_max, round(2 * accepted / rounds)))


def _stepper(model, B, stepper):
    if isinstance(stepper, str):
        return SlotStepper(model, B, stepper)
    if stepper.B != B:
        raise ValueError(f"this stepper was built for batch size {stepper.B}, not {B}")
    stepper.cache.keep(None)
    return stepper


@torch.no_grad()
def generate_speculative(model, n, batch_size, *, k=4, order='random', given=None, temperature=1.0, top_p=1.0,
                         vocab_size=None, generator=None, stepper='dynamic', bonus=True, batch_commit='per_row',
                         fused=False, trace=False, _bug=None):
    """Samples (B, n) from the model's exact joint along `order` (or the mixture over random orders),
    at under one forward call per token (module docstring). Returns (tokens (B, n), stats).

    k: draft length per round (>= 2; 1 is plain one-token-per-call decoding) or 'auto'.
    order: 'random', 'l2r', 'blocks:K' or a permutation, fixed before the first draw; the confidence
    orders are refused (not exact). given: as generate_ao (the given tokens enter the cache first).
    stepper: 'dynamic', 'static', 'cuda_graph' or a SlotStepper (RowStepper for per_row) to reuse.
    bonus: the extra verify slot that earns a token when every draft is kept. batch_commit: 'per_row'
    (each sample commits what it accepted, under a per-sample cache mask; a mode name, or a RowStepper
    for the fixed shapes) or 'min' (every sample commits the batch's fewest: exact, simpler, but at
    B = 32 almost always 2 a round).
    fused: one call a round instead of two (per_row only, always with the bonus; see _fused): the next
    round's drafts hang off the verify call's rows, so they miss the round's last token and every draft,
    the first too, is tested; k is then the drafts per round (auto: at most K_FUSED).
    stats: forward_calls, token_passes (rows per sample through the network), tokens_generated, rounds
    (the batch's), rounds_per_sample and calls_per_sample (the mean over samples of the rounds and calls
    each needed on its own: under per_row commits a sample that is done waits for the batch),
    committed (tokens per round), drafted (k per round), accept_rate (kept / tested drafts over all
    rows, before the batch minimum), frac (revealed fraction at each round's start), order (B, n);
    with trace=True also events: per round (m (B,) tokens revealed before it, k, t (B,) tokens it committed,
    a (B,) drafts each sample's tests kept past d_0, drafts (B, k), the committed tokens (B, >= t)).
    _bug: the tests' negative controls ('resample_p', 'keep_rejected', 'wrong_target'): wrong on purpose.
    """
    if not (model.config.causal and model.any_order):
        raise ValueError("speculative sampling needs an any-order decoder (AO-GPT or sigma-GPT); an encoder "
                         "MDM or an L2R GPT cannot score a drafted sequence in one pass")
    if isinstance(check_order(order), str) and order in ADAPTIVE:
        raise ValueError(f"order {order!r} is chosen from the drawn values, so speculative sampling would not "
                         f"be exact: use random, l2r, blocks:K or a permutation")
    if k != 'auto' and (not isinstance(k, int) or k < 1):
        raise ValueError(f"k must be an integer >= 1 or 'auto', got {k!r}")
    if n > model.config.block_size:
        raise ValueError(f"n = {n} > block_size {model.config.block_size}")
    if batch_commit not in ('min', 'per_row'):
        raise ValueError(f"batch_commit must be 'min' or 'per_row', got {batch_commit!r}")
    if fused and (batch_commit != 'per_row' or not bonus):
        raise ValueError("fused=True needs batch_commit='per_row' and the bonus slot (its drafts for the next "
                         "round hang off the bonus row when every draft is kept)")
    if _bug and not (batch_commit == 'min' or fused and _bug in ('keep_rejected', 'stale_q')):
        raise ValueError("the negative controls (_bug) live in the batch-minimum and fused paths")
    dev = next(model.parameters()).device
    B = batch_size
    gpos, gtok, free = split_given(given, n)
    g = gpos.numel()
    reveal = torch.cat([gpos.expand(B, g), free_order(order, free, B, generator)], 1)  # (B, n) positions
    slot_tok = torch.full((B, n + 1), -1, dtype=torch.long)                 # slot j: the j-th revealed token
    slot_tok[:, 1:g + 1] = gtok
    slot_tok = slot_tok.to(dev)
    slot_pos = torch.cat([torch.full((B, 1), -1), reveal], 1).to(dev)        # its position; [None] is -1
    reveal = reveal.to(dev)
    tf = dict(temperature=temperature, top_p=top_p, vocab_size=vocab_size)
    rnd = lambda *shape: torch.rand(*shape, dtype=torch.float64, generator=generator).to(dev)  # noqa: E731
    if batch_commit == 'per_row':
        if getattr(stepper, 'mode', 'dynamic') != 'dynamic' and not isinstance(stepper, RowStepper):
            raise ValueError("batch_commit='per_row' at fixed shapes takes a mode name or a RowStepper "
                             "(speculative.row_stepper), not a SlotStepper")
        if fused:
            stats = _fused(model, n, B, k, reveal, slot_tok, slot_pos, g, tf, rnd, trace, stepper, _bug)
        else:
            stats = _per_row(model, n, B, k, reveal, slot_tok, slot_pos, g, tf, rnd, bonus, trace, stepper)
    else:
        stats = _batch_min(model, n, B, k, reveal, slot_tok, slot_pos, g, tf, rnd, bonus, trace, stepper, _bug)
    tokens = torch.empty(B, n, dtype=torch.long, device=dev).scatter_(1, reveal, slot_tok[:, 1:])
    stats = dict(stats, steps=stats['rounds'], tokens_generated=n - g, order=reveal)
    if not trace:
        stats.pop('events')
    return tokens, stats


def _batch_min(model, n, B, k, reveal, slot_tok, slot_pos, g, tf, rnd, bonus, trace, stepper, _bug):
    """generate_speculative with batch_commit='min': every sample commits the batch's fewest (any
    SlotStepper, and the tests' negative controls)."""
    dev = slot_tok.device
    step = _stepper(model, B, stepper)
    ar = torch.arange(B, device=dev)
    m, calls, passes = g, 0, 0
    committed, drafted, frac, events = [], [], [], []
    kept_tests = all_tests = 0
    while m < n:
        kk = min(auto_k(sum(committed), len(committed)) if k == 'auto' else k, n - m)
        c = step.cache.len
        # draft: the pending slots c..m-1 (the given tokens at the first round, else none), then kk copies
        # of slot m, copy j with target reveal[m + j]
        idx = list(range(c, m)) + [m] * kk
        tgt = torch.cat([reveal[:, c:m], reveal[:, m:m + kk]], 1)           # (empty pending when c > m: a bug)
        if _bug == 'wrong_target' and kk > 1:  # copy 0 drafts the next position's conditional
            tgt = tgt.clone()
            tgt[:, m - c], tgt[:, m - c + 1] = reveal[:, m + 1], reveal[:, m]
        q = logits_to_probs(step(slot_tok[:, idx], slot_pos[:, idx], tgt, kk), **tf)   # (B, kk, V)
        step.cache.keep(max(0, m - c + 1))                                  # the pending slots and copy 0
        calls, passes = calls + 1, passes + len(idx)
        d = draw(q, rnd(B, kk))                                             # (B, kk) drafts
        if kk == 1:
            slot_tok[:, m + 1] = d[:, 0]
            committed.append(1), drafted.append(1), frac.append(m / n)
            if trace:
                events.append((torch.full((B,), m), 1, torch.ones(B, dtype=torch.long),
                               torch.zeros(B, dtype=torch.long), d.cpu(), d.cpu()))
            m += 1
            continue
        # verify: d_0..d_{kk-2} in slots m+1..m+kk-1, targets chained; + the bonus slot when there is room
        nb = int(bonus and m + kk < n)
        nv = kk - 1 + nb
        p = logits_to_probs(step(d[:, :nv], reveal[:, m:m + nv], reveal[:, m + 1:m + 1 + nv], 1, n_logits=nv), **tf)
        calls, passes = calls + 1, passes + nv                               # p: (B, nv, V)
        ua, ur = rnd(B, kk - 1), rnd(B)
        dj = d[:, 1:, None]                                                  # (B, kk-1, 1)
        ratio = p[:, :kk - 1].gather(2, dj).squeeze(2) / q[:, 1:].gather(2, dj).squeeze(2)
        a = (ua < ratio).long().cumprod(1).sum(1)                            # (B,) drafts kept past d_0
        kept_tests += int(a.sum())
        all_tests += int(torch.clamp(a + 1, max=kk - 1).sum())
        # each row's replacement: the residual at its first rejection j = a + 1, or the bonus p_kk
        j = torch.clamp(a + 1, max=kk - 1)
        pj = p[ar, j - 1] if not nb else torch.where((a == kk - 1)[:, None], p[:, -1], p[ar, j - 1])
        qj = torch.where((a == kk - 1)[:, None], torch.zeros_like(pj), q[ar, j])
        resid = pj if _bug == 'resample_p' else _residual(pj, qj)
        y = draw(resid, ur)                                                  # (B,)
        A = int(a.min())
        if A < kk - 1:   # d_0..d_A, then y where the row stopped at A, else its kept d_{A+1}
            t = A + 2
            new = torch.cat([d[:, :A + 1], torch.where(a == A, y, d[:, A + 1])[:, None]], 1)
        else:            # every draft kept in every row: d_0..d_{kk-1} (+ the bonus)
            t = kk + nb
            new = torch.cat([d, y[:, None]], 1)[:, :t]
        slot_tok[:, m + 1:m + 1 + t] = new
        # keep the verify rows whose token and target are committed: slots m+1..m+t-1
        step.cache.keep(t if _bug == 'keep_rejected' and A < kk - 1 else t - 1)
        committed.append(t), drafted.append(kk), frac.append(m / n)
        if trace:
            events.append((torch.full((B,), m), kk, torch.full((B,), t), a.cpu(), d.cpu(), new.cpu()))
        m += t
    return dict(forward_calls=calls, token_passes=passes, rounds=len(committed),
                rounds_per_sample=len(committed), calls_per_sample=calls, committed=committed, drafted=drafted,
                frac=frac, accept_rate=kept_tests / all_tests if all_tests else float('nan'), events=events)


class RowCache(KVCache):
    """A KVCache whose rows (samples) keep different slots: the buffer stays rectangular, every call
    writes all samples' rows at [len, len + r), and `valid` (B, S) says which slots each sample attends
    to. Attention does not care where a key sits (positions enter through the slot embeddings), so a
    slot a sample did not keep is just masked out; compact() moves each sample's kept slots to the front
    when the buffer runs out."""

    def __init__(self, model, batch_size, slots, device):
        super().__init__(model, batch_size)
        self.shape = self.shape[:2] + (slots,) + self.shape[3:]
        self.valid = torch.zeros(batch_size, slots, dtype=torch.bool, device=device)

    def mask(self, inner):
        """(B, 1, r, len + r) attention mask: each sample's kept slots, then `inner` (r, r) among the rows."""
        B, r, L = self.shape[0], inner.size(0), self.len
        return torch.cat([self.valid[:, None, :L].expand(B, r, L), inner.expand(B, r, r)], 2)[:, None]

    def commit(self, keep):
        _commit(self, self.valid, keep)

    def room(self, r, limit=None):
        _room(self, self.valid, r, self.shape[2])


def _commit(cache, valid, keep):
    """Keep the last call's row i for the samples where keep (B, r) is set; the buffer advances to the
    last row any sample keeps (the rows after it are overwritten by the next call)."""
    r = keep.size(1)
    valid[:, cache.len:cache.len + r] = keep
    cols = keep.any(0).nonzero()
    cache.len += int(cols.max()) + 1 if cols.numel() else 0


def _room(cache, valid, r, limit):
    """Before a call of r rows: if they would pass `limit` slots, move each sample's kept slots to the
    front (in place: a captured graph reads these very tensors)."""
    if cache.len + r > limit:
        idx = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices    # (B, S) kept first
        for buf in cache.k + cache.v:
            buf.copy_(buf.gather(2, idx[:, None, :, None].expand_as(buf)))
        valid.copy_(valid.gather(1, idx))
        cache.len = int(valid.sum(1).max())
        if cache.len + r > limit:
            raise RuntimeError(f"per-sample cache: {cache.len} kept + {r} rows > {limit} slots")


class RowStepper(SlotStepper):
    """SlotStepper's fixed shapes ('static', 'cuda_graph') with per-sample commits: the cache buffer is
    longer (room for the holes), and every row also masks out the slots its sample did not keep (`valid`,
    a device tensor updated in place, so a replayed graph reads the current one)."""

    def __init__(self, model, batch_size, mode, slots, kv_bucket=KV_BUCKET):
        super().__init__(model, batch_size, mode, kv_bucket)
        c = self.cache
        c.shape = c.shape[:2] + (KVCache.slots(slots),) + c.shape[3:]        # + a scratch row, 16-aligned
        self.valid = torch.zeros(batch_size, c.shape[2], dtype=torch.bool, device=self.dev)

    def commit(self, keep):
        _commit(self.cache, self.valid, keep)

    def room(self, r):
        _room(self.cache, self.valid, r, self.cache.shape[2] - 1)  # padding rows past it share the scratch row

    def _forward(self, R, span, tree=False):
        # SlotStepper's fixed-shape mask, and each sample's kept slots among the cached ones
        buf, L = self.bufs[R], self.scalars[0]
        vis, input_pos = self.visible(R, span, tree)                     # (R, span), (R,)
        j = torch.arange(span, device=self.dev)
        vis = vis & ((j >= L) | self.valid[:, :span])[:, None]           # (B, R, span)
        return self.model.hidden_slots(buf[0], buf[1], buf[2], mask=vis[:, None], kv=(self.cache, input_pos, span))


def row_slots(n, k, n_given=0, fused=False):
    """Buffer slots for per-sample commits: room for the kept slots, about as many holes, and a call."""
    kmax = (K_FUSED if fused else K_MAX) if k == 'auto' else k
    return 2 * (n + 1) + ((kmax + 1) ** 2 if fused else kmax) + n_given


def row_stepper(model, batch_size, mode, n, k, n_given=0, kv_bucket=KV_BUCKET, fused=False):
    """A RowStepper for runs of n tokens at draft length k (reusable across runs: its graphs are kept)."""
    return RowStepper(model, batch_size, mode, row_slots(n, k, n_given, fused), kv_bucket)


def _row_caller(model, n, B, k, g, stepper, dev, fused=False):
    """The per-sample cache (RowCache at dynamic shapes, a RowStepper at fixed ones) and call(tok, pos,
    tgt, n_par, n_logits, inner) -> logits of one forward call of r rows: inner (r, r) is which of them
    each row sees; at fixed shapes the last n_par rows form the parallel block instead, unless fused."""
    mode = getattr(stepper, 'mode', stepper)
    if mode == 'dynamic':
        cache = RowCache(model, B, row_slots(n, k, g, fused), dev)
    else:
        cache = row_stepper(model, B, mode, n, k, g, fused=fused) if isinstance(stepper, str) else stepper
        cache.cache.keep(None)
        cache.valid.zero_()

    def call(tok, pos, tgt, n_par, n_logits, inner):
        cache.room(tok.size(1))
        if mode == 'dynamic':
            L, r = cache.len, tok.size(1)
            kv = cache, torch.arange(L, L + r, device=dev), L + r
            return model.forward_slots(tok, pos, tgt, mask=cache.mask(inner), kv=kv, n_logits=n_logits)
        return cache(tok, pos, tgt, n_par, n_logits=n_logits, inner=inner if fused else None)
    return cache, call


def _per_row(model, n, B, k, reveal, slot_tok, slot_pos, g, tf, rnd, bonus, trace, stepper):
    """generate_speculative with batch_commit='per_row': each sample commits what it accepted (RowCache at
    dynamic shapes, RowStepper at fixed ones). Same draws, in the same order, as the batch-minimum path."""
    dev = slot_tok.device
    kmax = K_MAX if k == 'auto' else k
    cache, call = _row_caller(model, n, B, k, g, stepper, dev)
    tok_buf = torch.full((B, n + kmax + 3), -1, dtype=torch.long, device=dev)   # room past n for done rows
    tok_buf[:, :n + 1] = slot_tok
    m = torch.full((B,), g, dtype=torch.long, device=dev)                        # tokens revealed, per sample
    ar = torch.arange(B, device=dev)
    at = lambda idx: reveal.gather(1, idx.clamp(max=n - 1))                      # noqa: E731 positions at slots
    calls = passes = kept_tests = all_tests = 0
    committed, drafted, frac, events, tot, live, own_calls = [], [], [], [], 0, 0, 0
    while bool((m < n).any()):
        active = m < n
        live += int(active.sum())
        kk = min(auto_k(tot, len(committed)) if k == 'auto' else k, int((n - m).max()))
        kb = torch.clamp(n - m, max=kk)                                          # (B,) drafts that fit
        own_calls += int(active.sum()) + int((active & (kb > 1)).sum())          # a lone last token: 1 call
        P = g if calls == 0 else 0                                               # the given slots, once
        j = torch.arange(kk, device=dev)
        tok = torch.cat([tok_buf[:, :P], tok_buf.gather(1, m[:, None]).expand(B, kk)], 1)
        pos = torch.cat([slot_pos[:, :P], slot_pos.gather(1, m.clamp(max=n)[:, None]).expand(B, kk)], 1)
        tgt = torch.cat([reveal[:, :P], at(m[:, None] + j)], 1)
        q = logits_to_probs(call(tok, pos, tgt, kk, kk, parallel_mask(P + kk, kk, 0, dev)), **tf)   # (B, kk, V)
        cache.commit(torch.cat([torch.ones(B, P, dtype=torch.bool, device=dev), active[:, None],
                                torch.zeros(B, kk - 1, dtype=torch.bool, device=dev)], 1))
        calls, passes = calls + 1, passes + P + kk
        d = draw(q, rnd(B, kk))                                                  # (B, kk)
        if kk == 1:
            t, a, new = active.long(), torch.zeros(B, dtype=torch.long, device=dev), d
        else:
            nb = int(bonus and bool((m + kk < n).any()))
            nv = kk - 1 + nb
            jv = torch.arange(nv, device=dev)
            p = logits_to_probs(call(d[:, :nv], at(m[:, None] + jv), at(m[:, None] + 1 + jv), 1, nv,
                           torch.ones(nv, nv, dtype=torch.bool, device=dev).tril()), **tf)  # (B, nv, V)
            calls, passes = calls + 1, passes + nv
            ua, ur = rnd(B, kk - 1), rnd(B)
            dj = d[:, 1:, None]
            ratio = p[:, :kk - 1].gather(2, dj).squeeze(2) / q[:, 1:].gather(2, dj).squeeze(2)
            ok = (ua < ratio) & (j[1:] < kb[:, None])                           # tests past a row's end fail
            a = ok.long().cumprod(1).sum(1)                                      # (B,) drafts kept past d_0
            full = a == kb - 1
            nbr = full & (m + kb < n) & bool(nb)                                 # the row earns the bonus
            kept_tests += int(a[active].sum())
            all_tests += int(torch.minimum(a + 1, kb - 1)[active].sum())
            jr = torch.clamp(a + 1, max=kk - 1)
            pj = torch.where(nbr[:, None], p[:, -1], p[ar, jr - 1])
            qj = torch.where(nbr[:, None], torch.zeros_like(pj), q[ar, jr])
            y = draw(_residual(pj, qj), ur)                                      # (B,) replacement or bonus
            t = torch.where(full, kb + nbr.long(), a + 2) * active               # (B,) tokens committed
            new = torch.cat([d, d[:, :1]], 1)                                    # (B, kk + 1)
            new.scatter_(1, (t - 1).clamp(min=0)[:, None], torch.where(full & ~nbr, new.gather(
                1, (t - 1).clamp(min=0)[:, None]).squeeze(1), y)[:, None])
            cache.commit(jv[None] < (t - 1)[:, None])                            # rows m+1..m+t-1 per sample
        w = new.size(1)
        cols = m[:, None] + 1 + torch.arange(w, device=dev)
        keep = torch.arange(w, device=dev)[None] < t[:, None]
        tok_buf.scatter_(1, cols, torch.where(keep, new, tok_buf.gather(1, cols)))
        committed.append(float(t[active].float().mean())), drafted.append(kk)
        frac.append(float(m[active].float().mean()) / n)
        tot += committed[-1]
        if trace:
            events.append((m.cpu(), kk, t.cpu(), a.cpu(), d.cpu(), new.cpu()))
        m = m + t
    slot_tok.copy_(tok_buf[:, :n + 1])
    return dict(forward_calls=calls, token_passes=passes, rounds=len(committed), rounds_per_sample=live / B,
                calls_per_sample=own_calls / B,                committed=committed,
                drafted=drafted, frac=frac, accept_rate=kept_tests / all_tests if all_tests else float('nan'),
                events=events)


def fused_mask(P, C, K2, device=None):
    """(r, r) bool, r = P + C + C * K2: which of a fused call's rows each row sees. P pending rows and C
    chain rows are causal; then K2 draft copies of each chain row i, each seeing the pending rows, the
    chain rows before i and itself: what row i sees, with its own target in place of row i's."""
    r = P + C + C * K2
    m = torch.ones(r, r, dtype=torch.bool, device=device).tril()
    hang = torch.arange(C, device=device).repeat_interleave(K2)              # (C * K2,) the row each copies
    m[P + C:] = False
    m[P + C:, :P] = True
    m[P + C:, P:P + C] = torch.arange(C, device=device)[None] < hang[:, None]
    cp = torch.arange(P + C, r, device=device)
    m[cp, cp] = True
    return m


def _fused(model, n, B, k, reveal, slot_tok, slot_pos, g, tf, rnd, trace, stepper, _bug=None):
    """Per-sample commits at one forward call a round. A round at m revealed tokens carries drafts
    e_0..e_{K-1} for sigma(m..m+K-1), drawn last round from proposals qd. Its one call runs the chain
    (slot m, target sigma(m); then e_i in slot m+1+i, target sigma(m+1+i)), giving the true conditionals
    p_0..p_K, and K2 draft copies hung off every chain row i (targets sigma(m+i+1..m+i+K2)). Accept:
    e_j with probability min(1, p_j(e_j) / qd_j(e_j)) for j = 0, 1, ...; at the first rejection a, y from
    norm(max(p_a - qd_a, 0)); if all K are kept, y from p_K (the bonus). The round commits e_0..e_{a-1}, y
    (a + 1 tokens) and keeps chain rows 0..a in the cache; the next drafts are the copies of row a, which
    saw every committed token but y. Exact for the reason the two-call round is (each draft is fixed
    before its own test, and its proposal is a function of the past); a first round has no drafts and is
    one exact token. Draws per round: K accept uniforms, 1 for y, K2 for the next drafts. _bug: the tests'
    negative controls, 'keep_rejected' (chain row a + 1 stays in the cache) and 'stale_q' (drafts drawn
    from row a's copies are tested against row 0's)."""
    dev = slot_tok.device
    cache, call = _row_caller(model, n, B, k, g, stepper, dev, fused=True)
    kmax = K_FUSED if k == 'auto' else k
    tok_buf = torch.full((B, n + kmax + 3), -1, dtype=torch.long, device=dev)   # room past n for done rows
    tok_buf[:, :n + 1] = slot_tok
    m = torch.full((B,), g, dtype=torch.long, device=dev)                        # tokens revealed, per sample
    ar = torch.arange(B, device=dev)
    at = lambda idx: reveal.gather(1, idx.clamp(max=n - 1))                      # noqa: E731 positions at slots
    e = torch.zeros(B, 0, dtype=torch.long, device=dev)                          # (B, K) drafts carried
    qd, kd = None, torch.zeros(B, dtype=torch.long, device=dev)                  # their proposals, count
    calls = passes = kept_tests = all_tests = live = tot = 0
    committed, drafted, frac, events = [], [], [], []
    while bool((m < n).any()):
        active = m < n
        live += int(active.sum())
        K, C = e.size(1), e.size(1) + 1
        K2 = auto_k(tot, len(committed), K_FUSED) if k == 'auto' else k
        K2 = max(0, min(K2, int((n - m - 2)[active].max())))                    # drafts the next round can use
        P = g if calls == 0 else 0                                               # the given slots, once
        i = torch.arange(C, device=dev)
        c_tok = torch.cat([tok_buf.gather(1, m[:, None]), e], 1)                # (B, C) the chain
        c_pos = torch.cat([slot_pos.gather(1, m[:, None]), at(m[:, None] + i[:-1])], 1)
        c_tgt = at(m[:, None] + i)
        cp_tgt = at((m[:, None, None] + i[None, :, None] + 1 + torch.arange(K2, device=dev)).reshape(B, -1))
        tok = torch.cat([tok_buf[:, :P], c_tok, c_tok.repeat_interleave(K2, 1)], 1)
        pos = torch.cat([slot_pos[:, :P], c_pos, c_pos.repeat_interleave(K2, 1)], 1)
        tgt = torch.cat([reveal[:, :P], c_tgt, cp_tgt], 1)                        # copies: (B, C * K2)
        pr = logits_to_probs(call(tok, pos, tgt, 1, C * (K2 + 1), fused_mask(P, C, K2, dev)), **tf)
        calls, passes = calls + 1, passes + tok.size(1)
        p, qn = pr[:, :C], pr[:, C:].reshape(B, C, K2, pr.size(-1))                   # (B, C, V), (B, C, K2, V)
        ua, ur = rnd(B, K), rnd(B)
        if K:
            ej = e[:, :, None]
            ratio = p[:, :K].gather(2, ej).squeeze(2) / qd.gather(2, ej).squeeze(2)
            ok = (ua < ratio) & (i[None, :K] < kd[:, None])                     # no test past a row's drafts
            a = ok.long().cumprod(1).sum(1)                                      # (B,) drafts kept
            qa = torch.where((a < kd)[:, None], qd[ar, a.clamp(max=K - 1)], torch.zeros_like(p[:, 0]))
        else:
            a = torch.zeros(B, dtype=torch.long, device=dev)
            qa = torch.zeros_like(p[:, 0])
        y = draw(_residual(p[ar, a], qa), ur)                                    # (B,) replacement or bonus
        t = (a + 1) * active                                                     # (B,) tokens committed
        kept_tests += int(a[active].sum())
        all_tests += int(torch.minimum(a + 1, kd)[active].sum())
        keep = t + (a < kd) if _bug == 'keep_rejected' else t
        cache.commit(torch.cat([torch.ones(B, P, dtype=torch.bool, device=dev), i[None] < keep[:, None],
                                torch.zeros(B, C * K2, dtype=torch.bool, device=dev)], 1))
        new = torch.cat([e, y[:, None]], 1).scatter(1, a[:, None], y[:, None])   # (B, C): e_0..e_{a-1}, y
        cols = m[:, None] + 1 + i
        tok_buf.scatter_(1, cols, torch.where(i[None] < t[:, None], new, tok_buf.gather(1, cols)))
        committed.append(float(t[active].float().mean())), drafted.append(K)
        frac.append(float(m[active].float().mean()) / n)
        tot += committed[-1]
        if trace:
            events.append((m.cpu(), kd.cpu(), t.cpu(), a.cpu(), e.cpu(), new.cpu()))
        m = m + t
        # the next round's drafts: the copies of each sample's row a
        qd = qn[ar, a]                                                           # (B, K2, V)
        e = draw(qd, rnd(B, K2)) if K2 else e[:, :0]
        if _bug == 'stale_q':
            qd = qn[:, 0]
        kd = torch.clamp(n - m - 1, min=0, max=K2) * (m < n)
        Kn = int(kd.max())
        e, qd = e[:, :Kn], qd[:, :Kn]
    slot_tok.copy_(tok_buf[:, :n + 1])
    return dict(forward_calls=calls, token_passes=passes, rounds=len(committed), rounds_per_sample=live / B,
                calls_per_sample=live / B, committed=committed, drafted=drafted, frac=frac,
                accept_rate=kept_tests / all_tests if all_tests else float('nan'), events=events)
