"""
Finding 12 (ours): does any-order lose ground as the window grows? AO-GPT against the encoder MDM at contexts of 32 to
512 characters, on one backbone with everything else held equal; the same on rotary positions, and sigma-GPT.

    python findings/length.py             # about 150 CPU-core-minutes on 2 cores (4 seeds) -> results/f12_*
    python findings/length.py --quick     # the pipeline end to end on tiny runs in about a minute; judges nothing
    python findings/length.py --replot    # only redraw results/f12_length.png from results/f12_length.json

Why. Pynadath & Zhang (arXiv 2602.16092) argue that a single-stream any-order model, one whose hidden state at a
step both summarises its own token for the later steps and predicts the next target, degrades as sequences grow,
and that two-stream attention is what competitive any-order models need. AO-GPT is single-stream (a slot holds the
revealed token and gets its target through AdaLN), and so is sigma-GPT; the encoder MDM, whose ELBO estimates the
same quantity as AO-GPT's any-order loss (likelihood.nll_mdm_elbo), has no such competition: a masked position
predicts and a revealed one summarises. What a two-stream AO-GPT would change in model.py: docs/two_stream.md.

Setting. reproduce.py's (character-level PTB, 2 layers x 64, learning rate 3e-3 nearly constant after warmup, EMA
0.995, max_iters steps) at each block_size of `lengths`, with the same characters per step (`tokens`, batch_size =
tokens / block_size: reproduce.py's 32 x 32 at 32), so every run sees the same characters in the same number of
steps. Runs (each on every seed of --seeds, `_seedS` after the first):
  ao, mdm             AO-GPT (the paper's defaults) and the encoder MDM (causal=False): reproduce.py's `ao` and `mdm`,
                      at every length
  ao_rope, mdm_rope   the rope block: the same two with pos='rope' (rotary positions, no position table to learn; the
                      paper's single-stream variant is rotary too), at the lengths of --rope
  sigma               sigma-GPT (cond='sigma'): reproduce.py's `sigma`, at the lengths of --sigma
The rope block and sigma-GPT run at 32 and 128 by default, not 512: there neither AO-GPT nor the MDM leaves the
unigram plateau within these steps (the section's tables), so no gap can be judged, and the budget (about 180
CPU-core-minutes) goes where one can. The runs live in reproduce.py's runs_dir: at its own setting (32 x 32) they
are its runs, named as it names them (`ao`, `ao_seed2`, `mdm`, `sigma`, ...), so each one it trained is reused and
each one trained here serves it; at another length `<name>_n<length>`. A finished run is reused, an interrupted one
resumes, and each run's scores are kept in its folder (f12_scores.json), so a rerun scores only what changed.

Evaluation (EMA weights), on the first val_tokens characters of val.bin cut into windows of the run's length (the
same text at every length): the any-order bound per window, split by how many of the window's n tokens each
prediction saw (likelihood.nll_by_revealed: eval_orders uniform orders per window for a decoder, elbo_draws mask
draws for an MDM's ELBO), grouped into deciles of the fraction revealed r/n, which add up to the loss; a decoder's
exact L2R loss; and AO-GPT's context-order ensemble (ens_members orderings, the fast estimator, ens_draws draws per
window) with its gain over its mean member on the same draws. The unigram loss of the same characters (the train
split's frequencies) is the loss of a model that reads no context.

Verdict. The gap is a decoder's any-order loss minus its MDM's ELBO (AO-GPT's and sigma-GPT's: the MDM's; the rope
block's: its own) at the same length and seed (positive: the decoder behind). It is judged at the lengths where one
of the two reads its context on some seed (more than 0.1 below the unigram loss); where a model does not, the
evidence says so, since there the gap measures how much later it learns where to look, not what it can hold. It
grows when its mean over the seeds at the longest such length exceeds the mean at the shortest by more than the
larger of the two lengths' seed ranges, shrinks when it falls by more, and otherwise stays within noise; a
least-squares line per seed against log2(block_size) gives its change per doubling of the window. The eval noise of
each gap (the standard error of its per-window differences) is reported beside the seed spread.
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
from aogpt.errors import command, die  # noqa: E402
from aogpt.paths import atomic_json  # noqa: E402
from findings import reproduce as R  # noqa: E402
from findings.judging import mean_spread  # noqa: E402
from findings.report import children_cpu_minutes, publish, redraw, trained_cost, verdicts_against  # noqa: E402

# -----------------------------------------------------------------------------
quick = False                  # tiny runs: the pipeline end to end; nothing is judged
replot = False                 # only redraw the plot from results_dir/f12_length.json
device = 'cpu'
jobs = 0                       # training runs at once (0: one per CPU core)
runs_dir = ''                  # '' = out-reproduce, reproduce.py's (--quick: out-length-quick)
results_dir = ''               # '' = results (--quick: out-length-quick/results)
lengths = '32,128,512'         # block_size of the runs, shortest first
tokens = 1024                  # characters per step at every length (batch_size = tokens / block_size)
max_iters = 6000               # reproduce.py's: its runs at 32 are reused only with its own command
eval_interval = 250            # reproduce.py's
seeds = '1337,2,3,4'           # the first is every run's without a suffix (reproduce.py's --seeds)
rope = '32,128'                # lengths of the rope block, AO-GPT and the MDM with pos='rope' ('' = none)
sigma = '32,128'               # lengths of sigma-GPT's runs ('' = none); both among `lengths` (why not 512: above)
val_tokens = 131072            # val characters scored at each length (val.bin holds 377k)
eval_orders = 2                # uniform orders per window for a decoder's any-order bound
elbo_draws = 8                 # mask draws per window for the MDM's ELBO
ens_members = 4                # orderings of the context in AO-GPT's ensemble
ens_draws = 1                  # the ensemble's draws per window
# -----------------------------------------------------------------------------
RECORD, FIG, SECTION = 'f12_length.json', 'f12_length.png', 'f12_length.md'
MODELS = {  # model: (reproduce.py's run it is, with these train.py keys more; the MDM it is compared with; what it is)
    'ao': ('ao', {}, 'mdm', "AO-GPT, the paper's defaults (AdaLN, uniform orders + 10% L2R)"),
    'mdm': ('mdm', {}, None, 'the encoder MDM (causal=False), trained on its ELBO'),
    'sigma': ('sigma', {}, 'mdm', "sigma-GPT (the target position added at the input), uniform orders + 10% L2R"),
    'ao_rope': ('ao', {'pos': 'rope'}, 'mdm_rope', "AO-GPT on rotary positions (pos='rope'), else the paper's"),
    'mdm_rope': ('mdm', {'pos': 'rope'}, None, "the encoder MDM on rotary positions (pos='rope')"),
}
DECODERS = [m for m, (_, _, ref, _) in MODELS.items() if ref]  # the models with a gap: ao first, the verdict's
NAMES = {'ao': 'AO-GPT', 'mdm': 'MDM', 'sigma': 'sigma-GPT', 'ao_rope': 'AO-GPT (rope)', 'mdm_rope': 'MDM (rope)'}
DECILES = 10
CLAIM = ("(ours) Single-stream any-order models lose ground as the window grows (Pynadath & Zhang 2026): AO-GPT's "
         "any-order loss falls further behind the encoder MDM's ELBO from the shortest window to the longest")


# ----------------------------------------------------------------------------- the runs

def own_setting(c, n):
    """Whether length n at c.tokens a step is reproduce.py's own setting (its runs, its names)."""
    return n == c.rc.block_size and c.tokens == c.rc.block_size * c.rc.batch_size


def run_name(c, model, n, seed):
    base = model + ('' if own_setting(c, n) else f'_n{n}')
    return base if seed == c.seed_list[0] else f'{base}_seed{seed}'


def run_spec(c, model, n, seed):
    """(train.py overrides beyond reproduce.py's shared ones, what it is): at reproduce.py's own setting exactly its
    run's overrides (and its seed's), so the command is its command."""
    ref, keys, _, what = MODELS[model]
    over = dict(R.RUNS[ref][0], **keys)
    if not own_setting(c, n):  # keys train_args already holds: they keep their place in the command
        over.update(block_size=n, batch_size=c.tokens // n)
    if seed != c.seed_list[0]:
        over['seed'] = seed
    return over, f"{what}, block_size {n}, seed {seed}"


def plan(c):
    """[(stage, [(model, n, seed, name)])]: the MDM and AO-GPT first (the finding), then the rope block, then
    sigma-GPT, each at its lengths and longest first (so that no core idles at its end while one long run finishes)."""
    blocks = [('the AO-GPT and MDM runs', ['ao', 'mdm'], c.length_list),
              ('the rope block', ['ao_rope', 'mdm_rope'], c.rope_list), ('the sigma-GPT runs', ['sigma'], c.sigma_list)]
    return [(stage, [(m, n, s, run_name(c, m, n, s)) for n in reversed(ns) for m in ms for s in c.seed_list])
            for stage, ms, ns in blocks if ns]


def train(c):
    """Train every stage's runs (finished ones reused): {name: (overrides, what)} of them all."""
    specs = {}
    for stage, runs in plan(c):
        mine = {name: run_spec(c, m, n, s) for m, n, s, name in runs}
        specs.update(mine)
        print(f"finding 12: {stage}, {len(mine)} runs of {c.max_iters} steps (finished ones are reused)")
        R.train_runs(c.rc, list(mine), mine)
    return specs


# ----------------------------------------------------------------------------- evaluation

def deciles(by_revealed):
    """by_revealed (N, n): each window's loss split by the tokens revealed (likelihood.nll_by_revealed) ->
    (shares, per_slot, slots): per decile d of the fraction revealed (r with floor(10 r / n) = d), its share of
    the loss per character (the shares add up to the loss, from the same numbers), the mean loss of one of its
    predictions (None for a decile no r falls in: n < 10), and how many of the n predictions fall in it."""
    N, n = by_revealed.shape
    col = by_revealed.sum(0)                                             # (n,) summed over the windows
    which = [r * DECILES // n for r in range(n)]
    shares = [sum(col[r].item() for r in range(n) if which[r] == d) / (N * n) for d in range(DECILES)]
    slots = [which.count(d) for d in range(DECILES)]
    return shares, [s * n / k if k else None for s, k in zip(shares, slots)], slots


def evaluate(c, name, model_kind, n):
    """One run's row, and its per-window any-order loss (N,) per character (for the gaps' paired eval noise)."""
    import torch

    from aogpt.checkpoint import load_model
    from aogpt.likelihood import nll_by_revealed, nll_ensemble, nll_l2r
    model = load_model(os.path.join(c.runs_dir, name), c.device)[0]
    chunks = R.val_chunks(c.val_tokens // n, n)
    N, bs = len(chunks), max(1, 8192 // n)                              # about 8k characters a forward pass
    g = torch.Generator().manual_seed(c.seed_list[0])                    # every model of a length: the same draws
    by = nll_by_revealed(model, chunks, c.eval_orders if model.config.causal else c.elbo_draws, g, bs)
    window = by.sum(1) / n                                               # (N,) per character
    shares, per_slot, slots = deciles(by)
    row = dict(run=name, model=model_kind, n=n, windows=N, loss=by.sum().item() / (N * n),
               loss_se=window.std().item() / math.sqrt(N), shares=shares, per_slot=per_slot, slots=slots)
    if model.config.causal:
        s, cnt = nll_l2r(model, chunks, bs)
        row['l2r'] = s / cnt
    if model_kind == 'ao':
        ens, member = nll_ensemble(model, chunks, c.ens_members, 'fast', g, c.ens_draws, bs)
        gain = (member - ens) / n                                        # (N,) paired, per character
        row.update(ensemble=ens.sum().item() / (N * n), ens_gain=gain.mean().item(),
                   ens_gain_se=gain.std().item() / math.sqrt(N))
    return row, window


EVAL_KEYS = ('val_tokens', 'eval_orders', 'elbo_draws', 'ens_members', 'ens_draws', 'device')
SCORES = 'f12_scores.json'  # a run's scores in its folder: a rerun (a report rewritten, say) reuses them


def scored(c, name, model_kind, n):
    """evaluate's (row, per-window losses) of one run, reused from its folder when they were computed with these
    settings from this very checkpoint (its iterations); the row keeps the CPU-seconds its scoring took."""
    import torch
    path, log = os.path.join(c.runs_dir, name, SCORES), R.read_log(os.path.join(c.runs_dir, name))
    key = dict({k: getattr(c, k) for k in EVAL_KEYS}, seed=c.seed_list[0], iters=log[-1]['iter'] if log else None)
    try:
        with open(path, encoding='utf-8') as f:
            old = json.load(f)
        if old['key'] == key:
            return old['row'], torch.tensor(old['window'], dtype=torch.float64)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or another setting's: score it
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    row, window = evaluate(c, name, model_kind, n)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    row['eval_cpu_s'] = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    atomic_json(path, dict(key=key, row=row, window=window.tolist()), indent=None)
    return row, window


def study(c, specs):
    """Every run's row (the plan's order), its seed and its log's evals; each decoder's gap to the MDM of the same
    length and seed, with the standard error of its per-window differences (the eval noise of that gap)."""
    rows, windows = [], {}
    for _, runs in plan(c):
        for model_kind, n, seed, name in runs:
            t0 = time.time()
            row, windows[name] = scored(c, name, model_kind, n)
            row.update(seed=seed, log=[{k: r.get(k) for k in ('iter', 'val_ao', 'val_l2r', 'val_elbo')}
                                       for r in R.read_log(os.path.join(c.runs_dir, name))])
            rows.append(row)
            print(f"  {name}: loss {row['loss']:.4f} ± {row['loss_se']:.4f} on {row['windows']} windows of {n}"
                  + (f", L2R {row['l2r']:.4f}" if 'l2r' in row else '')
                  + (f", ensemble {row['ensemble']:.4f} (gain {row['ens_gain']:.4f})" if 'ensemble' in row else '')
                  + f" ({time.time() - t0:.0f} s)")
    for row in rows:
        if MODELS[row['model']][2]:
            ref = run_name(c, MODELS[row['model']][2], row['n'], row['seed'])
            d = windows[row['run']] - windows[ref]
            row['gap'] = row['loss'] - next(r['loss'] for r in rows if r['run'] == ref)
            row['gap_se'] = d.std().item() / math.sqrt(len(d))
    return rows


def unigram(c):
    """The loss of a model that reads no context: the cross-entropy of the scored val characters (the first
    val_tokens) under the train split's character frequencies. An any-order loss at it means the model has not yet
    learned to use its target position (finding 5's plateau)."""
    import numpy as np

    from aogpt.bins import load_bin
    data = os.path.join(ROOT, 'data', R.DATASET)
    train, val = load_bin(data, 'train'), load_bin(data, 'val')[:c.val_tokens]
    V = int(max(train.max(), val.max())) + 1
    p = np.bincount(train, minlength=V) / len(train)
    q = np.bincount(val, minlength=V)
    return float(-(q[q > 0] * np.log(p[q > 0])).sum() / q.sum())


# ----------------------------------------------------------------------------- judging (pure functions)

PLATEAU = 0.1  # a loss within this of the unigram loss: the model reads next to no context yet (finding 5's plateau)


def stalled(rows, model, n, uni):
    """(seeds of a model at length n that read next to no context, its seeds): a loss no more than PLATEAU below the
    unigram loss uni, the plateau an any-order model or an MDM sits on until it learns where to look."""
    mine = [r['loss'] for r in rows if r['model'] == model and r['n'] == n]
    return sum(v > uni - PLATEAU for v in mine), len(mine)


def gaps(rows, model, uni=None):
    """{n: [gap per seed, in seed order]} of a decoder model's runs: at every length, or with uni only at those where
    it and its MDM both read their context on every seed. Where either is still on the plateau, the gap says which
    model learns where to look sooner at equal steps, not what a model of that window can hold, which the claim is
    about: the length is left out (plateau_text says where and whose seeds)."""
    out, ref = {}, MODELS[model][2]
    live = lambda m, n: stalled(rows, m, n, uni)[0] == 0  # noqa: E731
    for r in sorted((r for r in rows if r['model'] == model), key=lambda r: r['n']):
        if uni is None or (live(model, r['n']) and live(ref, r['n'])):
            out.setdefault(r['n'], []).append(r['gap'])
    return out


def slope(ns, ys):
    """The least-squares slope of ys against log2(ns): the change per doubling of the window."""
    xs = [math.log2(x) for x in ns]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def judge_gap(g):
    """g {n: [gap per seed]} -> (word, facts): 'grows', 'shrinks' or 'stays within noise', judged on the mean over
    the seeds at the longest length against the shortest and the larger seed range (twice the half range) of the
    two; with one seed, the sign alone. facts: each length's mean and half range, the change, the yardstick, and the
    slope per doubling of each seed and their mean and half range."""
    ns = sorted(g)
    first, last = g[ns[0]], g[ns[-1]]
    change = mean_spread(last)[0] - mean_spread(first)[0]
    noise = max(2 * mean_spread(first)[1], 2 * mean_spread(last)[1]) if min(len(first), len(last)) > 1 else None
    yard = noise or 0.0
    word = 'grows' if change > yard else 'shrinks' if change < -yard else 'stays within noise'
    per_seed = [slope(ns, [g[n][i] for n in ns]) for i in range(min(len(v) for v in g.values()))]
    return word, dict(lengths=ns, mean={n: mean_spread(g[n]) for n in ns}, change=change, noise=noise,
                      slopes=per_seed, slope=mean_spread(per_seed))


def gap_text(model, word, f):
    """One model's gap in words: its value at each length, the change against the yardstick, the slope."""
    at = ' / '.join(f"{f['mean'][n][0]:+.3f} ± {f['mean'][n][1]:.3f}" for n in f['lengths'])
    yard = f"the larger seed range {f['noise']:.3f}" if f['noise'] is not None else 'one seed: its sign'
    return (f"{NAMES[model]} − {NAMES[MODELS[model][2]]} at {' / '.join(map(str, f['lengths']))}: {at}; "
            f"{f['lengths'][0]} -> "
            f"{f['lengths'][-1]} {f['change']:+.3f} against {yard}: {word}; {f['slope'][0]:+.4f} ± "
            f"{f['slope'][1]:.4f} nats per doubling (seeds: {', '.join(f'{s:+.4f}' for s in f['slopes'])})")


def plateau_text(rows, model, out, uni):
    """The lengths left out of a decoder's gap, each with the seeds on which it or its MDM reads next to no context
    (at most PLATEAU below the unigram loss uni) and their mean losses; '' where none is left out."""
    ref, parts = MODELS[model][2], []
    for n in out:
        who = []
        for m in (model, ref):
            k, K = stalled(rows, m, n, uni)
            who.append(f"{NAMES[m]} {mean_of(rows, m, n, 'loss')[0]:.3f}" + (f", on the plateau on {k} of {K} seeds"
                                                                             if k else ""))
        parts.append(f"{n} ({'; '.join(who)})")
    if not parts:
        return ''
    return (f"; left out, where a model still reads next to no context ({PLATEAU} or less below the unigram loss, "
            f"{uni:.3f}) on some seed, so that the gap there says which learns where to look sooner at equal steps, "
            f"not what it can hold: " + ', '.join(parts))


def judge(rows, uni):
    """Finding 12's verdict (AO-GPT's gap) and evidence, and every decoder model's (word, facts). The gap is judged
    at the lengths where the model and the MDM both read their context (more than PLATEAU below the unigram loss uni
    on every seed); with fewer than two such lengths, not at all."""
    judged, ev = {}, []
    for m in DECODERS:
        if not any(r['model'] == m for r in rows):
            continue
        g = gaps(rows, m, uni)
        out = sorted(set(gaps(rows, m)) - set(g))
        if len(g) >= 2:
            judged[m] = judge_gap(g)
            text = gap_text(m, *judged[m])
            if judged[m][0] == 'grows':
                text += f" (so {judged[m][1]['slope'][0]:+.3f} nats per character per doubling of the window)"
        else:
            judged[m] = ('not judged', dict(lengths=sorted(g)))
            text = (f"{NAMES[m]} − {NAMES[MODELS[m][2]]}: not judged (fewer than two lengths where both read their "
                    f"context on every seed" + (f": only {sorted(g)[0]}" if g else "") + ")")
        if m != 'ao' and 'not judged' not in (judged['ao'][0], judged[m][0]):
            text += f" ({'like' if judged[m][0] == judged['ao'][0] else 'unlike'} AO-GPT's)"
        text += plateau_text(rows, m, out, uni)
        ev.append(text)
    worst = max(r['gap_se'] for r in rows if 'gap_se' in r)
    ev.append(f"eval noise of a gap (standard error over the val windows) at most {worst:.4f}")
    word, f = judged['ao']
    span = '' if word == 'not judged' or f['lengths'] == sorted(gaps(rows, 'ao')) else \
        f" ({f['lengths'][0]} to {f['lengths'][-1]})"
    return (word if word == 'not judged' else f"the gap {word}") + span, '; '.join(ev), judged


def decile_gaps(rows, model):
    """{n: [(mean over the seeds, half range) of a decoder model's per-prediction loss minus its MDM's of the same
    seed, in each decile of the fraction revealed; None where no prediction falls]}."""
    out = {}
    for n in sorted({r['n'] for r in rows if r['model'] == model}):
        mine = {r['seed']: r['per_slot'] for r in rows if r['model'] == model and r['n'] == n}
        ref = {r['seed']: r['per_slot'] for r in rows if r['model'] == MODELS[model][2] and r['n'] == n}
        out[n] = [mean_spread([mine[s][d] - ref[s][d] for s in mine]) if mine[next(iter(mine))][d] is not None
                  else None for d in range(DECILES)]
    return out


def where(rows, model, lengths):
    """The sentence on where a decoder's gap moved from the shortest judged window to the longest, by decile."""
    if len(lengths) < 2:
        return ''
    dg, a, b = decile_gaps(rows, model), lengths[0], lengths[-1]
    moved = [(d, dg[b][d][0] - dg[a][d][0]) for d in range(DECILES) if dg[a][d] and dg[b][d]]
    if not moved:
        return ''
    big = max(moved, key=lambda t: abs(t[1]))
    return (f"From {a} to {b} characters, {NAMES[model]}'s gap per prediction moved by " + ', '.join(
        f"{d * 10}-{d * 10 + 10}% {x:+.3f}" for d, x in moved) + f" (deciles of the fraction revealed; most at "
        f"{big[0] * 10}-{big[0] * 10 + 10}%).")


def mean_of(rows, model, n, key):
    """(mean, half range) over the seeds of one model's figure at one length; None if it has none."""
    v = [r[key] for r in rows if r['model'] == model and r['n'] == n and r.get(key) is not None]
    return mean_spread(v) if v else None


# ----------------------------------------------------------------------------- plot, record and report

DASH = ('-', '--', ':', '-.')  # the seeds, in order (a fifth starts over)
MID = [d / DECILES + 1 / (2 * DECILES) for d in range(DECILES)]  # a decile's middle, on the plot's x axis


PAIRS = (('ao', 'mdm'), ('ao_rope', 'mdm_rope'))  # the plot's and the tables' like-for-like pairs


def per_decile(rows, model, n):
    """A model's loss of one prediction in each decile at length n: [(mean over the seeds, half range) or None]."""
    return [mean_of([dict(r, v=r['per_slot'][k]) for r in rows], model, n, 'v') for k in range(DECILES)]


def curve_of(rows, model, n, seed):
    """(steps, val loss) of one run's train.py evals: the any-order loss, or the MDM's ELBO."""
    r = next(r for r in rows if r['model'] == model and r['n'] == n and r['seed'] == seed)
    pts = [(e['iter'], e.get('val_ao') or e.get('val_elbo')) for e in r['log'] if e['iter'] > 0]
    return [p[0] for p in pts], [p[1] for p in pts]


def draw(c, d):
    """results/f12_length.png: the gaps against the window, each seed; per pair (learned positions, rope), the gap
    and the loss by decile of the fraction revealed and the training curves at each length."""
    rows, seeds, uni = d['rows'], d['seeds'], d['unigram']
    color = {'ao': 'k', 'sigma': 'C3', 'ao_rope': 'C4'}  # the lengths are C0, C1, C2 in the other panels
    series = []
    for m in DECODERS:
        for i, s in enumerate(seeds):
            pts = sorted((r['n'], r['gap']) for r in rows if r['model'] == m and r['seed'] == s)
            if pts:
                series.append((f"{NAMES[m]} − {NAMES[MODELS[m][2]]}, seed {s}", [p[0] for p in pts],
                               [p[1] for p in pts], color[m] + DASH[i % len(DASH)] + 'o'))
    gap_series = []
    for m, style in (('ao', '-^'), ('ao_rope', ':v')):
        for n, g in decile_gaps(rows, m).items():
            pts = [(x, y[0]) for x, y in zip(MID, g) if y is not None]
            gap_series.append((f"{NAMES[m]} − {NAMES[MODELS[m][2]]}, n = {n}", [p[0] for p in pts],
                               [p[1] for p in pts], hue(d, n) + style))
    panels = [('the gap: any-order loss minus its MDM\'s ELBO', series, 'block_size (characters; each seed)', True),
              ('the gap by the fraction revealed', gap_series, 'fraction of the window revealed (seed means)', False)]
    for dec, mdm in PAIRS:
        lengths = sorted({r['n'] for r in rows if r['model'] == dec})
        if not lengths:
            continue
        loss, train = [], []
        for n in lengths:
            for m, style in ((dec, '-o'), (mdm, '--s')):
                pts = [(x, y[0]) for x, y in zip(MID, per_decile(rows, m, n)) if y is not None]
                loss.append((f"{NAMES[m]}, n = {n}", [p[0] for p in pts], [p[1] for p in pts],
                             hue(d, n) + style))
                train.append((f"{NAMES[m]}, n = {n}", *curve_of(rows, m, n, seeds[0]), hue(d, n)
                              + style[:-1]))
        unigram = (f"unigram loss (no context), {uni:.3f}", [MID[0], MID[-1]], [uni] * 2, 'k:')
        block = 'rope block' if 'rope' in dec else 'learned positions'
        panels.append((f"{block}: loss of a prediction by the fraction revealed", loss + [unigram],
                       'fraction of the window revealed (seed means)', False))
        panels.append((f"{block}: val loss in training (seed {seeds[0]})", train, 'optimizer steps', False))
    plot.lines(os.path.join(c.results_dir, FIG), f"Finding 12: AO-GPT against the encoder MDM as the window grows "
               f"({d['config']['tokens']} characters a step, {d['config']['max_iters']} steps, every length)",
               panels, 'nats per character', sharey=False, cols=2)


def hue(d, n):
    """A length's colour, the same in every panel: C0, C1, C2 from the shortest."""
    return f"C{sorted({r['n'] for r in d['rows']}).index(n)}"


def still_falling(d):
    """What the short training leaves open, with the numbers: how much each model's val loss (train.py's evals) still
    fell over the last quarter of its steps, seed means, at each length."""
    rows, quarter = d['rows'], d['config']['max_iters'] // 4
    drops = []
    for m in MODELS:
        for n in sorted({r['n'] for r in rows if r['model'] == m}):
            fell = []
            for r in (r for r in rows if r['model'] == m and r['n'] == n):
                pts = [(e['iter'], e.get('val_ao') or e.get('val_elbo')) for e in r['log']]
                late = [v for it, v in pts if it >= pts[-1][0] - quarter]
                fell.append(late[0] - late[-1])
            drops.append(f"{NAMES[m]} {sum(fell) / len(fell):.3f} at {n}")
    return (f"Every length trains the same {d['config']['max_iters']} steps of the same characters, so a longer "
            f"window sees fewer windows a step ({d['config']['tokens']} / n) and each position's learned rows (the "
            f"position table, AO-GPT's target table) fewer updates. Over the last quarter of the steps the val losses "
            f"still fell by " + ', '.join(drops) + " nats (seed means, train.py's evals): none of these models is at "
            "its end, and a gap at equal steps is not the gap at convergence. PTB is a corpus of short sentences "
            "(about 120 characters each), so little beyond a few hundred characters can help any of them; whether "
            "the gap holds at 1k-4k tokens, with larger models or with more steps is open.")


def pm(v, fmt='.3f'):
    return '' if v is None else f"{v[0]:{fmt}} ± {v[1]:{fmt}}"


def tables(d):
    """The section's tables: AO-GPT and the MDM per length, the other models per length, the loss per decile, the
    gaps per seed, and the runs' commands."""
    rows, lengths = d['rows'], sorted({r['n'] for r in d['rows']})
    at = lambda m, n, key, fmt='.3f': pm(mean_of(rows, m, n, key), fmt)  # noqa: E731
    md = [f"| length | windows | AO-GPT any-order | AO-GPT ensemble (M = {d['config']['ens_members']}) | its gain | "
          f"MDM ELBO | gap AO-GPT − MDM | its eval noise | AO-GPT L2R |", '|---|---|---|---|---|---|---|---|---|']
    for n in lengths:
        w = next(r['windows'] for r in rows if r['n'] == n)
        md.append(f"| {n} | {w} | {at('ao', n, 'loss')} | {at('ao', n, 'ensemble')} | {at('ao', n, 'ens_gain', '.4f')} "
                  f"| {at('mdm', n, 'loss')} | {at('ao', n, 'gap')} | {at('ao', n, 'gap_se', '.4f')} | "
                  f"{at('ao', n, 'l2r')} |")
    others = [m for m in DECODERS[1:] if any(r['model'] == m for r in rows)]
    if others:
        md += ['', 'The other models (the same estimators and windows):', '',
               '| model | length | any-order | its MDM | its MDM\'s ELBO | gap | its eval noise | L2R |',
               '|---|---|---|---|---|---|---|---|']
        for m in others:
            ref = MODELS[m][2]
            md += [f"| {NAMES[m]} | {n} | {at(m, n, 'loss')} | {NAMES[ref]} | {at(ref, n, 'loss')} | "
                   f"{at(m, n, 'gap')} | {at(m, n, 'gap_se', '.4f')} | {at(m, n, 'l2r')} |"
                   for n in sorted({r['n'] for r in rows if r['model'] == m})]
    md += ['', "Where the loss goes: the loss of one prediction in each decile of the fraction of the window already "
           "revealed (r/n, r the tokens it saw), seed means ± half the range; the shares of the loss, which add up to "
           "it exactly, are in the record.", '',
           '| length | model | ' + ' | '.join(f"{k * 10}-{k * 10 + 10}%" for k in range(DECILES)) + ' |',
           '|---|---|' + '---|' * DECILES]
    for m in [m for m in DECODERS if any(r['model'] == m for r in rows)]:
        for n in sorted({r['n'] for r in rows if r['model'] == m}):
            for x in ((m, MODELS[m][2]) if m != 'sigma' else (m,)):  # sigma-GPT's MDM is AO-GPT's, listed there
                md.append(f"| {n} | {NAMES[x]} | " + ' | '.join(pm(v) for v in per_decile(rows, x, n)) + ' |')
            md.append(f"| {n} | {NAMES[m]} − {NAMES[MODELS[m][2]]} | " + ' | '.join(
                pm(v) for v in decile_gaps(rows, m)[n]) + ' |')
    md += ['', 'Per seed (the gap, and its eval noise):', '', '| model | length | ' + ' | '.join(
        f"seed {s}" for s in d['seeds']) + ' |', '|---|---|' + '---|' * len(d['seeds'])]
    for m in ['ao'] + others:
        for n in sorted({r['n'] for r in rows if r['model'] == m}):
            by = {r['seed']: r for r in rows if r['model'] == m and r['n'] == n}
            md.append(f"| {NAMES[m]} | {n} | " + ' | '.join(f"{by[s]['gap']:+.3f} ({by[s]['gap_se']:.4f})"
                                                          for s in d['seeds']) + ' |')
    md += ['', '| run | what | command |', '|---|---|---|']
    md += [f"| {r['run']} | {d['what'][r['run']]} | `{d['commands'][r['run']]}` |" for r in rows]
    return md


def report(c, d, cmd):
    """The record (json), the plot and a section for results/README.md with its findings-table row."""
    res, cfg = c.results_dir, d['config']
    verdict, evidence, judged = judge(d['rows'], d['unigram'])
    v = 'not judged (--quick)' if c.quick else verdict
    row = f"| 12 | {CLAIM} ([plot]({FIG})) | **{v}** | {evidence} |"
    changes, d['verdicts_before'] = verdicts_against(os.path.join(res, RECORD),
                                                     lambda r: {'12': r['judged']['verdict']}, {'12': v})
    d['judged'] = dict(verdict=v, evidence=evidence, row=row, models={m: dict(word=w, **f) for m, (w, f) in
                                                                     judged.items()})
    ns = sorted({r['n'] for r in d['rows']})
    shapes = ', '.join(f"{cfg['tokens'] // n} x {n}" for n in ns)
    md = ["## Finding 12: does any-order lose ground as the window grows?"
          + (' (QUICK: nothing judged)' if c.quick else ''), '',
          f"Written by `{cmd}` on {time.strftime('%Y-%m-%d')}, device {c.device}, in {d['minutes']:.1f} min; "
          f"{trained_cost(d['cpu_min'], reused='reproduce.py or an earlier invocation')}. Training measured by the "
          f"invocations that wrote this record, this one included: {d['trained_cpu_min']:.1f} CPU-core-minutes (the "
          f"record's trained_cpu_min; one stopped before writing its record is not in it); scoring "
          f"{d['eval_cpu_min']:.1f} (each run's when it was scored). Setting: "
          f"reproduce.py's (character-level PTB, "
          f"{cfg['n_layer']} layers x {cfg['n_embd']}, learning rate {cfg['learning_rate']:g} nearly constant after "
          f"warmup, EMA {cfg['ema_decay']}) at block_size {', '.join(map(str, ns))} with the same {cfg['tokens']} "
          f"characters a step ({shapes}) and the same "
          f"{cfg['max_iters']} steps, on seeds {', '.join(map(str, d['seeds']))}; EMA weights. Losses in nats per "
          f"character on the first {cfg['val_tokens']:,} characters of val.bin at every length (cut into windows of "
          f"the length): any-order bounds from likelihood.nll_by_revealed ({cfg['eval_orders']} uniform orders a "
          f"window; the MDM's ELBO {cfg['elbo_draws']} mask draws a window), AO-GPT's exact L2R loss, its "
          f"context-order ensemble of {cfg['ens_members']} orderings (fast estimator, {cfg['ens_draws']} draw a "
          f"window; gain: over its mean member on the same draws). Each cell: the mean over the seeds ± half their "
          f"range. The gap is the any-order loss minus the MDM's ELBO of the same length and seed (positive: behind "
          f"the MDM); its eval noise is the standard error of its per-window differences. A model that reads no "
          f"context scores the unigram loss of these characters, {d['unigram']:.3f}.", '',
          changes, '', '| # | claim | verdict | evidence |', '|---|---|---|---|', row, '']
    md += tables(d)
    md += [''] + [where(d['rows'], m, f['lengths']) for m, (_, f) in judged.items()]
    md += ['', f"**What {cfg['max_iters']} steps leave open.** {still_falling(d)}", '',
           f"![f12]({FIG})", '']
    print(f"\n[12] {CLAIM}\n     {v}: {evidence}")
    publish(c, 12, md, d, RECORD, SECTION, (FIG,), draw)




# ----------------------------------------------------------------------------- the command

def reproduce_settings(c):
    """c.rc: reproduce.py's settings (train_args' config) for everything this study does not change."""
    c.rc = namespace(vars(R), [])
    c.rc.device, c.rc.jobs, c.rc.runs_dir, c.rc.seed = c.device, c.jobs, c.runs_dir, c.seed_list[0]
    c.rc.max_iters, c.rc.eval_interval = c.max_iters, c.eval_interval
    if c.quick:
        c.rc.eval_iters = 2


def earlier_training(c, commands):
    """The CPU-core-minutes the earlier invocations recorded for training these runs (results_dir's record, when
    its runs are among these, with the same commands), so that a report rewritten from reused runs still says what
    they cost; 0 without such a record."""
    try:
        with open(os.path.join(c.results_dir, RECORD), encoding='utf-8') as f:
            old = json.load(f)
        same = all(k in commands and R.same_run(v.split()[1:], commands[k].split()[1:])  # 'python' dropped
                   for k, v in old['commands'].items())
        return float(old['trained_cpu_min']) if same else 0.0
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0.0


def check(c):
    """The settings, before any run: one line for what cannot work."""
    c.length_list = split_list('lengths', c.lengths, int, lambda n: n >= 2, 'block sizes of at least 2')
    if len(c.length_list) < 2 or sorted(set(c.length_list)) != c.length_list:
        die(f"--lengths must be at least two different block sizes, shortest first, got {c.lengths!r}: a gap against "
            f"the window needs two windows")
    bad = [n for n in c.length_list if c.tokens % n]
    if c.tokens < 1 or bad:
        die(f"--tokens={c.tokens} must be a multiple of every length (the batch is tokens / block_size): not of "
            f"{', '.join(map(str, bad))}" if bad else f"--tokens must be at least 1, got {c.tokens}")
    if c.val_tokens < c.length_list[-1]:
        die(f"--val_tokens={c.val_tokens} holds no window of {c.length_list[-1]}: give at least that many")
    for key in ('max_iters', 'eval_interval', 'eval_orders', 'elbo_draws', 'ens_members', 'ens_draws'):
        if getattr(c, key) < 1:
            die(f"--{key} must be at least 1, got {getattr(c, key)}")
    if c.jobs < 0:
        die(f"--jobs must be 0 (one per core) or more, not {c.jobs}")
    for key in ('rope', 'sigma'):  # '' = none; --quick: the shortest and the longest length, unless given
        given = str(getattr(c, key)).strip() if key in c.given or not c.quick else \
            f"{c.length_list[0]},{c.length_list[-1]}"
        ns = split_list(key, given, int, lambda n: n in c.length_list, f"lengths among --lengths={c.lengths}") \
            if given else []
        setattr(c, f'{key}_list', sorted(set(ns)))
    c.seed_list = seed_list('seeds', c.seeds)


@command
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    c = namespace(globals(), argv)
    R.settle(c, 'length', dict(lengths='8,16,32', tokens=64, max_iters=30, eval_interval=10, val_tokens=2048,
                               elbo_draws=2, eval_orders=1, ens_members=2),
             runs_dir='out-reproduce')  # reproduce.py's: its runs at its own setting are these
    cmd = 'python findings/length.py' + ''.join(f' {a}' for a in argv)
    if c.replot:
        redraw(c, 12, RECORD, draw, 'length.py')
        return print(f"redrew {os.path.join(c.results_dir, FIG)} from {RECORD}")
    check(c)
    if c.quick and 'seeds' not in c.given:  # quick: one seed, unless asked for more
        c.seed_list = c.seed_list[:1]
    reproduce_settings(c)
    t0 = time.time()
    R.prepare_data()
    cpu0 = children_cpu_minutes()
    specs = train(c)
    cpu = children_cpu_minutes() - cpu0
    print(f"finding 12: any-order losses, ELBOs, L2R and ensembles on {c.val_tokens:,} val characters per length")
    rows = study(c, specs)
    commands = {k: 'python ' + ' '.join(R.train_args(c.rc, k, specs)) for k in specs}
    d = dict(config=dict(c.config, **{k: getattr(c.rc, k) for k in ('n_layer', 'n_embd', 'learning_rate',
                                                                         'ema_decay')}),
             command=cmd, seeds=c.seed_list, rows=rows, what={k: w for k, (_, w) in specs.items()},
             commands=commands, cpu_min=cpu, trained_cpu_min=earlier_training(c, commands) + cpu, unigram=unigram(c),
             eval_cpu_min=sum(r['eval_cpu_s'] for r in rows) / 60, minutes=(time.time() - t0) / 60)
    report(c, d, cmd)


if __name__ == '__main__':
    stop_on_ctrl_c("the finished runs are kept, and an interrupted one resumes: run the same command again")
    main()
