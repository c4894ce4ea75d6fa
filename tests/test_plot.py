"""plot.py: every plot is a real PNG, drawn from the records the scripts write (nulls and all)."""
import json
import subprocess
import sys

import pytest

from aogpt import ROOT, plot

PNG = b'\x89PNG\r\n\x1a\n'


def is_png(path):
    data = open(path, 'rb').read()
    return data[:8] == PNG and len(data) > 5000


def test_curves_and_xy(tmp_path):
    t, a = [0, 1e5, 2e5, 3e5, 4e5, 5e5], [3.0, 2.5, 2.2, 2.1, 2.05, 2.0]
    plot.curves(tmp_path / 'c.png', 'curves', [('a', t, a, '-o'), ('b', t, [x + 0.1 for x in a], '--')])
    plot.xy(tmp_path / 'x.png', 'xy', [1, 2, 4], [('y', [3.0, 2.0, 1.5], '-o')], 'M', 'PPL', logy=True)
    assert is_png(tmp_path / 'c.png') and is_png(tmp_path / 'x.png')


def png_size(path):
    """(width, height) in pixels, from the PNG's IHDR chunk."""
    data = open(path, 'rb').read(24)
    return int.from_bytes(data[16:20], 'big'), int.from_bytes(data[20:24], 'big')


def test_panels_in_rows_keep_the_figure_title(tmp_path):
    """lines(): panels in rows of `cols`, and the figure's title in the PNG. The tight crop keeps only the artists
    it is given, and the title was once cut off every multi-panel figure: the same figure with a title must be
    taller than without one."""
    panel = ('p', [('a', [0, 1, 2], [3.0, 2.0, 1.5], '-'), ('b', [0, 2], [2.5, 2.5], 'k--')], 'steps', False)
    for title in ('', 'a title'):
        plot.lines(tmp_path / f'row{bool(title)}.png', title, [panel] * 3, 'loss')
        plot.lines(tmp_path / f'grid{bool(title)}.png', title, [panel] * 3, 'loss', cols=2)
    (w, h), (gw, gh) = png_size(tmp_path / 'rowFalse.png'), png_size(tmp_path / 'gridFalse.png')
    assert gw < w * 0.8 and gh > h * 1.6  # 3 panels as 2 rows of 2: narrower and about twice as tall
    for name in ('row', 'grid'):
        plain, titled = png_size(tmp_path / f'{name}False.png'), png_size(tmp_path / f'{name}True.png')
        assert titled[1] >= plain[1] + 15, (name, plain, titled)  # a line of 11-point text at 110 dpi is ~17 px


def test_loss_curves_from_a_log_with_nulls_and_a_torn_line(tmp_path):
    recs = [dict(iter=i, tokens=1000 * i, train_loss=None if i == 0 else 3 - 0.1 * i, val_l2r=2.9 - 0.1 * i,
                 val_ao=3.0 - 0.08 * i, val_order=None, val_elbo=None) for i in range(6)]
    log = tmp_path / 'log.jsonl'
    log.write_text(''.join(json.dumps(r) + '\n' for r in recs) + '{"iter": 6, "tok')  # killed mid-write
    assert plot.plot_log(log, tmp_path / 'loss.png') and is_png(tmp_path / 'loss.png')
    empty = tmp_path / 'empty.jsonl'
    empty.write_text('')
    assert plot.plot_log(empty, tmp_path / 'none.png') is False


def test_eval_table_and_the_command_line(tmp_path, capsys):
    row = lambda p: {'nll': 1.0, 'ppl': p}  # noqa: E731
    record = dict(model='AO-GPT', checkpoint='out', datasets={
        'ptb': dict(chunks=3, tokens=48, l2r=row(90.0), any_order=row(110.0), ensemble=row(100.0)),
        'lambada': dict(chunks=2, tokens=32, l2r=row(40.0), any_order=row(50.0), ensemble=None)})
    (tmp_path / 'eval_ppl.json').write_text(json.dumps(record))
    plot.main(str(tmp_path))
    assert is_png(tmp_path / 'eval_ppl.png') and 'eval_ppl.png' in capsys.readouterr().out
    p = subprocess.run([sys.executable, plot.__file__, str(tmp_path / 'nothing')], capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr.count('\n') == 1 and 'nothing to plot' in p.stderr


@pytest.mark.parametrize('argv', [[], ['a', 'b']])
def test_usage_is_one_line(argv):
    p = subprocess.run([sys.executable, plot.__file__, *argv], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count('\n') == 1 and 'usage' in p.stderr


def test_help_asked_for_is_the_usage_and_status_0():
    for argv in ([plot.__file__, '--help'], ['-m', 'aogpt.plot', '-h']):
        p = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 0 and p.stdout.startswith('usage') and not p.stderr, p.stderr
