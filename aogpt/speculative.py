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
untested and must be the true conditional. With sigma drawn per sample from `order` (independent of the
drafts) the law is the mixture over sigma of that chain: generate_ao's law when each of its steps reveals
one token (fixed_counts=True with steps >= the tokens to generate; with random counts, only in the limit of
many more steps than tokens). It is not generate_ao's law at T = n with random counts: a step there may
reveal several tokens, each drawn given only the tokens revealed before the step, and at n = T = 5 only
5!/5^5 = 3.8% of runs reveal one token per step. Orders chosen from the drawn values (confidence) change
sigma after the fact: not exact, refused.

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
(engine.RowStepper), so that the CUDA-graph path gets it.

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

The code: the three round loops (_batch_min, _per_row, _fused) share one run state (_Run: the slots the
rounds fill in, the draws, the counts) and one accept test with its replacement / bonus draw (accept);
q and p come from generate.logits_to_probs, the transform sample_tokens draws from; the caches and the
calls are engine.py's (SlotStepper, RowStepper).
"""

if __name__ == '__main__':  # run as a script (python aogpt/speculative.py): one line, not an ImportError
    raise SystemExit("error: aogpt/speculative.py is a library module, with nothing to run: the commands are train.py,"
                     " sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

from dataclasses import dataclass, field

import torch

from aogpt.engine import KV_BUCKET, RowStepper, SlotStepper
from aogpt.generate import check_order, doc_start, free_order, inverse_cdf, logits_to_probs, prologue, settled, \
    slot_tables
from aogpt.samplers import Sampling

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


@dataclass
class _Run:
    """One run, as the three round loops share it: the reveal order and the slots the rounds fill in,
    the transform and the draws, and the counts that become the stats."""
    n: int
    g: int                    # given tokens: slots 1..g, entered first
    reveal: torch.Tensor      # (B, n) positions in reveal order
    slot_tok: torch.Tensor    # (B, n + 1 + room) slot j: the j-th revealed token (room past n for done rows)
    slot_pos: torch.Tensor    # (B, n + 1) its position; slot 0 is [None] at -1
    settings: Sampling        # one transform for q and p alike, the generator, until
    sp: 'Speculation'         # the draft length, the bonus slot, the trace
    start: int = 0            # where a document may end (generate.doc_start)
    calls: int = 0            # forward calls of the batch
    passes: int = 0           # rows through the network per sample
    kept: int = 0             # drafts kept by the accept tests, over all samples
    tested: int = 0           # drafts tested
    live: int = 0             # rounds summed over the samples taking part in them
    committed: list = field(default_factory=list)
    drafted: list = field(default_factory=list)
    frac: list = field(default_factory=list)
    events: list = field(default_factory=list)

    @property
    def B(self):
        return self.reveal.size(0)

    def rand(self, *shape):
        return self.settings.rand(*shape).to(self.reveal.device)

    def at(self, idx):
        """The positions that the slots idx (B, ...) reveal (clamped for done samples)."""
        return self.reveal.gather(1, idx.clamp(max=self.n - 1))

    def next_k(self):
        """The draft length of the next round: k, or under 'auto' auto_k's, at most the Speculation's k_max."""
        k = self.sp.k
        return auto_k(sum(self.committed), len(self.committed), self.sp.k_max) if k == 'auto' else k

    def forward(self, step, tok, pos, tgt, k, **kw):
        """One forward call, counted: its probabilities under the transform (B, n_logits, V')."""
        self.calls, self.passes = self.calls + 1, self.passes + tok.size(1)
        return logits_to_probs(step(tok, pos, tgt, k, **kw), **self.settings.transform)

    def record(self, m, k, t, a, drafts, new):
        """One round's bookkeeping. m, t: tokens revealed before it and committed in it, per sample (B,),
        or ints where the batch shares them; k: drafts (an int, or per sample); a: drafts kept; drafts
        (B, k) and the committed tokens new (B, >= t)."""
        if isinstance(m, int):
            self.committed.append(t), self.frac.append(m / self.n)
            m, t = torch.full((self.B,), m), torch.full((self.B,), t)
        else:
            live = m < self.n
            self.live += int(live.sum())
            self.committed.append(float(t[live].float().mean()))
            self.frac.append(float(m[live].float().mean()) / self.n)
        self.drafted.append(drafts.size(1))
        if self.sp.trace:
            k = k.cpu() if torch.is_tensor(k) else k
            self.events.append((m.cpu(), k, t.cpu(), a.cpu(), drafts.cpu(), new.cpu()))

    def write(self, m, new, t):
        """Per-sample commits: sample b's first t[b] tokens of new (B, w) into its slots m[b] + 1..."""
        w = torch.arange(new.size(1), device=m.device)
        cols = m[:, None] + 1 + w
        self.slot_tok.scatter_(1, cols, torch.where(w[None] < t[:, None], new, self.slot_tok.gather(1, cols)))

    def settled(self, m):
        """(B,) the samples whose first document is settled (generate.settled) after m (B,) tokens each."""
        if self.settings.until is None:
            return torch.zeros_like(m, dtype=torch.bool)
        x = torch.full((self.B, self.n), -1, dtype=torch.long, device=self.reveal.device)
        drawn = torch.arange(self.n, device=m.device)[None] < m[:, None]      # slots 1..m[b] hold tokens
        x.scatter_(1, self.reveal, torch.where(drawn, self.slot_tok[:, 1:self.n + 1], -1))
        return settled(x, self.settings.until, self.start)

    def stop(self, m):
        """m (B,) with each sample whose document is settled marked done (m = n): it draws no more."""
        return torch.where(self.settled(m) & (m < self.n), self.n, m)

    def stats(self, rounds_per_sample, calls_per_sample):
        return dict(forward_calls=self.calls, token_passes=self.passes, rounds=len(self.committed),
                    rounds_per_sample=rounds_per_sample, calls_per_sample=calls_per_sample, committed=self.committed,
                    drafted=self.drafted, frac=self.frac,
                    accept_rate=self.kept / self.tested if self.tested else float('nan'), events=self.events)


def accept(run, p, q, d, n_tests, bonus):
    """The accept test and the draw that ends a round (module docstring, "accept"), for every sample at
    once. d (B, J): drafts proposed from q (B, J, V); p (B, J or J + 1, V): the true conditionals at the
    drafts' positions, then the one after the last (the bonus) if the call computed it. Sample b tests its
    first n_tests[b] drafts in order, keeping d_j with probability min(1, p_j(d_j) / q_j(d_j)), and stops
    at the first rejection: a[b] drafts kept. Then y[b]: a replacement from norm(max(p_a - q_a, 0)) in
    the rejected draft's place, or where every test passed and bonus[b], the bonus from p_a (where every
    test passed without the bonus, y is not used). Uniforms: J for the tests, then 1 for y, per sample.
    Returns (a, y), each (B,); the kept and tested drafts are counted in the run (a sample that is done
    has n_tests 0 and counts nothing)."""
    B, J = d.shape
    ar = torch.arange(B, device=d.device)
    ua, ur = run.rand(B, J), run.rand(B)
    dj = d[:, :, None]
    ratio = p[:, :J].gather(2, dj).squeeze(2) / q.gather(2, dj).squeeze(2)             # (B, J)
    ok = (ua < ratio) & (torch.arange(J, device=d.device) < n_tests[:, None])
    a = ok.long().cumprod(1).sum(1)                                                   # (B,)
    run.kept += int(a.sum())
    run.tested += int(torch.minimum(a + 1, n_tests).sum())
    pa = p[ar, a.clamp(max=p.size(1) - 1)]
    qa = q[ar, a.clamp(max=J - 1)] if J else torch.zeros_like(pa)
    return a, draw(_residual(pa, torch.where(((a == n_tests) & bonus)[:, None], 0.0, qa)), ur)


@dataclass(frozen=True)
class Speculation:
    """How the speculative sampler drafts, commits and records its rounds (the module docstring): one object,
    checked when it is made, passed whole to generate_speculative and row_stepper. The token draw is the
    Sampling's, as for every sampler.

    k             drafts per round: an integer >= 2, 1 (plain one-token-per-call decoding), or 'auto' (from
                  the rounds so far, auto_k; at most K_MAX, K_FUSED when fused)
    bonus         the extra verify slot that earns a token when every draft is kept
    batch_commit  'per_row': each sample commits what it accepted, under a per-sample cache mask; 'min': every
                  sample commits the batch's fewest (exact, simpler, but at B = 32 almost always 2 a round)
    fused         one call a round instead of two (per_row only, always with the bonus; see _fused): the next
                  round's drafts hang off the verify call's rows, so they miss the round's last token and
                  every draft, the first too, is tested; k is then the drafts per round
    trace         the stats also hold each round's events (a copy to the CPU per round: slower on a GPU)

    Change one with dataclasses.replace(speculation, k=8).
    """
    k: object = 4
    bonus: bool = True
    batch_commit: str = 'per_row'
    fused: bool = False
    trace: bool = False

    def __post_init__(self):
        if self.k != 'auto' and (not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1):
            raise ValueError(f"k must be an integer >= 1 or 'auto', got {self.k!r}")
        if self.batch_commit not in ('min', 'per_row'):
            raise ValueError(f"batch_commit must be 'min' or 'per_row', got {self.batch_commit!r}")
        for name in ('bonus', 'fused', 'trace'):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.fused and (self.batch_commit != 'per_row' or not self.bonus):
            raise ValueError("fused=True needs batch_commit='per_row' and the bonus slot (its drafts for the next "
                             "round hang off the bonus row when every draft is kept)")

    @property
    def k_max(self):
        """The largest draft length a round may use: k, or under 'auto' K_FUSED (fused) or K_MAX."""
        return (K_FUSED if self.fused else K_MAX) if self.k == 'auto' else self.k


@torch.no_grad()
def generate_speculative(model, n, batch_size, settings=None, *, speculation=None, order='random', given=None,
                         stepper='dynamic'):
    """Samples (B, n) from the model's exact joint along `order` (or the mixture over random orders),
    at under one forward call per token (module docstring). Returns (tokens (B, n), stats).

    settings: a Sampling (None: the defaults): the token draw, for q and p alike, and until (below).
    speculation: a Speculation (None: the defaults, k=4 with per-sample commits): the draft length, the
    bonus slot, how a batch commits, fused rounds, the trace.
    order: an order distribution (orders.GRAMMAR, defined in aogpt/orders.py) or a permutation, fixed
    before the first draw (a confidence sampler picks positions from the drawn values: not exact). given: as
    generate_ao (the given tokens enter the cache first).
    stepper: 'dynamic', 'static', 'cuda_graph' or a SlotStepper to reuse; under per-sample commits at fixed
    shapes a RowStepper (row_stepper).
    stats: forward_calls, token_passes (rows per sample through the network), tokens_generated, rounds
    (the batch's), rounds_per_sample and calls_per_sample (the mean over samples of the rounds and calls
    each needed on its own: under per_row commits a sample that is done waits for the batch),
    committed (tokens per round), drafted (k per round), accept_rate (kept / tested drafts over all
    rows, before the batch minimum), frac (revealed fraction at each round's start), order (B, n);
    with speculation.trace also events: per round (m (B,) tokens revealed before it, k, t (B,) tokens it
    committed, a (B,) drafts each sample's tests kept past d_0, drafts (B, k), the committed tokens (B, >= t)).
    settings.until: an end-of-document id, or None: a sample stops once its first document is settled
    (generate.settled). Stopping is a function of the committed tokens only, which nothing changes
    later, so a stopped sample's document has the law the full draw's would have after the cut. With
    per_row commits a stopped sample drops out of the rounds (it waits for the batch, as a finished
    one does); with 'min' the batch stops when every sample has. Positions never drawn are -1; stats
    then also hold per sample generated (tokens drawn when it stopped).
    """
    settings, dev, gpos, gtok, free = prologue(model, n, batch_size, None, settings, 'speculative', given)
    order = check_order(order)  # a spec string parsed once, here (a confidence sampler's name is refused there)
    sp = Speculation() if speculation is None else speculation
    if not isinstance(sp, Speculation):
        raise ValueError(f"speculation must be a speculative.Speculation (or None for the defaults), got "
                         f"{type(sp).__name__}")
    per_row = sp.batch_commit == 'per_row'
    if per_row and getattr(stepper, 'mode', 'dynamic') != 'dynamic' and not isinstance(stepper, RowStepper):
        raise ValueError("batch_commit='per_row' at fixed shapes takes a mode name or a RowStepper "
                         "(speculative.row_stepper), not a SlotStepper")
    B, g, until = batch_size, gpos.numel(), settings.until
    reveal = torch.cat([gpos.expand(B, g), free_order(order, free, B, settings.generator, n)], 1)  # (B, n)
    room = min(sp.k_max, n) + 2 if per_row else 0                           # past n, for the done samples
    slot_tok, slot_pos = slot_tables(gtok, reveal, n, dev, room)            # the j-th revealed token, its position
    run = _Run(n, g, reveal.to(dev), slot_tok, slot_pos, settings, sp,
               doc_start(given, n) if until is not None else 0)
    if per_row:
        step = RowStepper.make(model, B, stepper, slots=row_slots(n, sp, g))
        stats = _fused(run, step) if sp.fused else _per_row(run, step)
    else:
        stats = _batch_min(run, SlotStepper.make(model, B, stepper))
    tokens = torch.empty(B, n, dtype=torch.long, device=dev).scatter_(1, run.reveal, run.slot_tok[:, 1:n + 1])
    stats = dict(stats, steps=stats['rounds'], tokens_generated=n - g, order=run.reveal)
    if until is not None:
        stats['generated'] = ((run.slot_tok[:, 1:n + 1] >= 0).sum(1) - g).tolist()
    if not sp.trace:
        stats.pop('events')
    return tokens, stats


def _batch_min(run, step):
    """generate_speculative with batch_commit='min': every sample commits the batch's fewest (any
    SlotStepper)."""
    n, B, reveal, slot_tok, slot_pos = run.n, run.B, run.reveal, run.slot_tok, run.slot_pos
    m = run.g
    while m < n:
        kk = min(run.next_k(), n - m)
        c = step.cache.len
        # draft: the pending slots c..m-1 (the given tokens at the first round, else none), then kk copies
        # of slot m, copy j with target reveal[m + j]
        idx = list(range(c, m)) + [m] * kk
        tgt = torch.cat([reveal[:, c:m], reveal[:, m:m + kk]], 1)           # (empty pending when c > m: a bug)
        q = run.forward(step, slot_tok[:, idx], slot_pos[:, idx], tgt, kk)  # (B, kk, V)
        step.cache.keep(max(0, m - c + 1))                                  # the pending slots and copy 0
        d = draw(q, run.rand(B, kk))                                        # (B, kk) drafts
        if kk == 1:
            slot_tok[:, m + 1] = d[:, 0]
            run.record(m, 1, 1, torch.zeros(B, dtype=torch.long), d, d)
            m += 1
            if m < n and bool(run.settled(torch.full((B,), m, device=reveal.device)).all()):
                break
            continue
        # verify: d_0..d_{kk-2} in slots m+1..m+kk-1, targets chained; + the bonus slot when there is room
        nb = int(run.sp.bonus and m + kk < n)
        nv = kk - 1 + nb
        p = run.forward(step, d[:, :nv], reveal[:, m:m + nv], reveal[:, m + 1:m + 1 + nv], 1, n_logits=nv)
        a, y = accept(run, p, q[:, 1:], d[:, 1:], torch.full_like(d[:, 0], kk - 1),  # tests d_1..d_{kk-1}
                      torch.full_like(d[:, 0], nb, dtype=torch.bool))
        A = int(a.min())
        if A < kk - 1:   # d_0..d_A, then y where the row stopped at A, else its kept d_{A+1}
            t = A + 2
            new = torch.cat([d[:, :A + 1], torch.where(a == A, y, d[:, A + 1])[:, None]], 1)
        else:            # every draft kept in every row: d_0..d_{kk-1} (+ the bonus)
            t = kk + nb
            new = torch.cat([d, y[:, None]], 1)[:, :t]
        slot_tok[:, m + 1:m + 1 + t] = new
        # keep the verify rows whose token and target are committed: slots m+1..m+t-1
        step.cache.keep(t - 1)
        run.record(m, kk, t, a, d, new)
        m += t
        if m < n and bool(run.settled(torch.full((B,), m, device=reveal.device)).all()):
            break
    return run.stats(len(run.committed), run.calls)


def row_slots(n, speculation=None, n_given=0):
    """Buffer slots for per-sample commits: room for the kept slots, about as many holes, and a call."""
    sp = Speculation() if speculation is None else speculation
    k = min(sp.k_max, n)  # a round drafts at most the n - m tokens left: a longer k sizes nothing
    return 2 * (n + 1) + ((k + 1) ** 2 if sp.fused else k) + n_given


def row_stepper(model, batch_size, mode, n, speculation=None, n_given=0, kv_bucket=KV_BUCKET):
    """A RowStepper (engine.py) for runs of n tokens under speculation (a Speculation, None: the defaults),
    reusable across runs: its graphs are kept."""
    return RowStepper(model, batch_size, mode, row_slots(n, speculation, n_given), kv_bucket)


def _per_row(run, step):
    """generate_speculative with batch_commit='per_row': each sample commits what it accepted (a
    RowStepper). Same draws, in the same order, as the batch-minimum path."""
    n, B, g, reveal, slot_tok, slot_pos = run.n, run.B, run.g, run.reveal, run.slot_tok, run.slot_pos
    dev = slot_tok.device
    m = torch.full((B,), g, dtype=torch.long, device=dev)                        # tokens revealed, per sample
    own_calls = 0
    while bool((m < n).any()):
        active = m < n
        kk = min(run.next_k(), int((n - m).max()))
        kb = torch.clamp(n - m, max=kk)                                          # (B,) drafts that fit
        own_calls += int(active.sum()) + int((active & (kb > 1)).sum())          # a lone last token: 1 call
        P = g if run.calls == 0 else 0                                           # the given slots, once
        j = torch.arange(kk, device=dev)
        tok = torch.cat([slot_tok[:, :P], slot_tok.gather(1, m[:, None]).expand(B, kk)], 1)
        pos = torch.cat([slot_pos[:, :P], slot_pos.gather(1, m.clamp(max=n)[:, None]).expand(B, kk)], 1)
        q = run.forward(step, tok, pos, torch.cat([reveal[:, :P], run.at(m[:, None] + j)], 1), kk)  # (B, kk, V)
        step.cache.commit(torch.cat([torch.ones(B, P, dtype=torch.bool, device=dev), active[:, None],
                                     torch.zeros(B, kk - 1, dtype=torch.bool, device=dev)], 1))
        d = draw(q, run.rand(B, kk))                                             # (B, kk)
        if kk == 1:
            t, a, new = active.long(), torch.zeros(B, dtype=torch.long, device=dev), d
        else:
            nb = int(run.sp.bonus and bool((m + kk < n).any()))
            nv = kk - 1 + nb
            jv = torch.arange(nv, device=dev)
            p = run.forward(step, d[:, :nv], run.at(m[:, None] + jv), run.at(m[:, None] + 1 + jv), 1, n_logits=nv)
            has_bonus = (m + kb < n) & bool(nb)                                  # the row has its bonus slot
            a, y = accept(run, p, q[:, 1:], d[:, 1:], (kb - 1).clamp(min=0), has_bonus)  # tests past a row's end fail
            full = a == kb - 1
            nbr = full & has_bonus                                               # the row earns the bonus
            t = torch.where(full, kb + nbr.long(), a + 2) * active               # (B,) tokens committed
            new = torch.cat([d, d[:, :1]], 1)                                    # (B, kk + 1)
            new.scatter_(1, (t - 1).clamp(min=0)[:, None], torch.where(full & ~nbr, new.gather(
                1, (t - 1).clamp(min=0)[:, None]).squeeze(1), y)[:, None])
            step.cache.commit(jv[None] < (t - 1)[:, None])                       # rows m+1..m+t-1 per sample
        run.write(m, new, t)
        run.record(m, kk, t, a, d, new)
        m = run.stop(m + t)
    return run.stats(run.live / B, own_calls / B)


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


def _draft(qn, a, u):
    """The next round's drafts (B, K2), from the copies hung off each sample's chain row a (the last it
    kept: they saw every committed token but the round's last), with the uniforms u (B, K2); and the
    proposals they will be tested against, the same (B, K2, V)."""
    qd = qn[torch.arange(qn.size(0), device=qn.device), a]
    return draw(qd, u), qd


def _fused(run, step):
    """Per-sample commits at one forward call a round. A round at m revealed tokens carries drafts
    e_0..e_{K-1} for sigma(m..m+K-1), drawn last round from proposals qd. Its one call runs the chain
    (slot m, target sigma(m); then e_i in slot m+1+i, target sigma(m+1+i)), giving the true conditionals
    p_0..p_K, and K2 draft copies hung off every chain row i (targets sigma(m+i+1..m+i+K2)). Accept:
    e_j with probability min(1, p_j(e_j) / qd_j(e_j)) for j = 0, 1, ...; at the first rejection a, y from
    norm(max(p_a - qd_a, 0)); if all K are kept, y from p_K (the bonus). The round commits e_0..e_{a-1}, y
    (a + 1 tokens) and keeps chain rows 0..a in the cache; the next drafts are the copies of row a, which
    saw every committed token but y. Exact for the reason the two-call round is (each draft is fixed
    before its own test, and its proposal is a function of the past); a first round has no drafts and is
    one exact token. Draws per round: K accept uniforms, 1 for y, K2 for the next drafts."""
    n, B, g, reveal, slot_tok, slot_pos = run.n, run.B, run.g, run.reveal, run.slot_tok, run.slot_pos
    dev = slot_tok.device
    m = torch.full((B,), g, dtype=torch.long, device=dev)                        # tokens revealed, per sample
    e = torch.zeros(B, 0, dtype=torch.long, device=dev)                          # (B, C - 1) drafts carried
    qd, kd = None, torch.zeros(B, dtype=torch.long, device=dev)                  # their proposals, count
    while bool((m < n).any()):
        active = m < n
        C = e.size(1) + 1                                                        # chain rows: slot m, then the drafts
        K2 = max(0, min(run.next_k(), int((n - m - 2)[active].max())))  # drafts the next round can use
        P = g if run.calls == 0 else 0                                           # the given slots, once
        i = torch.arange(C, device=dev)
        c_tok = torch.cat([slot_tok.gather(1, m[:, None]), e], 1)               # (B, C) the chain
        c_pos = torch.cat([slot_pos.gather(1, m[:, None]), run.at(m[:, None] + i[:-1])], 1)
        c_tgt = run.at(m[:, None] + i)
        cp_tgt = run.at((m[:, None, None] + i[None, :, None] + 1 + torch.arange(K2, device=dev)).reshape(B, -1))
        tok = torch.cat([slot_tok[:, :P], c_tok, c_tok.repeat_interleave(K2, 1)], 1)
        pos = torch.cat([slot_pos[:, :P], c_pos, c_pos.repeat_interleave(K2, 1)], 1)
        tgt = torch.cat([reveal[:, :P], c_tgt, cp_tgt], 1)                        # copies: (B, C * K2)
        pr = run.forward(step, tok, pos, tgt, 1, n_logits=C * (K2 + 1), inner=fused_mask(P, C, K2, dev))
        p, qn = pr[:, :C], pr[:, C:].reshape(B, C, K2, pr.size(-1))              # (B, C, V), (B, C, K2, V)
        a, y = accept(run, p, p[:, :0] if qd is None else qd, e, kd, torch.ones_like(active))  # no test past kd
        t = (a + 1) * active                                                     # (B,) tokens committed
        step.cache.commit(torch.cat([torch.ones(B, P, dtype=torch.bool, device=dev), i[None] < t[:, None],
                                     torch.zeros(B, C * K2, dtype=torch.bool, device=dev)], 1))
        new = torch.cat([e, y[:, None]], 1).scatter(1, a[:, None], y[:, None])   # (B, C): e_0..e_{a-1}, y
        run.write(m, new, t)
        run.record(m, kd, t, a, e, new)
        m = run.stop(m + t)
        e, qd = _draft(qn, a, run.rand(B, K2))                                   # the next round's drafts
        kd = torch.clamp(n - m - 1, min=0, max=K2) * (m < n)
        Kn = int(kd.max())
        e, qd = e[:, :Kn], qd[:, :Kn]
    return run.stats(run.live / B, run.live / B)
