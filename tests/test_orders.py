"""orders.py: each order distribution's law against exact enumeration (the probability of every permutation,
computed combinatorially, not by drawing), its edge values against L2R and uniform (as laws and as identical
draws), and one clear line for a bad spec."""
import pytest
import torch
from helpers import exact_law
from test_speculative import chi2_pvalue

from aogpt.errors import UserError
from aogpt.orders import (block_order, draw_orders, l2r_mix, old_keys_line, one_block, parse_order, random_orders,
                          spec_of_config)

ALPHA = 1e-4
N = 40000  # orders per law


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def pvalue(orders, law, pos):
    """Chi-square of drawn orders (N, m) of the positions pos against a law over their permutations."""
    rank = {p: i for i, p in enumerate(pos)}
    cells = torch.tensor([[rank[p] for p in perm] for perm in law])
    probs = torch.tensor([float(v) for v in law.values()], dtype=torch.float64)
    drawn = orders.clone().apply_(lambda p: rank[p])
    return chi2_pvalue(drawn, cells, probs)


SPECS = ['semiar:2', 'semiar:3', 'nearl2r:1.5', 'nearl2r:2.5', 'nearl2r:4', 'mix:0.3*l2r+0.2*semiar:2+0.5*nearl2r:2']


@pytest.mark.parametrize('spec', SPECS)
@pytest.mark.parametrize('pos', [(0, 1, 2, 3), (0, 2, 3, 6, 7)], ids=['n4', 'gaps'])
def test_each_law_matches_enumeration(spec, pos):
    """Drawn orders against the exact probability of every permutation (pos: the positions to order, as
    the samplers pass the free ones), and the test's power: the uniform law is rejected."""
    law = exact_law(spec, pos)
    assert float(sum(law.values())) == pytest.approx(1, abs=1e-12)
    orders = draw_orders(spec, N, positions=torch.tensor(pos), generator=gen())
    assert pvalue(orders, law, pos) > ALPHA
    assert pvalue(orders, exact_law('random', pos), pos) < ALPHA


def old_random_mode(B, n, frac, generator):
    """train.py's order_mode=random draw with l2r_frac=frac before the Order (random_orders with l2r_frac), from its
    definition: the permutations, then the identity where a float32 uniform is < frac (none drawn at frac 0)."""
    orders = torch.rand(B, n, generator=generator, dtype=torch.float64).argsort(dim=1)
    if frac > 0:
        orders = torch.where(torch.rand(B, 1, generator=generator) < frac, torch.arange(n), orders)
    return orders


def test_edge_values_are_l2r_and_uniform():
    """semiar:1, nearl2r:0 and nearl2r:1 are L2R, drawn as the identity; semiar:K with K >= n draws exactly
    random_orders' orders; nearl2r:W tends to uniform as W grows (exact law within 1e-4 in total variation
    at W = 10^5, and the draws pass); mix:0.1*l2r+0.9*random draws exactly train.py's old l2r_frac=0.1 orders."""
    n, ident = 6, torch.arange(6).expand(500, 6)
    for spec in ('semiar:1', 'nearl2r:0', 'nearl2r:1', 'l2r', 'mix:0.4*semiar:1+0.6*nearl2r:0.5'):
        assert torch.equal(draw_orders(spec, 500, n, generator=gen()), ident), spec
    for spec in (f'semiar:{n}', 'semiar:100', 'random'):
        assert torch.equal(draw_orders(spec, 500, n, generator=gen(1)), random_orders(500, n, generator=gen(1)))
    assert torch.equal(draw_orders('mix:0.1*l2r+0.9*random', 4000, n, generator=gen(2)),
                       old_random_mode(4000, n, 0.1, gen(2)))
    pos = (0, 1, 2, 3)
    far, uniform = exact_law('nearl2r:100000', pos), exact_law('random', pos)
    assert sum(abs(far[p] - uniform[p]) for p in uniform) / 2 < 1e-4
    assert pvalue(draw_orders('nearl2r:100000', N, 4, generator=gen()), uniform, pos) > ALPHA
    # the laws at the edges, by enumeration too
    assert exact_law('semiar:1', pos) == exact_law('l2r', pos) == exact_law('nearl2r:1', pos)
    assert exact_law('semiar:4', pos) == uniform


def test_draws_follow_the_generator_and_the_device_batch():
    """The same seed draws the same orders; another seed others; every row a permutation."""
    for spec in ('semiar:3', 'nearl2r:2.5', 'mix:0.5*semiar:4+0.5*random'):
        a, b = draw_orders(spec, 64, 12, generator=gen(5)), draw_orders(spec, 64, 12, generator=gen(5))
        assert torch.equal(a, b) and not torch.equal(a, draw_orders(spec, 64, 12, generator=gen(6)))
        assert torch.equal(a.sort(1).values, torch.arange(12).expand(64, 12))


@pytest.mark.parametrize('bad,why', [
    ('sideways', "unknown order 'sideways'"),
    ('semiar:0', "semiar:K takes an integer K >= 1 (at most 2**63 - 1), not '0'"),
    ('semiar:2.5', "semiar:K takes an integer K >= 1"), ('nearl2r:-1', "nearl2r:W takes a number W >= 0"),
    ('nearl2r:inf', "nearl2r:W takes a number W >= 0"), ('mix:0.5*l2r+0.4*random', "sum to 0.9"),
    ('mix:l2r+random', "each part of a mix is weight*order"), ('mix:0.5*l2r+0.5*mix:1*random', "cannot hold a mix"),
    ('mix:0.5*l2r+0.5*sideways', "unknown order 'sideways' in 'mix:0.5*l2r+0.5*sideways'"),
])
def test_a_bad_spec_is_one_line_naming_the_grammar(bad, why):
    with pytest.raises(UserError) as e:
        parse_order(bad)
    assert why in e.value.msg and 'semiar:K' in e.value.msg and '\n' not in e.value.msg, e.value.msg


BIG = '100000000000000000000'  # > 2**64: int() reads it, torch's int64 does not


@pytest.mark.parametrize('bad,why', [
    (f'semiar:{BIG}', "semiar:K takes an integer K >= 1 (at most 2**63 - 1)"),
    (f'semiar:{2 ** 63}', "semiar:K takes an integer K >= 1 (at most 2**63 - 1)"),  # pos // K: silently negative
    ('semiar:\u00b2', "semiar:K takes an integer K >= 1"),  # '²'.isdigit(), but int('²') raises
    (f'fixed:{BIG}', "fixed:S takes an integer seed S >= 0 (at most 2**63 - 1)"),
    (f'fixedblocks:4:{BIG}', "fixedblocks:K:S takes a block length K >= 1 and a seed S >= 0"),
    (f'fixedblocks:{BIG}:1', "fixedblocks:K:S takes a block length K >= 1 and a seed S >= 0"),
    ('nearl2r:1e999', "nearl2r:W takes a number W >= 0"), ('nearl2r:nan', "nearl2r:W takes a number W >= 0"),
    (f'mix:0.5*semiar:{BIG}+0.5*random', "semiar:K takes an integer K >= 1 (at most 2**63 - 1)"),
    ('mix:nan*l2r+1*random', "each part of a mix is weight*order with a weight in [0, 1]"),
    ('mix:1e999*l2r+0*random', "each part of a mix is weight*order with a weight in [0, 1]"),
])
def test_every_number_of_a_spec_is_checked_in_the_parser(bad, why):
    """Issue #48 C: semiar:1e20 or fixed:1e20 parsed, then overflowed torch's int64 in a draw (an OverflowError
    traceback in train.py, sample.py, eval_ppl.py). Every numeric field goes through one check (_int, _real)."""
    with pytest.raises(UserError) as e:
        parse_order(bad)
    assert why in e.value.msg and '\n' not in e.value.msg, e.value.msg


def test_the_largest_numbers_a_spec_takes_draw():
    """The bound is where torch stops: the largest K and S draw (K beyond n is the uniform order)."""
    top = 2 ** 63 - 1
    g = torch.Generator().manual_seed(0)
    assert torch.equal(draw_orders(f'semiar:{top}', 2, 6, generator=g).sort(1).values, torch.arange(6).expand(2, 6))
    assert sorted(parse_order(f'fixed:{top}').permutation(6).tolist()) == list(range(6))
    assert sorted(parse_order(f'fixedblocks:3:{top}').permutation(6).tolist()) == list(range(6))


@pytest.mark.parametrize('spec', ['l2r', 'random', 'semiar:1', 'semiar:2', 'semiar:3', 'nearl2r:0.5', 'nearl2r:2.5',
                                  'mix:0.5*l2r+0.5*semiar:2', 'mix:0.4*random+0.6*nearl2r:0'])
def test_a_law_is_of_the_position_values_not_of_the_order_they_come_in(spec):
    """Positions passed in any order draw the law of their values (the exact law of the sorted ones, by
    enumeration): l2r, semiar:1 and nearl2r:W <= 1 give them ascending, every row of every kind."""
    pos = (6, 2, 7, 0, 3)
    orders = draw_orders(spec, 6000, positions=torch.tensor(pos), generator=gen())
    law = exact_law(spec, sorted(pos))
    if sum(1 for w in law.values() if w) == 1:  # one order: every row is it
        assert torch.equal(orders, torch.tensor(sorted(pos)).expand(6000, 5)), spec
    else:
        assert pvalue(orders, law, pos) > ALPHA


@pytest.mark.parametrize('kw, why', [
    (dict(positions=torch.tensor([3, 1, 3])), "the positions must be distinct, got [3, 1, 3]"),
    (dict(positions=torch.tensor([0.0, 1.0])), "positions is a 1-D integer tensor, got torch.float32 of shape (2,)"),
    (dict(positions=torch.arange(4).view(2, 2)), "positions is a 1-D integer tensor, got torch.int64 of shape (2, 2)"),
    (dict(positions=[0, 1]), "positions is a 1-D integer tensor, got list"),
    (dict(), "give n (an integer >= 0) or positions, got n=None"),
    (dict(n=-1), "give n (an integer >= 0) or positions, got n=-1"),
    (dict(n=4, batch_size=-1), "batch_size is an integer >= 0, got -1"),
])
def test_bad_positions_sizes_are_one_line_not_a_torch_error(kw, why):
    kw = dict(dict(batch_size=2), **kw)
    with pytest.raises(UserError) as e:
        draw_orders('semiar:2', kw.pop('batch_size'), **kw)
    assert why in e.value.msg and '\n' not in e.value.msg, e.value.msg


def test_one_block_says_when_semiar_is_the_uniform_order():
    """semiar:K with K >= the length n is one block: uniform, as 'random' (test_edge_values: the same draws).
    A command that knows n says so in one line; K < n, and every other kind, say nothing."""
    assert one_block('semiar:8', 8) is not None and one_block('semiar:9', 8) is not None
    assert 'semiar:8 at length 5 puts all 5 positions in one block' in one_block('mix:0.5*l2r+0.5*semiar:8', 5)
    assert '\n' not in one_block('semiar:9', 4)
    for spec in ('semiar:7', 'random', 'l2r', 'nearl2r:100', 'mix:0.5*semiar:4+0.5*random'):
        assert one_block(spec, 8) is None, spec


@pytest.mark.parametrize('frac', [0.0, 0.1, 0.5, 0.7123456789, 1.0])
def test_the_l2r_weight_schedule_draws_the_old_random_mode_bit_for_bit(frac):
    """l2r_mix(w), train.py's law at L2R weight w (the old order_mode=random, l2r_frac=w), draws exactly the old
    orders: 0 plain random_orders (no uniform drawn), 1 only identities, in between the permuted rows the same
    draws; the parsed spec of the same weight draws the same. Its l2r_weight is w, the weight log.jsonl records."""
    def g():
        return torch.Generator().manual_seed(5)
    law = l2r_mix(frac)
    got = law.draw(64, 9, generator=g())
    assert torch.equal(got, old_random_mode(64, 9, frac, g())) and law.l2r_weight == frac
    if 0 < frac < 1:
        assert torch.equal(parse_order(law.spec).draw(64, 9, generator=g()), got)
        l2r = (got == torch.arange(9)).all(1)
        plain = random_orders(64, 9, generator=g())
        assert 0 < l2r.sum() < 64 and torch.equal(got[~l2r], plain[~l2r])
    assert torch.equal(l2r_mix(0.0).draw(64, 9, generator=g()), random_orders(64, 9, generator=g()))
    assert torch.equal(l2r_mix(1.0).draw(64, 9, generator=g()), torch.arange(9).expand(64, 9))


@pytest.mark.parametrize('spec,k,seed', [('fixed:3', None, 3), ('fixedblocks:4:3', 4, 3), ('fixed:0', None, 0),
                                         ('fixedblocks:1:7', 1, 7)])
def test_a_fixed_spec_is_the_old_fixed_order(spec, k, seed):
    """fixed:S is the old order_mode=fixed_random with order_seed=S, fixedblocks:K:S block_random with
    block_size_order=K: block_order's permutation, every row of every draw, none taken from the generator;
    not L2R (but for K = 1); a sampler's positions are refused (one line), and so is a mix holding one."""
    order, n = parse_order(spec), 12
    want = block_order(n, n if k is None else k, seed)
    g = gen(1)
    assert order.fixed and torch.equal(order.permutation(n), want)
    assert torch.equal(order.draw(5, n, generator=g), want.expand(5, n))
    assert torch.equal(g.get_state(), gen(1).get_state())  # nothing drawn
    assert (k == 1) == torch.equal(want, torch.arange(n))
    with pytest.raises(UserError, match='a fixed order is a permutation of all n positions'):
        order.draw(2, positions=torch.tensor([1, 3]))
    with pytest.raises(UserError, match='a mix cannot hold a fixed order'):
        parse_order(f'mix:0.5*l2r+0.5*{spec}')
    if k == 4:
        with pytest.raises(UserError, match='blocks of 4 do not divide the length 10'):
            order.permutation(10)


@pytest.mark.parametrize('old,new', [
    ({}, None),
    ({'order_mode': 'random'}, 'mix:0.1*l2r+0.9*random'),  # l2r_frac's default, 0.1
    ({'order_mode': 'random', 'l2r_frac': 0.0}, 'random'),
    ({'order_mode': 'random', 'l2r_frac': 1.0}, 'mix:1*l2r+0*random'),  # the same draws as the old mode
    ({'order_mode': 'random', 'l2r_frac': 0.25}, 'mix:0.25*l2r+0.75*random'),
    ({'order_mode': 'l2r', 'l2r_frac': 0.1}, 'l2r'),
    ({'order_mode': 'fixed_random', 'order_seed': 2}, 'fixed:2'),
    ({'order_mode': 'block_random'}, 'fixedblocks:4:0'),  # block_size_order's and order_seed's defaults
    ({'order_mode': 'block_random', 'block_size_order': 8, 'order_seed': 1}, 'fixedblocks:8:1'),
    ({'order_mode': 'mix:0.5*blocks:8+0.5*random'}, 'mix:0.5*semiar:8+0.5*random'),
    ({'order': 'nearl2r:3', 'order_mode': 'random'}, 'nearl2r:3'),  # the new key wins
])
def test_an_old_config_reads_as_its_new_spec(old, new):
    """A checkpoint's (or export's) config in the old spelling is read as the new spec of the same law; the same
    settings given to train.py are one line naming that spec."""
    assert spec_of_config(old) == new
    assert not old or spec_of_config(dict(old, l2r_frac_end=None)) == new
    if new is not None:
        assert parse_order(new).spec == new
    if old and 'order' not in old:
        line = old_keys_line(old)
        assert f"use order={new!r}" in line and '\n' not in line, line


def test_blocks_is_refused_with_its_new_name():
    for bad, why in [('blocks:4', "blocks:K is spelled semiar:K now (the same law): use 'semiar:4'"),
                     ('mix:0.5*blocks:2+0.5*l2r', "use 'mix:0.5*semiar:2+0.5*l2r'"),
                     ('blocks:0', "blocks:K is spelled semiar:K now (the same law); semiar:K takes an integer K >= 1")]:
        with pytest.raises(UserError) as e:
            parse_order(bad)
        assert why in e.value.msg and '\n' not in e.value.msg, e.value.msg


def test_an_order_is_parsed_once_and_carried():
    """parse_order gives the Order the commands carry: draw_orders takes it as it is (no second parse), and
    its spec, comps and equality are those of the text."""
    import aogpt.orders as orders
    order = parse_order('mix:0.5*semiar:4+0.5*random')
    calls = []
    real = orders.parse_order
    try:
        orders.parse_order = lambda s: calls.append(s) or real(s)
        a = draw_orders(order, 3, 8, generator=gen(2))
    finally:
        orders.parse_order = real
    assert calls == [] and torch.equal(a, order.draw(3, 8, generator=gen(2)))
    assert order == parse_order('mix:0.5 * semiar:4 + 0.5 * random') and str(order) == order.spec
    assert list(order) == [(0.5, 'semiar', 4), (0.5, 'random', None)]


@pytest.mark.parametrize('cfg', [{'order_mode': 'random', 'l2r_frac': 1.0, 'l2r_frac_end': 0.1},
                                 {'order': 'l2r', 'l2r_frac_end': 0.1}])
def test_a_scheduled_run_trained_at_its_end_on_the_schedules_end(cfg):
    """config/train_ptb_tiny's L2R weight 1 -> 0.1, old and new spelling: the run ends on mix:0.1*l2r+0.9*random
    (what sample.py's auto order reads: random, as before), not on its first law."""
    assert spec_of_config(cfg) == 'mix:0.1*l2r+0.9*random'
    assert spec_of_config(dict(cfg, l2r_frac_end=0.0)) == 'random'


def test_order_warmup_grows_its_window_or_block_geometrically_from_a_to_b():
    """train.py's order_warmup: its parameter A (B / A)^frac, each doubling taking as many steps (a block rounded to an
    integer); a spec outside the grammar is one line naming the key."""
    from aogpt.orders import parse_warmup, warmup_order
    assert parse_warmup('') is None
    w = parse_warmup('nearl2r:1:32')
    assert [warmup_order(w, f).comps[0][2] for f in (0, 0.2, 0.4, 0.8)] == pytest.approx([1, 2, 4, 16])
    s = parse_warmup('semiar:2:32')
    assert [warmup_order(s, f).spec for f in (0, 0.25, 0.5, 0.99)] == ['semiar:2', 'semiar:4', 'semiar:8', 'semiar:31']
    assert warmup_order(parse_warmup('semiar:16:1'), 0.5).spec == 'semiar:4'  # a shrinking block works as well
    for bad in ('nearl2r:0:8', 'semiar:0:8', 'semiar:4', 'random:1:2', 'nearl2r:1:inf', 'semiar:1:²', 3):
        with pytest.raises(UserError, match="order_warmup must be '' \\(none\\), nearl2r:A:B"):
            parse_warmup(bad)
