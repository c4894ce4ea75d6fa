"""
The val losses train.py logs at every eval (docs/training.md lists them). They are scored on a fixed set of
non-overlapping windows spread over val.bin, and the any-order losses on a fixed seeded set of eval_orders orders
per batch (the encoder: mask draws), the same for every run and every eval, so runs compare like with like. A run
on an order distribution other than random, l2r and their mixes (semiar:K, nearl2r:W, mix:...; aogpt/orders.py)
has its val_order drawn from it, eval_orders orders per batch from the same seeds as val_ao's; a run on a fixed
order, val_order under that order.
They are token-weighted: each rank sums the NLLs and token counts of its share of the batches, then the ranks
add theirs up.

    batches = val_windows(n_val, block_size, eval_iters, batch_size)
    mine = progress_of(range(rank, len(batches), world_size), "eval 0", show_bar, say)
    out = val_losses(model, batches, mine, read, ctx, eval_orders, order, fixed_order)   # order: an Order
"""

if __name__ == '__main__':  # run as a script (python aogpt/valloss.py): one line, not an ImportError
    raise SystemExit("error: aogpt/valloss.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import time

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from aogpt.likelihood import mdm_corrupt
from aogpt.orders import random_orders

PROGRESS_EVERY = 30.0  # seconds between progress lines of a long eval when there is no progress bar


def val_windows(n_val, block_size, eval_iters, batch_size):
    """Up to eval_iters batches of window starts into val.bin (n_val tokens): spread over it, no overlap."""
    n_avail = n_val // block_size
    n_windows = min(eval_iters * batch_size, n_avail)
    starts = [(i * n_avail // n_windows) * block_size for i in range(n_windows)]
    return [starts[i:i + batch_size] for i in range(0, n_windows, batch_size)]


def eval_seed(k, j):  # independent of the run's seed: every run is scored on the same orders and masks
    return int(np.random.SeedSequence([20250619, k, j]).generate_state(1, np.uint64)[0]) >> 1


def own_draws(model, order, fixed_order):
    """Whether val_order is drawn from the run's order: an any-order model on a law that val_ao and val_l2r do
    not already score (not random, l2r or a mix of the two) and no fixed order."""
    return model.any_order and fixed_order is None and not order.fixed and order.l2r_weight is None


def val_passes(model, eval_orders, fixed_order, order):
    """Forward passes per val batch: L2R, eval_orders random orders (any-order models), the fixed order if
    any, or eval_orders orders of the run's order distribution (decoders); eval_orders mask draws (the encoder)."""
    if not model.config.causal:
        return eval_orders
    spec = own_draws(model, order, fixed_order)
    return 1 + (eval_orders if model.any_order else 0) + (fixed_order is not None) + (eval_orders if spec else 0)


def progress_of(items, what, show_bar, say):
    """Yield items, showing on rank 0 how far the loop has got: a bar on a terminal, else a line every
    PROGRESS_EVERY seconds (a long eval on a CPU must not look like a hang)."""
    if show_bar:
        yield from tqdm(items, desc=what, unit='batch', leave=False, dynamic_ncols=True)
        return
    t0 = t_line = time.monotonic()
    for i, x in enumerate(items):
        yield x
        now = time.monotonic()
        if now - t_line >= PROGRESS_EVERY and i + 1 < len(items):
            say(f"{what}: {i + 1}/{len(items)} val batches, {now - t0:.0f} s")
            t_line = now


@torch.no_grad()
def val_losses(model, batches, mine, read, ctx, eval_orders, order, fixed_order=None):
    """Token-weighted val NLLs of `model` over batches[k] for k in `mine` (this rank's share; a k of None: a pass
    counted nowhere, for the collectives' sake), summed over the ranks: val_l2r, val_ao, val_order, val_elbo (None
    where not defined) and val_loss, the one of them under the orders being trained (order, an Order: the law
    trained at this step). read(split, starts) gives the (B, n) token windows on the model's device."""
    model.eval()
    causal, mask_id = model.config.causal, model.config.mask_token_id
    device = next(model.parameters()).device
    s = torch.zeros(8, device=device, dtype=torch.float64)  # (nll, tokens) for l2r, ao, order, elbo
    gen = torch.Generator(device=device)
    for k in mine:  # k None: a pass that counts nothing (FSDP: every rank makes as many forward calls)
        acc = s if k is not None else torch.zeros_like(s)
        k = 0 if k is None else k
        x = read('val', batches[k])
        B, ntok = x.size(0), x.numel()
        with ctx:
            if not causal:
                for j in range(eval_orders):
                    xt, t = mdm_corrupt(x, mask_id, generator=gen.manual_seed(eval_seed(k, j)))
                    _, nll = model(xt, targets=x, reduction='none')
                    acc[6] += (nll.sum(1) / t).sum()
                    acc[7] += ntok
                continue
            acc[0] += model(x, targets=x, reduction='none')[1].sum()
            acc[1] += ntok
            if model.any_order:
                for j in range(eval_orders):
                    sigma = random_orders(B, x.size(1), device=device, generator=gen.manual_seed(eval_seed(k, j)))
                    acc[2] += model(x, order=sigma, targets=x, reduction='none')[1].sum()
                    acc[3] += ntok
            if fixed_order is not None:
                acc[4] += model(x, order=fixed_order.expand(B, -1), targets=x, reduction='none')[1].sum()
                acc[5] += ntok
            elif own_draws(model, order, fixed_order):  # the run's own order distribution
                for j in range(eval_orders):
                    sigma = order.draw(B, x.size(1), device=device, generator=gen.manual_seed(eval_seed(k, j)))
                    acc[4] += model(x, order=sigma, targets=x, reduction='none')[1].sum()
                    acc[5] += ntok
    if dist.is_initialized():
        dist.all_reduce(s)
    model.train()
    mean = lambda i: (s[i] / s[i + 1]).item() if s[i + 1] > 0 else None
    out = dict(val_l2r=mean(0), val_ao=mean(2), val_order=mean(4), val_elbo=mean(6))
    headline = ('val_l2r' if order.is_l2r else 'val_ao' if order.l2r_weight is not None else 'val_order') if causal \
        else 'val_elbo'
    out['val_loss'] = out[headline]
    return out
