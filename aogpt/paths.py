"""
Where a command writes, checked before the work that fills it: a bad --save, --json_out or --runs_dir must
cost one line, not a sampling run, an evaluation or an hour of training. (The writes themselves are
atomic: checkpoint.atomic_write.) Both raise UserError; torch-free, so data/*/prepare.py can use them.
"""

if __name__ == '__main__':  # run as a script (python aogpt/paths.py): one line, not an ImportError
    raise SystemExit("error: aogpt/paths.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")
import os

from aogpt.errors import UserError


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
