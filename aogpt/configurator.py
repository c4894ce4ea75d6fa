"""
nanoGPT's "poor man's configurator", with its sharp edges fixed. A script declares its defaults as
plain module-level globals (lowercase names), then calls

    config = configure(globals())        # a linear script (train.py): its globals become the config
    c = namespace(globals(), argv)       # a script whose main() is also called from code: c.key

which applies, in command-line order, Python config files (`python train.py config/x.py`) and
`--key=value` / `--key value` overrides, then writes the results back into the dict it was given.

What nanoGPT did not do and this does:
  * an unknown key, in a config file or on the command line, is an error naming the nearest valid key;
  * every value is checked against its key's type: the default's type, or for a key whose default is
    None the annotation written beside it (`vocab_size: int = None`); ints are accepted for floats;
    a float must be finite, and a key named `seed` is an integer in [0, 2**32) in every script;
  * a string key takes its value as text, never evaluated (`--prompt="[1, 2]"` is that text);
  * a boolean key given alone means True (`--fixed_counts`, like argparse's store_true); booleans may be
    written True/False, yes/no, on/off or 1/0;
  * `--help` lists every key with its default and the comment written beside it in the script;
  * every error is one line on stderr and exit status 2, never a traceback.

configure() is the command line's parser, called first thing by a command, so like argparse.parse_args it ends
the process itself: status 2 for a malformed command line or config file, 0 after --help.
"""

if __name__ == '__main__':  # run as a script (python aogpt/configurator.py): one line, not an ImportError
    raise SystemExit("error: aogpt/configurator.py is a library module, with nothing to run: the commands are "
                     "train.py, sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import ast
import difflib
import math
import os
import re
import signal
import sys
from types import SimpleNamespace

from aogpt.errors import UserError, die

_SIMPLE = (int, float, bool, str, tuple, list, type(None))
# Every script's `seed` takes the range all its consumers accept: numpy's legacy seeding (lm-eval's
# numpy_random_seed) stops at 2**32, and SeedSequence (train.py's counter-based draws) refuses negatives.
SEED_LIMIT = 2 ** 32


def _keys(g):
    """The config keys among a script's globals: lowercase names bound to simple values (UPPERCASE names
    are the script's constants, _private ones its helpers)."""
    return {k: v for k, v in g.items() if k[:1].islower() and isinstance(v, _SIMPLE) and not callable(v)}


def _nearest(key, keys):
    m = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    return f" (did you mean '{m[0]}'?)" if m else ""


_BOOL_WORDS = {'true': True, 'yes': True, 'on': True, '1': True, 'false': False, 'no': False, 'off': False,
               '0': False}


def _types(g, defaults):
    """Each key's type: its default's, or for a None default the type annotated beside it (None: any)."""
    notes = g.get('__annotations__') or {}
    out = {}
    for k, v in defaults.items():
        t = type(v) if v is not None else notes.get(k)
        args = [a for a in getattr(t, '__args__', ()) if a is not type(None)]  # int | None -> int
        out[k] = args[0] if len(args) == 1 else t if isinstance(t, type) else None
    return out


def _coerce(key, value, typ, source):
    """Check (and where safe convert) a new value against the key's type (None: anything goes)."""
    if typ is None or value is None:
        return value
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise UserError(f"{source}: {key} must be True or False, got {value!r}", 2)
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is tuple and isinstance(value, list):
        return tuple(value)
    if typ is int and isinstance(value, float) and value.is_integer():
        value = int(value)  # 1e3 for 1000, checked below as any integer
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise UserError(f"{source}: {key} expects {typ.__name__}, got {type(value).__name__} "
                        f"{_short(value)}", 2)
    if typ is float and not math.isfinite(value):  # 1e999 parses as inf; a config file can say float('nan')
        raise UserError(f"{source}: {key} must be a finite number, got {value!r}", 2)
    if key == 'seed' and not 0 <= value < SEED_LIMIT:
        raise UserError(f"{source}: seed must be an integer in [0, 2**32), got {_short(value)}", 2)
    if typ is int and not -2 ** 63 <= value < 2 ** 63:  # torch's sizes and counts are int64: past it, an OverflowError
        raise UserError(f"{source}: {key} must be an integer below 2**63 (torch's int64), got {_short(value)}", 2)
    return value


def _short(value):
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + '...'


def _parse_value(text, typ, nullable):
    """A command-line value for a key of type typ: text for str keys, a literal otherwise; 'None' only
    for a key whose default is None."""
    low = text.strip().lower()
    if low == 'none' and nullable:
        return None
    if typ is str:
        return text
    if typ is bool and low in _BOOL_WORDS:
        return _BOOL_WORDS[low]
    if low in ('true', 'false'):
        return low == 'true'
    try:
        return ast.literal_eval(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        pass
    if typ in (int, float):  # nan, inf, -Infinity: Python's own float words, not literals; _coerce says they
        try:                 # are not finite (not "expects float, got str")
            return float(text)
        except ValueError:
            pass
    return text  # a bare word, e.g. --device=cuda; a typed key then rejects it in _coerce


def _help_text(g, defaults):
    """`--help`: the script's docstring, then each key, its default and its source comment."""
    comments, key = {}, None
    path = g.get('__file__')
    if path and os.path.exists(path):
        for line in open(path):
            m = re.match(r'^(\w+)\s*(?::[^=]*)?=\s*.*?#\s*(.*)$', line)
            more = re.match(r'^\s+#\s*(.*)$', line)  # a comment carried on under the key's own
            if m and m.group(1) in defaults:
                key = m.group(1)
                comments[key] = m.group(2).strip()
            elif more and key:
                comments[key] += ' ' + more.group(1).strip()
            else:
                key = None
    out = []
    doc = (g.get('__doc__') or '').strip()
    if doc:
        out += [doc, '']
    out.append('usage: python %s [config/file.py ...] [--key=value | --key value ...]' %
               os.path.basename(path or 'script.py'))
    out.append('')
    width = max(len(k) for k in defaults) if defaults else 0
    for k, v in defaults.items():
        c = comments.get(k, '')
        out.append(f"  --{k.ljust(width)}  {v!r:<24} {c}".rstrip())
    return '\n'.join(out)


def configure(g, argv=None, given=None, moved=None):
    """Apply config files and overrides from argv to the globals dict g; return the resolved config.
    given: a set that receives the keys the config files and the command line set (a default is not asked
    for, so only these may contradict what a checkpoint holds). moved: (keys, line) for keys a script no longer
    has: settings of them ({key: value}, all those of one config file or one command line) are refused with
    line(settings), which names their new form."""
    argv = sys.argv[1:] if argv is None else argv
    given = set() if given is None else given
    old_keys, old_line = moved or ((), None)
    defaults = _keys(g)
    types = _types(g, defaults)
    cfg = dict(defaults)
    try:
        i = 0
        while i < len(argv):
            arg = argv[i]
            if arg in ('-h', '--help'):
                print(_help_text(g, defaults))
                raise SystemExit(0)
            if not arg.startswith('--'):
                if not arg.endswith('.py'):
                    raise UserError(f"unexpected argument {arg!r}: give config files (*.py) or --key=value", 2)
                if not os.path.exists(arg):
                    raise UserError(f"config file not found: {arg}", 2)
                ns = {}
                try:
                    exec(compile(open(arg).read(), arg, 'exec'), ns)
                except Exception as e:  # a broken config file is one line, not a traceback
                    raise UserError(f"{arg}: {type(e).__name__}: {e}", 2)
                old = {k: v for k, v in ns.items() if k in old_keys}
                if old:
                    raise UserError(f"{arg}: {old_line(old)}", 2)
                for k, v in ns.items():
                    if k.startswith('_') or not isinstance(v, _SIMPLE):
                        continue  # imports, helpers
                    if k not in defaults:
                        raise UserError(f"{arg}: unknown config key '{k}'{_nearest(k, defaults)}", 2)
                    cfg[k] = _coerce(k, v, types[k], arg)
                    given.add(k)
                i += 1
                continue
            body = arg[2:]
            key, has_value, val = body.partition('=')
            key = key.replace('-', '_')
            if key in old_keys:
                raise UserError(_moved_on_command_line(argv, old_keys, old_line, types), 2)
            if key not in defaults:
                raise UserError(f"unknown config key '--{key}'{_nearest(key, defaults)}; "
                                f"see --help for the list", 2)
            i += 1
            if not has_value:
                nxt = argv[i] if i < len(argv) else None
                if types[key] is bool and (nxt is None or nxt.startswith('--') or nxt.endswith('.py')):
                    val = 'True'  # a flag given alone
                elif nxt is None:
                    raise UserError(f"--{key} needs a value (--{key}=VALUE or --{key} VALUE)", 2)
                else:
                    val = nxt
                    i += 1
            val = _parse_value(val, types[key], defaults[key] is None)
            cfg[key] = _coerce(key, val, types[key], 'command line')
            given.add(key)
    except UserError as e:  # the command line's parser ends the command (status 2), as argparse does
        die(e.msg, e.code)
    g.update(cfg)
    return cfg


def _moved_on_command_line(argv, old_keys, line, types):
    """line() of every old key on the command line, with its value (--key=value or --key value)."""
    old = {}
    for i, arg in enumerate(argv):
        key, has_value, val = arg[2:].partition('=') if arg.startswith('--') else ('', '', '')
        key = key.replace('-', '_')
        if key in old_keys:
            val = val if has_value else (argv[i + 1] if i + 1 < len(argv) else '')
            old[key] = _parse_value(val, object, False)  # a literal (0.3, 4) or the bare word
    return line(old)


def namespace(g, argv=None, moved=None):
    """configure() for a script whose main() may run more than once in a process (eval_ppl, sample,
    reproduce: the tests call them): the module's defaults stay untouched, and the resolved config comes
    back as a namespace, c.key, with the plain dict in c.config (for printing and saving) and the keys the
    config files and the command line set in c.given (an option given on purpose can then be refused where it
    would be ignored)."""
    given = set()
    cfg = configure(dict(g), argv, given, moved)
    return SimpleNamespace(**cfg, config=cfg, given=given)


def split_list(key, text, typ=str, ok=lambda v: True, what=None):
    """A comma-separated setting (--seeds=1337,2, --steps=16,32,64) as a list of typ, each value checked by ok:
    a value that does not parse or pass is one line naming the key, not a traceback from int() or a KeyError."""
    parts = [p.strip() for p in str(text).split(',')]
    try:
        values = [typ(p) for p in parts]
    except ValueError:
        values = None
    if values is None or not all(ok(v) and (typ is not float or math.isfinite(v)) for v in values):
        raise UserError(f"--{key} must be a comma-separated list of {what or typ.__name__ + 's'}, got {text!r}", 2)
    return values


def seed_list(key, text):
    """A findings script's seeds (--seeds=1337,2): distinct integers in [0, 2**32). The one check every script
    that trains a run per seed uses: a seed given twice is one run counted twice, a seed spread of zero reported
    as the spread of two seeds (a UserError naming the key)."""
    seeds = split_list(key, text, int, lambda s: 0 <= s < SEED_LIMIT, 'seeds in [0, 2**32)')
    if len(set(seeds)) < len(seeds):
        raise UserError(f"--{key} must be different seeds, got {text!r}: a seed given twice is one run counted twice",
                        2)
    return seeds


def print_config(cfg, file=None):
    """The resolved config, one key per line, so a log records exactly what ran."""
    width = max(len(k) for k in cfg) if cfg else 0
    print('config:', file=file)
    for k, v in cfg.items():
        print(f"  {k.ljust(width)} = {v!r}", file=file)


_first_signal = [None]  # the first SIGINT or SIGTERM since the handlers were set (None: none yet)
_order_pipe = []  # (read, write): the signals' numbers in the order they came (signal.set_wakeup_fd)


def stop_on_ctrl_c(what):
    """From here on, Ctrl-C is one line and exit status 130, as a shell expects, not a KeyboardInterrupt
    traceback of 50-90 lines; SIGTERM (kill, a job scheduler, `timeout`) the same line and 143, not a silent
    death. Raised as SystemExit, so `finally` blocks, temp-file cleanups and child processes' ends still run.
    Called from a script's __main__ only: a caller that runs main() in-process keeps its own handlers."""
    _catch(what)


def stop_at_safe_points():
    """train.py's form of stop_on_ctrl_c: the handler only records the signal, and the script asks
    stop_requested() at its safe points (between steps, between val batches, after a checkpoint write) and ends
    there, in its own words. Ending from inside the handler, wherever the main thread happens to be, can cut a
    write in half, let go of a lock while a write still needs it, or raise SystemExit inside a callback that
    swallows it and trains on."""
    _catch(None)


def ignore_signals():
    """The process is ending: later Ctrl-Cs and SIGTERMs are ignored by the OS, also through the interpreter's
    teardown (seconds, with torch loaded), where Python puts back the default action of every signal it still
    handles and one more would kill the process with another status. Called from the main flow, never from the
    handler. A signal that the OS hands to a thread while the disposition changes (after signal.signal's own
    check of pending signals, before the kernel's SIG_IGN) is left caught with no Python handler to run, and
    Python writes it to stderr as a 5-line 'OSError: Signal 2 ignored due to race condition' traceback after
    the run's one line (1 run in some hundreds of back-to-back Ctrl-Cs). Ignoring it is what was asked, so that
    report, and only that one, is dropped here."""
    hook = sys.unraisablehook

    def quiet(report):
        if not (isinstance(report.exc_value, OSError) and 'ignored due to race condition' in str(report.exc_value)):
            hook(report)
    sys.unraisablehook = quiet
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _handle_pending()
    finally:
        sys.unraisablehook = hook


def _handle_pending():
    """A Python call: Python runs the handlers of pending signals on entering it."""


def stop_requested():
    """The signal number of the first Ctrl-C (SIGINT) or SIGTERM since the handlers were set, or None."""
    return _first_signal[0]


def _catch(what):
    """Set the handler of both signals. The first signal wins: a second one (Ctrl-C twice, a Ctrl-C then
    `timeout`'s SIGTERM, a SIGTERM to a process group and then to each of its children) is ignored, so the
    line is said once, the exit status is the first signal's, and the cleanup the first one started runs to its
    end (SIGKILL still ends a process whose cleanup hangs). Through the interpreter's teardown only where the
    script calls ignore_signals (train.py's Run.stop). what: the line's text after 'interrupted: '; None: only
    record the signal."""
    owner = os.getpid()
    _first_signal[0] = None
    # Python runs the handlers of signals pending together in signal-number order, so a SIGTERM that came a
    # microsecond before a SIGINT would be handled second; the wakeup fd receives each number as it comes.
    for fd in _order_pipe:
        os.close(fd)  # a second call in one process (tests run scripts in-process)
    _order_pipe[:] = os.pipe()
    for fd in _order_pipe:
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(_order_pipe[1], warn_on_full_buffer=False)

    def stop(signum, frame):
        if os.getpid() != owner:  # a forked worker (a pool being shut down): die as if no handler were set
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if _first_signal[0] is not None:
            return
        try:
            came = os.read(_order_pipe[0], 256)
        except OSError:  # empty: another user of the wakeup fd (an asyncio loop) has it now
            came = b''
        signum = next((s for s in came if s in (signal.SIGINT, signal.SIGTERM)), signum)
        _first_signal[0] = signum
        if what is None:
            return
        word = 'interrupted' if signum == signal.SIGINT else 'terminated'
        print(f"\n{word}: {what}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    os.register_at_fork(after_in_child=_default_signals)


def die_with_parent(parent):
    """In a worker process (a prepare pool's): the kernel kills it when its parent dies (Linux's PR_SET_PDEATHSIG),
    even while it waits idle on a queue whose write end its siblings keep open; a SIGKILLed prepare left such a
    worker waiting forever. parent: the parent's pid, read before the fork (it may already be gone)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: prepare_shards.advance's own check of the parent still stops a busy worker
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def _default_signals():
    """In a forked child (a prepare pool's worker): Ctrl-C and SIGTERM kill it at once, as if no handler had been
    set. A Python-level handler inherited from the parent could miss the signal: a Pool worker given SIGTERM by
    pool.terminate() while blocked on the task queue's lock sometimes lived on, and the parent waited forever in
    terminate's join (about 1 run in 50 of a 2-process prepare)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # forked from a thread other than the main one: the handler's own owner check still holds
        pass
