"""
Where a command writes, checked before the work that fills it: a bad --save, --json_out or --runs_dir must
cost one line, not a sampling run, an evaluation or an hour of training (check_writable, make_folder: both
raise UserError). And the writes themselves, whole or not at all: atomic_write for a file (atomic_json for
JSON), atomic_folder for a folder, append_jsonl for a record added to a .jsonl history, read_jsonl to read one
back; temp_path and is_temp name what a killed writer leaves behind. Torch-free, so data/*/prepare.py can use them.
"""

if __name__ == '__main__':  # run as a script (python aogpt/paths.py): one line, not an ImportError
    raise SystemExit("error: aogpt/paths.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import errno
import json
import os
import shutil

from aogpt.errors import UserError, first_line


def _nearest_existing(path):
    """The nearest folder on path that exists: where a write or a mkdir would start."""
    up = os.path.abspath(path)
    while not os.path.exists(up):
        up = os.path.dirname(up)
    return up


def check_writable(path, flag, example, create=False, given=True):
    """A file a command will write (--save, --trace, --json_out, --out). create: missing folders will be made
    (atomic_write makes them), so only a file in the way or an unwritable folder is refused. given=False:
    the path is the command's default (beside the checkpoint), which the message says."""
    why = _unwritable_file(path, flag, example, create)
    if why:
        raise UserError(why if given else f"{why} (where the record goes by default, beside the checkpoint): "
                                          f"pass --{flag} FILE")


def _unwritable_file(path, flag, example, create):
    if os.path.isdir(path):
        return f"--{flag} {path} is a folder: name a file in it, e.g. --{flag} {os.path.join(path, example)}"
    d = os.path.dirname(os.path.abspath(path))
    up = _nearest_existing(d)
    if not os.path.isdir(up):
        return (f"--{flag} {path}: the folder {d} is a file, not a folder" if up == d else
                f"--{flag} {path}: {up} is a file, so the folder {d} cannot be made")
    if up != d and not create:
        return f"--{flag} {path}: the folder {d} does not exist; create it first"
    if not os.access(up, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"--{flag} {path}: not writable"
    return None


def make_folder(path, flag):
    """os.makedirs for a folder a command fills (--runs_dir, --results_dir, a dataset's --out_dir): a file in
    the way, or a folder this user may not write, is one line."""
    up = _nearest_existing(path)
    if not os.path.isdir(up):
        raise UserError(f"--{flag} {path} is a file, not a folder" if up == os.path.abspath(path) else
                        f"--{flag} {path}: {up} is a file, so that folder cannot be made")
    if not os.access(up, os.W_OK):
        raise UserError(f"--{flag} {path}: {up} is not writable")
    os.makedirs(path, exist_ok=True)


def temp_path(path):
    """The temp name beside `path` that atomic_write and atomic_folder fill before their rename: hidden, and
    owned by this process (two writers of one file never share a temp)."""
    path = os.path.abspath(path)
    return os.path.join(os.path.dirname(path), f'.{os.path.basename(path)}.tmp.{os.getpid()}')


def is_temp(name):
    """Is this file name (no folder) one that temp_path makes? What a killed writer leaves behind; cleaners
    of a folder remove such names and nothing else."""
    head, sep, pid = name.rpartition('.tmp.')
    return name.startswith('.') and bool(sep) and len(head) > 1 and pid.isdigit()


def _fsync_folder(d):
    try:  # make a rename in d durable
        fd = os.open(d, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    except OSError:
        pass


def atomic_write(path, write, mode='wb'):
    """write(f) into a temp file beside `path`, fsync, then rename: a kill or a full disk mid-write never leaves
    half a file at `path`, nor the temp file. A failed write raises OSError, whichever layer noticed it.
    Every file a command or a prepare script writes whole goes through here (atomic_folder for a folder)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = temp_path(path)
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:  # also Ctrl-C: the temp file goes
        try:
            os.remove(tmp)
        except OSError:
            pass
        if isinstance(e, RuntimeError):  # torch's zip writer reports a full disk so, at some sizes
            raise OSError(f"the write failed ({first_line(e, 120)}): is the disk full?") from e
        raise
    os.replace(tmp, path)
    _fsync_folder(d)


def atomic_json(path, obj, indent=1):
    """obj as JSON at path, through atomic_write."""
    atomic_write(path, lambda f: json.dump(obj, f, indent=indent), 'w')


def atomic_folder(path, fill, carry=None):
    """fill(tmp) writes a folder's files into a temp folder beside `path`, which is then renamed to `path`: a
    kill, a full disk or an error in fill never leaves a half-filled folder at `path`, nor the temp folder.
    Without carry, `path` must be absent or empty when the rename comes (a folder filled meanwhile: OSError
    ENOTEMPTY, and `path` is left as it was). With carry, an existing folder at `path` is replaced: carry(old,
    tmp) first copies into tmp what of it should outlive the replacement, the old folder is moved aside, and
    put back if the rename fails. Raises what failed (OSError, or fill's own error) after cleaning up."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    tmp = temp_path(path)
    old = os.path.join(parent, f'.{os.path.basename(path)}.old.{os.getpid()}')
    try:
        os.makedirs(parent, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        fill(tmp)
        for f in os.listdir(tmp):  # the files' bytes on disk before the name points at them
            if os.path.isfile(os.path.join(tmp, f)):
                with open(os.path.join(tmp, f), 'rb') as fh:
                    os.fsync(fh.fileno())
        if carry is not None and os.path.isdir(path) and os.listdir(path):
            carry(path, tmp)
            os.rename(path, old)
        os.rename(tmp, path)  # onto nothing or an empty folder
    except BaseException:  # a full disk, no permission, a race, Ctrl-C: leave things as they were
        if os.path.exists(old) and not os.path.exists(path):
            os.rename(old, path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_folder(parent)
    shutil.rmtree(old, ignore_errors=True)


def append_jsonl(path, record, say=print):
    """Append record to a .jsonl history as one whole line or not at all: the line goes in one os.write, and a
    short or failed write (a full disk) is cut back off, so the file never ends mid-line and the next append
    is not glued onto a fragment. A last line without its newline is read by read_jsonl's rule: a whole record
    (an editor or `truncate` took only the newline) is kept and the newline written before the new line; a line
    cut short by a kill is dropped, and say() says so. A history that is a symbolic link (a run copied with
    `cp -as`) becomes a file of its own first: the copy's records must not grow the original's. A failed write
    raises OSError naming path."""
    line = (json.dumps(record) + '\n').encode()
    try:
        if os.path.islink(path):
            with open(path, 'rb') as f:
                data = f.read()
            atomic_write(path, lambda f: f.write(data))
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), path) from e
    try:
        end = os.fstat(fd).st_size
        if end and os.pread(fd, 1, end - 1) != b'\n':  # a last line without its newline
            data = os.pread(fd, end, 0)
            start = data.rfind(b'\n') + 1
            if not _whole(data[start:]):  # cut short: back to the last whole line
                os.ftruncate(fd, start)
                end = start
                say(cut_note(path))
            else:  # a whole record: it gets its newline in the same write as the new record
                line = b'\n' + line
        n = os.write(fd, line)
        if n != len(line):
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({n} of {len(line)} bytes written)")
    except OSError as e:
        try:
            os.ftruncate(fd, end)
        except OSError:
            pass
        raise OSError(e.errno, e.strerror or str(e), path) from e
    finally:
        os.close(fd)


def _whole(line):
    """Does a history's last line parse (read_jsonl keeps it then)? A line a kill cut short never does: a record
    is a JSON object, and its closing brace is its last byte."""
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def cut_note(path):
    """The one line said when a history's cut last line is dropped (read_jsonl's cut, append_jsonl)."""
    return f"{path} ended in a line cut short (a write that did not finish): dropped it"


def read_jsonl(path, needs=()):
    """The records of a .jsonl history, and whether its last line was cut short (a write a kill or a full disk
    interrupted; that line is left out, and the caller says cut_note). A last record without its newline is
    whole, and kept. The one reader of every history (train.py's log, the eval records), with one rule for a line
    that is no record: a bad line before the last is not a cut, and a line that is JSON but not an object holding
    the history's `needs` keys (a note added by hand) is not one of its records; either is a UserError naming the
    file and the line."""
    with open(path, 'rb') as f:
        lines = f.read().split(b'\n')
    out, cut = [], False
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            if i < len(lines) - 1 and any(l.strip() for l in lines[i + 1:]):
                raise UserError(f"{path}, line {i + 1}, is not a JSON record ({first_line(e, 80)}): the file was "
                                f"edited or damaged; remove that line, or the file")
            cut = True
            continue
        missing = [k for k in needs if k not in rec] if isinstance(rec, dict) else None
        if missing is None or missing:
            what = (f"has no {', '.join(repr(k) for k in missing)}" if missing else
                    f"is a JSON {type(rec).__name__}, not an object")
            raise UserError(f"{path}, line {i + 1}, is JSON but not a record of this history (it {what}): the file "
                            f"was edited; remove that line")
        out.append(rec)
    return out, cut

