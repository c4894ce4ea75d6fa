"""speculative.py: samples against the model's exact joint (enumeration of every sequence over a tiny
vocabulary, chi-square of whole sequences) in every setting the sampler offers, negative controls that
the same test must reject, the cache against a cache-free recomputation, fixed shapes, the cost bound,
and the CLI."""
import itertools
import math

import pytest
import torch
from helpers import BACKBONES, exact_law, seq_law, speculate, split_settings, tiny

from aogpt import engine, generate, speculative
from aogpt.generate import logits_to_probs
from aogpt.samplers import Sampling
from aogpt.speculative import Speculation, generate_speculative
from model import parallel_mask

ALPHA = 1e-4
N = 20000   # samples per law: the negative controls below are rejected at p < 1e-10 with this many


def gen(seed):
    return torch.Generator().manual_seed(seed)


def sharp(model, scale=25.0):
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


# the Llama/Qwen block (rotary positions, SwiGLU, grouped-query attention: a KV cache of 2 heads for 4 queries)
ROPE = dict(BACKBONES['rope'], cond='adaln')


def mixy(seed=3, s=0.3, head=5.0, **kw):
    """tiny(), with noise on the attention and token embeddings too: its conditionals depend on the
    *tokens* before them, not just on positions and targets, so a wrong context (a rejected draft left in
    the cache) or a wrong proposal law shows in the samples. Vocab 4 of which the samplers use 3: id 3
    plays a padded id that must never be drawn."""
    m = tiny(seed=seed, **dict(dict(vocab_size=4, block_size=8), **kw))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if 'attn' in name or 'wte' in name:
                p.add_(torch.randn(p.shape, generator=g) * s)
    return sharp(m, head).double()


@pytest.fixture(scope='module')
def m4(backbone):
    return mixy(**backbone)


@pytest.fixture(scope='module')
def m4_paper():
    """m4 on the paper's block alone, for the negative controls: their power is this model's (on the rope
    block the same chi-square at N does not reject keep_rejected). The laws run on both blocks."""
    return mixy()


def chi2_pvalue(samples, xs, law):
    """Pearson chi-square of samples (N, n) against law over the cells xs, cells expecting < 5 pooled."""
    V = int(xs.max()) + 1
    code = lambda t: (t * (V ** torch.arange(t.size(1) - 1, -1, -1))).sum(1)  # noqa: E731
    obs = torch.bincount(code(samples), minlength=V ** xs.size(1)).double()[code(xs)]
    assert obs.sum() == samples.size(0), "a sample outside the enumerated cells"
    exp = law * samples.size(0)
    small = exp < 5
    o = torch.cat([obs[~small], obs[small].sum()[None]])
    e = torch.cat([exp[~small], exp[small].sum()[None]])
    keep = e > 0
    if bool((o[~keep] > 0).any()):
        return 0.0  # a sample the law gives probability 0
    stat = ((o[keep] - e[keep]) ** 2 / e[keep]).sum()
    df = int(keep.sum()) - 1
    return torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2).item()


L2R4 = [(0, 1, 2, 3)]


def run(model, n=4, V=3, seed=0, **kw):
    kw.setdefault('batch_commit', 'min')
    s, kw = split_settings(kw, vocab_size=V, generator=gen(seed))
    x, st = speculate(model, n, N, s, **kw)
    assert x.max() < V
    assert st['forward_calls'] <= st['tokens_generated']  # the batch's calls, so every sample's too
    return x, st


def passes(model, x, orders, n=4, V=3, given=None, **tf):
    xs, law = seq_law(model, n, V, orders, given, **tf)
    return chi2_pvalue(x, xs, law) > ALPHA


PERMS4 = list(itertools.permutations(range(4)))


@pytest.mark.parametrize('k', [2, 3, 4])
@pytest.mark.parametrize('bonus', [True, False])
def test_l2r_is_the_exact_joint(m4, k, bonus):
    """Left to right, per-sample commits (rows commit 1..k+1 tokens a round), k in {2, 3, n}, with and
    without the bonus slot: the law of whole sequences is the model's chain rule."""
    x, st = run(m4, k=k, bonus=bonus, order='l2r', batch_commit='per_row')
    assert passes(m4, x, L2R4)
    assert st['accept_rate'] > 0.5 and (max(st['committed']) > 2) == (k + bonus > 2)  # long runs were tested
    assert not passes(m4, x, PERMS4)  # power: the random-order mixture is another law, rejected


def test_fixed_permutation_and_batch_minimum(m4):
    """A fixed permutation, the batch-minimum commits (any stepper's path)."""
    perm = (2, 0, 3, 1)
    x, st = run(m4, k=3, order=torch.tensor(perm))
    assert passes(m4, x, [perm]) and not passes(m4, x, L2R4)


def test_blocks_order_is_the_mixture_over_its_orders(m4):
    x, _ = run(m4, k=4, order='semiar:2', batch_commit='per_row')
    allowed = [a + b for a in itertools.permutations((0, 1)) for b in itertools.permutations((2, 3))]
    assert passes(m4, x, allowed) and not passes(m4, x, PERMS4) and not passes(m4, x, L2R4)


@pytest.mark.parametrize('order', ['semiar:3', 'mix:0.3*l2r+0.7*nearl2r:2.5'])
def test_an_order_distribution_gives_the_mixture_over_its_law(m4, order):
    """semiar, and a mix of l2r and nearl2r (orders.py), the order drawn before the first draft: whole
    sequences follow the model's joint mixed over the distribution's exact law (helpers.exact_law, by
    enumeration), neither the uniform mixture nor L2R alone. The Lemma-1 sampler at one token a step draws
    the same law."""
    law = {perm: float(w) for perm, w in exact_law(order, range(4)).items() if w}
    x, _ = run(m4, k=3, order=order, batch_commit='per_row')
    assert passes(m4, x, law) and not passes(m4, x, PERMS4) and not passes(m4, x, L2R4)
    if order.startswith('mix'):
        x, _ = generate.generate_ao(m4, 4, N, 4, Sampling(fixed_counts=True, vocab_size=3, generator=gen(7)),
                                    order=order)
        assert passes(m4, x, law) and not passes(m4, x, PERMS4)


@pytest.mark.parametrize('commit', ['min', 'per_row'])
def test_random_order_is_the_mixture_over_orders(m4, commit):
    """A fresh uniform order per sample: the mixture over all n! of the chain along each (generate_ao at one
    token a step)."""
    x, _ = run(m4, k=3, order='random', batch_commit=commit)
    assert passes(m4, x, PERMS4) and not passes(m4, x, L2R4)


@pytest.mark.slow
def test_sigma_gpt_random_order():
    model = mixy(cond='sigma')
    x, _ = run(model, k=3, order='random', batch_commit='per_row')
    assert passes(model, x, PERMS4) and not passes(model, x, L2R4)


@pytest.mark.parametrize('where', ['prompt', 'infill'])
def test_prompt_and_infill(m4, where):
    given = torch.tensor([2, -1, -1, -1]) if where == 'prompt' else torch.tensor([-1, 1, -1, 0])
    x, st = run(m4, k=3, order='random', given=given, batch_commit='per_row')
    assert (x[:, given >= 0] == given[given >= 0]).all() and st['tokens_generated'] == int((given < 0).sum())
    assert passes(m4, x, PERMS4, given=given)
    free = [i for i in range(4) if given[i] < 0]
    xs, law = seq_law(m4, 4, 3, PERMS4, given=given)
    # power: every free position drawn from the conditional given only the given tokens is another law
    wrong = torch.ones(len(xs), dtype=torch.float64)
    for i in free:
        o = [j for j in range(4) if given[j] >= 0] + [i] + [j for j in free if j != i]
        p = logits_to_probs(m4(xs, order=torch.tensor(o).expand(len(xs), 4))[0].detach(), vocab_size=3)
        wrong *= p[:, 4 - len(free)].gather(1, xs[:, i:i + 1]).squeeze(1)
    ok = (xs[:, given >= 0] == given[given >= 0]).all(1)
    assert chi2_pvalue(x, xs, torch.where(ok, wrong, 0.0)) < ALPHA


@pytest.mark.parametrize('tf', [dict(temperature=0.7), dict(top_p=0.8), dict(temperature=0.7, top_p=0.8)])
def test_temperature_and_top_p_transform_both_laws(m4, tf):
    """The transform acts on q and p alike: the output is sequential sampling under the transform."""
    x, _ = run(m4, k=3, order='l2r', batch_commit='per_row', **tf)
    assert passes(m4, x, L2R4, **tf) and not passes(m4, x, L2R4)


def test_rows_of_a_batch_accept_different_counts(m4):
    """One batch: under per-sample commits rows commit different counts in the same round, and under the
    batch minimum they all commit the fewest (2 a round at this batch size); both exact (the tests above)."""
    _, st = speculate(m4, 4, 256, Sampling(vocab_size=3, generator=gen(1)), k=4, order='l2r',
                                 batch_commit='per_row', trace=True)
    t = st['events'][0][2]
    assert len(set(t.tolist())) > 1
    _, st = speculate(m4, 4, 256, Sampling(vocab_size=3, generator=gen(1)), k=4, order='l2r',
                                 batch_commit='min')
    assert st['committed'] == [2, 2]


@pytest.mark.slow
def test_one_sample_per_row_equals_batch_minimum(m4):
    """With B = 1 the two commit rules are the same algorithm with the same draws: same samples."""
    for seed in range(20):
        for k in (2, 3, 'auto'):
            a, sa = speculate(m4, 4, 1, Sampling(vocab_size=3, generator=gen(seed)), k=k,
                                         batch_commit='min')
            b, sb = speculate(m4, 4, 1, Sampling(vocab_size=3, generator=gen(seed)), k=k,
                                         batch_commit='per_row')
            assert torch.equal(a, b) and sa['forward_calls'] == sb['forward_calls']


# --------------------------------------------------------------------------- negative controls
# Each breaks one piece of the sampler on purpose, by patching it; the chi-square that passes the
# correct run must reject the broken one.

def resample_p(monkeypatch):
    """The replacement after a rejection drawn from p instead of the residual norm(max(p - q, 0))."""
    monkeypatch.setattr(speculative, '_residual', lambda p, q: p)


def keep_rejected(monkeypatch):
    """After a round that ended in a rejection, the cache keeps one row more than it should: the
    rejected draft's (the next round conditions on a token that was never committed)."""
    rejected, real = [], speculative.accept
    real_keep, real_commit = engine.KVCache.keep, engine.RowCache.commit

    def spy(run, p, q, d, n_tests, bonus):
        a, y = real(run, p, q, d, n_tests, bonus)
        rejected.append(a < n_tests)
        return a, y

    def keep(self, rows, chosen=None):    # batch minimum: the batch stopped at a rejection if any row did
        if rows is not None and rejected:
            rows += int(rejected.pop().any())
        return real_keep(self, rows, chosen)

    def commit(self, keep):               # per-sample commits: each rejecting sample's first row not kept
        if rejected:
            rej, keep = rejected.pop(), keep.clone()
            keep[rej, keep.long().argmin(1)[rej]] = True
        return real_commit(self, keep)
    monkeypatch.setattr(speculative, 'accept', spy)
    monkeypatch.setattr(engine.KVCache, 'keep', keep)
    monkeypatch.setattr(engine.RowCache, 'commit', commit)


def wrong_target(monkeypatch):
    """Draft copy 0 with the next position's target (copies 0 and 1 swap targets); copy 0 is committed
    untested, so it must be the true conditional."""
    real = engine.SlotStepper.__call__

    def swapped(self, tok, pos, tgt, k, n_logits=None):
        if k > 1:  # a draft call
            c0, tgt = tgt.size(1) - k, tgt.clone()
            tgt[:, [c0, c0 + 1]] = tgt[:, [c0 + 1, c0]]
        return real(self, tok, pos, tgt, k, n_logits)
    monkeypatch.setattr(engine.SlotStepper, '__call__', swapped)


def stale_q(monkeypatch):
    """Fused rounds: the next drafts drawn from the copies of each sample's row a, but tested against
    row 0's (the ratio p/q with the wrong q)."""
    real = speculative._draft
    monkeypatch.setattr(speculative, '_draft', lambda qn, a, u: (real(qn, a, u)[0], qn[:, 0]))


@pytest.mark.parametrize('bug', [resample_p, keep_rejected, wrong_target])
def test_negative_controls_are_rejected(m4_paper, bug, monkeypatch):
    """The same chi-square rejects each wrong variant: resampling from p instead of the residual (the
    token after a rejection is biased towards what q proposed), keeping the rejected draft's verify row
    in the cache, and draft copy 0 with the next position's target."""
    bug(monkeypatch)
    x, _ = run(m4_paper, k=2, order='l2r')  # the same run without the bug: test_l2r_batch_minimum
    assert not passes(m4_paper, x, L2R4)


def test_l2r_batch_minimum(m4):
    x, _ = run(m4, k=2, order='l2r')
    assert passes(m4, x, L2R4)


@pytest.mark.slow
def test_a_wrong_target_past_copy_0_is_only_a_worse_proposal(m4_paper, monkeypatch):
    """The accept test corrects any proposal: copies 1.. drafting from the wrong target keep the law
    exact (fewer drafts are accepted). This is why the control above must break copy 0."""
    real = engine.SlotStepper.__call__

    def shifted(self, tok, pos, tgt, k, n_logits=None):
        if k > 1:  # a draft call: copy j >= 1 gets copy 1's target
            tgt, c1 = tgt.clone(), tgt.size(1) - k + 1
            tgt[:, c1:] = tgt[:, c1:c1 + 1]
        return real(self, tok, pos, tgt, k, n_logits)
    _, st0 = run(m4_paper, k=4, order='l2r')
    monkeypatch.setattr(engine.SlotStepper, '__call__', shifted)
    x, st = run(m4_paper, k=4, order='l2r')
    assert passes(m4_paper, x, L2R4) and st['accept_rate'] < st0['accept_rate']


# --------------------------------------------------------------------------- the cache, fixed shapes, cost

class Uncached(engine.SlotStepper):
    """SlotStepper's interface without a KV cache: each call runs every committed slot again, then the
    call's rows (the same masks), so its logits are what the cache should reproduce. A SlotStepper, so
    that the sampler takes it as one to reuse (SlotStepper.make)."""

    def __init__(self, model, B):
        self.model, self.B, self.cache = model, B, self
        self.len, self.done, self.last = 0, None, None

    def keep(self, rows):
        if rows is None:
            self.len, self.done = 0, None
            return
        kept = [t[:, :rows] for t in self.last]
        self.done = kept if self.done is None else [torch.cat([a, b], 1) for a, b in zip(self.done, kept)]
        self.len += rows

    def __call__(self, tok, pos, tgt, k, n_logits=None):
        self.last = (tok, pos, tgt)
        full = [t if self.done is None else torch.cat([d, t], 1) for d, t in zip(self.done or [None] * 3, self.last)]
        mask = parallel_mask(full[0].size(1), k, 0)  # k = 1: causal
        return self.model.forward_slots(*full, mask=mask, n_logits=k if n_logits is None else n_logits)


@pytest.mark.parametrize('cond', [dict(cond='adaln'), dict(cond='adaln', adaln_table=True), dict(cond='sigma'),
                                  ROPE])
@pytest.mark.parametrize('kw', [dict(order='random', k=3), dict(order='l2r', k='auto'),
                                dict(order='random', k=4, bonus=False), dict(order='random', k=2, top_p=0.8)])
def test_cache_equals_a_cache_free_recomputation(kw, cond):
    """Every call's logits on the KV cache equal a full pass over the committed slots and the call's rows:
    the cache holds exactly the rows whose token and target are committed. Same samples, on a model too
    large to enumerate (n = 24, given tokens at the start and in the middle); AdaLN and sigma-GPT."""
    model = mixy(seed=5, block_size=32, vocab_size=11, **cond)
    n, B = 24, 16
    given = torch.full((n,), -1)
    given[[0, 1, 9]] = torch.tensor([4, 9, 1])
    settings = lambda: split_settings(kw, generator=gen(3))[0]  # noqa: E731
    kw = split_settings(kw)[1]
    b, sb = speculate(model, n, B, settings(), given=given, stepper=Uncached(model, B), batch_commit='min',
                                 **kw)
    a, sa = speculate(model, n, B, settings(), given=given, batch_commit='min', **kw)
    assert torch.equal(a, b) and sa['committed'] == sb['committed'] and sa['forward_calls'] < n


def test_the_cache_free_check_catches_a_rejected_row_kept(monkeypatch):
    """The check above has power: keeping the rejected draft's row changes the samples."""
    model = mixy(seed=5, block_size=32, vocab_size=11)
    n, B = 24, 16
    a, _ = speculate(model, n, B, Sampling(generator=gen(3)), k=3, batch_commit='min')
    keep_rejected(monkeypatch)
    b, _ = speculate(model, n, B, Sampling(generator=gen(3)), k=3, batch_commit='min')
    assert not torch.equal(a, b)


@pytest.mark.parametrize('commit', ['min', 'per_row', 'fused'])
@pytest.mark.parametrize('kw', [dict(order='random', k=3), dict(order='l2r', k=5, top_p=0.9),
                                dict(order='semiar:8', k='auto')])
def test_static_stepper_gives_the_dynamic_samples(kw, commit, backbone):
    """The fixed-shape path (what a CUDA graph replays) gives the dynamic path's samples: padded rows,
    masked spans over the zeroed cache, the verify call as k = 1 with every row's logits; per-sample
    commits through RowStepper's per-sample masks."""
    model = mixy(seed=8, block_size=40, vocab_size=11, s=0.1, **backbone)
    n, B = 40, 3
    given = torch.full((n,), -1)
    given[[0, 5, 17]] = torch.tensor([4, 9, 1])
    fused = commit == 'fused'
    kw = dict(kw, batch_commit='per_row' if fused else commit, fused=fused)
    settings = lambda: split_settings(kw, generator=gen(4))[0]  # noqa: E731
    kw = split_settings(kw)[1]
    a, sa = speculate(model, n, B, settings(), given=given, **kw)
    step = (engine.SlotStepper(model, B, 'static', kv_bucket=16) if commit == 'min' else
            speculative.row_stepper(model, B, 'static', n, Speculation(kw['k'], fused=fused), 3, kv_bucket=16))
    b, sb = speculate(model, n, B, settings(), given=given, stepper=step, **kw)
    assert torch.equal(a, b) and sa['committed'] == sb['committed']
    c, _ = speculate(model, n, B, settings(), given=given, stepper=step, **kw)  # reused
    assert torch.equal(a, c)


def test_calls_per_token_and_passes():
    """A round is 2 calls for >= 2 tokens: calls <= tokens for every k; k = 1 is one call per token."""
    model = mixy(seed=5, block_size=32, vocab_size=11)
    for k in (1, 3, 'auto'):
        for commit in ('min', 'per_row'):
            _, st = speculate(model, 32, 8, Sampling(generator=gen(0)), k=k, batch_commit=commit)
            assert st['forward_calls'] <= 32 and st['tokens_generated'] == 32
            if k == 1:
                assert st['forward_calls'] == st['token_passes'] == 32


@pytest.mark.parametrize('bad, msg', [
    (dict(order='confidence'), 'not an order fixed before the draws'), (dict(k=0), 'k must be'), (dict(batch_commit='max'), 'batch_commit'),
])
def test_bad_arguments_are_one_clear_error(m4, bad, msg):
    with pytest.raises(ValueError, match=msg):
        speculate(m4, 4, 2, **bad)
    with pytest.raises(ValueError, match='RowStepper'):
        speculate(m4, 4, 2, batch_commit='per_row', stepper=engine.SlotStepper(m4, 2, 'static'))
    with pytest.raises(ValueError, match='speculation must be a speculative.Speculation'):
        generate_speculative(m4, 4, 2, speculation=dict(k=4))
    with pytest.raises(ValueError, match='fused must be True or False'):
        Speculation(fused='yes')


@pytest.mark.parametrize('fused', [False, True])
def test_a_draft_longer_than_the_window_sizes_nothing(m4, fused):
    """A round drafts at most the tokens left, so k past n draws as k = n; the per-sample buffers were sized by k
    itself, and sample.py --speculative 10**12 asked for a terabyte (an allocation traceback)."""
    huge = Speculation(10 ** 20, fused=fused)
    assert speculative.row_slots(6, huge) == speculative.row_slots(6, Speculation(6, fused=fused))
    a = speculate(m4, 6, 3, Sampling(generator=torch.Generator().manual_seed(0)), k=10 ** 20, fused=fused,
                  batch_commit="per_row")
    b = speculate(m4, 6, 3, Sampling(generator=torch.Generator().manual_seed(0)), k=6, fused=fused,
                  batch_commit="per_row")
    assert torch.equal(a[0], b[0])


@pytest.mark.parametrize('kw', [dict(cond='none'), dict(causal=False, cond='none', mask_token_id=7)])
def test_gpt_and_encoder_are_refused(kw):
    model = tiny(vocab_size=8, block_size=8, **kw)
    with pytest.raises(ValueError, match='any-order decoder'):
        speculate(model, 4, 2)


# --------------------------------------------------------------------------- the CLI

def test_cli_speculative(tmp_path, cli):
    from test_sample import write_ckpt
    ck = tmp_path / 'ck.pt'
    write_ckpt(ck)

    def run(*args):
        code, out, err = cli('--ckpt', str(ck), '--quiet', *args)
        return code, out + err

    for args in (['--speculative', '3'], ['--speculative', 'auto', '--order', 'l2r', '--prompt', 'ab'],
                 ['--speculative', '2', '--order', 'semiar:4', '--template', 'a[BLANK:5]b', '--temperature', '0.7',
                  '--top_p', '0.9', '--stepper', 'static'],
                 ['--speculative', '4', '--save', str(tmp_path / 's.json')],
                 ['--speculative', '3', '--fused', 'True', '--stepper', 'static', '--prompt', 'ab']):
        code, out = run(*args, '--length', '16')
        assert code == 0, out
        assert 'tokens per forward call' in out and 'rounds per sample' in out
    # --trace: one page per run, for the speculative sampler (which drafts were kept) and the others
    for args in (['--speculative', '3'], ['--speculative', '3', '--fused', 'True'], ['--steps', '4'],
                 ['--order', 'confidence', '--steps', '4']):
        page = tmp_path / 'trace.html'
        code, out = run(*args, '--length', '12', '--batch_size', '2', '--prompt', 'a', '--trace', str(page))
        assert code == 0, out
        text = page.read_text()
        assert text.count('<h3>sample') == 2 and text.count('<table>') == 2
        assert ("<td class='d0'" in text) == (args[0] == '--speculative') and "<td class='given'" in text
    code, out = run('--speculative', '3', '--order', 'confidence')
    assert code != 0 and 'not be exact' in out
    code, out = run('--fused', 'True', '--length', '8')
    assert code != 0 and "--fused is not used here: it is the speculative sampler's" in out
    code, out = run('--speculative', '1')
    assert code != 0 and 'speculative' in out
    write_ckpt(ck, cond='none')  # a GPT: one clear line
    code, out = run('--speculative', '3', '--length', '8')
    assert code != 0 and 'cannot verify drafts' in out


def test_trace_steps_cover_every_position_once(m4):
    """The trace's steps, rebuilt from a run's stats, reveal every free position exactly once, in the
    run's order, and call a token resampled exactly when its draft was rejected."""
    from aogpt import tracepage
    given = torch.tensor([-1, 2, -1, -1])
    for commit in ('min', 'per_row', 'fused'):
        x, st = speculate(m4, 4, 64, Sampling(vocab_size=3, generator=gen(0)), k=3, given=given,
                                     batch_commit='per_row' if commit == 'fused' else commit,
                                     fused=commit == 'fused', trace=True)
        for b, steps in enumerate(tracepage.steps_of(st, 4, 1, 64)):
            flat = [(p, kind) for row in steps for p, kind, _ in row]
            assert [p for p, _ in flat] == st['order'][b].tolist()
            assert flat[0][1] == 'given' and all(kind != 'given' for _, kind in flat[1:])
            for row in steps[1:]:
                assert row[0][1] == 'd0' or commit == 'fused'
                for p, kind, rej in row:
                    assert (kind == 'resampled') == (rej is not None)


def test_greedy_is_greedy_sequential_decoding():
    """Temperature 0: q and p are one-hot, a draft is kept iff it is the argmax given the drafts before
    it, so the output is greedy decoding along the order, token for token."""
    model = mixy(seed=5, block_size=32, vocab_size=11)
    for order in ('l2r', 'random'):
        ref, st = generate.generate_ao(model, 24, 8, 24,
                                       Sampling(fixed_counts=True, temperature=0.0, generator=gen(2)), order=order)
        for commit in ('min', 'per_row'):
            x, _ = speculate(model, 24, 8, Sampling(temperature=0.0, generator=gen(2)), k=4,
                                        order=st['order'], batch_commit=commit)  # generate_ao's orders, per sample
            assert torch.equal(x, ref)


def test_every_round_loop_has_one_accept_test_and_one_transform(monkeypatch):
    """The three round loops (batch minimum, per-sample, fused) share speculative.accept and draw q and p
    from generate.logits_to_probs, sample_tokens' transform: with accept told to test nothing, every
    round commits d_0 and a replacement (two calls) or a replacement alone (fused); with the transform
    made greedy, every loop is generate_ao's greedy decoding token for token."""
    model = mixy(seed=5, block_size=32, vocab_size=11)
    loops = [dict(batch_commit='min'), dict(batch_commit='per_row'), dict(fused=True)]
    real_accept, real_probs = speculative.accept, generate.logits_to_probs
    assert speculative.logits_to_probs is real_probs
    with monkeypatch.context() as mp:
        mp.setattr(speculative, 'accept', lambda run, p, q, d, n_tests, bonus: real_accept(
            run, p, q, d, n_tests.clamp(max=0), bonus & False))
        for kw in loops:
            _, st = speculate(model, 24, 8, Sampling(generator=gen(2)), k=4, **kw)
            assert max(st['committed']) == (1 if kw.get('fused') else 2) and st['accept_rate'] != st['accept_rate']
    ref, st = generate.generate_ao(model, 24, 8, 24,
                                   Sampling(fixed_counts=True, temperature=0.0, generator=gen(2)), order='random')
    monkeypatch.setattr(speculative, 'logits_to_probs',
                        lambda logits, **tf: real_probs(logits, **dict(tf, temperature=0)))
    for kw in loops:
        x, _ = speculate(model, 24, 8, Sampling(generator=gen(3)), k=4, order=st['order'], **kw)
        assert torch.equal(x, ref)


@pytest.mark.parametrize('mode', ['dynamic', 'static'])
def test_compacting_the_per_sample_cache_changes_nothing(monkeypatch, mode):
    """Per-sample commits leave holes in the buffer; when it runs out, RowCache.room moves each sample's
    kept slots to the front. Attention does not see where a key sits, so a buffer small enough to compact
    often gives the same samples as the roomy default."""
    model = mixy(seed=5, block_size=32, vocab_size=11)
    kw = dict(k=6, batch_commit='per_row', given=torch.tensor([3] + [-1] * 23))
    a, _ = speculate(model, 24, 16, Sampling(vocab_size=11, generator=gen(7)), **kw)
    real, seen = engine.RowCache.room, []

    def spy(cache, r):
        seen.append(cache.len + r > cache.limit)
        return real(cache, r)
    monkeypatch.setattr(engine.RowCache, 'room', spy)
    # about n + 1 slots for the kept ones + the widest call (static: 32 with the scratch row)
    monkeypatch.setattr(speculative, 'row_slots', lambda n, sp=None, g=0: 32 if mode == 'dynamic' else 31)
    b, _ = speculate(model, 24, 16, Sampling(vocab_size=11, generator=gen(7)), stepper=mode, **kw)
    assert sum(seen) >= 2 and torch.equal(a, b)


# --------------------------------------------------------------------------- per-sample caches, fused rounds

def checked_calls(model, monkeypatch):
    """Checks every per-sample call against a cache-free recomputation: a shadow keeps each sample's
    committed (token, position, target) rows in commit order, and each call's logits must equal one
    uncached pass per sample over its kept rows (causal: each saw every row kept before it) and the
    call's rows under the call's own mask. Returns the list of per-call maximum differences."""
    # the per-sample mask lives on RowCache; the shadow rebuilds it, so a wrong one shows
    shadow, last, diffs = {}, {}, []
    real_fwd, real_commit = model.forward_slots, engine.RowCache.commit

    def fwd(tok, pos, tgt, mask=None, kv=None, n_logits=None):
        out = real_fwd(tok, pos, tgt, mask=mask, kv=kv, n_logits=n_logits)
        L, r = kv[0].len, tok.size(1)
        last['rows'] = torch.stack([tok, pos, tgt], 2)                          # (B, r, 3)
        worst = 0.0
        for b in range(tok.size(0)):
            kept = shadow.get(b, torch.zeros(0, 3, dtype=torch.long))
            full = torch.cat([kept, last['rows'][b]])                            # (Lk + r, 3)
            Lk = kept.size(0)
            m = torch.zeros(Lk + r, Lk + r, dtype=torch.bool)
            m[:Lk, :Lk] = torch.ones(Lk, Lk, dtype=torch.bool).tril()
            m[Lk:, :Lk] = True
            m[Lk:, Lk:] = mask[b, 0, :, L:]
            ref = real_fwd(*full.T[:, None], mask=m, n_logits=n_logits)[0]
            worst = max(worst, (ref - out[b]).abs().max().item())
        diffs.append(worst)
        return out

    def commit(self, keep):
        for b in range(keep.size(0)):
            rows = last['rows'][b][keep[b]]
            shadow[b] = torch.cat([shadow.get(b, torch.zeros(0, 3, dtype=torch.long)), rows])
        real_commit(self, keep)
    monkeypatch.setattr(model, 'forward_slots', fwd)
    monkeypatch.setattr(engine.RowCache, 'commit', commit)
    return diffs


@pytest.mark.parametrize('kw', [dict(k=3), dict(k='auto', order='l2r'), dict(k=4, fused=True),
                                dict(k='auto', fused=True, top_p=0.8), dict(k=2, fused=True, bug='holes')])
@pytest.mark.parametrize('cond', [dict(cond='adaln'), dict(cond='sigma'), ROPE])
def test_per_sample_cache_equals_a_cache_free_recomputation(monkeypatch, kw, cond):
    """Per-sample commits (two-call and fused rounds), with holes in the buffer and compaction: every
    call's logits equal an uncached pass over what that sample committed. The control attends over the
    holes too (the rows a sample did not keep), and the check must see it."""
    kw = dict(kw)
    holes = bool(kw.pop('bug', None))
    if holes:
        monkeypatch.setattr(engine.RowCache, 'mask', lambda self, inner: torch.cat(
            [torch.ones(self.shape[0], inner.size(0), self.len, dtype=torch.bool), inner.expand(
                self.shape[0], -1, -1)], 2)[:, None])
    model = mixy(seed=5, block_size=32, vocab_size=11, **cond)
    n, B = 24, 4
    given = torch.full((n,), -1)
    given[[0, 1, 9]] = torch.tensor([4, 9, 1])
    monkeypatch.setattr(speculative, 'row_slots', lambda n, sp=None, g=0: 96)   # compacts now and then
    diffs = checked_calls(model, monkeypatch)
    s, kw = split_settings(kw, generator=gen(3))
    speculate(model, n, B, s, given=given, batch_commit='per_row', **kw)
    assert len(diffs) > 4
    assert (max(diffs) > 1e-3) if holes else (max(diffs) < 1e-9)


PERM4 = (2, 0, 3, 1)


@pytest.mark.parametrize('kw, orders, n', [
    (dict(order='l2r', k=2), L2R4, 4), (dict(order='l2r', k=2), [tuple(range(5))], 5),
    (dict(order='l2r', k=3), [tuple(range(5))], 5), (dict(order=torch.tensor(PERM4), k=3), [PERM4], 4),
    (dict(order='semiar:2', k=2), [a + b for a in itertools.permutations((0, 1))
                                   for b in itertools.permutations((2, 3))], 4),
    (dict(order='random', k='auto'), PERMS4, 4),
    (dict(order='random', k=2, given=torch.tensor([-1, 1, -1, -1])), PERMS4, 4),
    (dict(order='l2r', k=3, temperature=0.7, top_p=0.8), L2R4, 4)])
def test_fused_rounds_are_the_exact_joint(m4, kw, orders, n):
    """One call a round: every draft, the first too, is tested against the true conditional, and the
    drafts miss the round's last token. Still the exact law in each setting; k in {2, 3} (the drafts a
    round can use are capped by what is left, so k = n is k = n - 2 here)."""
    x, st = run(m4, n=n, fused=True, batch_commit='per_row', **kw)
    tf = {key: kw[key] for key in ('temperature', 'top_p') if key in kw}
    assert passes(m4, x, orders, n=n, given=kw.get('given'), **tf)
    assert st['calls_per_sample'] < st['tokens_generated'] and max(st['committed']) > 1.5
    if n == 4:  # power: another law is rejected
        assert not passes(m4, x, PERMS4 if orders != PERMS4 else L2R4, n=4, given=kw.get('given'), **tf)


@pytest.mark.parametrize('bug', [None, keep_rejected, stale_q])
def test_fused_negative_controls_are_rejected(bug, monkeypatch):
    """A rejected chain row left in the cache, and drafts tested against another row's proposal (the
    ratio p/q with the wrong q): the same chi-square rejects both, and passes the same run without the
    bug. Fused drafts miss one token only, so this needs a model whose conditionals lean hard on the
    tokens before them (strong attention noise, a sharp head) and sequences long enough (n = 6 over two
    ids) for drafts that outlive a rejection."""
    model = mixy(s=2.0, head=10.0)
    if bug:
        bug(monkeypatch)
    x, _ = run(model, n=6, V=2, fused=True, batch_commit='per_row', order='l2r', k=2)
    assert passes(model, x, [tuple(range(6))], n=6, V=2) == (bug is None)


def test_fused_rows_commit_different_counts_and_one_call_a_round(m4):
    _, st = speculate(m4, 4, 256, Sampling(vocab_size=3, generator=gen(1)), k=2, order='l2r',
                                 fused=True, trace=True)
    assert len(set(st['events'][1][2].tolist())) > 1
    assert st['forward_calls'] == st['rounds'] and st['calls_per_sample'] <= st['rounds']


def test_fused_needs_per_row_commits_and_the_bonus(m4):
    for bad in (dict(batch_commit='min'), dict(bonus=False)):
        with pytest.raises(ValueError, match='fused'):
            speculate(m4, 4, 2, fused=True, **bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a GPU (bench/gpu_suite.sh graphs)')
@pytest.mark.parametrize('fused', [False, True])
def test_cuda_graph_speculative_equals_static_on_gpu(fused, backbone):
    """Replayed graphs (RowStepper, its per-sample masks, the fused call's tree mask) give the eager
    fixed-shape path's samples, in float32, with given tokens and a reused stepper."""
    model = mixy(seed=8, block_size=40, vocab_size=11, s=0.1, **backbone).float().cuda()
    n, B = 40, 3
    given = torch.full((n,), -1)
    given[[0, 5, 17]] = torch.tensor([4, 9, 1])
    kw = dict(k=3, fused=fused, given=given)
    out = {}
    for mode in ('static', 'cuda_graph'):
        step = speculative.row_stepper(model, B, mode, n, Speculation(3, fused=fused), 3, kv_bucket=16)
        out[mode] = [speculate(model, n, B, Sampling(generator=gen(s)), stepper=step, **kw)[0]
                     for s in (4, 5)]
    assert all(torch.equal(a, b) for a, b in zip(out['static'], out['cuda_graph']))


@torch.no_grad()
def test_its_law_is_the_lemma1_samplers_at_one_token_a_step_only(m4):
    """What the docstrings claim, checked against the code: the speculative law (the chain along a uniform
    order, which the tests above sample) is generate_ao's with fixed counts at T >= n (every step reveals one
    token), but not generate_ao's at T = n with random counts, where steps may reveal several tokens. That law
    is exact: a mixture over the compositions of n into the nonzero per-step counts, each of T linear steps'
    bins taking a position with probability 1/T, so (c_1..c_r) has probability C(T, r) n!/prod c_i! / T^n."""
    from test_sample import ao_law
    n, V = 3, 3
    for T in (n, n + 1, 3 * n):
        assert generate.reveal_counts(n, T, fixed=True).tolist() == [1] * n + [0] * (T - n)
    xs, chain = seq_law(m4, n, V, list(itertools.permutations(range(n))))
    comps = [[b - a for a, b in zip((0,) + cuts, cuts + (n,))] for r in range(n) for cuts in
             itertools.combinations(range(1, n), r)]                        # every composition of n
    laws = {tuple(c): ao_law(m4, n, V, c)[1] for c in comps}
    assert torch.allclose(laws[(1,) * n], chain, rtol=1e-12, atol=0)

    def random_counts_law(T):
        return sum(math.comb(T, len(c)) * math.factorial(n) / math.prod(map(math.factorial, c)) / T ** n * law
                   for c, law in laws.items())
    at_n, at_8n = random_counts_law(n), random_counts_law(8 * n)
    assert float(at_n.sum()) == pytest.approx(1, abs=1e-12) and float(at_8n.sum()) == pytest.approx(1, abs=1e-12)
    tv_n, tv_8n = (float((law - chain).abs().sum()) / 2 for law in (at_n, at_8n))
    assert tv_n > 0.01 and tv_8n < tv_n / 4, (tv_n, tv_8n)
    # the weight of one token a step at T = n, n!/n^n, against the code's own counts
    g = gen(11)
    ones = sum(generate.reveal_counts(n, n, generator=g).tolist() == [1] * n for _ in range(4000)) / 4000
    p = math.factorial(n) / n ** n
    assert abs(ones - p) < 5 * math.sqrt(p * (1 - p) / 4000), ones


def test_the_samplers_name_the_order_grammar_of_orders_py(m4):
    """The order a sampler takes is orders.py's grammar (nearl2r:W and mix: too), which its docstring points
    to and its refusal names whole, not a list of some of the kinds."""
    from aogpt.orders import GRAMMAR
    for f in (generate.generate_ao, generate_speculative, generate.free_order, generate.check_order):
        assert 'orders.GRAMMAR' in f.__doc__ and 'blocks:K' not in f.__doc__, f.__name__
    with pytest.raises(ValueError) as e:
        speculate(m4, 4, 2, order='margin')
    assert GRAMMAR in str(e.value) and 'nearl2r:W' in str(e.value) and 'mix:' in str(e.value)
