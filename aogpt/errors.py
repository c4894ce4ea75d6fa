"""The one exception type of the library, bad input a user can fix, and how a command reports it.

Library code raises UserError with the one line a command prints for it ("error: " + the message) and
never exits the process, so a notebook or another program can catch it. Each command turns it into that
line and its exit status (`code`: 1, or 2 for a malformed command line), in one of two ways:

    @command                 # a command's main(): a UserError from anywhere below it is die(msg, code)
    def main(argv=None): ...

    exit_in_one_line()       # a linear script (no main to wrap): from here on, an uncaught UserError is too

train.py, a linear script that must also let go of its out_dir, wraps its start-up calls in `with run.failing():`
(rundir.py), which ends in run.fail's line. die(msg) is that line and exit, for a command's own refusals.
"""

if __name__ == '__main__':  # run as a script (python aogpt/errors.py): one line, not an ImportError
    raise SystemExit("error: aogpt/errors.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import functools
import json
import os
import sys
import time


class UserError(ValueError):
    def __init__(self, msg, code=1):
        super().__init__(msg)
        self.msg, self.code = msg, code


def first_line(e, limit=200):
    """An exception's message cut to its first line (or its type when it has none): what a one-line
    error says of a failure deep inside a library."""
    text = str(e).strip()
    if not text:
        return type(e).__name__
    line = text.splitlines()[0]
    return line if len(line) <= limit else line[:limit].rsplit(' ', 1)[0] + ' ...'  # cut between words, and say so


def tell_torchrun(line):
    """Under torchrun, write our error line where it prints a worker's root cause: the last entry of its
    failure report (without it: a pointer to its docs). The layout is its own error handler's, our line the
    traceback. Nothing happens outside torchrun."""
    if os.environ.get('TORCHELASTIC_ERROR_FILE'):
        try:
            with open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w') as f:
                json.dump(dict(message=dict(message=line, extraInfo=dict(py_callstack=line,
                                                                         timestamp=str(int(time.time()))))), f)
        except OSError:
            pass  # the line on stderr is what matters


def die(msg, code=1):
    """One clear line on stderr and a non-zero exit: how the scripts report bad input."""
    tell_torchrun(f"error: {msg}")
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(code)


def out_of_memory(e):
    """Whether e is running out of memory: a GPU's OutOfMemoryError, torch's CPU allocator's failure (a
    RuntimeError of its own wording), or Python's and numpy's MemoryError (a batch gathered on the host)."""
    torch = sys.modules.get('torch')  # nothing to ask if torch was never imported
    return ((torch is not None and isinstance(e, torch.OutOfMemoryError)) or isinstance(e, MemoryError)
            or (isinstance(e, RuntimeError) and "can't allocate memory" in str(e)))


def command(main):
    """A command's main(): a UserError raised anywhere below it ends the command as die() does, with its one
    line (on stderr, and in torchrun's report) and its exit status; so does running out of memory, with the
    allocator's first line and what to change. Called from code (the tests do), main() then raises SystemExit, as
    the command would exit."""
    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as e:
            die(e.msg, e.code)
        except (RuntimeError, MemoryError) as e:
            if not out_of_memory(e):
                raise
            die(f"out of memory ({first_line(e, 160)}): run with smaller batches (this command's --batch_size, and "
                f"the like) or on a device with more memory")
    return run


def exit_in_one_line():
    """For a linear script (data/*/prepare.py, bench/): from here on, a UserError nothing catches ends the process
    as die() does (the SystemExit raised in the hook sets the exit status), any other exception as before."""
    previous = sys.excepthook

    def hook(kind, e, tb):
        if isinstance(e, UserError):
            die(e.msg, e.code)
        previous(kind, e, tb)
    sys.excepthook = hook
