"""reproduce.py's judging and plotting on synthetic logs: each verdict must follow the data, including
the cases where the data contradicts the paper (those must come out 'not reproduced')."""
import json
import math
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from aogpt.preflight import model_reads
from findings import adapt as AD
from findings import optimizers as OPT
from findings import orders as O
from findings import report
from findings import reproduce as R
from findings import sampling as S


def test_end_and_tokens_to_reach():
    assert R.end([5.0, 4.0, 3.0, 2.0, 1.0]) == pytest.approx(2.0)  # mean of the last 3
    assert R.end([7.0]) == 7.0
    assert R.tokens_to_reach([0, 10, 20, 30], [4.0, 3.0, 2.0, 1.0], 2.5) == 20
    assert R.tokens_to_reach([0, 10], [4.0, 3.0], 1.0) is None


def _curve(rate, floor, n=9):
    t = [i * 1000 for i in range(n)]
    return t, [floor + 3.0 * math.exp(-rate * i) for i in range(n)]


def test_finding1_follows_the_curves():
    fast, slow = _curve(1.0, 1.0), _curve(0.3, 1.3)
    v, text = R.judge_slower(fast, slow)
    assert v == 'reproduced' and '8/8' in text
    v, _ = R.judge_slower(slow, fast)  # the data says the opposite
    assert v == 'not reproduced'
    # lower at the end but not at every eval: only part of the claim holds
    t, a = _curve(1.0, 1.0)
    b = list(a)
    b[1] -= 0.5
    b[-3:] = [x + 0.2 for x in a[-3:]]
    assert R.judge_slower((t, a), (t, b))[0] == 'partly reproduced'


@pytest.mark.parametrize('l2r, block, fixed, want', [
    (1.0, 1.2, 1.5, 'reproduced'),
    (1.0, 1.6, 1.5, 'partly reproduced'),  # L2R beats fixed random, but block-wise is not between
    (1.6, 1.2, 1.5, 'not reproduced'),
])
def test_finding2_orders(l2r, block, fixed, want):
    v, text = R.judge_order([9.0] + [l2r] * 3, [9.0] + [block] * 3, [9.0] + [fixed] * 3)
    assert v == want
    assert f"{l2r:.3f}" in text and f"{fixed:.3f}" in text


def test_better_respects_the_noise_yardstick():
    v, text = R.judge_better([('L2R loss', 1.00, 1.10), ('any-order loss', 1.20, 1.25)], noise=0.02)
    assert v == 'reproduced' and '-0.100' in text and 'spread 0.020' in text
    v, text = R.judge_better([('L2R loss', 1.00, 1.10), ('any-order loss', 1.24, 1.25)], noise=0.02)
    assert v == 'partly reproduced' and 'within noise' in text
    v, text = R.judge_better([('L2R loss', 1.20, 1.10), ('any-order loss', 1.30, 1.25)], noise=0.02)
    assert v == 'not reproduced' and 'worse' in text
    assert R.judge_better([('x', 1.24, 1.25)], noise=None)[0] == 'reproduced'  # no yardstick: sign only


def test_finding4_ensemble():
    ms = [1, 2, 4, 8, 16]
    v, _ = R.judge_ensemble(ms, [3.0, 2.9, 2.85, 2.82, 2.81], [0, .01, .02, .03, .035], [0, .002, .002, .002, .002])
    assert v == 'reproduced'
    v, _ = R.judge_ensemble(ms, [3.0, 2.9, 2.95, 2.82, 2.81], [0, .01, .02, .03, .035], [0, .002, .002, .002, .002])
    assert v == 'partly reproduced'  # not monotone
    v, _ = R.judge_ensemble(ms, [3.0, 3.1, 3.2, 3.3, 3.4], [0, .0, .0, .0, .001], [0, .002, .002, .002, .002])
    assert v == 'not reproduced'


def test_finding6_slopes():
    T = [8, 16, 32, 64, 128]
    assert R.loglog_slope(T, [0.5 * t for t in T]) == pytest.approx(1.0)
    assert R.loglog_slope(T, [2.0] * 5) == pytest.approx(0.0, abs=1e-9)
    assert R.judge_scaling(T, [1.0, 1.02, 1.05, 1.1, 1.2], [0.1 * t for t in T])[0] == 'reproduced'
    assert R.judge_scaling(T, [0.01 * t for t in T], [0.1 * t for t in T])[0] == 'partly reproduced'


def test_finding7_annealing():
    plain, hot = S.GEN_SETTINGS[0], S.GEN_SETTINGS[-1]
    ppl = lambda ao1, mdm1, ao3, mdm3: {('ao', plain): ao1, ('mdm', plain): mdm1, ('ao', hot): ao3,  # noqa: E731
                                        ('mdm', hot): mdm3}
    noise = {plain: 0.05, hot: 0.05}
    v, text = R.judge_annealing(ppl(12.0, 9.0, 3.0, 3.05), noise)
    assert v == 'reproduced' and '+33%' in text and 'spread 5%' in text
    assert R.judge_annealing(ppl(12.0, 9.0, 3.5, 3.0), noise)[0] == 'partly reproduced'  # still apart
    assert R.judge_annealing(ppl(9.0, 9.2, 3.0, 3.0), noise)[0] == 'partly reproduced'   # never apart
    assert R.judge_annealing(ppl(8.0, 9.0, 3.6, 3.0), noise)[0] == 'not reproduced'
    assert R.judge_annealing(ppl(12.0, 9.0, 3.3, 3.0), None)[0] == 'reproduced'  # no yardstick: the gap shrinks


def test_gen_summary_is_a_geometric_mean_over_the_judged_steps():
    rows = [dict(sampler='ao', top_p=1.0, temperature=1.0, T=T, per_sequence=p, token=p)
            for T, p in zip(S.GEN_STEPS, [100.0, 100.0, 2.0, 8.0, 4.0, 16.0])]
    assert S.gen_summary(rows)[('ao', (1.0, 1.0))] == pytest.approx((2 * 8 * 4 * 16) ** 0.25)


def test_runs_differ_only_in_what_they_test():
    """Every comparison must be like with like: two runs' train.py commands may differ only in out_dir
    and the overrides that define them (order mode, L2R fraction, conditioning, seed)."""
    c = SimpleNamespace(runs_dir='r', device='cpu', n_layer=2, n_head=2, n_embd=32, target_dim=16, block_size=64,
                        batch_size=4, max_iters=100, learning_rate=1e-3, ema_decay=0.99, eval_interval=10,
                        eval_iters=2, eval_orders=2, seed=1)
    parse = lambda name: dict(a[2:].split('=', 1) for a in R.train_args(c, name)[1:])
    base = parse('ao')
    assert base['max_iters'] == '100' and base['dataset'] == R.DATASET and base['init_from'] == 'auto'
    # and the shared keys a run's model never reads, which are not given (train.py refuses them): the sigma-GPT's
    # and the encoder's target_dim, the judge GPT's target_dim and eval_orders
    unread = lambda over: {k for k in base if not model_reads(k, R.run_model(over))}  # noqa: E731
    assert unread(R.RUNS['judge'][0]) == {'target_dim', 'eval_orders'} and unread(R.RUNS['sigma'][0]) == {'target_dim'}
    for name, (over, _) in R.RUNS.items():
        args = parse(name)
        diff = {k for k in set(args) | set(base) if args.get(k) != base.get(k)}
        assert diff <= {'out_dir'} | set(over) | unread(over) and not unread(over) & set(args), (name, diff)
    for name, (over, _) in O.RUNS.items():  # finding 10's runs, and the ones it shares with reproduce.py
        args = dict(a[2:].split('=', 1) for a in R.train_args(c, name, O.RUNS)[1:])
        diff = {k for k in set(args) | set(base) if args.get(k) != base.get(k)}
        assert diff <= {'out_dir'} | set(over) | unread(over), (name, diff)
        assert name not in R.RUNS or args == parse(name)


def test_a_run_held_with_keys_its_model_never_reads_is_the_same_run(monkeypatch):
    """A runs_dir trained before train.py refused keys a model never reads holds commands with them (the sigma-GPT's
    --target_dim): the same run, bit for bit, so it is reused, not refused as another run's folder."""
    c = SimpleNamespace(runs_dir='r', device='cpu', n_layer=2, n_head=2, n_embd=32, target_dim=16, block_size=64,
                        batch_size=4, max_iters=100, learning_rate=1e-3, ema_decay=0.99, eval_interval=10,
                        eval_iters=2, eval_orders=2, seed=1)
    now = {name: R.train_args(c, name) for name in ('sigma', 'judge', 'mdm', 'ao')}
    monkeypatch.setattr(R, 'model_reads', lambda key, model: True)  # the commands as they were: every key given
    held = {name: R.train_args(c, name) for name in now}
    monkeypatch.undo()
    assert '--target_dim=16' in held['sigma'] and '--target_dim=16' not in now['sigma']
    for name, args in now.items():
        assert R.same_run(held[name], args) and R.same_run(args, args)
        assert not R.same_run([a.replace('--max_iters=100', '--max_iters=101') for a in held[name]], args)


def test_finding10_verdict_follows_the_numbers():
    """Lower is better on each axis (L2R loss, any-order loss, speculative calls); a difference counts only
    beyond the larger of the two seed spreads on that axis."""
    def fam(l2r, uni, calls, spread=0.01):
        return {'l2r': (l2r, spread), 'uniform': (uni, spread), 'calls': (calls, 0.5)}
    assert O.judge_orders({'A': fam(1.5, 2.0, 10), 'B': fam(1.6, 2.1, 11)})[0] == 'A dominates'
    v, ev = O.judge_orders({'A': fam(1.5, 2.2, 10), 'B': fam(1.7, 2.0, 12), 'C': fam(1.8, 2.3, 13)})
    assert v == 'a trade-off: A, B undominated' and 'any-order loss B 2.000' in ev
    assert 'B +0.200* / -0.200* / +2.0*' in ev  # against the first, the paper's
    v, ev = O.judge_orders({'A': fam(1.50, 2.00, 10, 0.1), 'B': fam(1.55, 2.05, 10.2, 0.1)})  # within the spread
    assert v == 'no single best: all undominated' and ev.endswith('B +0.050 / +0.050 / +0.2')  # no stars


def test_sections_of_findings_9_and_10_go_into_the_report_once_in_order(tmp_path):
    """results/README.md as reproduce.py writes it: each finding's verdict row joins the findings table in number
    order and its section is appended; a second run replaces both instead of adding more. reproduce.py merges
    the sections it finds again whenever it rewrites the report, so make findings never drops them."""
    readme = tmp_path / 'README.md'
    readme.write_text('# Paper findings\n\n| # | claim | verdict | evidence |\n|---|---|---|---|\n| 8 | x | y | z |\n\n'
                      '## Runs\n\n| T | s |\n|---|---|\n| 9 | 0.1 |\n| 10 | 0.2 |\n')  # another table's rows stay
    sec10 = lambda v: f"{O.MARK}\n## Finding 10\n\n| 10 | claim | **{v}** | ev |\n\n{O.MARK.replace('<!-- ', '<!-- end of ')}\n"  # noqa: E731
    sec9 = lambda v: f"## Finding 9\n\n| # | claim | verdict | evidence |\n|---|---|---|---|\n| 9 | muon | **{v}** | ev |\n"  # noqa: E731
    assert report.merge_section(str(readme), 10, sec10('first')) and report.merge_section(str(readme), 10, sec10('second'))
    assert report.merge_section(str(readme), 9, sec9('a')) and report.merge_section(str(readme), 9, sec9('b'))
    text = readme.read_text()
    assert text.count('| 10 | claim') == 2 and 'first' not in text and text.count('## Finding 10') == 1
    assert text.count('| 9 | muon') == 2 and '**a**' not in text and text.count('## Finding 9') == 1
    lines = text.split('\n')
    at = lines.index('| 8 | x | y | z |')
    assert lines[at + 1].startswith('| 9 | muon | **b**') and lines[at + 2].startswith('| 10 | claim | **second**')
    assert '| 9 | 0.1 |' in lines and '| 10 | 0.2 |' in lines
    assert report.merge_section(str(readme), 10, sec10('third'))  # a rerun of one finding keeps the sections' order
    again = readme.read_text()
    assert again.index('## Finding 10') < again.index('## Finding 9') and again == text.replace('second', 'third')
    assert not report.merge_section(str(tmp_path / 'none.md'), 10, sec10('x'))


def test_a_report_rewrite_that_fails_keeps_the_old_report(tmp_path, monkeypatch):
    """merge_section rewrites the user's results/README.md in place: a write that fails part way (a full disk, a
    kill) must leave the old report whole, as every whole-file write does (paths.atomic_write), not a truncated one."""
    readme = tmp_path / 'README.md'
    old = '# Paper findings\n\n| # | claim | verdict | evidence |\n|---|---|---|---|\n| 8 | x | y | z |\n'
    readme.write_text(old)

    def full_disk(fd):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(os, 'fsync', full_disk)
    with pytest.raises(OSError):
        report.merge_section(str(readme), 9, '## Finding 9\n\n| 9 | muon | **met** | ev |\n')
    assert readme.read_text() == old and os.listdir(tmp_path) == ['README.md']


@pytest.mark.slow
def test_quick_pipeline_runs_end_to_end(tmp_path):
    """`reproduce.py --quick`: every run trains, every finding gets a row, every plot is written; finding 8's table
    is part of the report it writes (atomically, before the sections other commands wrote, merged after it)."""
    runs, res = tmp_path / 'runs', tmp_path / 'res'
    res.mkdir()
    (res / report.SECTIONS[10]).write_text("| 10 | a claim | **confirmed** | evidence |\n\nthe section\n")
    p = subprocess.run([sys.executable, 'findings/reproduce.py', '--quick', f'--runs_dir={runs}', f'--results_dir={res}'],
                       cwd=R.ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, HF_DATASETS_OFFLINE='1', WANDB_MODE='disabled'))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    md = (res / 'README.md').read_text()
    for i in ('1', '2', '3', '4', '5a', '5a+', '5b', '6', '7', '8', '10'):
        assert f"| {i} | " in md and 'not judged (--quick)' in md
    assert md.index('Finding 7 (') < md.index('Finding 8 (') < md.index('<!-- finding 10 -->')
    spec = json.loads((res / 'results.json').read_text())['speculative']
    table = md[md.index('Finding 8 ('):md.index('<!-- finding 10 -->')]
    assert spec and all(f"| {r['model']} | {r['sampler']} | {r['top_p']} / " in table for r in spec)
    assert sorted(f.name for f in res.glob('*.png')) == sorted(R.FIGS.values())
    assert sorted(d.name for d in runs.iterdir()) == sorted(k for k in R.RUNS if k != 'ao_seed2')
    gen = json.loads((res / 'results.json').read_text())['generation']
    assert {r['sampler'] for r in gen} == {'ao', 'mdm', 'ao, semiar:8', 'ao, confidence'}
    assert len(gen) == 4 * len(S.GEN_SETTINGS) * 2  # quick: two step counts
    assert all(r['per_sequence'] > 1 and r['token'] > 1 and r['unigram_entropy'] > 0 for r in gen)
    # --replot redraws every plot from results.json alone (the runs gone), and leaves the record as it was
    record = (res / 'results.json').read_bytes()
    for f in res.glob('*.png'):
        f.unlink()
    shutil.rmtree(runs)
    p = subprocess.run([sys.executable, 'findings/reproduce.py', '--replot', f'--results_dir={res}'], cwd=R.ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and 'redrew' in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    assert sorted(f.name for f in res.glob('*.png')) == sorted(R.FIGS.values())
    assert (res / 'results.json').read_bytes() == record
    p = subprocess.run([sys.executable, 'findings/reproduce.py', '--replot', f'--results_dir={tmp_path / "none"}'],
                       cwd=R.ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and p.stderr.count('\n') == 1 and 'run `python findings/reproduce.py`' in p.stderr, p.stderr


def _spoilt(kind):
    """results/results.json (the committed record), spoilt one way, as bytes."""
    good = open(os.path.join(R.ROOT, 'results', 'results.json'), 'rb').read()
    d = json.loads(good)
    if kind == 'truncated':
        return good[:len(good) // 2]
    if kind == 'empty':
        return b''
    if kind == 'random bytes':
        return bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8))
    if kind == 'a list':
        return b'[1, 2, 3]'
    if kind == 'another object':
        return b'{"foo": 1}'
    if kind == 'no generation':
        del d['generation']
    if kind == 'a run missing':
        del d['logs']['sigma']
    if kind == 'a field missing':
        del d['config']['sample_n']
    if kind == 'a row mangled':
        d['ensemble'][0] = 'x'
    return json.dumps(d).encode()


@pytest.mark.parametrize('kind', ['truncated', 'empty', 'random bytes', 'a list', 'another object', 'no generation',
                                  'a run missing', 'a field missing', 'a row mangled'])
def test_replot_from_a_spoilt_results_json_is_one_line(tmp_path, capsys, kind):
    (tmp_path / 'results.json').write_bytes(_spoilt(kind))
    with pytest.raises(SystemExit) as e:
        R.main(['--replot', f'--results_dir={tmp_path}'])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1 and err.startswith(f"error: {tmp_path / 'results.json'} ") \
        and err.endswith('run `python findings/reproduce.py` (or --quick) again to rewrite it'), err


def _alive_with(text):
    """Pids of live processes whose command line holds `text` (from /proc: no extra package)."""
    out = []
    for pid in os.listdir('/proc'):
        try:
            if pid.isdigit() and text in open(f'/proc/{pid}/cmdline', 'rb').read().decode(errors='replace'):
                out.append(int(pid))
        except OSError:
            pass
    return out


@pytest.mark.slow
def test_sigterm_ends_the_training_runs_with_it(tmp_path):
    """SIGTERM to reproduce.py's process group (what `timeout` sends) once left its train.py children running (on
    both cores, holding their out_dir locks), or one whose train.log ended in 'OSError: Bad file descriptor' (its
    handler ran twice, for the group's SIGTERM and then reproduce.py's own), or one that ignored both for 30 s.
    Now each run says one line and ends within seconds, and reproduce.py says so in one line with status 143. A
    --max_iters given with --quick is kept (quick once overrode it silently)."""
    import signal
    import time
    runs = tmp_path / 'runs'
    p = subprocess.Popen([sys.executable, 'findings/reproduce.py', '--quick', f'--runs_dir={runs}',
                          f'--results_dir={tmp_path / "res"}', '--max_iters=100000'], cwd=R.ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, TQDM_DISABLE='1'),
                         start_new_session=True)
    deadline = time.time() + 240
    while not any(runs.glob('*/log.jsonl')) and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    kids = _alive_with(str(runs))
    assert kids, "no training run started"
    t0 = time.time()
    os.killpg(p.pid, signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert time.time() - t0 < 25, "a train.py ignored its SIGTERM until reproduce.py's 30 s SIGKILL"
    assert p.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1].startswith('terminated: the finished runs are kept'), err[-2000:]
    assert 'keeping --max_iters=100000 as given' in out
    assert not [k for k in _alive_with(str(runs)) if k in kids], "a train.py outlived reproduce.py"
    for log in runs.glob('*/train.log'):
        text = log.read_text()
        assert 'Traceback' not in text and 'Error' not in text, text[-2000:]
        assert not text.strip() or text.strip().splitlines()[-1].startswith('interrupted at iteration '), text[-2000:]


def test_seeds_that_must_differ_are_refused_before_any_run(tmp_path, capsys):
    """reproduce.py --seed=2 trained `ao` and `ao_seed2` with one command, so findings 3, 5 and 7 were judged
    against a spread of 0; orders.py paired its seeds the same way; optimizers.py took --seeds=1,1 as two seeds, and
    adapt.py --seeds=5,5 too."""
    dirs = ['--runs_dir', str(tmp_path / 'runs'), '--results_dir', str(tmp_path / 'res')]
    for main, argv, says in [
            (R.main, [f'--seed={R.SEED2}', *dirs], f"--seed={R.SEED2} is the second seed's"),
            (O.main, [f'--seed={R.SEED2}', *dirs], f"--seed={R.SEED2} is the second seed's"),
            (OPT.main, ['--quick', '--seeds=1,1', *dirs], "--seeds must be different seeds, got '1,1'"),
            # issue #48 E: adapt.py reported '± 0.00' from one run counted twice; every --seeds is configurator.seed_list
            (AD.main, ['--quick', '--seeds=5,5', '--budget=40', '--splits=20', '--sunk=20', '--eval_interval=10',
                       *dirs], "--seeds must be different seeds, got '5,5'")]:
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code != 0 and len(err) == 1 and says in err[0], err
    assert not list((tmp_path / 'runs').rglob('*.json'))  # refused before any run (its command.json)


def test_paths_are_the_callers_and_replot_makes_no_folder(tmp_path):
    """A relative --results_dir is where the user stands, not the repository: the error names that path, and
    nothing is created inside the repository."""
    p = subprocess.run([sys.executable, os.path.join(R.ROOT, 'findings', 'reproduce.py'), '--replot',
                        '--results_dir=mine'], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and f"no {tmp_path / 'mine' / 'results.json'}" in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(R.ROOT, 'mine')) and not (tmp_path / 'mine').exists()


def test_output_folders_and_list_settings_are_one_line_before_any_run(tmp_path, capsys):
    """A file where --runs_dir/--results_dir should be, a list setting that does not parse, or a run length of 0
    once ended in a traceback (makedirs, int(), float()) or in runs that started and failed one by one."""
    f = tmp_path / 'afile'
    f.write_text('not a folder')
    dirs = ['--runs_dir', str(tmp_path / 'runs'), '--results_dir', str(tmp_path / 'res')]
    for main, argv, says in [
            (R.main, ['--quick', '--runs_dir', str(f)], f"--runs_dir {f} is a file, not a folder"),
            (OPT.main, ['--quick', '--results_dir', str(f / 'sub')], f"{f} is a file, so that folder cannot be made"),
            (OPT.main, ['--quick', '--seeds', '1337,abc', *dirs], "--seeds must be a comma-separated list of seeds "
                                                                  "in [0, 2**32), got '1337,abc'"),
            (OPT.main, ['--quick', '--lrs_muon', '0.02,-1', *dirs], "--lrs_muon must be a comma-separated list of "
                                                                    "learning rates > 0"),
            (OPT.main, ['--quick', '--max_iters', '0', *dirs], "--max_iters must be at least 1, got 0")]:
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code != 0 and len(err) == 1 and says in err[0], err
    assert not (tmp_path / 'runs' / 'sweep').exists()  # no run started
    mine = tmp_path / 'mine'  # a folder with a README.md of the user's own: the report would replace it
    mine.mkdir()
    (mine / 'README.md').write_text('# my project\n')
    for main in (R.main, OPT.main, O.main):
        with pytest.raises(SystemExit):
            main(['--quick', '--results_dir', str(mine), '--runs_dir', str(tmp_path / 'runs')])
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: --results_dir {mine} holds a README.md that is not a findings report, which the "
                       f"report would replace or append to: pick another --results_dir"], err
    assert (mine / 'README.md').read_text() == '# my project\n' and sorted(os.listdir(mine)) == ['README.md']


def _record_with(tmp_path, spoil):
    d = json.loads(open(os.path.join(R.ROOT, 'results', 'results.json')).read())
    spoil(d)
    (tmp_path / 'results.json').write_text(json.dumps(d))
    for f in list(R.FIGS.values()):
        (tmp_path / f).write_bytes(b'the old plot')


@pytest.mark.parametrize('spoil, says', [
    (lambda d: d['logs']['ao'][3].__setitem__('val_ao', float('nan')), 'non-finite number at logs.ao[3].val_ao'),
    (lambda d: d['speculative'][0].pop('per_sequence'), 'lacks or mangles'),  # fails at the last plot
])
def test_replot_draws_all_or_nothing(tmp_path, capsys, spoil, says):
    """A NaN once drew an empty plot (exit 0), and a field spoilt for a late plot left the earlier plots
    redrawn and the rest old. Now the record is checked whole first, and the plots are moved in only when
    every one of them was drawn."""
    _record_with(tmp_path, spoil)
    with pytest.raises(SystemExit) as e:
        R.main(['--replot', f'--results_dir={tmp_path}'])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1 and says in err, err
    assert all((tmp_path / f).read_bytes() == b'the old plot' for f in R.FIGS.values())
    assert sorted(os.listdir(tmp_path)) == sorted(list(R.FIGS.values()) + ['results.json'])  # no scratch left


def test_replot_swaps_the_results_folder_whole(tmp_path, capsys, monkeypatch):
    """--replot once moved its plots in file by file (os.replace each), so a failure between two moves left some
    plots new and the rest old. It swaps the folder whole now (paths.atomic_folder): the second move failing
    leaves every file as it was, the record and the report carried over on success, and no scratch either way."""
    res = tmp_path / 'results'
    res.mkdir()
    _record_with(res, lambda d: None)
    (res / 'README.md').write_text('the report')
    moves, real = [], (os.replace, os.rename)

    def second_fails(real_move):  # the second move into or out of the results folder fails
        def move(a, b):
            if any(str(x) == str(res) or os.path.dirname(str(x)) == str(res) for x in (a, b)):
                moves.append(a)
                if len(moves) == 2:
                    raise OSError(28, 'No space left on device')
            return real_move(a, b)
        return move
    monkeypatch.setattr(os, 'replace', second_fails(real[0]))
    monkeypatch.setattr(os, 'rename', second_fails(real[1]))
    with pytest.raises(SystemExit) as e:
        R.main(['--replot', f'--results_dir={res}'])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1 and 'No space left on device' in err, err
    assert all((res / f).read_bytes() == b'the old plot' for f in R.FIGS.values())
    assert sorted(os.listdir(tmp_path)) == ['results']
    monkeypatch.setattr(os, 'replace', real[0])
    monkeypatch.setattr(os, 'rename', real[1])
    R.main(['--replot', f'--results_dir={res}'])
    assert all((res / f).read_bytes() != b'the old plot' for f in R.FIGS.values())
    assert (res / 'README.md').read_text() == 'the report' and (res / 'results.json').exists()
    assert sorted(os.listdir(tmp_path)) == ['results']


def test_no_legend_lies_over_data(tmp_path, monkeypatch):
    """Every plot make findings draws (finding 8's legend of 25 entries once covered its data): no legend's
    box overlaps any axes' box, and a figure's title overlaps no panel, its title included."""
    from aogpt import plot
    _record_with(tmp_path, lambda d: None)
    real, seen = plot._save, []

    def checked(plt, fig, path, rect=(0, 0, 1, 1)):
        fig.tight_layout(rect=rect)
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        boxes = [lg.get_window_extent(r) for lg in [ax.get_legend() for ax in fig.axes if ax.get_legend()]
                 + list(fig.legends)]
        for i, box in enumerate(boxes):
            assert not any(box.overlaps(ax.get_window_extent(r)) for ax in fig.axes), os.path.basename(path)
            assert not any(box.overlaps(other) for other in boxes[i + 1:]), os.path.basename(path)
        for text in fig.texts:  # a suptitle
            assert not any(text.get_window_extent(r).overlaps(ax.get_tightbbox(r)) for ax in fig.axes
                           if ax.get_visible()), os.path.basename(path)
        seen.append(os.path.basename(path))
        real(plt, fig, path, rect)
    monkeypatch.setattr(plot, '_save', checked)
    R.main(['--replot', f'--results_dir={tmp_path}'])
    assert sorted(seen) == sorted(R.FIGS.values())


# ----------------------------------------------------------------------------- finding 9 (findings/optimizers.py)

def test_steps_to_reach_interpolates_between_evals():
    from findings import optimizers as O
    assert O.steps_to_reach([0, 100, 200], [3.0, 2.0, 1.0], 1.5) == pytest.approx(150.0)
    assert O.steps_to_reach([0, 100, 200], [3.0, 2.0, 1.0], 2.0) == 100.0  # reached exactly at an eval
    assert O.steps_to_reach([0, 100, 200], [3.0, 1.0, 2.5], 2.0) == pytest.approx(50.0)  # the first crossing
    assert O.steps_to_reach([0, 100], [3.0, 2.0], 1.0) is None


def _log(speed, floor, seed_shift=0.0, n=61, every=100):
    """An eval log whose losses fall as floor + 2 exp(-speed * step / 1000) (speed 1: AdamW's pace)."""
    return [dict(iter=i * every, val_ao=floor + seed_shift + 2 * math.exp(-speed * i * every / 1000),
                 val_l2r=floor - 0.5 + seed_shift + 2 * math.exp(-speed * i * every / 1000)) for i in range(n)]


@pytest.mark.parametrize('speed,want', [(1 / 0.6, 'met'), (1 / 0.8, 'not met'), (0.7, 'not met')])
def test_finding9_ratio_follows_the_curves(speed, want):
    """Muon's curve is AdamW's run `speed` times faster: the step ratio is 1/speed (interpolation aside)."""
    from findings import optimizers as O
    logs = {}
    for i, s in enumerate((1, 2)):
        for model in ('ao', 'l2r'):
            logs[f'{model}_adamw_s{s}'] = _log(1.0, 1.5, 0.01 * i)
            logs[f'{model}_muon_s{s}'] = _log(speed, 1.5, 0.01 * i)
    judged, gap = O.judge(logs, [1, 2], 6000)
    rows = judged['ao val_ao']
    v, text = O.verdict_line(rows)
    assert v == want, text
    if speed > 1:  # AdamW's end loss is reached; the ratio is the time compression
        assert all(r['ratio'] == pytest.approx(1 / speed, abs=0.02) for r in rows), rows
        assert f"{1 / speed:.2f}x" in text
    else:  # Muon never gets there: said so, with the ratio the other way round (> 1)
        assert all(r['ratio'] is None and r['reverse'] > 1 for r in rows) and 'does not reach' in text
    assert gap['adamw'] == pytest.approx([0.5, 0.5], abs=0.01)  # same floors: finding 1's gap is the L2R offset


def test_finding9_runs_differ_only_in_the_optimizer_and_its_keys():
    """Like with like: a finding-9 command is reproduce.py's command for that model plus only the optimizer's
    keys (learning rates, optimizer, muon_lr, muon_adaln) and the seed."""

    from findings import optimizers as O
    c = SimpleNamespace(runs_dir='r', device='cpu', n_layer=2, n_head=2, n_embd=32, target_dim=16, block_size=64,
                        batch_size=4, max_iters=100, learning_rate=1e-3, ema_decay=0.99, eval_interval=10,
                        eval_iters=2, eval_orders=2, seed=1)
    parse = lambda args: dict(a[2:].split('=', 1) for a in args[1:])  # noqa: E731
    for model in ('ao', 'l2r'):
        base = parse(R.train_args(c, model))
        for spec in [O.run(model, 'adamw', 6e-3, 2), O.run(model, 'muon', 0.02, 1337, 6e-3, adaln=True)]:
            args = parse(R.train_args(c, spec[0], dict([spec])))
            diff = {k for k in set(args) | set(base) if args.get(k) != base.get(k)}
            assert diff <= {'out_dir', 'learning_rate', 'min_lr', 'optimizer', 'muon_lr', 'muon_adaln', 'seed'}
            assert args['max_iters'] == '100' and ('optimizer' in args) == (spec[0].split('_')[1] == 'muon')


def test_finding9_report_and_replot_from_its_record(tmp_path, capsys):
    """The report from synthetic runs: the findings-table row, the section, the record and both plots; --replot
    redraws the plots from the record alone, and a spoilt record is one line."""

    from findings import optimizers as O
    logs = {f'{m}_{o}_s{s}': _log(1.0 if o == 'adamw' else 1.5, 1.5 + (0.3 if m == 'ao' else 0), 0.01 * i)
            for i, s in enumerate((1, 2)) for m in ('ao', 'l2r') for o in ('adamw', 'muon')}
    logs.update({f'ao_muon32_s{s}': logs[f'ao_muon_s{s}'] for s in (1, 2)})  # a float32 iteration, same curves
    sweep = [dict(name=f'{m}_{o}_lr{x:g}{"_adaln" if a else ""}_s1', model=m, opt=o, lr=x, adaln=a,
                  end={'val_ao': 2.0 + x, 'val_l2r': 1.5})
             for m in ('ao', 'l2r') for o, xs in (('adamw', (1e-3, 3e-3)), ('muon', (0.02,))) for x in xs
             for a in ((False, True) if o == 'muon' else (False,))]
    d = dict(config=dict(max_iters=6000, sweep_iters=3000, eval_interval=100), seeds=[1, 2], sweep=sweep,
             best={}, muon_adaln=False, best_text='(synthetic)', logs=logs, what={k: k for k in logs},
             commands={k: f'python train.py {k}' for k in [*logs, *(r['name'] for r in sweep)]}, cpu_min=0.0,
             step_times=dict(rows=[dict(optimizer=o, ms=ms, opt_ms=1.0) for o, ms in
                                   (('adamw', 10.0), ('muon', 12.0), ('muon_fp32', 11.0))],
                             torch='x', capability='DEFAULT', command='python bench/train_speed.py --optimizer'))
    c = SimpleNamespace(results_dir=str(tmp_path), quick=False, device='cpu')
    O.report(c, d, 'python findings/optimizers.py')
    md = (tmp_path / O.SECTION).read_text()
    row = next(line for line in md.splitlines() if line.startswith('| 9 | '))
    assert '**met**' in row and '0.67x' in row and 'with AdamW' in row and '(synthetic)' in row
    # wall-clock: the step ratio times the step-time ratio (Muon 1.2x, its float32 iteration 1.1x AdamW's step)
    assert '1.20x AdamW\'s step time, so 0.80x the time' in row and '1.10x the step time, 0.67x the steps, 0.73x' in row
    assert '| 1 | 1.805 | 1.800 | 1.800 | 0.67 / 0.67 | 0.80 / 0.73 |' in md  # seed 1: end losses, ratios
    assert md.count('| AO-GPT | any-order |') == 3 and md.count('`python train.py ') == len(d['commands'])
    assert 'every run reused from an earlier invocation' in md and 'CPU-core-minutes' not in md  # nothing trained
    assert '| AO-GPT | any-order | mean ± half range (2 seeds) |' in md  # the two seeds' rows, then their mean
    record = json.loads((tmp_path / O.RECORD).read_text())
    assert record['verdicts']['row'] == row
    for f in (O.FIG_CURVES, O.FIG_SWEEP):
        (tmp_path / f).unlink()
    O.main(['--replot', f'--results_dir={tmp_path}'])
    assert (tmp_path / O.FIG_CURVES).exists() and (tmp_path / O.FIG_SWEEP).exists()
    (tmp_path / O.RECORD).write_text('{"logs": 3}')
    capsys.readouterr()
    with pytest.raises(SystemExit):
        O.main(['--replot', f'--results_dir={tmp_path}'])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'is not a readable finding-9 record' in err, err


# ----------------------------------------------------------------------------- finding 11 (findings/adapt.py)

def _adapt_logs(speed, split_ao, split_l2r, seeds=(1, 2)):
    """Synthetic finding-11 runs: scratch AO-GPTs over 6000 steps (end any-order ~1.5, L2R ~1.0), GPTs, the
    adaptations of the full GPT over 2000 steps falling to 1.4 at `speed` x the scratch pace, and the equal-total
    runs ending at split_ao / split_l2r (+ the seed's shift)."""
    logs = {}
    for i, s in enumerate(seeds):
        shift = 0.01 * i
        for opt in ('adamw', 'muon'):
            logs[f'ao_{opt}_s{s}'] = _log(1.0, 1.5, shift)
            logs[f'full{"_muon" if opt == "muon" else ""}_s{s}'] = _log(speed, 1.4, shift, n=21)
        logs[f'gpt_s{s}'] = [dict(r, val_ao=None) for r in _log(1.0, 1.2, shift)]
        for name, *_ in AD.LEVERS:  # every lever as fast as the recipe, the plain adaptation slower
            logs[f'{name}_s{s}'] = _log(1.0 if name == 'as_is' else speed, 1.4, shift, n=21)
        for S in (1500, 3000, 4500):
            logs[f'split{S}_s{s}'] = [dict(iter=k * 100, val_ao=split_ao + shift + (S - 3000) / 1e5,
                                           val_l2r=split_l2r + shift) for k in range((6000 - S) // 100 + 1)]
    return logs


@pytest.mark.parametrize('speed,split_ao,split_l2r,want,checks', [
    (5.0, 1.45, 0.9, 'met', [True, True, True]),          # reaches the target at ~0.1x; better on both losses
    (1.0, 1.45, 0.9, 'partly met', [False, True, True]),   # the adaptation never gets there within 2000 steps
    (5.0, 1.6, 1.2, 'partly met', [True, False, False]),   # equal totals: worse on both beyond the seed spread
])
def test_finding11_verdict_follows_the_curves(speed, split_ao, split_l2r, want, checks):
    from findings import adapt as A
    d = dict(logs=_adapt_logs(speed, split_ao, split_l2r), splits=[1500, 3000, 4500], lever_seeds=[2])
    j = A.judge(d, [1, 2], 6000, 0.3)
    assert j['levers']['as_is'][0]['steps'] is None and len(j['levers']) == len(A.LEVERS)
    # the L2R edge over scratch's end: lost at the first eval above it, back at the first one after at or below
    curve = [dict(iter=i * 100, val_l2r=v) for i, v in enumerate((1.5, 2.3, 1.9, 1.8))]
    assert [A.l2r_kept(curve, bar) for bar in (1.95, 2.5, 1.7)] == [(100, 200), (None, None), (100, None)]
    assert j['verdict'] == want and j['checks'] == checks and j['best'] == 1500  # the lowest any-order end
    r = j['sunk'][0]['adamw']
    if speed == 5.0:  # 1.4 + 2 exp(-5 t / 1000) = the scratch end (1.5 + 2 exp(-6), a mean of 3 evals): t ~ 590
        assert 550 < r['steps'] < 650 and r['ratio'] == r['steps'] / 6000
    else:
        assert r['steps'] is None and r['ratio'] is None


def test_the_recipe_in_parts():
    """A scratch run takes the recipe apart: a schedule's keys go with the key they schedule, each other key alone;
    a one-part recipe has nothing to take apart."""
    from findings import adapt as A
    keys = lambda name: next(over for n, over, _, _ in A.LEVERS if n == name)  # noqa: E731
    assert A.recipe_parts(keys('tstd1_semiar')) == [dict(target_std=1.0),
                                                    dict(order_warmup='semiar:1:32', order_warmup_iters=500)]
    assert A.recipe_parts(keys('tstd1_body')) == [dict(target_std=1.0), dict(target_lr_scale=3.0),
                                                  dict(learning_rate=2e-3, min_lr=2e-4)]
    assert A.recipe_parts(keys('tstd1_l2r')) == [dict(target_std=1.0),
                                                 dict(order='l2r', l2r_frac_end=0.1, l2r_frac_iters=500)]
    assert A.recipe_parts(keys('tstd1')) == [] and A.recipe_parts({}) == []
    c = SimpleNamespace(recipe='tstd1_semiar', seed_list=[1, 2], learning_rate=6e-3, muon_lr=0.01)
    runs = A.scratch_runs(c)
    assert sorted(k for k in runs if k.startswith('part')) == ['part1_adamw_s1', 'part1_adamw_s2', 'part2_adamw_s1',
                                                                'part2_adamw_s2']
    over, what = runs['part2_adamw_s1']
    assert over == dict(runs['ao_adamw_s1'][0], order_warmup='semiar:1:32', order_warmup_iters=500)
    assert what.endswith("with the recipe's order_warmup=semiar:1:32, order_warmup_iters=500 alone")


def test_a_section_says_what_its_invocation_cost_or_that_it_reused_every_run():
    """A rerun that reused every run said "the training runs 0.0 CPU-core-minutes" (finding 10's section), which
    reads as the finding's cost; it says where the runs came from instead. One phrase for all four scripts."""
    assert report.trained_cost(12.34) == "12.3 CPU-core-minutes for the runs it trained (runs reused cost nothing here)"
    for cpu in (0.0, 0.04):
        assert report.trained_cost(cpu, reused='reproduce.py') == "every run reused from reproduce.py"
    c, _ = R.read_config([])
    with open(os.path.join(R.ROOT, 'results', 'orders.json'), encoding='utf-8') as f:
        rows = json.load(f)['rows']  # the committed record's
    summary = O.summarize(rows)
    sec = O.section(c, 'python findings/orders.py', rows, summary, O.judge_orders(summary), 66.0, O.all_runs(c), 0.0)
    assert 'in 1.1 min; every run reused from reproduce.py or an earlier invocation.' in sec
    assert 'CPU-core-minutes' not in sec
    sec = O.section(c, 'python findings/orders.py', rows, summary, O.judge_orders(summary), 66.0, O.all_runs(c), 62.5)
    assert 'in 1.1 min; 62.5 CPU-core-minutes for the runs it trained (runs reused cost nothing here).' in sec


def test_finding11_report_replot_and_bad_settings(tmp_path, capsys):
    """The report from synthetic runs (row, section, record, plot); --replot from the record alone; settings that
    cannot make the study are one line each, before any run."""

    from findings import adapt as A
    logs = _adapt_logs(5.0, 1.45, 0.9)
    d = dict(config=dict(budget=6000, sunk=2000, ratio=0.3, eval_interval=100, learning_rate=6e-3, muon_lr=0.01),
             seeds=[1, 2], lever_seeds=[1, 2], recipe='tstd1', vocab=49, splits=[1500, 3000, 4500], reused=[],
             logs=logs, what={k: k for k in logs},
             commands={k: f'python train.py {k}' for k in logs}, cpu_min=0.0)
    A.report(SimpleNamespace(results_dir=str(tmp_path), quick=False, device='cpu', runs_dir='runs'), d,
             'python findings/adapt.py')
    md = (tmp_path / A.SECTION).read_text()
    row = next(line for line in md.splitlines() if line.startswith('| 11 | '))
    assert '**met**' in row and 'best split 1500 L2R + 4500 adaptation' in row and 'recipe tstd1' in row
    assert f"| as_is | start | {A.LEVER_WHAT['as_is']} | 2 | " in md  # every lever tried, each seed
    assert "Did not, within 2000 steps: as_is." in md  # the levers that lost, by name
    assert "the recipe's keys alone move" not in md  # no like-for-like runs here: the paper's scratch is the yardstick
    assert 'scores 3.4' in md and 'than a uniform guess over the 49 characters' not in md
    assert md.count('`python train.py ') == len(logs)
    assert json.loads((tmp_path / A.RECORD).read_text())['judged']['row'] == row
    # like-for-like scratch runs (the recipe's keys from scratch) that end below the adaptation: claim 1 fails
    # against them, while the paper-default scratch is still reached
    lfl = dict(logs, **{f'lfl_{o}_s{s}': _log(1.0, 1.2, 0.01 * i) for i, s in enumerate((1, 2)) for o in ('adamw', 'muon')})
    lfl.update({f'part{p}_adamw_s{s}': _log(1.0, 1.2 + 0.1 * p, 0.01 * i) for i, s in enumerate((1, 2)) for p in (1, 2)})
    parts = ['target_std=1.0', 'order_warmup=semiar:1:32, order_warmup_iters=500']
    A.report(SimpleNamespace(results_dir=str(tmp_path / 'lfl'), quick=False, device='cpu', runs_dir='runs'),
             dict(d, logs=lfl, what={k: k for k in lfl}, commands={k: k for k in lfl}, parts=parts),
             'python findings/adapt.py')
    md = (tmp_path / 'lfl' / A.SECTION).read_text()
    j = json.loads((tmp_path / 'lfl' / A.RECORD).read_text())['judged']
    assert j['checks'][0] is False and all(r['adamw']['paper_ratio'] < 0.3 for r in j['sunk'])
    assert "the recipe's keys alone move the end any-order loss from 1.510 ± 0.005 to 1.210 ± 0.005 with AdamW" in md
    assert "against scratch with the same keys: reached on 0 of 2 seeds within the adaptation's steps with AdamW" in md
    # each part of the recipe from scratch, apart: its seeds' ends and their mean (1.3 + 2 exp(-6), + 0.01 on seed 2)
    assert ("Apart, with AdamW (against the paper-default scratch run of the same seed): target_std=1.0 alone 1.310 "
            "± 0.005 (1.305, 1.315; -0.200 on average, lower on 2 of 2 seeds); order_warmup=semiar:1:32, "
            "order_warmup_iters=500 alone 1.410 ± 0.005 (1.405, 1.415; -0.100 on average, lower on 2 of 2 seeds).") in md
    (tmp_path / A.FIG).unlink(), (tmp_path / A.LEVER_FIG).unlink()
    A.main(['--replot', f'--results_dir={tmp_path}'])
    assert (tmp_path / A.FIG).exists() and (tmp_path / A.LEVER_FIG).exists()
    dirs = ['--runs_dir', str(tmp_path / 'runs'), '--results_dir', str(tmp_path / 'res')]
    for argv, says in [(['--splits', '15'], "--splits must be a comma-separated list of steps in (0, budget=40), "
                                            "multiples of eval_interval=10"),
                       (['--splits', '10,10'], "--splits 10,10 names a split twice"),
                       (['--ratio', '1.5'], "--ratio must be in (0, 1], got 1.5"),
                       (['--budget', '45'], "--budget (45) must be a multiple of --eval_interval (10)"),
                       (['--lever_seeds', '9'], "--lever_seeds 9 must be among --seeds 1337,2,3,4"),
                       (['--recipe', 'fast'], "--recipe must name a lever: as_is, tstd1, ")]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            A.main(['--quick', *argv, *dirs])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code != 0 and len(err) == 1 and says in err[0], err
    assert not any((tmp_path / 'runs').glob('*/*'))  # no run started
