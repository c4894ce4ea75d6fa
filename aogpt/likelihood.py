"""
The likelihood estimators every command scores with, each a token-weighted sum (sum_nll, n_tokens) so that
DDP ranks all-reduce sums and PPL = exp(sum_nll / n_tokens): the exact L2R chain (the encoder MDM's masked
suffix chain), the any-order bound over uniform orders or an order distribution, the context-order ensemble
(paper eq. 7; fast and exact forms) and the encoder MDM's ELBO; nll_by_revealed splits the any-order bound (or
the ELBO) by how many tokens each prediction saw. eval_ppl.py is the command around them (its docstring says what
each column means); findings/ and bench/ call them directly. eval_harness.py scores a continuation after a
context with the same estimators, its orders and masks drawn here (conditionals).
"""

if __name__ == '__main__':  # run as a script (python aogpt/likelihood.py): one line, not an ImportError
    raise SystemExit("error: aogpt/likelihood.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import math

import torch
from torch.nn import functional as F

from aogpt.orders import UNIFORM, draw_orders, random_orders

# The most orders, context orderings or masks a command draws per request or chunk (eval_harness.py's orders:K,
# ensemble:M and --mc, eval_ppl.py's --ensemble): each is a forward pass, and its rows are held until they run, so
# a count past this is a typo (ensemble:1e20 grew its memory for minutes) or a run of days, not a finer estimate.
MAX_DRAWS = 4096

# ----------------------------------------------------------------------------------------------- the MDM's draws
# (what train.py, valloss.py and the ELBO estimators below corrupt a batch with)

def stratified_uniform(count, generator=None, device=None, dtype=torch.float64):
    """count draws in (0, 1], each uniform marginally, jointly spread evenly (systematic sampling: one
    uniform offset, count evenly spaced points, then shuffled). Stratifying the masking rate (or the
    reveal count) across a batch removes most of the variance that comes from it."""
    u = torch.rand(1, device=device, generator=generator, dtype=dtype)
    t = 1 - ((torch.arange(count, device=device, dtype=dtype) + u) / count) % 1.0  # % 1: rounding up to 1
    return t[torch.randperm(count, device=device, generator=generator)]


def mdm_corrupt(x, mask_token_id, generator=None, t=None):
    """The MDM forward process: t ~ U(0, 1] per row (stratified over the batch), each token replaced by
    [MASK] with probability t. Returns (x_t, t)."""
    B, n = x.shape
    if t is None:
        t = stratified_uniform(B, generator, x.device, torch.float32)
    masked = torch.rand(B, n, device=x.device, generator=generator) < t[:, None]
    return torch.where(masked, torch.full_like(x, mask_token_id), x), t


# ----------------------------------------------------------------------------------------------- helpers

def _device(model):
    return next(model.parameters()).device


def _tick(bar, k):
    # k may be fractional (a draw is 1/draws of a chunk); the bar only ever sees whole chunks
    if bar is not None:
        bar.carry = getattr(bar, 'carry', 0.0) + k
        whole = int(bar.carry + 1e-9)
        if whole:
            bar.update(whole)
            bar.carry -= whole


def _check_tokens(chunks):
    # Every token of a chunk is context for some conditional, so a -1 pad cannot be "ignored" in any order.
    if chunks.numel() and chunks.min() < 0:
        raise ValueError("chunks hold -1 padding; evaluate full chunks only (keep_partial=False)")


def _require_any_order(model):
    if not model.any_order:
        raise ValueError("this model cannot condition on an order (a left-to-right GPT or an encoder); "
                         "any-order estimators need cond='adaln' or 'sigma'")


def stratified_counts(count, n, generator=None):
    """count draws from {1..n}, each uniform marginally, stratified (stratified_uniform)."""
    return (stratified_uniform(count, generator) * n).ceil().long().clamp(1, n)


def uniform_subsets(k, n, generator=None):
    """(B, n) bool, row b a uniform subset of range(n) with k[b] members (k (B,)): the positions whose rank
    in a uniform order (orders.draw_orders) is below k[b]. The MDM ELBO's masks."""
    return draw_orders('random', len(k), n, generator=generator).argsort(1) < k[:, None]


# ----------------------------------------------------------------------------------------------- L2R

@torch.no_grad()
def nll_fixed(model, chunks, perm, batch_size=8, bar=None):
    """Exact NLL along one fixed order perm (n,), a permutation of the positions: (sum over chunks of
    -sum_i log p(x_perm_i | x_perm_<i), number of tokens), the first made from [None] alone. Any decoder reads
    it; for a GPT trained on that one order (train.py --cond=none --order=fixed:S) it is the model's exact
    likelihood, as nll_l2r is an L2R GPT's."""
    if not model.config.causal:
        raise ValueError("nll_fixed reads a decoder along an order; the encoder MDM has nll_l2r's L2R column")
    _check_tokens(chunks)
    dev, total = _device(model), 0.0
    perm = torch.as_tensor(perm, dtype=torch.long).view(-1)
    if not torch.equal(perm.sort().values, torch.arange(chunks.size(1))):
        raise ValueError(f"perm must be a permutation of the {chunks.size(1)} positions of a chunk")
    for s in range(0, len(chunks), batch_size):
        x = chunks[s:s + batch_size].to(dev)
        _, nll = model(x, order=perm.to(dev).expand_as(x), targets=x, reduction='none')  # (B, n)
        total += nll.double().sum().item()
        _tick(bar, len(x))
    return total, chunks.numel()


@torch.no_grad()
def nll_l2r(model, chunks, batch_size=8, bar=None):
    """Exact NLL in the identity order: (sum over chunks of -log p(x), number of predicted tokens).

    n predictions per chunk of n tokens, the first one made from [None] alone (the paper's protocol).
    Targets of -1 are skipped. For the encoder MDM this is the exact L2R factorisation
    prod_i p(x_i | x_<i, [MASK] at >= i), one pass per position (n passes per chunk).
    """
    dev = _device(model)
    if not model.config.causal:
        return _nll_l2r_encoder(model, chunks, batch_size, bar)
    total, count = 0.0, 0
    for s in range(0, len(chunks), batch_size):
        x = chunks[s:s + batch_size].to(dev)
        _, nll = model(x, targets=x, reduction='none')                   # (B, n), 0 where target is -1
        # (a -1 right-pad is fed as [None] to the slots after it, which are pads too, so it is harmless)
        total += nll.double().sum().item()
        count += (x >= 0).sum().item()
        _tick(bar, len(x))
    return total, count


@torch.no_grad()
def _nll_l2r_encoder(model, chunks, batch_size, bar):
    _check_tokens(chunks)
    dev = _device(model)
    mask = model.config.mask_token_id
    N, n = chunks.shape
    pos = torch.arange(n, device=dev)
    total = 0.0
    for c in range(N):
        x = chunks[c].to(dev)
        for s in range(0, n, batch_size):
            i = pos[s:s + batch_size]                                    # predict position i from x_<i
            rows = torch.where(pos[None, :] < i[:, None], x[None, :], mask)  # (b, n)
            _, nll = model(rows, targets=x.expand_as(rows), reduction='none')
            total += nll.gather(1, i[:, None]).double().sum().item()
        _tick(bar, 1)
    return total, N * n


# ----------------------------------------------------------------------------------------------- any-order

@torch.no_grad()
def nll_any_order(model, chunks, n_orders=1, generator=None, batch_size=8, bar=None):
    """The AO-AR bound: (sum over chunks of the mean over n_orders uniform orders of
    -sum_i log p(x_sigma_i | x_sigma_<i), number of tokens). An upper bound on the NLL, not a likelihood.
    Orders come from `generator` (CPU), so a fixed seed reproduces the number exactly.
    For the encoder MDM this is its ELBO (the same quantity; see nll_mdm_elbo) with n_orders draws."""
    if not model.config.causal:
        return nll_mdm_elbo(model, chunks, n_orders, generator, batch_size=batch_size, bar=bar)
    per_chunk = _any_order_per_chunk(model, chunks, n_orders, generator, batch_size, bar)
    return per_chunk.sum().item(), chunks.numel()


@torch.no_grad()
def nll_order(model, chunks, spec, n_orders=1, generator=None, batch_size=8, bar=None):
    """The AO-AR bound under an order distribution (an orders.Order, or its spec, e.g. 'semiar:8'): (sum over chunks of
    the mean over n_orders orders drawn from it of -sum_i log p(x_sigma_i | x_sigma_<i), number of tokens).
    An upper bound on -log of the mixture over the distribution; 'random' is nll_any_order (same draws)
    and 'l2r' the exact nll_l2r. Orders come from `generator` (CPU)."""
    return _any_order_per_chunk(model, chunks, n_orders, generator, batch_size, bar, spec).sum().item(), chunks.numel()


def _any_order_per_chunk(model, chunks, n_orders, generator, batch_size, bar=None, spec=UNIFORM):
    return _any_order_by_revealed(model, chunks, n_orders, generator, batch_size, bar, spec).sum(1)


@torch.no_grad()
def _any_order_by_revealed(model, chunks, n_orders, generator, batch_size, bar=None, spec=UNIFORM):
    _require_any_order(model)
    _check_tokens(chunks)
    dev = _device(model)
    N, n = chunks.shape
    out = torch.zeros(N, n, dtype=torch.float64)
    for s in range(0, N, batch_size):
        x = chunks[s:s + batch_size].to(dev)
        for _ in range(n_orders):
            order = draw_orders(spec, len(x), n, generator=generator).to(dev)
            _, nll = model(x, order=order, targets=x, reduction='none')  # (B, n): slot r saw r tokens
            out[s:s + len(x)] += nll.double().cpu() / n_orders
        _tick(bar, len(x))
    return out


@torch.no_grad()
def nll_by_revealed(model, chunks, n_orders=1, generator=None, batch_size=8, bar=None):
    """nll_any_order's bound split by how much each prediction saw: (N, n) float64, [c, r] the part of chunk c's
    sum that comes from predictions made with r of its n tokens revealed. Its row sums are the per-chunk sums
    nll_any_order adds up (the same draws: the same generator gives the same orders and masks), so any grouping
    of its columns (deciles of r/n, say) adds up to that total. A decoder: slot r of each order (the mean over
    n_orders uniform orders). The encoder MDM: its ELBO's draws with k = n - r tokens masked, each weighted n/k as
    there, so column r estimates the same quantity as a decoder's slot r: the mean over the masked tokens of
    -log p(x_i | the r revealed ones), for a uniform r-subset (nll_mdm_elbo's docstring)."""
    if not model.config.causal:
        return _mdm_elbo_by_revealed(model, chunks, n_orders, generator, 'count', batch_size, bar)
    return _any_order_by_revealed(model, chunks, n_orders, generator, batch_size, bar)


# ----------------------------------------------------------------------------------------------- ensemble

@torch.no_grad()
def nll_ensemble(model, chunks, M, mode='fast', generator=None, draws=1, batch_size=8, bar=None):
    """Context-order ensemble (paper eq. 7), per chunk: (ensemble, mean member), each the estimated
    chain-rule NLL summed over the chunk's tokens, in float64. The mean member is the plain any-order NLL
    on the *same* draws, so member - ensemble is a paired, low-noise measure of what ensembling gains.
    M: the number of members, giving (N,) tensors; or, in fast mode, a tuple of sizes, giving an
    ensemble of shape (len(M), N) whose sizes are nested (the first m of max(M) orderings, so the
    differences between sizes are paired too; the mean member is over max(M)).
    mode 'fast' (M passes per draw, _ensemble_fast) or 'exact' (the paper's per-token form, n*M passes
    per draw, _ensemble_exact); both estimate the same expected bound."""
    if mode == 'fast':
        Ms = tuple(M) if isinstance(M, (tuple, list)) else (M,)
        ens, member = _ensemble_fast(model, chunks, Ms, generator, draws, batch_size, bar)
        return (ens if isinstance(M, (tuple, list)) else ens[0]), member
    if mode == 'exact':
        if not isinstance(M, int):
            raise ValueError("the exact ensemble takes one member count M, not a tuple of sizes")
        return _ensemble_exact(model, chunks, M, generator, draws, batch_size, bar)
    raise ValueError(f"ensemble mode must be 'fast' or 'exact', got {mode!r}")


def mixture_nll(member_nll):
    """-log of the mean *probability* over members (dim 0), computed stably: -(logsumexp(-nll) - log M). Over
    the orders of an any-order bound it is the importance-weighted (log-mean-exp) bound."""
    M = member_nll.size(0)
    return -(torch.logsumexp(-member_nll, dim=0) - math.log(M))


def _reorder_contexts(ctx, M, generator):
    """(R, c) context positions in reveal order -> (M, R, c): member 0 keeps the order it was revealed
    in (the paper always includes it), members 1.. are uniform reshuffles of the same set. The base
    order is itself uniform, so the M orderings are M independent uniform orderings of the set."""
    R, c = ctx.shape
    shuffles = [ctx.gather(1, random_orders(R, c, generator=generator)) for _ in range(M - 1)]
    return torch.stack([ctx] + shuffles)


@torch.no_grad()
def _ensemble_fast(model, chunks, Ms, generator=None, draws=1, batch_size=8, bar=None):
    """The fast estimator of the ensembled any-order NLL. Returns per-chunk estimates (len(Ms), N) of
    the ensemble's chain-rule NLL, one row per size in Ms, and (N,) on the same draws of the mean
    member's (the plain any-order NLL). The sizes are nested: the M-member ensemble uses the first M of
    max(Ms) orderings of each context (member 0 = the order it was revealed in), so differences between
    sizes are paired; the mean member is over max(Ms).

    The target. The exact (paper's) quantity for a chunk of n tokens is, with sigma a uniform order,
        Q = E_sigma sum_{i=0}^{n-1} f(sigma_<i, sigma_i),
        f(C, j) = E_{pi_1..pi_M} -log (1/M) sum_m p(x_j | x_C revealed in order pi_m),
    the pi_m being uniform orderings of the set C. So f sees the context only as a *set*.
    Why one draw may score every remaining target. Group the sum by the context size i. Under a uniform
    sigma, sigma_<i is a uniform i-subset C and sigma_i is uniform over the n-i positions outside C, so
        Q = sum_i E_{|C|=i} [ (1/(n-i)) sum_{j not in C} f(C, j) ]
          = n * E_{i ~ U{0..n-1}} E_{|C|=i} [ (1/(n-i)) sum_{j not in C} f(C, j) ].
    One draw: reveal count l ~ U{1..n}, i.e. i = l-1 context tokens = the first i positions of a uniform
    order (a uniform i-subset), and all k = n-l+1 positions outside C as targets, each scored by the
    M-member mixture, one forward_queries pass per member. The draw's value
        (n/k) * sum_{j not in C} -log p_ens(x_j | C)
    therefore has expectation Q exactly: the k targets are every j outside C (no sampling there), the
    1/k turns their sum into the mean over j that the chain rule's uniform sigma_i implies, and the
    factor n undoes the 1/n probability of the drawn count. (Without the n/k weight, small contexts,
    which have many targets, would be over-counted.) This is the decoder form of the MDM ELBO weighting
    (paper eq. 5), and with M=1 it estimates the plain any-order loss. Cost: M passes per draw instead of
    the exact form's n*M. The counts l are stratified across chunks and draws (stratified_counts).
    """
    _require_any_order(model)
    _check_tokens(chunks)
    dev = _device(model)
    N, n = chunks.shape
    M = max(Ms)
    ens = torch.zeros(len(Ms), N, dtype=torch.float64)
    mean_member = torch.zeros(N, dtype=torch.float64)
    ls = stratified_counts(N * draws, n, generator)                      # (N*draws,) flat (chunk, draw)
    per_pass = max(1, batch_size // M)                                   # draws per pass: M rows each
    by_l = ls.argsort(stable=True).split(torch.bincount(ls, minlength=n + 1)[1:].tolist())
    for l, ids in enumerate(by_l, start=1):                              # draws sharing l share a layout
        c, k = l - 1, n - l + 1                                          # context size, number of targets
        for s in range(0, len(ids), per_pass):
            rows = ids[s:s + per_pass] // draws                          # chunk index of each draw
            x = chunks[rows]                                             # (R, n) on CPU
            R = len(x)
            order = random_orders(R, n, generator=generator)             # (R, n)
            ctx = _reorder_contexts(order[:, :c], M, generator)          # (M, R, c)
            member = _queries_nll(model, x.to(dev), ctx.to(dev), order[:, c:].to(dev), batch_size)
            w = n / k / draws                                            # (M, R, k) -> per-chunk sums
            for i, m in enumerate(Ms):                                   # nested: the first m members
                ens[i].index_add_(0, rows, mixture_nll(member[:m]).sum(1).double().cpu() * w)
            mean_member.index_add_(0, rows, member.mean(0).sum(1).double().cpu() * w)
            _tick(bar, R / draws)
    return ens, mean_member


@torch.no_grad()
def _queries_nll(model, x, ctx, tgt, batch_size):
    """-log p(x at tgt | x at ctx[m], revealed in that order) for every member m: (M, R, k).
    x (R, n), ctx (M, R, c), tgt (R, k); rows are passed batch_size at a time."""
    M, R, c = ctx.shape
    k = tgt.size(1)
    xm = x.repeat(M, 1)                                                  # (M*R, n), member-major
    ctx = ctx.reshape(M * R, c)
    tgt = tgt.repeat(M, 1)                                               # (M*R, k)
    out = []
    for s in range(0, M * R, batch_size):
        cp, qp, xs = ctx[s:s + batch_size], tgt[s:s + batch_size], xm[s:s + batch_size]
        logits = model.forward_queries(xs.gather(1, cp), cp, qp)        # (b, k, V)
        y = xs.gather(1, qp)                                             # (b, k)
        out.append(F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction='none').view(-1, k))
    return torch.cat(out).view(M, R, k)


@torch.no_grad()
def _ensemble_exact(model, chunks, M, generator=None, draws=1, batch_size=8, bar=None):
    """The paper's per-token form, the reference the fast estimator is checked against. For each draw a
    base order sigma, and for every target index i the M-member mixture over orderings of the context
    sigma_<i: member 0 is sigma's own ordering, the others uniform reshuffles of it. Each member is one
    full forward pass in its order, of which only slot i is used: n*M passes per draw, so it is for
    small inputs. It uses model.forward, not forward_queries, so the two modes check each other.
    Returns (ens, mean member) per chunk, as the fast estimator does."""
    _require_any_order(model)
    _check_tokens(chunks)
    dev = _device(model)
    N, n = chunks.shape
    ens = torch.zeros(N, dtype=torch.float64)
    mean_member = torch.zeros(N, dtype=torch.float64)
    for d in range(N * draws):
        chunk = d // draws
        sigma = random_orders(1, n, generator=generator)[0]              # (n,)
        orders = []                                                      # member m of target index i
        for i in range(n):
            for m in range(M):
                o = sigma.clone()
                if m > 0:                                                # a uniform reshuffle of sigma_<i
                    o[:i] = sigma[:i][random_orders(1, i, generator=generator)[0]]
                orders.append(o)
        orders = torch.stack(orders).to(dev)                             # (n*M, n)
        x = chunks[chunk].to(dev).expand(n * M, n)
        nll = torch.cat([model(x[a:a + batch_size], order=orders[a:a + batch_size], targets=x[a:a + batch_size],
                               reduction='none')[1] for a in range(0, n * M, batch_size)])  # (n*M, n)
        for i in range(n):
            member = nll[i * M:(i + 1) * M, i]                           # (M,): slot i of target index i's passes
            ens[chunk] += mixture_nll(member).item() / draws
            mean_member[chunk] += member.mean().item() / draws
        _tick(bar, 1 / draws)
    return ens, mean_member


# ----------------------------------------------------------------------------------------------- conditionals
# eval_harness.py scores a continuation x[c:n] after a context x[:c] with the estimators above, restricted to
# the continuation's tokens: these draw their orders (the ELBO's masks: stratified_counts, uniform_subsets).

def continuation_orders(K, c, n, generator=None):
    """The any-order bound of log p(x[c:n] | x[:c]): K orders of range(n), each the context left to right,
    then the continuation in a uniform order (orders.draw_orders). The mean of their chain-rule sums over
    the continuation is the bound; mixture_nll of them the importance-weighted one. (K, n)"""
    cont = draw_orders('random', K, positions=torch.arange(c, n), generator=generator)  # (K, n - c)
    return torch.cat([torch.arange(c).expand(K, c), cont], 1)


def context_orderings(M, c, n, generator=None):
    """The context-order ensemble (paper eq. 7) of x[c:n] given x[:c]: M orders of range(n), member 0 left to
    right, members 1.. uniform orderings of the context (_reorder_contexts), each followed by the
    continuation left to right. Each continuation token scored by mixture_nll over the members: the
    orderings depend on the context alone, so every conditional is normalised and the sum is an exact
    log-likelihood of the ensemble, not a bound. (M, n)"""
    ctx = _reorder_contexts(torch.arange(c)[None], M, generator)[:, 0]                  # (M, c)
    return torch.cat([ctx, torch.arange(c, n).expand(M, n - c)], 1)


# ----------------------------------------------------------------------------------------------- encoder MDM

@torch.no_grad()
def nll_mdm_elbo(model, chunks, n_draws=1, generator=None, estimator='count', batch_size=8, bar=None):
    """The encoder MDM's ELBO, (sum over chunks of the estimated bound, number of tokens).

    The continuous-time ELBO  int_0^1 (1/t) E[sum_{masked i} -log p(x_i | x_t)] dt  equals the discrete
    sum over the number of masked tokens k: a given k arises with probability C(n,k) t^k (1-t)^(n-k), and
    int_0^1 (1/t) C(n,k) t^k (1-t)^(n-k) dt = 1/k, so
        ELBO = sum_{k=1}^n (1/k) E_{S, |S|=k} sum_{i in S} -log p(x_i | x outside S)
             = n * E_{k ~ U{1..n}} [(1/k) sum_{i in S} ...],
    which is also the AO-AR loss E_sigma sum_i -log p(x_sigma_i | x_sigma_<i) of the encoder's
    conditionals (paper eq. 5). estimator='count' (default) draws k uniform, stratified across chunks
    and draws, and weights n/k: no 1/t blow-up near t=0. estimator='time' is the training loss's
    t ~ U(0,1] form (stratified t, weight 1/t), kept as a cross-check.
    """
    if model.config.causal:
        raise ValueError("nll_mdm_elbo is for the encoder MDM (causal=False)")
    per_chunk = _mdm_elbo_per_chunk(model, chunks, n_draws, generator, estimator, batch_size, bar)
    return per_chunk.sum().item(), chunks.numel()


def _mdm_elbo_per_chunk(model, chunks, n_draws=1, generator=None, estimator='count', batch_size=8, bar=None):
    return _mdm_elbo_by_revealed(model, chunks, n_draws, generator, estimator, batch_size, bar).sum(1)


@torch.no_grad()
def _mdm_elbo_by_revealed(model, chunks, n_draws=1, generator=None, estimator='count', batch_size=8, bar=None):
    _check_tokens(chunks)
    dev = _device(model)
    N, n = chunks.shape
    D = n_draws
    out = torch.zeros(N, n, dtype=torch.float64)                        # [chunk, tokens revealed]
    if estimator == 'count':
        ks = stratified_counts(N * D, n, generator).double()             # masked count per (chunk, draw)
    elif estimator == 'time':
        ks = stratified_uniform(N * D, generator)                        # masking rate t in (0, 1]
    else:
        raise ValueError(f"estimator must be 'count' or 'time', got {estimator!r}")
    for s in range(0, N * D, batch_size):
        ids = torch.arange(s, min(s + batch_size, N * D))
        rows = ids // D
        x = chunks[rows]
        v = ks[ids]
        if estimator == 'count':
            masked = uniform_subsets(v, n, generator)                    # a uniform subset of size k
            w = n / v
        else:
            masked = torch.rand(len(x), n, generator=generator, dtype=torch.float64) < v[:, None]
            w = 1 / v
        xt = torch.where(masked, model.config.mask_token_id, x)
        _, nll = model(xt.to(dev), targets=x.to(dev), reduction='none')  # (b, n), 0 where unmasked
        # a 'time' draw may mask nothing (n revealed): it adds 0, so it may sit in column n - 1
        revealed = (n - masked.sum(1)).clamp(max=n - 1)
        out.view(-1).index_add_(0, rows * n + revealed, nll.double().sum(1).cpu() * w / D)
        _tick(bar, len(x) / D)
    return out


# ----------------------------------------------------------------------------------------------- the script
