"""
Findings 1-7's judging, pure functions of the logged losses and the measurements (moved out of
findings/reproduce.py, which imports them from here, to keep that file within the house's 700 lines).
"""

if __name__ == '__main__':  # run as a script: one line, not an ImportError
    raise SystemExit('error: findings/judging.py is part of the findings pipeline, with nothing to run: run '
                     'findings/reproduce.py')
import math

import numpy as np

from findings.sampling import GEN_SETTINGS

def curve(log, key):
    """(tokens, values) of one logged loss, skipping evals where it is undefined."""
    pts = [(r['tokens'], r[key]) for r in log if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def end(values, k=3):
    """The mean of the last k evals: the end-of-run loss with less eval noise than the last point."""
    v = values[-k:]
    return sum(v) / len(v)


def tokens_to_reach(tokens, values, target):
    """The first logged token count at which a curve is at or below target (None if never)."""
    return next((t for t, v in zip(tokens, values) if v <= target), None)


def verdict(checks):
    """checks: list of bools, one per sub-claim -> 'reproduced' | 'partly reproduced' | 'not reproduced'."""
    if all(checks):
        return 'reproduced'
    return 'partly reproduced' if any(checks) else 'not reproduced'


def judge_slower(fast, slow):
    """Finding 1: does `slow` (AO's any-order loss) converge more slowly than `fast` (L2R)?
    Each is (tokens, values) on the same eval schedule. Evidence: end losses, the share of evals after
    the first where fast is lower, and how many tokens fast needed to reach slow's end loss."""
    (tf, vf), (ts, vs) = fast, slow
    pairs = [(a, b) for t, a, b in zip(tf, vf, vs) if t > 0]
    below = sum(a < b for a, b in pairs)
    reach = tokens_to_reach(tf, vf, end(vs))
    ok = [end(vf) < end(vs), below == len(pairs)]
    text = (f"end loss L2R {end(vf):.3f} vs AO any-order {end(vs):.3f}; L2R lower at {below}/{len(pairs)} "
            f"evals; L2R reached AO's end loss after {reach:,} of {ts[-1]:,} tokens" if reach is not None else
            f"end loss L2R {end(vf):.3f} vs AO any-order {end(vs):.3f}; L2R lower at {below}/{len(pairs)} evals")
    return verdict(ok), text


def judge_order(l2r, block, fixed):
    """Finding 2: end losses l2r < block < fixed (each a list of values in its own training order)."""
    a, b, f = end(l2r), end(block), end(fixed)
    ok = [a < f, a < b < f]
    return verdict(ok), f"end loss L2R {a:.3f} < block-wise {b:.3f} < fixed random {f:.3f}" if all(ok) else \
        f"end loss L2R {a:.3f}, block-wise {b:.3f}, fixed random {f:.3f} (claim: L2R < block-wise < fixed random)"


def judge_better(named, noise):
    """Findings 3 and 5: named = [(what, value with, value without)]; the claim is with < without by
    more than the run-to-run spread `noise` (None in quick mode: sign only)."""
    v, text = _better([(what, w, wo, f"{wo:.3f} -> {w:.3f}") for what, w, wo in named], noise)
    return v, text + (f"; run-to-run spread {noise:.3f}" if noise is not None else "")


def _better(rows, noise):
    """rows [(what, with, without, the change as text)]: each claim is with < without by more than noise (None:
    sign only); the verdict and the evidence."""
    checks, parts = [], []
    for what, w, wo, change in rows:
        d = w - wo
        ok = d < 0 and (noise is None or -d > noise)
        checks.append(ok)
        tag = '' if ok else (' (within noise)' if d < 0 else ' (worse)')
        parts.append(f"{what} {change} ({d:+.3f}){tag}")
    return verdict(checks), '; '.join(parts)


def judge_ensemble(ms, ppl, gain, gain_se):
    """Finding 4: PPL falls as M grows. ppl[i] at M = ms[i]; gain[i] = paired NLL drop vs M = 1 on the
    same draws, with its standard error. Claim holds if each step lowers the PPL and the gain at
    the largest M is over 2 standard errors."""
    steps_down = all(b < a for a, b in zip(ppl, ppl[1:]))
    sig = gain[-1] > 2 * gain_se[-1]
    text = ', '.join(f"M={m}: {p:.3f}" for m, p in zip(ms, ppl)) + \
        f" (PPL per char); M={ms[-1]} vs M=1 on the same draws: {-gain[-1]:+.4f} ± {gain_se[-1]:.4f} nats"
    return verdict([steps_down, sig]), text


def loglog_slope(xs, ys):
    """Least-squares slope of log y on log x: 0 = flat, 1 = linear."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(lx, ly, 1)[0])


def judge_scaling(steps, t_dec, t_enc):
    """Finding 6: decoder time flat in T (log-log slope < 0.3), encoder roughly linear (slope > 0.7)."""
    sd, se = loglog_slope(steps, t_dec), loglog_slope(steps, t_enc)
    text = (f"log-log slope decoder {sd:.2f}, encoder {se:.2f}; at T={steps[-1]}: decoder {t_dec[-1]:.2f} s, "
            f"encoder {t_enc[-1]:.2f} s ({t_enc[-1] / t_dec[-1]:.1f}x)")
    return verdict([sd < 0.3, se > 0.7]), text


def judge_annealing(ppl, noise):
    """Finding 7: without annealing the decoder's generative perplexity is higher than the encoder MDM's;
    with top-p 0.95 and temperature 0.7 the two are comparable. ppl[(model, setting)]: the geometric mean
    gen PPL over the judged step counts, for model 'ao' and 'mdm' and the first and last of GEN_SETTINGS;
    noise[setting]: |log| of the ao / ao_seed2 ratio (the run-to-run spread; None: sign only). Holds if
    log(ao / mdm) exceeds the spread without annealing, and is within it with annealing."""
    plain, hot = GEN_SETTINGS[0], GEN_SETTINGS[-1]
    gap = {s: math.log(ppl[('ao', s)] / ppl[('mdm', s)]) for s in (plain, hot)}
    if noise is None:
        ok = [gap[plain] > 0, abs(gap[hot]) < abs(gap[plain])]
        spread = {plain: '', hot: ''}
    else:
        ok = [gap[plain] > noise[plain], abs(gap[hot]) <= noise[hot]]
        spread = {s: f", run-to-run spread {math.exp(noise[s]) - 1:.0%}" for s in (plain, hot)}
    text = '; '.join(f"top-p {s[0]} / T {s[1]}: AO-GPT {ppl[('ao', s)]:.2f} vs encoder MDM {ppl[('mdm', s)]:.2f} "
                     f"({math.exp(gap[s]) - 1:+.0%}{spread[s]})" for s in (plain, hot))
    return verdict(ok), text


def mean_spread(xs):
    """(mean, half the range): the seed spread of a per-seed figure."""
    return sum(xs) / len(xs), (max(xs) - min(xs)) / 2


def judge_better_seeds(named):
    """Finding 3 over seeds: named = [(what, values with, values without)], one value per seed. The claim holds
    where the mean with is lower than the mean without by more than the larger seed range of the two runs (twice
    its half range), the largest over everything named: the yardstick ao/ao_seed2's difference was with two
    seeds, one run each side. With one seed: sign only. The evidence gives each mean ± half its range."""
    n = min(len(v) for _, w, wo in named for v in (w, wo))
    noise = max(2 * mean_spread(v)[1] for _, w, wo in named for v in (w, wo)) if n > 1 else None
    rows = []
    for what, w, wo in named:
        (mw, sw), (mo, so) = mean_spread(w), mean_spread(wo)
        rows.append((what, mw, mo, f"{mo:.3f} ± {so:.3f} -> {mw:.3f} ± {sw:.3f}"))
    v, text = _better(rows, noise)
    return v, text + (f"; means ± half range over {n} seeds, the larger seed range {noise:.3f}" if noise is not None
                      else "")
