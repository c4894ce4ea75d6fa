"""Writes on a full disk or into a read-only folder: one line naming the file, nothing cut or left behind.

The full disk is real where the suite may mount one (a 64 KiB tmpfs the test makes: helpers.small_fs); the
same code paths are also driven by a monkeypatched os.write, which needs no mount.
"""
import errno
import json
import os
import subprocess
import sys

import pytest
from helpers import fill, small_fs
from test_hub import make_run, one_line, run_export

from aogpt import paths, plot
from aogpt.checkpoint import save_record
from aogpt.errors import UserError
from aogpt.rundir import rewind_out_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def records(n, width=40):
    return [dict(iter=i, note='x' * width) for i in range(n)]


def test_a_full_disk_never_cuts_a_history_line(tmp_path):
    """eval_ppl's history append on a full disk left a cut line: the next record was glued onto it (and lost to
    every reader), and the error named eval_ppl.json, not the history that failed."""
    d = tmp_path / 'fs'
    with small_fs(d):
        hist = d / 'eval_ppl.jsonl'
        for r in records(3):
            paths.append_jsonl(str(hist), r)
        before = hist.read_bytes()
        fill(str(d), 1000)
        with pytest.raises(OSError) as e:
            paths.append_jsonl(str(hist), dict(iter=3, note='y' * 20000))  # more than is left
        assert e.value.errno == errno.ENOSPC and e.value.filename == str(hist)
        assert hist.read_bytes() == before  # whole lines only
        with pytest.raises(OSError) as e:
            save_record(str(d / 'eval_ppl.json'), dict(iter=4, note='z' * 20000))
        assert e.value.filename in (str(hist), str(d / 'eval_ppl.json')) and hist.read_bytes() == before
        os.remove(d / 'filler')
        paths.append_jsonl(str(hist), dict(iter=5))
        assert paths.read_jsonl(str(hist)) == (records(3) + [dict(iter=5)], False)


@pytest.mark.parametrize('written', [0, 7])
def test_a_failed_or_short_append_is_cut_back(tmp_path, monkeypatch, written):
    """The same without a mount: os.write fails (ENOSPC) or writes only part of the line."""
    hist = tmp_path / 'h.jsonl'
    for r in records(2):
        paths.append_jsonl(str(hist), r)
    before = hist.read_bytes()
    real = os.write

    def full(fd, data):
        if not written:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data[:written])
    monkeypatch.setattr(os, 'write', full)
    with pytest.raises(OSError) as e:
        paths.append_jsonl(str(hist), dict(iter=9))
    monkeypatch.undo()
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(hist) and hist.read_bytes() == before


def test_a_cut_last_line_is_reported_and_repaired(tmp_path):
    """A kill mid-append leaves a cut last line: a reader leaves it out and says so; the next append drops it
    rather than gluing its record onto it. A bad line in the middle is not a cut: one line naming it."""
    hist = tmp_path / 'log.jsonl'
    hist.write_text(''.join(json.dumps(r) + '\n' for r in records(2)) + '{"iter": 2, "no')
    assert paths.read_jsonl(str(hist)) == (records(2), True)
    paths.append_jsonl(str(hist), dict(iter=3))
    assert paths.read_jsonl(str(hist)) == (records(2) + [dict(iter=3)], False)
    hist.write_text('{"iter": 0}\n{"iter": 1, "no\n{"iter": 2}\n')
    with pytest.raises(UserError, match=r"log.jsonl, line 2, is not a JSON record"):
        paths.read_jsonl(str(hist))


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path):
    """Issue #48 G: two eval_ppl.py runs, `truncate -s -1` on the history (only its newline goes), a third run:
    the append took the whole last record for a cut one and dropped it without a word (2 records, not 3)."""
    said = []
    d = tmp_path / 'h'
    for i in range(2):
        save_record(str(d / 'e.json'), dict(iter=i), said.append)
    hist = d / 'e.jsonl'
    hist.write_bytes(hist.read_bytes()[:-1])
    assert paths.read_jsonl(str(hist)) == ([dict(iter=0), dict(iter=1)], False)
    save_record(str(d / 'e.json'), dict(iter=2), said.append)
    assert paths.read_jsonl(str(hist)) == ([dict(iter=i) for i in range(3)], False) and not said
    assert hist.read_bytes().endswith(b'}\n') and hist.read_bytes().count(b'\n') == 3


def test_a_truly_cut_last_line_is_dropped_with_one_note(tmp_path):
    said = []
    hist = tmp_path / 'e.jsonl'
    hist.write_text(json.dumps(dict(iter=0)) + '\n{"iter": 1, "val')
    paths.append_jsonl(str(hist), dict(iter=2), said.append)
    assert paths.read_jsonl(str(hist)) == ([dict(iter=0), dict(iter=2)], False)
    assert said == [f"{hist} ended in a line cut short (a write that did not finish): dropped it"]


@pytest.mark.parametrize('line,what', [('{"note": "x"}', "has no 'iter', 'tokens'"), ('[1, 2]', "is a JSON list")])
def test_a_json_line_that_is_no_record_of_the_log_is_one_line(tmp_path, line, what):
    """Issue #48 G: `{"note": "x"}` appended to log.jsonl made the resume fail with a KeyError traceback (the
    rewind indexed r['iter']); the plot of the log and any other reader took it too. Refused, naming the line."""
    log = tmp_path / 'log.jsonl'
    log.write_text(json.dumps(dict(iter=0, tokens=0)) + '\n' + line + '\n')
    for read in (lambda: rewind_out_dir(str(tmp_path), str(log), 10, False, lambda *a: None),
                 lambda: plot.read_log(str(log))):
        with pytest.raises(UserError) as e:
            read()
        assert e.value.msg.startswith(f"{log}, line 2, is JSON but not a record of this history (it {what}"), \
            e.value.msg
    assert json.loads(log.read_text().splitlines()[1]) == json.loads(line)  # nothing rewritten


def test_forget_run_is_the_one_way_past_check_room_and_takes_only_the_runs_files(tmp_path):
    """findings' train_runs starts an interrupted fine-tune (or a run with only a log) over with forget_run: the
    run's checkpoints, log and plot go, what the findings script keeps beside them stays."""
    from aogpt.rundir import check_room, forget_run
    for name in ('ckpt.pt', 'ckpt_0000002.pt', 'log.jsonl', 'loss.png', 'train.log', 'command.json'):
        (tmp_path / name).write_text('{"iter": 0, "tokens": 0}\n')
    with pytest.raises(UserError, match="already holds checkpoints"):
        check_room(str(tmp_path), '/elsewhere/ckpt.pt', False)
    forget_run(str(tmp_path))
    check_room(str(tmp_path), '/elsewhere/ckpt.pt', False)
    assert sorted(os.listdir(tmp_path)) == ['command.json', 'train.log']


def test_a_png_on_a_full_disk_is_one_line_and_leaves_no_temp_file(tmp_path):
    d = tmp_path / 'fs'
    with small_fs(d):
        log = d / 'log.jsonl'
        for i in range(4):
            paths.append_jsonl(str(log), dict(iter=i, tokens=i * 100, train_loss=3.0 - i / 4, val_l2r=3 - i / 5))
        fill(str(d), 2000)  # a loss plot takes tens of kB
        with pytest.raises(UserError, match=f"cannot write {d / 'loss.png'} "):
            plot.plot_log(str(log), str(d / 'loss.png'))
        assert sorted(os.listdir(d)) == ['filler', 'log.jsonl']


def test_plot_and_export_into_a_read_only_folder_are_one_line(tmp_path, capsys):
    """`python -m aogpt.plot` and export.py into a read-only folder gave tracebacks (savefig, makedirs)."""
    make_run(tmp_path / 'run')
    d = tmp_path / 'ro'
    with small_fs(d) as remount:
        for i in range(3):
            paths.append_jsonl(str(d / 'log.jsonl'), dict(iter=i, tokens=i * 100, val_l2r=3 - i / 5))
        remount('ro')
        p = subprocess.run([sys.executable, '-m', 'aogpt.plot', str(d)], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        err = p.stderr.strip()
        assert p.returncode == 1 and len(err.splitlines()) == 1 and f"cannot write {d / 'loss.png'}" in err, err
        one_line(capsys, lambda: run_export('--out_dir', str(tmp_path / 'run'), '--dest', str(d / 'hub')),
                 f"cannot write {d / 'hub'}", 'nothing was changed')
        assert sorted(os.listdir(d)) == ['log.jsonl']


# ------------------------------------------------------------------ the one home of whole writes: paths.py
KILLED_WRITER = """
import os, signal, sys
sys.path.insert(0, {root!r})
from aogpt import paths
def half(x):
    x.write(b'half of the new bytes')
    x.flush()
    os.kill(os.getpid(), signal.SIGKILL)   # no cleanup runs: what a kill -9 or an OOM kill leaves
if sys.argv[1] == 'file':
    paths.atomic_write(sys.argv[2], half)
else:
    def fill(tmp):
        open(os.path.join(tmp, 'a'), 'w').write('new')
        with open(os.path.join(tmp, 'b'), 'wb') as x:
            half(x)
    paths.atomic_folder(sys.argv[2], fill, carry=lambda old, tmp: None)
"""


@pytest.mark.parametrize('kind', ['file', 'folder'])
def test_a_killed_write_leaves_the_old_file_or_folder_and_a_temp_is_temp_knows(tmp_path, kind):
    """SIGKILL mid-write (no except clause runs): the old file or folder is untouched at its name; the temp
    left beside it is what is_temp (the cleaners' test) recognises, and nothing else there is."""
    target = tmp_path / 'x'
    if kind == 'file':
        target.write_bytes(b'old')
    else:
        target.mkdir()
        (target / 'a').write_text('old')
    p = subprocess.run([sys.executable, '-c', KILLED_WRITER.format(root=ROOT), kind, str(target)], timeout=60)
    assert p.returncode == -9
    assert (target.read_bytes() == b'old' if kind == 'file' else
            sorted(os.listdir(target)) == ['a'] and (target / 'a').read_text() == 'old')
    left = sorted(f for f in os.listdir(tmp_path) if f != 'x')
    assert len(left) == 1 and paths.is_temp(left[0]), left
    assert os.path.basename(paths.temp_path(str(target))).rpartition('.')[0] == left[0].rpartition('.')[0]
    assert not any(paths.is_temp(f) for f in ['x', 'x.tmp', '.x', 'train.bin.partial', '.x.tmp.', 'a.tmp.12'])


def test_an_interrupted_folder_write_puts_the_old_folder_back(tmp_path):
    """Ctrl-C while filling, or a failed rename, with carry (replace an existing folder): the old folder is
    back at its name with its files, and neither the temp folder nor the moved-aside one is left."""
    target = tmp_path / 'export'
    target.mkdir()
    (target / 'a').write_text('old')

    def interrupted(tmp):
        open(os.path.join(tmp, 'a'), 'w').write('new')
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        paths.atomic_folder(str(target), interrupted, carry=lambda old, tmp: None)
    assert os.listdir(tmp_path) == ['export'] and (target / 'a').read_text() == 'old'

    real = os.rename

    def fail_second(src, dst):  # the old folder is moved aside, then the new one cannot take its name
        if src.endswith(f'.tmp.{os.getpid()}'):
            raise OSError(errno.EACCES, 'Permission denied', dst)
        return real(src, dst)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(os, 'rename', fail_second)
        with pytest.raises(OSError):
            paths.atomic_folder(str(target), lambda tmp: open(os.path.join(tmp, 'a'), 'w').write('new'),
                                carry=lambda old, tmp: None)
    assert os.listdir(tmp_path) == ['export'] and (target / 'a').read_text() == 'old'
    paths.atomic_folder(str(target), lambda tmp: open(os.path.join(tmp, 'b'), 'w').write('new'),
                        carry=lambda old, tmp: None)
    assert os.listdir(target) == ['b']  # replaced whole: carry kept nothing
    with pytest.raises(OSError) as e:  # without carry a filled folder is never replaced
        paths.atomic_folder(str(target), lambda tmp: None)
    assert e.value.errno in (errno.ENOTEMPTY, errno.EEXIST) and os.listdir(tmp_path) == ['export']


def test_a_shard_cut_short_leaves_nothing_and_a_killed_ones_temps_are_cleaned(tmp_path):
    """data/prepare_shards: a shard whose texts fail midway leaves no ids, lens or json (so it is redone), and
    clean_temporaries removes exactly what a killed atomic_write leaves in the shard folder."""
    sys.path.insert(0, os.path.join(ROOT, 'data'))
    import prepare_shards as ps

    def texts():
        yield 'a first document'
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        ps.write_shard(str(tmp_path), 's0', 'k', texts())
    assert os.listdir(tmp_path) == [] and ps.read_shard(str(tmp_path), 's0', 'k') is None
    rec = ps.write_shard(str(tmp_path), 's1', 'k', iter(['one', 'two']))
    assert ps.read_shard(str(tmp_path), 's1', 'k') == rec and rec['docs'] == 2
    (tmp_path / 's2.ids').write_bytes(b'old')
    p = subprocess.run([sys.executable, '-c', KILLED_WRITER.format(root=ROOT), 'file', str(tmp_path / 's2.ids')],
                       timeout=60)
    assert p.returncode == -9 and len(os.listdir(tmp_path)) == 5
    ps.clean_temporaries(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ['s1.ids', 's1.json', 's1.lens', 's2.ids']


def test_a_resume_cleans_the_temps_its_own_writes_left_and_no_others(tmp_path):
    """A run killed mid-write leaves a temp of its checkpoint or of its log's rewrite; the resume removes both
    (paths.is_temp's names for the files train.py writes), and leaves another writer's temp in the folder (an
    eval record being written beside the checkpoint) alone."""
    from aogpt.rundir import rewind_out_dir
    own = [paths.temp_path(tmp_path / 'ckpt.pt'), paths.temp_path(tmp_path / 'log.jsonl'),
           str(tmp_path / '.log.jsonl.tmp.99999')]
    other = [str(tmp_path / '.eval.json.tmp.123'), str(tmp_path / '.ckpt.pt.tmp.notapid')]
    for p in own + other:
        open(p, 'w').close()
    log = tmp_path / 'log.jsonl'
    log.write_text(json.dumps(dict(iter=0, tokens=0)) + '\n' + json.dumps(dict(iter=5, tokens=50)) + '\n')
    rewind_out_dir(str(tmp_path), str(log), 2, False, say=lambda s: None)
    assert not any(os.path.exists(p) for p in own)
    assert all(os.path.exists(p) for p in other)
    assert [json.loads(x)['iter'] for x in log.read_text().splitlines()] == [0]
