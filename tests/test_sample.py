"""generate.py, engine.py, genppl.py and sample.py: the cached any-order sampler against full forward passes and exact enumeration, the
Lemma-1 counts, L2R equivalence, infilling, the encoder sampler and its caching trick, top-p /
temperature / padding, generative perplexity against HF, and the CLI."""
import itertools
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
from helpers import tiny

import sample
from aogpt import engine, generate, genppl, samplers, speculative
from aogpt.checkpoint import load_checkpoint, save_checkpoint
from aogpt.errors import UserError
from aogpt.generate import generate_ao, generate_ar, generate_mdm, reveal_counts, sample_tokens, time_grid
from aogpt.samplers import EncoderPlan, Sampling
from aogpt.genppl import judge_nll, unigram_entropy
from sample import encode_template

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATOL = 1e-5


def sharp(model, scale=25.0):
    """Peaky, order-dependent conditionals, so wrong laws are far from right ones."""
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def gen(seed):
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- exact laws by enumeration

def probs_ref(logits, temperature=1.0, top_p=1.0, V=None):
    """Reference softmax + nucleus, written plainly (rows of a tiny vocab)."""
    logits = logits[..., :V].double()
    p = torch.softmax(logits / temperature, -1)
    if top_p < 1.0:
        out = torch.zeros_like(p)
        for idx in itertools.product(*[range(s) for s in p.shape[:-1]]):
            row = p[idx]
            mass = 0.0
            for j in sorted(range(row.numel()), key=lambda j: -row[j].item()):
                out[idx][j] = row[j]
                mass += row[j].item()
                if mass >= top_p:
                    break
        p = out / out.sum(-1, keepdim=True)
    return p


def ao_law(model, n, V, counts, orders=None, **kw):
    """P(x) of the any-order sampler with a fixed composition `counts`, over all V^n x: the average over
    the orders (all n! unless given) of the product of the conditionals, each query of a step seeing
    only earlier steps. Every conditional is read off a full uncached forward in an order where the
    query comes right after the context."""
    xs = torch.tensor(list(itertools.product(range(V), repeat=n)))  # (V^n, n)
    law = torch.zeros(len(xs), dtype=torch.float64)
    orders = list(itertools.permutations(range(n))) if orders is None else orders
    for sigma in orders:
        p, m = torch.ones(len(xs), dtype=torch.float64), 0
        for k in counts:
            for j in range(k):
                o = list(sigma[:m]) + [sigma[m + j]] + [s for s in sigma[m:] if s != sigma[m + j]]
                logits = model(xs, order=torch.tensor(o).expand(len(xs), n))[0][:, m]
                q = probs_ref(logits, V=V, **kw)
                p *= q.gather(1, xs[:, sigma[m + j]][:, None]).squeeze(1)
            m += k
        law += p / len(orders)
    return xs, law


def chi2_pvalue(samples, xs, law):
    """Pearson chi-square of the samples (N, n) against law over the cells xs; cells with tiny expected
    counts are pooled. Returns the p-value (regularised upper incomplete gamma)."""
    V = int(xs.max()) + 1
    code = lambda t: (t * (V ** torch.arange(t.size(1) - 1, -1, -1))).sum(1)
    obs = torch.bincount(code(samples), minlength=len(xs)).double()[code(xs)]
    exp = law * samples.size(0)
    small = exp < 5
    o = torch.cat([obs[~small], obs[small].sum()[None]])
    e = torch.cat([exp[~small], exp[small].sum()[None]])
    keep = e > 0
    stat = ((o[keep] - e[keep]) ** 2 / e[keep]).sum()
    df = int(keep.sum()) - 1
    return torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2).item()


@pytest.fixture(scope='module')
def ao3(backbone):
    # vocab 4 of which the sampler may use 3: id 3 plays a padded id that must never be drawn
    return sharp(tiny(**backbone, vocab_size=4, block_size=3, seed=3)).double()


def test_distribution_matches_exact_any_order_mixture(ao3):
    """T >> n: one token per step (the steps revealing nothing cost nothing), so the sample law is the
    exact any-order mixture E_sigma p_sigma(x) = sum_sigma p_sigma(x) / n!."""
    n, V, N = 3, 3, 20000
    x, st = generate_ao(ao3, n, N, 4000, Sampling(vocab_size=V, generator=gen(0)))
    assert st['forward_calls'] == n and x.max() < V  # this seed's Binomial draws: 1 + 1 + 1
    xs, law = ao_law(ao3, n, V, [1, 1, 1])
    assert abs(law.sum().item() - 1) < 1e-9
    assert chi2_pvalue(x, xs, law) > 1e-3
    # the test has power: the T = 1 law (every token from [None]) is a different distribution, rejected
    _, law1 = ao_law(ao3, n, V, [3])
    assert chi2_pvalue(x, xs, law1) < 1e-6


def test_parallel_steps_with_temperature_top_p_match_exact_law(ao3):
    """Fixed counts with T = 2: step 1 reveals 1 token, step 2 reveals 2 tokens in parallel, each from
    the same context. Temperature and top-p act on every conditional."""
    n, V, N = 3, 3, 20000
    kw = dict(temperature=0.8, top_p=0.9)
    assert reveal_counts(n, 2, fixed=True).tolist() == [1, 2]
    x, st = generate_ao(ao3, n, N, 2, Sampling(fixed_counts=True, vocab_size=V, generator=gen(1), **kw))
    assert st['forward_calls'] == 2
    xs, law = ao_law(ao3, n, V, [1, 2], **kw)
    assert chi2_pvalue(x, xs, law) > 1e-3
    _, wrong = ao_law(ao3, n, V, [1, 1, 1], **kw)
    assert chi2_pvalue(x, xs, wrong) < 1e-6


def test_one_step_draws_every_position_from_its_first_step_marginal(ao3):
    n, V, N = 3, 3, 20000
    x, st = generate_ao(ao3, n, N, 1, Sampling(vocab_size=V, generator=gen(2)))
    assert st['forward_calls'] == 1 and st['token_passes'] == n  # n copies of [None], nothing else
    xs = torch.tensor(list(itertools.product(range(V), repeat=n)))
    law = torch.ones(len(xs), dtype=torch.float64)
    for i in range(n):  # p(x_i | nothing): slot 0 of any order that starts at position i
        o = torch.tensor([i] + [j for j in range(n) if j != i])[None]
        q = torch.softmax(ao3(xs[:1], order=o)[0][0, 0, :V].double(), -1)
        law *= q[xs[:, i]]
    assert chi2_pvalue(x, xs, law) > 1e-3
    _, mix = ao_law(ao3, n, V, [1, 1, 1])
    assert chi2_pvalue(x, xs, mix) < 1e-6


# --------------------------------------------------------------------------- semi-AR and confidence orders

def test_blocks_order_matches_the_mixture_over_its_orders(backbone):
    """semiar:2 on n = 4: blocks {0,1} then {2,3}, a uniform order inside each. The law of whole
    sequences is the mixture over exactly those 2! x 2! orders: neither L2R alone nor all 4! orders."""
    model = sharp(tiny(**backbone, vocab_size=4, block_size=4, seed=4)).double()
    n, V, N = 4, 3, 30000
    x, st = generate_ao(model, n, N, 4000, Sampling(vocab_size=V, generator=gen(6)), order='semiar:2')
    assert st['forward_calls'] == n
    assert all(set(o[:2]) == {0, 1} for o in st['order'].tolist()[:200])
    allowed = [a + b for a in itertools.permutations((0, 1)) for b in itertools.permutations((2, 3))]
    xs, law = ao_law(model, n, V, [1] * n, orders=allowed)
    assert chi2_pvalue(x, xs, law) > 1e-3
    _, everything = ao_law(model, n, V, [1] * n)
    _, l2r = ao_law(model, n, V, [1] * n, orders=[(0, 1, 2, 3)])
    assert chi2_pvalue(x, xs, everything) < 1e-6 and chi2_pvalue(x, xs, l2r) < 1e-6


def confident_without_cache(model, n, B, steps, score, given=None, generator=None, threshold=0.0, **kw):
    """Confidence decoding recomputed from scratch at every step (forward_queries over the context in
    reveal order: no cache), with generate_confident's draws. Returns (tokens, reveal order, each
    step's logits)."""
    from aogpt.generate import split_given
    gpos, gtok, free = split_given(given, n)
    counts = [] if threshold else [k for k in reveal_counts(free.numel(), steps, generator=generator).tolist() if k]
    tokens = torch.full((B, n), -1)
    tokens[:, gpos] = gtok
    order, seen = gpos.expand(B, -1).clone(), []
    for step in itertools.count():
        nm = n - order.size(1)
        if nm == 0:
            return tokens, order, seen
        masked = torch.ones(B, n, dtype=torch.bool).scatter_(1, order, False)
        qpos = torch.stack([row.nonzero().squeeze(1) for row in masked])          # (B, nm) ascending
        logits = model.forward_queries(tokens.gather(1, order), order, qpos)
        seen.append(logits)
        u = torch.rand(B, nm, dtype=torch.float64, generator=generator)
        cand, sure, top = sample_tokens(logits, u, score=score, **kw)
        k = max(1, int((top >= threshold).sum())) if threshold else counts[step]
        j = sure.topk(k, dim=1).indices
        tokens.scatter_(1, qpos.gather(1, j), cand.gather(1, j))
        order = torch.cat([order, qpos.gather(1, j)], 1)


@pytest.mark.parametrize('score,stepper', [('confidence', 'dynamic'), ('margin', 'static'), ('entropy', 'dynamic')])
def test_confidence_orders_on_the_cache_equal_a_cache_free_recomputation(score, stepper, monkeypatch, backbone):
    """The chosen tokens enter the cache in the chosen order and each step keeps the surest copy: every
    step's logits equal recomputing it from scratch, and so the tokens and positions, one for one."""
    model = sharp(tiny(**backbone, block_size=12, seed=5), 3.0).double()
    given = torch.full((12,), -1)
    given[[2, 7]] = torch.tensor([3, 5])
    real, seen = engine.SlotStepper.__call__, []

    def spy(self, *a):
        seen.append(real(self, *a))
        return seen[-1]
    monkeypatch.setattr(engine.SlotStepper, '__call__', spy)
    for T, giv in ((4, None), (5, given), (12, given)):
        seen.clear()
        x, st = generate.generate_confident(model, 12, 3, T, Sampling(generator=gen(T), top_p=0.9), score=score,
                                            given=giv, stepper=stepper)
        ref, order, ref_logits = confident_without_cache(model, 12, 3, T, score, given=giv, generator=gen(T),
                                                         top_p=0.9)
        assert torch.equal(x, ref) and torch.equal(st['order'], order) and len(seen) == len(ref_logits)
        for a, b in zip(seen, ref_logits):
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
        if giv is not None:
            assert (x[:, [2, 7]] == torch.tensor([3, 5])).all()
        # every step queries every masked position: more token-passes than the fixed orders' < 2n
        assert st['token_passes'] == sum(n_pending + (12 - m) for n_pending, m in _pending_and_revealed(st, giv))


def _pending_and_revealed(st, given):
    """(pending slots, tokens revealed) at each call of a confidence run, from its counts."""
    g = 0 if given is None else int((given >= 0).sum())
    out, pend, m = [], g, g
    for k in st['counts']:
        out.append((pend, m))
        pend, m = k - 1, m + k
    return out


@pytest.mark.parametrize('score', ['confidence', 'margin', 'entropy'])
def test_greedy_confidence_equals_brute_force(score, backbone):
    """Temperature 0, one token per step: at each step every masked position's distribution is read off
    a full forward pass in an order where it comes next; the surest position is revealed with its most
    likely token. Also with a threshold (several per step) against the same brute force."""
    model = sharp(tiny(**backbone, block_size=8, seed=6), 10.0).double()  # top probabilities 0.2-0.3 at the start
    n = 8
    x = torch.randint(0, 11, (1, n), generator=gen(0))

    def brute(threshold):
        seq, order = x.clone(), []
        while len(order) < n:
            rest = [i for i in range(n) if i not in order]
            rows = []
            for i in rest:
                o = torch.tensor(order + [i] + [j for j in rest if j != i])[None]
                p = torch.softmax(model(seq, order=o)[0][0, len(order), :11], -1)
                top2 = p.topk(2).values
                sure = {'confidence': top2[0], 'margin': top2[0] - top2[1], 'entropy': (p * p.log()).sum()}[score]
                rows.append((sure.item(), top2[0].item(), i, p.argmax().item()))
            rows.sort(reverse=True)
            take = [r for r in rows if threshold and r[1] >= threshold] or rows[:1]  # the surest, at least
            for _, _, i, t in take:
                seq[0, i] = t
                order.append(i)
        return seq, order

    for threshold in (0.0, 0.22):
        out, st = generate.generate_confident(  # a threshold replaces the counts: no steps, no fixed_counts
            model, n, 1, None if threshold else n, Sampling(fixed_counts=not threshold, temperature=0, vocab_size=11,
                                                            threshold=threshold, generator=gen(1)), score=score)
        ref, order = brute(threshold)
        assert torch.equal(out, ref) and st['order'][0].tolist() == order
        if threshold:
            assert st['forward_calls'] < n  # some steps did reveal several positions


def test_threshold_decodes_each_sample_on_its_own():
    model = sharp(tiny(block_size=10, seed=7), 3.0)
    x, st = generate.generate_confident(model, 10, 3, None, Sampling(threshold=0.5, generator=gen(3)))
    g = gen(3)
    ones = [generate.generate_confident(model, 10, 1, None, Sampling(threshold=0.5, generator=g))[0]
            for _ in range(3)]
    assert torch.equal(x, torch.cat(ones)) and len(st['counts']) == 3
    assert st['forward_calls'] == sum(len(c) for c in st['counts']) / 3


def test_threshold_decoding_keeps_one_batch_1_stepper(monkeypatch):
    """With a threshold each sample is decoded alone; every sample of every batch runs on one batch-1
    stepper kept beside the caller's, so a cuda_graph stepper captures its graphs once, not once per
    sample. Same samples as the default path."""
    model = sharp(tiny(block_size=10, seed=7), 3.0)
    refs = [generate.generate_confident(model, 10, 3, None, Sampling(threshold=0.5, generator=gen(s)))[0]
            for s in (1, 2)]
    made, real_init = [], engine.SlotStepper.__init__

    def counting(self, model, batch_size, *a, **k):
        made.append(batch_size)
        real_init(self, model, batch_size, *a, **k)
    monkeypatch.setattr(engine.SlotStepper, '__init__', counting)
    st = engine.SlotStepper(model, 3, 'static')
    for s, ref in zip((1, 2), refs):  # two batches, as sample.py --num_batches 2 runs them
        x, _ = generate.generate_confident(model, 10, 3, None, Sampling(threshold=0.5, generator=gen(s)),
                                           stepper=st)
        assert torch.equal(x, ref)
    assert made == [3, 1] and st.for_batch(1) is st.for_batch(1).for_batch(1)


@pytest.mark.parametrize('order', ['random', 'l2r', 'semiar:3', 'confidence', 'margin'])
def test_infilling_works_with_every_order(order, backbone):
    model = tiny(**backbone, block_size=12, seed=8)
    given = torch.full((12,), -1)
    given[[0, 5, 11]] = torch.tensor([4, 9, 1])
    s = Sampling(generator=gen(0))
    x, st = generate.generate_confident(model, 12, 3, 5, s, score=order, given=given) if order in samplers.SCORES \
        else generate_ao(model, 12, 3, 5, s, order=order, given=given)
    assert (x[:, [0, 5, 11]] == torch.tensor([4, 9, 1])).all() and (x >= 0).all()
    assert st['order'][:, :3].tolist() == [[0, 5, 11]] * 3  # the given tokens enter first
    if order == 'semiar:3':  # free positions block by block: {1, 2}, {3, 4}, {6, 7, 8}, {9, 10}
        assert all(sorted(o[3:5]) == [1, 2] and sorted(o[7:10]) == [6, 7, 8] for o in st['order'].tolist())


@pytest.mark.parametrize('spec', ['blocks:0', 'blocks:', 'blocks:x', 'sideways', 'confident'])
def test_a_bad_order_spec_is_one_clear_error(spec):
    with pytest.raises(ValueError, match='an order is random, l2r, semiar:K'):
        generate_ao(tiny(), 8, 2, 4, order=spec)
    with pytest.raises(ValueError, match="the ao sampler does not read threshold=0.5: it is the confidence samplers'"):
        generate_ao(tiny(), 8, 2, 4, Sampling(threshold=0.5), order='random')


@pytest.mark.parametrize('score', ['confidence', 'margin'])
def test_a_confidence_rule_is_a_sampler_not_an_order(score):
    """The confidence rules pick positions from the drawn values: they are samplers of their own (a row of
    samplers.SAMPLERS, generate_confident), never an "order" beside the order distributions and permutations."""
    for call in (lambda: generate_ao(tiny(), 8, 2, 4, order=score), lambda: generate.check_order(score),
                 lambda: speculative.generate_speculative(tiny(), 8, 2, order=score)):
        with pytest.raises(UserError, match=f"'{score}' is a sampler of its own") as e:
            call()
        assert '\n' not in str(e.value)
    assert score in samplers.SAMPLERS and "threshold" in samplers.SAMPLERS[score].reads


def test_a_threshold_replaces_the_counts_so_a_count_setting_beside_it_is_refused():
    """With a threshold a confidence sampler reveals every position whose top probability reaches it: steps,
    schedule and fixed_counts have no use there (sample.py once recorded them and drew the same samples)."""
    model = tiny()
    for steps, kw, name in ((4, {}, 'steps'), (None, dict(schedule='cosine'), 'schedule'),
                            (None, dict(fixed_counts=True), 'fixed_counts')):
        with pytest.raises(UserError, match=f"the confidence sampler does not read {name}=.*with threshold 0.5"):
            generate.generate_confident(model, 8, 2, steps, Sampling(threshold=0.5, **kw))
    x, _ = generate.generate_confident(model, 8, 2, None, Sampling(threshold=0.5))
    assert x.shape == (2, 8)


@pytest.mark.parametrize('bad', [dict(temperature=-1), dict(temperature=float('nan')), dict(top_p=0.0),
                                 dict(top_p=1.5), dict(vocab_size=0), dict(generator=7), dict(schedule='cos'),
                                 dict(fixed_counts='yes'), dict(threshold=1.5), dict(until=-1)])
def test_a_bad_setting_is_one_line_when_the_settings_are_made(bad):
    """Every setting is checked once, where the settings object is made, by the rules sample.py's flags
    are checked by too: one line naming the setting and what a valid one is."""
    (name, value), = bad.items()
    with pytest.raises(UserError, match=f"^invalid {name}=") as e:
        Sampling(**bad)
    assert '\n' not in str(e.value) and samplers.RULES[name][1] in str(e.value)
    assert samplers.Sampling.invalid(**bad) == (name, samplers.RULES[name][1])
    Sampling(**{name: getattr(Sampling(), name)})  # the default is valid


def test_samplers_take_their_settings_as_objects_not_loose_keywords():
    """A sampler's settings travel whole (Sampling; the speculative sampler's Speculation, the encoder's
    EncoderPlan), so a new setting is a field of one checked object, not a keyword forwarded by hand through
    every caller: a sampler takes its sizes, those objects, what it samples along (order, score) and from
    (given, prompt), and its stepper."""
    import inspect
    allowed = {'model', 'n', 'batch_size', 'steps', 'settings', 'speculation', 'plan', 'order', 'score', 'given',
               'prompt', 'stepper'}
    for f in (generate_ao, generate.generate_confident, generate_ar, generate_mdm, speculative.generate_speculative):
        params = inspect.signature(f).parameters
        assert set(params) <= allowed and len(params) <= 9, (f.__name__, set(params) - allowed)


@pytest.mark.parametrize('sampler, setting', [('ar', dict(schedule='cosine')), ('ar', dict(fixed_counts=True)),
                                              ('mdm', dict(until=2)), ('confidence', dict(until=2)),
                                              ('ao', dict(threshold=0.5)), ('speculative', dict(fixed_counts=True)),
                                              ('speculative', dict(threshold=0.5)),
                                              ('ao', dict(top_p=0.9, temperature=0))])
def test_a_sampler_refuses_a_setting_it_does_not_read_before_any_draw(sampler, setting):
    """One settings object serves every sampler, so a sampler can be handed a setting it has no use for:
    it refuses it (one line, before a single draw) rather than run as if it had used it."""
    model = dict(ar=tiny(cond='none'), mdm=tiny(causal=False, cond='none', vocab_size=12, mask_token_id=11)).get(
        sampler, tiny())
    run = dict(ao=lambda s: generate_ao(model, 8, 2, 4, s), ar=lambda s: generate_ar(model, 8, 2, s),
               confidence=lambda s: generate.generate_confident(model, 8, 2, 4, s, score='confidence'),
               mdm=lambda s: generate_mdm(model, 8, 2, 4, s),
               speculative=lambda s: speculative.generate_speculative(model, 8, 2, s))[sampler]
    g = gen(0)
    with pytest.raises(UserError, match=f"the {sampler} sampler does not read {next(iter(setting))}=") as e:
        run(Sampling(generator=g, **setting))
    assert '\n' not in str(e.value) and torch.equal(g.get_state(), gen(0).get_state())
    x, _ = run(Sampling(generator=g))  # the same call at the default runs
    assert x.shape == (2, 8)
    with pytest.raises(UserError, match='settings must be a samplers.Sampling'):
        run(dict(temperature=0.5))


# --------------------------------------------------------------------------- the cache, step by step

@pytest.mark.parametrize('cond', ['adaln', 'sigma'])
def test_step_logits_equal_full_forward(cond, monkeypatch, backbone):
    """Every step's logits equal a full uncached forward on the same order and context, with given
    tokens entering first and Binomial counts (several tokens per step)."""
    model = tiny(**backbone, cond=cond, seed=1)
    B, n = 2, 8
    given = torch.tensor([4, -1, -1, 7, -1, -1, -1, 2])
    calls = []
    real = model.forward_slots

    def spy(tok, pos, tgt, **kw):
        out = real(tok, pos, tgt, **kw)
        if kw.get('kv') is not None:  # the sampler's calls, not the reference forwards below
            calls.append((tok.size(1), tgt[:, -kw['n_logits']:].clone(), out.clone()))
        return out
    monkeypatch.setattr(model, 'forward_slots', spy)
    x, st = generate_ao(model, n, B, 5, Sampling(generator=gen(3)), given=given)
    order = st['order']
    assert order[:, :3].tolist() == [[0, 3, 7]] * B  # given tokens first, ascending
    assert len(calls) == st['forward_calls'] >= 2 and sum(r for r, _, _ in calls) == st['token_passes']
    assert st['token_passes'] <= 2 * n
    m = 3
    for r, tgt, logits in calls:
        k = logits.size(1)
        assert torch.equal(tgt, order[:, m:m + k])
        for j in range(k):
            o = torch.cat([order[:, :m], order[:, m + j:m + j + 1], order[:, m:m + j], order[:, m + j + 1:]], 1)
            torch.testing.assert_close(logits[:, j], model(x, order=o)[0][:, m], atol=ATOL, rtol=0)
        m += k
    assert m == n


def test_token_passes_about_2n_for_any_T():
    model = tiny(block_size=64, seed=2)
    n = 64
    for T in [1, 4, 16, 64, 512]:
        _, st = generate_ao(model, n, 2, T, Sampling(generator=gen(T)))
        ks = st['counts']
        assert sum(ks) == n and len(ks) == st['forward_calls'] and min(ks) >= 1
        # every token is a query once (n) and then, except the last step's, context once
        assert st['token_passes'] == n + sum(k - 1 for k in ks[:-1]) <= 2 * n


# --------------------------------------------------------------------------- fixed shapes (CUDA graphs)

def run_steppers(monkeypatch, fn, modes=('dynamic', 'static')):
    """fn(stepper) under each mode; per mode, the result and each call's (r, L, S, logits, span): S the
    cache's slots, span those a fixed-shape call attends over."""
    real, out = engine.SlotStepper.__call__, {}
    for mode in modes:
        calls = []

        def spy(self, tok, pos, tgt, k):
            L, S = self.cache.len, self.cache.shape[2]
            span = self.span_for(L, self.rows_for(tok.size(1)), S, self.kv_bucket)
            logits = real(self, tok, pos, tgt, k)
            calls.append((tok.size(1), L, S, logits.clone(), span))
            return logits
        monkeypatch.setattr(engine.SlotStepper, '__call__', spy)
        out[mode] = fn(mode), calls
    return out


def stepper(model, B, mode, kv_bucket=16):
    """A mode name for 'dynamic', else a SlotStepper with kv_bucket-slot spans (16: several per tiny run)."""
    return mode if mode == 'dynamic' else engine.SlotStepper(model, B, mode, kv_bucket=kv_bucket)


@pytest.mark.parametrize('kv_bucket', [0, 16])
@pytest.mark.parametrize('kw', [dict(cond='adaln'), dict(cond='adaln', adaln_table=True), dict(cond='sigma')])
def test_static_stepper_equals_dynamic_call_for_call(kw, kv_bucket, monkeypatch, backbone):
    """The fixed-shape path that a CUDA graph replays (rows padded by SlotStepper.rows_for, attention over
    the zeroed cache up to a span under a mask, padding rows past the buffer sharing its scratch row)
    gives the dynamic path's logits at every call, and so the same samples; with the whole cache as the
    span (kv_bucket 0) and with 16-slot buckets (spans 16, 32, 48 here)."""
    model = sharp(tiny(**backbone, block_size=40, seed=8, **kw), 3.0)
    n, B = 40, 3
    given = torch.full((n,), -1)
    given[[0, 5, 17]] = torch.tensor([4, 9, 1])
    spans = set()
    # T = 1 without given tokens: one call of 40 copies of [None], padded to 48 rows, and nothing cached
    # for the padding rows to see but slot 0
    for T, fixed, giv in ((2, True, given), (7, False, given), (40, False, given), (1, False, None)):
        res = run_steppers(monkeypatch, lambda mode: generate_ao(
            model, n, B, T, Sampling(fixed_counts=fixed, top_p=0.9, generator=gen(T)), given=giv,
            stepper=stepper(model, B, mode, kv_bucket))[0])
        (xd, cd), (xs, cs) = res['dynamic'], res['static']
        assert torch.equal(xd, xs) and len(cd) == len(cs)
        for (r, L, _, ld, _), (r2, L2, S, ls, span) in zip(cd, cs):
            assert (r, L) == (r2, L2) and L + r <= span <= S
            torch.testing.assert_close(ls, ld, atol=ATOL, rtol=0)
            spans.add(span)
        if T == 2:  # the second call's padding runs past the buffer: L + R > S
            r, L, S, _, _ = cs[1]
            assert L + engine.SlotStepper.rows_for(r) > S
    assert spans == ({48} if kv_bucket == 0 else {16, 32, 48})


def test_static_stepper_for_l2r_decoding(monkeypatch, backbone):
    model = sharp(tiny(**backbone, cond='none', block_size=24, seed=9), 3.0)
    res = run_steppers(monkeypatch, lambda mode: generate_ar(model, 24, 2, Sampling(generator=gen(2)),
                                                             prompt=[3, 1, 4], stepper=stepper(model, 2, mode))[0])
    (xd, cd), (xs, cs) = res['dynamic'], res['static']
    assert torch.equal(xd, xs) and len(cd) == len(cs) == 21
    for (_, _, _, ld, _), (_, _, _, ls, _) in zip(cd, cs):
        torch.testing.assert_close(ls, ld, atol=ATOL, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='CUDA graphs need a GPU (bench/gpu_suite.sh graphs)')
@pytest.mark.parametrize('how', ['fp32', 'bf16_weights', 'autocast'])
def test_cuda_graph_stepper_equals_eager_on_gpu(how, monkeypatch, backbone):
    """Replayed graphs give the logits of the eager fixed-shape path (the same kernels), and both those
    of the dynamic path, for several Ts (new shapes keep being captured mid-run) and for L2R decoding."""
    from contextlib import nullcontext
    model = sharp(tiny(**backbone, block_size=40, seed=8), 3.0).to('cuda', torch.bfloat16 if how == 'bf16_weights'
                                                                   else None)
    ctx = torch.autocast('cuda', dtype=torch.bfloat16) if how == 'autocast' else nullcontext()
    tol = ATOL if how == 'fp32' else 3e-2
    modes = ('dynamic', 'static', 'cuda_graph')
    with ctx:
        runs = [run_steppers(monkeypatch, lambda mode: generate_ao(model, 40, 3, T, Sampling(generator=gen(T)),
                                                                   stepper=stepper(model, 3, mode))[0], modes)
                for T in (1, 2, 7, 40)]
        runs.append(run_steppers(monkeypatch, lambda mode: generate_ar(model, 40, 3, Sampling(generator=gen(0)),
                                                                       prompt=[1, 2],
                                                                       stepper=stepper(model, 3, mode))[0], modes))
    for res in runs:
        (xd, cd), (xs, cs), (xg, cg) = (res[m] for m in modes)
        assert len(cd) == len(cs) == len(cg)
        for (_, _, _, ld, _), (_, _, _, ls, _), (_, _, _, lg, _) in zip(cd, cs, cg):
            torch.testing.assert_close(lg, ls, atol=1e-6 if how == 'fp32' else 1e-2, rtol=0)
            torch.testing.assert_close(ls.float(), ld.float(), atol=tol, rtol=0)
        if how == 'fp32':
            assert torch.equal(xg, xs) and torch.equal(xs, xd)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a GPU (bench/gpu_suite.sh graphs)')
def test_bf16_logits_are_drawn_in_float64_on_gpu(monkeypatch):
    """On the GPU, as on the CPU, tokens are drawn in float64 from the model's bf16 logits: every draw of a
    graphed bf16 sampling run equals the CPU's draw from the same logits and uniforms."""
    model = sharp(tiny(block_size=40, seed=8), 3.0).to('cuda', torch.bfloat16)
    real, seen = generate.sample_tokens, []

    def spy(logits, u, *a, **k):
        out = real(logits, u, *a, **k)
        seen.append((logits.cpu(), u.cpu(), out.cpu(), a, k))
        return out
    monkeypatch.setattr(generate, 'sample_tokens', spy)
    generate_ao(model, 40, 3, 7, Sampling(top_p=0.9, generator=gen(7)), stepper='cuda_graph')
    assert seen
    for logits, u, out, a, k in seen:
        assert logits.dtype == torch.bfloat16 and u.dtype == torch.float64
        assert torch.equal(real(logits, u, *a, **k), out)


def test_a_stepper_serves_many_runs():
    """A reused stepper (how the CLI and the bench keep their CUDA graphs across batches) starts each run
    from an empty cache: the same samples as a fresh one, whatever ran before."""
    model = sharp(tiny(block_size=16, seed=3), 3.0)
    st = engine.SlotStepper(model, 2, 'static')
    for T in (16, 3, 5):
        fresh = generate_ao(model, 16, 2, T, Sampling(generator=gen(T)), stepper='static')[0]
        assert torch.equal(generate_ao(model, 16, 2, T, Sampling(generator=gen(T)), stepper=st)[0], fresh)
    assert torch.equal(generate_ar(model, 16, 2, Sampling(generator=gen(1)), stepper=st)[0],
                       generate_ar(model, 16, 2, Sampling(generator=gen(1)))[0])
    with pytest.raises(ValueError, match='another model or batch size'):
        generate_ao(model, 16, 3, 4, stepper=st)


def test_padded_row_counts():
    R = [engine.SlotStepper.rows_for(r) for r in range(1, 50)]
    assert sorted(set(R)) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    assert all(r <= R[r - 1] < 1.5 * r + 1 for r in range(1, 50))  # under half again as many rows


def test_stepper_bad_mode_and_cuda_graph_on_cpu_are_clear():
    model = tiny()
    with pytest.raises(ValueError, match='needs the model on a CUDA device'):
        generate_ao(model, 8, 2, 4, stepper='cuda_graph')
    with pytest.raises(ValueError, match='stepper must be one of'):
        generate_ar(model, 8, 2, stepper='graph')
    enc = tiny(causal=False, cond='none', vocab_size=12, mask_token_id=11)
    with pytest.raises(ValueError, match='needs the model on a CUDA device'):
        generate_mdm(enc, 8, 2, 4, stepper='cuda_graph')
    for bad in (-16, 24):
        with pytest.raises(ValueError, match='kv_bucket must be 0'):
            engine.SlotStepper(model, 2, 'static', kv_bucket=bad)


# --------------------------------------------------------------------------- counts

@pytest.mark.parametrize('schedule', ['linear', 'cosine'])
def test_binomial_counts_have_the_lemma_mean_and_variance(schedule):
    n, T, R = 40, 8, 4000
    g = gen(5)
    k = torch.stack([reveal_counts(n, T, schedule, generator=g) for _ in range(R)]).double()  # (R, T)
    assert (k.sum(1) == n).all()
    t = time_grid(T, schedule)
    mean = n * (t[:-1] - t[1:])                       # E k_i = n (t_i - t_{i+1})
    se = (n * (t[:-1] - t[1:]) * (1 - t[:-1] + t[1:])).sqrt() / math.sqrt(R)
    assert ((k.mean(0) - mean).abs() <= 4 * se + 1e-9).all()
    # step 2 given step 1: Binomial(n - k_1, 1 - t_2 / t_1)
    q = 1 - t[2] / t[1]
    cond_mean = ((n - k[:, 0]) * q).mean()
    assert abs(k[:, 1].mean() - cond_mean) < 4 * k[:, 1].std() / math.sqrt(R)
    p1 = 1 - t[1]
    assert abs(k[:, 0].var() / (n * p1 * (1 - p1)) - 1) < 0.1


def test_fixed_counts_are_the_paper_code_formula():
    n, T = 10, 4
    cum = [0]
    for ti in time_grid(T).tolist()[1:]:
        cum.append(min(n, max(int(n * (1 - ti)), cum[-1] + 1)))
    assert reveal_counts(n, T, fixed=True).tolist() == [b - a for a, b in zip(cum, cum[1:])]
    assert reveal_counts(8, 8, fixed=True).tolist() == [1] * 8       # T = n: one per step
    assert reveal_counts(8, 20, fixed=True).tolist() == [1] * 8 + [0] * 12
    assert reveal_counts(7, 3, 'cosine', fixed=True).sum() == 7


# --------------------------------------------------------------------------- L2R equivalence

def uncached_l2r(model, n, B, seed, prompt=(), **kw):
    """The plainest decoding loop: a full forward of the prefix per token, no cache."""
    u = torch.rand(B, n, dtype=torch.float64, generator=gen(seed))
    x = torch.zeros(B, n, dtype=torch.long)
    x[:, :len(prompt)] = torch.tensor(list(prompt), dtype=torch.long)
    with torch.no_grad():
        for i in range(len(prompt), n):
            logits = model(x[:, :i + 1])[0][:, i]
            x[:, i] = sample_tokens(logits, u[:, i], **kw)
    return x


@pytest.mark.parametrize('prompt', [(), (3, 1, 4)])
def test_l2r_fixed_counts_equals_uncached_loop_token_for_token(prompt, backbone):
    model = sharp(tiny(**backbone, seed=4), 3.0).double()
    B, n = 4, 8
    kw = dict(temperature=0.9, top_p=0.95, vocab_size=10)
    ref = uncached_l2r(model, n, B, 7, prompt, **kw)
    given = torch.tensor(list(prompt) + [-1] * (n - len(prompt)))
    x, st = generate_ao(model, n, B, n - len(prompt), Sampling(fixed_counts=True, generator=gen(7), **kw),
                        order='l2r', given=given)
    assert st['forward_calls'] == n - len(prompt)
    assert torch.equal(x, ref)
    y, _ = generate_ar(model, n, B, Sampling(generator=gen(7), **kw), prompt=list(prompt))
    assert torch.equal(y, ref)
    assert not torch.equal(ref, uncached_l2r(model, n, B, 8, prompt, **kw))  # the seed matters


def test_generate_ar_for_a_gpt_equals_uncached_loop(backbone):
    model = sharp(tiny(**backbone, cond='none', seed=6), 3.0).double()
    ref = uncached_l2r(model, 8, 3, 11)
    x, st = generate_ar(model, 8, 3, Sampling(generator=gen(11)))
    assert torch.equal(x, ref) and st['token_passes'] == 8 and st['forward_calls'] == 8


def test_a_gpt_trained_on_a_fixed_order_decodes_along_it():
    """A GPT (cond='none') trained on one fixed order (train.py --cond=none --order=fixed:S) is never told which
    position comes next: generate_ar(order=) decodes along that order, token for token the plainest loop along
    it (no cache; each slot predicting the next position of the order), with a prompt at the order's first
    positions and the stop rule of a settled document; a distribution it cannot decode along is one line."""
    from aogpt.orders import parse_order
    model = sharp(tiny(cond='none', seed=6), 3.0).double()
    n, B = 8, 3
    perm = parse_order('fixed:3').permutation(n)
    u = torch.rand(B, n, dtype=torch.float64, generator=gen(11))
    ref = torch.zeros(B, n, dtype=torch.long)
    with torch.no_grad():
        for j in range(n):
            ref[:, perm[j]] = sample_tokens(model(ref, order=perm.expand(B, n))[0][:, j], u[:, j])
    for order in (perm, 'fixed:3'):
        x, st = generate_ar(model, n, B, Sampling(generator=gen(11)), order=order)
        assert torch.equal(x, ref) and torch.equal(st['order'][0], perm) and st['forward_calls'] == n
    assert not torch.equal(ref, generate_ar(model, n, B, Sampling(generator=gen(11)))[0])  # not the identity
    x, _ = generate_ar(model, n, B, Sampling(generator=gen(11)), order=perm, prompt=ref[0, perm[:2]].tolist())
    assert (x[:, perm[:2]] == ref[0, perm[:2]]).all()
    with pytest.raises(UserError, match="generate_ar decodes along one fixed order"):
        generate_ar(model, n, B, order='semiar:2')


def test_sample_py_samples_a_fixed_order_gpt_along_its_saved_order(tmp_path, cli):
    """sample.py once sampled a GPT trained on fixed:3 along the identity without a word (and refused --order
    fixed:3). It decodes along the checkpoint's order now, and refuses in one line what would not be that order."""
    from aogpt.checkpoint import load_model
    from aogpt.orders import parse_order
    write_ckpt(tmp_path / 'ckpt.pt', cond='none', seed=2)
    ck = load_checkpoint(str(tmp_path / 'ckpt.pt'))
    perm = parse_order('fixed:3').permutation(16)
    save_checkpoint(dict(ck, config={'dataset': 'no-such-dataset', 'order': 'fixed:3'}, order=perm),
                    str(tmp_path / 'ckpt.pt'))
    model = load_model(str(tmp_path / 'ckpt.pt'), 'cpu')[0]
    want = generate_ar(model, 16, 2, Sampling(vocab_size=50257, generator=gen(1)), order=perm)[0]
    for order in ([], ['--order', 'fixed:3']):
        code, out, err = cli('--ckpt', str(tmp_path / 'ckpt.pt'), '--batch_size', '2', *order,
                             '--save', str(tmp_path / 's.json'))
        assert code == 0, err
        assert json.load(open(tmp_path / 's.json'))['samples'] == want.tolist() and 'fixed:3' in out
    for args, says in ((['--order', 'l2r'], '--order l2r: this GPT'), (['--length', '8'], 'whole windows only'),
                       (['--prompt', 'Hi'], "given tokens must sit at that order's first positions")):
        code, out, err = cli('--ckpt', str(tmp_path / 'ckpt.pt'), *args)
        assert code == 1 and len(err.strip().splitlines()) == 1 and says in err, err


def test_encoder_plan_is_checked_once_and_refuses_what_it_cannot_draw():
    """The encoder's own settings: a bad value is refused when the EncoderPlan is made, a plan of another type
    and MDLM's per-position counts with an order or fixed counts (whose per-position times they cannot keep)
    before any pass."""
    enc = tiny(causal=False, cond='none', vocab_size=12, mask_token_id=11, seed=7)
    for bad, needle in ((dict(counts='per_sample'), "counts must be 'shared' or 'independent'"),
                        (dict(cache_trick=1), 'cache_trick must be True or False')):
        with pytest.raises(ValueError, match=needle):
            EncoderPlan(**bad)
    with pytest.raises(ValueError, match='plan must be a samplers.EncoderPlan'):
        generate_mdm(enc, 8, 2, 4, plan=dict(counts='independent'))
    for kw in (dict(order='l2r'), dict(settings=Sampling(fixed_counts=True))):
        with pytest.raises(ValueError, match='per-position reveal times'):
            generate_mdm(enc, 8, 2, 4, plan=EncoderPlan('independent'), **kw)


# --------------------------------------------------------------------------- infilling

def test_infilling_keeps_given_tokens():
    n = 8
    given = torch.tensor([5, 6, -1, 1, -1, -1, 9, 9])
    ao = tiny(seed=7)
    enc = tiny(causal=False, cond='none', vocab_size=12, mask_token_id=11, seed=7)
    for x, st in [generate_ao(ao, n, 5, 3, Sampling(generator=gen(0)), given=given),
                  generate_ao(ao, n, 5, 3, Sampling(generator=gen(0)), order='l2r', given=given),
                  generate_mdm(enc, n, 5, 3, Sampling(generator=gen(0)), given=given),
                  generate_mdm(enc, n, 5, 3, Sampling(generator=gen(0)), given=given,
                               plan=EncoderPlan('independent'))]:
        keep = given >= 0
        assert (x[:, keep] == given[keep]).all()
        assert (x >= 0).all() and (x < 11).all()
        assert st['tokens_generated'] == 3
    # a random order of the free positions after the given ones; l2r: ascending
    _, st = generate_ao(ao, n, 3, 3, Sampling(generator=gen(0)), order='l2r', given=given)
    assert st['order'][0].tolist() == [0, 1, 3, 6, 7, 2, 4, 5]
    with pytest.raises(ValueError):
        generate_ao(ao, n, 1, 3, Sampling(generator=gen(0)), given=torch.arange(n))


def test_encode_template():
    from aogpt.tokenizer import char_codec, gpt2_codec
    cc = char_codec(list("abc xyz"))
    ids = encode_template("ab [BLANK:2] c [BLANK]x", cc, blank_len=3)
    assert ids == cc.encode("ab") + [-1] * 2 + cc.encode(" c") + [-1] * 3 + cc.encode("x")
    g = gpt2_codec()
    ids = encode_template("The [BLANK] sat on the [BLANK:3] mat.", g, blank_len=2)
    assert ids == g.encode("The") + [-1, -1] + g.encode(" sat on the") + [-1] * 3 + g.encode(" mat.")


# --------------------------------------------------------------------------- the encoder MDM sampler

@pytest.fixture(scope='module')
def enc3(backbone):
    # vocab 4 with [MASK] = 3: the sampler must never draw it even without a vocab_size cut.
    # All weights get noise so the conditionals depend strongly on the context.
    model = tiny(**backbone, causal=False, cond='none', vocab_size=4, mask_token_id=3, block_size=3, seed=8)
    g = gen(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return model.double()


def mdm_law(model, n, V, T=None):
    """P(x) of MDLM's per-position sampler with T linear steps: sum over the reveal steps a(p) of every
    position, prob prod_p (t_a - t_{a+1}), each token drawn from the encoder given the positions
    revealed at strictly earlier steps ([MASK] elsewhere). T=None: one position per step in a uniform
    random order (the encoder's any-order mixture)."""
    mask = model.config.mask_token_id
    xs = torch.tensor(list(itertools.product(range(V), repeat=n)))
    if T is None:
        plans = [(a, 1 / math.factorial(n)) for a in itertools.permutations(range(n))]
    else:
        t = time_grid(T)
        plans = [(a, math.prod((t[s] - t[s + 1]).item() for s in a)) for a in itertools.product(range(T), repeat=n)]
    law = torch.zeros(len(xs), dtype=torch.float64)
    for a, w in plans:
        p = torch.ones(len(xs), dtype=torch.float64)
        for i in range(n):
            inp = xs.clone()
            for j in range(n):
                if a[j] >= a[i]:
                    inp[:, j] = mask
            q = torch.softmax(model(inp)[0][:, i].double(), -1)
            p *= q.gather(1, xs[:, i:i + 1]).squeeze(1)
        law += w * p
    return xs, law


def test_encoder_sampler_matches_exact_law(enc3):
    n, V, N = 3, 3, 20000
    x, st = generate_mdm(enc3, n, N, 2, Sampling(generator=gen(4)), plan=EncoderPlan('independent', cache_trick=True))
    assert x.max() < V  # [MASK] never drawn
    xs, law = mdm_law(enc3, n, V, 2)
    assert abs(law.sum().item() - 1) < 1e-9
    assert chi2_pvalue(x, xs, law) > 1e-3
    _, wrong = mdm_law(enc3, n, V, 1)  # everything from the all-[MASK] input: rejected
    assert chi2_pvalue(x, xs, wrong) < 1e-6
    # shared counts, T = n fixed: one token per step in a random order, i.e. the any-order mixture
    x, _ = generate_mdm(enc3, n, N, n, Sampling(fixed_counts=True, generator=gen(6)))
    _, law_n = mdm_law(enc3, n, V)
    assert chi2_pvalue(x, xs, law_n) > 1e-3


@pytest.mark.parametrize('counts', ['shared', 'independent'])
def test_encoder_cache_trick_gives_identical_samples_with_fewer_passes(counts, backbone):
    enc = tiny(**backbone, causal=False, cond='none', vocab_size=12, mask_token_id=11, seed=9)
    given = torch.tensor([3, -1, -1, -1, -1, -1, -1, -1])
    a, sa = generate_mdm(enc, 8, 6, 64, Sampling(vocab_size=11, generator=gen(1)), given=given,
                         plan=EncoderPlan(counts, cache_trick=False))
    b, sb = generate_mdm(enc, 8, 6, 64, Sampling(vocab_size=11, generator=gen(1)), given=given,
                         plan=EncoderPlan(counts, cache_trick=True))
    assert torch.equal(a, b)
    assert sa['forward_calls'] == 64 and sb['forward_calls'] < 64
    assert sb['token_passes'] == 8 * sb['forward_calls']


@pytest.mark.parametrize('mode', ['static', 'cuda_graph'])
def test_encoder_stepper_gives_the_eager_samples(mode, backbone):
    """The encoder's fixed input buffer ('static'; 'cuda_graph' replays the same pass) gives the samples
    of the plain pass, with and without the cache trick, and one stepper serves many runs."""
    if mode == 'cuda_graph' and not torch.cuda.is_available():
        pytest.skip('CUDA graphs need a GPU (bench/gpu_suite.sh graphs)')
    dev = 'cuda' if mode == 'cuda_graph' else 'cpu'
    enc = sharp(tiny(**backbone, causal=False, cond='none', vocab_size=12, mask_token_id=11, seed=9), 3.0).to(dev)
    st = engine.EncoderStepper(enc, 6, 8, mode)
    for T, trick in ((64, True), (5, False), (3, True)):
        kw = dict(plan=EncoderPlan(cache_trick=trick), given=torch.tensor([3, -1, -1, -1, -1, -1, -1, -1]))
        a, sa = generate_mdm(enc, 8, 6, T, Sampling(vocab_size=11, generator=gen(T)), **kw)
        b, sb = generate_mdm(enc, 8, 6, T, Sampling(vocab_size=11, generator=gen(T)), stepper=st, **kw)
        assert torch.equal(a, b) and sa['forward_calls'] == sb['forward_calls']
    with pytest.raises(ValueError, match='another model or shape'):
        generate_mdm(enc, 8, 5, steps=4, stepper=st)


def test_encoder_head_on_rows_equals_full_forward(backbone):
    enc = tiny(**backbone, causal=False, cond='none', vocab_size=12, mask_token_id=11, seed=10)
    x = torch.randint(0, 12, (2, 8))
    with torch.no_grad():
        full = enc(x)[0]
        h = enc.encoder_hidden(x)
        rows = enc.lm_head(h[torch.tensor([0, 1, 1]), torch.tensor([2, 0, 7])])
    torch.testing.assert_close(rows[:, :11], full[[0, 1, 1], [2, 0, 7]][:, :11], atol=ATOL, rtol=0)


def test_shared_plan_couples_ao_and_mdm():
    """Same seed, same plan: the encoder reveals the same positions in the same order as generate_ao."""
    ao = tiny(seed=11)
    enc = tiny(causal=False, cond='none', vocab_size=12, mask_token_id=11, seed=11)
    _, s1 = generate_ao(ao, 8, 3, 4, Sampling(generator=gen(2)))
    _, s2 = generate_mdm(enc, 8, 3, 4, Sampling(generator=gen(2)))
    assert torch.equal(s1['order'], s2['order'])


# --------------------------------------------------------------------------- top-p, temperature, padding

@pytest.mark.parametrize('temperature,top_p', [(1.0, 1.0), (0.5, 1.0), (1.0, 0.6), (1.7, 0.85)])
def test_sample_tokens_follows_the_transformed_distribution(temperature, top_p):
    logits = torch.tensor([1.0, 2.5, 0.2, 2.0, -1.0, 9.0, 9.0])  # ids 5, 6: padding with large logits
    N = 20000
    u = (torch.arange(N, dtype=torch.float64) + 0.5) / N  # a uniform grid: counts are N p up to rounding
    x = sample_tokens(logits.expand(N, -1), u, temperature, top_p, vocab_size=5)
    p = probs_ref(logits, temperature, top_p, V=5)
    counts = torch.bincount(x, minlength=7).double()
    assert counts[5:].sum() == 0
    assert ((counts[:5] - N * p).abs() <= 1).all(), (counts, N * p)
    # the numbers the speculative accept test reads for q and p are this same law
    torch.testing.assert_close(generate.logits_to_probs(logits, temperature, top_p, vocab_size=5), p, rtol=0, atol=1e-12)


@pytest.mark.parametrize('scale,size', [(6.0, 3), (2.0, 308), (0.5, 1559)])
def test_top_p_on_a_large_vocab(scale, size):
    """Nuclei inside the top 64, the top 1024 (the CPU shortcuts) and beyond (a full sort)."""
    V, N, top_p = 2000, 4000, 0.9
    logits = torch.randn(V, generator=gen(0)) * scale
    u = (torch.arange(N, dtype=torch.float64) + 0.5) / N
    x = sample_tokens(logits.expand(N, -1), u, top_p=top_p)
    p = probs_ref(logits, top_p=top_p)
    assert (p > 0).sum() == size  # the case this parameter covers
    assert ((torch.bincount(x, minlength=V).double() - N * p).abs() <= 1).all()


def test_sample_tokens_greedy_ban_and_shapes():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 1.0, 0.0]]).view(2, 1, 3)
    u = torch.rand(2, 1, dtype=torch.float64)
    assert sample_tokens(logits, u, temperature=0).tolist() == [[1], [0]]
    assert sample_tokens(logits, u, temperature=0, ban=1).tolist() == [[2], [0]]
    # u at the very top of [0, 1) never reaches a zero-probability id
    x = sample_tokens(torch.tensor([[0.0, -math.inf]]), torch.tensor([1 - 2 ** -53], dtype=torch.float64))
    assert x.tolist() == [0]
    with pytest.raises(ValueError):
        sample_tokens(logits, u, top_p=0.0)


# --------------------------------------------------------------------------- generative perplexity

def test_judge_nll_matches_hf_gpt2_both_modes(tmp_path):
    transformers = pytest.importorskip('transformers')
    from aogpt.families import load_hf
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=50257, n_positions=16)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path)
    judge = load_hf(str(tmp_path)).eval()
    x = torch.randint(0, 50256, (3, 16))
    with torch.no_grad():
        # hf mode: the raw 16 tokens, token 0 unscored (the paper code's recipe)
        ref = torch.stack([hf(x[i:i + 1], labels=x[i:i + 1]).loss for i in range(3)])
        torch.testing.assert_close(judge_nll(judge, x, 'hf', batch_size=2), ref, atol=1e-5, rtol=0)
        # none mode: all 15 tokens scored after [None] = <|endoftext|>
        y = x[:, :15]
        eot = torch.full((3, 1), 50256)
        logits = hf(torch.cat([eot, y], 1)).logits[:, :15]
        ref = torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction='none').mean(1)
        torch.testing.assert_close(judge_nll(judge, y, 'none'), ref, atol=1e-5, rtol=0)
        with pytest.raises(ValueError):
            judge_nll(judge, x, 'none')  # 16 tokens + [None] do not fit


def char_judge(block_size=16, seed=0):
    from aogpt.tokenizer import char_codec
    codec = char_codec('abc \n')
    return tiny(cond='none', vocab_size=5, block_size=block_size, seed=seed), codec


def test_generative_ppl_both_averages_against_direct_sums():
    """per_sequence: the mean of per-sample perplexities on the sample ids as drawn; token: one
    token-weighted perplexity of the samples cut after their first end of document, re-tokenized."""
    judge, codec = char_judge()
    samples = torch.tensor([[0, 1, 2, 4, 0, 0, 1, 3],     # 'abc\n' then more: cut after the newline
                            [3, 0, 3, 1, 3, 2, 3, 0],     # no newline: scored whole
                            [4, 1, 1, 1, 1, 1, 1, 1]])    # ends at once: one token
    r = genppl.generative_ppl(judge, codec, samples, codec, 'none', batch_size=2)
    with torch.no_grad():
        per = judge(samples, targets=samples, reduction='none')[1].double()          # (3, 8)
        assert r['per_sequence'] == pytest.approx(per.mean(1).exp().mean().item(), rel=1e-6)
        cuts = [samples[0, :4], samples[1], samples[2, :1]]
        tot = sum(judge(x[None], targets=x[None], reduction='none')[1].double().sum().item() for x in cuts)
    assert r['tokens_scored'] == 4 + 8 + 1 and r['ended_early'] == 2
    assert r['token'] == pytest.approx(math.exp(tot / 13), rel=1e-6)
    assert r['per_sequence_tokens'] == 'sample ids' and len(r['per_sample']) == 3
    assert r['unigram_entropy'] == pytest.approx(unigram_entropy(samples).mean().item())


def test_a_sequence_with_nothing_to_score_is_counted_never_dropped_unsaid():
    """In mode hf a sequence's first token is only context: a one-token document (here the empty ones, their
    end symbol alone) has no perplexity. It is left out of the per-sequence mean and named in `unscored`, once
    dropped without a word; where nothing at all is scored, one line (once torch.stack's 'non-empty TensorList')."""
    judge, codec = char_judge()
    docs = [[0, 1, 2, 4], [4], [3, 0, 3], [4]]             # 'abc\n', an empty document (its newline), 'cac', another
    r = genppl.generative_ppl(judge, codec, docs, codec, 'hf', per_document=True)
    per = genppl.judge_token_nll(judge, docs, 'hf')
    assert r['unscored'] == [1, 3] and len(r['per_sample']) == 2 and [len(t) for t in per] == [3, 0, 2, 0]
    assert r['per_sequence'] == pytest.approx((per[0].double().mean().exp() + per[2].double().mean().exp()).item() / 2,
                                              rel=1e-6)
    assert 'listed in unscored' in r['protocol']
    assert genppl.generative_ppl(judge, codec, torch.tensor([[0, 1, 2]]), codec, 'none')['unscored'] == []
    for samples in (torch.tensor([[0], [3]]), [[4], [4]]):
        with pytest.raises(UserError, match=r"^nothing to score: in mode 'hf' the first token of a sequence is only "
                                            r"context") as e:
            genppl.generative_ppl(judge, codec, samples, codec, 'hf', per_document=isinstance(samples, list))
        assert '\n' not in str(e.value)


def test_an_hf_judge_on_one_token_samples_is_refused_before_sampling(tmp_path, cli, monkeypatch):
    """sample.py --length 1 --gen_ppl <HF GPT-2 folder> once ended in a RuntimeError after the sampling: the HF
    recipe scores each token after the first, so a 1-token sample has nothing to score."""
    transformers = pytest.importorskip('transformers')
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50257,
                                                         n_positions=16)).save_pretrained(tmp_path / 'gpt2')
    write_ckpt(tmp_path / 'ckpt.pt')
    calls = []
    monkeypatch.setattr(generate, 'generate_ao', lambda *a, **k: calls.append(1))
    code, out, err = cli('--out_dir', str(tmp_path), '--length', '1', '--steps', '1', '--gen_ppl', str(tmp_path / 'gpt2'))
    err = err.strip().splitlines()[-1]  # after save_pretrained's progress bar
    assert code == 1 and err.startswith('error: --gen_ppl: ') and calls == [], err
    assert "--length 1 leaves nothing to score: use --length 2 or more" in err


def test_generative_ppl_re_tokenizes_for_another_codec_and_windows_long_text():
    """GPT-2 samples under a char-level judge: the text is re-tokenized into characters, and a sample
    longer than the judge's context is scored in consecutive windows, each from scratch."""
    from aogpt.tokenizer import gpt2_codec
    judge, codec = char_judge(block_size=8, seed=1)
    g2 = gpt2_codec()
    ids = g2.encode(' abc ab c abba cab')
    samples = torch.tensor([ids, ids[::-1]])
    r = genppl.generative_ppl(judge, codec, samples, g2, 'none')
    texts = [g2.decode(row) for row in samples.tolist()]
    with torch.no_grad():
        tot = n = 0
        for t in texts:
            x = torch.tensor(codec.encode(t))
            for a in range(0, len(x), 8):
                w = x[a:a + 8][None]
                tot += judge(w, targets=w, reduction='none')[1].double().sum().item()
            n += len(x)
    assert r['per_sequence_tokens'] == 're-tokenized' and r['tokens_scored'] == n
    assert r['token'] == pytest.approx(math.exp(tot / n), rel=1e-6)
    with pytest.raises(ValueError, match='cannot encode'):
        genppl.generative_ppl(judge, codec, torch.tensor([g2.encode('xyz')]), g2)


def test_unigram_entropy():
    x = torch.tensor([[1, 1, 1, 1], [0, 1, 2, 3], [5, 5, 6, 6]])
    torch.testing.assert_close(unigram_entropy(x), torch.tensor([0.0, math.log(4), math.log(2)],
                                                                dtype=torch.float64))


# --------------------------------------------------------------------------- the CLI

def write_ckpt(path, **kw):
    model = tiny(vocab_size=50304, block_size=16, **kw)
    ema = {'decay': 0.999, 'num_updates': 1, 'params': {k: v.clone() for k, v in model.named_parameters()}}
    save_checkpoint(dict(format='aogpt-v1', model_args=asdict(model.config), model=model.state_dict(),
                         ema=ema, config={'dataset': 'no-such-dataset'}, order=None), str(path))


def test_cli_generates_infills_and_scores(tmp_path, cli):
    write_ckpt(tmp_path / 'ao.pt', seed=1)
    write_ckpt(tmp_path / 'gpt.pt', cond='none', seed=2)
    code, out, err = cli('--ckpt', str(tmp_path / 'ao.pt'), '--template', 'The [BLANK:2] sat on the [BLANK] mat',
                         '--blank_len', '3', '--steps', '3', '--batch_size', '2', '--gen_ppl', str(tmp_path / 'gpt.pt'),
                         '--save', str(tmp_path / 's.json'))
    assert code == 0, err
    assert 'token-passes' in out and 'gen ppl' in out and 'EMA weights' in out
    res = json.load(open(tmp_path / 's.json'))
    from aogpt.tokenizer import gpt2_codec
    lay = encode_template('The [BLANK:2] sat on the [BLANK] mat', gpt2_codec(), 3)
    for row in res['samples']:
        assert len(row) == len(lay) and all(v == t for v, t in zip(row, lay) if t >= 0)
    assert len(res['gen_ppl']['per_sample']) == 2 and res['gen_ppl']['mode'] == 'none'
    # the GPT checkpoint samples left to right with a prompt
    code, out, err = cli('--ckpt', str(tmp_path / 'gpt.pt'), '--prompt', 'Hello', '--length', '6')
    assert code == 0, err
    assert 'L2R GPT' in out and out.count('---------- sample') == 4
    # the fixed-shape stepper gives the same samples as the default, for the decoders and the encoder
    write_ckpt(tmp_path / 'mdm.pt', cond='none', causal=False, seed=3)
    for ck in ('ao.pt', 'gpt.pt', 'mdm.pt'):
        for st in ('dynamic', 'static'):
            code, out, err = cli('--ckpt', str(tmp_path / ck), '--length', '9', *(['--steps', '4'] if ck != 'gpt.pt'
                                                                                  else []), '--stepper', st,
                                 '--save', str(tmp_path / f'{st}.json'))
            assert code == 0, err
        assert json.load(open(tmp_path / 'dynamic.json'))['samples'] == \
            json.load(open(tmp_path / 'static.json'))['samples']


@pytest.mark.parametrize('args,msg', [
    (['--prompt', 'word ' * 20], 'no room left'),
    (['--prompt', 'a b c', '--suffix', 'd e f', '--length', '6'], 'no room left'),
    (['--length', '17'], 'block_size'),
    (['--template', 'x ' * 20 + '[BLANK]'], 'too long'),
    (['--template', 'a [BLANK]', '--prompt', 'b'], 'either'),
    (['--order', 'nope.txt'], '--order nope.txt: no such file'),  # once "unknown order"
    (['--order', 'orders/x.npy'], '--order orders/x.npy: no such file'),
    (['--top_p', '0'], 'top_p'),
    (['--stpes', '3'], 'steps'),
    (['--stepper', 'cuda_graph'], 'needs a CUDA device'),
    (['--stepper', 'graphs'], 'stepper'),
    (['--blank_len', '0', '--template', 'a [BLANK] b'], 'invalid --blank_len=0'),
    (['--template', 'a [BLANK:-3] b'], '[BLANK:-3]: a blank is [BLANK] or [BLANK:k] with k >= 1'),
    (['--template', 'a [BLANK:-2]'], '[BLANK:-2]'),  # once kept as literal text, silently
    (['--template', 'a [BLANK:x] b'], '[BLANK:x]'),
    (['--template', 'a [BLANK b [BLANK]'], 'unclosed or malformed [BLANK'),
    (['--template', 'a [BLANK:0] b'], '[BLANK:0]'),
    # checked against the window before the blank's positions are made: an OverflowError and MemoryErrors once
    (['--template', 'a [BLANK:99999999999999999999] b'], "too long: [BLANK:99999999999999999999] takes it past the "
                                                         "model's block_size, 16 tokens"),
    (['--template', 'a [BLANK:9999999999] b'], "too long: [BLANK:9999999999] takes it past"),
    (['--template', 'a [BLANK] b', '--blank_len', '9999999999'], "too long: [BLANK] (--blank_len 9999999999)"),
    (['--template', 'a [BLANK:' + '9' * 5000 + ']'], "too long: [BLANK:999"),  # past int()'s 4300 digits too
    (['--device', 'cuda'], 'CUDA is not available'),
    (['--judge_batch_size', '0'], 'invalid --judge_batch_size=0'),
    (['--length', '-5'], 'invalid --length=-5'),
    (['--speculative', '²'], "invalid --speculative='²'"),  # a digit to isdigit, not to int(): a ValueError traceback
    (['--save', '/no/such/dir/s.json'], 'the folder /no/such/dir does not exist'),
    (['--save', '/tmp'], '--save /tmp is a folder: name a file in it'),
    (['--gen_ppl', '/no/such/judge'], 'checkpoint not found'),
    (['--top_p', '1.5'], 'invalid --top_p=1.5'),
    (['--temperature', '-1'], 'invalid --temperature=-1'),
    (['--use_ema', 'nope'], 'use_ema must be True or False'),
    (['--order', 'blocks:0'], "--order: order 'blocks:0': blocks:K is spelled semiar:K now (the same law); "
                              "semiar:K takes an integer K >= 1"),
    (['--order', 'blocks:4'], "--order: order 'blocks:4': blocks:K is spelled semiar:K now (the same law): use "
                              "'semiar:4'"),
    (['--order', 'fixedblocks:3:0', '--length', '8'], "--order: order fixedblocks:3:0: blocks of 3 do not divide the "
                                                      "length 8"),
    (['--order', 'sideways'], "--order: unknown order 'sideways': an order is random, l2r, semiar:K (K >= 1)"),
    (['--order', 'mix:0.5*l2r+0.6*random'], "the weights of a mix sum to 1, these sum to 1.1"),
    (['--order', 'nearl2r:-2', '--speculative', '4'], "nearl2r:W takes a number W >= 0"),
    (['--threshold', '0.5'], "--threshold is not used here: it is the confidence samplers'"),
    (['--order', 'confidence', '--threshold', '1.5'], 'invalid --threshold=1.5'),
])
def test_cli_bad_input_is_one_line(tmp_path, cli, args, msg):
    write_ckpt(tmp_path / 'ckpt.pt')
    code, out, err = cli('--out_dir', str(tmp_path), *args)
    assert code != 0
    assert err.strip().startswith('error:') and len(err.strip().splitlines()) == 1 and msg in err, err


def test_bad_destinations_and_judges_fail_before_any_sampling(tmp_path, cli, monkeypatch):
    """--save to a missing folder and a judge that cannot load once failed only after all the sampling."""
    write_ckpt(tmp_path / 'ckpt.pt')
    calls = []
    monkeypatch.setattr(generate, 'generate_ao', lambda *a, **k: calls.append(1))
    write_ckpt(tmp_path / 'mdm.pt', cond='none', causal=False)
    char = load_checkpoint(str(tmp_path / 'ckpt.pt'))
    char['codec'] = {'tokenizer': 'char', 'vocab_size': 3, 'chars': 'abc', 'eot': None}
    save_checkpoint(char, str(tmp_path / 'char.pt'))
    (tmp_path / 'afile').write_text('x')
    for bad, says in ((['--save', str(tmp_path / 'missing' / 's.json')], 'does not exist'),
                      (['--save', str(tmp_path)], 'is a folder'),
                      (['--trace', str(tmp_path / 'missing' / 't.html')], 'does not exist'),
                      (['--trace', str(tmp_path)], 'is a folder'),
                      (['--trace', str(tmp_path / 'afile' / 'sub' / 't.html')], 'afile is a file, so the folder'),
                      (['--gen_ppl', str(tmp_path / 'nojudge')], 'checkpoint not found'),
                      (['--gen_ppl', str(tmp_path / 'mdm.pt')], 'is an encoder MDM'),
                      (['--gen_ppl', str(tmp_path / 'char.pt')], 'reads 3 characters, and the samples are gpt2')):
        code, out, err = cli('--out_dir', str(tmp_path), *bad)
        assert code != 0 and len(err.strip().splitlines()) == 1 and says in err and calls == [], err


def test_a_judge_whose_data_codec_does_not_fit_it_is_refused(tmp_path, cli):
    """A judge checkpoint without a stored codec reads its ids by the codec of the data it names (checkpoint_codec).
    Where that codec cannot be the one it trained with (5 characters for a vocabulary of 50304 that train.py
    derived from its codec), the judge would score the samples' characters as ids of another vocabulary: one
    line, as load_model refuses such a model everywhere else, not a confident gen PPL."""
    data = tmp_path / 'chars5'
    data.mkdir()
    (data / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'chars': list('\n abc')}))
    write_ckpt(tmp_path / 'ckpt.pt')
    char = load_checkpoint(str(tmp_path / 'ckpt.pt'))
    char['codec'] = {'tokenizer': 'char', 'vocab_size': 5, 'chars': '\n abc', 'eot': None}  # the judge's data's
    save_checkpoint(char, str(tmp_path / 'char.pt'))
    write_ckpt(tmp_path / 'judge.pt', cond='none')
    judge = load_checkpoint(str(tmp_path / 'judge.pt'))
    judge['config'] = {'dataset': str(data), 'vocab_size': None}  # train.py's: the vocabulary from the codec
    save_checkpoint(judge, str(tmp_path / 'judge.pt'))
    code, out, err = cli('--ckpt', str(tmp_path / 'char.pt'), '--length', '8', '--batch_size', '2',
                         '--gen_ppl', str(tmp_path / 'judge.pt'))
    assert code != 0 and len(err.strip().splitlines()) == 1 and 'char codec has 5 symbols, far fewer' in err, err


@pytest.mark.parametrize('args, family, key', [
    (['--speculative', '3', '--steps', '8'], 'ao', 'steps'),
    (['--speculative', 'auto', '--schedule', 'cosine'], 'ao', 'schedule'),
    (['--speculative', '3', '--fixed_counts'], 'ao', 'fixed_counts'),
    (['--speculative', '3', '--mdm_counts', 'shared'], 'ao', 'mdm_counts'),
    (['--speculative', '3', '--threshold', '0.5'], 'ao', 'threshold'),
    (['--speculative', '3', '--cache_trick', 'True'], 'ao', 'cache_trick'),
    (['--mdm_counts', 'independent'], 'ao', 'mdm_counts'), (['--cache_trick', 'False'], 'ao', 'cache_trick'),
    (['--fused', 'True'], 'ao', 'fused'), (['--threshold', '0.9'], 'ao', 'threshold'),
    (['--order', 'margin', '--mdm_counts', 'shared'], 'ao', 'mdm_counts'),
    (['--order', 'confidence', '--threshold', '0.9', '--steps', '64', '--schedule', 'cosine', '--fixed_counts',
      'True'], 'ao', 'steps'),  # issue 48: recorded and ignored
    (['--order', 'entropy', '--threshold', '0.5', '--schedule', 'cosine'], 'ao', 'schedule'),
    (['--order', 'confidence', '--threshold', '0.5', '--fixed_counts'], 'ao', 'fixed_counts'),
    (['--steps', '8'], 'ar', 'steps'), (['--fixed_counts'], 'ar', 'fixed_counts'),
    (['--schedule', 'cosine'], 'ar', 'schedule'), (['--cache_trick', 'False'], 'ar', 'cache_trick'),
    (['--threshold', '0.5'], 'ar', 'threshold'), (['--mdm_counts', 'shared'], 'ar', 'mdm_counts'),
    (['--threshold', '0.5'], 'mdm', 'threshold'), (['--fused', 'True'], 'mdm', 'fused'),
    (['--blank_len', '3'], 'ao', 'blank_len'), (['--blank_len', '3', '--template', 'a [BLANK:2] b'], 'ao', 'blank_len'),
    (['--gen_ppl_mode', 'hf'], 'ao', 'gen_ppl_mode'),
    (['--judge_batch_size', '4'], 'ar', 'judge_batch_size'), (['--temperature', '0', '--top_p', '0.9'], 'ao', 'top_p'),
    (['--top_p', '0.5', '--temperature', '0', '--speculative', '2'], 'ao', 'top_p')])
def test_an_option_the_sampler_ignores_is_refused_not_silently_dropped(tmp_path, cli, monkeypatch, args, family, key):
    """Given on purpose, a setting the chosen sampler does not read is one line before any sampling, the first
    such flag named (the speculative sampler once ran with --steps, --schedule, --fixed_counts and --mdm_counts
    silently ignored; --order confidence --threshold with the counts' flags recorded them and drew the same
    samples; a GPT's --steps was a note). samplers.SAMPLERS is the one table of which sampler reads what."""
    write_ckpt(tmp_path / 'ckpt.pt', **dict(ao={}, ar=dict(cond='none'), mdm=dict(cond='none', causal=False))[family])
    calls = []
    for name in ('generate_ao', 'generate_ar', 'generate_confident', 'generate_mdm'):
        monkeypatch.setattr(generate, name, lambda *a, **k: calls.append(1))
    code, out, err = cli('--out_dir', str(tmp_path), '--length', '8', *args)
    assert code == 1 and err.strip().startswith(f"error: --{key} is not used here") and calls == [], err
    assert len(err.strip().splitlines()) == 1


def test_a_full_disk_at_save_is_one_line_and_leaves_no_file(tmp_path, cli, monkeypatch):
    write_ckpt(tmp_path / 'ckpt.pt')
    real = json.dump

    def dump(obj, f, *a, **k):
        f.write('{"samples": [')  # half written, then the disk is full
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(json, 'dump', dump)
    code, out, err = cli('--out_dir', str(tmp_path), '--length', '4', '--steps', '2',
                         '--save', str(tmp_path / 's.json'))
    monkeypatch.setattr(json, 'dump', real)
    assert code == 1 and err.strip() == f"error: cannot write --save {tmp_path / 's.json'} (No space left on " \
        "device); nothing was written there", err
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pt']  # neither the file nor its temp


CTRL_C_AT_FIRST_FORWARD = """
import os, runpy, signal, sys, torch
sys.path.insert(0, {root!r})
real = torch.nn.Linear.forward
def forward(self, x):
    os.kill(os.getpid(), signal.SIGINT)  # as if the user pressed Ctrl-C mid-run
    return real(self, x)
torch.nn.Linear.forward = forward
sys.argv = {argv!r}
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.parametrize('script', ['sample.py', 'eval_ppl.py'])
def test_ctrl_c_is_one_line_and_status_130(tmp_path, script):
    write_ckpt(tmp_path / 'ckpt.pt')
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    extra = (['--save', str(tmp_path / 's.json')] if script == 'sample.py' else
             ['--datasets', 'ptb', '--data_path', f"ptb={tmp_path / 'text.txt'}", '--progress', 'False'])
    (tmp_path / 'text.txt').write_text('the cat sat on the mat . ' * 40)
    argv = [os.path.join(root, script), '--out_dir', str(tmp_path), '--device', 'cpu', *extra]
    p = subprocess.run([sys.executable, '-c', CTRL_C_AT_FIRST_FORWARD.format(root=root, argv=argv)], cwd=root,
                       capture_output=True, text=True, timeout=120)
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 130 and len(err) == 1 and err[0].startswith('interrupted: '), p.stderr
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pt', 'text.txt']  # no samples, no eval record, no temp file


def test_samples_are_printed_with_control_characters_escaped():
    assert sample.printable('a\x1b[2Jb\nc\td\x00\u200b') == 'a\\x1b[2Jb\nc\td\\x00\\u200b'
    assert sample.printable('café ☃') == 'café ☃'


@pytest.mark.parametrize('args', [['--order', 'semiar:4'], ['--order', 'confidence'], ['--order', 'nearl2r:2.5'],
                                  ['--order', 'mix:0.5*semiar:4+0.5*random', '--speculative', 'auto'],
                                  ['--order', 'margin', '--threshold', '0.05', '--template', 'a [BLANK:3] b'],
                                  ['--order', 'entropy', '--stepper', 'static']])
def test_cli_new_orders(tmp_path, cli, args):
    write_ckpt(tmp_path / 'ckpt.pt')
    steps = [] if '--speculative' in args or '--threshold' in args else ['--steps', '4']  # both refuse --steps
    code, out, err = cli('--out_dir', str(tmp_path), *steps, '--batch_size', '2', '--length', '8', *args,
                         '--save', str(tmp_path / 's.json'))
    assert code == 0, err
    res = json.load(open(tmp_path / 's.json'))
    assert res['config']['order'] == args[1] and len(res['samples']) == 2 and 'token-passes' in out


@pytest.mark.parametrize('trained', [{'order_mode': 'nearl2r:3'}, {'order': 'nearl2r:3'}], ids=['old', 'new'])
def test_auto_order_is_the_training_order_distribution(tmp_path, cli, trained):
    """A checkpoint trained on an order distribution samples along it by default (--order auto): the same
    samples as naming it, not the uniform order's; its config in the old spelling (order_mode) or the new."""
    model = tiny(vocab_size=50304, block_size=16)
    save_checkpoint(dict(format='aogpt-v1', model_args=asdict(model.config), model=model.state_dict(),
                         config={'dataset': 'no-such-dataset', **trained}, order=None),
                    str(tmp_path / 'ckpt.pt'))
    got, said = {}, {}
    for order in ('auto', 'nearl2r:3', 'random'):
        code, said[order], err = cli('--out_dir', str(tmp_path), '--order', order, '--steps', '16', '--batch_size',
                                     '3', '--save', str(tmp_path / f'{order}.json'))
        assert code == 0, err
        got[order] = json.load(open(tmp_path / f'{order}.json'))['samples']
    assert "order: the checkpoint's training order distribution, nearl2r:3" in said['auto']
    assert got['auto'] == got['nearl2r:3'] != got['random']


def test_a_boolean_flag_alone_as_the_readme_types_it(tmp_path, cli):
    """`--order l2r --fixed_counts --steps n`, as typed in the README, reproduces L2R decoding."""
    write_ckpt(tmp_path / 'ckpt.pt')
    code, out, err = cli('--out_dir', str(tmp_path), '--order', 'l2r', '--fixed_counts', '--steps', '16',
                         '--batch_size', '2', '--save', str(tmp_path / 'a.json'))
    assert code == 0, err
    assert json.load(open(tmp_path / 'a.json'))['config']['fixed_counts'] is True


def test_script_runs(tmp_path):
    """`python sample.py` as a subprocess: encoder MDM with the caching trick."""
    model = tiny(causal=False, cond='none', vocab_size=50304, mask_token_id=50257, block_size=16)
    save_checkpoint(dict(format='aogpt-v1', model_args=asdict(model.config), model=model.state_dict(),
                         config={}), str(tmp_path / 'ckpt.pt'))
    r = subprocess.run([sys.executable, 'sample.py', '--out_dir', str(tmp_path), '--device', 'cpu',
                        '--steps', '64', '--batch_size', '2'], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert 'encoder MDM' in r.stdout and 'token-passes' in r.stdout


def test_the_plan_is_the_calls_generate_ao_makes(monkeypatch):
    """draw_plan + ao_calls (what bench/sample_roofline.py counts FLOPs and bytes for) are the calls
    generate_ao makes, call for call: (rows, cached slots, copies), given tokens included."""
    model = tiny(block_size=32)
    given = torch.full((32,), -1)
    given[[3, 9]] = torch.tensor([1, 2])
    real, seen = engine.SlotStepper.__call__, []

    def spy(self, tok, pos, tgt, k):
        seen.append((tok.size(1), self.cache.len, k))
        return real(self, tok, pos, tgt, k)
    monkeypatch.setattr(engine.SlotStepper, '__call__', spy)
    for T, giv in ((4, None), (9, given), (32, None), (32, given)):
        seen.clear()
        _, st = generate_ao(model, 32, 3, T, Sampling(generator=gen(5)), given=giv)
        counts = generate.draw_plan(32, 3, T, Sampling(generator=gen(5)), given=giv)[2].tolist()
        calls = generate.ao_calls(counts, 0 if giv is None else 2)
        assert calls == seen and len(calls) == st['forward_calls']
        assert sum(r for r, _, _ in calls) == st['token_passes']
    r = subprocess.run([sys.executable, 'bench/sample_roofline.py', '--n_layer=2', '--n_embd=64', '--n=32',
                        '--batch_size=3', '--steps=4,32'], cwd=ROOT, capture_output=True, text=True)
    first = r.stdout.split('Exact speculative sampling')[0]  # the AO table (the speculative one has k rows)
    assert r.returncode == 0 and first.count('\n| 4 | ') == 1, r.stderr


@pytest.mark.parametrize('where', ['sample_tokens', 'top_p', 'generate_ao', 'speculative'])
def test_non_finite_probabilities_are_refused_never_drawn(where):
    """NaN logits once drew the first id past the vocabulary (sample.py printed padding characters, exit 0):
    every draw goes through inverse_cdf, which refuses a row whose mass is not a positive finite number."""
    from aogpt.errors import UserError
    from aogpt.speculative import Speculation, generate_speculative
    with pytest.raises(UserError, match='NaN or inf'):
        if where in ('sample_tokens', 'top_p'):
            sample_tokens(torch.full((3, 7), float('nan')), torch.rand(3), vocab_size=5,
                          top_p=0.9 if where == 'top_p' else 1.0)
        else:
            model = tiny(block_size=8, vocab_size=11)
            with torch.no_grad():
                model.lm_head.weight[0, 0] = float('nan')
            g = torch.Generator().manual_seed(0)
            if where == 'generate_ao':
                generate_ao(model, 8, 2, 4, Sampling(vocab_size=11, generator=g))
            else:
                generate_speculative(model, 8, 2, Sampling(vocab_size=11, generator=g), speculation=Speculation(3))


class _Evil:
    """Pickled, it asks the loader to call os.system: what a weights_only load must refuse."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f'touch {self.marker}',)


def test_an_hf_folder_with_a_pickled_call_is_one_line_and_runs_nothing(tmp_path, cli):
    """An HF GPT-2 folder whose pytorch_model.bin pickles a call: as a --gen_ppl judge it gave an
    UnpicklingError traceback (its load bypassed the checkpoint loader), and a checkpoint pickling a call was
    called "truncated or corrupt". Both are refused in one line that says what the file asks for."""
    hf = tmp_path / 'gpt2'
    hf.mkdir()
    (hf / 'config.json').write_text(json.dumps(dict(model_type='gpt2', n_positions=17, vocab_size=50257, n_layer=1,
                                                    n_head=2, n_embd=8)))
    torch.save({'wte.weight': _Evil(tmp_path / 'ran')}, hf / 'pytorch_model.bin')
    write_ckpt(tmp_path / 'ckpt.pt')
    code, out, err = cli('--out_dir', str(tmp_path), '--length', '8', '--gen_ppl', str(hf))
    assert code == 1 and len(err.strip().splitlines()) == 1 and 'refused' in err and 'system' in err \
        and 'would run as code' in err, err
    torch.save({'model': _Evil(tmp_path / 'ran')}, tmp_path / 'evil.pt')
    code, out, err = cli('--ckpt', str(tmp_path / 'evil.pt'), '--length', '8')
    assert code == 1 and 'refused' in err and 'system' in err and 'truncated' not in err, err
    assert not (tmp_path / 'ran').exists()


def test_steps_are_the_steps_that_revealed_a_token_not_the_steps_asked(tmp_path, cli):
    """--steps 256 for 8 tokens said "256 steps": every sampler's stats and sample.py's line now count the steps
    that revealed a token (at most one per token), and the line says how many were asked for."""
    g = torch.Generator().manual_seed(0)
    ao, mdm = tiny(vocab_size=8, block_size=8), tiny(vocab_size=8, block_size=8, cond='none', causal=False,
                                                       mask_token_id=7)
    for T, fixed in ((64, False), (64, True), (3, False)):
        _, st = generate_ao(ao, 8, 2, T, Sampling(fixed_counts=fixed, generator=g))
        assert st['steps'] == len(st['counts']) == st['forward_calls'] <= min(T, 8) and all(st['counts'])
        assert st['steps'] == 8 or not fixed
        _, st = generate.generate_confident(ao, 8, 2, T, Sampling(fixed_counts=fixed, generator=g))
        assert st['steps'] == len(st['counts']) <= min(T, 8) and all(st['counts'])
        _, st = generate_mdm(mdm, 8, 2, T, Sampling(fixed_counts=fixed, generator=g))
        assert st['steps'] == len(st['step_of'].unique()) <= min(T, 8) and (st['steps'] == 8 or not fixed)
    write_ckpt(tmp_path / 'ckpt.pt')
    code, out, err = cli('--out_dir', str(tmp_path), '--steps', '256', '--fixed_counts', '--batch_size', '2',
                         '--length', '8', '--quiet')
    assert code == 0 and '(8 generated each), 8 steps (of --steps 256: the others revealed no token): ' in out, err
    code, out, err = cli('--out_dir', str(tmp_path), '--steps', '4', '--fixed_counts', '--batch_size', '2',
                         '--length', '8', '--quiet')
    assert code == 0 and '(8 generated each), 4 steps: ' in out, err
    # a threshold replaces the counts: its steps are never "of --steps 256" (a setting it does not read)
    code, out, err = cli('--out_dir', str(tmp_path), '--order', 'confidence', '--threshold', '0.5', '--batch_size', '1',
                         '--length', '8', '--quiet')
    assert code == 0 and 'steps: ' in out and '--steps' not in out, (out, err)


def test_a_semiar_block_as_long_as_the_sequence_says_it_is_the_uniform_order(tmp_path, cli):
    write_ckpt(tmp_path / 'ckpt.pt')
    for spec, said in (('semiar:8', True), ('semiar:7', False)):
        code, out, err = cli('--out_dir', str(tmp_path), '--steps', '4', '--batch_size', '2', '--length', '8',
                             '--order', spec, '--quiet')
        notes = [l for l in out.splitlines() if 'one block' in l]
        assert code == 0 and notes == ([f"note: order {spec}: {spec} at length 8 puts all 8 positions in one block, "
                                        "which is the uniform random order (semi-autoregressive needs K < 8)"]
                                       if said else []), (notes, err)


@pytest.mark.parametrize('call, needle', [
    (lambda m, e: generate_ao(m, 8, 2, 0), "steps must be an integer >= 1, got 0"),
    (lambda m, e: generate_ao(m, 8, 0, 4), "batch_size must be an integer >= 1, got 0"),
    (lambda m, e: generate_ao(m, 9, 2, 4), "n must be an integer >= 1 and <= block_size 8, got 9"),
    (lambda m, e: generate_ao(m, 4, 2, 4, given=torch.tensor([9, -1, -1, -1])), "given token id 9 is not in the "
                                                                                 "model's vocabulary (ids 0..7"),
    (lambda m, e: generate_ao(m, 8, 2, 4, order=torch.arange(7)), "a permutation of range(8), (8,) or one per "
                                                                   "sample (2, 8): got shape (7,)"),
    (lambda m, e: generate_ao(m, 8, 2, 4, order=3), "or a permutation of the positions"),
    (lambda m, e: generate_ar(m, 8, 2, prompt=[8]), "given token id 8 is not in the model's vocabulary"),
    (lambda m, e: generate_mdm(e, 8, 2, 0), "steps must be an integer >= 1, got 0"),
    (lambda m, e: speculative.generate_speculative(m, 8, 0), "batch_size must be an integer >= 1, got 0"),
    (lambda m, e: reveal_counts(4, 0), "steps one >= 1, got n=4, steps=0"),
])
def test_a_sampler_refuses_bad_sizes_orders_and_ids_in_one_line(call, needle):
    """Each of these was a raw torch error from deep in the run (bincount, an index out of range, a division by
    zero) or, for a permutation too short, an IndexError: now a UserError saying what is wrong."""
    m, e = tiny(vocab_size=8, block_size=8), tiny(vocab_size=8, block_size=8, cond='none', causal=False,
                                                  mask_token_id=7)
    with pytest.raises(UserError) as err:
        call(m, e)
    assert needle in err.value.msg and '\n' not in err.value.msg, err.value.msg


def test_a_plain_pickle_file_is_named_and_refused(tmp_path, cli):
    """A file written by pickle.dump (any protocol), harmless or asking for os.system, was called "truncated or
    corrupt ... copy it again"; it is a plain pickle, which only an unpickler that runs code could read."""
    import pickle
    for name, obj, protocol in [('dict4.pt', {'model': {}, 'iter_num': 1}, 4), ('dict2.pt', {'model': {}}, 2),
                                ('evil4.pt', {'model': _Evil(tmp_path / 'ran')}, 4)]:
        with open(tmp_path / name, 'wb') as f:
            pickle.dump(obj, f, protocol=protocol)
        code, out, err = cli('--ckpt', str(tmp_path / name), '--length', '8')
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert f"refused {tmp_path / name}: it is a plain Python pickle (pickle.dump)" in err and 'copy it' not in err
    assert not (tmp_path / 'ran').exists()


@pytest.mark.parametrize('order', ['mix:0.5*semiar:4+0.5*nearl2r:2', 'auto'])
def test_an_order_is_parsed_once_and_carried_to_the_sampler(tmp_path, cli, monkeypatch, order):
    """sample.py parses --order (or the checkpoint's order, for auto) once; the sampler draws from that Order
    (once a spec was parsed in sample.py, generate_ao's check and free_order, and drawn from text)."""
    from aogpt import orders
    model = tiny(vocab_size=50304, block_size=16)
    save_checkpoint(dict(format='aogpt-v1', model_args=asdict(model.config), model=model.state_dict(),
                         config={'dataset': 'no-such-dataset', 'order': 'semiar:4'}, order=None),
                    str(tmp_path / 'ckpt.pt'))
    made, init = [], orders.Order.__init__
    monkeypatch.setattr(orders.Order, '__init__', lambda self, comps, spec: made.append(spec) or init(self, comps, spec))
    code, out, err = cli('--out_dir', str(tmp_path), '--order', order, '--steps', '4', '--batch_size', '2')
    assert code == 0, err
    assert made == [{'auto': 'semiar:4'}.get(order, order)]


def test_help_says_which_judges_work_and_ends_its_sentences(capsys):
    """--help: --gen_ppl takes any Hugging Face family with its tokenizer.json, not only GPT-2 (it said 'or HF GPT-2'
    after the other families worked), and --until_eot's text runs to its end (it stopped mid-parenthesis)."""
    with pytest.raises(SystemExit) as e:
        sample.read_config(['--help'])
    assert e.value.code == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith('  --')}
    assert 'Qwen3 with its tokenizer.json' in lines['--gen_ppl']
    assert 'auto: hf for an HF GPT-2' in lines['--gen_ppl_mode']
    assert lines['--until_eot'].endswith("samplers stop once it is settled (docs/sampling.md)")
