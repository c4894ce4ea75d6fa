"""
--trace FILE: one self-contained HTML page showing, per sample, how the sequence filled in, one line per
forward step (a round of the speculative sampler, a step of the others). Given tokens are grey; a step's
new tokens are coloured; positions not yet revealed show a dot. For the speculative sampler each new
token says how it was decided: d_0 (the draft call's exact first copy; in a fused round without drafts,
its one exact token), a kept draft, a replacement drawn from the residual after a rejected draft (hover:
the rejected draft), or the bonus token.
"""

if __name__ == '__main__':  # run as a script (python aogpt/tracepage.py): one line, not an ImportError
    raise SystemExit("error: aogpt/tracepage.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import html

import torch

from aogpt.paths import atomic_write

KINDS = {  # kind -> (colour, legend)
    'given': ('#ddd', 'given'),
    'new': ('#9cf', 'revealed at this step'),
    'd0': ('#9cf', 'd_0: the exact first draft'),
    'kept': ('#8d8', 'a draft kept (accept test passed)'),
    'resampled': ('#fb6', 'drawn from the residual after a rejected draft (hover: the draft)'),
    'bonus': ('#c9f', 'bonus token (every draft kept)'),
}


def steps_of(stats, n, n_given, batch_size):
    """Per sample, a list of steps, each a list of (position, kind, rejected draft or None), from the stats
    of any sampler: the speculative sampler's events, or a reveal order with per-step counts (generate_ao,
    generate_confident), or per-position step indices (generate_mdm's step_of), or left to right (AR)."""
    B, out = batch_size, []
    order = stats.get('order')
    order = order.cpu() if order is not None else torch.arange(n).expand(B, n)
    for b in range(B):
        st = [[(int(p), 'given', None) for p in order[b, :n_given]]] if n_given else []
        if 'events' in stats:
            for m, kk, t, a, d, _ in stats['events']:
                mb, tb, ab = int(m[b]), int(t[b]), int(a[b])
                row = []
                for i in range(tb):
                    if torch.is_tensor(kk):  # a fused round: kk (B,) drafts per sample, all of them tested
                        kb = int(kk[b])
                        kind = 'kept' if i < ab else 'resampled' if ab < kb else 'bonus' if kb else 'd0'
                    else:
                        kind = 'd0' if i == 0 else 'bonus' if i == kk else 'kept' if i <= ab else 'resampled'
                    row.append((int(order[b, mb + i]), kind, int(d[b, i]) if kind == 'resampled' else None))
                if row:
                    st.append(row)
        elif 'step_of' in stats:
            s = stats['step_of'][b].cpu()
            for k in sorted(set(s[s >= 0].tolist())):
                st.append([(int(p), 'new', None) for p in order[b] if s[p] == k])
        else:
            counts = stats.get('counts')
            if counts and isinstance(counts[0], list):  # threshold-chosen: each sample its own counts
                counts = counts[b]
            counts = counts or [1] * (n - n_given)
            j = n_given
            for k in counts:
                st.append([(int(p), 'new', None) for p in order[b, j:j + k]])
                j += k
        out.append(st)
    return out


def write(path, samples, stats, n_given, decode, title):
    """The page: samples (B, n) token ids, the sampler's stats, decode(id) -> text of one token."""
    B, n = samples.shape
    css = ''.join(f".{k}{{background:{c}}}" for k, (c, _) in KINDS.items())
    parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
             "body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;margin-bottom:2em}"
             "td{font-family:monospace;white-space:pre;padding:0 1px;border:1px solid #f4f4f4}"
             "td.s{font-family:sans-serif;color:#888;padding-right:.6em;border:0}.u{color:#ccc}" + css + "</style>",
             f"<h2>{html.escape(title)}</h2><p>" + ' '.join(
                 f"<span class='{k}'>&nbsp;{html.escape(v)}&nbsp;</span>" for k, (_, v) in KINDS.items()) + "</p>"]
    for b, st in enumerate(steps_of(stats, n, n_given, B)):
        shown = {}
        parts.append(f"<h3>sample {b}: {len(st)} steps</h3><table>")
        for i, row in enumerate(st):
            now = {p: (k, r) for p, k, r in row}
            cells = []
            for p in range(n):
                tok = html.escape(decode(int(samples[b, p])).replace('\n', '⏎') or ' ')
                if p in now:
                    k, r = now[p]
                    tip = f" title='rejected draft: {html.escape(decode(r))}'" if r is not None else ''
                    cells.append(f"<td class='{k}'{tip}>{tok}</td>")
                elif p in shown:
                    cells.append(f"<td>{tok}</td>")
                else:
                    cells.append("<td class='u'>·</td>")
            shown.update(now)
            parts.append(f"<tr><td class='s'>{i}</td>{''.join(cells)}</tr>")
        parts.append("</table>")
    atomic_write(path, lambda f: f.write(''.join(parts)), 'w')  # a failed write leaves no half page
