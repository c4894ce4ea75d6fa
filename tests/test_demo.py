"""make demo, end to end with a shrunk config, and the unigram baseline its summary stands on."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from findings import demo_summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_unigram_nll_of_a_sample_on_itself_is_its_entropy():
    rng = np.random.default_rng(0)
    x = rng.choice(5, size=2000, p=[0.5, 0.2, 0.15, 0.1, 0.05])
    counts = np.bincount(x, minlength=5).astype(np.float64)
    p = counts / counts.sum()
    entropy = -(p * np.log(p)).sum()
    assert demo_summary.unigram_nll(counts, 1e-12, x) == pytest.approx(entropy, rel=1e-9)
    # smoothing moves mass to rarer symbols, so it can only cost on the sample it was counted on
    assert demo_summary.unigram_nll(counts, 1.0, x) > entropy
    # an unseen symbol gets alpha / (N + alpha * V), not zero
    counts0 = np.array([3.0, 1.0, 0.0])
    assert demo_summary.unigram_nll(counts0, 0.5, np.array([2])) == pytest.approx(-math.log(0.5 / 5.5))


@pytest.mark.slow
def test_make_demo_runs_end_to_end_and_reuses_its_work(tmp_path):
    """demo.sh with the demo's config shrunk to seconds: every stage runs, the summary's numbers are the
    evaluation's, and a second run trains and evaluates nothing."""
    cfg = tmp_path / 'tiny.py'
    cfg.write_text(open(os.path.join(ROOT, 'config', 'train_demo.py')).read() + "\n".join([
        "", "n_layer = 1", "n_embd = 32", "target_dim = 16", "batch_size = 8", "max_iters = 20",
        "lr_decay_iters = 20", "warmup_iters = 2", "eval_interval = 10", "eval_iters = 2", "log_interval = 10", ""]))
    out = tmp_path / 'out'
    env = dict(os.environ, PYTHON=sys.executable, DEMO_OUT=str(out), DEMO_CONFIG=str(cfg), DEMO_CHUNKS='12')
    first = subprocess.run(['bash', 'findings/demo.sh'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    text = first.stdout
    for header in ('1/5', '2/5', '3/5', '4/5', '5/5'):
        assert f"=== {header}" in text
    assert 'config:' not in text and 'config:' in (out / 'train.log').read_text()  # shown in the log only
    infill = text.split('=== 4/5')[1].split('=== 5/5')[0]
    assert infill.count('the company said') >= 3 and infill.count('in the third quarter') >= 3

    ev = json.load(open(out / 'eval_ppl.json'))['datasets']['ptb']
    assert ev['chunks'] == 12 and ev['tokens'] == 12 * 64
    summary = text.split('=== 5/5 summary')[1]
    own = summary.split('range over')[0]  # the table; below it, the range bench/demo_spread.py measured
    table = {line[:48].strip(): line[48:].split() for line in own.splitlines() if line.startswith('  AO-GPT')
             or line.startswith('  unigram')}
    assert len(table) == 4, own
    spread = os.path.join(ROOT, 'results', 'demo_spread.json')
    if os.path.isfile(spread):
        runs = len(json.load(open(spread))['runs'])
        assert f'range over {runs} runs' in summary and ' to ' in summary.split('range over')[1]
    assert float(table['AO-GPT, left to right (exact)'][0]) == pytest.approx(ev['l2r']['nll'], abs=5e-4)
    assert float(table['AO-GPT, any-order, ensemble x8 (bound)'][0]) == pytest.approx(ev['ensemble']['nll'], abs=5e-4)
    uni = [v for k, v in table.items() if k.startswith('unigram')][0]
    assert 2.5 < float(uni[0]) < 4.0  # characters of English: about 3 nats under a unigram
    assert 'wall time: prepare' in summary and 'train' in summary
    assert "check: skipped (not the demo's own config" in summary  # 20 steps promise nothing

    again = subprocess.run(['bash', 'findings/demo.sh'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert 'nothing to train' in again.stdout and 'done already' in again.stdout
    assert again.stdout.split('=== 5/5 summary')[1].splitlines()[:6] == summary.splitlines()[:6]


def test_demo_summary_says_what_is_missing(tmp_path, capsys):
    with pytest.raises(SystemExit):
        demo_summary.main([f'--out_dir={tmp_path}'])
    assert 'ckpt.pt not found' in capsys.readouterr().err


def test_summary_prints_the_measured_range(tmp_path):
    rec = dict(date='2026-01-01', runs=[dict(name='a', l2r=1.9, any_order=2.4, ensemble=2.39),
                                        dict(name='b', l2r=2.0, any_order=2.45, ensemble=2.41)])
    (tmp_path / 'spread.json').write_text(json.dumps(rec))
    lines = demo_summary.spread_lines(str(tmp_path / 'spread.json'), [('l2r', 'L2R'), ('ensemble', 'ens')])
    assert '2 runs' in lines[0] and 'a, b' in lines[0]
    assert lines[1].split()[-3:] == ['1.900', 'to', '2.000'] and lines[2].split()[-3:] == ['2.390', 'to', '2.410']
    assert demo_summary.spread_lines(str(tmp_path / 'missing.json'), []) == []


UNIGRAM = 2.974  # the demo's unigram baseline on its 1000 PTB test rows (README)


@pytest.mark.parametrize('l2r,ao,ok', [
    (1.895, 2.460, True),   # bench/demo_spread.py on an AVX-512 CPU
    (1.933, 2.462, True),   # ATEN_CPU_CAPABILITY=default
    (1.946, 2.529, True),   # seed 2
    (1.984, 2.480, True),   # a 2-core AMD EPYC with AVX2, native kernels (outside the range printed above)
    (1.951, 2.462, True),   # the same with ATEN_CPU_CAPABILITY=default (outside it too)
    (2.018, 2.437, True),   # a fresh clone on another host (results/notes.md)
    (2.95, 2.97, False),    # learned nothing: a broken install
    (2.40, 2.90, False),    # L2R learned a little, any-order stuck on the unigram plateau
])
def test_the_demos_check_passes_every_working_cpu_and_fails_a_broken_install(l2r, ao, ok):
    got, line = demo_summary.promise(UNIGRAM, {'l2r': l2r, 'any_order': ao})
    assert got is ok and line.startswith(f"check: {'PASS' if ok else 'FAIL'}"), line
