"""
Finding 9: time to a target loss with Muon beside AdamW (train.py's optimizer=muon), at the findings' CPU
scale: reproduce.py's setting (character-level PTB, context 32, 2 layers x 64) and its training commands.

    python findings/optimizers.py              # ~60 CPU-core-minutes on 2 seeds, each more seed 5 runs -> results/f9_*
    python findings/optimizers.py --quick      # the pipeline end to end in tiny runs; judges nothing
    python findings/optimizers.py --replot     # only redraw results/f9_*.png from results/f9_optimizers.json
    python findings/optimizers.py --extend     # keep the record's runs; add what it lacks (step times, float32 runs)
    python findings/optimizers.py --extend --seeds=1337,2,3,4   # the record's sweep and runs, and the compared
                                               # runs for the seeds it lacks (--seeds starts with the record's)

Models: reproduce.py's `ao` (AO-GPT, scored by its any-order and by its L2R val loss) and `l2r` (the same
architecture trained left to right, finding 1's GPT, scored by its L2R loss), each trained with AdamW and
with Muon, by reproduce.py's train_args with an eval every eval_interval steps.

1. A sweep on one seed, sweep_iters steps (shorter than the runs it chooses for: the budget): AdamW's
   learning_rate over lrs_adamw; then Muon's muon_lr over lrs_muon, its AdamW group (embeddings, head, norms,
   biases) at AdamW's best learning_rate; then, at Muon's best muon_lr, the AdaLN Linears in Muon
   (muon_adaln=True) instead of in AdamW. Best: the lowest end loss (mean of the last 3 evals) in the model's
   own objective (AO: any-order; L2R: L2R). The placement that wins on `ao` is the one both models use.
2. Each model and optimizer at its best, max_iters steps, every seed in `seeds`.
3. Muon's Newton-Schulz in float32 (train.py's muon_dtype=float32) on AO-GPT, at Muon's best, every seed: the
   same runs as 2's Muon runs but for the iteration's dtype, judged the same way.
4. The wall-clock of a step of each (bench/train_speed.py --optimizer at this shape, one thread as each run
   here has, the optimizers' steps interleaved in one process): the step ratio times the step-time ratio is
   Muon's wall-clock to AdamW's end loss over AdamW's own.

Verdict, per model and loss, seed by seed (Muon against the AdamW run of the same seed): the steps Muon needs
to reach AdamW's final loss (the AdamW run's end loss) over the steps AdamW needs, both by linear
interpolation on the eval curve; the losses at equal steps; and finding 1's gap (AO's end any-order loss
minus the L2R run's end L2R loss) under each optimizer. Spread = half the range over the seeds. Runs are
reused and resumed as reproduce.py's are (runs_dir).
"""

import copy
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)
from aogpt import plot  # noqa: E402
from aogpt.configurator import namespace, seed_list, split_list, stop_on_ctrl_c  # noqa: E402
from aogpt.errors import UserError, command, die, first_line  # noqa: E402
from findings import reproduce as R  # noqa: E402
from findings.judging import mean_spread  # noqa: E402  (O.mean_spread too: adapt.py's)
from findings.report import children_cpu_minutes, publish, redraw, trained_cost, verdicts_against  # noqa: E402

# -----------------------------------------------------------------------------
quick = False                  # tiny runs: the pipeline end to end; nothing is judged
replot = False                 # only redraw the plots from results_dir/f9_optimizers.json
device = 'cpu'
jobs = 2                       # training runs at once (reproduce.py's train_runs)
runs_dir = ''                  # '' = out-optimizers (--quick: out-optimizers-quick)
results_dir = ''               # '' = results (--quick: out-optimizers-quick/results)
max_iters = 6000               # the compared runs (reproduce.py's length)
sweep_iters = 3000             # the learning-rate sweep's runs
eval_interval = 100            # fine enough to interpolate the step a loss is reached at
lrs_adamw = '1.5e-3,3e-3,6e-3,1.2e-2'  # AdamW's learning_rate (reproduce.py's runs use 3e-3; 6e-3 won the first three)
lrs_muon = '0.01,0.02,0.04'    # Muon's muon_lr (the anchors' tuned values: 0.02-0.035)
seeds = '1337,2,3,4'           # the first one also runs the sweep; 4, since a 2-seed spread was ~10x too narrow
time_iters = 200               # timed steps of each optimizer for the step times (interleaved)
extend = False                 # reuse results_dir's record: train and measure only what it lacks
# -----------------------------------------------------------------------------
MODELS = {'ao': ('val_ao', 'val_l2r'), 'l2r': ('val_l2r',)}  # the losses judged; the first one picks the best
NAMES = {'ao': 'AO-GPT', 'l2r': 'L2R GPT', 'val_ao': 'any-order', 'val_l2r': 'L2R'}
RECORD, FIG_CURVES, FIG_SWEEP, SECTION = 'f9_optimizers.json', 'f9_optimizers.png', 'f9_sweep.png', 'f9_optimizers.md'
VOCAB = 64  # ptb_char's 49 symbols, padded as train.py pads them (a multiple of 64)


def run(model, opt, lr, seed, adamw_lr=None, adaln=False):
    """(name, (train.py overrides beyond reproduce.py's shared ones, what it is)) of one run. opt: adamw, muon,
    or muon32 (Muon with its Newton-Schulz iteration in float32)."""
    over = dict(R.RUNS[model][0])  # l2r: order='l2r'
    if opt == 'adamw':
        over.update(learning_rate=lr, min_lr=lr / 10)
        name, what = f"{model}_adamw_lr{lr:g}_s{seed}", f"AdamW lr {lr:g}"
    else:
        over.update(learning_rate=adamw_lr, min_lr=adamw_lr / 10, optimizer='muon', muon_lr=lr, muon_adaln=adaln)
        if opt == 'muon32':
            over['muon_dtype'] = 'float32'
        name = f"{model}_{opt}_lr{lr:g}{'_adaln' if adaln else ''}_s{seed}"
        what = (f"Muon lr {lr:g}{' (AdaLN in Muon)' if adaln else ''}{', float32 Newton-Schulz' if opt == 'muon32' else ''}"
                f", AdamW lr {adamw_lr:g}")
    over['seed'] = seed
    return name, (over, f"{NAMES[model]}, {what}, seed {seed}")


def stage_config(c, iters, sub):
    """reproduce.py's settings for a stage of this study: its runs' length, and their folder runs_dir/sub."""
    rc = copy.copy(c.rc)
    rc.max_iters, rc.runs_dir = iters, os.path.join(c.runs_dir, sub)
    return rc


def train(c, iters, sub, runs):
    """Train runs {name: (overrides, what)} for `iters` steps in runs_dir/sub; returns {name: log}."""
    rc = stage_config(c, iters, sub)
    R.train_runs(rc, list(runs), runs)
    return {k: R.read_log(os.path.join(rc.runs_dir, k)) for k in runs}


def commands(c, iters, sub, runs):
    rc = stage_config(c, iters, sub)
    return {k: 'python ' + ' '.join(R.train_args(rc, k, runs)) for k in runs}


# ----------------------------------------------------------------------------- judging (pure functions)

def steps_of(log, key):
    """(steps, values) of one logged loss."""
    pts = [(r['iter'], r[key]) for r in log if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def steps_to_reach(steps, values, target):
    """The step at which a curve first reaches target, linearly interpolated between evals (None if never)."""
    for i, (s, v) in enumerate(zip(steps, values)):
        if v <= target:
            if i == 0:
                return float(s)
            s0, v0 = steps[i - 1], values[i - 1]
            return s0 + (v0 - target) / (v0 - v) * (s - s0)
    return None


def step_ratio(adamw, muon):
    """Seed-paired curves (steps, values): Muon's steps to AdamW's end loss over AdamW's own (ratio; None where
    Muon never gets there), and the same to Muon's end loss (reverse: the ratio the other way round)."""
    target = R.end(adamw[1])
    mine, theirs = steps_to_reach(*muon, target), steps_to_reach(*adamw, target)
    own = steps_to_reach(*muon, R.end(muon[1])), steps_to_reach(*adamw, R.end(muon[1]))
    return dict(target=target, muon_steps=mine, adamw_steps=theirs, ratio=mine / theirs if mine is not None else None,
                reverse=own[0] / own[1] if own[1] else None)


def judge(logs, seeds, max_iters):
    """Per model and loss: the per-seed step ratios and end losses, the losses at equal steps, finding 1's gap."""
    out = {}
    at = [max_iters // 4, max_iters // 2, max_iters]
    for model, keys in MODELS.items():
        for key in keys:
            rows = []
            for s in seeds:
                a, m = steps_of(logs[f'{model}_adamw_s{s}'], key), steps_of(logs[f'{model}_muon_s{s}'], key)
                r = step_ratio(a, m)
                r.update(seed=s, adamw_end=R.end(a[1]), muon_end=R.end(m[1]),
                         at={t: (dict(zip(*a))[t], dict(zip(*m))[t]) for t in at if t in a[0] and t in m[0]})
                rows.append(r)
            out[f'{model} {key}'] = rows
    gap = {opt: [R.end(steps_of(logs[f'ao_{opt}_s{s}'], 'val_ao')[1]) -
                 R.end(steps_of(logs[f'l2r_{opt}_s{s}'], 'val_l2r')[1]) for s in seeds] for opt in ('adamw', 'muon')}
    return out, gap


def verdict_line(rows, target=0.7):
    """'met' / 'not met' for the target ratio (every seed within it), and the ratio with its spread."""
    ratios = [r['ratio'] for r in rows]
    if any(x is None for x in ratios):
        rev = [r['reverse'] for r in rows if r['reverse'] is not None]
        return 'not met', (f"Muon does not reach AdamW's final loss in {sum(x is None for x in ratios)} of "
                           f"{len(rows)} seeds" + (f"; to Muon's own end loss Muon needs {min(rev):.2f}-"
                                                   f"{max(rev):.2f}x AdamW's steps" if rev else ''))
    m, s = mean_spread(ratios)
    per = ', '.join(f"{x:.2f}" for x in ratios)
    return ('met' if max(ratios) <= target else 'not met'), f"{m:.2f}x ± {s:.2f} the steps (seeds: {per})"


# ----------------------------------------------------------------------------- plots, record and report

def draw(c, d):
    res = c.results_dir
    seeds = d['seeds']
    color = {'adamw': 'C0', 'muon': 'C1', 'ao': 'C0', 'l2r': 'C2'}  # matplotlib's cycle: blue, orange, green
    panels = []
    for model, keys in MODELS.items():
        for key in keys:
            series = []
            for opt in ('adamw', 'muon'):
                for i, s in enumerate(seeds):
                    st, v = steps_of(d['logs'][f'{model}_{opt}_s{s}'], key)
                    style = color[opt] + ('-' if i == 0 else '--')  # seeds: solid, dashed
                    series.append((f"{'AdamW' if opt == 'adamw' else 'Muon'}, seed {s}", st[1:], v[1:], style))
            panels.append((f"{NAMES[model]}: {NAMES[key]} val loss", series, 'optimizer steps', False))
    plot.lines(os.path.join(res, FIG_CURVES), "Finding 9: Muon beside AdamW, each at its best learning rate "
               f"(evals from step {d['config']['eval_interval']})", panels, 'val loss (nats/char)',
               sharey=False)
    panels = []
    for opt in ('adamw', 'muon'):
        series = []
        for model in MODELS:
            key = MODELS[model][0]
            pts = sorted((r['lr'], r['end'][key]) for r in d['sweep'] if r['model'] == model and r['opt'] == opt
                         and not r['adaln'])
            series.append((f"{NAMES[model]}, {NAMES[key]} loss", [p[0] for p in pts], [p[1] for p in pts],
                           color[model] + '-o'))
        if opt == 'muon':
            for model in MODELS:
                key = MODELS[model][0]
                pts = [(r['lr'], r['end'][key]) for r in d['sweep'] if r['model'] == model and r['adaln']]
                series.append((f"{NAMES[model]}, AdaLN in Muon", [p[0] for p in pts], [p[1] for p in pts],
                               color[model] + 'x'))
        panels.append(('AdamW: learning_rate' if opt == 'adamw' else 'Muon: muon_lr (AdamW group at its best)',
                       series, 'peak learning rate', True))
    plot.lines(os.path.join(res, FIG_SWEEP), f"Finding 9's sweep: end loss after {d['config']['sweep_iters']} "
               f"steps, seed {seeds[0]}", panels, 'end val loss (nats/char)', sharey=True)


def report(c, d, cmd):
    """The record (json), the plots and a section for results/README.md with its findings-table row."""
    res = c.results_dir
    seeds = d['seeds']
    judged, gap = judge(d['logs'], seeds, d['config']['max_iters'])
    v, text = verdict_line(judged['ao val_ao'])
    claim = ("(ours) Muon reaches AdamW's final AO-GPT any-order loss in <= 0.7x the steps, each optimizer at its "
             "best learning rate")
    narrow, gm = gap_verdict(gap)
    gap_text = (f"finding 1's gap (AO any-order - L2R GPT, end losses) {gm['adamw'][0]:.3f} ± {gm['adamw'][1]:.3f} "
                f"with AdamW, {gm['muon'][0]:.3f} ± {gm['muon'][1]:.3f} with Muon: "
                + ('narrower' if narrow == 'narrower' else 'not narrower beyond the seed spread'))
    if c.quick:
        v = 'not judged (--quick)'
    changes, d['verdicts_before'] = verdicts_against(os.path.join(res, RECORD), lambda r: {
        '9': r['verdicts']['ao_any_order'][0], "9 (finding 1's gap under Muon)": gap_verdict(r['verdicts']['gap'])[0]},
        {'9': v, "9 (finding 1's gap under Muon)": narrow})
    others = '; '.join(f"{NAMES[k.split()[0]]} {NAMES[k.split()[1]]}: {verdict_line(rows)[1]}"
                       for k, rows in judged.items() if k != 'ao val_ao')
    ms = {r['optimizer']: r['ms'] for r in d['step_times']['rows']}
    cost = {o: ms[o] / ms['adamw'] for o in ms}  # a step's wall-clock against AdamW's
    f32 = float32_rows(d)
    wall = lambda rows, o: mean_spread([r['ratio'] * cost[o] for r in rows])  # noqa: E731  (None: judged 'not met')
    wall_text = (f"wall-clock to AdamW's any-order end loss on this CPU: Muon {cost['muon']:.2f}x AdamW's step time"
                 + (f", so {wall(judged['ao val_ao'], 'muon')[0]:.2f}x the time"
                    if all(r['ratio'] for r in judged['ao val_ao']) else '')
                 + f"; with a float32 Newton-Schulz {cost['muon_fp32']:.2f}x the step time"
                 + (f", {mean_spread([r['ratio'] for r in f32])[0]:.2f}x the steps, "
                    f"{wall(f32, 'muon_fp32')[0]:.2f}x the time" if all(r['ratio'] for r in f32) else ''))
    row = (f"| 9 | {claim} ([plot]({FIG_CURVES})) | **{v}** | any-order: {text}; {others}; {gap_text}; "
           f"{wall_text}; best: {d['best_text']} |")
    md = [f"## Finding 9: Muon beside AdamW, steps to a target loss{' (QUICK: nothing judged)' if c.quick else ''}",
          '', f"Written by `{cmd}` on {time.strftime('%Y-%m-%d')}, device {c.device}, "
          + trained_cost(d['cpu_min'], 'its training runs and the step timing',
                         'an earlier invocation (its cost: notes.md)')
          + ". Setting: reproduce.py's "
          f"(character-level PTB, context 32, 2 layers x 64, 32 x 32 characters a step, EMA weights), eval every "
          f"{d['config']['eval_interval']} steps; the sweep {d['config']['sweep_iters']} steps on seed {seeds[0]}, "
          f"the compared runs {d['config']['max_iters']} steps on seeds {', '.join(map(str, seeds))}. Ratio: the "
          f"steps Muon needs to reach the final (end: mean of the last 3 evals) loss of AdamW's run of the same "
          f"seed, over AdamW's own steps to it (both interpolated on the eval curve); ± half the seed range.", '',
          changes, '', '| # | claim | verdict | evidence |', '|---|---|---|---|', row, '']
    md += tables(d, judged, cost, f32)
    md += ['', 'The compared runs:', '', '| run | what | command |', '|---|---|---|']
    md += [f"| {k} | {d['what'][k]} | `{d['commands'][k]}` |" for k in d['logs']]
    md += ['', f"![f9]({FIG_CURVES}) ![f9 sweep]({FIG_SWEEP})", '']
    d['verdicts'] = dict(ao_any_order=[v, text], judged=judged, gap=gap, gap_narrower=narrow, row=row)
    print(row)
    publish(c, 9, md, d, RECORD, SECTION, (FIG_CURVES, FIG_SWEEP), draw)


def tables(d, judged, cost, f32):
    """The section's tables: each model and loss per seed, a training step's wall-clock, Muon's float32
    Newton-Schulz, and the learning-rate sweep. cost: each optimizer's step time over AdamW's; f32: float32_rows."""
    seeds, max_iters = d['seeds'], d['config']['max_iters']
    md = ['| model | loss | seed | AdamW end | Muon end | Muon steps / AdamW steps to AdamW\'s end | Muon time / '
          'AdamW time to it | at '
          + ', '.join(f"step {t}" for t in (max_iters // 4, max_iters // 2))
          + ' (AdamW / Muon) |', '|---|---|---|---|---|---|---|---|']
    for k, rows in judged.items():
        model, key = k.split()
        for r in rows:
            ratio = (f"{r['muon_steps']:.0f} / {r['adamw_steps']:.0f} = {r['ratio']:.2f}" if r['ratio'] is not None
                     else f"not reached / {r['adamw_steps']:.0f}")
            time_ratio = f"{r['ratio'] * cost['muon']:.2f}" if r['ratio'] is not None else ''
            at = ', '.join(f"{a:.3f} / {m:.3f}" for t, (a, m) in r['at'].items() if t < max_iters)
            md.append(f"| {NAMES[model]} | {NAMES[key]} | {r['seed']} | {r['adamw_end']:.3f} | {r['muon_end']:.3f} | "
                      f"{ratio} | {time_ratio} | {at} |")
        ms = lambda xs, f='.3f': '{:{f}} ± {:{f}}'.format(*mean_spread(xs), f=f)  # noqa: E731
        ratios = [r['ratio'] for r in rows]
        reached = all(x is not None for x in ratios)
        md.append(f"| {NAMES[model]} | {NAMES[key]} | mean ± half range ({len(rows)} seeds) | "
                  f"{ms([r['adamw_end'] for r in rows])} | {ms([r['muon_end'] for r in rows])} | "
                  f"{ms(ratios, '.2f') if reached else 'not reached in every seed'} | "
                  f"{ms([x * cost['muon'] for x in ratios], '.2f') if reached else ''} | |")
    st = d['step_times']
    md += ['', f"A training step's wall-clock (median of {d['config'].get('time_iters', '?')} interleaved steps "
           f"each, one thread, torch {st['torch']}, CPU kernels {st['capability']}: `{st['command']}`); the time "
           f"ratio above is the step ratio times Muon's step time over AdamW's:", '',
           '| optimizer | ms/step | optimizer ms/step | vs AdamW |', '|---|---|---|---|']
    md += [f"| {r['optimizer']} | {r['ms']:.2f} | {r['opt_ms']:.2f} | {cost[r['optimizer']]:.2f}x |"
           for r in st['rows']]
    md += ['', "Muon's Newton-Schulz in float32 (`--muon_dtype=float32`) against torch's bfloat16, AO-GPT any-order, "
           "the same runs but for that dtype:", '',
           '| seed | AdamW end | Muon end (bf16) | Muon end (fp32) | steps to AdamW\'s end, bf16 / fp32 (x AdamW\'s) '
           '| time to it, bf16 / fp32 (x AdamW\'s) |', '|---|---|---|---|---|---|']
    for r, b in zip(f32, judged['ao val_ao']):
        fmt = lambda x, c=1.0: f"{x * c:.2f}" if x is not None else 'not reached'  # noqa: E731
        md.append(f"| {r['seed']} | {r['adamw_end']:.3f} | {b['muon_end']:.3f} | {r['muon_end']:.3f} | "
                  f"{fmt(b['ratio'])} / {fmt(r['ratio'])} | {fmt(b['ratio'], cost['muon'])} / "
                  f"{fmt(r['ratio'], cost['muon_fp32'])} |")
    md += ['', f"Sweep ({d['config']['sweep_iters']} steps, seed {seeds[0]}; end losses):", '',
           '| model | optimizer | peak lr | AdaLN in | end any-order | end L2R | command |',
           '|---|---|---|---|---|---|---|']
    for r in d['sweep']:
        f = lambda key: f"{r['end'][key]:.3f}" if r['end'].get(key) is not None else ''  # noqa: E731
        md.append(f"| {NAMES[r['model']]} | {r['opt']} | {r['lr']:g} | {'Muon' if r['adaln'] else 'AdamW'} | "
                  f"{f('val_ao')} | {f('val_l2r')} | `{d['commands'][r['name']]}` |")
    return md


def gap_verdict(gap):
    """Finding 1's gap under each optimizer ({opt: per-seed gaps}): 'narrower' when Muon's mean gap lies below
    AdamW's by more than the two half ranges together, and the (mean, half range) of each."""
    gm = {opt: mean_spread(g) for opt, g in gap.items()}
    narrow = gm['muon'][0] < gm['adamw'][0] - gm['adamw'][1] - gm['muon'][1]
    return ('narrower' if narrow else 'not narrower'), gm


def float32_rows(d):
    """step_ratio of each seed's float32-Newton-Schulz Muon run against its AdamW run (AO-GPT, any-order)."""
    rows = []
    for s in d['seeds']:
        a, m = steps_of(d['logs'][f'ao_adamw_s{s}'], 'val_ao'), steps_of(d['logs'][f'ao_muon32_s{s}'], 'val_ao')
        rows.append(dict(step_ratio(a, m), seed=s, adamw_end=R.end(a[1]), muon_end=R.end(m[1])))
    return rows


def best_of(sweep, model, opt, adaln=False):
    rows = [r for r in sweep if r['model'] == model and r['opt'] == opt and r['adaln'] == adaln]
    return min(rows, key=lambda r: r['end'][MODELS[model][0]])


def study(c):
    """The sweep, then the compared runs: (the record, its command lines)."""
    seeds = c.seed_list
    s0, sweep, logs, what, cmds = seeds[0], [], {}, {}, {}

    def stage(what, specs):
        """specs: [(model, opt, lr, adamw_lr, adaln)], trained together, then added to the sweep."""
        runs, meta = {}, {}
        for model, opt, lr, a, adaln in specs:
            name, spec = run(model, opt, lr, s0, a, adaln)
            runs[name], meta[name] = spec, dict(model=model, opt=opt, lr=lr, adaln=adaln)
        print(f"sweep: {what}, {len(runs)} runs of {c.sweep_iters} steps")
        lg = train(c, c.sweep_iters, 'sweep', runs)
        cmds.update(commands(c, c.sweep_iters, 'sweep', runs))
        for name, m in meta.items():
            end = {k: R.end(steps_of(lg[name], k)[1]) for k in MODELS[m['model']]}
            sweep.append(dict(name=name, **m, end=end))
    lrs = c.lrs
    stage("AdamW's learning_rate", [(m, 'adamw', x, None, False) for m in MODELS for x in lrs['adamw']])
    best_adamw = {m: best_of(sweep, m, 'adamw')['lr'] for m in MODELS}
    stage("Muon's muon_lr", [(m, 'muon', x, best_adamw[m], False) for m in MODELS for x in lrs['muon']])
    stage("the AdaLN Linears in Muon, at Muon's best muon_lr",
          [(m, 'muon', best_of(sweep, m, 'muon')['lr'], best_adamw[m], True) for m in MODELS])
    key = MODELS['ao'][0]
    adaln = best_of(sweep, 'ao', 'muon', True)['end'][key] < best_of(sweep, 'ao', 'muon')['end'][key]
    best = {model: dict(adamw=best_of(sweep, model, 'adamw')['lr'], muon=best_of(sweep, model, 'muon')['lr'])
            for model in MODELS}
    best_text = ', '.join(f"{NAMES[m]} AdamW lr {b['adamw']:g}, Muon muon_lr {b['muon']:g}" for m, b in best.items()) \
        + f"; AdaLN Linears in {'Muon' if adaln else 'AdamW'} (the lower end loss on AO-GPT at Muon's best lr)"
    d = dict(config=c.config, seeds=seeds, sweep=sweep, best=best, muon_adaln=adaln, best_text=best_text,
             logs={}, what={}, commands=cmds)
    compared_runs(c, d, seeds)
    float32_runs(c, d)
    d['step_times'] = step_times(c)
    return d


def compared_runs(c, d, seeds):
    """Stage 2: each model and optimizer at the record d's best settings for `seeds`, in runs_dir/final; their
    logs, descriptions and commands join d's."""
    best, runs = d['best'], {}
    for model in MODELS:
        for s in seeds:
            for opt in ('adamw', 'muon'):
                adaln = d['muon_adaln'] and opt == 'muon'
                runs[f'{model}_{opt}_s{s}'] = run(model, opt, best[model][opt], s, best[model]['adamw'], adaln)[1]
    print(f"compared runs: {len(runs)} of {c.max_iters} steps")
    d['logs'].update(train(c, c.max_iters, 'final', runs))
    d['commands'].update(commands(c, c.max_iters, 'final', runs))
    d['what'].update({k: w for k, (_, w) in runs.items()})


def float32_runs(c, d):
    """Stage 3: AO-GPT's Muon runs again with the Newton-Schulz iteration in float32 (muon_dtype), every seed d lacks,
    in runs_dir/final beside the runs they are compared with; their logs, descriptions and commands join d's."""
    b = d['best']['ao']
    runs = {f'ao_muon32_s{s}': run('ao', 'muon32', b['muon'], s, b['adamw'], d['muon_adaln'])[1] for s in d['seeds']
            if f'ao_muon32_s{s}' not in d['logs']}  # --extend: the record's own are kept as recorded
    print(f"Muon with a float32 Newton-Schulz: {len(runs)} runs of {c.max_iters} steps")
    d['logs'].update(train(c, c.max_iters, 'final', runs))
    d['commands'].update(commands(c, c.max_iters, 'final', runs))
    d['what'].update({k: w for k, (_, w) in runs.items()})


def step_times(c):
    """Stage 4: the median ms of one training step of AO-GPT at this study's shape with AdamW, Muon and Muon with
    a float32 iteration, their steps interleaved in one process (bench/train_speed.py --optimizer), one thread
    as each training run here has (reproduce.py's jobs). The L2R GPT is the same network, so its steps cost the
    same. Returns the bench's record (rows, torch version, CPU capability) and its command."""
    rc, out = c.rc, os.path.join(c.runs_dir, 'step_times.json')
    args = ['bench/train_speed.py', '--optimizer=True', '--models=ao', '--device=cpu', f'--n_layer={rc.n_layer}',
            f'--n_head={rc.n_head}', f'--n_embd={rc.n_embd}', f'--target_dim={rc.target_dim}',
            f'--block_size={rc.block_size}', f'--batch_size={rc.batch_size}', f'--vocab_size={VOCAB}',
            f'--iters={c.time_iters}', f'--warmup={min(10, c.time_iters)}', f'--json_out={out}']
    print(f"step times: {c.time_iters} interleaved steps of each optimizer, one thread")
    r = subprocess.run([sys.executable] + args, cwd=R.ROOT, env=dict(os.environ, OMP_NUM_THREADS='1'),
                       capture_output=True, text=True)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ['no output'])[-1]
        die(f"bench/train_speed.py failed ({first_line(last, 200)}): run `python {' '.join(args)}` to see why")
    with open(out, encoding='utf-8') as f:
        record = json.load(f)
    record['command'] = 'OMP_NUM_THREADS=1 python ' + ' '.join(a for a in args if not a.startswith('--json_out'))
    return record


def extend_seeds(recorded, given):
    """--extend --seeds: the seeds to add to a record of `recorded` seeds (its sweep ran on the first), [] when
    given is the record's own. Any other change is refused in one line: the record's sweep and runs would no
    longer be the ones its seeds name."""
    if given[:len(recorded)] != list(recorded):
        raise UserError(f"--extend --seeds={','.join(map(str, given))} must start with the record's seeds "
                        f"{','.join(map(str, recorded))} (its sweep and runs are theirs) and may only add seeds "
                        f"after them: pass --seeds={','.join(map(str, recorded))},..., or run without --extend", 2)
    return list(given[len(recorded):])


@command
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    c = namespace(globals(), argv)
    R.settle(c, 'optimizers', dict(max_iters=30, sweep_iters=20, eval_interval=10, lrs_adamw='3e-3',
                                   lrs_muon='0.02', time_iters=5))
    cmd = 'python findings/optimizers.py' + ''.join(f' {a}' for a in argv)
    if c.replot:
        redraw(c, 9, RECORD, draw, 'optimizers.py')
        return print(f"redrew {FIG_CURVES} and {FIG_SWEEP} in {c.results_dir} from {RECORD}")
    for key in ('max_iters', 'sweep_iters', 'eval_interval', 'time_iters'):  # else the runs start, and fail one by one
        if getattr(c, key) < 1:
            die(f"--{key} must be at least 1, got {getattr(c, key)}")
    c.seed_list = seed_list('seeds', c.seeds)
    c.lrs = {opt: split_list(f'lrs_{opt}', getattr(c, f'lrs_{opt}'), float, lambda v: v > 0, 'learning rates > 0')
             for opt in ('adamw', 'muon')}
    # reproduce.py's settings for everything this study does not change
    c.rc = namespace(vars(R), [])
    if c.quick:
        c.rc.eval_iters = 2
    c.rc.device, c.rc.jobs, c.rc.eval_interval = c.device, c.jobs, c.eval_interval
    R.prepare_data()
    cpu0 = children_cpu_minutes()
    d = extended(c) if c.extend else study(c)
    d['cpu_min'] = children_cpu_minutes() - cpu0
    report(c, d, cmd)


def extended(c):
    """--extend: results_dir's record with what it lacks added: the float32-Newton-Schulz runs (trained with the
    record's settings), the step times (measured again), and with a --seeds that starts with the record's seeds,
    the compared and float32 runs of the seeds it adds (the record's best settings, study()'s commands). Its
    sweep and other runs are taken as recorded."""
    path = os.path.join(c.results_dir, RECORD)
    try:
        with open(path, encoding='utf-8') as f:
            d = json.load(f)
        kept = {k: d['config'][k] for k in ('max_iters', 'eval_interval', 'seeds', 'sweep_iters')}
    except FileNotFoundError:
        die(f"--extend: no {path}: run `python findings/optimizers.py` first")
    except (ValueError, KeyError, TypeError) as e:
        die(f"--extend: {path} is not a readable finding-9 record ({type(e).__name__}: {first_line(e, 120)})")
    new = extend_seeds(d['seeds'], c.seed_list) if 'seeds' in c.given else []
    changed = [f"--{k}={getattr(c, k)}" for k in kept if k in c.given and getattr(c, k) != kept[k]
               and not (k == 'seeds' and new)]
    if changed:
        die(f"--extend keeps the record's settings, so {', '.join(changed)} cannot apply: leave "
            f"{'it' if len(changed) == 1 else 'them'} out, or run without --extend")
    for k, v in kept.items():
        setattr(c, k, v)
    c.rc.eval_interval = c.eval_interval
    d['config'].update(time_iters=c.time_iters)
    if new:
        print(f"--extend: the record's seeds {', '.join(map(str, d['seeds']))} and new seeds "
              f"{', '.join(map(str, new))}: training their compared runs")
        compared_runs(c, d, new)
        d['seeds'] = d['seeds'] + new
        d['config']['seeds'] = ','.join(map(str, d['seeds']))
    if not all(f'ao_muon32_s{s}' in d['logs'] for s in d['seeds']):
        float32_runs(c, d)
    d['step_times'] = step_times(c)
    return d


if __name__ == '__main__':
    stop_on_ctrl_c("the finished runs are kept, and an interrupted one resumes: run the same command again")
    main()
