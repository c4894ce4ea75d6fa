"""
How far `make demo`'s numbers move from one machine to another, measured: the whole demo (findings/demo.sh)
run several times, each with one thing changed that differs between machines or seeds, side by side.

    python bench/demo_spread.py                 # 4 runs, 2 at a time with one thread each
    python bench/demo_spread.py --runs=2        # the first 2 variants only

Why the numbers move at all: at fixed settings a run is a pure function of its seed (same machine, same
thread count: bit-identical). But float kernels differ with the CPU's vector width (AVX-512, AVX2, none),
so another machine rounds the first step differently, by about 1e-7. The any-order model then spends
~1000 steps on a plateau at the unigram loss, and where it leaves that plateau amplifies such a
difference into a few hundredths of a nat at the end. The variants: this machine's kernels; the
portable no-SIMD kernels (ATEN_CPU_CAPABILITY=default, what a machine with other vector units looks
like from here); and two other seeds (a larger change than rounding, so the range errs wide).
Writes --out (the record results/notes.md reads the spread from) and prints the table. The demo's summary prints
no range: the same kernel set rounds differently on another host, so a range from this one reads as a broken install
wherever a working one lands outside it; its check, far below the unigram, is the test of an install.
"""
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

from aogpt.paths import atomic_write  # noqa: E402
from aogpt.configurator import configure, print_config, stop_on_ctrl_c  # noqa: E402
from aogpt.errors import command  # noqa: E402
from aogpt.paths import check_writable  # noqa: E402
from aogpt.runtime import cpu_cores  # noqa: E402

runs = 4                               # how many of VARIANTS to run, in order
parallel = 2                           # demo runs at once (each then gets cpu_cores() // parallel threads)
out = 'results/demo_spread.json'       # the record of the spread (results/notes.md)
keep = ''                              # a folder to keep each run's out-demo in ('' = a temporary one)
print_config(configure(globals()))

VARIANTS = [  # (name, extra environment, extra config lines)
    ('this CPU', {}, ''),
    ('no SIMD kernels', {'ATEN_CPU_CAPABILITY': 'default'}, ''),
    ('seed 2', {}, 'seed = 2\n'),
    ('seed 3', {}, 'seed = 3\n'),
]


LIVE = set()  # the demos running, each a process group: none outlives this process


def stop_demos():
    """SIGTERM every running demo's whole group (train.py ends as at a Ctrl-C), SIGKILL after 30 s."""
    for p in list(LIVE):
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + 30
    for p in list(LIVE):
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def run_demo(variant, work):
    """findings/demo.sh into work/<name>; returns the demo's eval numbers for the PTB test rows."""
    name, env_extra, config_extra = variant
    folder = os.path.join(work, name.replace(' ', '_'))
    os.makedirs(folder, exist_ok=True)
    config = os.path.join(folder, 'config.py')
    with open(os.path.join(ROOT, 'config', 'train_demo.py')) as f, open(config, 'w') as g:
        g.write(f.read() + config_extra)
    threads = str(max(1, cpu_cores() // parallel))
    env = dict(os.environ, DEMO_OUT=os.path.join(folder, 'out'), DEMO_CONFIG=config, PYTHON=sys.executable,
               OMP_NUM_THREADS=threads, **env_extra)
    t0 = time.time()
    with open(os.path.join(folder, 'demo.log'), 'w') as log:
        # its own process group: bash dies of a SIGTERM at once, and would leave its train.py running
        p = subprocess.Popen(['bash', 'findings/demo.sh'], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        LIVE.add(p)
        try:
            p.wait()
        finally:
            LIVE.discard(p)
    if p.returncode != 0:
        raise SystemExit(f"error: the '{name}' demo failed (exit {p.returncode}); see {folder}/demo.log")
    ev = json.load(open(os.path.join(folder, 'out', 'eval_ppl.json')))['datasets']['ptb']
    print(f"  {name}: done in {time.time() - t0:.0f} s", flush=True)
    return dict(name=name, env=env_extra, config=config_extra.strip(), l2r=ev['l2r']['nll'],
                any_order=ev['any_order']['nll'], ensemble=ev['ensemble']['nll'], wall_s=round(time.time() - t0))


@command
def main():
    if not 1 <= runs <= len(VARIANTS):
        raise SystemExit(f"error: --runs must be 1 to {len(VARIANTS)}")
    check_writable(out, 'out', 'demo_spread.json', create=True)  # before an hour of demos, not after
    work = keep or tempfile.mkdtemp(prefix='demo_spread_')
    print(f"{runs} demo runs, {parallel} at a time, in {work}", flush=True)
    t0 = time.time()
    # the runs share data/ptb_char: prepare it once here, so parallel demos only find it done
    subprocess.run([sys.executable, 'data/ptb/prepare.py', '--char=True'], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    pool = ThreadPoolExecutor(parallel)
    try:
        results = list(pool.map(lambda v: run_demo(v, work), VARIANTS[:runs]))
    finally:  # a Ctrl-C, a SIGTERM, a failed demo: end the others first, or the pool would wait for them
        stop_demos()
        pool.shutdown(cancel_futures=True)
    rec = dict(date=datetime.date.today().isoformat(), torch=torch.__version__,
               cpu_capability=torch.backends.cpu.get_cpu_capability(),
               command='python bench/demo_spread.py' + ''.join(f' {a}' for a in sys.argv[1:]),
               wall_s=round(time.time() - t0), runs=results)
    atomic_write(out, lambda f: json.dump(rec, f, indent=1), 'w')
    print(f"\n{'run':<18} {'L2R':>7} {'any-order':>10} {'ens x8':>7}   (nats/char, PTB test, {rec['cpu_capability']})")
    for r in results:
        print(f"{r['name']:<18} {r['l2r']:7.3f} {r['any_order']:10.3f} {r['ensemble']:7.3f}")
    for k in ('l2r', 'any_order', 'ensemble'):
        v = [r[k] for r in results]
        print(f"{k}: {min(v):.3f} to {max(v):.3f} (spread {max(v) - min(v):.3f})")
    print(f"wrote {out}")


if __name__ == '__main__':
    stop_on_ctrl_c('the demos were stopped; nothing was written (a run kept with --keep resumes)')
    main()
