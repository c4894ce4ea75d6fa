"""
The findings' record: the sections that findings with commands of their own (optimizers.py, orders.py, adapt.py,
length.py) write into results/README.md, and the check a record passes before any plot is redrawn from it.
"""

if __name__ == '__main__':  # run as a script (python findings/report.py): one line, not an ImportError
    raise SystemExit('error: findings/report.py is part of the findings pipeline, with nothing to run: run '
                     'findings/reproduce.py, optimizers.py or orders.py')
import json
import math
import os
import re
import resource

from aogpt.errors import die, first_line
from aogpt.paths import atomic_json, atomic_write

# findings whose own commands write these sections
SECTIONS = {9: 'f9_optimizers.md', 10: 'f10_orders.md', 11: 'f11_adapt.md', 12: 'f12_length.md'}
PLACE = '<!-- the section goes here -->'  # merge_section's placeholder while it edits the findings table
TITLE = '# Paper findings at small scale'  # the report's first line: a README.md without it is not ours to rewrite


def foreign_readme(results_dir):
    """The path of a README.md in results_dir that is not a findings report (a findings script would overwrite
    or append to it), else None."""
    path = os.path.join(results_dir, 'README.md')
    if not os.path.isfile(path):
        return None
    with open(path, encoding='utf-8', errors='replace') as f:
        return None if f.readline().startswith(TITLE) else path


def merge_section(path, n, sec):
    """Put finding n's section (as its command wrote it) into results/README.md, between its marks, replacing
    an earlier one, and its row (the section's line '| n | ...') into the findings table in number order.
    False when there is no README.md yet (reproduce.py writes it, then merges every section it finds)."""
    if not os.path.exists(path):
        return False
    mark, end = f'<!-- finding {n} -->', f'<!-- end of finding {n} -->'
    if not sec.startswith(mark):
        sec = f"{mark}\n{sec.strip()}\n{end}\n"
    text = open(path, encoding='utf-8').read()
    if mark in text and end in text:  # in its place, so a rerun of one finding keeps the sections' order
        before, after = text[:text.index(mark)].rstrip('\n'), text[text.index(end) + len(end):].lstrip('\n')
        text = before + '\n\n' + PLACE + '\n\n' + after
    else:
        text = text.rstrip('\n') + '\n\n' + PLACE
    lines = text.rstrip('\n').split('\n')
    row = next(ln for ln in sec.split('\n') if ln.startswith(f'| {n} | '))
    head = next((i for i, ln in enumerate(lines) if ln.startswith('| # | claim')), None)
    if head is not None:  # the findings table, the first of the report: its rows only (other tables number T, M)
        stop = head + 2
        while stop < len(lines) and lines[stop].startswith('|'):
            stop += 1
        rows = [ln for ln in lines[head + 2:stop] if not ln.startswith(f'| {n} | ')]
        at = next((i for i, ln in enumerate(rows) if _row_after(ln, n)), len(rows))
        lines = lines[:head + 2] + rows[:at] + [row] + rows[at:] + lines[stop:]
    text = '\n'.join(lines).replace(PLACE, sec.strip('\n')).rstrip('\n') + '\n'
    atomic_write(path, lambda f: f.write(text.encode('utf-8')))  # a kill mid-write keeps the old report
    return True


def _row_after(line, n):
    """Whether a findings-table row is numbered after n (rows are '| 5a | ...', '| 8 | ...', '| 10 | ...')."""
    num = re.match(r'\| (\d+)', line)
    return bool(num) and int(num.group(1)) > n


def nonfinite(d, at='the record'):
    """Where the first NaN or infinity in a JSON value is (a path like logs.ao[3].val_ao), or None."""
    if isinstance(d, float) and not math.isfinite(d):
        return at
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        where = nonfinite(v, f"{at}[{k}]" if isinstance(k, int) else k if at == 'the record' else f"{at}.{k}")
        if where:
            return where
    return None


def previous_verdicts(path, pick):
    """({id: verdict}, {id: verdict} before its last change) of the record at path as it stands before this run
    rewrites it ({} each if there is none or it cannot be read: a first run, or a record of an older shape).
    pick: the loaded record -> {id: verdict}."""
    try:
        with open(path, encoding='utf-8') as f:
            record = json.load(f)
        return ({str(k): v for k, v in pick(record).items()},
                {str(k): v for k, v in (record.get('verdicts_before') or {}).items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return {}, {}


def verdicts_against(path, pick, new):
    """(sentence, before): which verdicts (new: {id: verdict}) changed against the record at path, and the
    verdicts the record being written keeps as its `verdicts_before`. A rerun that judges as the record did (the
    section rewritten from the same runs, say) tells the change that record told, against the last record that
    judged otherwise, so a rewrite never erases what a wider spread overturned."""
    old, before = previous_verdicts(path, pick)
    if old == new and before and before != new:
        return verdict_changes(before, new, 'the last record that judged otherwise'), before
    return verdict_changes(old, new), old


def verdict_changes(old, new, against='the previous record'):
    """One sentence for a report: which verdicts changed against an earlier record (old, new: {id: verdict}),
    so that a rerun with more seeds says what the wider spread overturned."""
    if not old:
        return f"Verdicts against {against}: none to compare with (no earlier record here)."
    changed = [f"{k}: {old[k]} -> **{v}**" for k, v in new.items() if k in old and old[k] != v]
    same = [k for k, v in new.items() if k in old and old[k] == v]
    fresh = [k for k in new if k not in old]
    return (f"Verdicts against {against}: " + ('; '.join(changed) if changed else 'none changed')
            + (f"; unchanged: {', '.join(same)}" if same and changed else '')
            + (f"; new: {', '.join(fresh)}" if fresh else '') + '.')


def trained_cost(cpu_min, what='the runs it trained', reused='an earlier invocation'):
    """What an invocation cost, for a section's first line: the CPU-core-minutes of what it ran, or, when it ran
    nothing (every run reused), where the runs came from, not a cost of 0.0 that reads as the finding's."""
    if cpu_min >= 0.05:
        return f"{cpu_min:.1f} CPU-core-minutes for {what} (runs reused cost nothing here)"
    return f"every run reused from {reused}"


def children_cpu_minutes():
    """CPU-core-minutes (user + system) that this process's finished child processes (the training runs) used
    so far: the difference across a stage is what that stage cost."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r.ru_utime + r.ru_stime) / 60


def publish(c, n, md, d, record, section, figs, draw):
    """Write finding n, in the one order its scripts use: the record (a loss in it that is not finite is one line
    naming the runs_dir, where the diverged run's train.log is, and nothing is written), the figures drawn from the
    record (draw(c, d): they can be redrawn from it alone), the section (md, its lines), and the section merged into
    results_dir's README.md when there is one. Says what it wrote."""
    res = c.results_dir
    where = nonfinite(d)
    if where:
        die(f"a loss in the record is not finite ({where}): a run diverged; see its train.log in {c.runs_dir}")
    atomic_json(os.path.join(res, record), d)
    draw(c, d)
    atomic_write(os.path.join(res, section), lambda f: f.write('\n'.join(md)), 'w')
    merged = merge_section(os.path.join(res, 'README.md'), n, '\n'.join(md))
    print(f"\nwrote {res}/{record}, {', '.join(figs)}, {section}" + (" and its section in README.md" if merged else
                                                                     ""))


def redraw(c, n, record, draw, script):
    """--replot: finding n's figures drawn again from its record alone (one line if there is none, or it is not one
    of finding n's)."""
    path = os.path.join(c.results_dir, record)
    if not os.path.exists(path):
        die(f"no {path}: run `python findings/{script}` (or --quick) first")
    try:
        with open(path, encoding='utf-8') as f:
            draw(c, json.load(f))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, StopIteration) as e:  # not JSON, or not it
        die(f"{path} is not a readable finding-{n} record ({type(e).__name__}: {first_line(e, 120)}): run "
            f"`python findings/{script}` (or --quick) again to rewrite it")
