"""orders.py: each order distribution's law against exact enumeration (the probability of every permutation,
computed combinatorially, not by drawing), its edge values against L2R and uniform (as laws and as identical
draws), and one clear line for a bad spec."""
import pytest
import torch
from helpers import exact_law
from test_speculative import chi2_pvalue

from aogpt.errors import UserError
from aogpt.orders import draw_orders, one_block, parse_order, random_orders

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


SPECS = ['semiar:2', 'blocks:3', 'nearl2r:1.5', 'nearl2r:2.5', 'nearl2r:4', 'mix:0.3*l2r+0.2*semiar:2+0.5*nearl2r:2']


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


def test_edge_values_are_l2r_and_uniform():
    """semiar:1, nearl2r:0 and nearl2r:1 are L2R, drawn as the identity; semiar:K with K >= n draws exactly
    random_orders' orders; nearl2r:W tends to uniform as W grows (exact law within 1e-4 in total variation
    at W = 10^5, and the draws pass); mix:0.1*l2r+0.9*random draws exactly train.py's l2r_frac=0.1 orders."""
    n, ident = 6, torch.arange(6).expand(500, 6)
    for spec in ('semiar:1', 'nearl2r:0', 'nearl2r:1', 'l2r', 'mix:0.4*semiar:1+0.6*nearl2r:0.5'):
        assert torch.equal(draw_orders(spec, 500, n, generator=gen()), ident), spec
    for spec in (f'semiar:{n}', 'semiar:100', 'blocks:6', 'random'):
        assert torch.equal(draw_orders(spec, 500, n, generator=gen(1)), random_orders(500, n, generator=gen(1)))
    assert torch.equal(draw_orders('mix:0.1*l2r+0.9*random', 4000, n, generator=gen(2)),
                       random_orders(4000, n, generator=gen(2), l2r_frac=0.1))
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
    ('sideways', "unknown order 'sideways'"), ('semiar:0', "semiar:K takes an integer K >= 1, not '0'"),
    ('semiar:2.5', "semiar:K takes an integer K >= 1"), ('nearl2r:-1', "nearl2r:W takes a number W >= 0"),
    ('nearl2r:inf', "nearl2r:W takes a number W >= 0"), ('mix:0.5*l2r+0.4*random', "sum to 0.9"),
    ('mix:l2r+random', "each part of a mix is weight*order"), ('mix:0.5*l2r+0.5*mix:1*random', "cannot hold a mix"),
    ('mix:0.5*l2r+0.5*sideways', "unknown order 'sideways' in 'mix:0.5*l2r+0.5*sideways'"),
])
def test_a_bad_spec_is_one_line_naming_the_grammar(bad, why):
    with pytest.raises(UserError) as e:
        parse_order(bad)
    assert why in e.value.msg and 'semiar:K' in e.value.msg and '\n' not in e.value.msg, e.value.msg


@pytest.mark.parametrize('spec', ['l2r', 'random', 'semiar:1', 'semiar:2', 'blocks:3', 'nearl2r:0.5', 'nearl2r:2.5',
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
    assert '\n' not in one_block('blocks:9', 4)
    for spec in ('semiar:7', 'random', 'l2r', 'nearl2r:100', 'mix:0.5*semiar:4+0.5*random'):
        assert one_block(spec, 8) is None, spec
