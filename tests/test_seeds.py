"""Issue #50: the verdicts that lean on a seed spread take it from every seed of a findings script's seeds
setting (4 by default), not from two. The runs of the first two seeds keep their names and commands (finished
runs are reused); --extend adds seeds to finding 9's record by training only the new seeds' compared runs; each
report says which verdicts changed against the record it replaces."""
import json
import math
from types import SimpleNamespace

import pytest

from findings import judging as J
from findings import optimizers as OPT
from findings import orders as O
from findings import report
from findings import reproduce as R


def _log(speed, floor, shift=0.0, n=61, every=100):
    """An eval log falling as floor + 2 exp(-speed * step / 1000) (speed 1: AdamW's pace)."""
    return [dict(iter=i * every, val_ao=floor + shift + 2 * math.exp(-speed * i * every / 1000),
                 val_l2r=floor - 0.5 + shift + 2 * math.exp(-speed * i * every / 1000)) for i in range(n)]


def _f9_record(seeds):
    """A finding-9 record (the shape study() writes) on `seeds`, Muon at 1/0.6 of AdamW's pace."""
    logs = {f'{m}_{o}_s{s}': _log(1.0 if o == 'adamw' else 1 / 0.6, 1.5 + (0.3 if m == 'ao' else 0), 0.01 * i)
            for i, s in enumerate(seeds) for m in ('ao', 'l2r') for o in ('adamw', 'muon', 'muon32')
            if (m, o) != ('l2r', 'muon32')}
    sweep = [dict(name=f'{m}_{o}_lr{x:g}_s{seeds[0]}', model=m, opt=o, lr=x, adaln=False,
                  end={'val_ao': 2.0 + x, 'val_l2r': 1.5}) for m in ('ao', 'l2r') for o, x in (('adamw', 3e-3),
                                                                                                   ('muon', 0.02))]
    sweep += [dict(r, name=r['name'] + '_adaln', adaln=True) for r in sweep if r['opt'] == 'muon']
    return dict(config=dict(max_iters=6000, sweep_iters=3000, eval_interval=100, seeds=','.join(map(str, seeds))),
                seeds=list(seeds), sweep=sweep, best={m: dict(adamw=3e-3, muon=0.02) for m in ('ao', 'l2r')},
                muon_adaln=False, best_text='(synthetic)', logs=logs, what={k: k for k in logs},
                commands={k: f'python train.py {k}' for k in [*logs, *(r['name'] for r in sweep)]}, cpu_min=0.0,
                step_times=_step_times())


def _step_times(c=None):
    return dict(rows=[dict(optimizer=o, ms=ms, opt_ms=1.0) for o, ms in (('adamw', 10.0), ('muon', 12.0),
                                                                         ('muon_fp32', 11.0))],
                torch='x', capability='DEFAULT', command='python bench/train_speed.py --optimizer')


def _extend(tmp_path, monkeypatch, seeds_arg, trained):
    """optimizers.py --extend on a record with training and the step timing stubbed: `trained` collects the runs
    it would train (stage folder, name, train.py overrides: with the stage, what makes its command). The new
    seeds' Muon runs take 0.8x AdamW's steps."""
    def train(c, iters, sub, runs):
        trained.extend((sub, k, runs[k][0]) for k in runs)
        return {k: _log(1.0 if '_adamw_' in k else 1 / 0.8, 1.5, 0.02) for k in runs}
    monkeypatch.setattr(OPT, 'train', train)
    monkeypatch.setattr(OPT, 'step_times', _step_times)
    OPT.main(['--extend', *seeds_arg, f'--results_dir={tmp_path / "res"}', f'--runs_dir={tmp_path / "runs"}'])


def test_extend_with_new_seeds_trains_only_their_compared_runs(tmp_path, monkeypatch):
    """--extend --seeds=1,2,3 keeps the record's sweep and runs, and trains the compared runs (both models, both
    optimizers, and AO-GPT's float32 Muon) of seed 3 alone, with the commands study() gives them; the section's
    table then has the 3 seeds' mean and spread, and the verdict's change against the record it replaced."""
    (tmp_path / 'res').mkdir()
    OPT.report(SimpleNamespace(results_dir=str(tmp_path / 'res'), quick=False, device='cpu'), _f9_record([1, 2]),
               'python findings/optimizers.py')
    trained = []
    _extend(tmp_path, monkeypatch, ['--seeds=1,2,3'], trained)
    assert sorted(k for _, k, _ in trained) == ['ao_adamw_s3', 'ao_muon32_s3', 'ao_muon_s3', 'l2r_adamw_s3',
                                                'l2r_muon_s3']
    assert {sub for sub, _, _ in trained} == {'final'}
    for _, k, over in trained:  # what study() and float32_runs() would have run for seed 3, in runs_dir/final
        model, opt = k.split('_')[:2]
        assert over == OPT.run(model, opt, 0.02 if opt != 'adamw' else 3e-3, 3, 3e-3)[1][0]
    d = json.loads((tmp_path / 'res' / OPT.RECORD).read_text())
    assert d['seeds'] == [1, 2, 3] and d['config']['seeds'] == '1,2,3' and len(d['sweep']) == 6
    md = (tmp_path / 'res' / OPT.SECTION).read_text()
    assert md.count('mean ± half range (3 seeds)') == 3 and 'Verdicts against the previous record: ' in md
    assert '9: met -> **not met**' in md  # seed 3's Muon is slower than 0.7x: the wider spread overturns it
    # the record's own seeds again: nothing new to train (the step times only), and the section still says what
    # the third seed overturned
    trained.clear()
    _extend(tmp_path, monkeypatch, ['--seeds=1,2,3'], trained)
    assert trained == [] and ('Verdicts against the last record that judged otherwise: 9: met -> **not met**'
                              in (tmp_path / 'res' / OPT.SECTION).read_text())


@pytest.mark.parametrize('seeds', ['--seeds=2,1,3', '--seeds=1', '--seeds=1,3'])
def test_extend_refuses_seeds_that_drop_or_reorder_the_records(tmp_path, monkeypatch, capsys, seeds):
    (tmp_path / 'res').mkdir()
    (tmp_path / 'res' / OPT.RECORD).write_text(json.dumps(_f9_record([1, 2])))
    trained = []
    with pytest.raises(SystemExit) as e:
        _extend(tmp_path, monkeypatch, [seeds], trained)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code != 0 and len(err) == 1 and "must start with the record's seeds 1,2" in err[0], err
    assert trained == []


def test_the_default_is_four_seeds_in_each_findings_script():
    assert OPT.seeds == R.seeds == '1337,2,3,4' and R.seeds.split(',')[1] == str(R.SEED2)


@pytest.mark.parametrize('argv,says', [
    (['--seeds=1337,3'], "the second seed must be 2, ao_seed2's"),
    (['--seed=3'], "--seed=3 is the third seed's"),
    (['--seed=5', '--seeds=6,2'], '--seed=5 and --seeds=6,2 disagree'),
    (['--seeds=1337,2,2'], "--seeds must be different seeds, got '1337,2,2'")])
def test_a_bad_seeds_setting_is_one_line_before_any_run(tmp_path, capsys, argv, says):
    dirs = ['--runs_dir', str(tmp_path / 'runs'), '--results_dir', str(tmp_path / 'res')]
    for main in (R.main, O.main):
        with pytest.raises(SystemExit) as e:
            main([*argv, *dirs])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code != 0 and len(err) == 1 and says in err[0], err
    assert not (tmp_path / 'runs').exists()


def test_seeds_setting_reads_seed_and_quick(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # read_config works from the repository root: come back after
    dirs = [f'--runs_dir={tmp_path / "runs"}', f'--results_dir={tmp_path / "res"}']
    c, _ = R.read_config(['--seed=5', '--quick', *dirs])
    assert c.seed == 5 and c.seed_list == [5]  # --quick: the first seed only, as before
    c, _ = R.read_config(['--seed=5', *dirs])
    assert c.seed_list == [5, 2, 3, 4]
    c, _ = R.read_config(['--seeds=7,2', '--quick', *dirs])
    assert c.seed == 7 and c.seed_list == [7, 2]  # given on purpose: kept under --quick


def test_extra_seed_runs_keep_the_old_names_and_commands_and_are_shared():
    """Seed 2's runs are the ones trained before (ao_seed2, semiar4_seed2, ...), the same commands; seed 3's are
    `_seed3` with only the seed changed; reproduce.py's ao_seed3 is orders.py's (trained once for both)."""
    c = SimpleNamespace(runs_dir='r', device='cpu', n_layer=2, n_head=2, n_embd=32, target_dim=16, block_size=64,
                        batch_size=4, max_iters=100, learning_rate=1e-3, ema_decay=0.99, eval_interval=10,
                        eval_iters=2, eval_orders=2, seed=1337, seed_list=[1337, 2, 3, 4], quick=False)
    rr = R.seeded(R.RUNS, R.SPREAD_RUNS, c.seed_list[1:])
    assert set(rr) - set(R.RUNS) == {'ao_seed3', 'ao_seed4', 'ao_noL2R_seed2', 'ao_noL2R_seed3', 'ao_noL2R_seed4'}
    assert rr['ao_seed2'] == R.RUNS['ao_seed2']
    assert R.seeded_runs(c) == (rr, [k for k in R.RUNS if k != 'ao_seed2'] + [
        'ao_seed2', 'ao_seed3', 'ao_seed4', 'ao_noL2R_seed2', 'ao_noL2R_seed3', 'ao_noL2R_seed4'])
    # one seed (--quick): every run of RUNS but ao_seed2, as before
    assert R.seeded_runs(SimpleNamespace(seed_list=[1337]))[1] == [k for k in R.RUNS if k != 'ao_seed2']
    orr = O.all_runs(c)
    for k in O.RUNS:
        assert R.train_args(c, k, orr) == R.train_args(c, k, O.RUNS)
    parse = lambda name, runs: dict(a[2:].split('=', 1) for a in R.train_args(c, name, runs)[1:])  # noqa: E731
    for base in ('ao', 'ao_noL2R', 'semiar4', 'nearl2r16'):
        runs = rr if base in rr else orr
        a, b = parse(base, runs), parse(f'{base}_seed3', runs)
        assert {k for k in a if a[k] != b[k]} == {'out_dir', 'seed'} and b['seed'] == '3'
    assert R.train_args(c, 'ao_seed3', rr) == R.train_args(c, 'ao_seed3', orr)
    names = O.run_names(c)
    assert len(names) == 6 * 4 + 1 and 'semiar16_seed4' in names and 'ao_seed2' in names
    assert {O.family_of(k) for k in names if k != 'judge'} == set(O.FAMILIES)
    assert R.seed_names(['ao', 'ao_noL2R', 'ao_seed2', 'ao_noL2R_seed3', 'ao_tstd1'], 'ao') == ['ao', 'ao_seed2']


def test_finding3_judges_the_means_against_the_seed_range():
    # 10% L2R lower by 0.05 and 0.06 on the means; the seeds' largest range 0.04: reproduced
    v, ev = J.judge_better_seeds([('L2R loss', [1.00, 1.02, 1.04, 1.02], [1.06, 1.07, 1.08, 1.07]),
                                  ('any-order loss', [2.00, 2.01, 2.02, 2.01], [2.06, 2.07, 2.08, 2.07])])
    assert v == 'reproduced' and '1.070 ± 0.010 -> 1.020 ± 0.020' in ev and 'over 4 seeds' in ev
    # the same means, one wild seed widens the range to 0.10: within noise
    v, ev = J.judge_better_seeds([('L2R loss', [0.97, 1.07, 1.02, 1.02], [1.06, 1.07, 1.08, 1.07])])
    assert v == 'not reproduced' and '(within noise)' in ev and '0.100' in ev
    assert J.judge_better_seeds([('L2R loss', [1.0], [1.1])])[0] == 'reproduced'  # one seed: the sign only


def test_orders_spread_is_half_the_range_over_every_seed():
    rows = [dict(family='semiar:4', l2r=x, uniform=2.0, own=2.0, generation={}, speculative=dict(calls=10, nll=1))
            for x in (1.0, 1.2, 1.1, 1.3)]
    s = O.summarize(rows)['semiar:4']
    assert s['l2r'] == pytest.approx((1.15, 0.15)) and s['uniform'] == (2.0, 0.0)


def test_verdict_changes_name_what_changed():
    assert 'none to compare with' in report.verdict_changes({}, {'3': 'reproduced'})
    text = report.verdict_changes({'3': 'reproduced', '5a': 'reproduced', '1': 'x'},
                                  {'1': 'x', '3': 'not reproduced', '5a': 'reproduced', '9': 'met'})
    assert text == ('Verdicts against the previous record: 3: reproduced -> **not reproduced**; unchanged: 1, 5a; '
                    'new: 9.')
    assert report.verdict_changes({'3': 'a'}, {'3': 'a'}) == 'Verdicts against the previous record: none changed.'


def test_previous_verdicts_read_an_old_record_or_none(tmp_path):
    p = tmp_path / 'results.json'
    pick = lambda r: {f['id']: f['verdict'] for f in r['findings']}  # noqa: E731
    assert report.previous_verdicts(str(p), pick) == ({}, {})
    p.write_text(json.dumps(dict(findings=[dict(id='3', verdict='reproduced')])))
    assert report.previous_verdicts(str(p), pick) == ({'3': 'reproduced'}, {})
    p.write_text('{"findings": 3}')
    assert report.previous_verdicts(str(p), pick) == ({}, {})


def test_a_rewrite_from_the_same_runs_keeps_the_change_it_told(tmp_path):
    """A section rewritten with the same verdicts (the same runs, a new wording) still says what the last change
    overturned, against the last record that judged otherwise; a new change is told against the record it replaces."""
    p = tmp_path / 'f11_adapt.json'
    pick = lambda r: {'11': r['verdict']}  # noqa: E731

    def rerun(verdict):
        text, before = report.verdicts_against(str(p), pick, {'11': verdict})
        p.write_text(json.dumps(dict(verdict=verdict, verdicts_before=before)))
        return text

    assert 'none to compare with' in rerun('partly met')
    assert rerun('partly met') == 'Verdicts against the previous record: none changed.'
    told = 'Verdicts against the previous record: 11: partly met -> **not met**.'
    assert rerun('not met') == told
    again = 'Verdicts against the last record that judged otherwise: 11: partly met -> **not met**.'
    assert rerun('not met') == again and rerun('not met') == again  # every rewrite keeps it
    assert rerun('met') == 'Verdicts against the previous record: 11: not met -> **met**.'
    p.write_text(json.dumps(dict(verdict='met')))  # a record written before verdicts_before existed
    assert rerun('met') == 'Verdicts against the previous record: none changed.'
