"""make demo, end to end with a shrunk config, and the unigram baseline its summary stands on."""
import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

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
    table = {line[:48].strip(): line[48:].split() for line in summary.splitlines() if line.startswith('  AO-GPT')
             or line.startswith('  unigram')}
    assert len(table) == 4 and 'range' not in summary, summary
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


def test_the_summary_prints_the_table_then_the_check_and_no_range(tmp_path, capsys, monkeypatch):
    """A range measured on one host read as a broken install on another, whose working demo landed outside it
    (issue 58: L2R 1.984 under a printed 1.895 to 1.946, then check: PASS). The summary is the table, then the
    check, which every working install passes; the spread stays in results/ (bench/demo_spread.py's record)."""
    import torch
    monkeypatch.chdir(ROOT)  # where results/demo_spread.json, the record of the range, lies
    ck = dict(config=dict(dataset='ptb_char', batch_size=32, block_size=64, order='mix:0.1*l2r+0.9*random'),
              model_args=dict(n_layer=2, n_embd=64), iter_num=5000, model={'w': torch.zeros(10)})
    monkeypatch.setattr(demo_summary, 'load_checkpoint', lambda path: ck)
    monkeypatch.setattr(demo_summary, 'checkpoint_codec', lambda ck: SimpleNamespace(name='char'))
    monkeypatch.setattr(demo_summary, 'find_dataset', lambda name, root: str(tmp_path))
    monkeypatch.setattr(demo_summary, 'unigram_baseline', lambda *a: (0.1, UNIGRAM, 64000))
    (tmp_path / 'ckpt.pt').write_bytes(b'')
    ptb = {k: dict(nll=v) for k, v in (('l2r', 1.984), ('any_order', 2.480), ('ensemble', 2.471))}
    (tmp_path / 'eval_ppl.json').write_text(json.dumps(dict(block_size=64, ensemble=8, ema=True, datasets=dict(
        ptb=dict(ptb, chunks=1000, tokens=64000)))))
    demo_summary.main([f'--out_dir={tmp_path}'])
    out = capsys.readouterr().out.splitlines()
    assert out[2].split()[:2] == ['nats/character', 'PPL'] and out[4].startswith('  AO-GPT, left to right')
    assert out[7].startswith('check: PASS') and len(out) == 8, out
    assert not any('range' in line for line in out), out


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
