"""
Order distributions: the laws over generation orders that train.py trains on, sample.py samples along and
eval_ppl.py scores under (--order in all three), written as one spec string, parsed once into an Order, and
drawn in this one place.

    random          uniform over all n! orders (the MDM's)
    l2r             left to right
    semiar:K        semi-autoregressive: blocks of K positions left to right, a uniform order inside each
                    (the AO-AR view of block diffusion). K = 1 is l2r, K >= n is random.
    nearl2r:W       near left to right: positions sorted by i + W * U_i, with U_i ~ U[0, 1) independent. Two
                    positions can swap only if they are fewer than W apart, so W <= 1 is l2r and each
                    position moves fewer than W places; as W grows the law tends to random.
    mix:w1*A+w2*B   a mixture: each order comes from A with probability w1, from B with w2, ... (weights >= 0
                    summing to 1; A, B, ... any of the above but a mix or a fixed order). train.py's default,
                    mix:0.1*l2r+0.9*random, is the paper's: 10% of the sequences left to right.
    fixed:S         one order, the same for every sequence: a permutation of all n positions drawn from seed S
                    (never the identity). A run trained on it saves it in ckpt.pt.
    fixedblocks:K:S one order: blocks of K positions left to right (K divides n), the same permutation of each
                    block's positions drawn from seed S (never the identity), e.g. 0 2 3 1 4 6 7 5 ... for K = 4.

None of them looks at the data, so the AO-AR loss under any of them is an exact expectation of exact
likelihoods -log p_sigma(x), an upper bound on -log of the mixture over sigma; and sampling along an order
drawn before the first token is exact for that mixture (the speculative sampler too).

    order = parse_order('semiar:8')                      # once, where the spec comes in
    order.draw(B, n, generator=g)                        # (B, n) permutations of range(n)
    order.draw(B, positions=free, generator=g)           # (B, m) the positions `free` in reveal order
    draw_orders('nearl2r:4', B, n, generator=g)          # the same from a spec string

Draws. Every order is an argsort of float64 keys (random_orders: no ties in practice) from the caller's
generator, on its device, so a counter-seeded generator makes the draws reproducible and independent of the
world size. random is random_orders itself; semiar keys are block + U, so semiar:K with K >= n draws exactly
random_orders' orders and K = 1 the identity; a mix draws every component for every row in the spec's order,
whatever its weight (0 too), then one float32 uniform per row picks the component. So mix:w*l2r+(1-w)*random
draws random_orders' permutations, then sets a row to the identity where that uniform is < w; train.py's
schedule of the L2R weight (l2r_frac_end) draws mix:w*l2r+(1-w)*random at each step, plain random where w = 0.
A fixed order draws nothing from the generator.

Old spellings. Specs and configs written before the Order (train.py's order_mode, l2r_frac, block_size_order,
order_seed; the alias blocks:K) are refused with one line that names the new form (old_keys_line,
parse_order); a checkpoint's config that holds them is read as its new form (new_spelling, spec_of_config).
"""

if __name__ == '__main__':  # run as a script (python aogpt/orders.py): one line, not an ImportError
    raise SystemExit("error: aogpt/orders.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import math
import re

import torch

from aogpt.errors import UserError

GRAMMAR = ("random, l2r, semiar:K (K >= 1), nearl2r:W (W >= 0), mix:w1*A+w2*B+... (weights summing to 1), "
           "fixed:S or fixedblocks:K:S (one seeded order)")
AO_KINDS = ('random', 'l2r')  # a law of only these is scored by val_ao and val_l2r (no val_order of its own)


def random_orders(B, n, device=None, generator=None):
    """B independent uniform permutations of range(n): argsort of uniform noise, on the device. The one
    place every order, shuffle and uniform subset is drawn (training, eval, sampling). float64 keys:
    float32 ones take 2^24 values, so a row of 1024 holds a tie with probability ~3%, and argsort breaks
    ties by index, a bias toward left to right; with 53 bits a tie is practically impossible."""
    return torch.rand(B, n, device=device, generator=generator, dtype=torch.float64).argsort(dim=1)


def block_order(n, k, seed):
    """A fixed order of range(n) (k divides n): blocks of k positions left to right, the same seeded permutation
    inside each, never the identity (a "random" order must not be L2R), e.g. 0 2 3 1 4 6 7 5 ... for k = 4. k = n:
    one random permutation (fixed:S); k < n: fixedblocks:K:S."""
    g = torch.Generator().manual_seed(seed)
    pattern = torch.randperm(k, generator=g)
    while k > 1 and torch.equal(pattern, torch.arange(k)):
        pattern = torch.randperm(k, generator=g)
    return (torch.arange(n // k)[:, None] * k + pattern[None, :]).flatten()


class Order:
    """A parsed order spec: comps ((weight, kind, param), ...), one unless it is a mix (kind 'random' | 'l2r' |
    'semiar' | 'nearl2r' | 'fixed' | 'fixedblocks'; param K, W, S, (K, S) or None), and spec, its text. What
    the commands carry from the one parse_order of their flag (iterating it gives comps)."""

    def __init__(self, comps, spec):
        self.comps, self.spec = tuple(comps), spec

    def __iter__(self):
        return iter(self.comps)

    def __str__(self):
        return self.spec

    def __repr__(self):
        return f"Order({self.spec!r})"

    def __eq__(self, other):
        return isinstance(other, Order) and self.comps == other.comps

    def __hash__(self):
        return hash(self.comps)

    @property
    def kinds(self):
        return {kind for _, kind, _ in self.comps}

    @property
    def is_l2r(self):
        """Plain l2r: the model's own left-to-right pass, no order tensor."""
        return self.kinds == {'l2r'}

    @property
    def fixed(self):
        """One order for every sequence (fixed:S, fixedblocks:K:S): permutation(n) is it."""
        return self.comps[0][1] in ('fixed', 'fixedblocks')

    @property
    def l2r_weight(self):
        """The probability of the L2R order when the law is random, l2r or a mix of the two (the weight
        train.py's l2r_frac_end schedule moves; the paper's 0.1); else None."""
        if not self.kinds <= set(AO_KINDS):
            return None
        return float(sum(w for w, kind, _ in self.comps if kind == 'l2r'))

    def permutation(self, n):
        """The (n,) fixed order at length n."""
        if not self.fixed:
            raise UserError(f"order {self.spec}: not a fixed order (fixed:S or fixedblocks:K:S)")
        _, kind, arg = self.comps[0]
        k, seed = (n, arg) if kind == 'fixed' else arg
        if n % k:
            raise UserError(f"order {self.spec}: blocks of {k} do not divide the length {n}: pick a K that divides it")
        return block_order(n, k, seed)

    def draw(self, batch_size, n=None, *, positions=None, device=None, generator=None):
        """batch_size orders drawn from this law (module docstring), each from the caller's generator on its
        device. Without positions: (B, n) permutations of range(n). With positions (m,) (distinct, e.g. the
        positions a sampler must fill): (B, m), those positions in reveal order. Every law is one of the position
        values, not of the order they are passed in: l2r is ascending positions, the block of a position is
        position // K and nearl2r's key is position + W U, wherever the gaps are. A fixed order is one of all n
        positions: it takes n, not positions."""
        pos = _positions(batch_size, n, positions, device)
        if self.fixed:
            if positions is not None:
                raise UserError(f"order {self.spec}: a fixed order is a permutation of all n positions; draw it with "
                                f"n, or pass its permutation(n) to a sampler")
            return self.permutation(n).to(pos.device).expand(batch_size, n)
        idx = [_draw(kind, arg, batch_size, pos, generator) for _, kind, arg in self.comps]   # each (B, m) into pos
        if len(idx) == 1:
            return pos[idx[0]]
        u = torch.rand(batch_size, 1, device=device, generator=generator)                     # float32, (B, 1)
        cum = torch.tensor([w for w, _, _ in self.comps], dtype=torch.float64).cumsum(0)[:-1]
        which = (u >= cum.to(device=device, dtype=u.dtype)).sum(1)                            # (B,) the component
        pick = torch.stack(idx).gather(0, which.view(1, -1, 1).expand(1, *idx[0].shape))[0]
        return pos[pick]


UNIFORM = Order([(1.0, 'random', None)], 'random')  # the laws the commands fall back on, built once
L2R = Order([(1.0, 'l2r', None)], 'l2r')


def _num(x):
    """A weight as short text that reads back as the same float."""
    return f"{x:g}" if float(f"{x:g}") == x else repr(x)


def l2r_mix(w):
    """The law of the L2R-weight schedule at weight w (module docstring): mix:w*l2r+(1-w)*random, every row
    drawn as random_orders then set to L2R with probability w; plain random at w = 0 (no uniform drawn)."""
    if not w > 0:
        return UNIFORM
    return Order([(w, 'l2r', None), (1 - w, 'random', None)], f"mix:{_num(w)}*l2r+{_num(1 - w)}*random")


WARMUP_GRAMMAR = "'' (none), nearl2r:A:B (the window W from A > 0 to B) or semiar:A:B (the block K from A >= 1 to B)"


def parse_warmup(spec):
    """train.py's order_warmup, an order that moves toward `order` in the run's first order_warmup_iters steps:
    '' -> None; 'nearl2r:A:B' or 'semiar:A:B' -> (kind, A, B), its parameter's start and end. Raises UserError."""
    if spec == '':
        return None
    parts = spec.replace(' ', '').split(':') if isinstance(spec, str) else []
    if len(parts) == 3 and parts[0] == 'nearl2r':
        a, b = _real(parts[1], 0, math.inf), _real(parts[2], 0, math.inf)
        if a and b:  # > 0: the growth is geometric
            return 'nearl2r', a, b
    if len(parts) == 3 and parts[0] == 'semiar' and _int(parts[1], 1) and _int(parts[2], 1):
        return 'semiar', _int(parts[1], 1), _int(parts[2], 1)
    raise UserError(f"order_warmup must be {WARMUP_GRAMMAR}, got {spec!r}")


def warmup_order(warmup, frac):
    """The law of order_warmup (kind, A, B) a fraction frac in [0, 1) of the way: its parameter A (B / A)^frac,
    geometric (each doubling of the window or block takes as many steps), a block rounded to an integer."""
    kind, a, b = warmup
    p = a * (b / a) ** frac
    p = max(1, round(p)) if kind == 'semiar' else p
    return Order([(1.0, kind, p)], f"{kind}:{_num(p)}")


def as_order(order):
    """An Order as it is, a spec string parsed."""
    return order if isinstance(order, Order) else parse_order(order)


def parse_order(spec):
    """An order spec -> its Order. Raises UserError naming what is wrong and the grammar (GRAMMAR)."""
    if not isinstance(spec, str):
        raise UserError(f"an order spec is a string, got {spec!r}: {GRAMMAR}")
    s = spec.replace(' ', '')
    if not s.startswith('mix:'):
        return Order([(1.0, *_component(s, spec))], s)
    parts = re.split(r'\+(?=[0-9.]+\*)', s[4:])  # '+' before the next 'w*' (a W may hold an exponent's '+')
    comps = []
    for part in parts:
        w, star, what = part.partition('*')
        w = _real(w, 0, 1)
        if not star or w is None:
            raise UserError(f"order {spec!r}: each part of a mix is weight*order with a weight in [0, 1], "
                            f"not {part!r}; an order is {GRAMMAR}")
        if what.startswith('mix:'):
            raise UserError(f"order {spec!r}: a mix cannot hold a mix; an order is {GRAMMAR}")
        comps.append((w, *_component(what, spec)))
        if comps[-1][1] in ('fixed', 'fixedblocks'):
            raise UserError(f"order {spec!r}: a mix cannot hold a fixed order (one order is no distribution to mix); "
                            f"an order is {GRAMMAR}")
    total = sum(w for w, _, _ in comps)
    if abs(total - 1) > 1e-6:
        raise UserError(f"order {spec!r}: the weights of a mix sum to 1, these sum to {total:g}; an order is {GRAMMAR}")
    return Order(comps, s)


INT_MAX = 2 ** 63 - 1  # every integer of a spec (K, S) is used as a torch int64: a seed, or a divisor of positions
_BELOW = " (at most 2**63 - 1)"


def _int(text, lo):
    """An integer field of a spec (a block length, a seed): plain ASCII digits, in [lo, INT_MAX], else None. The one
    check of every integer field: a larger one overflows torch's int64 (an OverflowError deep in a draw, or a
    quietly wrong block index), and str.isdigit alone takes digits such as '²' that int() refuses."""
    if not re.fullmatch(r'[0-9]+', text):
        return None
    v = int(text)
    return v if lo <= v <= INT_MAX else None


def _real(text, lo, hi):
    """A real field of a spec (a window W, a mixture weight): a finite float in [lo, hi], else None (nan, inf and
    1e999, which float() reads as inf, included). The one check of every real field."""
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) and lo <= v <= hi else None


def _component(s, spec):
    """One non-mix spec s -> (kind, param)."""
    if s in ('random', 'l2r'):
        return s, None
    name, _, arg = s.partition(':')
    if name == 'blocks':  # the old name: one name per law
        new = spec.replace(' ', '').replace('blocks:', 'semiar:')
        raise UserError(f"order {spec!r}: blocks:K is spelled semiar:K now (the same law)" +
                        (f": use {new!r}" if _int(arg, 1) is not None else
                         f"; semiar:K takes an integer K >= 1, not {arg!r}; an order is {GRAMMAR}"))
    if name == 'semiar':
        if _int(arg, 1) is not None:
            return 'semiar', _int(arg, 1)
        raise UserError(f"order {spec!r}: semiar:K takes an integer K >= 1{_BELOW}, not {arg!r}; an order is {GRAMMAR}")
    if name == 'nearl2r':
        if _real(arg, 0, math.inf) is not None:
            return 'nearl2r', _real(arg, 0, math.inf)
        raise UserError(f"order {spec!r}: nearl2r:W takes a number W >= 0 (finite), not {arg!r}; an order is {GRAMMAR}")
    if name == 'fixed':
        if _int(arg, 0) is not None:
            return 'fixed', _int(arg, 0)
        raise UserError(f"order {spec!r}: fixed:S takes an integer seed S >= 0{_BELOW}, not {arg!r}; an order is "
                        f"{GRAMMAR}")
    if name == 'fixedblocks':
        k, _, seed = arg.partition(':')
        if _int(k, 1) is not None and _int(seed, 0) is not None:
            return 'fixedblocks', (_int(k, 1), _int(seed, 0))
        raise UserError(f"order {spec!r}: fixedblocks:K:S takes a block length K >= 1 and a seed S >= 0 "
                        f"(each{_BELOW}), not {arg!r}; an order is {GRAMMAR}")
    raise UserError(f"unknown order {s!r}" + (f" in {spec!r}" if s != spec else "") + f": an order is {GRAMMAR}")


def is_order_spec(spec):
    """True if spec parses (parse_order would accept it)."""
    try:
        parse_order(spec)
        return True
    except UserError:
        return False


def one_block(order, n):
    """The line a command that knows its length n says for an order whose semiar:K has K >= n: one block holds
    every position, so that K draws the uniform random order (a block of K > n is no semi-autoregressive
    order); None when no component is such."""
    order = as_order(order)
    big = sorted({k for _, kind, k in order if kind == 'semiar' and k >= n})
    if big:
        return (f"order {order.spec}: semiar:{big[0]} at length {n} puts all {n} positions in one block, which is the "
                f"uniform random order (semi-autoregressive needs K < {n})")
    return None


def draw_orders(order, batch_size, n=None, *, positions=None, device=None, generator=None):
    """as_order(order).draw(...): an Order or a spec string."""
    return as_order(order).draw(batch_size, n, positions=positions, device=device, generator=generator)


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


# ------------------------------------------------------------------ the old spellings
OLD_KEYS = ('order_mode', 'l2r_frac', 'block_size_order', 'order_seed')  # train.py's keys before `order`
OLD_DEFAULTS = dict(order_mode='random', l2r_frac=0.1, block_size_order=4, order_seed=0)


def new_spelling(cfg):
    """A train.py config (a checkpoint's, an export's) in today's keys, the one translation of an old one: the old
    order keys it holds (OLD_KEYS) give way to `order`, their new spec (their defaults where absent, as train.py had
    them), unless it holds `order` already (which wins). The start's spec, as train.py's `order` key is: the
    l2r_frac_end schedule stays its own key. An empty config stays empty."""
    if not cfg:
        return cfg
    new = {k: v for k, v in cfg.items() if k not in OLD_KEYS}
    new['order'] = cfg['order'] if 'order' in cfg else _old_spec(cfg)
    return new


def order_of_config(cfg):
    """The Order a train.py config (a checkpoint's, an export's) trained on at its end: its `order` (new_spelling's
    for an old one), at l2r_frac_end's L2R weight when the schedule is set. None for an empty config; UserError
    (parse_order's) for an unreadable one."""
    if not cfg:
        return None
    cfg = new_spelling(cfg)
    order = parse_order(cfg['order'])
    end = cfg.get('l2r_frac_end')
    return l2r_mix(end) if end is not None and order.l2r_weight is not None else order


def spec_of_config(cfg):
    """order_of_config's spec (None for an empty config, the text as it is where it does not parse)."""
    try:
        order = order_of_config(cfg)
    except UserError:
        return new_spelling(cfg)['order']
    return None if order is None else order.spec


def _old_spec(cfg):
    """The new spec of the old keys' start (OLD_KEYS)."""
    old = dict(OLD_DEFAULTS, **{k: cfg[k] for k in OLD_KEYS if k in cfg})
    mode = old['order_mode']
    if mode == 'random':
        return l2r_mix(old['l2r_frac']).spec
    if mode == 'fixed_random':
        return f"fixed:{old['order_seed']}"
    if mode == 'block_random':
        return f"fixedblocks:{old['block_size_order']}:{old['order_seed']}"
    return re.sub(r'\bblocks:', 'semiar:', str(mode).replace(' ', ''))


def old_keys_line(old):
    """The one line for train.py settings in the old spelling ({key: value} of OLD_KEYS): the new form."""
    new = _old_spec(old)
    keys = ', '.join(f"{k}={v!r}" for k, v in old.items())
    moves = 'l2r_frac' in old and is_order_spec(new) and parse_order(new).l2r_weight is not None
    return (f"{keys}: train.py's orders are one key now, order (aogpt/orders.py): use order={new!r}"
            + (" (l2r_frac_end and l2r_frac_iters still move its L2R weight)" if moves else ""))


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
