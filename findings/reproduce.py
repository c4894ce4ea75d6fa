"""
Reproduce the paper's seven qualitative findings at small scale, and judge each one from the data.

    python findings/reproduce.py                  # everything: 15-25 min on 2 CPU cores with 2 seeds -> results/
                                                  # (each more seed of --seeds: 2 more runs)
    python findings/reproduce.py --quick          # the pipeline end to end in about a minute; judges nothing
    python findings/reproduce.py --device=cuda    # the same runs on a GPU
    python findings/reproduce.py --replot         # only redraw results/*.png from results/results.json

Setting. Character-level Penn Treebank (data/ptb_char, 49 symbols, prepared on first use), context 32,
2 layers x 64 wide (~0.1M parameters), the same architecture for every decoder run. Why so small: an
any-order model first sits on a plateau at the unigram loss until it learns to match target positions
to context positions, and that plateau is counted in optimizer steps (about 1000 here; with context
128 and 4 x 128 it lasted beyond 800 steps). A CPU budget of minutes buys enough steps only for a
small model. The LR is held nearly constant after warmup (lr_decay_iters = 10 x max_iters), as in the
paper's order experiments: curves then compare speed of convergence, not the end of a cosine
schedule. Every training run is a plain `python train.py --key=value ...` (the exact commands go into
results/README.md). A finished run in runs_dir is reused and an interrupted one resumes, so re-running
continues where it stopped.

Runs, shared across findings (losses are nats per character on fixed val windows, EMA weights):
  ao        random orders + 10% L2R, AdaLN, EMA      findings 1, 3, 4, 5, 7
  ao_noL2R  random orders only                       3
  l2r       the identity order, same architecture    1, 2
  fixed     one fixed random permutation             2
  block     block-wise random (blocks of 4)          2
  sigma     sigma-GPT input conditioning + 10% L2R   5
  ao_tstd1  `ao`, target table init std 1 (not 0.02)  5 (a follow-up of ours, not a paper claim)
  ao_init   `ao_tstd1` + AdaLN Linear init std 0.2    5 (ours: the init of the whole target pathway)
  ao_seed2  `ao` with another seed: the run-to-run spread, the yardstick for findings 3, 5 and 7
  ao_seedS, ao_noL2R_seedS   `ao` and `ao_noL2R` on every other seed S of --seeds: finding 3 compares their
            means, and the spread of `ao`'s seeds is findings 3 and 5's yardstick
  mdm       the encoder MDM: same blocks, data, steps and tokens, the MDM ELBO     7
  judge     an L2R GPT, twice as deep, another seed: finding 7's judge (not a model it compares)
Finding 4 evaluates `ao` with eval_ppl's ensemble estimator; finding 6 times sample.py's samplers on
random models (timing needs no training); finding 7 samples `ao`, `ao_seed2` and `mdm` and scores the
samples with `judge`.
Findings 6, 7 and 8 (the samplers put to the test) live in findings/sampling.py; this file trains,
evaluates, judges findings 1-7 and writes the report.

Judging. "End" losses are the mean of the last 3 evals (less noisy than the last one). A difference
smaller than the run-to-run spread is reported as within noise, i.e. not reproduced: finding 3 compares the
means of `ao` and `ao_noL2R` over every seed of --seeds against the larger of their seed ranges, findings 5a
judge against the range of `ao`'s seeds, finding 7 against ao/ao_seed2's (two seeds: its samples cost more).
"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

# -----------------------------------------------------------------------------
quick = False            # tiny runs: the whole pipeline in a few minutes; nothing is judged
replot = False           # only redraw the plots from results_dir/results.json (nothing trained or evaluated)
device = 'cpu'           # cpu | cuda
results_dir = ''         # '' = results/ (--quick: out-reproduce-quick/results)
jobs = 0                 # training runs at once (0 = one per CPU core, or 1 on cuda)
runs_dir = ''            # training runs ('' = out-reproduce, or out-reproduce-quick)
max_iters = 6000         # per training run
batch_size = 32
block_size = 32
n_layer = 2
n_head = 4
n_embd = 64
target_dim = 32          # width of the AdaLN target-position table
learning_rate = 3e-3
ema_decay = 0.995
eval_interval = 250
eval_iters = 8           # val batches per eval (8 x 32 windows of 32 = 8k characters)
eval_orders = 2          # random orders per val window for the any-order loss
eval_chunks = 1024       # val windows for findings 4 and 5 (EMA vs raw, ensembles)
ens_draws = 2            # Monte Carlo draws per window for the ensemble estimator
sample_n = 128           # finding 6: tokens per sample
sample_batch = 8         # finding 6: samples per batch
sample_embd = 256        # finding 6: width of the random timing models (wide enough that compute, not
                         # per-call overhead, dominates on a CPU)
gen_samples = 128        # finding 7: samples per sampler, setting and step count
gen_batch = 64           # finding 7: samples per batch
seed = 1337              # the first seed: every run's (the other seeds' runs are named _seedS)
seeds = '1337,2,3,4'     # the seeds of the runs whose verdicts lean on a seed spread (SPREAD_RUNS); the first is
                         # --seed's, the second 2 (ao_seed2's); 4, since 2 seeds' spread was ~10x too narrow
# -----------------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)
from aogpt import plot  # noqa: E402
from aogpt.bins import load_bin  # noqa: E402
from aogpt.checkpoint import run_checkpoints  # noqa: E402
from aogpt.configurator import namespace, print_config, seed_list, stop_on_ctrl_c  # noqa: E402
from aogpt.errors import UserError, command, die, first_line  # noqa: E402
from aogpt.paths import atomic_folder, atomic_json, atomic_write, make_folder  # noqa: E402
from aogpt.preflight import model_reads  # noqa: E402
from aogpt.rundir import forget_run  # noqa: E402
from findings import report  # noqa: E402
from findings.judging import (  # noqa: E402  (judging's pure functions, R.end and the others as before)
    curve,
    end,
    judge_annealing,
    judge_better,
    judge_better_seeds,
    mean_spread,
    judge_ensemble,
    judge_order,
    judge_scaling,
    judge_slower,
    loglog_slope,
    tokens_to_reach,
    verdict,
)
from findings.sampling import (  # noqa: E402
    GEN_SETTINGS,
    SPEC_FIG,
    draw_speculative,
    gen_summary,
    generation_study,
    judge_speculative,
    speculative_study,
    speculative_table,
    time_samplers,
)

DATASET = 'ptb_char'
SEED2 = 2  # ao_seed2's seed (findings/orders.py's second seeds too); --seed is the first one
ENSEMBLE_M = (1, 2, 4, 8, 16)
RUNS = {  # name: (train.py overrides beyond the shared ones, what it is)
    'ao': ({}, 'AO-GPT: random orders + 10% L2R, AdaLN'),
    'ao_noL2R': ({'order': 'random'}, 'AO-GPT without the 10% L2R data'),
    'l2r': ({'order': 'l2r'}, 'the same architecture trained left to right'),
    'fixed': ({'order': 'fixed:0'}, 'one fixed random order'),
    'block': ({'order': 'fixedblocks:4:0'}, 'block-wise random order, blocks of 4'),
    'sigma': ({'cond': 'sigma'}, 'sigma-GPT input conditioning + 10% L2R'),
    'ao_tstd1': ({'target_std': 1.0}, 'AO-GPT with the AdaLN target table initialised at std 1, not 0.02'),
    'ao_init': ({'target_std': 1.0, 'adaln_std': 0.2},
                'AO-GPT with the AdaLN target pathway initialised larger: table std 1, AdaLN Linear std 0.2'),
    'ao_seed2': ({'seed': SEED2}, 'AO-GPT, another seed (run-to-run spread)'),
    'mdm': ({'causal': False, 'cond': 'none'}, 'the encoder MDM: the same blocks, trained on the MDM ELBO'),
    'judge': ({'cond': 'none', 'order': 'l2r', 'n_layer': 4, 'seed': 3},
              "finding 7's judge: an L2R GPT, twice as deep, another seed"),
}
SPREAD_RUNS = ('ao', 'ao_noL2R')  # trained on every seed of --seeds: finding 3 compares their means


def seeded(runs, bases, seeds):
    """runs and a copy of each run of `bases` for each of `seeds`: `{base}_seed{s}`, its overrides with seed s (a
    run runs already holds, ao_seed2, stays as it is: the same overrides, so the same command as before)."""
    out = dict(runs)
    for base in bases:
        for s in seeds:
            out.setdefault(f'{base}_seed{s}', ({**runs[base][0], 'seed': s}, f"{runs[base][1]}, seed {s}"))
    return out


def seeded_runs(c):
    """(every run's spec, the runs to train): RUNS but ao_seed2, then SPREAD_RUNS' runs on each other seed of
    c.seed_list (ao_seed2 is one of them; --quick trains the first seed only, so none)."""
    return (seeded(RUNS, SPREAD_RUNS, c.seed_list[1:]),
            [k for k in RUNS if k != 'ao_seed2'] + [f'{b}_seed{s}' for b in SPREAD_RUNS for s in c.seed_list[1:]])


def seed_names(names, base):
    """The runs of `base` among names: itself and its other seeds' `{base}_seedS`, in order of names."""
    return [k for k in names if k == base or (k.startswith(base + '_seed') and k[len(base) + 5:].isdigit())]


# ----------------------------------------------------------------------------- training runs

def train_args(c, name, runs=RUNS):
    """The train.py command line for one run of `runs` (a list, also written into the results)."""
    over, _ = runs[name]
    a = dict(out_dir=os.path.join(c.runs_dir, name), init_from='auto', dataset=DATASET,
             device=c.device, n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd,
             target_dim=c.target_dim, block_size=c.block_size, batch_size=c.batch_size,
             gradient_accumulation_steps=1, max_iters=c.max_iters, warmup_iters=max(1, c.max_iters // 20),
             lr_decay_iters=10 * c.max_iters, learning_rate=c.learning_rate,
             min_lr=c.learning_rate / 10, weight_decay=0.1, ema_decay=c.ema_decay,
             eval_interval=c.eval_interval, eval_iters=c.eval_iters, eval_orders=c.eval_orders,
             log_interval=max(1, c.eval_interval // 5), seed=c.seed)
    a.update(over)
    model = run_model(a)  # the shared keys its model never reads are not given: train.py refuses them
    return ['train.py'] + [f'--{k}={v}' for k, v in a.items() if model_reads(k, model)]


def run_model(keys):
    """The model a run's train.py keys ask for, as preflight.READ_BY's readers look at it (train.py's defaults
    elsewhere: an AO-GPT with learned positions and a GELU MLP; a fine-tune here names its cond)."""
    return dict(cond=keys.get('cond', 'adaln'), causal=keys.get('causal', True) not in (False, 'False'),
                pos=keys.get('pos', 'learned'), mlp=keys.get('mlp', 'gelu'))


def same_run(held, args):
    """Whether a run directory's command.json (held) is the run `args` asks for: the same command, or one that also
    gave keys its model never reads, as commands did before train.py refused them (the same run, bit for bit); its
    out_dir by the run's folder name alone (where the runs_dir lies is not the run), so that a runs_dir moved or named
    another way holds the same runs."""
    folder = lambda a: f"--out_dir={os.path.basename(os.path.normpath(a[10:]))}" if a.startswith('--out_dir=') \
        else a  # noqa: E731
    held, args = [folder(a) for a in held], [folder(a) for a in args]
    keys = dict(a[2:].split('=', 1) for a in held[1:] if a.startswith('--') and '=' in a)
    model = run_model(keys)
    return held == args or [a for a in held if not a.startswith('--') or '=' not in a or
                            model_reads(a[2:].split('=', 1)[0], model)] == args


def read_log(out_dir):
    path = os.path.join(out_dir, 'log.jsonl')
    return plot.read_log(path) if os.path.exists(path) else []


def train_runs(c, names, runs=RUNS):
    """Train the runs of `runs` (RUNS, or another finding's), reusing finished ones, `jobs` train.py processes
    at a time, each with its share of the CPU's cores (OMP_NUM_THREADS): these models are too small for two
    threads to help one process much, so two single-thread runs side by side finish in about 0.55x the time
    of one after the other (and at one thread or two a run computes the same numbers here). Each run's
    console output goes to its train.log; the progress bar follows the log.jsonl files, the machine
    interface."""
    from tqdm import tqdm
    todo = []
    for name in names:
        args = train_args(c, name, runs)
        out_dir = os.path.join(c.runs_dir, name)
        cmd_file = os.path.join(out_dir, 'command.json')
        if os.path.exists(cmd_file) and not same_run(json.load(open(cmd_file)), args):
            die(f"{out_dir} holds a run with other settings than these (see {cmd_file}): delete it, or pass "
                f"another --runs_dir")
        log = read_log(out_dir)
        if log and log[-1]['iter'] >= c.max_iters and os.path.exists(os.path.join(out_dir, 'ckpt.pt')):
            print(f"  {name}: done already ({out_dir}, {log[-1]['iter']} iterations), reusing it")
        else:
            if '--init_from=auto' not in args or not run_checkpoints(out_dir):
                # nothing to resume: start over (train.py's rundir.check_room refuses what another attempt left)
                forget_run(out_dir)
            os.makedirs(out_dir, exist_ok=True)
            atomic_json(cmd_file, args, indent=None)
            todo.append((name, args, out_dir))
    # the deepest runs first, so that no core idles at the end while one long run finishes alone
    todo.sort(key=lambda t: -runs[t[0]][0].get('n_layer', c.n_layer))
    from aogpt.runtime import cpu_cores
    cores = cpu_cores()
    jobs = c.jobs or (cores if c.device == 'cpu' else 1)
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, cores // jobs))) if c.device == 'cpu' else None
    n_runs = len(todo)
    bar = tqdm(total=n_runs * c.max_iters, desc='  training', unit='it', dynamic_ncols=True)
    live = {}  # name: (process, its train.log, start time)
    try:
        wait_for_runs(c, todo, live, jobs, env, bar, n_runs)
    finally:  # a Ctrl-C, a SIGTERM, a failed run: no train.py outlives this process (nor holds its out_dir's lock)
        stop_runs(live)
    bar.close()


def stop_runs(live):
    """End the training runs still going: SIGTERM (train.py ends as at a Ctrl-C, after a checkpoint write
    in progress), then SIGKILL for one that has not ended within 30 seconds. An ended run resumes when
    the same command is run again."""
    for p, f, _ in live.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for name, (p, f, _) in list(live.items()):
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        f.close()
        del live[name]


def wait_for_runs(c, todo, live, jobs, env, bar, n_runs):
    """Start runs while fewer than `jobs` are live, and follow them until all have ended."""
    while todo or live:
        while todo and len(live) < jobs:
            name, args, out_dir = todo.pop(0)
            f = open(os.path.join(out_dir, 'train.log'), 'a')
            live[name] = (subprocess.Popen([sys.executable, '-u'] + args, cwd=ROOT, stdout=f,
                                           stderr=subprocess.STDOUT, env=env), f, time.time())
        time.sleep(1.0)
        finished = n_runs - len(todo) - len(live)
        live_iters = sum((read_log(os.path.join(c.runs_dir, n)) or [{'iter': 0}])[-1]['iter'] for n in live)
        bar.update(finished * c.max_iters + live_iters - bar.n)
        bar.set_postfix_str(', '.join(live))
        for name, (p, f, t0) in list(live.items()):
            if p.poll() is None:
                continue
            f.close()
            del live[name]
            if p.returncode != 0:
                bar.close()
                log_path = os.path.join(c.runs_dir, name, 'train.log')
                die(f"training run {name} failed (exit {p.returncode}); see {log_path}:\n"
                    + ''.join(open(log_path).readlines()[-5:]))
            bar.write(f"  {name}: {time.time() - t0:.0f} s")


# ----------------------------------------------------------------------------- evaluations

def val_chunks(n_chunks, n):
    """The first n_chunks non-overlapping windows of n tokens of data/ptb_char/val.bin: (N, n) LongTensor."""
    import torch
    data = load_bin(os.path.join(ROOT, 'data', DATASET), 'val')  # in the dtype its meta.json records
    N = min(n_chunks, len(data) // n)
    return torch.from_numpy(data[:N * n].astype(np.int64)).view(N, n)


def eval_ema(c, name, chunks):
    """Finding 5b: the same checkpoint scored with its EMA and its raw weights (L2R and any-order)."""
    import torch

    from aogpt.checkpoint import load_model
    from aogpt.likelihood import nll_any_order, nll_l2r
    out = {}
    for use_ema in (True, False):
        model, _, _ = load_model(os.path.join(c.runs_dir, name), c.device, use_ema=use_ema)
        l2r = nll_l2r(model, chunks, batch_size=32)
        ao = nll_any_order(model, chunks, n_orders=c.eval_orders,
                           generator=torch.Generator().manual_seed(c.seed), batch_size=32)
        out['ema' if use_ema else 'raw'] = dict(l2r=l2r[0] / l2r[1], ao=ao[0] / ao[1])
    return out


def eval_ensemble(c, name, chunks):
    """Finding 4 on a trained run: NLL per token for each M, and the paired gain over M = 1."""
    import torch

    from aogpt.checkpoint import load_model
    from aogpt.likelihood import nll_ensemble
    model, _, _ = load_model(os.path.join(c.runs_dir, name), c.device)
    # nested sizes on the same draws, so the differences between M are paired
    est, _ = nll_ensemble(model, chunks, ENSEMBLE_M, 'fast', torch.Generator().manual_seed(c.seed), c.ens_draws, 64)
    est = est / chunks.size(1)                                           # (len(M), N) nats per token
    out = []
    for i, M in enumerate(ENSEMBLE_M):
        d = est[0] - est[i]                                              # per-chunk gain over one member
        out.append(dict(M=M, nll=est[i].mean().item(), gain=d.mean().item(),
                        gain_se=d.std().item() / math.sqrt(len(d))))
    return out


# ----------------------------------------------------------------------------- plots and the report

@command
def main(argv=None):
    c, cmd = read_config(argv)
    if c.replot:
        return redraw(c)
    t_all, timing = time.time(), {}
    prepare_data()
    runs, names = seeded_runs(c)
    t0, cpu0 = time.time(), report.children_cpu_minutes()
    print(f"training {len(names)} runs of {c.max_iters} iterations ({DATASET}, {c.device})")
    train_runs(c, names, runs)
    c.runs = runs  # the report's commands
    timing['training'] = time.time() - t0
    c.cpu_min = report.children_cpu_minutes() - cpu0
    logs = {k: read_log(os.path.join(c.runs_dir, k)) for k in names}
    t0 = time.time()
    chunks, ema, ens = evaluate_runs(c, names)
    timing['evaluation'] = time.time() - t0
    t0 = time.time()
    print(f"finding 6: sampling time vs steps T (n={c.sample_n}, B={c.sample_batch}, random models)")
    samp = time_samplers(c)
    timing['sampling'] = time.time() - t0
    t0 = time.time()
    print(f"finding 7: generative perplexity, {c.gen_samples} samples per sampler, setting and T, judged by `judge`")
    gen = generation_study(c, names)
    timing['generation'] = time.time() - t0
    t0 = time.time()
    print(f"finding 8: exact speculative sampling, {c.gen_samples} samples per sampler, judged by `judge`")
    spec = speculative_study(c, names)
    timing['speculative'] = time.time() - t0
    figs = draw_plots(c, logs, ens, samp, gen)
    findings = judge_findings(c, names, logs, ens, ema, samp, gen, figs)
    f8 = judge_speculative(c, spec, draw_speculative(c, spec))
    findings.append(f8 if not c.quick else (*f8[:3], ('not judged (--quick)', f8[3][1])))
    write_report(c, cmd, names, logs, chunks, ens, ema, samp, gen, spec, findings, timing, time.time() - t_all)


def read_config(argv):
    """The resolved config (c.key), and the command line that produced it."""
    argv = sys.argv[1:] if argv is None else argv
    c = namespace(globals(), argv)
    if c.jobs < 0:
        die(f"--jobs must be 0 (one per core) or more, not {c.jobs}")
    if not c.replot:
        c.seed_list = seeds_setting(c)
    settle(c, 'reproduce', dict(max_iters=30, eval_interval=10, eval_iters=2, eval_chunks=16, ens_draws=1,
                                sample_n=32, sample_batch=4, sample_embd=c.n_embd, gen_samples=8, gen_batch=8))
    if c.quick and 'seeds' not in c.given and not c.replot:  # quick: one seed, as ever, unless asked for more
        c.seed_list = c.seed_list[:1]
    return c, 'python findings/reproduce.py ' + ' '.join(argv) if argv else 'python findings/reproduce.py'


def seeds_setting(c):
    """--seeds as a list: the first is --seed's (a --seed alone replaces it, and both given must agree), the second
    SEED2 (ao_seed2, findings 5b and 7's second model, and orders.py's *_seed2 runs); one line for anything else."""
    seeds = seed_list('seeds', c.seeds)
    if 'seed' in c.given and 'seeds' not in c.given:
        seeds[0] = c.seed
    if 'seed' in c.given and c.seed != seeds[0]:
        die(f"--seed={c.seed} and --seeds={c.seeds} disagree: the first of --seeds is --seed; give one of them")
    if seeds[0] in seeds[1:]:  # ao and ao_seedS would be one run twice: a noise yardstick of zero
        nth = ['second', 'third', 'fourth', 'fifth'][seeds.index(seeds[0], 1) - 1] if len(seeds) < 6 else 'another'
        die(f"--seed={c.seed} is the {nth} seed's (the *_seed{seeds[0]} runs train with it to measure the "
            f"run-to-run spread): pick another --seed")
    if len(seeds) > 1 and seeds[1] != SEED2:
        die(f"--seeds={c.seeds}: the second seed must be {SEED2}, ao_seed2's (findings 5b and 7 compare it): "
            f"--seeds={seeds[0]},{SEED2}{''.join(f',{s}' for s in seeds[1:] if s != SEED2)}")
    c.seed = seeds[0]
    return seeds


def settle(c, name, quick, runs_dir=None):
    """What a findings script does with its resolved config c before it starts: with --quick, small everything
    (quick: {key: value}, the same code path), but a setting given on purpose is kept, and said; runs_dir and
    results_dir default to out-NAME (or runs_dir: another script's; out-NAME-quick and its results/ with --quick)
    and results/, relative to the repository (no machine's path in a record), and a path given means what it says
    where the user stands; print the config; work from the repository root."""
    if c.quick:
        for k, v in quick.items():
            if k not in c.given:
                setattr(c, k, v)
                c.config[k] = v
        kept = [f"--{k}={getattr(c, k)}" for k in quick if k in c.given]
        if kept:
            print(f"--quick: keeping {', '.join(kept)} as given (quick would use "
                  f"{', '.join(f'{k}={quick[k]}' for k in quick if k in c.given)})")
    for k in ('runs_dir', 'results_dir'):
        if getattr(c, k):
            setattr(c, k, os.path.abspath(getattr(c, k)))
    c.runs_dir = c.config['runs_dir'] = c.runs_dir or (f'out-{name}-quick' if c.quick else runs_dir or f'out-{name}')
    c.results_dir = c.config['results_dir'] = c.results_dir or (
        os.path.join(f'out-{name}-quick', 'results') if c.quick else 'results')
    print_config(c.config)
    os.chdir(ROOT)
    if not c.replot:  # --replot reads a record; it makes no folder
        if report.foreign_readme(c.results_dir):  # --results_dir=. from the repository: its README.md would go
            die(f"--results_dir {c.results_dir} holds a README.md that is not a findings report, which the report "
                f"would replace or append to: pick another --results_dir")
        make_folder(c.results_dir, 'results_dir')
        make_folder(c.runs_dir, 'runs_dir')


def prepare_data():
    if not os.path.exists(os.path.join('data', DATASET, 'val.bin')):
        print("preparing character-level PTB (data/ptb_char)...")
        r = subprocess.run([sys.executable, 'data/ptb/prepare.py', '--char=True'], cwd=ROOT)
        if r.returncode:
            die("data/ptb/prepare.py --char=True failed (see above)")


def evaluate_runs(c, names):
    """Findings 5b (EMA vs raw weights) and 4 (ensembles) on the trained `ao` run(s)."""
    chunks = val_chunks(c.eval_chunks, c.block_size)
    print(f"finding 5b: EMA vs raw weights of `ao` on {len(chunks)} val windows")
    ema = {k: eval_ema(c, k, chunks) for k in (['ao', 'ao_seed2'] if 'ao_seed2' in names else ['ao'])}
    print(f"finding 4: context-order ensembles M = {ENSEMBLE_M} on {len(chunks)} val windows")
    ens = eval_ensemble(c, 'ao', chunks)
    for r in ens:
        print(f"  M={r['M']:2d}: any-order NLL {r['nll']:.4f} (PPL {math.exp(r['nll']):.3f}); "
              f"gain over M=1 {r['gain']:.4f} ± {r['gain_se']:.4f}")
    return chunks, ema, ens


FIGS = {1: 'f1_ao_vs_l2r.png', 2: 'f2_orders.png', 3: 'f3_l2r_mix.png', 4: 'f4_ensemble.png',
        5: 'f5_adaln_sigma.png', 6: 'f6_sampling_time.png', 7: 'f7_gen_ppl.png', '7b': 'f7b_gen_ppl_annealed.png',
        8: SPEC_FIG}


def redraw(c):
    """The plots again from results.json, as the run that wrote it would draw them now: a change to a
    plot needs no rerun of the findings."""
    path = os.path.join(c.results_dir, 'results.json')
    if not os.path.exists(path):
        die(f"no {path}: run `python findings/reproduce.py` (or --quick) first")
    again = "run `python findings/reproduce.py` (or --quick) again to rewrite it"
    try:
        with open(path, encoding='utf-8') as f:
            d = json.load(f)
    except (OSError, ValueError) as e:  # truncated, empty, random bytes (UnicodeDecodeError is a ValueError)
        die(f"{path} is not readable JSON ({type(e).__name__}: {first_line(e, 120)}): {again}")
    want = dict(config=dict, logs=dict, ensemble=list, sampling=list, generation=list)
    wrong = [k for k, t in want.items() if not isinstance(d, dict) or not isinstance(d.get(k), t)]
    if wrong:
        die(f"{path} is not a reproduce.py record: " + (f"it holds a {type(d).__name__}, not an object" if not
            isinstance(d, dict) else f"{', '.join(wrong)} missing or of the wrong type") + f"; {again}")
    bad = report.nonfinite(d)
    if bad:
        die(f"{path} holds a non-finite number at {bad}, which no plot can show; {again}")
    # Every plot is drawn into a scratch folder that replaces the results folder whole (paths.atomic_folder) once all
    # were drawn, the files that are no plots (the record, the report) carried over: never a mix of old and new.
    results_dir, figs = c.results_dir, {}

    def fill(tmp):
        c.results_dir = tmp
        for k in ('sample_batch', 'sample_n', 'device', 'block_size'):  # what the plots' titles say of that run
            setattr(c, k, d['config'][k])
        figs.update(draw_plots(c, d['logs'], d['ensemble'], d['sampling'], d['generation']))
        if 'speculative' in d:  # finding 8 (records written before it existed have none)
            figs[8] = draw_speculative(c, d['speculative'])

    def carry(old, tmp):
        for f in set(os.listdir(old)) - set(os.listdir(tmp)):
            src = os.path.join(old, f)
            (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, os.path.join(tmp, f))
    try:
        atomic_folder(results_dir, fill, carry)
    except UserError as e:  # a plot that could not be written (a full disk): not the record's fault
        die(f"{e.msg}; the files in {results_dir} are as they were")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:  # a field inside them
        die(f"{path} lacks or mangles what a plot needs ({type(e).__name__}: {first_line(e, 120)}); {again}")
    except OSError as e:
        die(f"cannot put the plots into {results_dir} ({e.strerror or e}); its files are as they were")
    finally:
        c.results_dir = results_dir
    print(f"redrew {len(figs)} plots in {c.results_dir} from {path}")


def draw_plots(c, logs, ens, samp, gen):
    res, tok = c.results_dir, lambda k, key: curve(logs[k], key)
    path = lambda i: os.path.join(res, FIGS[i])  # noqa: E731
    plot.curves(path(1), 'Finding 1: AO-GPT converges more slowly than L2R', [
        ('L2R run, L2R loss', *tok('l2r', 'val_l2r'), '-o'),
        ('AO run, any-order loss', *tok('ao', 'val_ao'), '-s'),
        ('AO run, L2R loss', *tok('ao', 'val_l2r'), '--')])
    plot.curves(path(2), 'Finding 2: fixed orders (loss in the trained order)', [
        ('left to right', *tok('l2r', 'val_l2r'), '-o'),
        ('block-wise random (4)', *tok('block', 'val_order'), '-^'),
        ('fixed random', *tok('fixed', 'val_order'), '-s')])
    plot.curves(path(3), 'Finding 3: 10% L2R data', [
        ('10% L2R: L2R loss', *tok('ao', 'val_l2r'), '-o'),
        ('0% L2R: L2R loss', *tok('ao_noL2R', 'val_l2r'), '--o'),
        ('10% L2R: any-order loss', *tok('ao', 'val_ao'), '-s'),
        ('0% L2R: any-order loss', *tok('ao_noL2R', 'val_ao'), '--s')])
    plot.xy(path(4), 'Finding 4: context-order ensemble', list(ENSEMBLE_M),
            [('ensemble of M orders', [math.exp(r['nll']) for r in ens], '-o')],
            'M (context orderings)', 'any-order PPL per char (<=)')
    plot.curves(path(5), 'Finding 5: AdaLN vs sigma-GPT input conditioning', [
        ('AdaLN: any-order loss', *tok('ao', 'val_ao'), '-s'),
        ('sigma-GPT: any-order loss', *tok('sigma', 'val_ao'), '--s'),
        ('AdaLN: L2R loss', *tok('ao', 'val_l2r'), '-o'),
        ('sigma-GPT: L2R loss', *tok('sigma', 'val_l2r'), '--o'),
        ('AdaLN, table std 1: any-order', *tok('ao_tstd1', 'val_ao'), ':s'),
        ('AdaLN, table 1 + Linear 0.2: any-order', *tok('ao_init', 'val_ao'), '-.s'),
        ('AdaLN, table 1 + Linear 0.2: L2R', *tok('ao_init', 'val_l2r'), '-.o')])
    Ts = [r['T'] for r in samp]
    plot.xy(path(6), f"Finding 6: sampling {c.sample_batch} x {c.sample_n} tokens, {c.device}", Ts,
            [('AO-GPT, KV-cached', [r['dec_s'] for r in samp], '-o'),
             ('encoder MDM', [r['enc_s'] for r in samp], '-s')], 'steps T', 'wall time (s)', logy=True)
    styles = {'ao': '-o', 'ao_seed2': ':o', 'mdm': '-s', 'ao, semiar:8': '--^', 'ao, confidence': '-.d'}
    for i, setting in ((7, GEN_SETTINGS[0]), ('7b', GEN_SETTINGS[-1])):
        cells = {label: sorted((r['T'], r['token_passes'], r['per_sequence']) for r in gen if r['sampler'] == label
                               and (r['top_p'], r['temperature']) == setting) for label in styles}
        # the same points twice: against the steps T, and against what they cost (the Lemma-1 samplers do
        # under 2n token-passes for every T, so there they bunch up; the lines follow T either way)
        by_T = [(label, [T for T, _, _ in pts], [v for _, _, v in pts], styles[label])
                for label, pts in cells.items() if pts]
        by_cost = [(label, [p for _, p, _ in pts], [v for _, _, v in pts], styles[label])
                   for label, pts in cells.items() if pts]
        plot.lines(path(i), f"Finding 7: gen PPL (judge: L2R GPT), top-p {setting[0]}, temperature {setting[1]}",
                   [('against the steps', by_T, 'steps T', True),
                    ('against the cost (in order of T)', by_cost, 'token-passes per sample', True)],
                   'gen PPL per char', logy=True)
    return FIGS


def judge_findings(c, names, logs, ens, ema, samp, gen, figs):
    """[(id, claim, figure, (verdict, evidence))], each judged from the data."""
    tok = lambda k, key: curve(logs[k], key)  # noqa: E731
    L = lambda k, key: end(curve(logs[k], key)[1])  # noqa: E731
    noise, gen_noise = None, None
    seeds = {b: seed_names(names, b) for b in SPREAD_RUNS}  # ao, ao_seed2, ...; ao_noL2R, ao_noL2R_seed2, ...
    per_seed = lambda b, key: [L(k, key) for k in seeds[b]]  # noqa: E731
    if 'ao_seed2' in names:  # the range of ao's seeds (ao and ao_seed2's difference with two)
        noise = max(max(per_seed('ao', k)) - min(per_seed('ao', k)) for k in ('val_l2r', 'val_ao'))
        g = gen_summary(gen)
        gen_noise = {s: abs(math.log(g[('ao', s)] / g[('ao_seed2', s)])) for s in GEN_SETTINGS}
    findings = [
        ('1', 'AO-GPT converges more slowly than L2R GPT on the same architecture', figs[1],
         judge_slower(tok('l2r', 'val_l2r'), tok('ao', 'val_ao'))),
        ('2', 'A fixed L2R order converges faster than a fixed random order; block-wise random lies between',
         figs[2], judge_order(tok('l2r', 'val_l2r')[1], tok('block', 'val_order')[1], tok('fixed', 'val_order')[1])),
        ('3', 'Adding 10% L2R data improves both the L2R loss and the any-order loss', figs[3],
         judge_better_seeds([('L2R loss', per_seed('ao', 'val_l2r'), per_seed('ao_noL2R', 'val_l2r')),
                             ('any-order loss', per_seed('ao', 'val_ao'), per_seed('ao_noL2R', 'val_ao'))])),
        ('4', 'Context-order ensembling lowers the any-order perplexity as M grows (1, 2, 4, 8, 16)', figs[4],
         judge_ensemble(list(ENSEMBLE_M), [math.exp(r['nll']) for r in ens], [r['gain'] for r in ens],
                        [r['gain_se'] for r in ens])),
        ('5a', "AdaLN beats sigma-GPT's input conditioning", figs[5],
         judge_better([('any-order loss', L('ao', 'val_ao'), L('sigma', 'val_ao')),
                       ('L2R loss', L('ao', 'val_l2r'), L('sigma', 'val_l2r'))], noise)),
        ('5a+', "(ours) the same with the AdaLN target table initialised at std 1 instead of the paper's 0.02",
         figs[5], judge_better([('any-order loss', L('ao_tstd1', 'val_ao'), L('sigma', 'val_ao')),
                                ('L2R loss', L('ao_tstd1', 'val_l2r'), L('sigma', 'val_l2r'))], noise)),
        ('5a++', "(ours) the same with the whole target pathway initialised larger: table std 1 and AdaLN "
         "Linear std 0.2", figs[5], judge_better([('any-order loss', L('ao_init', 'val_ao'), L('sigma', 'val_ao')),
                                                  ('L2R loss', L('ao_init', 'val_l2r'), L('sigma', 'val_l2r'))],
                                                 noise)),
        ('5b', 'EMA helps (EMA vs raw weights of the same run)', None,
         judge_better([(f"{k} {dict(ao='any-order', l2r='L2R')[m]}", ema[k]['ema'][m], ema[k]['raw'][m])
                       for k in ema for m in ('ao', 'l2r')], None)),
        ('6', "Decoder sampling time is flat in T while the encoder's grows linearly", figs[6],
         judge_scaling([r['T'] for r in samp], [r['dec_s'] for r in samp], [r['enc_s'] for r in samp])),
        ('7', "Without annealing the decoder MDM's generative perplexity is higher than the encoder MDM's; with "
         "top-p 0.95 and temperature 0.7 they are comparable", figs[7],
         judge_annealing(gen_summary(gen), gen_noise)),
    ]
    if c.quick:
        findings = [(i, claim, fig, ('not judged (--quick)', ev)) for i, claim, fig, (_, ev) in findings]
    return findings


def write_report(c, cmd, names, logs, chunks, ens, ema, samp, gen, spec, findings, timing, total):
    res = c.results_dir
    L = lambda k, key: end(curve(logs[k], key)[1])  # noqa: E731
    changes, before = report.verdicts_against(os.path.join(res, 'results.json'), lambda r: {
        f['id']: f['verdict'] for f in r['findings']}, {i: v for i, _, _, (v, _) in findings})
    md = [f"{report.TITLE}{' (QUICK: smoke test, nothing judged)' if c.quick else ''}", '',
          f"Written by `{cmd}` on {time.strftime('%Y-%m-%d')}, device {c.device}, in {total / 60:.1f} min "
          f"(" + ', '.join(f"{k} {v / 60:.1f}" for k, v in timing.items()) + "); "
          f"{report.trained_cost(getattr(c, 'cpu_min', 0))}. Seeds {', '.join(map(str, c.seed_list))} for "
          f"{' and '.join(f'`{b}`' for b in SPREAD_RUNS)} "
          f"(their other seeds' runs are `_seedS`), seed {c.seed} for the others. Setting: character-level PTB, "
          f"context {c.block_size}, {c.n_layer} layers x {c.n_embd}, {c.max_iters} iterations of {c.batch_size} x "
          f"{c.block_size} characters, LR {c.learning_rate} nearly constant after warmup, EMA "
          f"{c.ema_decay}. Losses are nats per character on {c.eval_iters * c.batch_size} fixed val "
          f"windows (EMA weights); \"end\" = mean of the last 3 evals.", '',
          "Earlier runs, trials and other hosts: the lab notebook, [notes.md](notes.md) (written by hand).", '',
          changes, '',
          '| # | claim | verdict | evidence |', '|---|---|---|---|']
    for i, claim, fig, (v, ev) in findings:
        figlink = f" ([plot]({fig}))" if fig else ''
        md.append(f"| {i} | {claim}{figlink} | **{v}** | {ev} |")
    md += ['', '## Runs', '', '| run | what | end L2R loss | end any-order loss | end loss in its order | '
           'end ELBO | command |', '|---|---|---|---|---|---|---|']
    for k in names:
        f = lambda key: (f"{L(k, key):.3f}" if curve(logs[k], key)[1] else '')  # noqa: E731
        md.append(f"| {k} | {c.runs[k][1]} | {f('val_l2r')} | {f('val_ao')} | {f('val_order')} | {f('val_elbo')} | "
                  f"`python {' '.join(train_args(c, k, c.runs))}` |")
    md += ['', "Finding 3's runs over their seeds (end losses, mean ± half the range):", '',
           '| run | seeds | end L2R loss | end any-order loss |', '|---|---|---|---|']
    for b in SPREAD_RUNS:
        ks = seed_names(names, b)
        md.append(f"| {b} | {len(ks)} | " + ' | '.join('{:.3f} ± {:.3f}'.format(*mean_spread([L(k, key) for k in ks]))
                                                     for key in ('val_l2r', 'val_ao')) + ' |')
    md += ['', f"Finding 4 (`ao`, EMA, {len(chunks)} val windows of {c.block_size}, {c.ens_draws} "
           f"draws each, eval_ppl's fast estimator with nested members; gain = paired drop vs M = 1):", '',
           '| M | any-order NLL | PPL per char | gain (nats) |', '|---|---|---|---|']
    md += [f"| {r['M']} | {r['nll']:.4f} | {math.exp(r['nll']):.4f} | {r['gain']:.4f} ± {r['gain_se']:.4f} |"
           for r in ens]
    md += ['', f"Finding 5b (the same {len(chunks)} val windows, {c.eval_orders} orders each):", '',
           '| run | weights | L2R NLL | any-order NLL |', '|---|---|---|---|']
    md += [f"| {k} | {w} | {ema[k][w]['l2r']:.4f} | {ema[k][w]['ao']:.4f} |" for k in ema for w in ('ema', 'raw')]
    md += ['', f"Finding 6 (random models, {c.n_layer} x {c.sample_embd}, n = {c.sample_n}, batch "
           f"{c.sample_batch}, {c.device}; best of 3 runs (decoder), one run (encoder); encoder without the "
           f"caching trick):", '', '| T | AO-GPT cached (s) | encoder MDM (s) | token-passes AO | token-passes MDM |',
           '|---|---|---|---|---|']
    md += [f"| {r['T']} | {r['dec_s']:.3f} | {r['enc_s']:.3f} | {r['dec_passes']} | {r['enc_passes']} |"
           for r in samp]
    steps = sorted({r['T'] for r in gen})
    md += ['', f"Finding 7 ({c.gen_samples} samples of {c.block_size} characters per cell, judged by the "
           f"`judge` run (an L2R GPT, {RUNS['judge'][0]['n_layer']} layers, not a compared model); gen PPL per "
           f"character: the per-sequence mean (the paper's code, SEDD) / the token-weighted one after cutting "
           f"at the first newline (MDLM, DUO); H = unigram entropy of a sample, nats; passes = token-passes "
           f"per sample; the encoder uses the caching trick):", '',
           '| sampler | top-p / T | ' + ' | '.join(f"T={T}: PPL seq / tok, H, passes" for T in steps) + ' |',
           '|---|---|' + '---|' * len(steps)]
    for label in dict.fromkeys(r['sampler'] for r in gen):
        for setting in GEN_SETTINGS:
            cells = {r['T']: r for r in gen if r['sampler'] == label and (r['top_p'], r['temperature']) == setting}
            md.append(f"| {label} | {setting[0]} / {setting[1]} | " + ' | '.join(
                f"{cells[T]['per_sequence']:.2f} / {cells[T]['token']:.2f}, {cells[T]['unigram_entropy']:.2f}, "
                f"{cells[T]['token_passes']:.0f}" for T in steps) + ' |')
    md += ['', ' '.join(f"![f{i}]({f})" for i, f in FIGS.items())] + speculative_table(c, spec) + ['']
    atomic_write(os.path.join(res, 'README.md'), lambda f: f.write('\n'.join(md)), 'w')
    for n, name in report.SECTIONS.items():  # the findings that other commands write stay in the report
        if os.path.exists(os.path.join(res, name)):
            with open(os.path.join(res, name), encoding='utf-8') as f:
                report.merge_section(os.path.join(res, 'README.md'), n, f.read())
    atomic_json(os.path.join(res, 'results.json'),
                dict(config=c.config, command=cmd, logs=logs, ensemble=ens, ema=ema, sampling=samp, generation=gen,
                     timing=timing, findings=[dict(id=i, claim=cl, verdict=v, evidence=ev)
                                              for i, cl, _, (v, ev) in findings], speculative=spec,
                     verdicts_before=before))
    print()
    for i, claim, _, (v, ev) in findings:
        print(f"[{i}] {claim}\n     {v}: {ev}")
    if c.quick:
        print("\nQUICK MODE: tiny runs check that the pipeline works end to end; nothing above is judged.")
    print(f"\nwrote {res}/README.md, {res}/results.json and {len(FIGS)} plots in {total / 60:.1f} min")


if __name__ == '__main__':
    stop_on_ctrl_c("the finished runs are kept, and an interrupted one resumes: run the same command again")
    main()
