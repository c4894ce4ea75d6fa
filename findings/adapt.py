"""
Finding 11 (ours): what adapting a trained left-to-right GPT into an AO-GPT buys, and the levers that make it pay,
at the findings' CPU scale: reproduce.py's setting (character-level PTB, context 32, 2 layers x 64) and commands.

    python findings/adapt.py              # about 127 CPU-core-minutes (2 jobs) -> results/f11_*
    python findings/adapt.py --quick      # the pipeline end to end in tiny runs; judges nothing
    python findings/adapt.py --replot     # only redraw results/f11_*.png from results/f11_adapt.json

An AO-GPT is a GPT whose target conditioning is switched on: train.py --init_from=<GPT> --cond=adaln copies the
GPT and starts the modulation at zero, so the adapted model is the GPT at step 0 (model.adapt), then trains on
reproduce.py's `ao` orders (uniform, 10% L2R). Runs:
  gpt_s<seed>           a GPT (cond='none', L2R), `budget` steps, its checkpoints kept at every split; every seed
  <lever>_s<seed>       each lever of LEVERS (the start's scales, the new parts' learning rate, the order) on the GPT
                        at `budget` steps, `sunk` steps, AdamW; every seed of lever_seeds
  full_s<seed>          the recipe (the lever named `recipe`) on the GPT at `budget` steps, `sunk` steps, AdamW;
  full_muon_s<seed>     the same with Muon (finding 9's best settings); every seed
  split<S>_s<seed>      the recipe on the GPT at S steps for budget - S steps: equal total steps, each S in `splits`
  ao_<opt>_s<seed>      finding 9's AO-GPT runs at their best learning rates, AdamW and Muon (`budget` steps; reused
                        from results/f9_optimizers.json when its commands are these, else trained here)
  lfl_<opt>_s<seed>     like for like: the same from scratch with the recipe's keys (the ones a scratch run reads)
  part<i>_adamw_s<seed> the recipe's parts apart (its order schedule's keys together, each other key alone), from
                        scratch with AdamW, when it has more than one: which of them moves the yardstick
Every stage uses finding 9's best AdamW learning rate (learning_rate) and Muon's (muon_lr) unless a lever sets
it; an eval every eval_interval steps, on the EMA weights.

Claims. (1) From the GPT trained for the whole budget, the recipe reaches the like-for-like scratch AO-GPT's end
any-order loss (mean of its last 3 evals) in at most `ratio` x the scratch run's steps (`budget`), every seed,
AdamW (Muon: the same against Muon's own scratch run, reported). (2) At equal total steps, the best split is at
least as good as that scratch run on the any-order loss (every seed within the scratch runs' seed spread, or
better) and better on the exact L2R loss (every seed by more than that spread). Spread = half the range over the
seeds (at least 4). Runs are reused and resumed as reproduce.py's are (runs_dir); an interrupted adaptation run
starts over from its GPT checkpoint.
"""

import json
import math
import os
import sys
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)
from aogpt import plot  # noqa: E402
from aogpt.configurator import namespace, seed_list, split_list, stop_on_ctrl_c  # noqa: E402
from aogpt.errors import command, die, first_line  # noqa: E402
from aogpt.tokenizer import get_codec  # noqa: E402
from findings import optimizers as O  # noqa: E402
from findings import reproduce as R  # noqa: E402
from findings.report import children_cpu_minutes, publish, redraw, trained_cost, verdicts_against  # noqa: E402

# -----------------------------------------------------------------------------
quick = False                  # tiny runs: the pipeline end to end; nothing is judged
replot = False                 # only redraw the plots from results_dir/f11_adapt.json
device = 'cpu'
jobs = 2                       # training runs at once (reproduce.py's train_runs)
runs_dir = ''                  # '' = out-adapt (--quick: out-adapt-quick)
results_dir = ''               # '' = results (--quick: out-adapt-quick/results)
budget = 6000                  # total steps: the scratch AO-GPT's (finding 9's length) = L2R steps + adaptation steps
splits = '1500,3000'           # the GPT's steps before adaptation in the equal-total runs
sunk = 2000                    # adaptation steps from the GPT trained for the whole budget (claim: <= ratio x budget)
ratio = 0.3                    # claim (1)'s bound on the steps, as a fraction of the scratch run's
eval_interval = 100            # fine enough to interpolate the step a loss is reached at (finding 9's)
learning_rate = 6e-3           # AdamW's peak, every stage (finding 9's best for the AO-GPT and the L2R model)
muon_lr = 0.01                 # Muon's (finding 9's best; its AdaLN Linears in Muon, as finding 9 chose)
seeds = '1337,2,3,4'            # the final comparison's (at least 4: the seed spread is judged on them)
lever_seeds = '1337,3'          # every lever's runs (a subset of seeds)
recipe = 'tstd1_semiar'        # the lever (LEVERS) the final comparison adapts with: the levers' winner
# -----------------------------------------------------------------------------
RECORD, FIG, SECTION = 'f11_adapt.json', 'f11_adapt.png', 'f11_adapt.md'
LEVER_FIG = 'f11_levers.png'
# The levers tried on the adaptation from the GPT at `budget` steps (AdamW, `sunk` steps, every seed of lever_seeds):
# (name, train.py overrides, family, what). Families: the start's scales, the new parts' learning rate, the order.
WARM = dict(order_warmup_iters=500)
LEVERS = [
    ('as_is', {}, 'start', "as committed: Linears zero, table drawn at target_std 0.02"),
    ('tstd1', dict(target_std=1.0), 'start', "table drawn at target_std 1"),
    ('tstd3', dict(target_std=3.0), 'start', "table drawn at target_std 3"),
    ('astd0.05', dict(adaln_std=0.05), 'start', "Linears drawn at adaln_std 0.05, table zero"),
    ('astd0.2', dict(adaln_std=0.2), 'start', "Linears drawn at adaln_std 0.2, table zero"),
    ('lr3', dict(target_lr_scale=3.0), 'rate', "target_lr_scale 3 (table at 0.02)"),
    ('tstd1_lr3', dict(target_std=1.0, target_lr_scale=3.0), 'rate', "table at 1, target_lr_scale 3"),
    ('tstd1_lr10', dict(target_std=1.0, target_lr_scale=10.0), 'rate', "table at 1, target_lr_scale 10"),
    ('tstd1_body', dict(target_std=1.0, target_lr_scale=3.0, learning_rate=2e-3, min_lr=2e-4), 'rate',
     "table at 1, the copied weights at 2e-3 and the new ones at 6e-3"),
    ('tstd1_l2r', dict(target_std=1.0, order='l2r', l2r_frac_end=0.1, l2r_frac_iters=500), 'order',
     "table at 1, the L2R weight from 1 to 0.1 in 500 steps"),
    ('tstd1_near', dict(target_std=1.0, order_warmup='nearl2r:1:32', **WARM), 'order',
     "table at 1, nearl2r's window 1 -> 32 in 500 steps, then the run's order"),
    ('tstd1_semiar', dict(target_std=1.0, order_warmup='semiar:1:32', **WARM), 'order',
     "table at 1, semiar's block 1 -> 32 in 500 steps, then the run's order"),
    ('tstd1_lr3_near', dict(target_std=1.0, target_lr_scale=3.0, order_warmup='nearl2r:1:32', **WARM), 'combined',
     "table at 1, target_lr_scale 3, nearl2r's window 1 -> 32 in 500 steps"),
    ('tstd1_lr3_semiar', dict(target_std=1.0, target_lr_scale=3.0, order_warmup='semiar:1:32', **WARM), 'combined',
     "table at 1, target_lr_scale 3, semiar's block 1 -> 32 in 500 steps"),
    ('tstd1_lr3_semiar250', dict(target_std=1.0, target_lr_scale=3.0, order_warmup='semiar:1:32',
                                 order_warmup_iters=250), 'combined',
     "table at 1, target_lr_scale 3, semiar's block 1 -> 32 in 250 steps"),
]
LEVER_WHAT = {name: what for name, _, _, what in LEVERS}
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


def lever_runs(c):
    """{name: (overrides, what)} of every lever (LEVERS) on every seed of lever_seeds, adapting the GPT at budget."""
    out = {}
    for s in c.lever_list:
        for name, over, _, what in LEVERS:
            run, (o, w) = adapt_run(c, f'{name}_s{s}', kept(c, s, c.budget), s)
            out[run] = (dict(o, **over), f"{what}; {w}")
    return out


def kept_iter(path):
    return int(os.path.basename(path)[len('ckpt_'):-len('.pt')])


def kept(c, seed, steps):
    """The GPT's checkpoint at `steps` (train.py's keep_ckpt_every copy)."""
    return os.path.join(c.runs_dir, 'main', f'gpt_s{seed}', f'ckpt_{steps:07d}.pt')


def recipe_keys(c):
    """The recipe's train.py overrides (its lever's in LEVERS)."""
    return dict(next(over for name, over, _, _ in LEVERS if name == c.recipe))


PART_OF = dict(order_warmup_iters='order_warmup', l2r_frac_end='order', l2r_frac_iters='order', min_lr='learning_rate')


def recipe_parts(keys):
    """The recipe's keys in parts a scratch run can take apart: a schedule's keys with the key they schedule
    (PART_OF), each other key alone; [] when there is only one part."""
    parts = {}
    for k, v in keys.items():
        parts.setdefault(PART_OF.get(k, k), {})[k] = v
    return list(parts.values()) if len(parts) > 1 else []


def scratch_runs(c):
    """{name: (overrides, what)} of finding 9's AO-GPT runs at their best settings, AdamW and Muon, per seed, and the
    like-for-like ones: the same with the recipe's keys (every lever key is one a scratch run reads too)."""
    out, keys = {}, recipe_keys(c)
    for s in c.seed_list:
        for opt, run in (('adamw', O.run('ao', 'adamw', c.learning_rate, s)),
                         ('muon', O.run('ao', 'muon', c.muon_lr, s, c.learning_rate, True))):
            over, what = run[1]
            out[f'ao_{opt}_s{s}'] = (over, what)
            if keys:
                out[f'lfl_{opt}_s{s}'] = (dict(over, **keys), f"{what}, with the recipe's keys ({c.recipe})")
        over, what = O.run('ao', 'adamw', c.learning_rate, s)[1]
        for i, part in enumerate(recipe_parts(keys), 1):
            out[f'part{i}_adamw_s{s}'] = (dict(over, **part), f"{what}, with the recipe's {keys_text(part)} alone")
    return out


def keys_text(keys):
    return ', '.join(f"{k}={v}" for k, v in keys.items())


def lfl(d):
    """The prefix of the like-for-like scratch runs: lfl, or ao when the recipe has no key (adapting as is)."""
    return 'lfl' if any(k.startswith('lfl_') for k in d['logs']) else 'ao'


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
    mine = O.commands(c, c.budget, 'main', runs)
    drop = lambda cmd: [a for a in cmd.split() if not a.startswith('--out_dir=')]  # noqa: E731
    out = {}
    for k in [k for k in runs if k.startswith('ao_')]:  # finding 9 trains no like-for-like run
        log = logs.get(k) or []
        if k in cmds and drop(cmds[k]) == drop(mine[k]) and log and log[-1]['iter'] >= c.budget:
            out[k] = (log, cmds[k])
    return out


# ----------------------------------------------------------------------------- judging (pure functions)

def steps_to(log, key, target):
    return O.steps_to_reach(*O.steps_of(log, key), target)


def end_of(log, key):
    return R.end(O.steps_of(log, key)[1])


def l2r_kept(log, bar):
    """How long an adapted run keeps the GPT's L2R edge: (the first eval step whose L2R loss is above bar, the
    scratch run's end L2R loss; the first step after it back at or below bar), each None if there is none."""
    pts = list(zip(*O.steps_of(log, 'val_l2r')))
    lost = next((st for st, v in pts if v > bar), None)
    back = None if lost is None else next((st for st, v in pts if st > lost and v <= bar), None)
    return lost, back


def sunk_row(logs, run, scratch, paper, budget):
    """One adaptation from the GPT at budget against its like-for-like scratch run and the paper-default one."""
    target, ptarget = end_of(logs[scratch], 'val_ao'), end_of(logs[paper], 'val_ao')
    steps, psteps = steps_to(logs[run], 'val_ao', target), steps_to(logs[run], 'val_ao', ptarget)
    l2r = O.steps_of(logs[run], 'val_l2r')[1]
    return dict(target=target, steps=steps, ratio=None if steps is None else steps / budget, paper_target=ptarget,
                paper_steps=psteps, paper_ratio=None if psteps is None else psteps / budget,
                at0_ao=O.steps_of(logs[run], 'val_ao')[1][0], end_ao=end_of(logs[run], 'val_ao'),
                at0_l2r=l2r[0], max_l2r=max(l2r), end_l2r=end_of(logs[run], 'val_l2r'),
                scratch_l2r=end_of(logs[scratch], 'val_l2r'),
                **dict(zip(('l2r_kept', 'l2r_back'), l2r_kept(logs[run], end_of(logs[scratch], 'val_l2r')))))


def judge(d, seeds, budget, ratio):
    """Claim (1) per seed (the recipe's AdamW and Muon adaptations against their like-for-like scratch runs, and
    the paper-default ones), claim (2) per split and seed, and every lever on its seeds."""
    logs, pre = d['logs'], lfl(d)
    sunk = []
    for s in seeds:
        row = dict(seed=s)
        for opt, run in (('adamw', f'full_s{s}'), ('muon', f'full_muon_s{s}')):
            row[opt] = sunk_row(logs, run, f'{pre}_{opt}_s{s}', f'ao_{opt}_s{s}', budget)
        sunk.append(row)
    noise = {key: O.mean_spread([end_of(logs[f'{pre}_adamw_s{s}'], key) for s in seeds])[1] for key in
             ('val_ao', 'val_l2r')}
    splits = {}
    for S in d['splits']:
        rows = []
        for s in seeds:
            run, scratch = logs[f'split{S}_s{s}'], logs[f'{pre}_adamw_s{s}']
            rows.append({key: dict(two_stage=end_of(run, key), scratch=end_of(scratch, key),
                                   diff=end_of(run, key) - end_of(scratch, key)) for key in ('val_ao', 'val_l2r')})
        splits[S] = dict(rows=rows, mean_ao_diff=O.mean_spread([r['val_ao']['diff'] for r in rows])[0],
                         as_good_ao=all(r['val_ao']['diff'] <= noise['val_ao'] for r in rows),
                         better_l2r=all(r['val_l2r']['diff'] < -noise['val_l2r'] for r in rows))
    best = min(splits, key=lambda S: splits[S]['mean_ao_diff'])
    levers = {name: [sunk_row(logs, f'{name}_s{s}', f'ao_adamw_s{s}', f'ao_adamw_s{s}', budget)
                     for s in d['lever_seeds']] for name, _, _, _ in LEVERS}
    paper = [end_of(logs[f'ao_adamw_s{s}'], 'val_ao') for s in seeds]
    parts = []
    for i, keys in enumerate(d.get('parts', []), 1):  # a record from before the parts has none
        ends = [end_of(logs[f'part{i}_adamw_s{s}'], 'val_ao') for s in seeds]
        diffs = [e - p for e, p in zip(ends, paper)]  # against the paper-default scratch run of the same seed
        parts.append(dict(keys=keys, ends=ends, mean=O.mean_spread(ends), diffs=diffs,
                          lower=sum(x < 0 for x in diffs)))
    c1 = all(r['adamw']['ratio'] is not None and r['adamw']['ratio'] <= ratio for r in sunk)
    checks = [c1, splits[best]['as_good_ao'], splits[best]['better_l2r']]
    verdict = 'met' if all(checks) else 'partly met' if any(checks) else 'not met'
    return dict(sunk=sunk, noise=noise, splits=splits, best=best, checks=checks, verdict=verdict, levers=levers,
                parts=parts)


def ratio_text(ratios, budget):
    """Per-seed step ratios (None: not reached) as text: mean ± half the range, or how many were not reached."""
    if any(x is None for x in ratios):
        got = [f"{x:.2f}x" for x in ratios if x is not None]
        return (f"reached on {len(got)} of {len(ratios)} seeds within the adaptation's steps"
                + (f" ({', '.join(got)})" if got else ''))
    m, s = O.mean_spread(ratios)
    return f"{m:.2f}x ± {s:.2f} of {budget} steps (seeds: {', '.join(f'{x:.2f}' for x in ratios)})"


# ----------------------------------------------------------------------------- plot, record and report

DASH = ('-', '--', ':', '-.')  # the seeds, in order (a fifth seed starts over)


def draw(c, d):
    seeds, logs, budget, pre = d['seeds'], d['logs'], d['config']['budget'], lfl(d)
    dash = lambda i: DASH[i % len(DASH)]  # noqa: E731
    panels = []
    for opt, name in (('adamw', 'AdamW'), ('muon', 'Muon')):
        series = []
        for i, s in enumerate(seeds):
            for run, label, col in ((f'ao_{opt}_s{s}', f'scratch AO-GPT, {name}', 'C0'),
                                    (f'{pre}_{opt}_s{s}', f'scratch with the recipe, {name}', 'C1'),
                                    (f"full{'_muon' if opt == 'muon' else ''}_s{s}",
                                     f'GPT at {budget} steps + the recipe, {name}', 'C2')):
                if pre == 'ao' and col == 'C1':
                    continue
                st, v = O.steps_of(logs[run], 'val_ao')
                series.append((f"{label}, seed {s}", st[1:], v[1:], col + dash(i)))
        panels.append((f"any-order val loss, {name} (steps of this run)", series, 'optimizer steps', False))
    series = []
    for i, s in enumerate(seeds):
        for run, label, col in ((f'{pre}_adamw_s{s}', 'scratch (like for like), AdamW', 'C1'),
                                (f'full_s{s}', f'GPT at {budget} steps + the recipe, AdamW', 'C2'),
                                (f'full_muon_s{s}', f'GPT at {budget} steps + the recipe, Muon', 'C3')):
            st, v = O.steps_of(logs[run], 'val_l2r')
            series.append((f"{label}, seed {s}", st, v, col + dash(i)))
    panels.append(("L2R val loss: how long the GPT's skill lasts", series, 'optimizer steps', False))
    for key, name in (('val_ao', 'any-order'), ('val_l2r', 'L2R')):
        series = []
        for i, s in enumerate(seeds):
            st, v = O.steps_of(logs[f'{pre}_adamw_s{s}'], key)
            series.append((f"scratch (like for like), AdamW, seed {s}", st[1:], v[1:], 'C1' + dash(i)))
            for j, S in enumerate(d['splits']):
                st, v = O.steps_of(logs[f'split{S}_s{s}'], key)
                series.append((f"GPT {S} + the recipe {budget - S}, seed {s}", [S + x for x in st[1:]], v[1:],
                               f'C{4 + j}' + dash(i)))
        panels.append((f"{name} val loss at equal total steps", series, 'total optimizer steps (L2R + adaptation)',
                       False))
    plot.lines(os.path.join(c.results_dir, FIG), f"Finding 11: a trained GPT adapted with the recipe ({d['recipe']}) "
               f"against AO-GPTs from scratch (evals every {d['config']['eval_interval']} steps, from the first)",
               panels, 'val loss (nats/char)', sharey=False)
    panels, sunk = [], d['config']['sunk']
    for name, _, fam, what in LEVERS:  # a panel per lever: its seeds against the committed start and scratch's end
        series = []
        for i, s in enumerate(d['lever_seeds']):
            series.append((f"scratch AO-GPT's end ({budget} steps), AdamW, seed {s}", [0, sunk],
                           [end_of(logs[f'ao_adamw_s{s}'], 'val_ao')] * 2, 'k' + dash(i)))
            ref = [] if name == 'as_is' else [(f'as_is_s{s}', 'as committed (as_is)', 'C7')]  # as_is is its own
            for run, label, col in ref + [(f'{name}_s{s}', 'the lever', 'C1')]:
                st, v = O.steps_of(logs[run], 'val_ao')
                series.append((f"{label}, seed {s}", st[1:], v[1:], col + dash(i)))
        panels.append((textwrap.fill(f"{name} ({fam}): {what}", 60), series, 'adaptation steps', False))
    plot.lines(os.path.join(c.results_dir, LEVER_FIG), f"Finding 11's levers, one panel each: any-order val loss of "
               f"the GPT at {budget} steps adapted with the lever (AdamW), against the committed start and the scratch "
               f"AO-GPT's end loss", panels, 'val loss (nats/char)', sharey=True, cols=4)


def kept_text(x):
    """The L2R edge's cell: never lost, or lost at step a and back by step b (or never back)."""
    if x['l2r_kept'] is None:
        return 'never'
    return f"{x['l2r_kept']} / {x['l2r_back'] if x['l2r_back'] is not None else 'never'}"


def steps_text(steps, ratio, sunk):
    return f"{steps:.0f} ({ratio:.2f}x)" if steps is not None else f"not within {sunk}"


def claim_row(d, j, verdict):
    """Finding 11's row of the findings table: the claim, the verdict and the evidence."""
    cfg, budget, best = d['config'], d['config']['budget'], j['splits'][j['best']]
    pair = lambda rows, key, part: ', '.join(f"{r[key][part]:.3f}" for r in rows)  # noqa: E731
    ratios = lambda opt, key='ratio': [r[opt][key] for r in j['sunk']]  # noqa: E731
    claim = (f"(ours) From the trained L2R GPT, an AO-GPT reaches the from-scratch AO-GPT's end any-order loss in "
             f"<= {cfg['ratio']}x its steps; at equal total steps the two-stage model is at least as good on "
             f"any-order loss and better on L2R loss")
    evidence = (f"recipe {d['recipe']} ({LEVER_WHAT[d['recipe']]}), from the GPT at {budget} steps, against scratch "
                f"with the same keys: {ratio_text(ratios('adamw'), budget)} with AdamW, "
                f"{ratio_text(ratios('muon'), budget)} with Muon; against the paper-default scratch: "
                f"{ratio_text(ratios('adamw', 'paper_ratio'), budget)} (AdamW); equal total {budget} steps, best split "
                f"{j['best']} L2R + {budget - j['best']} adaptation: any-order "
                f"{pair(best['rows'], 'val_ao', 'two_stage')} vs scratch {pair(best['rows'], 'val_ao', 'scratch')}, "
                f"L2R {pair(best['rows'], 'val_l2r', 'two_stage')} vs {pair(best['rows'], 'val_l2r', 'scratch')} "
                f"(seeds {', '.join(map(str, d['seeds']))}; scratch seed spread {j['noise']['val_ao']:.3f} any-order, "
                f"{j['noise']['val_l2r']:.3f} L2R)")
    return f"| 11 | {claim} ([plot]({FIG}), [levers]({LEVER_FIG})) | **{verdict}** | {evidence} |"


def setting_text(c, d, cmd):
    """The section's paragraph on how the runs were made."""
    cfg, budget = d['config'], d['config']['budget']
    return (f"Written by `{cmd}` on {time.strftime('%Y-%m-%d')}, device {c.device}, "
            + trained_cost(d['cpu_min'])
            + f". Setting: reproduce.py's (character-level PTB, context 32, 2 layers x 64, 32 x 32 characters a step, "
            f"EMA weights), eval every {cfg['eval_interval']} steps, AdamW at {cfg['learning_rate']:g} and Muon at "
            f"{cfg['muon_lr']:g} (finding 9's best) unless a lever sets them. The GPT (cond='none') trains left to "
            f"right for {budget} steps; train.py --init_from=<its checkpoint> --cond=adaln adapts it (exactly the GPT "
            f"at step 0) and trains on `ao`'s orders (uniform, 10% L2R), a fresh warmup and optimizer. Scratch: "
            f"finding 9's AO-GPT runs ({budget} steps" + (", reused from its record" if d['reused'] else "") + "), and "
            f"like for like: the same with the recipe's keys. The equal-total runs adapt the GPT's checkpoint at S "
            f"steps for {budget} - S steps (finding 9's near-constant schedule, so the GPT at S steps is a GPT trained "
            f"for S). End: mean of the last 3 evals; steps to a loss interpolated on the eval curve; ± half the range "
            f"over {len(d['seeds'])} seeds.")


def start_and_levers(d, j):
    """The step-0 paragraph, and every lever's table with the line that ranks them."""
    budget, sunk, vocab = d['config']['budget'], d['config']['sunk'], d.get('vocab')
    at0 = O.mean_spread([r['adamw']['at0_ao'] for r in j['sunk']])[0]
    md = [f"**The start.** At step 0 the adapted model is the GPT, for every order: each slot predicts the character "
          f"after the last one revealed, whatever its target. On a uniform order that is the right position in few "
          f"slots, so the step-0 model scores {at0:.2f} nats/char any-order (seed mean)"
          + (f", worse than a uniform guess over the {vocab} characters ({math.log(vocab):.2f})" if vocab and
             at0 > math.log(vocab) else '') + ". Exact at step 0 is not a good any-order model at step 0.", '',
          f"**The levers** ({', '.join(map(str, d['lever_seeds']))}; the GPT at {budget} steps adapted for {sunk} "
          f"steps with AdamW, against the paper-default scratch AO-GPT of the same seed; every lever tried is here, "
          f"the ones that lost too):", '',
          '| lever | family | what | seed | end any-order | steps to scratch\'s end (x budget) | L2R at 0 / worst / '
          'end | L2R above scratch\'s end: from / back by step |', '|---|---|---|---|---|---|---|---|']
    for name, _, fam, what in LEVERS:
        for s, x in zip(d['lever_seeds'], j['levers'][name]):
            md.append(f"| {name} | {fam} | {what} | {s} | {x['end_ao']:.3f} | "
                      f"{steps_text(x['steps'], x['ratio'], sunk)} | {x['at0_l2r']:.3f} / {x['max_l2r']:.3f} / "
                      f"{x['end_l2r']:.3f} | {kept_text(x)} |")
    won = {n: [x['ratio'] for x in rows] for n, rows in j['levers'].items() if all(x['ratio'] for x in rows)}
    return md + ['', "Reached the scratch run's end on every seed, by the mean ratio: " + (', '.join(
        f"{n} {sum(r) / len(r):.2f}x" for n, r in sorted(won.items(), key=lambda t: sum(t[1]))) or 'none')
        + f". Did not, within {sunk} steps: " + (', '.join(n for n in j['levers'] if n not in won) or 'none') + '.']


def recipe_tables(d, j):
    """The recipe's table per seed and optimizer, what its keys do from scratch (like for like), and the
    equal-total table."""
    budget, sunk, seeds = d['config']['budget'], d['config']['sunk'], d['seeds']
    md = [f"**The recipe** ({d['recipe']}: {LEVER_WHAT[d['recipe']]}) from the GPT trained {budget} steps (a "
          f"sunk cost), every seed: adaptation steps to the end any-order loss of the scratch run with the same "
          f"keys (and of the paper-default one), against the scratch run's {budget}. L2R above scratch's end: the "
          f"first eval at which the adapted model's L2R loss is above the like-for-like scratch run's end L2R loss, "
          f"and the first after it back at or below (never: the GPT's L2R edge is not regained within the run).", '',
          '| seed | optimizer | scratch end any-order: like for like / paper | adapted: step 0 / end any-order | '
          'steps to like for like (x budget) | steps to paper (x budget) | L2R: step 0 / worst / end (scratch end) '
          '| L2R above scratch\'s end: from / back by step |', '|---|---|---|---|---|---|---|---|']
    for r in j['sunk']:
        for opt in ('adamw', 'muon'):
            x = r[opt]
            md.append(f"| {r['seed']} | {opt} | {x['target']:.3f} / {x['paper_target']:.3f} | {x['at0_ao']:.3f} / "
                      f"{x['end_ao']:.3f} | {steps_text(x['steps'], x['ratio'], sunk)} | "
                      f"{steps_text(x['paper_steps'], x['paper_ratio'], sunk)} | {x['at0_l2r']:.3f} / "
                      f"{x['max_l2r']:.3f} / {x['end_l2r']:.3f} ({x['scratch_l2r']:.3f}) | "
                      f"{kept_text(x)} |")
    if lfl(d) == 'lfl':  # what the recipe's keys do without the GPT: the yardstick moves too
        mean = lambda opt, key: O.mean_spread([r[opt][key] for r in j['sunk']])  # noqa: E731
        md += ['', "From scratch, the recipe's keys alone move the end any-order loss " + '; '.join(
            f"from {mean(opt, 'paper_target')[0]:.3f} ± {mean(opt, 'paper_target')[1]:.3f} to "
            f"{mean(opt, 'target')[0]:.3f} ± {mean(opt, 'target')[1]:.3f} with {name}"
            for opt, name in (('adamw', 'AdamW'), ('muon', 'Muon')))
            + f" (mean ± half the range, {len(seeds)} seeds)."]
        if j['parts']:
            md[-1] += (" Apart, with AdamW (against the paper-default scratch run of the same seed): " + '; '.join(
                f"{x['keys']} alone {x['mean'][0]:.3f} ± {x['mean'][1]:.3f} ({', '.join(f'{e:.3f}' for e in x['ends'])}"
                f"; {sum(x['diffs']) / len(x['diffs']):+.3f} on average, lower on {x['lower']} of {len(x['diffs'])} "
                f"seeds)" for x in j['parts']) + '.')
    md += ['', f"Equal total steps ({budget}): end losses of the two-stage runs (the recipe) against the like-for-like "
           f"scratch AO-GPT (AdamW), per seed:", '', '| L2R steps + adaptation | seed | any-order (two-stage / '
           'scratch) | L2R (two-stage / scratch) |', '|---|---|---|---|']
    for S, sp in j['splits'].items():
        for s, r in zip(seeds, sp['rows']):
            md.append(f"| {S} + {budget - S} | {s} | {r['val_ao']['two_stage']:.3f} / {r['val_ao']['scratch']:.3f} | "
                      f"{r['val_l2r']['two_stage']:.3f} / {r['val_l2r']['scratch']:.3f} |")
    return md


def report(c, d, cmd):
    """Judge the record, write finding 11's section (and merge it into results/README.md), the record and the
    figures."""
    res, cfg = c.results_dir, d['config']
    j = judge(d, d['seeds'], cfg['budget'], cfg['ratio'])
    v = 'not judged (--quick)' if c.quick else j['verdict']
    row = claim_row(d, j, v)
    changes, d['verdicts_before'] = verdicts_against(os.path.join(res, RECORD),
                                                     lambda r: {'11': r['judged']['verdict']}, {'11': v})
    md = [f"## Finding 11: adapting a trained GPT into an AO-GPT{' (QUICK: nothing judged)' if c.quick else ''}", '',
          setting_text(c, d, cmd), '', changes, '', '| # | claim | verdict | evidence |', '|---|---|---|---|', row, '']
    md += start_and_levers(d, j) + [''] + recipe_tables(d, j)
    md += ['', 'The runs:', '', '| run | what | command |', '|---|---|---|']
    md += [f"| {k} | {d['what'][k]} | `{d['commands'][k]}` |" for k in d['logs']]
    md += ['', f"![f11]({FIG}) ![f11 levers]({LEVER_FIG})", '']
    d['judged'] = dict(j, row=row, splits={str(k): v for k, v in j['splits'].items()})
    print(row)
    publish(c, 11, md, d, RECORD, SECTION, (FIG, LEVER_FIG), draw)


def study(c):
    """The GPTs, the levers, the recipe's adaptations and the scratch runs: the record."""
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
    print(f"the GPTs and the scratch AO-GPTs: {len(todo)} runs of {budget} steps ({len(reused)} scratch runs reused)")
    stage(budget, 'main', todo)
    levers = lever_runs(c)
    print(f"the levers: {len(levers)} adaptations of {c.sunk} steps")
    stage(c.sunk, 'levers', levers)
    keys, full = recipe_keys(c), {}
    for s in seeds:
        for name, opt in ((f'full_s{s}', 'adamw'), (f'full_muon_s{s}', 'muon')):
            run, (over, w) = adapt_run(c, name, kept(c, s, budget), s, opt)
            full[run] = (dict(over, **keys), f"{w}, recipe {c.recipe}")
    print(f"adapting the GPTs at {budget} steps with the recipe ({c.recipe}): {len(full)} runs of {c.sunk} steps")
    stage(c.sunk, 'sunk', full)
    for S in c.split_list:
        runs = {}
        for s in seeds:
            run, (over, w) = adapt_run(c, f'split{S}_s{s}', kept(c, s, S), s)
            runs[run] = (dict(over, **keys), f"{w}, recipe {c.recipe}")
        print(f"adapting the GPTs at {S} steps with the recipe: {len(runs)} runs of {budget - S} steps")
        stage(budget - S, f'split{S}', runs)
    order = list(gpts) + list(scratch) + list(levers) + list(full) + [f'split{S}_s{s}' for S in c.split_list
                                                                      for s in seeds]
    return dict(config=c.config, seeds=seeds, lever_seeds=c.lever_list, recipe=c.recipe, splits=c.split_list,
                parts=[keys_text(p) for p in recipe_parts(keys)], reused=sorted(reused),
                vocab=get_codec(os.path.join('data', R.DATASET)).vocab_size,
                logs={k: logs[k] for k in order}, what={k: what[k] for k in order},
                commands={k: cmds[k] for k in order})


@command
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    c = namespace(globals(), argv)
    R.settle(c, 'adapt', dict(budget=40, splits='10,20', sunk=20, eval_interval=10))
    cmd = 'python findings/adapt.py' + ''.join(f' {a}' for a in argv)
    if c.replot:
        redraw(c, 11, RECORD, draw, 'adapt.py')
        return print(f"redrew {FIG} and {LEVER_FIG} in {c.results_dir} from {RECORD}")
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
    c.seed_list, c.lever_list = seed_list('seeds', c.seeds), seed_list('lever_seeds', c.lever_seeds)
    if not set(c.lever_list) <= set(c.seed_list):
        die(f"--lever_seeds {c.lever_seeds} must be among --seeds {c.seeds}: a lever is judged against the scratch "
            f"run of its seed")
    if c.recipe not in LEVER_WHAT:
        die(f"--recipe must name a lever: {', '.join(LEVER_WHAT)}; got {c.recipe!r}")
    # reproduce.py's settings for everything this study does not change
    c.rc = namespace(vars(R), [])
    if c.quick:
        c.rc.eval_iters = 2
    c.rc.device, c.rc.jobs, c.rc.eval_interval = c.device, c.jobs, c.eval_interval
    R.prepare_data()
    cpu0 = children_cpu_minutes()
    d = study(c)
    d['cpu_min'] = children_cpu_minutes() - cpu0
    report(c, d, cmd)


if __name__ == '__main__':
    stop_on_ctrl_c("the finished runs are kept, and an interrupted one resumes: run the same command again")
    main()
