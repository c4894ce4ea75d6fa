"""The GPU suite's bench commands, run on the CPU at toy sizes. A device call is 10 minutes of a session's
30, and a GPU comes to few sessions: none of it should go to a typo in a flag or a crash that a CPU
could have found first. Only the device and the sizes change; every other flag is the suite's own."""
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from helpers import processes

# per script, the sizes that make a run take seconds on a CPU (appended: the last value of a key wins)
TOY = {
    'bench/sample_speed.py': '--n_layer=1 --n_head=2 --n_embd=32 --n=32 --batch_size=2 --steps=4,16',
    'bench/eval_speed.py': '--n_layer=1 --n_head=2 --n_embd=32 --n=16 --chunks=2 --exact_chunks=1 --batch_size=4',
    'bench/train_speed.py': '--n_layer=1 --n_head=2 --n_embd=32 --block_size=32 --batch_size=2 --iters=1 '
                            '--warmup=1',
    'bench/profile_sampler.py': '--n_layer=1 --n_head=2 --n_embd=32 --n=32 --batch_size=2 --steps=4',
    'bench/sample_roofline.py': '--n_layer=1 --n_embd=32 --vocab_size=64 --target_dim=8 --n=32 --batch_size=2 '
                                '--steps=4,16 --buckets=0,8 --spec_ks=2 --spec_alphas=0.5',
}


def suite_commands(script='bench/gpu_suite.sh'):
    """Every `$PY bench/...` command in a GPU script, as (group, argv) with the loops unrolled and its NAME="..."
    variables filled in (gpu_session.sh's steps, `step SECS $PY ...`, are one group, 'session')."""
    text = open(os.path.join(ROOT, script)).read().replace('\\\n', ' ')
    out, group, loop = [], None if script.endswith('gpu_suite.sh') else 'session', None
    names = dict(re.findall(r'^(\w+)="([^"]*)"', text, re.M))
    for line in text.splitlines():
        line = re.sub(r'^(left \d+ && )?step \d+ ', '', line.strip())
        for k, v in names.items():
            line = line.replace(f'${k}', v)
        if m := re.match(r'if \[\[ \$what == (\w+)', line):
            group = m.group(1)
        if m := re.match(r'for (\w+) in (.*); do', line):
            loop = m.group(1), shlex.split(m.group(2))
        if line.startswith('$PY bench/'):
            cmd = re.split(r' (?:2>&1|>)', line)[0].removeprefix('$PY ')  # the command, not its redirections
            for value in loop[1] if loop and f'${loop[0]}' in cmd else [None]:
                out.append((group, shlex.split(cmd.replace(f'${loop[0]}', value) if value is not None else cmd)))
        if line == 'done':
            loop = None
    return out


def on_cpu(argv):
    """The suite's command with the CPU as its device: _graph samplers become their eager fixed-shape twins
    (the same code but the capture), no compile, no cuDNN, nothing written to BENCHMARKS.md."""
    swap = {'--device=cuda': '--device=cpu', '--compile=True': '--compile=False', '--write=True': '--write=False',
            '--stepper=cuda_graph': '--stepper=static', '--sdpa=cudnn': '--sdpa=default'}
    args = [swap.get(a, a) for a in argv[1:]]
    args = [re.sub(r'_graph\b', '_static', a) if a.startswith('--samplers=') else a for a in args]
    return [sys.executable, argv[0]] + args + TOY[argv[0]].split()


COMMANDS = suite_commands() + suite_commands('bench/gpu_session.sh')


def test_the_ceilings_count_what_they_time(monkeypatch):
    """bench/common.py's ceilings (what sample_roofline.py measures on the GPU before counting, and train_speed.py's
    MFU denominator): a matmul's 2 n^3 FLOPs and a copy's bytes read plus written, over the seconds per call.
    A clock that advances one second a reading makes every timed loop last one second, so the rates are exact;
    on the CPU at small sizes, the same code the GPU runs but its synchronisation."""
    from bench import common
    clock = iter(range(100))
    monkeypatch.setattr(common.time, 'perf_counter', lambda: float(next(clock)))
    assert common.measure_matmul_peak('cpu', size=64) == 2 * 64 ** 3 * 20  # 20 products in one second
    assert common.measure_copy_bandwidth('cpu', numel=1024) == 2 * 1024 * 2 * 10  # 10 copies of 2 KiB, read + written


def test_the_suite_is_read_whole():
    groups = {g for g, _ in COMMANDS}
    assert {'sample', 'graphs', 'spans', 'tune', 'train', 'optimizer', 'session'} <= groups
    assert sum(g == 'session' for g, _ in COMMANDS) == 8
    assert sum(g == 'spans' for g, _ in COMMANDS) == 3 and sum(g == 'tune' for g, _ in COMMANDS) == 2
    assert all(argv[0] in TOY for _, argv in COMMANDS)


@pytest.mark.slow
@pytest.mark.parametrize('group,argv', COMMANDS, ids=[f'{g}-{a[0][6:-3]}-{i}' for i, (g, a) in enumerate(COMMANDS)])
def test_suite_command_runs_on_cpu(group, argv, tmp_path):
    r = subprocess.run(on_cpu(argv), cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'PYTHONPATH': ROOT})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    if argv[0] != 'bench/profile_sampler.py':  # the others print a markdown table with a row per setting
        rows = [ln for ln in r.stdout.splitlines() if ln.startswith('| ') and not ln.startswith('| T ')]
        assert rows and all('nan' not in ln for ln in rows), r.stdout[-2000:]
    else:
        assert re.search(r'total [\d.]+ s over \d+ calls', r.stdout), r.stdout[-2000:]


@pytest.mark.slow
def test_one_failing_sampler_does_not_cost_the_others():
    """A sampler that raises (here: a stepper refusing its kv_bucket) is reported in one line under the
    table and the exit status is 1, but the other samplers are still measured and tabled."""
    r = subprocess.run([sys.executable, 'bench/sample_speed.py', '--samplers=ao_static,mdm_cache', '--kv_bucket=24',
                        *TOY['bench/sample_speed.py'].split()], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert re.search(r'^FAILED ao_static: ValueError: kv_bucket must be', r.stdout, re.M), r.stdout
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith('| ')]
    assert 'mdm_cache s' in rows[0] and 'ao_static' not in rows[0] and len(rows) == 1 + 2, r.stdout  # the head, T = 4 and 16


@pytest.mark.slow
def test_an_encoder_timed_per_pass_counts_the_passes_a_full_run_makes():
    """--encoder_passes (the session's encoder columns): the passes each T is multiplied by are those the
    encoder's own run makes there (counted on a 1-layer stand-in), with and without skipping empty steps."""
    args = [sys.executable, 'bench/sample_speed.py', '--samplers=mdm,mdm_cache', *TOY['bench/sample_speed.py'].split(),
            '--steps=4,16,64']
    full, per_pass = (subprocess.run(args + extra, cwd=ROOT, capture_output=True, text=True, timeout=300)
                      for extra in ([], ['--encoder_passes=8']))
    rows = [[ln.split(' | ')[3:5] for ln in r.stdout.splitlines() if re.match(r'\| \d+ \|', ln)] for r in (full, per_pass)]
    assert rows[0] == rows[1] and len(rows[0]) == 3, full.stdout[-1500:] + per_pass.stdout[-1500:]
    assert 'mdm s (per pass x passes)' in per_pass.stdout and 'per pass x passes' not in full.stdout


@pytest.mark.parametrize('argv, says', [
    (['bench/sample_speed.py', '--n_head=3'], "error: the model: n_embd must be a multiple of n_head (3), got 128"),
    (['bench/sample_speed.py', '--steps=16,x'], "error: --steps must be a comma-separated list of step counts >= 1, "
                                                "got '16,x'"),
    (['bench/sample_speed.py', '--samplers=spec', '--spec_k=1'], "error: --spec_k must be an int >= 2 or auto"),
    (['bench/train_speed.py', '--models=ao,foo'], "error: --models must be a comma-separated list of models among "
                                                  "ao, ao_table, gpt, mdm (NAME:rope on the Llama/Qwen block), got "
                                                  "'ao,foo'"),
    (['bench/train_speed.py', '--models=ao:rope', '--n_head=3', '--n_embd=96'], "error: --n_head must be even for "
                                                                                "a :rope model"),
    (['bench/train_speed.py', '--iters=0'], "error: --iters must be at least 1, got 0"),
    (['bench/eval_speed.py', '--device=cuda:99'], "error: --device cuda:99, but "),
    (['bench/profile_sampler.py', '--stepper=foo'], "error: --stepper must be one of dynamic, static, cuda_graph"),
    (['bench/sample_roofline.py', '--spec_alphas=0.5,1.5'], "error: --spec_alphas must be a comma-separated list of "
                                                            "acceptance probabilities in (0, 1), got '0.5,1.5'"),
    (['bench/sample_roofline.py', '--peak_flops=0'], "error: --peak_flops must be at least 1, got 0.0"),
    (['bench/sample_roofline.py', '--device=cuda:99'], "error: --device cuda:99, but "),
    (['bench/loss_memory.py', '--chunks=0,-4'], "error: --chunks must be a comma-separated list of loss_chunk settings "
                                                ">= 0 (0: off), got '0,-4'"),
    (['bench/memory_budget.py', '--source=gpt5'], "error: --source must be one of qwen3_0p6b, smollm2_135m, qwen3_8b, llama3_8b, got 'gpt5'"),
])
def test_bad_settings_are_one_line_before_anything_is_built(argv, says):
    """These were tracebacks (int('x'), a KeyError, GPTConfig's ValueError, a division by zero iters), or, for
    --spec_k=1, a timing of a setting the sampler does not take."""
    p = subprocess.run([sys.executable] + argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    err = p.stderr.strip().splitlines()
    assert p.returncode != 0 and len(err) == 1 and err[0].startswith(says), p.stderr


@pytest.mark.slow
def test_demo_spread_ends_its_demos_with_it(tmp_path):
    """SIGTERM to bench/demo_spread.py left each demo's bash and its train.py running (bash dies of a SIGTERM at
    once and orphans its child). Now each demo is a process group that ends with it; nothing is written."""
    keep, out = tmp_path / 'kept', tmp_path / 'spread.json'
    p = subprocess.Popen([sys.executable, 'bench/demo_spread.py', '--runs=1', '--parallel=1', f'--keep={keep}',
                          f'--out={out}'], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not (keep / 'this_CPU' / 'out' / 'log.jsonl').exists():  # its train.py has started (its first eval)
            assert p.poll() is None and time.time() < deadline, p.communicate()
            time.sleep(0.5)
        assert any('train.py' in open(f'/proc/{q}/cmdline', 'rb').read().decode(errors='replace')
                   for q in processes(str(keep)))
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=90)
        assert p.returncode == 143 and err.strip().splitlines()[-1].startswith('terminated: the demos were stopped'), err
        deadline = time.time() + 30  # a SIGTERMed train.py ends at its next safe point: on a loaded CPU, seconds
        while processes(str(keep)) and time.time() < deadline:
            time.sleep(0.2)
        assert processes(str(keep)) == [] and not out.exists()
    finally:
        for q in processes(str(keep)):
            os.kill(q, signal.SIGKILL)
        if p.poll() is None:
            p.kill()


@pytest.mark.slow
def test_loss_memory_measures_a_smaller_peak_with_the_same_loss():
    """bench/loss_memory.py at toy sizes: each setting in its own process, the same loss (the same rows' NLLs in
    another summation order: printed to 6 decimals), and the chunked step's peak below the unchunked one's (the
    logits are 4 MiB against a chunk's 0.5 MiB). The fast twin: tests/test_loss_chunk.py's saved-tensor check."""
    r = subprocess.run([sys.executable, 'bench/loss_memory.py', '--vocab_size=4096', '--n_embd=16', '--block_size=64',
                        '--batch_size=4', '--chunks=0,32'], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [ln.split('|')[1:-1] for ln in r.stdout.splitlines() if ln.startswith('| ') and 'loss_chunk' not in ln]
    assert [int(c[0]) for c in rows] == [0, 32] and rows[0][2] == rows[1][2], r.stdout
    assert int(rows[1][1]) < int(rows[0][1]), r.stdout
