"""
Finding 10 (ours): the paper's open question, non-uniform order distributions, at the findings' CPU scale.

    python findings/orders.py               # after (or without) reproduce.py: its runs are reused -> results/
    python findings/orders.py --quick       # the pipeline end to end on tiny runs in a few minutes; judges nothing
    python findings/orders.py --replot      # only redraw results/f10_orders.png from results/orders.json

The paper trains on uniform orders with 10% L2R sequences mixed in (its finding 3) and ends its part 1 with
"future MDM research could explore non-uniform order distributions". Here the same 2-layer model as
reproduce.py's runs trains on two families of them (aogpt/orders.py), each on every seed of --seeds
(reproduce.py's setting, 1337,2,3,4: a run `NAME` on the first, `NAME_seedS` on each other seed S):
  semiar:K   blocks of K positions left to right, a uniform order inside each (block diffusion's orders)
  nearl2r:W  positions sorted by i + W * U: a local shuffle, positions fewer than W apart can swap
and a mixture of the better of them with uniform orders (mix:0.5*nearl2r:4+0.5*random), against
reproduce.py's `ao` and its other seeds' `ao_seedS` (uniform + 10% L2R, i.e. mix:0.1*l2r+0.9*random). Per model:
  losses      exact L2R, the uniform any-order bound, the bound under its own distribution (eval_ppl's
              estimators on eval_chunks val windows, EMA weights)
  generation  along its own distribution: the Lemma-1 sampler at T in STEPS (judge NLL per token and
              unigram entropy, finding 7's measures, judged by reproduce.py's `judge` run), and the exact
              speculative sampler (fused rounds, k=auto: finding 8's headline setting): forward calls per
              sample, and the judge NLL of its samples (the exact law, T = n's)
The settings, options and runs directory are reproduce.py's (the same --keys; `ao`, `ao_seedS` and `judge`
are its runs, reused when it trained them). Writes results/orders.json, results/f10_orders.png and
results/f10_orders.md (the section and the findings-table row), and puts that section into
results/README.md when reproduce.py has written one.
"""

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)
from aogpt.configurator import stop_on_ctrl_c  # noqa: E402
from aogpt.errors import command, die, first_line  # noqa: E402
from aogpt.paths import atomic_json, atomic_write  # noqa: E402
from findings import reproduce as R  # noqa: E402
from findings import sampling as S  # noqa: E402
from findings.judging import mean_spread  # noqa: E402
from findings.report import children_cpu_minutes, merge_section, trained_cost, verdicts_against  # noqa: E402

FAMILIES = {  # the distributions compared: (name of its first-seed run, order spec, what it is)
    'uniform + 10% L2R': ('ao', 'mix:0.1*l2r+0.9*random', "the paper's: uniform orders, 10% L2R sequences"),
    'semiar:4': ('semiar4', 'semiar:4', 'semi-AR: blocks of 4 left to right, uniform inside'),
    'semiar:16': ('semiar16', 'semiar:16', 'semi-AR: blocks of 16 left to right, uniform inside'),
    'nearl2r:4': ('nearl2r4', 'nearl2r:4', 'near L2R: sorted by i + 4U, positions < 4 apart can swap'),
    'nearl2r:16': ('nearl2r16', 'nearl2r:16', 'near L2R: sorted by i + 16U, positions < 16 apart can swap'),
    '0.5 nearl2r:4 + 0.5 uniform': ('mixnear4', 'mix:0.5*nearl2r:4+0.5*random',
                                    'a mixture: half near L2R (width 4), half uniform orders'),
}
RUNS = {'ao': R.RUNS['ao'], 'ao_seed2': R.RUNS['ao_seed2'], 'judge': R.RUNS['judge']}
for _fam, (_run, _spec, _what) in FAMILIES.items():
    if _run != 'ao':
        RUNS[_run] = ({'order': _spec}, _what)
        RUNS[_run + '_seed2'] = ({'order': _spec, 'seed': R.SEED2}, _what + ', another seed')
STEPS = (4, 8, 16, 32)        # Lemma-1 steps T for generation along the model's own order (n = 32)
EVAL_ORDERS = 4               # orders per val window for the any-order and own-distribution bounds
FIG = 'f10_orders.png'
MARK = '<!-- finding 10 -->'  # brackets the section in results/README.md


def family_of(run):
    """The family of a run: its first seed's run name, or that name and `_seedS`."""
    return next(f for f, (r, _, _) in FAMILIES.items() if R.seed_names([run], r))


def all_runs(c):
    """RUNS with every family's run on each other seed of --seeds (`NAME_seedS`; the ones of seed 2, as before)."""
    return R.seeded(RUNS, [r for r, _, _ in FAMILIES.values()], c.seed_list[1:])


def run_names(c):
    """The runs to train and study: every family's run on each seed of --seeds, and the judge (--quick: the first
    seed, unless --seeds was given)."""
    first = [r for r, _, _ in FAMILIES.values()]
    return first + [f'{r}_seed{s}' for s in c.seed_list[1:] for r in first] + ['judge']


# ----------------------------------------------------------------------------- the study

def study(c, runs):
    """One row per run: its three losses, generation along its own distribution at each T of STEPS, and the
    exact speculative sampler's calls per sample along it."""
    import torch

    from aogpt.checkpoint import load_model
    from aogpt.generate import generate_ao
    from aogpt.samplers import Sampling
    from aogpt.speculative import Speculation, generate_speculative
    from aogpt.likelihood import nll_any_order, nll_l2r, nll_order
    chunks = R.val_chunks(c.eval_chunks, c.block_size)
    judge, codec = S.load_judge(c)
    n, nb = c.block_size, max(1, c.gen_samples // c.gen_batch)
    g = lambda s: torch.Generator().manual_seed(s)  # noqa: E731
    per_token = lambda r: r[0] / r[1]  # noqa: E731
    rows = []
    for run in runs:
        model = load_model(os.path.join(c.runs_dir, run), c.device)[0]
        fam = family_of(run)
        spec = FAMILIES[fam][1]
        row = dict(run=run, family=fam, spec=spec, l2r=per_token(nll_l2r(model, chunks, 64)),
                   uniform=per_token(nll_any_order(model, chunks, EVAL_ORDERS, g(c.seed), 64)),
                   own=per_token(nll_order(model, chunks, spec, EVAL_ORDERS, g(c.seed), 64)), generation={})
        for T in (STEPS[:2] if c.quick else STEPS):
            sT = Sampling(vocab_size=codec.vocab_size, generator=g(c.seed + T))  # every model: the same seeds
            xs = [generate_ao(model, n, c.gen_batch, T, sT, order=spec)[0].cpu() for _ in range(nb)]
            row['generation'][str(T)] = S.judged(judge, codec, torch.cat(xs))
        ss, xs, calls = Sampling(vocab_size=codec.vocab_size, generator=g(c.seed)), [], 0.0
        sp = Speculation('auto', fused=True)
        for _ in range(nb):
            x, st = generate_speculative(model, n, c.gen_batch, ss, speculation=sp, order=spec)
            xs.append(x.cpu())
            calls += st['calls_per_sample'] / nb
        row['speculative'] = dict(calls=calls, **S.judged(judge, codec, torch.cat(xs)))
        rows.append(row)
        print(f"  {run} ({spec}): L2R {row['l2r']:.3f}, any-order {row['uniform']:.3f}, own {row['own']:.3f}; "
              f"judge NLL at T={STEPS[0]} {row['generation'][str(STEPS[0])]['nll']:.3f}; speculative "
              f"{calls:.1f} calls per sample, judge NLL {row['speculative']['nll']:.3f}")
    return rows


def metrics(row):
    """A row's numbers, flat: the losses, judge NLL and entropy at each T, the speculative calls and NLL."""
    m = {k: row[k] for k in ('l2r', 'uniform', 'own')}
    for T, r in row['generation'].items():
        m[f'nll@{T}'], m[f'H@{T}'] = r['nll'], r['unigram_entropy']
    m['calls'], m['spec_nll'] = row['speculative']['calls'], row['speculative']['nll']
    return m


def summarize(rows):
    """{family: {metric: (mean over its seeds, half the range over them, None with one seed)}}."""
    out = {}
    for fam in FAMILIES:
        ms = [metrics(r) for r in rows if r['family'] == fam]
        if ms:
            out[fam] = {k: (mean_spread([m[k] for m in ms])[0], mean_spread([m[k] for m in ms])[1]
                            if len(ms) > 1 else None) for k in ms[0]}
    return out


AXES = (('l2r', 'exact L2R loss', '.3f'), ('uniform', 'any-order loss', '.3f'),
        ('calls', 'speculative calls per sample', '.1f'))


def judge_orders(summary):
    """Finding 10's verdict. Three axes, lower is better on each: the exact L2R loss, the uniform any-order
    loss (the flexibility infilling needs) and the exact speculative sampler's forward calls per sample (fast
    generation). One distribution beats another on an axis when it is lower by more than the larger of the
    two's seed ranges there (twice the half range; sign only with one seed); it dominates when it beats the
    other somewhere and loses nowhere. The answer is the distributions no other dominates; the evidence gives
    each axis's best, every distribution against the first (the paper's), and few-step generation (judge NLL
    at T = 8)."""
    noise = lambda x, y, a: 2 * max(summary[x][a][1] or 0, summary[y][a][1] or 0)  # noqa: E731
    beats = lambda x, y, a: summary[y][a][0] - summary[x][a][0] > noise(x, y, a)  # noqa: E731
    front = [f for f in summary if not any(any(beats(o, f, a) for a, _, _ in AXES) and
                                           not any(beats(f, o, a) for a, _, _ in AXES) for o in summary if o != f)]
    best = lambda a: min(summary, key=lambda f: summary[f][a][0])  # noqa: E731
    ev = 'best ' + ', '.join(f"{what} {best(a)} {summary[best(a)][a][0]:{fmt}}" for a, what, fmt in AXES)
    ref = next(iter(summary))
    ev += f"; against {ref} (L2R / any-order / calls, * beyond the seed spreads): " + ', '.join(
        f + ' ' + ' / '.join(f"{summary[f][a][0] - summary[ref][a][0]:+{fmt}}" + '*' * (beats(f, ref, a) or
                                                                                         beats(ref, f, a))
                             for a, _, fmt in AXES) for f in summary if f != ref)
    if 'nll@8' in summary[ref]:
        ev += f"; generation in 8 steps, best {best('nll@8')} (judge NLL {summary[best('nll@8')]['nll@8'][0]:.3f})"
    if len(front) == 1:
        return f"{front[0]} dominates", ev
    return ("no single best: all undominated" if len(front) == len(summary) else
            "a trade-off: " + ', '.join(front) + " undominated"), ev


# ----------------------------------------------------------------------------- plot and report

def draw(c, rows, summary):
    """results/f10_orders.png: L2R against any-order loss (every run), judge NLL of generation along the
    model's own distribution against the steps T, and the exact speculative sampler's calls per sample
    against its samples' judge NLL. One legend below the panels, never over the data."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (a, b, d) = plt.subplots(1, 3, figsize=(14, 4.6))
    marks = dict(zip(FAMILIES, 'osD^vP'))
    for i, fam in enumerate(summary):
        color, mk = f"C{i}", marks[fam]
        mine = [r for r in rows if r['family'] == fam]
        a.plot([r['l2r'] for r in mine], [r['uniform'] for r in mine], mk, color=color, label=fam)
        Ts = sorted(int(T) for T in mine[0]['generation'])
        b.plot(Ts, [summary[fam][f'nll@{T}'][0] for T in Ts], '-' + mk, color=color)
        d.plot([r['speculative']['calls'] for r in mine], [r['speculative']['nll'] for r in mine], mk, color=color)
    a.set(xlabel='exact L2R loss (nats/char)', ylabel='uniform any-order loss (nats/char)',
          title='likelihood: L2R vs any order (each run)')
    b.set(xlabel='Lemma-1 steps T (n = %d)' % c.block_size, ylabel='judge NLL per char', xscale='log',
          title='generation along its own order (seed mean)')
    d.set(xlabel='forward calls per sample', ylabel='judge NLL per char',
          title='exact speculative sampling (fused, k=auto)')
    Ts = sorted(int(T) for T in rows[0]['generation'])
    b.set_xticks(Ts, [str(T) for T in Ts])
    b.minorticks_off()
    for ax in (a, b, d):
        ax.grid(alpha=0.3)
    fig.legend(*a.get_legend_handles_labels(), loc='lower center', ncol=len(summary), frameon=False)
    fig.suptitle('Finding 10: training order distributions (2 layers x 64, char PTB, context %d)' % c.block_size)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(os.path.join(c.results_dir, FIG), dpi=110)
    plt.close(fig)
    return FIG


CLAIM = ("(ours) Which training order distribution trades best between exact L2R likelihood, any-order "
         "flexibility and fast generation")


def section(c, cmd, rows, summary, verdict, timing, runs, cpu=0.0, changes=''):
    """The report: the findings-table row, the table per distribution (seed means, ± half the seed range),
    the runs and their commands, and the plot. cpu: the CPU-core-minutes of the runs it trained; changes: the
    verdict's change against the previous record (report.verdicts_against)."""
    pm = lambda v, fmt='.3f': f"{v[0]:{fmt}}" + (f" ± {v[1]:{fmt}}" if v[1] is not None else '')  # noqa: E731
    seeds = sorted({len([r for r in rows if r['family'] == f]) for f in summary})
    Ts = sorted(int(T) for T in rows[0]['generation'])
    cells = [g for r in rows for g in list(r['generation'].values()) + [r['speculative']]]
    se = sum(g['nll_se'] for g in cells) / len(cells)
    md = [MARK, f"## Finding 10 (ours): training order distributions{' (QUICK: nothing judged)' if c.quick else ''}",
          '', f"Written by `{cmd}` on {time.strftime('%Y-%m-%d')}, device {c.device}, in {timing / 60:.1f} min; "
          f"{trained_cost(cpu, reused='reproduce.py or an earlier invocation')}. reproduce.py's setting and its "
          f"`ao`, `ao_seedS` and `judge` runs; each distribution "
          f"trained on seeds {', '.join(map(str, c.seed_list))} ({'/'.join(map(str, seeds))} seeds a distribution "
          f"here). "
          f"Losses: nats per character on {c.eval_chunks} val windows of {c.block_size}, EMA weights, eval_ppl's "
          f"estimators ({EVAL_ORDERS} orders per window for the bounds). Generation along the model's own "
          f"distribution, {c.gen_samples} samples per cell, judged by `judge`: judge NLL per character (mean "
          f"over samples) and unigram entropy H (nats). Speculative: fused rounds, k=auto, forward calls per "
          f"sample for n = {c.block_size}. Each cell: the mean over the seeds ± half their range (a judge NLL "
          f"also has a sampling standard error, about {se:.3f} here).", '',
          changes, '', '| # | claim | verdict | evidence |', '|---|---|---|---|',
          f"| 10 | {CLAIM} ([plot]({FIG})) | **{'not judged (--quick)' if c.quick else verdict[0]}** | {verdict[1]} |",
          '', '| distribution | L2R loss | any-order loss | own-distribution loss | '
          + ' | '.join(f"T={T}: judge NLL, H" for T in Ts) + ' | speculative calls | speculative judge NLL |',
          '|---|---|---|---|' + '---|' * len(Ts) + '---|---|']
    for fam, s in summary.items():
        md.append(f"| {fam} (`{FAMILIES[fam][1]}`) | {pm(s['l2r'])} | {pm(s['uniform'])} | {pm(s['own'])} | "
                  + ' | '.join(f"{pm(s[f'nll@{T}'])}, {s[f'H@{T}'][0]:.2f}" for T in Ts)
                  + f" | {pm(s['calls'], '.1f')} | {pm(s['spec_nll'])} |")
    md += ['', '| run | its distribution | command |', '|---|---|---|']
    md += [f"| {r['run']} | `{r['spec']}` | `python {' '.join(R.train_args(c, r['run'], runs))}` |" for r in rows]
    md += ['', f"![f10]({FIG})", MARK.replace('<!-- ', '<!-- end of '), '']
    return '\n'.join(md)


def replot(c):
    path = os.path.join(c.results_dir, 'orders.json')
    if not os.path.exists(path):
        die(f"no {path}: run `python findings/orders.py` (or --quick) first")
    try:
        d = json.load(open(path, encoding='utf-8'))
        draw(c, d['rows'], summarize(d['rows']))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        die(f"{path} is not a findings/orders.py record ({type(e).__name__}: {first_line(e, 120)}): run "
              f"`python findings/orders.py` (or --quick) again to rewrite it")
    print(f"redrew {os.path.join(c.results_dir, FIG)} from {path}")


@command
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    c, _ = R.read_config(argv)
    cmd = 'python findings/orders.py' + (' ' + ' '.join(argv) if argv else '')
    if c.replot:
        return replot(c)
    t0 = time.time()
    R.prepare_data()
    runs, specs = run_names(c), all_runs(c)
    print(f"finding 10: training {len(runs)} runs of {c.max_iters} iterations (finished ones are reused)")
    cpu0 = children_cpu_minutes()
    R.train_runs(c, runs, specs)
    cpu = children_cpu_minutes() - cpu0
    print("finding 10: losses, generation along each model's own distribution, speculative calls")
    rows = study(c, [r for r in runs if r != 'judge'])
    summary = summarize(rows)
    verdict = judge_orders(summary)
    path = os.path.join(c.results_dir, 'orders.json')
    changes, before = verdicts_against(path, lambda r: {'10': r['verdict']['verdict']}, {'10': verdict[0]})
    atomic_json(path,  # first: the plot can be redrawn from it
                dict(config=c.config, command=cmd, runs={r: specs[r][0] for r in runs}, rows=rows, cpu_min=cpu,
                     verdict=dict(id='10', claim=CLAIM, verdict=verdict[0], evidence=verdict[1]),
                     verdicts_before=before))
    draw(c, rows, summary)
    sec = section(c, cmd, rows, summary, verdict, time.time() - t0, specs, cpu, changes)
    atomic_write(os.path.join(c.results_dir, 'f10_orders.md'), lambda f: f.write(sec), 'w')
    merged = merge_section(os.path.join(c.results_dir, 'README.md'), 10, sec)
    print(f"\n[10] {CLAIM}\n     {verdict[0]}: {verdict[1]}")
    print(f"\nwrote {c.results_dir}/orders.json, {FIG}, f10_orders.md" + (" and its section in README.md" if merged
                                                                          else ""))


if __name__ == '__main__':
    stop_on_ctrl_c("the finished runs are kept, and an interrupted one resumes: run the same command again")
    main()
