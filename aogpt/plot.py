"""
Plots a researcher would rather look at than JSON: a run's loss curves from its log.jsonl, and an eval
table from eval_ppl.py's record. train.py redraws out_dir/loss.png at every eval, eval_ppl.py draws its
table beside its JSON, reproduce.py draws the findings with the same helpers.

    python -m aogpt.plot out-demo        # out-demo/loss.png from log.jsonl, out-demo/eval_ppl.png from eval_ppl.json

matplotlib is imported only when a plot is drawn (Agg backend: no display needed), so importing this
module costs nothing.
"""

import json
import math
import os
import sys


def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def finish(plt, fig, ax, path, title, xlabel, ylabel, legend=True):
    """Labels, grid and legend, then write the PNG."""
    _label(ax, title, xlabel, ylabel, legend)
    _save(plt, fig, path)


def _label(ax, title, xlabel, ylabel, legend=True):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if legend:
        legend_below(ax)


def legend_below(where, fontsize=8):
    """The legend under the axes (or under a whole figure): never on top of the data, however many entries
    it has. The PNG grows to hold it (bbox_inches='tight' in save)."""
    if hasattr(where, 'get_legend_handles_labels'):
        handles, labels = where.get_legend_handles_labels()
    else:  # a figure: every panel's labels, each once, in order
        seen = {}
        for ax in where.axes:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(lab, h)
        labels, handles = list(seen), list(seen.values())
    if not handles:
        return None
    on_axes = hasattr(where, 'get_legend_handles_labels')
    fig = where.figure if on_axes else where
    width = fig.get_figwidth() * (where.get_position().width if on_axes else 1.0)  # inches the legend may span
    per_col = fontsize * 0.6 * (max(map(len, labels)) + 5) / 72                    # inches a column takes
    cols = max(1, min(3, len(labels) // 4 + 1, int(width / per_col)))
    below = (0.5, -0.2) if on_axes else (0.5, 0.0)  # under an axes' x label; under a whole figure
    legend = where.legend(handles, labels, fontsize=fontsize, ncol=cols, loc='upper center', bbox_to_anchor=below,
                          frameon=False)
    legend.set_in_layout(False)  # tight_layout sizes the axes alone; the saved image grows to take the legend
    return legend


def _save(plt, fig, path, rect=(0, 0, 1, 1)):
    """Write the PNG atomically (paths.atomic_write): a reader never sees half a file, and a full disk or a
    read-only folder leaves no temp file behind and is a UserError naming the PNG. rect: the part of the
    figure the axes fill."""
    from aogpt.errors import UserError
    from aogpt.paths import atomic_write
    fig.tight_layout(rect=rect)
    # what the tight crop keeps besides the axes: given a list, savefig keeps only it, so the figure's own texts
    # (a suptitle) go in too, or they are cut off
    extra = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends) + list(fig.texts)
    try:
        atomic_write(path, lambda f: fig.savefig(f, format='png', dpi=110, bbox_inches='tight',
                                                 bbox_extra_artists=extra))
    except OSError as e:
        raise UserError(f"cannot write {path} ({e.strerror or e})") from None
    finally:
        plt.close(fig)


def save(fig, path):
    """_save for a figure drawn outside this module (findings/sampling.py's finding 8)."""
    _save(_pyplot(), fig, path)


def curves(path, title, series, ylabel='val loss (nats/char)', xlabel='training tokens (M)'):
    """series: [(label, tokens, values, style)]; the y range skips the first steep drop."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for label, t, v, style in series:
        ax.plot([x / 1e6 for x in t], v, style, label=label, lw=1.5, ms=3)
    lo = min(min(v[len(v) // 5:] or v) for _, _, v, _ in series)
    hi = max(max(v[len(v) // 5:] or v) for _, _, v, _ in series)
    ax.set_ylim(lo - 0.05 * (hi - lo + 1e-9), hi + 0.3 * (hi - lo + 1e-9))
    finish(plt, fig, ax, path, title, xlabel, ylabel)


def xy(path, title, xs, series, xlabel, ylabel, logx=True, logy=False):
    """series: [(label, ys, style)] over the shared xs."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for label, ys, style in series:
        ax.plot(xs, ys, style, label=label, lw=1.5, ms=4)
    if logx:
        ax.set_xscale('log', base=2)
    if logy:
        ax.set_yscale('log')
    ax.set_xticks(xs, [str(x) for x in xs])
    finish(plt, fig, ax, path, title, xlabel, ylabel)


def lines(path, title, panels, ylabel, logy=False, sharey=True, cols=None):
    """panels: [(subtitle, series, xlabel, logx)] side by side (or in rows of `cols`), sharing the y axis unless
    not sharey; series: [(label, xs, ys, style)], each line on its own xs. One legend under the figure: every
    panel's labels, each once."""
    plt = _pyplot()
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
    cols = min(cols or len(panels), len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), sharey=sharey, squeeze=False)
    for ax in axes.flat[len(panels):]:  # the last row's empty places
        ax.set_visible(False)
    for i, (ax, (subtitle, series, xlabel, logx)) in enumerate(zip(axes.flat, panels)):
        for label, xs, ys, style in series:
            ax.plot(xs, ys, style, label=label, lw=1.5, ms=4)
        for on, axis, scale in ((logx, ax.xaxis, ax.set_xscale), (logy, ax.yaxis, ax.set_yscale)):
            if on:  # plain numbers at 1, 2, 5 x 10^k (a range under a decade still gets labels), no minor ones
                scale('log')
                axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                axis.set_major_formatter(ScalarFormatter())
                axis.set_minor_formatter(NullFormatter())
        ticks = sorted({x for _, xs, _, _ in series for x in xs})
        if len(ticks) <= 8:  # a few shared x values (steps T, say): label each of them
            ax.set_xticks(ticks, [f'{t:g}' for t in ticks])
        _label(ax, subtitle, xlabel, ylabel if i % cols == 0 or not sharey else '', legend=False)
    fig.suptitle(title, fontsize=11)
    legend_below(fig)  # one legend for every panel, under them all
    _save(plt, fig, path, rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))  # the top 0.3 inch: the title's


LOG_FIELDS = ('iter', 'tokens')  # what every eval record of train.py's log.jsonl holds, and its readers index


def read_log(path):
    """train.py's log.jsonl as a list of dicts (a line cut short by a kill is left out, a line that is no eval
    record refused: paths.read_jsonl)."""
    from aogpt.paths import read_jsonl
    return read_jsonl(path, LOG_FIELDS)[0]


def plot_log(log_path, png, title=None):
    """Loss curves of one run: train loss, and every val loss it logged (L2R, any-order, its own order,
    the encoder's ELBO), against training tokens. Returns False when there is nothing to draw yet."""
    recs = read_log(log_path)
    names = [('train_loss', 'train (objective)', 'k-'), ('val_l2r', 'val L2R', 'o-'),
             ('val_ao', 'val any-order', 's-'), ('val_order', 'val, training order', '^-'),
             ('val_elbo', 'val ELBO', 'd-')]
    series = []
    for key, label, style in names:
        pts = [(r['tokens'], r[key]) for r in recs if r.get(key) is not None and math.isfinite(r[key])]
        if pts:
            series.append((label, [t for t, _ in pts], [v for _, v in pts], style))
    if not series:
        return False
    title = title or os.path.basename(os.path.dirname(os.path.abspath(log_path)))
    curves(png, title, series, ylabel='loss (nats/token)')
    return True


def plot_eval(record, png):
    """eval_ppl.py's table as grouped bars: one group per dataset, one bar per column (log scale, PPL)."""
    plt = _pyplot()
    spec = record.get('order') or record.get('order_mode')  # order_mode: records written before --order
    cols = [('l2r', 'L2R'), ('any_order', 'any-order (bound)'), ('order', f"{spec or 'order distribution'} (bound)"),
            ('ensemble', 'ensemble (bound)')]
    rows = list(record['datasets'].items())
    cols = [(k, label) for k, label in cols if any(r.get(k) for _, r in rows)]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(rows) + 2), 3.6))
    width = 0.8 / max(1, len(cols))
    for j, (key, label) in enumerate(cols):
        xs = [i + (j - (len(cols) - 1) / 2) * width for i in range(len(rows))]
        ys = [r[key]['ppl'] if r.get(key) else float('nan') for _, r in rows]
        bars = ax.bar(xs, ys, width, label=label)
        ax.bar_label(bars, fmt='%.1f', fontsize=7)
    ax.set_xticks(range(len(rows)), [name for name, _ in rows])
    ax.set_yscale('log')
    title = f"{record.get('model', '')} {os.path.basename(str(record.get('checkpoint', '')))}".strip()
    finish(plt, fig, ax, png, title, 'dataset', 'perplexity (lower is better)')


def main(out_dir):
    done = []
    log = os.path.join(out_dir, 'log.jsonl')
    if os.path.exists(log) and plot_log(log, os.path.join(out_dir, 'loss.png')):
        done.append(os.path.join(out_dir, 'loss.png'))
    ev = os.path.join(out_dir, 'eval_ppl.json')
    if os.path.exists(ev):
        plot_eval(json.load(open(ev)), os.path.join(out_dir, 'eval_ppl.png'))
        done.append(os.path.join(out_dir, 'eval_ppl.png'))
    if not done:
        from aogpt.errors import UserError
        raise UserError(f"nothing to plot in {out_dir} (no log.jsonl with evals, no eval_ppl.json)")
    print('wrote ' + ', '.join(done))


if __name__ == '__main__':
    if not __package__:  # run as a file (python aogpt/plot.py): the repository's root in aogpt/'s place
        sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from aogpt.configurator import stop_on_ctrl_c
    from aogpt.errors import command
    stop_on_ctrl_c('no plot was half written (each is written whole, then moved into place)')
    if len(sys.argv) != 2 or sys.argv[1].startswith('-'):
        asked = sys.argv[1:] in (['-h'], ['--help'])  # asked for: stdout and status 0, as argparse does
        print("usage: python -m aogpt.plot OUT_DIR   (draws OUT_DIR/loss.png and OUT_DIR/eval_ppl.png)",
              file=sys.stdout if asked else sys.stderr)
        raise SystemExit(0 if asked else 2)
    command(main)(sys.argv[1])
