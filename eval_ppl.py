"""
Zero-shot perplexity of a checkpoint: exact L2R, the any-order bound, and the context-order ensemble.

    python eval_ppl.py --ensemble 8                          # out/ckpt.pt, EMA weights, the paper's 5 sets
    python eval_ppl.py --datasets ptb --max_chunks 20        # a quick look
    python eval_ppl.py --order_mode semiar:8 --orders 4      # + the bound under an order distribution
    python eval_ppl.py --datasets wikitext2 --data_path wikitext2=/data/wiki.test.raw
    torchrun --standalone --nproc_per_node 8 eval_ppl.py --ensemble 8

Every requested set is loaded before the first forward pass. One that cannot be had (offline and not in
the HF cache, with no --data_path) is skipped, with one line naming it (--skip_missing False fails
instead); PTB ships with the package, so the default command scores something even offline. The record
goes to eval_ppl.json beside the checkpoint, is appended to eval_ppl.jsonl (every run is kept), and is
drawn as eval_ppl.png. It names what it scored: the weights by a hash (`weights`) and each set's token ids by
another (`datasets.<name>.data`), so two records compare only when both agree.

Columns (per-token NLL -> PPL = exp(mean NLL) over every token of every block_size chunk):
  L2R        exact likelihood in the identity order; n predictions per chunk, the first made from [None]
             (HF GPT-2 with labels=input makes n-1: it never predicts the first token).
  any-order  E_sigma[-sum_i log p(x_sigma_i | x_sigma_<i)] over uniform orders: an upper bound on the
             NLL (Jensen: -log E_sigma p(x|sigma) <= E_sigma -log p(x|sigma)), not a likelihood. For the
             encoder MDM it is its ELBO, which is the same quantity (paper eq. 5).
  order      (--order_mode SPEC) the same expectation with sigma drawn from an order distribution
             (aogpt/orders.py: semiar:K, nearl2r:W, mix:...; --orders draws per chunk): again an upper
             bound, on -log of the mixture over that distribution; L2R and uniform are its two ends.
  ens xM     paper eq. 7: each conditional is the mixture (1/M) sum_m p(x_j | context in order pi_m) over
             M orderings of the same context set. Each mixture is a normalised conditional, so the chain
             rule still gives a valid likelihood (of the mixture model) and its any-order average is again
             an upper bound; by Jensen it is never worse than the mean member. The table shows
             any-order - (mean member - ensemble), the gain measured on identical draws (a control
             variate: same expectation, much less noise); the JSON also has the direct estimate.

The estimators are importable (bench/eval_speed.py uses them) and return token-weighted sums
(sum_nll, n_tokens), so DDP ranks all-reduce sums and PPL = exp(sum_nll / n_tokens).
"""

import difflib
import hashlib
import math
import os
import sys
import time

import torch
from torch.nn import functional as F

from aogpt.checkpoint import checkpoint_codec, fingerprint, load_model, save_record
from aogpt.configurator import namespace, print_config, stop_on_ctrl_c
from aogpt.errors import UserError, command, die
from aogpt.evalsets import EVAL_SETS, load_eval_chunks, parse_revisions
from aogpt.orders import draw_orders, parse_order
from aogpt.paths import check_writable
from aogpt.plot import plot_eval
from aogpt.runtime import autocast, script_device, start_ranks
from model import random_orders, stratified_uniform

# ----------------------------------------------------------------------------------------------- CLI defaults
out_dir = 'out'          # checkpoint directory (evaluates out_dir/ckpt.pt)
ckpt = ''                # checkpoint file or dir, export.py folder, or hf:owner/repo[/path.pt]; overrides out_dir
use_ema: bool = None     # None: EMA weights when the checkpoint has them; True/False to force
dataset = ''             # a data dir or name to check the codec against ('' = the checkpoint's own codec)
datasets = 'lambada,wikitext2,ptb,wikitext103,lm1b'  # comma list; also ag_news,pubmed,arxiv,owt
data_path = ''           # local-file overrides, e.g. 'wikitext2=/data/wiki.test.raw,lambada=/data/l.jsonl'
skip_missing = True      # skip a set that cannot be loaded (offline, not cached), with a line; False: fail
split = ''               # '' = each set's default split (see evalsets.py)
revisions = ''           # HF hub revision per set instead of evalsets' pins, e.g. 'lambada=<commit>,lm1b=main'
paper_split = False      # True: the paper's WikiText-2 *train* split (inherited from RADD), to match its tables
block_size = 0           # chunk length, >= 1; 0 = the model's block_size
max_chunks = 0           # evaluate only the first max_chunks chunks of each set, >= 1 (0 = all)
batch_size = 8           # sequences of length block_size per forward pass
orders = 1               # random orders per chunk for the any-order column (MC draws for the encoder MDM)
order_mode = ''          # an order distribution (semiar:K, nearl2r:W, mix:..., see aogpt/orders.py): its column
ensemble = 0             # M, context orderings per conditional for the ensemble column (0 = no column)
ensemble_mode = 'fast'   # 'fast': M passes per Monte Carlo draw | 'exact': the paper's n*M passes per chunk
ensemble_draws = 1       # Monte Carlo draws (reveal counts) per chunk for ensemble_mode='fast'
mdm_l2r = False          # encoder MDM: also compute exact L2R (n forward passes per chunk: slow)
seed = 1337              # orders and reveal counts come from this seed (plus the DDP rank)
device = 'auto'          # auto (cuda if available, else cpu) | cpu | cuda | cuda:N
dtype = 'auto'           # auto (bf16 autocast on CUDA, fp16 without bf16, fp32 elsewhere); float32 | bfloat16 | float16
compile = False          # torch.compile the model
json_out = ''            # results file; '' = eval_ppl.json beside the checkpoint (+ every run in eval_ppl.jsonl)
plot = True              # also draw the table as a PNG next to the JSON
progress = True          # tqdm bars (rank 0 only)


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
    """count draws from {1..n}, each uniform marginally, stratified (model.stratified_uniform)."""
    return (stratified_uniform(count, generator) * n).ceil().long().clamp(1, n)


def rank_slice(n_chunks, rank, world_size):
    """The contiguous shard of chunks that DDP rank `rank` evaluates: every chunk goes to exactly one
    rank (no DistributedSampler-style padding, which would count some chunks twice)."""
    return slice(n_chunks * rank // world_size, n_chunks * (rank + 1) // world_size)


# ----------------------------------------------------------------------------------------------- L2R

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
    """The AO-AR bound under an order distribution (orders.py spec, e.g. 'semiar:8'): (sum over chunks of
    the mean over n_orders orders drawn from it of -sum_i log p(x_sigma_i | x_sigma_<i), number of tokens).
    An upper bound on -log of the mixture over the distribution; 'random' is nll_any_order (same draws)
    and 'l2r' the exact nll_l2r. Orders come from `generator` (CPU)."""
    return _any_order_per_chunk(model, chunks, n_orders, generator, batch_size, bar, spec).sum().item(), chunks.numel()


@torch.no_grad()
def _any_order_per_chunk(model, chunks, n_orders, generator, batch_size, bar=None, spec='random'):
    _require_any_order(model)
    _check_tokens(chunks)
    dev = _device(model)
    N, n = chunks.shape
    out = torch.zeros(N, dtype=torch.float64)
    for s in range(0, N, batch_size):
        x = chunks[s:s + batch_size].to(dev)
        for _ in range(n_orders):
            order = draw_orders(spec, len(x), n, generator=generator).to(dev)
            _, nll = model(x, order=order, targets=x, reduction='none')  # (B, n)
            out[s:s + len(x)] += nll.double().sum(1).cpu() / n_orders
        _tick(bar, len(x))
    return out


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


def _mixture_nll(member_nll):
    """-log of the mean *probability* over members (dim 0), computed stably: -(logsumexp(-nll) - log M)."""
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
                ens[i].index_add_(0, rows, _mixture_nll(member[:m]).sum(1).double().cpu() * w)
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
            ens[chunk] += _mixture_nll(member).item() / draws
            mean_member[chunk] += member.mean().item() / draws
        _tick(bar, 1 / draws)
    return ens, mean_member


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


@torch.no_grad()
def _mdm_elbo_per_chunk(model, chunks, n_draws=1, generator=None, estimator='count', batch_size=8, bar=None):
    _check_tokens(chunks)
    dev = _device(model)
    N, n = chunks.shape
    D = n_draws
    out = torch.zeros(N, dtype=torch.float64)
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
            rank = random_orders(len(x), n, generator=generator).argsort(1)  # uniform ranks
            masked = rank < v[:, None]                                   # a uniform subset of size k
            w = n / v
        else:
            masked = torch.rand(len(x), n, generator=generator, dtype=torch.float64) < v[:, None]
            w = 1 / v
        xt = torch.where(masked, model.config.mask_token_id, x)
        _, nll = model(xt.to(dev), targets=x.to(dev), reduction='none')  # (b, n), 0 where unmasked
        out.index_add_(0, rows, nll.double().sum(1).cpu() * w / D)
        _tick(bar, len(x) / D)
    return out


# ----------------------------------------------------------------------------------------------- the script

@command
def main(argv=None):
    c = read_config(argv)
    rank, world, dev = start_ranks(c.device)
    master = rank == 0
    if master:
        print_config(c.config)
    quiet_hf_bars(master and c.progress)
    model, ck, used_ema, codec, n = load_for_eval(c, dev)
    data, skipped = load_sets(c, codec, n, master)
    ctx, precision = autocast(dev, c.dtype)
    results = {name: evaluate_set(model, name, chunks, c, ctx, rank, world, codec.name == 'char')
               for name, chunks in data.items()}
    if master:
        print_table(model, c, results, skipped, used_ema, codec, n, world)
        record = dict(checkpoint=c.ckpt or c.out_dir, model=_kind(model), ema=used_ema, codec=codec.name,
                      block_size=n, precision=precision, world_size=world, seed=c.seed, orders=c.orders,
                      order_mode=c.order_mode if model.any_order else '',
                      ensemble=c.ensemble if model.any_order else 0, ensemble_mode=c.ensemble_mode,
                      ensemble_draws=c.ensemble_draws, paper_split=c.paper_split, max_chunks=c.max_chunks,
                      iter_num=ck.get('iter_num'), weights=fingerprint(model), datasets=results, skipped=skipped,
                      notes=_notes(model, c, results),
                      time=time.strftime('%Y-%m-%d %H:%M:%S'))
        write_record(record, c)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def read_config(argv):
    """The resolved config (a namespace: main() may run more than once in one process), checked."""
    c = namespace(globals(), argv)
    for key, ok in (('orders', c.orders >= 1), ('ensemble', c.ensemble >= 0), ('batch_size', c.batch_size >= 1),
                    ('ensemble_draws', c.ensemble_draws >= 1), ('block_size', c.block_size >= 0),
                    ('max_chunks', c.max_chunks >= 0), ('ensemble_mode', c.ensemble_mode in ('fast', 'exact'))):
        if not ok:
            die(f"invalid --{key}={getattr(c, key)!r} (see --help for the valid values)")
    if c.order_mode:
        try:
            parse_order(c.order_mode)
        except UserError as e:
            die(f"--order_mode: {e.msg}")
    for key in ('ensemble_mode', 'ensemble_draws'):  # given on purpose, never silently unused
        if key in c.given and not c.ensemble:
            die(f"--{key} is an option of the ensemble column: add --ensemble M (M >= 1), or drop --{key}")
    c.names = [s.strip() for s in c.datasets.split(',') if s.strip()]
    if not c.names:
        die("--datasets is empty")
    unknown = [n for n in c.names if n not in EVAL_SETS]
    if unknown:  # a typo is never "skipped": --skip_missing is for sets that cannot be had here
        near = difflib.get_close_matches(unknown[0], EVAL_SETS, n=1)
        die(f"unknown eval set {unknown[0]!r}" + (f" (did you mean {near[0]!r}?)" if near else "") +
            f"; choose from {', '.join(EVAL_SETS)}")
    c.paths = _parse_paths(c.data_path)
    unused = sorted(set(c.paths) - set(c.names))
    if unused:
        die(f"--data_path names {unused} are not in --datasets {c.names}")
    c.sources = {}
    c.revision_of = parse_revisions(c.revisions)
    extra = sorted(set(c.revision_of) - set(c.names))
    if extra:
        die(f"--revisions names {extra}, which are not in --datasets {c.names}")
    c.device = script_device(c.device, c.dtype)[0]  # a device this machine lacks, or a bad --dtype: one line
    check_writable(json_path(c), 'json_out', 'eval_ppl.json', create=True, given=bool(c.json_out))  # not hours later
    return c


def quiet_hf_bars(show):
    if not show:  # HF datasets' own bars too (e.g. reading a local text file)
        os.environ['HF_DATASETS_DISABLE_PROGRESS_BARS'] = '1'
        if 'datasets' in sys.modules:
            sys.modules['datasets'].disable_progress_bars()


def load_for_eval(c, dev):
    """The model (EMA weights by default), its checkpoint dict, whether EMA was used, its codec, the
    chunk length."""
    model, ck, used_ema = load_model(c.ckpt or c.out_dir, dev, c.use_ema)
    codec = checkpoint_codec(ck, c.dataset)
    cfg = model.config
    if codec.vocab_size > cfg.vocab_size:
        die(f"the {codec.name} codec has {codec.vocab_size} symbols but the model only {cfg.vocab_size}: "
            f"the checkpoint's codec does not fit its model")
    if c.mdm_l2r and cfg.causal:
        die("--mdm_l2r computes an encoder MDM's L2R column; this decoder's L2R column is exact anyway: drop it")
    n = c.block_size or cfg.block_size
    if n > cfg.block_size:
        die(f"--block_size {n} exceeds the model's block_size {cfg.block_size}")
    if c.compile:
        model = torch.compile(model)
    return model, ck, used_ema, codec, n


def load_sets(c, codec, n, master):
    """Every requested set, cut into chunks, before the first forward pass: a set that cannot be had
    fails (or is skipped) in seconds, not after the others were evaluated. Returns ({name: chunks},
    {skipped name: why})."""
    data, skipped = {}, {}
    for name in c.names:
        c.sources[name] = {}  # what the set was read from (hub repo and commit, or a local path), for the JSON
        try:
            chunks = load_eval_chunks(name, codec, n, split=c.split or None, path=c.paths.get(name),
                                      paper_split=c.paper_split, revision=c.revision_of.get(name),
                                      record=c.sources[name])
        except UserError as e:
            if not c.skip_missing or name in c.paths:  # a local file the user named must load
                die(f"{e.msg} [eval_ppl.py: --data_path {name}=PATH]")
            skipped[name] = e.msg  # the real reason: offline is only one of them
            continue
        data[name] = chunks[:c.max_chunks] if c.max_chunks else chunks
        if len(data[name]) == 0:
            die(f"{name}: fewer than block_size={n} tokens, so no chunk to evaluate (try a smaller --block_size)")
    if skipped and not data:
        die(f"none of the requested sets could be loaded ({', '.join(skipped)}): " +
            '; '.join(f"{name}: {msg}" for name, msg in skipped.items()))
    if skipped and master:  # each with its real reason: offline is only one of them
        print(f"skipping {', '.join(skipped)} (--skip_missing False fails instead):", flush=True)
        for name, msg in skipped.items():
            print(f"  {name}: {msg}", flush=True)
    return data, skipped


def evaluate_set(model, name, chunks, c, ctx, rank, world, char):
    """One table row: the columns this model has, token-weighted over every chunk of every rank."""
    from tqdm import tqdm
    cfg = model.config
    decoder, any_order = cfg.causal, model.any_order
    do_l2r, do_ao, M = decoder or c.mdm_l2r, any_order or not decoder, c.ensemble if any_order else 0
    spec = c.order_mode if any_order else ''
    if len(chunks) < world and rank == 0:
        print(f"warning: {name} has {len(chunks)} chunks for {world} ranks; some ranks get none")
    mine = chunks[rank_slice(len(chunks), rank, world)]
    cols = [k for k, on in (('l2r', do_l2r), ('any_order', do_ao), ('order', bool(spec)), ('ensemble', M > 0)) if on]
    bar = tqdm(total=len(mine) * len(cols), desc=name, unit='chunk', leave=False,
               disable=not (rank == 0 and c.progress), file=sys.stderr)
    # one generator per column, seeded by (seed, rank): adding a column never changes another's draws
    gen = lambda: torch.Generator().manual_seed(c.seed + 100_003 * rank)  # noqa: E731
    sums = {}
    with ctx:
        if do_l2r:
            bar.set_description(f"{name} L2R")
            sums['l2r'] = nll_l2r(model, mine, c.batch_size, bar)
        if do_ao:
            bar.set_description(f"{name} any-order")
            sums['any_order'] = nll_any_order(model, mine, c.orders, gen(), c.batch_size, bar)
        if spec:
            bar.set_description(f"{name} {spec}")
            sums['order'] = nll_order(model, mine, spec, c.orders, gen(), c.batch_size, bar)
        if M:
            bar.set_description(f"{name} ens x{M}")
            # the ensemble's sums, plus the mean member on the *same* draws: a paired, low-noise
            # measure of what ensembling gains
            ens, member = nll_ensemble(model, mine, M, c.ensemble_mode, gen(), c.ensemble_draws, c.batch_size, bar)
            sums['ensemble'] = (ens.sum().item(), mine.numel())
            sums['member'] = (member.sum().item(), mine.numel())
    bar.close()
    keys = cols + (['member'] if M else [])
    t = torch.tensor([v for k in keys for v in sums.get(k, (0.0, 0))], dtype=torch.float64,
                     device=next(model.parameters()).device)
    if world > 1:
        torch.distributed.all_reduce(t)
    mean = {k: t[2 * i].item() / t[2 * i + 1].item() for i, k in enumerate(keys)}
    row = {'chunks': len(chunks), 'tokens': chunks.numel(), 'source': c.sources.get(name),
           'data': data_fingerprint(chunks)}
    for k in ('l2r', 'any_order', 'order', 'ensemble'):
        row[k] = {'nll': mean[k], 'ppl': math.exp(mean[k])} if k in cols and k != 'ensemble' else None
    if spec:
        row['order']['spec'] = spec
    if M:
        # Reported as a control variate: the any-order column (full orders, low noise) minus the
        # ensemble's gain measured on identical draws. Same expectation as the direct estimate
        # (E[any-order] = E[mean member]), far less Monte Carlo noise, and never above the any-order
        # column (Jensen holds per target on the same draws). The direct one is kept too.
        cv = mean['any_order'] - (mean['member'] - mean['ensemble'])
        row['ensemble'] = {'nll': cv, 'ppl': math.exp(cv), 'members': M, 'mode': c.ensemble_mode,
                           'draws': c.ensemble_draws, 'nll_direct': mean['ensemble'],
                           'mean_member_nll': mean['member'], 'gain_nats': mean['member'] - mean['ensemble']}
    if char:  # one token is one character
        for k in cols:
            row[k]['bpc'] = row[k]['nll'] / math.log(2)
    return row


def _kind(model):
    c = model.config
    if not c.causal:
        return 'encoder MDM'
    return {'adaln': 'AO-GPT', 'sigma': 'sigma-GPT', 'none': 'GPT (L2R)'}[c.cond]


def _parse_paths(spec):
    paths = {}
    for item in filter(None, (s.strip() for s in spec.split(','))):
        if '=' not in item:
            die(f"--data_path expects name=path[,name=path...], got {item!r}")
        name, path = item.split('=', 1)
        paths[name.strip()] = os.path.expanduser(path.strip())
    return paths


def _columns(model, c, char):
    """(header, result key, show as bits per character) of each table column."""
    ao_head = 'ELBO PPL (<=)' if not model.config.causal else f"any-order PPL (<=, {c.orders} ord)"
    heads = [('L2R PPL', 'l2r', False), (ao_head, 'any_order', False)]
    if c.order_mode and model.any_order:
        heads.append((f"{c.order_mode} PPL (<=)", 'order', False))
    if c.ensemble:
        heads.append((f"ens x{c.ensemble} PPL (<=)", 'ensemble', False))
    if char:
        heads += [(h.replace('PPL', 'bpc'), k, True) for h, k, _ in heads]
    return heads


def _fmt(col, bpc=False):
    if col is None:
        return 'n/a'
    return f"{col['bpc']:.4f}" if bpc else f"{col['ppl']:.2f}"


def _notes(model, c, results):
    notes = []
    if not model.config.causal:
        notes.append("encoder MDM: the any-order column is its ELBO; ensemble n/a (an encoder is order-invariant)"
                     + ("" if c.mdm_l2r else "; L2R costs n passes per chunk: --mdm_l2r True computes it"))
    elif not model.any_order:
        notes.append("L2R GPT: only the L2R column is meaningful (no target-position conditioning)")
    if c.order_mode and not model.any_order:
        notes.append(f"--order_mode {c.order_mode}: not scored, the model cannot condition on an order")
    if 'wikitext2' in results:  # a skipped set has no numbers to explain
        notes.append("wikitext2: " + ("the paper's train split (--paper_split True)" if c.paper_split else
                                      "standard split; the paper's tables use the train split (--paper_split True)"))
    return notes


def print_table(model, c, results, skipped, used_ema, codec, n, world):
    print(f"\n{_kind(model)} {c.ckpt or c.out_dir} ({'EMA' if used_ema else 'raw'} weights), {codec.name} codec, "
          f"block_size {n}, {world} rank(s)")
    heads = _columns(model, c, codec.name == 'char')
    w = max(8, max(len(s) for s in c.names))
    print(f"{'dataset':<{w}} {'chunks':>7} " + ' '.join(f"{h:>{max(10, len(h))}}" for h, _, _ in heads))
    for name, row in results.items():
        print(f"{name:<{w}} {row['chunks']:>7} " +
              ' '.join(f"{_fmt(row[k], b):>{max(10, len(h))}}" for h, k, b in heads))
    for name in skipped:
        print(f"{name:<{w}} {'skipped':>7}")
    for s in _notes(model, c, results):
        print(f"note: {s}")


def data_fingerprint(chunks):
    """A short hash of the token ids scored (every rank's chunks, in order): two records with the same one scored
    the same tokens, whatever cache, revision or local file they came from; the weights have theirs too."""
    return hashlib.sha256(chunks.to('cpu', torch.int64).contiguous().numpy().tobytes()).hexdigest()[:16]


def json_path(c):
    """Where the record goes: --json_out, else beside the checkpoint (a file other than ckpt.pt gets its
    own name); for an hf: checkpoint, here (never into the HF cache)."""
    if c.json_out:
        return c.json_out
    path = c.ckpt or c.out_dir
    stem = os.path.splitext(os.path.basename(path.rstrip('/')).split('@')[0])[0]
    if path.startswith('hf:'):
        return f'{stem}.eval_ppl.json'
    if os.path.isdir(path):
        return os.path.join(path, 'eval_ppl.json')
    return os.path.join(os.path.dirname(path) or '.', 'eval_ppl.json' if stem == 'ckpt' else f'{stem}.eval_ppl.json')


def write_record(record, c):
    """The record as JSON (atomically), appended to the .jsonl history beside it (so an eval of other sets
    never loses an earlier one), and plotted."""
    out = json_path(c)
    record['checkpoint'] = os.path.abspath(record['checkpoint']) if os.path.exists(record['checkpoint']) \
        else record['checkpoint']
    try:
        history = save_record(out, record)
    except OSError as e:
        die(f"cannot write {e.filename or out} ({e.strerror or e}); the table above has the numbers; pass --json_out FILE")
    print(f"wrote {out} (history: {history})")
    if c.plot and record['datasets']:
        png = os.path.splitext(out)[0] + '.png'
        plot_eval(record, png)
        print(f"wrote {png}")


if __name__ == '__main__':
    stop_on_ctrl_c('no results were written (eval_ppl.json and its history are as they were)')
    main()
