"""
Finding 11 (ours): what adapting a trained left-to-right GPT into an AO-GPT buys, at the findings' CPU scale:
reproduce.py's setting (character-level PTB, context 32, 2 layers x 64) and its training commands.

    python findings/adapt.py              # about 30-40 CPU-core-minutes (2 jobs) -> results/f11_*
    python findings/adapt.py --quick      # the pipeline end to end in tiny runs; judges nothing
    python findings/adapt.py --replot     # only redraw results/f11_adapt.png from results/f11_adapt.json

An AO-GPT is a GPT whose target conditioning is switched on: train.py --init_from=<GPT> --cond=adaln copies the
GPT and starts AdaLN at zero, so the adapted model is the GPT at step 0 (model.adapt), then trains on
reproduce.py's `ao` orders (uniform, 10% L2R). Runs, per seed in `seeds`:
  gpt_s<seed>           a GPT (cond='none', L2R), `budget` steps, its checkpoints kept at every split
  full_s<seed>          the GPT at `budget` steps (a sunk cost) adapted for `sunk` steps, AdamW
  full_muon_s<seed>     the same with Muon (finding 9's best settings)
  split<S>_s<seed>      the GPT at S steps adapted for budget - S steps: equal total steps, for each S in `splits`
  scratch: finding 9's AO-GPT runs at their best learning rates, AdamW and Muon (`budget` steps; reused from
  results/f9_optimizers.json when its commands are these, else trained here)
Every stage uses finding 9's best AdamW learning rate (learning_rate) and Muon's (muon_lr); an eval every
eval_interval steps, on the EMA weights.

Claims. (1) From the GPT trained for the whole budget, the adapted model reaches the scratch AO-GPT's end
any-order loss (mean of its last 3 evals) in at most `ratio` x the scratch run's steps (`budget`), every seed.
(2) At equal total steps, the best split is at least as good as scratch on the any-order loss (every seed within
the scratch runs' seed spread, or better) and better on the exact L2R loss (every seed by more than that spread).
Muon: the same steps-to-target for the Muon adaptation against Muon's own scratch run. Spread = half the range
over the seeds. Runs are reused and resumed as reproduce.py's are (runs_dir); an interrupted adaptation run starts
over from its GPT checkpoint.
"""

import json
import math
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)
from aogpt import plot  # noqa: E402
from aogpt.configurator import namespace, seed_list, split_list, stop_on_ctrl_c  # noqa: E402
from aogpt.errors import command, die, first_line  # noqa: E402
from aogpt.paths import atomic_json, atomic_write  # noqa: E402
from findings import optimizers as O  # noqa: E402
from findings import reproduce as R  # noqa: E402
from findings.report import merge_section, nonfinite  # noqa: E402

# -----------------------------------------------------------------------------
quick = False                  # tiny runs: the pipeline end to end; nothing is judged
replot = False                 # only redraw the plot from results_dir/f11_adapt.json
device = 'cpu'
jobs = 2                       # training runs at once (reproduce.py's train_runs)
runs_dir = ''                  # '' = out-adapt (--quick: out-adapt-quick)
results_dir = ''               # '' = results (--quick: out-adapt-quick/results)
budget = 6000                  # total steps: the scratch AO-GPT's (finding 9's length) = L2R steps + adaptation steps
splits = '1500,3000,4500'      # the GPT's steps before adaptation in the equal-total runs
sunk = 2000                    # adaptation steps from the GPT trained for the whole budget (claim: <= ratio x budget)
ratio = 0.3                    # claim (1)'s bound on the steps, as a fraction of the scratch run's
eval_interval = 100            # fine enough to interpolate the step a loss is reached at (finding 9's)
learning_rate = 6e-3           # AdamW's peak, every stage (finding 9's best for the AO-GPT and the L2R model)
muon_lr = 0.01                 # Muon's (finding 9's best; its AdaLN Linears in Muon, as finding 9 chose)
seeds = '1337,2'
# -----------------------------------------------------------------------------
RECORD, FIG, SECTION = 'f11_adapt.json', 'f11_adapt.png', 'f11_adapt.md'
F9_RECORD = 'f9_optimizers.json'


def gpt_run(c, seed):
    over = dict(cond='none', order='l2r', learning_rate=c.learning_rate, min_lr=c.learning_rate / 10,
                keep_ckpt_every=math.gcd(*c.split_list, c.budget), seed=seed)
    return f'gpt_s{seed}', (over, f"GPT (cond='none', L2R), seed {seed}")


def adapt_run(c, name, source, seed, opt='adamw'):
    """An adaptation of the GPT checkpoint `source` (AdaLN, reproduce.py's `ao` orders)."""
    over = dict(init_from=source, cond='adaln', learning_rate=c.learning_rate, min_lr=c.learning_rate / 10, seed=seed)
    if opt == 'muon':
        over.update(optimizer='muon', muon_lr=c.muon_lr, muon_adaln=True)
    return name, (over, f"{os.path.basename(os.path.dirname(source))} at {kept_iter(source)} steps adapted into "
                        f"an AO-GPT, {'Muon' if opt == 'muon' else 'AdamW'}, seed {seed}")


def kept_iter(path):
    return int(os.path.basename(path)[len('ckpt_'):-len('.pt')])


def kept(c, seed, steps):
    """The GPT's checkpoint at `steps` (train.py's keep_ckpt_every copy)."""
    return os.path.join(c.runs_dir, 'main', f'gpt_s{seed}', f'ckpt_{steps:07d}.pt')


def scratch_runs(c):
    """{name: (overrides, what)} of finding 9's AO-GPT runs at their best settings, AdamW and Muon, per seed."""
    out = {}
    for s in c.seed_list:
        out[f'ao_adamw_s{s}'] = O.run('ao', 'adamw', c.learning_rate, s)[1]
        out[f'ao_muon_s{s}'] = O.run('ao', 'muon', c.muon_lr, s, c.learning_rate, True)[1]
    return out


def reused_scratch(c, runs):
    """The scratch runs finding 9 trained with exactly these commands (but their out_dir), as {name: (log,
    command)}; the rest are trained here."""
    path = os.path.join(c.results_dir, F9_RECORD)
    if c.quick or not os.path.exists(path):
        return {}
    try:
        with open(path, encoding='utf-8') as f:
            f9 = json.load(f)
        logs, cmds = f9['logs'], f9['commands']
    except (ValueError, KeyError, TypeError) as e:
        print(f"note: {path} is not a readable finding-9 record ({first_line(e, 80)}); training the scratch runs")
        return {}
    mine = O.commands(c, c.budget, 'scratch', runs)
    drop = lambda cmd: [a for a in cmd.split() if not a.startswith('--out_dir=')]  # noqa: E731
    out = {}
    for k in runs:
        log = logs.get(k) or []
        if k in cmds and drop(cmds[k]) == drop(mine[k]) and log and log[-1]['iter'] >= c.budget:
            out[k] = (log, cmds[k])
    return out


# ----------------------------------------------------------------------------- judging (pure functions)

def steps_to(log, key, target):
    return O.steps_to_reach(*O.steps_of(log, key), target)


def end_of(log, key):
    return R.end(O.steps_of(log, key)[1])


def judge(d, seeds, budget, ratio):
    """Claim (1) per seed (AdamW and Muon adaptations against their scratch runs), claim (2) per split and seed."""
    logs = d['logs']
    sunk = []
    for s in seeds:
        row = dict(seed=s)
        for opt, run in (('adamw', f'full_s{s}'), ('muon', f'full_muon_s{s}')):
            target = end_of(logs[f'ao_{opt}_s{s}'], 'val_ao')
            steps = steps_to(logs[run], 'val_ao', target)
            row[opt] = dict(target=target, steps=steps, ratio=None if steps is None else steps / budget,
                            at0_ao=O.steps_of(logs[run], 'val_ao')[1][0], end_ao=end_of(logs[run], 'val_ao'),
                            at0_l2r=O.steps_of(logs[run], 'val_l2r')[1][0], end_l2r=end_of(logs[run], 'val_l2r'),
                            scratch_l2r=end_of(logs[f'ao_{opt}_s{s}'], 'val_l2r'))
        row['muon_to_adamw_target'] = steps_to(logs[f'full_muon_s{s}'], 'val_ao', row['adamw']['target'])
        sunk.append(row)
    noise = {key: O.mean_spread([end_of(logs[f'ao_adamw_s{s}'], key) for s in seeds])[1] for key in
             ('val_ao', 'val_l2r')}
    splits = {}
    for S in d['splits']:
        rows = []
        for s in seeds:
            run, scratch = logs[f'split{S}_s{s}'], logs[f'ao_adamw_s{s}']
            rows.append({key: dict(two_stage=end_of(run, key), scratch=end_of(scratch, key),
                                   diff=end_of(run, key) - end_of(scratch, key)) for key in ('val_ao', 'val_l2r')})
        mean_ao = O.mean_spread([r['val_ao']['diff'] for r in rows])[0]
        splits[S] = dict(rows=rows, mean_ao_diff=mean_ao,
                         as_good_ao=all(r['val_ao']['diff'] <= noise['val_ao'] for r in rows),
                         better_l2r=all(r['val_l2r']['diff'] < -noise['val_l2r'] for r in rows))
    best = min(splits, key=lambda S: splits[S]['mean_ao_diff'])
    c1 = all(r['adamw']['ratio'] is not None and r['adamw']['ratio'] <= ratio for r in sunk)
    checks = [c1, splits[best]['as_good_ao'], splits[best]['better_l2r']]
    verdict = 'met' if all(checks) else 'partly met' if any(checks) else 'not met'
    return dict(sunk=sunk, noise=noise, splits=splits, best=best, checks=checks, verdict=verdict)


def ratio_text(rows, opt, budget):
    ratios = [r[opt]['ratio'] for r in rows]
    if any(x is None for x in ratios):
        return (f"not reached in {sum(x is None for x in ratios)} of {len(rows)} seeds within the adaptation's "
                f"steps; reached: " + (', '.join(f"{x:.2f}x" for x in ratios if x is not None) or 'none'))
    m, s = O.mean_spread(ratios)
    return f"{m:.2f}x ± {s:.2f} of {budget} steps (seeds: {', '.join(f'{x:.2f}' for x in ratios)})"


# ----------------------------------------------------------------------------- plot, record and report

def draw(c, d):
    seeds, logs, budget = d['seeds'], d['logs'], d['config']['budget']
    dash = lambda i: '-' if i == 0 else '--'  # noqa: E731  (seeds: solid, dashed)
    panels = []
    for key, name in (('val_ao', 'any-order'), ('val_l2r', 'L2R')):
        series = []
        for i, s in enumerate(seeds):
            for run, label, col in ((f'ao_adamw_s{s}', 'scratch AO-GPT, AdamW', 'C0'),
                                    (f'ao_muon_s{s}', 'scratch AO-GPT, Muon', 'C1'),
                                    (f'full_s{s}', f'GPT at {budget} steps, adapted, AdamW', 'C2'),
                                    (f'full_muon_s{s}', f'GPT at {budget} steps, adapted, Muon', 'C3')):
                st, v = O.steps_of(logs[run], key)
                series.append((f"{label}, seed {s}", st, v, col + dash(i)))
        panels.append((f"{name} val loss: steps of this run (adaptation: after the GPT)", series, 'optimizer steps',
                       False))
    for key, name in (('val_ao', 'any-order'), ('val_l2r', 'L2R')):
        series = []
        for i, s in enumerate(seeds):
            st, v = O.steps_of(logs[f'ao_adamw_s{s}'], key)
            series.append((f"scratch AO-GPT, AdamW, seed {s}", st, v, 'C0' + dash(i)))
            if key == 'val_l2r':
                st, v = O.steps_of(logs[f'gpt_s{s}'], key)
                series.append((f"GPT (L2R), seed {s}", st, v, 'k' + dash(i)))
            for j, S in enumerate(d['splits']):
                st, v = O.steps_of(logs[f'split{S}_s{s}'], key)
                series.append((f"GPT {S} + adaptation {budget - S}, seed {s}", [S + x for x in st], v,
                               f'C{4 + j}' + dash(i)))
        panels.append((f"{name} val loss at equal total steps", series, 'total optimizer steps (L2R + adaptation)',
                       False))
    plot.lines(os.path.join(c.results_dir, FIG), "Finding 11: a trained GPT adapted into an AO-GPT, against "
               f"AO-GPTs from scratch (evals every {d['config']['eval_interval']} steps)", panels,
               'val loss (nats/char)', sharey=False)


def report(c, d, cmd):
    res, seeds, budget = c.results_dir, d['seeds'], d['config']['budget']
    j = judge(d, seeds, budget, d['config']['ratio'])
    v = 'not judged (--quick)' if c.quick else j['verdict']
    best = j['splits'][j['best']]
    pair = lambda rows, key, part: ', '.join(f"{r[key][part]:.3f}" for r in rows)  # noqa: E731
    claim = (f"(ours) From the trained L2R GPT, an AO-GPT reaches the from-scratch AO-GPT's end any-order loss in "
             f"<= {d['config']['ratio']}x its steps; at equal total steps the two-stage model is at least as good on "
             f"any-order loss and better on L2R loss")
    evidence = (f"from the GPT at {budget} steps: {ratio_text(j['sunk'], 'adamw', budget)} with AdamW; Muon adapting "
                f"against Muon from scratch: {ratio_text(j['sunk'], 'muon', budget)}; equal total {budget} steps, "
                f"best split {j['best']} L2R + {budget - j['best']} adaptation: any-order "
                f"{pair(best['rows'], 'val_ao', 'two_stage')} vs scratch {pair(best['rows'], 'val_ao', 'scratch')}, "
                f"L2R {pair(best['rows'], 'val_l2r', 'two_stage')} vs {pair(best['rows'], 'val_l2r', 'scratch')} "
                f"(seeds {', '.join(map(str, seeds))}; scratch seed spread {j['noise']['val_ao']:.3f} any-order, "
                f"{j['noise']['val_l2r']:.3f} L2R)")
    row = f"| 11 | {claim} ([plot]({FIG})) | **{v}** | {evidence} |"
    md = [f"## Finding 11: adapting a trained GPT into an AO-GPT{' (QUICK: nothing judged)' if c.quick else ''}", '',
          f"Written by `{cmd}` on {time.strftime('%Y-%m-%d')}, device {c.device}, "
          + (f"{d['cpu_min']:.1f} CPU-core-minutes for the runs it trained (runs reused cost nothing here)"
             if d['cpu_min'] >= 0.05 else "every run reused from an earlier invocation")
          + f". Setting: reproduce.py's (character-level PTB, context 32, 2 layers x 64, 32 x 32 characters a step, "
          f"EMA weights), eval every {d['config']['eval_interval']} steps, AdamW at {d['config']['learning_rate']:g} "
          f"and Muon at {d['config']['muon_lr']:g} (finding 9's best). The GPT (cond='none') trains left to right "
          f"for {budget} steps; train.py --init_from=<its checkpoint> --cond=adaln adapts it (exactly the GPT at "
          f"step 0) and trains on `ao`'s orders (uniform, 10% L2R), a fresh warmup and optimizer. Scratch: finding "
          f"9's AO-GPT runs ({budget} steps" + (", reused from its record" if d['reused'] else "") + "). The "
          f"equal-total runs adapt the GPT's checkpoint at S steps for {budget} - S steps (its schedule is finding "
          f"9's near-constant one, so the GPT at S steps is a GPT trained for S). End: mean of the last 3 evals; "
          f"steps to a loss interpolated on the eval curve; ± half the seed range.", '',
          '| # | claim | verdict | evidence |', '|---|---|---|---|', row, '',
          f"From the GPT trained {budget} steps (a sunk cost), adaptation steps to the scratch run's end any-order "
          f"loss, against the scratch run's {budget}:", '',
          '| seed | optimizer | scratch end any-order | adapted: step 0 / end any-order | steps to it (x budget) | '
          'adapted: step 0 / end L2R | scratch end L2R |', '|---|---|---|---|---|---|---|']
    for r in j['sunk']:
        for opt in ('adamw', 'muon'):
            x = r[opt]
            steps = f"{x['steps']:.0f} ({x['ratio']:.2f}x)" if x['steps'] is not None else \
                f"not within {d['config']['sunk']}"
            md.append(f"| {r['seed']} | {opt} | {x['target']:.3f} | {x['at0_ao']:.3f} / {x['end_ao']:.3f} | {steps} | "
                      f"{x['at0_l2r']:.3f} / {x['end_l2r']:.3f} | {x['scratch_l2r']:.3f} |")
    md += ['', f"Equal total steps ({budget}): end losses of the two-stage runs against the scratch AO-GPT (AdamW), "
           "per seed:", '', '| L2R steps + adaptation | seed | any-order (two-stage / scratch) | L2R (two-stage / '
           'scratch) |', '|---|---|---|---|']
    for S, sp in j['splits'].items():
        for s, r in zip(seeds, sp['rows']):
            md.append(f"| {S} + {budget - S} | {s} | {r['val_ao']['two_stage']:.3f} / {r['val_ao']['scratch']:.3f} | "
                      f"{r['val_l2r']['two_stage']:.3f} / {r['val_l2r']['scratch']:.3f} |")
    md += ['', 'The runs:', '', '| run | what | command |', '|---|---|---|']
    md += [f"| {k} | {d['what'][k]} | `{d['commands'][k]}` |" for k in d['logs']]
    md += ['', f"![f11]({FIG})", '']
    d['judged'] = dict(j, row=row, splits={str(k): v for k, v in j['splits'].items()})
    where = nonfinite(d)
    if where:
        die(f"a loss in the record is not finite ({where}): a run diverged; see its train.log in {c.runs_dir}")
    atomic_write(os.path.join(res, SECTION), lambda f: f.write('\n'.join(md)), 'w')
    atomic_json(os.path.join(res, RECORD), d)
    draw(c, d)
    merged = merge_section(os.path.join(res, 'README.md'), 11, '\n'.join(md))
    print(row)
    print(f"\nwrote {res}/{SECTION}, {res}/{RECORD}, {res}/{FIG}" + (" and its section in README.md" if merged else ""))


def study(c):
    """The GPTs, their adaptations and the scratch runs: the record."""
    seeds, budget = c.seed_list, c.budget
    logs, what, cmds = {}, {}, {}

    def stage(iters, sub, runs):
        logs.update(O.train(c, iters, sub, runs))
        cmds.update(O.commands(c, iters, sub, runs))
        what.update({k: w for k, (_, w) in runs.items()})

    scratch = scratch_runs(c)
    reused = reused_scratch(c, scratch)
    for k, (log, command_line) in reused.items():
        logs[k], cmds[k], what[k] = log, command_line, scratch[k][1] + ' (finding 9\'s run)'
    gpts = dict(gpt_run(c, s) for s in seeds)
    todo = dict(gpts, **{k: v for k, v in scratch.items() if k not in reused})
    print(f"the GPTs{' and the scratch AO-GPTs' if len(todo) > len(gpts) else ''}: {len(todo)} runs of {budget} steps")
    stage(budget, 'main', todo)
    full = {}
    for s in seeds:
        full.update([adapt_run(c, f'full_s{s}', kept(c, s, budget), s),
                     adapt_run(c, f'full_muon_s{s}', kept(c, s, budget), s, 'muon')])
    print(f"adapting the GPTs at {budget} steps: {len(full)} runs of {c.sunk} steps")
    stage(c.sunk, 'sunk', full)
    for S in c.split_list:
        runs = dict(adapt_run(c, f'split{S}_s{s}', kept(c, s, S), s) for s in seeds)
        print(f"adapting the GPTs at {S} steps: {len(runs)} runs of {budget - S} steps")
        stage(budget - S, f'split{S}', runs)
    order = list(gpts) + list(scratch) + list(full) + [f'split{S}_s{s}' for S in c.split_list for s in seeds]
    return dict(config=c.config, seeds=seeds, splits=c.split_list, reused=sorted(reused),
                logs={k: logs[k] for k in order}, what={k: what[k] for k in order},
                commands={k: cmds[k] for k in order})


@command
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    c = namespace(globals(), argv)
    R.settle(c, 'adapt', dict(budget=40, splits='10,20,30', sunk=20, eval_interval=10))
    cmd = 'python findings/adapt.py' + ''.join(f' {a}' for a in argv)
    if c.replot:
        path = os.path.join(c.results_dir, RECORD)
        if not os.path.exists(path):
            die(f"no {path}: run `python findings/adapt.py` (or --quick) first")
        try:
            with open(path, encoding='utf-8') as f:
                draw(c, json.load(f))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:  # not JSON, or not this record
            die(f"{path} is not a readable finding-11 record ({type(e).__name__}: {first_line(e, 120)}): run "
                f"`python findings/adapt.py` again to rewrite it")
        return print(f"redrew {FIG} in {c.results_dir} from {path}")
    for key in ('budget', 'sunk', 'eval_interval'):  # else the runs start, and fail one by one
        if getattr(c, key) < 1:
            die(f"--{key} must be at least 1, got {getattr(c, key)}")
    if c.budget % c.eval_interval:
        die(f"--budget ({c.budget}) must be a multiple of --eval_interval ({c.eval_interval}): the GPT's checkpoint "
            f"at the end is written at an eval")
    c.split_list = split_list('splits', c.splits, int, lambda S: 0 < S < c.budget and S % c.eval_interval == 0,
                              f'steps in (0, budget={c.budget}), multiples of eval_interval={c.eval_interval} '
                              f'(the GPT keeps its checkpoints at evals)')
    if len(set(c.split_list)) < len(c.split_list):
        die(f"--splits {c.splits} names a split twice")
    if not 0 < c.ratio <= 1:
        die(f"--ratio must be in (0, 1], got {c.ratio}")
    for key in ('learning_rate', 'muon_lr'):
        if not 0 < getattr(c, key) < math.inf:
            die(f"--{key} must be a learning rate > 0, got {getattr(c, key)}")
    c.seed_list = seed_list('seeds', c.seeds)
    # reproduce.py's settings for everything this study does not change
    c.rc = namespace(vars(R), [])
    if c.quick:
        c.rc.eval_iters = 2
    c.rc.device, c.rc.jobs, c.rc.eval_interval = c.device, c.jobs, c.eval_interval
    R.prepare_data()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    d = study(c)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    d['cpu_min'] = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) / 60
    report(c, d, cmd)


if __name__ == '__main__':
    stop_on_ctrl_c("the finished runs are kept, and an interrupted one resumes: run the same command again")
    main()
