"""eval_harness.py: our lm-eval model class against the harness's own hf class, orders:K against
enumeration, the encoder's ELBO, other codecs, and the launcher's one-line errors."""
import itertools
import json
import math
import os
from dataclasses import asdict

import pytest
import torch

lm_eval = pytest.importorskip('lm_eval')

from helpers import tiny  # noqa: E402

import eval_harness as H  # noqa: E402
from aogpt.checkpoint import save_checkpoint  # noqa: E402
from aogpt.families import load_hf  # noqa: E402
from aogpt.tokenizer import GPT2_PAT, char_codec, gpt2_codec, gpt2_file  # noqa: E402
from aogpt.likelihood import nll_any_order, nll_l2r, nll_mdm_elbo  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TASK_DIR = os.path.join(HERE, 'harness_tasks')
LL_TASKS = ['aogpt_test_mc', 'aogpt_test_lambada', 'aogpt_test_rolling']
ALL_TASKS = LL_TASKS + ['aogpt_test_gen']


@pytest.fixture(scope='module')
def task_dir(tmp_path_factory):
    """The local task YAMLs with their data paths made absolute (they are written relative to the repo
    root, where a user runs them), so the tests run from any directory."""
    d = tmp_path_factory.mktemp('tasks')
    for name in os.listdir(TASK_DIR):
        text = open(os.path.join(TASK_DIR, name)).read()
        (d / name).write_text(text.replace('tests/harness_tasks/', TASK_DIR + '/'))
    return str(d)


@pytest.fixture(scope='module')
def task_manager(task_dir):
    from lm_eval.tasks import TaskManager
    return TaskManager(include_path=task_dir, include_defaults=False)


@pytest.fixture(scope='module')
def gpt2_dir(tmp_path_factory):
    """A tiny random GPT-2 saved as a Hugging Face folder, with a GPT-2 tokenizer built offline from the
    BPE ranks our own codec reads (so both sides tokenize identically)."""
    transformers = pytest.importorskip('transformers')
    if gpt2_file() is None:
        pytest.skip("openai-whisper (the GPT-2 BPE file) is not installed")
    from transformers.convert_slow_tokenizer import TikTokenConverter
    d = tmp_path_factory.mktemp('gpt2')
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=50257, n_positions=24)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # larger than the default init, so a misplaced position or token shows
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(d)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=TikTokenConverter(vocab_file=gpt2_file(), pattern=GPT2_PAT).converted(),
        eos_token='<|endoftext|>', bos_token='<|endoftext|>', unk_token='<|endoftext|>')
    tok.save_pretrained(d)
    return str(d)


def _evaluate(lm, tm, tasks, **kw):
    kw.setdefault('bootstrap_iters', 0)
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=tm, log_samples=True, **kw)


def _responses(res, task):
    """Every request's raw response, in document then request order."""
    return [r for s in sorted(res['samples'][task], key=lambda s: s['doc_id']) for r in s['resps']]


def _flat(resp):
    r = resp[0] if isinstance(resp, (list, tuple)) and len(resp) == 1 else resp
    return (r,) if isinstance(r, (int, float)) else tuple(r)


# --------------------------------------------------------------------------- the harness's own reference

def test_matches_lm_evals_hf_class_on_gpt2(gpt2_dir, task_manager):
    """Every loglikelihood, is_greedy and rolling sum of ours on load_hf(folder), with
    bos=hf, equals what lm-eval's hf class computes on the same folder (float32), and greedy
    generate_until gives the same strings. The requests include left-truncated windows (contexts longer
    than n_positions) and multi-window rolling texts."""
    from lm_eval.models.huggingface import HFLM
    ref = _evaluate(HFLM(pretrained=gpt2_dir, device='cpu', batch_size=1, dtype='float32'), task_manager, ALL_TASKS)
    ours_lm = H.AOGPTLM(model=load_hf(gpt2_dir), codec=gpt2_codec(), bos='hf', batch_size=3)
    ours = _evaluate(ours_lm, task_manager, ALL_TASKS)
    # greedy generation: the same text, cut at the same stop string
    assert _responses(ours, 'aogpt_test_gen') == _responses(ref, 'aogpt_test_gen')
    n_long = 0
    for task in LL_TASKS:
        a, b = _responses(ref, task), _responses(ours, task)
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            x, y = _flat(x), _flat(y)
            assert abs(x[0] - y[0]) < 1e-4, (task, x, y)
            assert x[1:] == y[1:], (task, x, y)  # is_greedy, where the request has one
    for s in ours['samples']['aogpt_test_rolling']:
        n_long += len(gpt2_codec().encode(s['arguments'][0][0])) > ours_lm.max_length
    assert n_long >= 2, "the rolling task must exercise more than one window"
    # the metrics the harness derives from those numbers agree too
    for task in LL_TASKS:
        for k, v in ref['results'][task].items():
            if isinstance(v, float) and 'stderr' not in k:
                assert ours['results'][task][k] == pytest.approx(v, rel=1e-5, abs=1e-6), (task, k)


def _gen(lm, context, **kw):
    from lm_eval.api.instance import Instance
    kw = dict(dict(until=[], max_gen_toks=12, do_sample=False), **kw)
    return lm.generate_until([Instance(request_type='generate_until', doc={}, arguments=(context, kw), idx=0)])[0]


def test_generate_until_stops_like_hf(gpt2_dir, monkeypatch):
    """Stop strings: with a stop string taken from the middle of the unstopped greedy text, ours (bos=hf)
    and the hf class both return the text up to it; decoding in chunks stops early instead of running
    max_gen_toks; natively (bos=none) the text is greedy decoding from [None] + context."""
    from lm_eval.models.huggingface import HFLM
    monkeypatch.setattr(H, 'GEN_CHUNK', 2)
    hf = HFLM(pretrained=gpt2_dir, device='cpu', batch_size=1, dtype='float32')
    model = load_hf(gpt2_dir)
    ours = H.AOGPTLM(model=model, codec=gpt2_codec(), bos='hf')
    context = 'Q: Name a fruit.\nA:'
    full = _gen(ours, context)
    assert full == _gen(hf, context) and len(full) > 6
    stop = full[len(full) // 2:len(full) // 2 + 3]
    calls = []
    real = ours._decode
    monkeypatch.setattr(ours, '_decode', lambda *a: calls.append(a) or real(*a))
    cut = _gen(ours, context, until=[stop])
    assert cut == _gen(hf, context, until=[stop]) == full.split(stop)[0] and cut != full
    assert len(calls) < 6  # 12 tokens, 2 at a time: it stopped before the end
    native = H.AOGPTLM(model=model, codec=gpt2_codec())
    ids = gpt2_codec().encode(context)
    for _ in range(5):
        x = torch.tensor(ids + [0])[None]  # slot i predicts position i: the last slot is the next token
        ids.append(int(model(x)[0][0, -1, :50257].argmax()))
    assert _gen(native, context, max_gen_toks=4) == gpt2_codec().decode(ids[-5:-1])


def test_native_rolling_is_eval_ppl_chunks(backbone):
    """Natively ([None] first), a text's rolling log-likelihood is eval_ppl.py's L2R sum over the text cut
    into block_size chunks, each scored from [None]; a last partial chunk is scored, as the harness's
    windows do, after the block_size - len tokens before it (more context than a fresh chunk)."""
    model = tiny(**backbone, block_size=8, vocab_size=11)
    lm = H.AOGPTLM(model=model, codec=char_codec('abcdefghijk'), batch_size=4)
    text = 'abcabkdefhijjihgfedcbaakkabc'  # 28 tokens: 3 full chunks of 8, then 4 more
    ids = torch.tensor([ord(ch) - ord('a') for ch in text])
    full, tail = lm.loglikelihood_rolling([_req((text[:24],)), _req((text,))])
    nll, count = nll_l2r(model, ids[:24].view(3, 8))
    assert count == 24 and full == pytest.approx(-nll, abs=1e-4)
    last = ids[20:28][None]
    _, nll_last = model(last, targets=last, reduction='none')
    assert tail == pytest.approx(-nll - nll_last[0, 4:].sum().item(), abs=1e-4)


def test_native_loglikelihood_is_one_forward_pass(backbone):
    """l2r natively: log p(continuation | context) is the sum of model(context + continuation)'s last
    per-token log-probs (slot 0 being [None]), is_greedy their argmax check; a context longer than
    block_size is cut from the left; the batched, sorted, padded path changes nothing."""
    model = tiny(**backbone, block_size=8, vocab_size=11)
    lm = H.AOGPTLM(model=model, codec=char_codec('abcdefghijk'), batch_size=3)
    g = torch.Generator().manual_seed(0)
    draw = lambda n: torch.randint(0, 11, (n,), generator=g).tolist()  # noqa: E731
    reqs = [(draw(c), draw(k)) for c, k in [(1, 1), (3, 2), (0, 4), (7, 3), (12, 2), (2, 6)]]
    got = lm._loglikelihood_tokens([(None, [H.NONE] if not c else c, x) for c, x in reqs])
    for (c, x), (ll, greedy) in zip(reqs, got):
        w = torch.tensor((c + x)[-8:])[None]
        logits, nll = model(w, targets=w, reduction='none')
        L = len(x)
        assert ll == pytest.approx(-nll[0, -L:].sum().item(), abs=1e-5)
        assert greedy == bool((logits[0, -L:].argmax(-1) == w[0, -L:]).all())


def _req(args):
    from lm_eval.api.instance import Instance
    return Instance(request_type='loglikelihood_rolling', doc={}, arguments=args, idx=0)


# --------------------------------------------------------------------------- orders:K

def _chain_sums(model, ctx, cont):
    """Enumeration: {order of the continuation: log p(continuation | context) in that order}, in the
    model's dtype (float64 here) through model.forward, not the slot path the LM uses."""
    w = torch.tensor(ctx + cont)[None]
    c, L = len(ctx), len(cont)
    out = {}
    for p in itertools.permutations(range(L)):
        order = torch.tensor(list(range(c)) + [c + i for i in p])[None]
        logits, _ = model(w, order=order)
        lp = torch.log_softmax(logits[0], -1).gather(1, w[0, order[0]][:, None])[:, 0]  # slot i -> x[order[i]]
        out[p] = lp[c:].sum().item()
    return out


def test_orders_against_enumeration(backbone):
    """orders:K on a tiny vocabulary in float64. Each of the K chain-rule sums is the sum of one
    permutation of the continuation after the L2R context; the orders are uniform (all 3! appear, and
    the mean of K sums is within 4 standard errors of the exact expectation over orders); log-mean-exp
    >= mean per request, and in expectation <= the log-likelihood of the order mixture; the same orders
    are drawn for every choice of one question (same context, same continuation length)."""
    model = tiny(**backbone, block_size=8, vocab_size=11).double()
    codec = char_codec('abcdefghijk')
    ctx, conts = [1, 4, 2], [[3, 7, 9], [5, 0, 6], [8]]
    K = 400
    lm = H.AOGPTLM(model=model, codec=codec, likelihood=f'orders:{K}', batch_size=512)
    lm._loglikelihood_tokens([(None, ctx, x) for x in conts])
    picked = []
    for x in conts[:2]:
        exact = _chain_sums(model, ctx, x)
        m = lm.memo["orders"][(tuple(ctx), tuple(x))]
        which = [min(exact, key=lambda p: abs(exact[p] - s)) for s in m['orders']]
        assert all(abs(exact[p] - s) < 1e-9 for p, s in zip(which, m['orders']))  # each sum is one order's
        assert set(which) == set(exact)                                            # every order drawn
        vals = torch.tensor(list(exact.values()), dtype=torch.float64)
        se = vals.std(unbiased=False).item() / math.sqrt(K)
        assert abs(m['orders_mean'] - vals.mean().item()) < 4 * se + 1e-12
        assert m['orders_lme'] >= m['orders_mean'] - 1e-12
        assert m['l2r'] == pytest.approx(exact[(0, 1, 2)], abs=1e-9)               # the L2R pass rides along
        picked.append(which)
    assert picked[0] == picked[1]  # common random numbers across the choices
    # the importance-weighted bound: E[log-mean-exp of k draws] <= log E_sigma p(x | sigma), tight as k grows
    x = conts[0]
    exact = torch.tensor(list(_chain_sums(model, ctx, x).values()), dtype=torch.float64)
    mixture = (torch.logsumexp(exact, 0) - math.log(len(exact))).item()
    lmes = []
    for seed in range(20):
        small = H.AOGPTLM(model=model, codec=codec, likelihood='orders:3', seed=seed)
        small._loglikelihood_tokens([(None, ctx, x)])
        lmes.append(small.memo["orders"][(tuple(ctx), tuple(x))]["orders_lme"])
    lmes = torch.tensor(lmes)
    assert lmes.mean().item() <= mixture + 2 * lmes.std().item() / math.sqrt(len(lmes))
    assert (lmes <= exact.max() + 1e-12).all()


def test_orders_score_choice_and_memo():
    """The harness sees the mean (default) or the log-mean-exp, from one memo: switching recomputes nothing."""
    model = tiny(block_size=8, vocab_size=11)
    lm = H.AOGPTLM(model=model, codec=char_codec('abcdefghijk'), likelihood='orders:4')
    reqs = [(None, [1, 2], [3, 4]), (None, [1, 2], [5, 6])]
    mean = lm._loglikelihood_tokens(reqs)
    lm.orders_score = 'lme'
    lm.model = None  # a recomputation would fail
    lme = lm._loglikelihood_tokens(reqs)
    for (a, _), (b, _), (_, c, x) in zip(mean, lme, reqs):
        m = lm.memo["orders"][(tuple(c), tuple(x))]
        assert (a, b) == (m['orders_mean'], m['orders_lme']) and b >= a


def test_ensemble_is_a_normalised_likelihood(backbone):
    """ensemble:M: with M=1 it is the L2R log-likelihood; with M=4 it differs (the members matter), and it
    is still a likelihood, not a bound: exp of it summed over every 2-token continuation of an 11-symbol
    vocabulary is 1, because the orderings depend on the context only and each conditional is a mean of
    normalised distributions."""
    model = tiny(**backbone, block_size=8, vocab_size=11).double()
    codec = char_codec('abcdefghijk')
    ctx = [1, 4, 2, 7, 0]
    reqs = [(None, ctx, [a, b]) for a in range(11) for b in range(11)]
    l2r = H.AOGPTLM(model=model, codec=codec, batch_size=64)._loglikelihood_tokens(reqs)
    one = H.AOGPTLM(model=model, codec=codec, likelihood='ensemble:1', batch_size=64)._loglikelihood_tokens(reqs)
    ens = H.AOGPTLM(model=model, codec=codec, likelihood='ensemble:4', batch_size=64)._loglikelihood_tokens(reqs)
    assert [a for a, _ in one] == pytest.approx([a for a, _ in l2r], abs=1e-12)
    assert max(abs(a - b) for (a, _), (b, _) in zip(ens, l2r)) > 1e-4
    assert sum(math.exp(a) for a, _ in ens) == pytest.approx(1.0, abs=1e-9)
    assert [g for _, g in ens] == [g for _, g in l2r]  # the greedy check is the L2R pass's


def test_without_context_the_harness_scores_are_eval_ppls_estimators_on_the_same_draws(backbone):
    """The harness draws its orders and masks with likelihood.py's functions, so with an empty context (the
    continuation is the whole window) its orders:K mean and its encoder ELBO are eval_ppl's nll_any_order
    and nll_mdm_elbo of that window, seeded alike: the same draws, scored by another code path (slot passes
    over the continuation vs the model's full forward), equal to float32 rounding: the model is float64, but
    its forward takes the cross-entropy in float32 (model.head_loss), a few ulps (2^-24 relative) of each of the
    n terms near 2.5."""
    codec = char_codec('abcdefghij')
    x = [3, 7, 1, 9, 0, 5]
    chunk = torch.tensor([x])                                                           # (1, n)
    seeded = lambda: torch.Generator().manual_seed(H.context_seed(1234, []))
    model = tiny(**backbone, block_size=8, vocab_size=11).double()
    lm = H.AOGPTLM(model=model, codec=codec, likelihood='orders:5', batch_size=4)
    lm._loglikelihood_tokens([(None, [], x)])
    total, count = nll_any_order(model, chunk, n_orders=5, generator=seeded())
    tol = len(x) * 4 * 2.5 * 2 ** -24
    assert count == len(x) and lm.memo['orders'][((), tuple(x))]['orders_mean'] == pytest.approx(-total, abs=tol)
    enc = tiny(**backbone, block_size=8, vocab_size=11, causal=False, cond='none', mask_token_id=10).double()
    lm = H.AOGPTLM(model=enc, codec=codec, mc=64, batch_size=16)
    (ll, _), = lm._loglikelihood_tokens([(None, [], x)])
    total, _ = nll_mdm_elbo(enc, chunk, n_draws=64, generator=seeded(), batch_size=64)
    assert ll == pytest.approx(-total, abs=tol)


# --------------------------------------------------------------------------- encoder MDM, codecs

def test_encoder_elbo_is_a_seeded_lower_bound(backbone):
    """The encoder MDM's --mc estimate of log p(continuation | context): the same number for the same
    seed, and within 4 standard errors of the exact quantity it estimates, the ELBO (the mean over all
    reveal orders of the continuation of the encoder's chain-rule sums, context never masked), computed
    by enumeration in float64."""
    model = tiny(**backbone, block_size=8, vocab_size=11, causal=False, cond='none', mask_token_id=10).double()
    codec = char_codec('abcdefghij')
    ctx, x = [1, 2, 3], [4, 5, 6]
    a = H.AOGPTLM(model=model, codec=codec, mc=2000, batch_size=1000)
    (ll, _), = a._loglikelihood_tokens([(None, ctx, x)])
    se = a.memo['l2r'][(tuple(ctx), tuple(x))]['elbo_se']
    b = H.AOGPTLM(model=model, codec=codec, mc=2000, batch_size=1000)
    assert b._loglikelihood_tokens([(None, ctx, x)])[0][0] == ll
    # exact ELBO: E over orders of sum_i log p(x_sigma_i | context, x_sigma_<i, [MASK] elsewhere)
    w = torch.tensor(ctx + x)
    sums = []
    for p in itertools.permutations(range(3)):
        total, seen = 0.0, set()
        for i in p:
            row = w.clone()
            for j in range(3):
                if j not in seen:
                    row[3 + j] = 10
            logits, _ = model(row[None])
            total += torch.log_softmax(logits[0, 3 + i], -1)[w[3 + i]].item()
            seen.add(i)
        sums.append(total)
    exact = sum(sums) / len(sums)
    assert abs(ll - exact) < 4 * se


def test_encoder_through_the_launcher(tmp_path, task_dir, capsys):
    """An encoder-MDM checkpoint runs the loglikelihood tasks with its ELBO (recorded as such), and a
    generation task is one line, not a traceback."""
    run = _ckpt(tmp_path, causal=False, cond='none')
    tasks = ['--include_path', task_dir, '--builtin_tasks', 'False', '--ckpt', run, '--bootstrap_iters', '0']
    rec = H.main(['--tasks', 'aogpt_test_mc,aogpt_test_rolling', '--mc', '4'] + tasks)
    assert rec['estimator']['likelihood'] == 'mdm_elbo:mc=4' and 'ELBO' in rec['estimator']['harness_loglikelihood']
    assert 0 < rec['results']['aogpt_test_rolling']['bits_per_byte,none'] < math.inf
    capsys.readouterr()
    with pytest.raises(SystemExit):
        H.main(['--tasks', 'aogpt_test_gen'] + tasks)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'generation tasks need a decoder' in err[0], err


def test_settings_this_model_never_reads_are_refused(tmp_path, task_dir, capsys):
    """--mc on a decoder and --orders_score with an estimator that has one number (l2r, or the encoder's ELBO)
    were accepted and ignored without a word."""
    dec, enc = _ckpt(tmp_path / 'dec'), _ckpt(tmp_path / 'enc', causal=False, cond='none')
    tasks = ['--tasks', 'aogpt_test_mc', '--include_path', task_dir, '--builtin_tasks', 'False']
    for argv, says in [(['--ckpt', dec, '--mc', '4'], "--mc sets the encoder MDM's Monte-Carlo masks, but"),
                       (['--ckpt', dec, '--orders_score', 'lme'], "but this run scores --likelihood=l2r"),
                       (['--ckpt', enc, '--orders_score', 'lme'], "but this run scores the encoder MDM ELBO")]:
        with pytest.raises(SystemExit) as e:
            H.main(tasks + argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code not in (0, None) and len(err) == 1 and says in err[0], err
    assert not os.path.exists(os.path.join(dec, 'harness.json'))


def test_char_codec_missing_character_is_one_line(task_manager, capsys):
    """A character-level checkpoint scores tasks in its own codec, and refuses text it cannot encode."""
    from aogpt.errors import UserError
    lm = H.AOGPTLM(model=tiny(block_size=8, vocab_size=11), codec=char_codec('abcdefghijk'))
    with pytest.raises(UserError, match="not in this char-level vocabulary"):
        lm.tok_encode('The sun')
    assert lm.tok_encode('cab') == [2, 0, 1]


# --------------------------------------------------------------------------- the launcher

def _ckpt(path, codec=None, **kw):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=32, vocab_size=50304 if codec is None else codec.vocab_size + 1, n_layer=1,
                    n_head=2, n_embd=16, target_dim=8, **kw)
    model = GPT(cfg)
    ema = {'decay': 0.9, 'num_updates': 1, 'params': {k: v.detach() + 0.01 for k, v in model.named_parameters()}}
    extra = {} if codec is None else {'codec': codec.record()}
    save_checkpoint({'format': 'aogpt-v1', 'model_args': asdict(cfg), 'model': model.state_dict(), 'ema': ema,
                     'iter_num': 7, 'config': {'dataset': 'none_such'}, **extra}, os.path.join(path, 'ckpt.pt'))
    return str(path)


def test_char_level_checkpoint(tmp_path, task_dir, capsys):
    """A character-level checkpoint scores a task in its own codec when every character is in its
    alphabet, and stops with one line naming the character when one is not."""
    docs = [json.loads(line) for line in open(os.path.join(TASK_DIR, 'mc.jsonl'))]
    chars = sorted(set(''.join(d['question'] + ' ' + ' '.join(d['choices']) for d in docs)))
    args = ['--include_path', task_dir, '--builtin_tasks', 'False', '--bootstrap_iters', '0']
    rec = H.main(['--tasks', 'aogpt_test_mc', '--ckpt', _ckpt(tmp_path / 'full', char_codec(chars))] + args)
    assert rec['estimator']['codec'] == 'char' and 0 <= rec['results']['aogpt_test_mc']['acc,none'] <= 1
    capsys.readouterr()
    with pytest.raises(SystemExit):
        H.main(['--tasks', 'aogpt_test_mc', '--ckpt', _ckpt(tmp_path / 'lower', char_codec(
            [c for c in chars if c != 'T']))] + args)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'T' (aogpt_test_mc)" in err[0] and 'codec' in err[0], err


def test_a_run_of_other_tasks_keeps_the_earlier_results(tmp_path, task_dir):
    """harness.json is the latest run; each run is also appended to harness.jsonl beside it. Before, a run of
    other tasks overwrote harness.json and the earlier tasks' results were gone."""
    run = _ckpt(tmp_path / 'run')
    args = ['--include_path', task_dir, '--builtin_tasks', 'False', '--bootstrap_iters', '0', '--ckpt', run]
    first = H.main(['--tasks', 'aogpt_test_mc'] + args)
    H.main(['--tasks', 'aogpt_test_rolling'] + args)
    latest = json.load(open(os.path.join(run, 'harness.json')))
    history = [json.loads(line) for line in open(os.path.join(run, 'harness.jsonl'))]
    assert list(latest['results']) == ['aogpt_test_rolling']
    assert [list(r['results']) for r in history] == [['aogpt_test_mc'], ['aogpt_test_rolling']]
    assert history[0]['results'] == first['results']


def test_launcher_end_to_end(tmp_path, task_dir, capsys):
    """All four local tasks through main(): the harness's table, a JSON beside the checkpoint that records
    the estimator, both orders:K scores, EMA and the lm-eval version, and the model-card section."""
    run = _ckpt(tmp_path)
    rec = H.main(['--tasks', 'aogpt_test_mc,aogpt_test_lambada,aogpt_test_rolling,aogpt_test_gen',
                  '--ckpt', run, '--include_path', task_dir, '--builtin_tasks', 'False', '--likelihood', 'orders:2',
                  '--bootstrap_iters', '0', '--max_gen_toks', '4'])
    out = capsys.readouterr().out
    assert 'aogpt_test_mc' in out and '|' in out and 'the other orders:K score' in out
    saved = json.load(open(tmp_path / 'harness.json'))
    assert saved['estimator']['likelihood'] == 'orders:2' and 'mean' in saved['estimator']['harness_loglikelihood']
    assert saved['ema'] is True and saved['lm_eval_version'] == lm_eval.__version__
    assert set(saved['results']) >= {'aogpt_test_mc', 'aogpt_test_gen'} and 'aogpt_test_mc' in saved['results_lme']
    assert saved['results']['aogpt_test_rolling'] == saved['results_lme']['aogpt_test_rolling']  # rolling is L2R
    assert rec['results'] == saved['results']
    card = H.model_card_section(run, 7, True)
    assert 'aogpt_test_mc' in card and 'orders:2' in card and card.startswith('## Downstream tasks')
    assert H.model_card_section(os.path.join(run, 'ckpt.pt')) == card     # the file names the same JSON
    assert H.model_card_section(run, 8, True) == ''                         # another iteration's weights
    assert H.model_card_section(run, 7, False) == ''                        # raw weights, EMA was measured
    assert H.model_card_section(str(tmp_path / 'nowhere')) == ''
    assert H.model_card_section(run, 7, True, 'another-weights') == ''      # another checkpoint's weights
    # export.py's card carries the table for these weights
    import export
    export.main(['--out_dir', run, '--dest', str(tmp_path / 'exp')])
    assert 'aogpt_test_mc' in open(tmp_path / 'exp' / 'README.md').read()


def test_registered_for_the_lm_eval_cli(tmp_path):
    """`lm_eval --model aogpt --model_args ...` finds the class once eval_harness is imported, and builds it
    the way the CLI does (model_args string plus the CLI's batch_size/max_batch_size/device); a misspelt
    model arg is an error, not silently ignored."""
    from lm_eval.api.registry import get_model
    cls = get_model('aogpt')
    assert cls is H.AOGPTLM
    run = _ckpt(tmp_path)
    lm = cls.create_from_arg_string(f'ckpt={run},likelihood=orders:2,use_ema=False',
                                    {'batch_size': 4, 'max_batch_size': None, 'device': 'cpu'})
    assert (lm.estimator, lm.K, lm.used_ema, lm._batch, lm.iter_num) == ('orders', 2, False, 4, 7)
    with pytest.raises(TypeError, match='likelihod'):
        cls.create_from_arg_string(f'ckpt={run},likelihod=orders:2', {'device': 'cpu'})


@pytest.mark.parametrize('args, says', [
    (['--tasks', 'no_such_task'], 'unknown task'),
    (['--tasks', 'aogpt_test_mc', '--ckpt', 'missing/ckpt.pt'], 'checkpoint not found'),
    (['--tasks', 'aogpt_test_mc', '--likelihood', 'orders:x'], '--likelihood must be'),
    # a count of forward passes per request, bounded: past int64 was a traceback, ensemble:1e20 grew for minutes
    (['--tasks', 'aogpt_test_mc', '--likelihood', 'orders:99999999999999999999'], 'K, M from 1 to 4096'),
    (['--tasks', 'aogpt_test_mc', '--likelihood', 'ensemble:100000000000000000000'], 'K, M from 1 to 4096'),
    (['--tasks', 'aogpt_test_mc', '--likelihood', 'ensemble:4097'], 'K, M from 1 to 4096 (each is a forward pass'),
    (['--tasks', 'aogpt_test_mc', '--mc', '100000000'], '--mc must be from 1 to 4096 masks'),
    (['--tasks', ''], '--tasks is empty'),
    (['--tasks', 'aogpt_test_mc', '--num_fewshot', '-2'], 'invalid --num_fewshot=-2'),  # once ran, as "n-shot -2"
])
def test_one_line_errors(args, says, task_dir, capsys):
    with pytest.raises(SystemExit) as e:
        H.main(args + ['--include_path', task_dir, '--builtin_tasks', 'False'])
    assert e.value.code not in (0, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and 'Traceback' not in err[0], err


def test_the_out_path_is_checked_before_anything_loads(task_dir, tmp_path, capsys):
    """--out to a folder was refused only after every task had run; now before the checkpoint loads (here it
    does not even exist)."""
    with pytest.raises(SystemExit) as e:
        H.main(['--tasks', 'aogpt_test_mc', '--ckpt', 'missing/ckpt.pt', '--out', str(tmp_path),
                '--include_path', task_dir, '--builtin_tasks', 'False'])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and err == [f"error: --out {tmp_path} is a folder: name a file in it, e.g. --out "
                                         f"{tmp_path / 'harness.json'}"], err


def test_task_without_data_names_include_path(tmp_path, capsys):
    """A task whose data is neither cached nor local (here: a hub dataset, offline) is one line that says
    how to run it offline."""
    (tmp_path / 'hub.yaml').write_text("task: needs_hub\ndataset_path: nobody/no_such_dataset_here\n"
                                       "test_split: test\noutput_type: loglikelihood\ndoc_to_text: x\n"
                                       "doc_to_target: y\n")
    with pytest.raises(SystemExit):
        H.main(['--tasks', 'needs_hub', '--include_path', str(tmp_path), '--builtin_tasks', 'False'])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and '--include_path' in err[0], err


@pytest.mark.slow
def test_torchrun_two_ranks_match_one(tmp_path, task_dir):
    """Data parallel: under torchrun (2 CPU ranks, gloo) the harness shards the requests and gathers
    them through the LM's all_gather / gather_object; the metrics equal a single process's (orders are
    seeded by the context, not the rank)."""
    import subprocess
    import sys
    run = _ckpt(tmp_path)
    args = ['--tasks', 'aogpt_test_mc,aogpt_test_lambada,aogpt_test_rolling', '--include_path', task_dir,
            '--builtin_tasks', 'False', '--ckpt', run, '--likelihood', 'orders:2', '--bootstrap_iters', '0',
            '--device', 'cpu']
    one = H.main(args + ['--out', str(tmp_path / 'one.json')])
    root = os.path.dirname(HERE)
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=root)
    p = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2',
                        os.path.join(root, 'eval_harness.py')] + args + ['--out', str(tmp_path / 'two.json')],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    two = json.load(open(tmp_path / 'two.json'))
    assert two['world_size'] == 2 and one['world_size'] == 1
    for key in ('results', 'results_lme'):
        for task, metrics in one[key].items():
            for m, v in metrics.items():
                if isinstance(v, float) and 'stderr' not in m:
                    assert two[key][task][m] == pytest.approx(v, rel=1e-6), (key, task, m)


def test_non_finite_loglikelihoods_are_refused_not_ranked(tmp_path, task_dir, capsys, monkeypatch):
    """NaN log-likelihoods once ranked as the best answer: acc = acc_norm = 1.0, exit 0. (An overflow at run
    time: non-finite weights are already refused at load.)"""
    run = _ckpt(tmp_path)
    real = GPT.hidden_slots
    monkeypatch.setattr(GPT, 'hidden_slots', lambda self, *a, **k: real(self, *a, **k) * float('nan'))
    with pytest.raises(SystemExit) as e:
        H.main(['--ckpt', run, '--tasks', 'aogpt_test_mc', '--include_path', task_dir, '--builtin_tasks', 'False'])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and err[-1].startswith('error: ') and 'log-likelihoods are NaN or inf' in err[-1], err
    assert not any('error' in line or 'Traceback' in line for line in err[:-1]), err  # above it: progress bars only
