"""eval_ppl.py: every estimator against exact enumeration on tiny models, the DDP split, and the CLI."""
import hashlib
import itertools
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
from helpers import exact_law, tiny

import eval_ppl as E
from aogpt import likelihood as L
from aogpt.checkpoint import save_checkpoint
from aogpt.errors import UserError
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sharp(seed=2, scale=4.0, **kw):
    """tiny() with every matrix scaled up: peaked conditionals that depend visibly on the context
    order, so the ensemble differs from a single member by many standard errors."""
    model = tiny(seed=seed, **kw)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(scale)
    return model


def per_token(v, n):
    """Per-chunk NLL sums -> (mean per-token NLL, its standard error)."""
    v = v / n
    return v.mean().item(), v.std().item() / math.sqrt(len(v))


def enumerate_ensemble(model, x, M):
    """Exact expected per-token NLL of the M-member context-order ensemble, by brute force.

    Every conditional p(x_j | context C revealed in order o) comes from model.forward on the full
    order o + (j,) + rest, over all n! orders (no forward_queries, no estimator code). Then
        Q_M = (1/n) sum_i E_{C uniform |C|=i} E_{j not in C} E_{o_1..o_M iid orderings of C} -log mean_m p_m,
    averaging over all M-tuples of orderings. M=1 is the plain any-order loss E_sigma mean_i -log p.
    """
    n = len(x)
    perms = list(itertools.permutations(range(n)))
    xs = x.expand(len(perms), n)
    with torch.no_grad():
        _, nll = model(xs, order=torch.tensor(perms), targets=xs, reduction='none')
    logp = {}
    for p, row in zip(perms, nll.tolist()):
        for i in range(n):
            logp[(p[:i], p[i])] = -row[i]
    total = 0.0
    for i in range(n):
        vals = []
        for C in itertools.combinations(range(n), i):
            for j in sorted(set(range(n)) - set(C)):
                lp = [logp[(o, j)] for o in itertools.permutations(C)]
                f = [-math.log(sum(math.exp(a) for a in t) / M) for t in itertools.product(lp, repeat=M)]
                vals.append(sum(f) / len(f))
        total += sum(vals) / len(vals)  # every (C, j) pair of size i is equally likely
    return total / n


# --------------------------------------------------------------------------------------- L2R

@pytest.mark.parametrize('cond', ['adaln', 'none'])
def test_l2r_equals_prefix_by_prefix_computation(cond, backbone):
    model = tiny(**backbone, cond=cond)
    x = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(0))
    total, count = L.nll_l2r(model, x, batch_size=2)
    # direct: feed each prefix x_<i+1 alone and read -log p(x_i) off its last slot; the first token is
    # predicted from [None] (the paper's n predictions, not HF's n-1)
    ref = 0.0
    with torch.no_grad():
        for i in range(8):
            logits, _ = model(x[:, :i + 1])
            ref -= logits[:, -1].log_softmax(-1).gather(1, x[:, i:i + 1]).sum().item()
    assert count == 3 * 8
    assert total == pytest.approx(ref, rel=1e-5)


def test_l2r_encoder_is_the_masked_suffix_chain_rule(backbone):
    V = 11
    model = tiny(**backbone, causal=False, cond='none', vocab_size=V + 1, mask_token_id=V)
    x = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(1))
    total, count = L.nll_l2r(model, x, batch_size=4)
    ref = 0.0
    with torch.no_grad():
        for b in range(2):
            for i in range(6):
                xt = x[b:b + 1].clone()
                xt[0, i:] = V
                ref -= model(xt)[0][0, i].log_softmax(-1)[x[b, i]].item()
    assert count == 12
    assert total == pytest.approx(ref, rel=1e-5)


# --------------------------------------------------------------------------------------- any-order & ensemble

X4 = torch.tensor([3, 7, 0, 9])  # one chunk of n = 4 tokens, evaluated many times for Monte Carlo


def test_fast_and_exact_ensemble_match_enumeration(backbone):
    # a model whose exact ensemble gain is large (0.29 nats/token), so the power check at the end holds
    # with room; the agreement checks hold for any model
    model, n, M = sharp(seed=1, scale=5.0, **backbone), 4, 4
    q1 = enumerate_ensemble(model, X4, 1)
    qM = enumerate_ensemble(model, X4, M)
    g = torch.Generator().manual_seed(0)
    ens, member = L.nll_ensemble(model, X4.expand(4000, n), M, 'fast', g, 1, 512)
    fast, fast_se = per_token(ens, n)
    # the mean member on the same draws estimates the plain any-order loss (eval_ppl's control variate)
    mem, mem_se = per_token(member, n)
    assert abs(mem - q1) < 4 * mem_se, (mem, q1, mem_se)
    exact, exact_se = per_token(L.nll_ensemble(model, X4.expand(600, n), M, 'exact', g, 1, 512)[0], n)
    assert abs(fast - qM) < 4 * fast_se, (fast, qM, fast_se)
    assert abs(exact - qM) < 4 * exact_se, (exact, qM, exact_se)
    assert abs(fast - exact) < 4 * math.hypot(fast_se, exact_se)
    # power: the ensemble's expected loss is visibly below the single-member loss at this precision
    assert q1 - qM > 5 * fast_se, (q1, qM, fast_se)


def test_one_member_reproduces_the_plain_any_order_loss(backbone):
    model, n = sharp(**backbone), 4
    q1 = enumerate_ensemble(model, X4, 1)
    g = torch.Generator().manual_seed(1)
    ens, member = L.nll_ensemble(model, X4.expand(8000, n), 1, 'fast', g, 1, 512)
    assert torch.equal(ens, member)  # one member: the mixture is the member itself
    fast, se = per_token(ens, n)
    assert abs(fast - q1) < 4 * se, (fast, q1, se)
    ao, ao_se = per_token(L._any_order_per_chunk(model, X4.expand(4000, n), 1, g, 512), n)
    assert abs(ao - q1) < 4 * ao_se, (ao, q1, ao_se)
    # the public wrappers return token-weighted sums of the same per-chunk numbers
    s, cnt = L.nll_any_order(model, X4.expand(10, n), 3, torch.Generator().manual_seed(2))
    ref = L._any_order_per_chunk(model, X4.expand(10, n), 3, torch.Generator().manual_seed(2), 8).sum()
    assert cnt == 40 and s == pytest.approx(ref.item())


@pytest.mark.parametrize('spec', ['semiar:2', 'nearl2r:2.5', 'mix:0.3*l2r+0.7*semiar:3'])
def test_order_bound_is_the_expectation_over_its_law(spec, backbone):
    """The bound under an order distribution against its exact value, sum over every permutation of its
    probability (helpers.exact_law, by enumeration) times -log p_sigma(x); the uniform bound is another
    number. Its edges: 'random' is nll_any_order on the same draws, 'l2r' and semiar:1 the exact L2R NLL. (A model
    whose bounds lie 0.3-0.83 nats from the uniform one on both blocks, so the power check holds with room.)"""
    model, n = sharp(seed=4, scale=6.0, **backbone), 4
    law = exact_law(spec, range(4))
    perms = [p for p in law if law[p]]
    xs = X4.expand(len(perms), n)
    with torch.no_grad():
        nll = model(xs, order=torch.tensor(perms), targets=xs, reduction='none')[1].sum(1)
    exact = sum(float(law[p]) * v for p, v in zip(perms, nll.tolist())) / n
    est, se = per_token(L._any_order_per_chunk(model, X4.expand(4000, n), 1, torch.Generator().manual_seed(3),
                                               512, spec=spec), n)
    assert abs(est - exact) < 4 * se, (est, exact, se)
    assert abs(enumerate_ensemble(model, X4, 1) - exact) > 10 * se  # power: the uniform bound is far
    chunks = torch.randint(0, 11, (6, 8), generator=torch.Generator().manual_seed(4))
    assert L.nll_order(model, chunks, 'random', 2, torch.Generator().manual_seed(5)) == \
        L.nll_any_order(model, chunks, 2, torch.Generator().manual_seed(5))
    l2r = L.nll_l2r(model, chunks)
    for edge in ('l2r', 'semiar:1', 'nearl2r:0'):
        s, cnt = L.nll_order(model, chunks, edge, 2, torch.Generator())
        assert cnt == l2r[1] and s == pytest.approx(l2r[0], rel=1e-6), edge


@pytest.mark.parametrize('mode', ['fast', 'exact'])
def test_ensemble_never_worse_than_its_mean_member_on_the_same_draws(mode, backbone):
    model = sharp(seed=2, **backbone)
    x = torch.randint(0, 11, (6, 8), generator=torch.Generator().manual_seed(3))
    ens, member = L.nll_ensemble(model, x, 4, mode, torch.Generator().manual_seed(4), 2, 16)
    assert ens.shape == member.shape == (6,) and ens.dtype == torch.float64
    assert not ens.requires_grad  # no autograd graph kept across a whole dataset
    assert (ens <= member + 1e-9).all()              # Jensen: -log mean p <= mean -log p, per target
    assert (member - ens).min() > 1e-3               # strict: probabilities, not log-probs, are averaged


def test_nested_ensemble_sizes_share_their_draws(backbone):
    """A tuple of sizes (finding 4's use) gives, for each M, the ensemble of the first M orderings on the
    same draws: the largest equals the one-size estimate on the same seed, and the sizes differ."""
    model = sharp(seed=2, **backbone)
    chunks = torch.randint(0, 11, (5, 8), generator=torch.Generator().manual_seed(0))
    est, member = L.nll_ensemble(model, chunks, (1, 2, 4), 'fast', torch.Generator().manual_seed(3), 3, 8)
    ref, ref_member = L.nll_ensemble(model, chunks, 4, 'fast', torch.Generator().manual_seed(3), 3, 8)
    assert est.shape == (3, 5)
    torch.testing.assert_close(est[-1], ref)
    torch.testing.assert_close(member, ref_member)
    assert not torch.allclose(est[0], est[-1])       # the members differ, so the test has teeth
    assert (est[-1] <= member + 1e-9).all()          # Jensen on the same draws
    with pytest.raises(ValueError, match='one member count'):
        L.nll_ensemble(model, chunks, (1, 2), 'exact')


def test_any_order_estimators_refuse_a_left_to_right_gpt():
    model = tiny(cond='none')
    x = torch.randint(0, 11, (2, 8))
    with pytest.raises(ValueError):
        L.nll_any_order(model, x)
    with pytest.raises(ValueError):
        L.nll_ensemble(model, x, 2)


def test_stratified_counts_cover_every_stratum():
    g = torch.Generator().manual_seed(0)
    for n, r in ((5, 1), (7, 3)):
        ls = L.stratified_counts(n * r, n, g)
        assert torch.equal(torch.bincount(ls, minlength=n + 1)[1:], torch.full((n,), r))
    # marginally uniform: the mean over many independent calls of one slot
    first = torch.stack([L.stratified_counts(3, 8, g)[0] for _ in range(4000)]).double()
    assert abs(first.mean().item() - 4.5) < 4 * first.std().item() / math.sqrt(4000)


# --------------------------------------------------------------------------------------- encoder MDM

@pytest.mark.parametrize('estimator', ['count', 'time'])
def test_mdm_elbo_matches_enumeration_over_orders(estimator, backbone):
    V, n = 5, 4
    model = sharp(seed=6, scale=3.0, **backbone, causal=False, cond='none', vocab_size=V + 1, mask_token_id=V)
    x = torch.tensor([1, 4, 0, 2])
    # exact: the mean over all n! orders of sum_i -log p(x_si | x_s<i), the rest [MASK]
    rows, tgt = [], []
    for perm in itertools.permutations(range(n)):
        for i in range(n):
            xt = torch.full((n,), V)
            xt[list(perm[:i])] = x[list(perm[:i])]
            rows.append(xt)
            tgt.append(perm[i])
    with torch.no_grad():
        logp = model(torch.stack(rows))[0].log_softmax(-1)
    exact = -logp[torch.arange(len(rows)), torch.tensor(tgt), x[torch.tensor(tgt)]].sum().item()
    exact /= math.factorial(n) * n
    N = 20000
    g = torch.Generator().manual_seed(5)
    est, se = per_token(L._mdm_elbo_per_chunk(model, x.expand(N, n), 1, g, estimator, 4096), n)
    assert abs(est - exact) < 4 * se, (est, exact, se)
    # nll_any_order on an encoder is its ELBO
    s, cnt = L.nll_any_order(model, x.expand(50, n), 2, torch.Generator().manual_seed(7), batch_size=64)
    ref = L._mdm_elbo_per_chunk(model, x.expand(50, n), 2, torch.Generator().manual_seed(7), 'count', 64)
    assert cnt == 200 and s == pytest.approx(ref.sum().item())


def _per_column(by):
    """(N, n) per-chunk NLLs by tokens revealed -> each column's mean over the chunks and its standard error."""
    return by.mean(0), by.std(0) / math.sqrt(len(by))


@pytest.mark.parametrize('causal', [True, False])
def test_by_revealed_splits_the_bound_by_what_each_prediction_saw(causal, backbone):
    """nll_by_revealed's column r against its exact value by enumeration: the mean over every order of the NLL of
    the prediction made after r tokens (a decoder: slot r of the order; the encoder: the position order[r] with
    the tokens at order[:r] revealed and the rest [MASK], one forward each, no estimator code). A decoder's slots
    and the ELBO's mask counts thus land in the same column r, so a loss can be split by what each prediction saw;
    the columns add up to nll_any_order's sum on the same draws (the same per-chunk sums, bit for bit)."""
    V, n = 11, 4
    if causal:
        model, x = sharp(seed=4, scale=5.0, **backbone), X4
    else:
        model = sharp(seed=6, scale=3.0, **backbone, causal=False, cond='none', vocab_size=V + 1, mask_token_id=V)
        x = torch.tensor([1, 4, 0, 2])
    perms = torch.tensor(list(itertools.permutations(range(n))))
    with torch.no_grad():
        if causal:
            exact = model(x.expand(len(perms), n), order=perms, targets=x.expand(len(perms), n),
                          reduction='none')[1].double().mean(0)                     # (n,): slot r
        else:
            exact = torch.zeros(n, dtype=torch.float64)
            for r in range(n):
                xt = torch.full((len(perms), n), V)
                xt[torch.arange(len(perms))[:, None], perms[:, :r]] = x[perms[:, :r]]
                logp = model(xt)[0].log_softmax(-1).double()                          # (n!, n, V)
                exact[r] = -logp[torch.arange(len(perms)), perms[:, r], x[perms[:, r]]].mean()
    est, se = _per_column(L.nll_by_revealed(model, x.expand(20000, n), 1, torch.Generator().manual_seed(3), 4096))
    assert ((est - exact).abs() < 4 * se).all(), (est, exact, se)
    if causal:  # power: the columns lie far apart, so a mix-up would show (a random encoder's barely differ: the
        assert (exact[0] - exact[-1]).abs() > 10 * se.max()  # next test checks its columns exactly)
    chunks = torch.randint(0, V, (6, 8), generator=torch.Generator().manual_seed(4))
    by = L.nll_by_revealed(model, chunks, 2, torch.Generator().manual_seed(5))
    s, cnt = L.nll_any_order(model, chunks, 2, torch.Generator().manual_seed(5))
    assert by.shape == (6, 8) and cnt == 48 and s == by.sum(1).sum().item()


class RevealCounter(torch.nn.Module):
    """An encoder whose NLL at every masked position is 1 + the number of tokens revealed in its row: the exact
    value of nll_by_revealed's column r is then 1 + r."""

    def __init__(self, n):
        super().__init__()
        self.config = GPTConfig(block_size=n, vocab_size=12, n_layer=1, n_head=1, n_embd=4, causal=False, cond='none',
                                mask_token_id=11)
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, xt, targets=None, reduction='none'):
        masked = xt == self.config.mask_token_id
        return None, torch.where(masked, 1.0 + (~masked).sum(1, keepdim=True), 0.0)


def test_elbo_draws_land_in_the_column_of_the_tokens_they_reveal():
    """Each of the ELBO's draws (k masked, weight n/k) goes to column n - k: with counts stratified over a multiple
    of n draws every k comes up equally often, so each column's mean is exactly 1 + r here (small integers in
    float64: no rounding), and the row sums are the ELBO's per-chunk sums."""
    n = 8
    by = L.nll_by_revealed(RevealCounter(n), torch.zeros(40 * n, n, dtype=torch.long), 1,
                           torch.Generator().manual_seed(0), 64)
    assert torch.equal(by.mean(0), torch.arange(1, n + 1, dtype=torch.float64))
    assert torch.equal(by.sum(1), L._mdm_elbo_per_chunk(RevealCounter(n), torch.zeros(40 * n, n, dtype=torch.long),
                                                        1, torch.Generator().manual_seed(0), 'count', 64))


# --------------------------------------------------------------------------------------- DDP split

def test_rank_slices_cover_every_chunk_exactly_once():
    for world in range(1, 5):
        for N in range(0, 14):
            got = [i for r in range(world) for i in range(N)[E.rank_slice(N, r, world)]]
            assert got == list(range(N)), (world, N, got)
            sizes = [len(range(N)[E.rank_slice(N, r, world)]) for r in range(world)]
            assert max(sizes) - min(sizes) <= 1  # balanced


# --------------------------------------------------------------------------------------- the CLI

TEXT = ("the quick brown fox jumps over the lazy dog . " * 3 + "\n") * 40


def make_ckpt(path, vocab_size=50304, dataset='none_such', **kw):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=16, vocab_size=vocab_size, n_layer=1, n_head=2, n_embd=16, target_dim=8, **kw)
    model = GPT(cfg)
    ema = {'decay': 0.9, 'num_updates': 1,
           'params': {k: v.detach() + 0.01 for k, v in model.named_parameters()}}
    save_checkpoint({'format': 'aogpt-v1', 'model_args': asdict(cfg), 'model': model.state_dict(), 'ema': ema,
                     'iter_num': 7, 'config': {'dataset': dataset}}, os.path.join(path, 'ckpt.pt'))


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / 'tiny.txt'
    p.write_text(TEXT)
    return str(p)


def run_cli(args, capsys):
    E.main(args + ['--progress', 'False'])
    return capsys.readouterr().out


def test_cli_table_and_json_match_the_functions(tmp_path, text_file, capsys):
    from aogpt.checkpoint import load_model
    from aogpt.evalsets import load_eval_chunks
    from aogpt.tokenizer import get_codec
    make_ckpt(tmp_path / 'out')
    out = run_cli(['--out_dir', str(tmp_path / 'out'), '--datasets', 'ptb', '--data_path', f'ptb={text_file}',
                   '--ensemble', '2', '--eval_orders', '2', '--max_chunks', '6'], capsys)
    assert 'L2R PPL' in out and 'any-order PPL' in out and 'ens x2 PPL' in out
    res = json.load(open(tmp_path / 'out' / 'eval_ppl.json'))
    assert res['ema'] is True and res['codec'] == 'gpt2' and res['block_size'] == 16
    row = res['datasets']['ptb']
    assert row['chunks'] == 6 and row['tokens'] == 96
    # the L2R number is deterministic: recompute it from the same chunks and EMA weights
    model, _, _ = load_model(str(tmp_path / 'out'), 'cpu')
    chunks = load_eval_chunks('ptb', get_codec(None), 16, path=text_file)[:6]
    # the record names the tokens it scored, computed here independently of eval_ppl's helper
    assert row['data'] == hashlib.sha256(chunks.to(torch.int64).numpy().tobytes()).hexdigest()[:16]
    s, cnt = L.nll_l2r(model, chunks)
    assert row['l2r']['nll'] == pytest.approx(s / cnt, rel=1e-6)
    assert row['l2r']['ppl'] == pytest.approx(math.exp(s / cnt), rel=1e-6)
    assert f"{row['l2r']['ppl']:.2f}" in out
    s, cnt = L.nll_any_order(model, chunks, 2, torch.Generator().manual_seed(1337))  # the seed, rank 0
    assert row['any_order']['nll'] == pytest.approx(s / cnt, rel=1e-6)
    ens = row['ensemble']
    assert ens['nll_direct'] <= ens['mean_member_nll']  # Jensen on the same draws
    # the reported number: any-order minus the gain on identical draws, so never above any-order
    assert ens['nll'] == pytest.approx(row['any_order']['nll'] - (ens['mean_member_nll'] - ens['nll_direct']))
    assert ens['nll'] <= row['any_order']['nll']
    direct, _ = L.nll_ensemble(model, chunks, 2, 'fast', torch.Generator().manual_seed(1337))
    assert ens['nll_direct'] == pytest.approx(direct.sum().item() / chunks.numel(), rel=1e-6)


def test_cli_order_distribution_column(tmp_path, text_file, capsys):
    """--order SPEC: a column beside L2R and any-order, the bound recomputed from the same seed (its own
    generator: adding it leaves the any-order column's draws as they were)."""
    from aogpt.checkpoint import load_model
    from aogpt.evalsets import load_eval_chunks
    from aogpt.tokenizer import get_codec
    make_ckpt(tmp_path / 'out')
    args = ['--out_dir', str(tmp_path / 'out'), '--datasets', 'ptb', '--data_path', f'ptb={text_file}',
            '--eval_orders', '2', '--max_chunks', '6']
    run_cli(args, capsys)
    plain = json.load(open(tmp_path / 'out' / 'eval_ppl.json'))['datasets']['ptb']
    out = run_cli(args + ['--order', 'nearl2r:3'], capsys)
    res = json.load(open(tmp_path / 'out' / 'eval_ppl.json'))
    row = res['datasets']['ptb']
    assert 'nearl2r:3 PPL (<=)' in out and res['order'] == 'nearl2r:3' and row['order']['spec'] == 'nearl2r:3'
    assert row['any_order'] == plain['any_order'] and plain['order'] is None
    model, _, _ = load_model(str(tmp_path / 'out'), 'cpu')
    chunks = load_eval_chunks('ptb', get_codec(None), 16, path=text_file)[:6]
    s, cnt = L.nll_order(model, chunks, 'nearl2r:3', 2, torch.Generator().manual_seed(1337))
    assert row['order']['nll'] == pytest.approx(s / cnt, rel=1e-6) and f"{row['order']['ppl']:.2f}" in out
    assert 'note: order' not in out  # semiar:K with K >= the block is the uniform law: said in one line
    out = run_cli(args + ['--order', 'semiar:16'], capsys)
    assert 'note: order semiar:16: semiar:16 at length 16 puts all 16 positions in one block, which is the uniform ' \
           'random order' in out


def test_cli_gpt_shows_na_and_char_level_reports_bpc(tmp_path, text_file, capsys):
    make_ckpt(tmp_path / 'gpt', cond='none')
    out = run_cli(['--out_dir', str(tmp_path / 'gpt'), '--datasets', 'ptb', '--data_path', f'ptb={text_file}',
                   '--ensemble', '2', '--json_out', str(tmp_path / 'g.json')], capsys)
    line = [ln for ln in out.splitlines() if ln.startswith('ptb')][0]
    assert line.split()[-2:] == ['n/a', 'n/a']
    res = json.load(open(tmp_path / 'g.json'))['datasets']['ptb']
    assert res['l2r'] is not None and res['any_order'] is None and res['ensemble'] is None
    # a char-level model: the codec comes from its data dir's meta.json; bits per character reported
    chars = sorted(set(TEXT))
    ddir = tmp_path / 'data_char'
    ddir.mkdir()
    (ddir / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'chars': chars, 'vocab_size': len(chars),
                                                'eot': None}))
    make_ckpt(tmp_path / 'char', vocab_size=len(chars), dataset=str(ddir))
    out = run_cli(['--out_dir', str(tmp_path / 'char'), '--datasets', 'ptb', '--data_path', f'ptb={text_file}',
                   '--max_chunks', '4'], capsys)
    assert 'char codec' in out and 'L2R bpc' in out
    res = json.load(open(tmp_path / 'char' / 'eval_ppl.json'))['datasets']['ptb']
    assert res['l2r']['bpc'] == pytest.approx(res['l2r']['nll'] / math.log(2))


def test_a_gpt_trained_on_a_fixed_order_is_scored_exactly_in_it(tmp_path, text_file, capsys):
    """A GPT (cond='none') trained on one fixed order (train.py --cond=none --order=fixed:S) is never told which
    position comes next: its likelihood is along that order. eval_ppl once reported only L2R for it (3.06 nats
    against 2.88 in its own order) and refused --order fixed:3; now the exact column of its own order, said so,
    and no L2R column (an order it never saw)."""
    from aogpt.checkpoint import load_checkpoint, load_model
    from aogpt.evalsets import load_eval_chunks
    from aogpt.orders import parse_order
    from aogpt.tokenizer import get_codec
    make_ckpt(tmp_path / 'gpt', cond='none')
    path = str(tmp_path / 'gpt' / 'ckpt.pt')
    perm = parse_order('fixed:3').permutation(16)
    ck = load_checkpoint(path)
    save_checkpoint(dict(ck, config={'dataset': 'none_such', 'order': 'fixed:3'}, order=perm), path)
    args = ['--out_dir', str(tmp_path / 'gpt'), '--datasets', 'ptb', '--data_path', f'ptb={text_file}', '--max_chunks', '4']
    for extra in ([], ['--order', 'fixed:3']):
        out = run_cli(args + extra, capsys)
        res = json.load(open(tmp_path / 'gpt' / 'eval_ppl.json'))
        row = res['datasets']['ptb']
        assert row['l2r'] is None and row['order']['spec'] == 'fixed:3' and row['order']['exact'] is True
        assert 'fixed:3 PPL (exact)' in out and 'GPT trained on the fixed order fixed:3' in out
        assert res['order'] == 'fixed:3' and res['model'] == 'GPT (fixed:3)'
    model, _, _ = load_model(str(tmp_path / 'gpt'), 'cpu')
    chunks = load_eval_chunks('ptb', get_codec(None), 16, path=text_file)[:4]
    with torch.no_grad():  # the chain rule along perm, each conditional read off the forward in that order
        nll = sum(-torch.log_softmax(model(chunks, order=perm.expand(4, 16))[0][:, j].double(), -1)
                  .gather(1, chunks[:, perm[j]][:, None]).sum().item() for j in range(16))
    assert row['order']['nll'] == pytest.approx(nll / chunks.numel(), rel=1e-6)
    assert L.nll_fixed(model, chunks, perm)[0] == pytest.approx(nll, rel=1e-6)
    for extra, says in ((['--order', 'l2r'], '--order l2r: this GPT'), (['--block_size', '8'], 'whole windows')):
        with pytest.raises(SystemExit):
            run_cli(args + extra, capsys)
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err


def test_cli_errors_are_one_line(tmp_path, text_file, capsys):
    with pytest.raises(SystemExit) as e:
        E.main(['--out_dir', str(tmp_path / 'nothing'), '--progress', 'False'])
    err = capsys.readouterr().err.strip()
    assert e.value.code != 0 and len(err.splitlines()) == 1 and 'checkpoint not found' in err
    make_ckpt(tmp_path / 'out')
    with pytest.raises(SystemExit) as e:  # a missing local file
        E.main(['--out_dir', str(tmp_path / 'out'), '--datasets', 'ptb', '--data_path', 'ptb=/no/such.txt',
                '--progress', 'False'])
    err = capsys.readouterr().err.strip()
    assert e.value.code != 0 and len(err.splitlines()) == 1 and '--data_path ptb=' in err
    with pytest.raises(SystemExit) as e:  # a set that is not available offline, and no local copy, with
        E.main(['--out_dir', str(tmp_path / 'out'), '--datasets', 'ptb,lambada',  # --skip_missing False:
                '--data_path', f'ptb={text_file}', '--progress', 'False', '--skip_missing', 'False'])
    cap = capsys.readouterr()  # found before any eval
    err = cap.err.strip()
    assert e.value.code != 0 and len(err.splitlines()) == 1 and '--data_path lambada=' in err
    assert 'L2R PPL' not in cap.out
    with pytest.raises(SystemExit) as e:  # nothing at all can be loaded
        E.main(['--out_dir', str(tmp_path / 'out'), '--datasets', 'lambada,lm1b', '--progress', 'False'])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'none of the requested sets could be loaded (lambada, lm1b)' in err
    with pytest.raises(SystemExit) as e:  # --mdm_l2r on a decoder was silently unused
        E.main(['--out_dir', str(tmp_path / 'out'), '--mdm_l2r', 'True', '--datasets', 'ptb',
                '--data_path', f'ptb={text_file}', '--progress', 'False'])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1 and '--mdm_l2r computes an encoder MDM' in err


@pytest.mark.parametrize('argv,needle', [
    (['--ensemble_mode', 'slow'], 'invalid --ensemble_mode'),
    (['--max_chunks', '-13160'], 'invalid --max_chunks=-13160'),
    (['--max_chunks', '-1'], 'invalid --max_chunks=-1'),
    (['--block_size=-4'], 'invalid --block_size=-4'),
    (['--eval_orders', '0'], 'invalid --eval_orders=0'),
    # the old flags: the count was --orders, the distribution --order_mode (never read as each other)
    (['--orders', '8'], "--orders (a count) is now --eval_orders, the orders drawn per chunk: use --eval_orders 8; "
                        "--order names the order distribution"),
    (['--order_mode', 'semiar:8'], "--order_mode is now --order (the order distribution): use --order semiar:8"),
    (['--order', '8'], "--order names the order distribution (e.g. semiar:8); the orders drawn per chunk are "
                       "--eval_orders 8"),
    (['--use_ema', 'no_thanks'], 'use_ema must be True or False'),
    (['--device', 'cuda'], 'CUDA is not available'),
    (['--device', 'tpu'], '--device must be'),
    (['--dtype', 'int8'], '--dtype must be one of'),
    (['--data_path', 'ptb'], '--data_path expects name=path'),
    (['--datasets', ','], '--datasets is empty'),
    (['--datasets', 'ptbb'], "unknown eval set 'ptbb' (did you mean 'ptb'?)"),  # once "skipped: offline?"
    (['--order', 'semiar:0'], "--order: order 'semiar:0': semiar:K takes an integer K >= 1"),
    (['--order', 'mix:0.5*l2r'], "the weights of a mix sum to 1, these sum to 0.5"),
    (['--ensemble_draws', '3'], "--ensemble_draws is an option of the ensemble column"),  # once silently unused
    (['--ensemble_mode', 'exact'], "--ensemble_mode is an option of the ensemble column"),
    (['--ensemble', '100000000'], "--ensemble must be from 0 to 4096 orderings"),  # once M x n ids held at once
])
def test_bad_values_are_one_line_before_anything_loads(tmp_path, capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        E.main(['--out_dir', str(tmp_path / 'not-even-there'), '--progress', 'False', *argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code != 0 and len(err.splitlines()) == 1 and needle in err, err


def test_the_record_path_is_checked_before_the_checkpoint_loads(tmp_path, text_file, capsys):
    """--json_out to a folder or under a file was found only after the whole evaluation had run (one line,
    but hours lost). Now it is refused first: the checkpoint here does not even exist."""
    (tmp_path / 'f').write_text('a file')
    (tmp_path / 'run').write_text('a file where the default record folder would be')
    for argv, needle in [(['--json_out', str(tmp_path)], f"--json_out {tmp_path} is a folder: name a file in it"),
                         (['--json_out', str(tmp_path / 'f' / 'x.json')], f"the folder {tmp_path / 'f'} is a file"),
                         (['--json_out', str(tmp_path / 'f' / 'a' / 'x.json')],
                          f"{tmp_path / 'f'} is a file, so the folder {tmp_path / 'f' / 'a'} cannot be made"),
                         (['--ckpt', str(tmp_path / 'run' / 'ckpt.pt')],
                          "(where the record goes by default, beside the checkpoint): pass --json_out FILE")]:
        with pytest.raises(SystemExit) as e:
            E.main(['--out_dir', str(tmp_path / 'not-even-there'), '--progress', 'False', *argv])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 1 and len(err.splitlines()) == 1 and needle in err, err
    make_ckpt(tmp_path / 'out')  # a folder that does not exist yet is made, as before
    E.main(['--out_dir', str(tmp_path / 'out'), '--datasets', 'ptb', '--data_path', f'ptb={text_file}',
            '--progress', 'False', '--json_out', str(tmp_path / 'new' / 'deeper' / 'r.json')])
    assert json.load(open(tmp_path / 'new' / 'deeper' / 'r.json'))['datasets']['ptb']['l2r'] is not None


def test_both_eval_commands_put_their_record_by_one_rule(tmp_path, monkeypatch, capsys):
    """eval_ppl.py and eval_harness.py once had a rule each for where a record goes: for hf:owner/repo the
    harness wrote owner_repo.harness.json, eval_ppl repo.eval_ppl.json, and hf:.../ckpt.pt became a bare
    ckpt.eval_ppl.json. One rule now (checkpoint.record_path): the same name for both, only the kind differs,
    and the same refusal line for an unwritable default."""
    import eval_harness as H
    from types import SimpleNamespace
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'run').mkdir()
    cases = {'hf:me/tiny-ao': 'tiny-ao', 'hf:me/tiny-ao@v1': 'tiny-ao@v1', 'hf:me/tiny-ao/v2': 'tiny-ao_v2',
             'hf:them/AO-GPT-MDM/ckpts/ao.pt': 'AO-GPT-MDM_ckpts_ao', 'run': os.path.join('run', ''),
             'run/ckpt.pt': os.path.join('run', ''), 'run/ckpt_0000200.pt': os.path.join('run', 'ckpt_0000200.')}
    for spec, stem in cases.items():
        ppl = E.json_path(SimpleNamespace(json_out='', ckpt=spec, out_dir='out'))
        harness = H.json_path(SimpleNamespace(out='', ckpt=spec, out_dir='out'))
        sep = '' if stem.endswith(('/', '.')) else '.'
        assert (ppl, harness) == (f'{stem}{sep}eval_ppl.json', f'{stem}{sep}harness.json'), spec
    (tmp_path / 'blocked').write_text('a file where the default record folder would be')
    lines = []
    for cmd, argv in ((E.main, []), (H.main, ['--tasks', 'x'])):
        with pytest.raises(SystemExit):
            cmd(argv + ['--ckpt', str(tmp_path / 'blocked' / 'ckpt.pt')])
        lines.append(capsys.readouterr().err.strip())
    blocked = tmp_path / 'blocked'
    assert lines == [f"error: --{flag} {blocked / kind}.json: the folder {blocked} is a file, not a folder (where the "
                     f"record goes by default, beside the checkpoint): pass --{flag} FILE"
                     for flag, kind in (('json_out', 'eval_ppl'), ('out', 'harness'))], lines


def test_offline_default_sets_skip_with_a_line_and_every_eval_is_kept(tmp_path, text_file, capsys):
    """Offline, the default sets that need the hub are skipped in one line before the first forward
    pass, so a run with no flags still scores what it can; each run is kept in the .jsonl history."""
    make_ckpt(tmp_path / 'out')
    out = run_cli(['--out_dir', str(tmp_path / 'out'), '--data_path', f'ptb={text_file}', '--max_chunks', '3'],
                  capsys)
    first = out.index('skipping lambada, wikitext2, wikitext103, lm1b (--skip_missing False fails instead):')
    assert first < out.index('L2R PPL') and re.search(r'^lambada +skipped$', out, re.M)
    assert "\n  lambada: cannot load HF dataset" in out and 'offline and not in the HF cache' in out  # its reason
    res = json.load(open(tmp_path / 'out' / 'eval_ppl.json'))
    assert not any('wikitext2' in n for n in res['notes'])  # no split note for a set that was skipped
    res = json.load(open(tmp_path / 'out' / 'eval_ppl.json'))
    assert list(res['datasets']) == ['ptb'] and set(res['skipped']) == {'lambada', 'wikitext2', 'wikitext103', 'lm1b'}
    run_cli(['--out_dir', str(tmp_path / 'out'), '--datasets', 'ptb', '--data_path', f'ptb={text_file}',
             '--max_chunks', '2'], capsys)
    history = [json.loads(l) for l in open(tmp_path / 'out' / 'eval_ppl.jsonl')]
    assert [h['datasets']['ptb']['chunks'] for h in history] == [3, 2]
    assert json.load(open(tmp_path / 'out' / 'eval_ppl.json'))['datasets']['ptb']['chunks'] == 2
    assert open(tmp_path / 'out' / 'eval_ppl.png', 'rb').read(8) == b'\x89PNG\r\n\x1a\n'


@pytest.mark.slow
def test_torchrun_two_ranks_reduce_to_the_single_process_numbers(tmp_path, text_file):
    """gloo on CPU: two ranks split the chunks with no duplicates; the deterministic L2R column and the
    token counts must equal the single-process run exactly."""
    make_ckpt(tmp_path / 'out')
    common = ['--out_dir', str(tmp_path / 'out'), '--datasets', 'ptb', '--data_path', f'ptb={text_file}',
              '--max_chunks', '7', '--progress', 'False']
    env = dict(os.environ, OMP_NUM_THREADS='1')
    one = subprocess.run([sys.executable, 'eval_ppl.py', *common, '--json_out', str(tmp_path / '1.json')],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2',
                          'eval_ppl.py', *common, '--json_out', str(tmp_path / '2.json')],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert two.returncode == 0, two.stderr[-2000:]
    a = json.load(open(tmp_path / '1.json'))
    b = json.load(open(tmp_path / '2.json'))
    assert b['world_size'] == 2 and b['datasets']['ptb']['tokens'] == a['datasets']['ptb']['tokens'] == 7 * 16
    assert b['datasets']['ptb']['data'] == a['datasets']['ptb']['data']  # every rank's chunks, not rank 0's
    assert b['datasets']['ptb']['l2r']['nll'] == pytest.approx(a['datasets']['ptb']['l2r']['nll'], rel=1e-9)


@pytest.mark.parametrize('name,spoil,needle', [
    ('wikitext2', lambda p: p.write_bytes(bytes(range(128, 256)) * 40),  # not UTF-8
     'cannot be read as text data (it is not UTF-8 text)'),
    ('ptb', None, "PTB has splits train, valid and test, not 'bogus'"),  # --split bogus
    ('owt', None, 'data/openwebtext/val.bin not found'),
])
def test_each_set_that_cannot_load_says_its_own_reason(tmp_path, capsys, monkeypatch, name, spoil, needle):
    """Random bytes as a local copy are one line, not datasets' DatasetGenerationError; with --skip_missing
    (the default) a skipped set prints its real reason, not always "offline and not cached"."""
    from aogpt import evalsets
    monkeypatch.setattr(evalsets, 'ROOT', str(tmp_path))  # no prepared OWT here
    make_ckpt(tmp_path / 'out')
    (tmp_path / 'text.txt').write_text(TEXT)
    argv = ['--out_dir', str(tmp_path / 'out'), '--progress', 'False', '--max_chunks', '2']
    if spoil:
        spoil(tmp_path / 'bad.txt')
        with pytest.raises(SystemExit):
            E.main(argv + ['--datasets', name, '--data_path', f"{name}={tmp_path / 'bad.txt'}"])
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err and 'Traceback' not in err, err
        return
    extra = ['--split', 'bogus'] if name == 'ptb' else []
    out = run_cli(argv + ['--datasets', f'lambada,{name}', '--data_path', f"lambada={tmp_path / 'text.txt'}", *extra],
                  capsys)
    assert f'skipping {name} ' in out and needle in out and 'offline' not in out, out


def test_a_missing_dataset_names_each_path_it_tried_once(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # data_root 'data' is the repo's data/ seen from here: once "data/x and data/x"
    make_ckpt(tmp_path / 'out')
    with pytest.raises(SystemExit):
        E.main(['--out_dir', str(tmp_path / 'out'), '--dataset', 'nothere', '--progress', 'False'])
    err = capsys.readouterr().err.strip()
    assert err == "error: --dataset nothere: no such data directory (tried nothere and data/nothere); leave it " \
                  "empty to use the checkpoint's codec", err


@pytest.mark.parametrize('where', ['record', 'mid-bar'])
def test_an_error_after_or_inside_the_progress_bar_starts_its_own_line(tmp_path, text_file, capsys, monkeypatch, where):
    """The bar (stderr not a terminal, as in a log) left its line open, and the one-line error of a failed record
    write was glued to it; an error raised while the bar runs was too. Both now start a line of their own."""
    make_ckpt(tmp_path / 'out')
    if where == 'record':
        monkeypatch.setattr(E, 'save_record', lambda *a: (_ for _ in ()).throw(OSError(28, 'No space left on device')))
    else:
        monkeypatch.setattr(E, 'nll_any_order', lambda *a: (_ for _ in ()).throw(UserError('the model is broken')))
    with pytest.raises(SystemExit):
        E.main(['--out_dir', str(tmp_path / 'out'), '--datasets', 'ptb', '--data_path', f'ptb={text_file}',
                '--max_chunks', '6', '--json_out', str(tmp_path / 'r.json')])
    err = capsys.readouterr().err
    assert '%|' in err  # the bar ran
    last = err.rstrip('\n').split('\n')[-1]
    assert last == ("error: cannot write " + str(tmp_path / 'r.json') + " (No space left on device); the table above "
                    "has the numbers; pass --json_out FILE" if where == 'record' else "error: the model is broken"), err[-300:]


def test_the_order_is_parsed_once(tmp_path, text_file, capsys, monkeypatch):
    """--order is parsed once, in read_config; every chunk's draws come from that Order."""
    from aogpt import orders
    make_ckpt(tmp_path / 'out')
    made, init = [], orders.Order.__init__
    monkeypatch.setattr(orders.Order, '__init__', lambda self, comps, spec: made.append(spec) or init(self, comps, spec))
    run_cli(['--out_dir', str(tmp_path / 'out'), '--datasets', 'ptb', '--data_path', f'ptb={text_file}',
             '--eval_orders', '2', '--max_chunks', '20', '--batch_size', '4', '--order', 'semiar:4'], capsys)
    assert made == ['semiar:4']
