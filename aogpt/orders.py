"""
Order distributions: the laws over generation orders that train.py trains on, sample.py samples along and
eval_ppl.py scores under, written as one spec string and drawn in this one place.

    random          uniform over all n! orders (the MDM's)
    l2r             left to right
    semiar:K        semi-autoregressive: blocks of K positions left to right, a uniform order inside each
                    (the AO-AR view of block diffusion). K = 1 is l2r, K >= n is random. blocks:K is the
                    same law (sample.py's name for it), drawn the same way.
    nearl2r:W       near left to right: positions sorted by i + W * U_i, with U_i ~ U[0, 1) independent. Two
                    positions can swap only if they are fewer than W apart, so W <= 1 is l2r and each
                    position moves fewer than W places; as W grows the law tends to random.
    mix:w1*A+w2*B   a mixture: each order comes from A with probability w1, from B with w2, ... (weights > 0
                    summing to 1; A, B, ... any of the above but a mix). mix:0.1*l2r+0.9*random is
                    train.py's order_mode=random with l2r_frac=0.1, and draws the very same orders.

None of them looks at the data, so the AO-AR loss under any of them is an exact expectation of exact
likelihoods -log p_sigma(x), an upper bound on -log of the mixture over sigma; and sampling along an order
drawn before the first token is exact for that mixture (the speculative sampler too).

    draw_orders('semiar:8', B, n, generator=g)          # (B, n) permutations of range(n)
    draw_orders('nearl2r:4', B, positions=free, ...)    # (B, m) the positions `free` in reveal order

Draws. Every order is an argsort of float64 keys (random_orders' reasoning: no ties in practice) from
the caller's generator, on its device, so a counter-seeded generator makes the draws reproducible and
independent of the world size. random is random_orders itself; semiar keys are block + U, so
semiar:K with K >= n draws exactly random_orders' orders and K = 1 the identity; a mix draws every
component for every row in the spec's order, then one float32 uniform per row picks the component
(as random_orders picks its L2R rows).
"""

if __name__ == '__main__':  # run as a script (python aogpt/orders.py): one line, not an ImportError
    raise SystemExit("error: aogpt/orders.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import math
import re

import torch

from aogpt.errors import UserError

# train.py's own order modes, which it draws itself (random: uniform with l2r_frac of L2R rows, on a schedule;
# fixed_random, block_random: one order, saved in ckpt.pt); any other order_mode is a spec drawn here
TRAIN_MODES = ('random', 'l2r', 'fixed_random', 'block_random')

GRAMMAR = "random, l2r, semiar:K (K >= 1), nearl2r:W (W >= 0) or mix:w1*A+w2*B+... (weights summing to 1)"


def random_orders(B, n, device=None, generator=None, l2r_frac=0.0):
    """B independent uniform permutations of range(n): argsort of uniform noise, on the device. The one
    place every order, shuffle and uniform subset is drawn (training, eval, sampling). float64 keys:
    float32 ones take 2^24 values, so a row of 1024 holds a tie with probability ~3%, and argsort breaks
    ties by index, a bias toward left to right; with 53 bits a tie is practically impossible.
    l2r_frac > 0 (training's order_mode=random): each row is instead the identity with that probability,
    drawn after the permutations, from the same generator."""
    orders = torch.rand(B, n, device=device, generator=generator, dtype=torch.float64).argsort(dim=1)
    if l2r_frac > 0:
        l2r = torch.rand(B, 1, device=device, generator=generator) < l2r_frac
        orders = torch.where(l2r, torch.arange(n, device=device), orders)
    return orders


def block_order(n, k, seed):
    """A fixed order of range(n) (k divides n): blocks of k positions left to right, the same seeded permutation
    inside each, never the identity (a "random" order must not be L2R), e.g. 0 2 3 1 4 6 7 5 ... for k = 4. k = n:
    one random permutation (order_mode fixed_random); k < n: order_mode block_random."""
    g = torch.Generator().manual_seed(seed)
    pattern = torch.randperm(k, generator=g)
    while k > 1 and torch.equal(pattern, torch.arange(k)):
        pattern = torch.randperm(k, generator=g)
    return (torch.arange(n // k)[:, None] * k + pattern[None, :]).flatten()


def parse_order(spec):
    """An order spec -> its components [(weight, kind, param)], kind 'random' | 'l2r' | 'semiar' | 'nearl2r'
    (param: K, W or None); one component unless spec is a mix. Raises UserError naming what is wrong and the
    grammar (GRAMMAR)."""
    if not isinstance(spec, str):
        raise UserError(f"an order spec is a string, got {spec!r}: {GRAMMAR}")
    s = spec.replace(' ', '')
    if not s.startswith('mix:'):
        return [(1.0, *_component(s, spec))]
    parts = re.split(r'\+(?=[0-9.]+\*)', s[4:])  # '+' before the next 'w*' (a W may hold an exponent's '+')
    comps = []
    for part in parts:
        w, star, what = part.partition('*')
        try:
            w = float(w)
        except ValueError:
            w = None
        if not star or w is None or not 0 < w <= 1:
            raise UserError(f"order {spec!r}: each part of a mix is weight*order with a weight in (0, 1], "
                            f"not {part!r}; an order is {GRAMMAR}")
        if what.startswith('mix:'):
            raise UserError(f"order {spec!r}: a mix cannot hold a mix; an order is {GRAMMAR}")
        comps.append((w, *_component(what, spec)))
    total = sum(w for w, _, _ in comps)
    if abs(total - 1) > 1e-6:
        raise UserError(f"order {spec!r}: the weights of a mix sum to 1, these sum to {total:g}; an order is {GRAMMAR}")
    return comps


def _component(s, spec):
    """One non-mix spec s -> (kind, param)."""
    if s in ('random', 'l2r'):
        return s, None
    name, _, arg = s.partition(':')
    if name in ('semiar', 'blocks'):
        if arg.isdigit() and int(arg) >= 1:
            return 'semiar', int(arg)
        raise UserError(f"order {spec!r}: {name}:K takes an integer K >= 1, not {arg!r}; an order is {GRAMMAR}")
    if name == 'nearl2r':
        try:
            W = float(arg)
        except ValueError:
            W = -1.0
        if 0 <= W < math.inf:
            return 'nearl2r', W
        raise UserError(f"order {spec!r}: nearl2r:W takes a number W >= 0, not {arg!r}; an order is {GRAMMAR}")
    raise UserError(f"unknown order {s!r}" + (f" in {spec!r}" if s != spec else "") + f": an order is {GRAMMAR}")


def is_order_spec(spec):
    """True if spec parses (parse_order would accept it)."""
    try:
        parse_order(spec)
        return True
    except UserError:
        return False


def one_block(spec, n):
    """The line a command that knows its length n says for a spec whose semiar:K has K >= n: one block holds
    every position, so that K draws the uniform random order (a block of K > n is no semi-autoregressive
    order); None when no component is such."""
    big = sorted({k for _, kind, k in parse_order(spec) if kind == 'semiar' and k >= n})
    if big:
        return (f"order {spec}: semiar:{big[0]} at length {n} puts all {n} positions in one block, which is the "
                f"uniform random order (semi-autoregressive needs K < {n})")
    return None


def draw_orders(spec, batch_size, n=None, *, positions=None, device=None, generator=None):
    """batch_size orders drawn from spec (module docstring), each from the caller's generator on its device.
    Without positions: (B, n) permutations of range(n). With positions (m,) (distinct, e.g. the positions a
    sampler must fill): (B, m), those positions in reveal order. Every law is one of the position values, not of
    the order they are passed in: l2r is ascending positions, the block of a position is position // K and
    nearl2r's key is position + W U, wherever the gaps are."""
    comps = parse_order(spec)
    pos = _positions(batch_size, n, positions, device)
    idx = [_draw(kind, arg, batch_size, pos, generator) for _, kind, arg in comps]   # each (B, m) into pos
    if len(idx) == 1:
        return pos[idx[0]]
    u = torch.rand(batch_size, 1, device=device, generator=generator)                # float32, as random_orders
    cum = torch.tensor([w for w, _, _ in comps], dtype=torch.float64).cumsum(0)[:-1]
    which = (u >= cum.to(device=device, dtype=u.dtype)).sum(1)                       # (B,) the component
    pick = torch.stack(idx).gather(0, which.view(1, -1, 1).expand(1, *idx[0].shape))[0]
    return pos[pick]


def _draw(kind, arg, B, pos, generator):
    """(B, m) indices into pos: the reveal order of one component."""
    m, dev = pos.numel(), pos.device
    if kind == 'random':
        return random_orders(B, m, device=dev, generator=generator)
    if kind == 'l2r':  # ascending positions (arange(m) when they come ascending, as they mostly do)
        return pos.argsort().expand(B, m)
    U = torch.rand(B, m, device=dev, generator=generator, dtype=torch.float64)
    # semiar: the block, then a uniform tie-break inside it; nearl2r: the position plus W times the noise
    keys = (pos // arg).double() + U if kind == 'semiar' else pos.double() + arg * U
    return keys.argsort(dim=1)


def _positions(batch_size, n, positions, device):
    """The positions to order, (m,) on the device: range(n), or the caller's, checked (one line, not a torch
    error deep in a draw)."""
    if not isinstance(batch_size, int) or batch_size < 0:
        raise UserError(f"draw_orders: batch_size is an integer >= 0, got {batch_size!r}")
    if positions is None:
        if not isinstance(n, int) or n < 0:
            raise UserError(f"draw_orders: give n (an integer >= 0) or positions, got n={n!r}")
        return torch.arange(n, device=device)
    if not torch.is_tensor(positions) or positions.dim() != 1 or positions.is_floating_point() or \
            positions.is_complex() or positions.dtype == torch.bool:
        got = (f"{positions.dtype} of shape {tuple(positions.shape)}" if torch.is_tensor(positions) else
               type(positions).__name__)
        raise UserError(f"draw_orders: positions is a 1-D integer tensor, got {got}")
    if positions.unique().numel() != positions.numel():
        raise UserError(f"draw_orders: the positions must be distinct, got {positions.tolist()}")
    return positions.long() if device is None else positions.to(device=device, dtype=torch.long)
