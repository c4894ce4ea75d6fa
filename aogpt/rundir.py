"""
A training run's hold on its out_dir (train.py, rank 0), and its way out from anywhere:

    run = Run(master)                            # run.say, run.fail, run.stop; run.bar, run.lock
    with run.failing():                          # a UserError inside is run.fail's line
        run.lock = claim_out_dir(out_dir, init_from, eval_only)   # made, locked, proven writable, not another run's
    rewind_out_dir(out_dir, log_path, start_iter, eval_only)   # as the checkpoint being resumed left it
    keep_copy(ckpt_path, iter_num)               # keep_ckpt_every: ckpt_<iter>.pt beside ckpt.pt, a hard link
    run.stop(line, stop_requested())             # at a safe point: after a Ctrl-C or SIGTERM, one line and exit
    run.lock = release_out_dir(run.lock)         # at the end; failed=True: a start that failed leaves nothing

While a run is live it holds an OS lock (flock) on out_dir/.lock, which names its pid and host: a second run on
the same out_dir is refused in one line. The OS drops the lock when the holder exits, however it dies, so a
killed run never blocks its resume. Without fcntl (Windows) runs go unlocked.
"""

if __name__ == '__main__':  # run as a script (python aogpt/rundir.py): one line, not an ImportError
    raise SystemExit("error: aogpt/rundir.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import json
import os
import socket
import sys
from collections import namedtuple
from contextlib import contextmanager

try:
    import fcntl
except ImportError:
    fcntl = None

from tqdm import tqdm

from aogpt import sharded
from aogpt.checkpoint import CKPT_NAME, is_export, run_checkpoints
from aogpt.configurator import ignore_signals
from aogpt.errors import UserError, die, tell_torchrun
from aogpt.paths import atomic_write, cut_note, is_temp, read_jsonl
from aogpt.plot import LOG_FIELDS

Lock = namedtuple('Lock', 'fd out_dir made')  # made: this run created out_dir (a failed start removes it again)


LOG_NAME, PLOT_NAME = 'log.jsonl', 'loss.png'  # beside CKPT_NAME: what a run writes in its out_dir


def check_room(out_dir, init_from, eval_only):
    """Refuse, before anything is written, a start that would destroy or mix into another run in out_dir: its
    checkpoints (ckpt.pt, the periodic copies) or the evals its log.jsonl holds (a run killed before its first
    checkpoint, an eval_only run). Only a resume (init_from=resume, or auto where checkpoints are held) may start
    there: the run it continues is the one already there. Every other start writes a new run (scratch, a
    fine-tune or adaptation from a checkpoint, an export, the paper's, GPT-2, or out_dir's own checkpoint, which
    would replace the file it came from), and train.py would empty the log and replace ckpt.pt; an eval_only run
    of another model would add its record to this run's log and redraw its plot. A UserError naming the folder and
    the way on. claim_out_dir's, under the out_dir lock."""
    held = run_checkpoints(out_dir)
    if init_from == 'resume' or (held and init_from == 'auto'):  # resume, nothing to resume: model_source's line
        return
    log = os.path.join(out_dir, LOG_NAME)
    try:
        records, _ = read_jsonl(log, LOG_FIELDS)
    except FileNotFoundError:  # no log
        records = []
    except (OSError, UserError):  # unreadable or not a log of ours: keep it, and say so below
        records = [None]
    evals = len(records)
    if not held and (not records or not eval_only and all(r is not None and r['iter'] == 0 for r in records)):
        return  # nothing logged, or only the step-0 eval of a run stopped before its first checkpoint: redone
    scratch = init_from in ('scratch', 'auto')
    doing = (f"evaluating {'a new model' if scratch else init_from} here (eval_only) would add its record to that "
             f"run's log and plot" if eval_only else "starting from scratch here would overwrite that run" if scratch
             else f"fine-tuning from {init_from} here would overwrite that run")
    if held:
        names = ', '.join(os.path.basename(h) for h in held[:3]) + (', ...' if len(held) > 3 else '')
        raise UserError(f"{out_dir} already holds checkpoints ({names}): {doing}; pick a fresh --out_dir, or continue "
                        f"that run with init_from=resume (or auto) (to start over here, delete them first)")
    raise UserError(f"{out_dir} already holds a run's log ({log}, {evals} eval{'s' * (evals != 1)}, no checkpoint "
                    f"to resume): {doing}; pick a fresh --out_dir (to start over here, delete that log first)")


def forget_run(out_dir):
    """Delete what a train.py run wrote in out_dir (its checkpoints, log and plot), for a caller that has decided
    to start that run over (findings' interrupted fine-tunes): the one way past check_room, said explicitly."""
    for path in run_checkpoints(out_dir) + [os.path.join(out_dir, LOG_NAME), os.path.join(out_dir, PLOT_NAME)]:
        if os.path.exists(path):
            os.remove(path)


def model_type(folder):
    """The model_type a folder's config.json names where it is a Hugging Face model's (transformers writes one), else
    None (no config.json, not JSON, an export of ours)."""
    try:
        with open(os.path.join(folder, 'config.json')) as f:
            kind = json.load(f).get('model_type')
    except (OSError, ValueError, AttributeError):
        return None
    return kind if isinstance(kind, str) and not is_export(folder) else None


def claim_out_dir(out_dir, init_from, eval_only):
    """Make out_dir, lock it, and prove it writable, all before the first step: a run must not learn at its
    first checkpoint that it cannot save one, nor share its directory with another live run, nor start over another
    run that is held there (check_room, under the lock, before the lock file is written) (a UserError)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"out_dir {out_dir} is a file, not a directory: pick another out_dir")
    if is_export(out_dir) and not os.path.exists(os.path.join(out_dir, CKPT_NAME)):
        # a run here would write its own ckpt.pt beside the export, and every --ckpt of the folder would then
        # load that new model instead of the exported one
        raise UserError(f"out_dir {out_dir} is an export folder (export.py's config.json + model.safetensors), not a "
                        f"run directory, so there is no run to resume and no room for a new one: to train on from "
                        f"these weights, fine-tune into a new run with --init_from={out_dir} --out_dir=<a new folder>")
    source = model_type(out_dir)
    if source and not os.path.exists(os.path.join(out_dir, CKPT_NAME)):
        # the run's ckpt.pt beside the source's files would make the folder a run directory: --init_from of it
        # would then mean the trained run, no longer the source it names
        raise UserError(f"out_dir {out_dir} is a Hugging Face model folder (its config.json: a {source}), not a run "
                        f"directory: train into a new folder, e.g. --init_from={out_dir} --out_dir=<a new folder>")
    made = not os.path.exists(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        if os.path.islink(os.path.join(out_dir, '.lock')):  # a run copied with `cp -as`: lock the copy, not the original
            os.remove(os.path.join(out_dir, '.lock'))
        new_lock = not os.path.exists(os.path.join(out_dir, '.lock'))
        fd = os.open(os.path.join(out_dir, '.lock'), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UserError(f"cannot write in out_dir {out_dir} ({e.strerror}): pick a directory you can write to")
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 200).decode(errors='replace').strip() or 'a process that has not said its pid yet'
            os.close(fd)
            raise UserError(f"out_dir {out_dir} is in use by another training run ({holder}): wait for it to end, or "
                            f"pick another out_dir")
    try:
        check_room(out_dir, init_from, eval_only)  # under the lock: a live run there is the line above, not this one
    except UserError:
        os.close(fd)
        if new_lock:
            os.remove(os.path.join(out_dir, '.lock'))
        raise
    lock = Lock(fd, out_dir, made)
    probe = os.path.join(out_dir, f'.write_test.{os.getpid()}')
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        with open(probe, 'wb') as f:
            f.write(b'x')
        os.remove(probe)
    except OSError as e:
        release_out_dir(lock, failed=True)
        raise UserError(f"cannot write in out_dir {out_dir} ({e.strerror}): checkpoints could not be saved there; pick "
                        f"a directory you can write to")
    return lock


def release_out_dir(lock, failed=False):
    """Let go of out_dir (closing the file releases the lock). failed: a start that failed leaves nothing, not
    an empty run: its lock file goes, and out_dir too if this run made it. Returns None, so that
    `lock = release_out_dir(lock)` lets go once however many ways the run ends (None: nothing held)."""
    if lock is None:
        return None
    if failed and os.listdir(lock.out_dir) == ['.lock']:
        os.remove(os.path.join(lock.out_dir, '.lock'))
        if lock.made:
            os.rmdir(lock.out_dir)
    os.close(lock.fd)
    return None


def rewind_out_dir(out_dir, log_path, start_iter, eval_only, say=print):
    """out_dir as the checkpoint being resumed left it: the temp files of a checkpoint save or a log rewrite that
    was killed mid-write go, and log.jsonl keeps only the evals up to start_iter (a run from scratch starts it
    empty), less a last line a kill cut short (said). The log is rewritten whole (atomic_write), never through
    a symbolic link: a run copied with `cp -as` gets a log of its own instead of rewriting the original's."""
    ours = (CKPT_NAME, os.path.basename(log_path))  # another writer's temp in out_dir (an eval record) stays
    for f in os.listdir(out_dir):
        if is_temp(f) and f[1:].rpartition('.tmp.')[0] in ours:
            os.remove(os.path.join(out_dir, f))
        elif f.startswith('.') and sharded.SAVE.fullmatch(f[1:].split('.tmp.')[0].split('.old.')[0]):
            sharded.clean(out_dir, f)  # a sharded save killed mid-write, or the one it replaced
    if start_iter > 0 and os.path.exists(log_path):  # drop evals logged after the checkpoint we resumed
        records, cut = read_jsonl(log_path, LOG_FIELDS)
        if cut:
            say(cut_note(log_path))
        kept = ''.join(json.dumps(r) + '\n' for r in records if r['iter'] <= start_iter)
        atomic_write(log_path, lambda f: f.write(kept), 'w')
    elif start_iter == 0 and not eval_only:
        atomic_write(log_path, lambda f: None, 'w')


def keep_copy(path, iter_num):
    """Keep the checkpoint at `path` also as ckpt_<iter>.pt beside it (train.py's keep_ckpt_every; found by
    run_checkpoints): a hard link, the same bytes with no second write, which survives the next os.replace."""
    keep = os.path.join(os.path.dirname(path), f'ckpt_{iter_num:07d}.pt')
    if os.path.exists(keep):
        os.remove(keep)
    os.link(path, keep)



class Run:
    """What ending a run needs, wherever it ends: whether this is rank 0 (the one that speaks), the progress
    bar while one is shown, and the out_dir lock. Bad input, a failed write and a Ctrl-C all end the same
    way: one line, the lock let go, no traceback, nothing half-written. A Ctrl-C or SIGTERM is only recorded
    when it comes (configurator.stop_at_safe_points); the run ends at its next safe point (stop)."""

    def __init__(self, master):
        self.master, self.bar, self.lock = master, None, None

    def say(self, *a):
        if self.master:
            if self.bar is not None:
                tqdm.write(' '.join(map(str, a)), file=sys.stdout)  # above the bar
                sys.stdout.flush()
            else:
                print(*a, flush=True)

    def fail(self, msg):
        """One clear line (from rank 0 only; every rank's goes to torchrun's error file) and exit: bad input
        must never cost a traceback."""
        if self.bar is not None:
            self.bar.close()
        self.lock = release_out_dir(self.lock, failed=True)
        if self.master:
            die(msg)
        tell_torchrun(f"error: {msg}")
        raise SystemExit(1)

    def stop(self, line, signum):
        """A safe point reached after a Ctrl-C (signum 2) or a SIGTERM (15), or nothing (signum None): the line
        (line() says where the run stands), the out_dir lock let go last, after the run's last write, and exit
        status 130 or 143 as a shell expects."""
        if not signum:
            return
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.master:
            print(line(), file=sys.stderr, flush=True)
        self.lock = release_out_dir(self.lock)
        ignore_signals()
        raise SystemExit(128 + signum)

    @contextmanager
    def failing(self):
        """Library calls at the start of a run: a UserError they raise ends the run as fail() does."""
        try:
            yield
        except UserError as e:
            self.fail(e.msg)
