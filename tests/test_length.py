"""findings/length.py (finding 12): its runs at reproduce.py's setting are reproduce.py's own commands and the others
differ from them only in what the finding varies; the breakdown by deciles of the fraction revealed adds up to the
loss the estimator reports, on tiny models; the verdict follows the seed spread; the report, its record, the plot and
--replot; bad settings are one line before any run; --quick end to end (slow).

Why the deciles are compared to rel=1e-12: both sides sum the same float64 per-prediction NLLs (of size ~3), in
another order (10 decile sums of the columns, against the per-window sums nll_any_order adds up); with N x n <= 161
terms the rounding is at most about 161 x 1.1e-16 relative (tests/README.md, class 5)."""
import json
import os
import subprocess
import sys
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch
from helpers import tiny

from aogpt.configurator import namespace
from aogpt.likelihood import nll_any_order, nll_by_revealed
from findings import length as L
from findings import report
from findings import reproduce as R


def config(*argv):
    """length.py's resolved settings, as its main makes them (without its folders)."""
    c = namespace(vars(L), list(argv))
    c.runs_dir = c.runs_dir or 'out-reproduce'
    L.check(c)
    L.reproduce_settings(c)
    return c


def test_the_runs_at_reproduces_setting_are_its_own_commands():
    """At 32 x 32 characters a step the runs are reproduce.py's, named and written as it writes them, so each run it
    trained is reused here and each one trained here serves it; every other run differs from reproduce.py's `ao` only
    in what the finding varies (the length and the batch that keeps the characters a step, the model, the seed), and
    in the AdaLN width a model without AdaLN is not given (train.py refuses a key its model never reads)."""
    c = config('--sigma=32,128,512')
    rc = namespace(vars(R), [])
    rc.runs_dir = c.runs_dir
    theirs = R.seeded(R.RUNS, ['ao', 'mdm', 'sigma'], c.seed_list[1:])
    args = lambda m, n, s, name: R.train_args(c.rc, name, {name: L.run_spec(c, m, n, s)})  # noqa: E731
    runs = [r for _, rs in L.plan(c) for r in rs]
    assert len(runs) == len({name for *_, name in runs}) == 3 * 3 * 4 + 2 * 2 * 4
    at32 = [r for r in runs if r[1] == 32 and 'rope' not in r[0]]
    assert {'ao', 'ao_seed2', 'ao_seed4', 'mdm', 'mdm_seed3', 'sigma'} <= {name for *_, name in at32}
    for r in at32:
        assert args(*r) == R.train_args(rc, r[3], theirs), r
    parse = lambda a: dict(x[2:].split('=', 1) for x in a[1:])  # noqa: E731
    base = parse(R.train_args(rc, 'ao'))
    for r in runs:
        a = parse(args(*r))
        diff = {k for k in set(a) | set(base) if a.get(k) != base.get(k)}
        assert diff <= {'out_dir', 'block_size', 'batch_size', 'seed', 'causal', 'cond', 'pos'} | \
            ({'target_dim'} if 'target_dim' not in a else set()), (r, diff)
        assert int(a['block_size']) * int(a['batch_size']) == 1024 and int(a['block_size']) == r[1]
    assert {r[1] for r in runs if 'rope' in r[0]} == {32, 128} and 'mdm_rope_n128_seed3' in {r[3] for r in runs}
    assert [r[1] for r in L.plan(c)[0][1]][0] == 512  # longest first: no core idles at the end of a stage
    assert not [r for _, rs in L.plan(config('--rope=')) for r in rs if 'rope' in r[0]]  # '' leaves a block out


@pytest.mark.parametrize('causal', [True, False])
def test_the_deciles_add_up_to_the_loss_the_estimator_reports(causal):
    """AO-GPT's slots and the MDM's ELBO draws, grouped by the fraction of the window revealed: the ten shares add up to
    nll_any_order's loss on the same draws (an uneven n = 23: deciles of 2 and 3 predictions), decile d holds exactly
    the r with d/10 <= r/n < (d+1)/10, and a decile's mean prediction times its count is its share."""
    V, n = 11, 23
    kw = {} if causal else dict(causal=False, cond='none', vocab_size=V + 1, mask_token_id=V)
    model = tiny(block_size=n, seed=3, **kw)
    chunks = torch.randint(0, V, (7, n), generator=torch.Generator().manual_seed(4))
    shares, per_slot, slots = L.deciles(nll_by_revealed(model, chunks, 3, torch.Generator().manual_seed(5)))
    s, cnt = nll_any_order(model, chunks, 3, torch.Generator().manual_seed(5))
    assert sum(shares) == pytest.approx(s / cnt, rel=1e-12, abs=0)
    assert slots == [sum(Fraction(d, 10) <= Fraction(r, n) < Fraction(d + 1, 10) for r in range(n)) for d in range(10)]
    assert sorted(set(slots)) == [2, 3]
    assert all(p * k / n == pytest.approx(x, rel=1e-12) for p, k, x in zip(per_slot, slots, shares))
    shares, per_slot, slots = L.deciles(torch.ones(2, 8, dtype=torch.float64))  # n < 10: some deciles hold nothing
    assert sum(slots) == 8 and [p for p in per_slot if p is None] and sum(shares) == 1.0


def test_the_verdict_follows_the_seed_spread_and_the_slope_is_per_doubling():
    """The gap grows (or shrinks) only by more than the larger seed range at the two ends; the slope is per doubling
    of the window (log2), per seed."""
    up = {32: [0.00, 0.02], 128: [0.05, 0.07], 512: [0.10, 0.12]}  # +0.10 over 4 doublings; each range 0.02
    word, f = L.judge_gap(up)
    assert word == 'grows' and f['change'] == pytest.approx(0.10) and f['noise'] == pytest.approx(0.02)
    assert f['slopes'] == pytest.approx([0.025, 0.025]) and f['slope'][0] == pytest.approx(0.025)
    assert L.judge_gap({n: [-v for v in vs] for n, vs in up.items()})[0] == 'shrinks'
    assert L.judge_gap({32: [0.0, 0.2], 128: [0.05, 0.15], 512: [0.05, 0.25]})[0] == 'stays within noise'
    word, f = L.judge_gap({32: [0.0], 512: [0.01]})  # one seed: the sign alone, and said so
    assert word == 'grows' and f['noise'] is None and 'one seed' in L.gap_text('ao', word, f)


def _row(model, n, seed, loss, gap=None):
    row = dict(run=f'{model}_n{n}_s{seed}', model=model, n=n, seed=seed, windows=4096 // n, loss=loss, loss_se=0.002,
               shares=[loss / 10] * 10, per_slot=[loss + 0.1 * (5 - d) for d in range(10)], slots=[n // 10] * 10,
               eval_cpu_s=6.0, log=[dict(iter=i, val_ao=loss + 1 / (1 + i), val_elbo=loss + 1 / (1 + i), val_l2r=None)
                                    for i in range(0, 6001, 250)])
    if model != 'mdm':
        row.update(l2r=loss - 0.2, gap=gap, gap_se=0.003)
    if model == 'ao':
        row.update(ensemble=loss - 0.01, ens_gain=0.006, ens_gain_se=0.001)
    return row


def _record(grow, unigram=3.0):
    """Two seeds at 32, 128 and 512: the MDM 0.1 lower a length, AO-GPT's gap `grow` higher a length, sigma-GPT's
    flat; the seeds 0.01 (the MDM) and 0.005 (the gaps) apart."""
    rows = []
    for k, n in enumerate((32, 128, 512)):
        for i, s in enumerate((1337, 2)):
            mdm = 2.3 + 0.01 * i - 0.1 * k
            rows.append(_row('mdm', n, s, mdm))
            for m, slope in (('ao', grow), ('sigma', 0.0)):
                gap = -0.2 + 0.005 * i + slope * k
                rows.append(_row(m, n, s, mdm + gap, gap))
    cfg = dict(tokens=1024, max_iters=6000, n_layer=2, n_embd=64, learning_rate=3e-3, ema_decay=0.995,
               val_tokens=131072, eval_orders=2, elbo_draws=8, ens_members=4, ens_draws=1)
    return dict(config=cfg, seeds=[1337, 2], rows=rows, what={r['run']: r['model'] for r in rows},
                commands={r['run']: f"python train.py --out_dir=runs/{r['run']}" for r in rows}, cpu_min=40.0,
                trained_cpu_min=40.0, eval_cpu_min=1.6, minutes=30.0, unigram=unigram)


def test_the_report_its_record_plot_and_replot(tmp_path, capsys):
    """From synthetic rows: the row's verdict and evidence (AO-GPT's gap +0.12 from 32 to 512 over 4 doublings,
    against a seed range of 0.005), sigma-GPT judged alike, the section joins results/README.md as finding 12, the
    record keeps the row, the plot is drawn and redrawn from the record alone; a spoilt record is one line."""
    res = tmp_path / 'res'
    res.mkdir()
    (res / 'README.md').write_text(f"{report.TITLE}\n\n| # | claim | verdict | evidence |\n|---|---|---|---|\n"
                                   f"| 11 | x | y | z |\n")
    c = SimpleNamespace(results_dir=str(res), quick=False, device='cpu', runs_dir='runs')
    L.report(c, _record(0.06), 'python findings/length.py')
    md = (res / L.SECTION).read_text()
    row = next(line for line in md.splitlines() if line.startswith('| 12 | '))
    assert '**the gap grows**' in row and 'AO-GPT − MDM at 32 / 128 / 512: -0.198 ± 0.003 / ' in row
    assert '32 -> 512 +0.120 against the larger seed range 0.005: grows' in row
    assert '+0.0300 ± 0.0000 nats per doubling' in row and '(so +0.030 nats per character per doubling' in row
    assert 'sigma-GPT − MDM at 32 / 128 / 512' in row and 'stays within noise' in row and '(unlike AO-GPT\'s)' in row
    assert 'left out' not in row and 'scores the unigram loss of these characters, 3.000' in md
    assert 'this one included: 40.0 CPU-core-minutes' in md and 'scoring 1.6 (' in md
    assert md.count('`python train.py ') == 18 and '| 512 | AO-GPT | ' in md and '| 512 | AO-GPT − MDM | ' in md
    assert '| sigma-GPT | 128 | ' in md and '| 128 | sigma-GPT − MDM | ' in md  # the other models' tables
    readme = (res / 'README.md').read_text()
    assert readme.index('| 11 | x') < readme.index('| 12 | ') and '## Finding 12' in readme
    assert json.loads((res / L.RECORD).read_text())['judged']['row'] == row
    (res / L.FIG).unlink()
    L.main(['--replot', f'--results_dir={res}'])
    assert (res / L.FIG).exists()
    L.report(c, _record(0.0), 'python findings/length.py')  # within noise now: the change is said
    md = (res / L.SECTION).read_text()
    assert '**the gap stays within noise**' in md and '12: the gap grows -> **the gap stays within noise**' in md
    (res / L.RECORD).write_text('{"rows": [')
    capsys.readouterr()
    with pytest.raises(SystemExit):
        L.main(['--replot', f'--results_dir={res}'])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'is not a readable finding-12 record' in err[0], err


def test_a_length_where_a_model_reads_no_context_is_left_out_and_the_evidence_says_whose_seeds():
    """A model whose loss is no more than 0.1 below the unigram loss has not learned where to look yet (finding 5's
    plateau). A length where either model of a pair is there on some seed is left out of the gap: there it says which
    model learns sooner at equal steps, not what one can hold (the claim). The evidence names the length, each model's
    loss and its seeds on the plateau; with fewer than two lengths left there is no verdict."""
    d = _record(0.06)
    for r in d['rows']:
        if r['n'] == 512 and r['model'] == 'mdm':
            r['loss'] = 2.95 + 0.01 * (r['seed'] == 2)  # the MDM on the plateau at 512; AO-GPT and sigma-GPT not
    verdict, ev, judged = L.judge(d['rows'], 3.0)
    assert verdict == 'the gap grows (32 to 128)' and judged['ao'][1]['lengths'] == [32, 128]
    assert 'not what it can hold: 512 (AO-GPT 2.027; MDM 2.955, on the plateau on 2 of 2 seeds)' in ev
    assert 'sigma-GPT − MDM at 32 / 128: ' in ev  # its MDM is on the plateau at 512 too: left out for it as well
    for r in d['rows']:
        if r['n'] == 32 and r['model'] == 'mdm' and r['seed'] == 2:
            r['loss'] = 2.95  # and at 32 on one seed: one length left, no verdict
    verdict, ev, judged = L.judge(d['rows'], 3.0)
    assert verdict == 'not judged' and 'AO-GPT − MDM: not judged (fewer than two lengths where both read their ' \
        'context on every seed: only 128)' in ev
    assert '32 (AO-GPT ' in ev and 'MDM 2.625, on the plateau on 1 of 2 seeds' in ev and 'like AO-GPT' not in ev
    verdict, ev, judged = L.judge(d['rows'], 1.9)  # no loss is more than 0.1 below it: no model reads its context
    assert verdict == 'not judged' and 'AO-GPT − MDM: not judged (fewer than two lengths where both read their ' \
        'context on every seed)' in ev


@pytest.mark.parametrize('argv,says', [
    (['--lengths=32'], "--lengths must be at least two different block sizes, shortest first, got '32'"),
    (['--lengths=16,8'], "--lengths must be at least two different block sizes, shortest first, got '16,8'"),
    (['--lengths=8,abc'], "--lengths must be a comma-separated list of block sizes of at least 2"),
    (['--tokens=48'], "--tokens=48 must be a multiple of every length (the batch is tokens / block_size): not of 32"),
    (['--val_tokens=16'], "--val_tokens=16 holds no window of 32"),
    (['--elbo_draws=0'], "--elbo_draws must be at least 1, got 0"),
    (['--seeds=3,3'], "--seeds must be different seeds, got '3,3'"),
    (['--rope=8,64'], "--rope must be a comma-separated list of lengths among --lengths=8,16,32, got '8,64'")])
def test_bad_settings_are_one_line_before_any_run(tmp_path, capsys, argv, says):
    dirs = ['--runs_dir', str(tmp_path / 'runs'), '--results_dir', str(tmp_path / 'res')]
    with pytest.raises(SystemExit) as e:
        L.main(['--quick', *argv, *dirs])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code != 0 and len(err) == 1 and says in err[0], err
    assert not list((tmp_path / 'runs').iterdir())  # no run started


@pytest.mark.slow
def test_quick_pipeline_runs_end_to_end_and_a_rerun_reuses_everything(tmp_path):
    """`length.py --quick` on two lengths and two seeds: every run trains and is scored, each row's deciles add up to
    its loss, the section and the plot are written; run again, it trains and scores nothing (the same rows) and still
    says what the runs cost to train."""
    runs, res = tmp_path / 'runs', tmp_path / 'res'
    argv = [sys.executable, 'findings/length.py', '--quick', '--lengths=8,16', '--seeds=1337,2', f'--runs_dir={runs}',
            f'--results_dir={res}']
    env = dict(os.environ, OMP_NUM_THREADS='1', WANDB_MODE='disabled')
    p = subprocess.run(argv, cwd=R.ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    d = json.loads((res / L.RECORD).read_text())
    assert len(d['rows']) == 5 * 2 * 2 and (res / L.FIG).exists()  # ao, mdm, the rope block and sigma-GPT
    for r in d['rows']:
        assert sum(r['shares']) == pytest.approx(r['loss'], rel=1e-12, abs=0), r['run']
        assert (L.MODELS[r['model']][2] is None) == ('gap' not in r)  # a gap for each decoder, none for an MDM
    md = (res / L.SECTION).read_text()
    assert '| 12 | ' in md and 'not judged (--quick)' in md and 'the runs it trained' in md
    p = subprocess.run(argv, cwd=R.ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0 and p.stdout.count('done already') == len(d['rows']), p.stdout[-2000:]
    again = json.loads((res / L.RECORD).read_text())
    assert [r['loss'] for r in again['rows']] == [r['loss'] for r in d['rows']]
    assert again['cpu_min'] < 0.05 and again['trained_cpu_min'] == pytest.approx(d['trained_cpu_min'])
    assert 'every run reused' in (res / L.SECTION).read_text()


def test_a_run_is_the_same_wherever_its_runs_dir_lies():
    """reproduce.same_run takes a run folder's command by its folder name, not the runs_dir's path: a runs_dir moved,
    or named relative where it was absolute, holds the same runs (reused, not refused or retrained), and the record
    names it as the script does, relative to the repository; another setting is still another run."""
    held = ['train.py', '--out_dir=/somewhere/else/out-reproduce/ao_n128', '--seed=2', '--target_dim=32',
            '--causal=False', '--cond=none']
    assert R.same_run(held, ['train.py', '--out_dir=out-reproduce/ao_n128', '--seed=2', '--causal=False',
                             '--cond=none'])
    assert not R.same_run(held, ['train.py', '--out_dir=out-reproduce/ao_n128', '--seed=3', '--causal=False',
                                 '--cond=none'])
    assert not R.same_run(held, ['train.py', '--out_dir=out-reproduce/ao_n512', '--seed=2', '--causal=False',
                                 '--cond=none'])
    c = namespace(vars(L), ['--replot=True'])  # settle as main calls it (replot: it makes no folder)
    R.settle(c, 'length', {}, runs_dir='out-reproduce')
    assert c.runs_dir == c.config['runs_dir'] == 'out-reproduce'  # where the record's commands put the runs
