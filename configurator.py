"""
nanoGPT's "poor man's configurator", with its sharp edges fixed. A script declares its defaults as
plain module-level globals, then calls

    config = configure(globals())

which applies, in command-line order, Python config files (`python train.py config/x.py`) and
`--key=value` / `--key value` overrides, then writes the results back into the script's globals.

What nanoGPT did not do and this does:
  * an unknown key, in a config file or on the command line, is an error naming the nearest valid key;
  * ints are accepted for float keys; keys whose default is None take any Python literal (or a string);
  * `--help` lists every key with its default and the comment written beside it in the script;
  * every error is one line on stderr and exit status 2, never a traceback.
"""

import ast
import difflib
import os
import re
import sys

_SIMPLE = (int, float, bool, str, tuple, list, type(None))


class ConfigError(SystemExit):
    def __init__(self, msg):
        super().__init__(2)
        self.msg = msg


def _keys(g):
    return {k: v for k, v in g.items()
            if not k.startswith('_') and isinstance(v, _SIMPLE) and not callable(v)}


def _nearest(key, keys):
    m = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    return f" (did you mean '{m[0]}'?)" if m else ""


def _coerce(key, value, default, source):
    """Check (and where safe convert) a new value against the default's type."""
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ConfigError(f"{source}: {key} must be True or False, got {value!r}")
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(default, tuple) and isinstance(value, list):
        return tuple(value)
    if isinstance(default, int) and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, type(default)):
        raise ConfigError(f"{source}: {key} expects {type(default).__name__} (default {default!r}), "
                          f"got {type(value).__name__} {value!r}")
    return value


def _parse_literal(s):
    low = s.lower()
    if low in ('true', 'false'):
        return low == 'true'
    if low == 'none':
        return None
    try:
        return ast.literal_eval(s)
    except (SyntaxError, ValueError):
        return s  # a bare string, e.g. --device=cuda


def _help_text(g, defaults):
    """`--help`: the script's docstring, then each key, its default and its source comment."""
    comments = {}
    path = g.get('__file__')
    if path and os.path.exists(path):
        for line in open(path):
            m = re.match(r'^(\w+)\s*=\s*.*?#\s*(.*)$', line)
            if m and m.group(1) in defaults:
                comments[m.group(1)] = m.group(2).strip()
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


def configure(g, argv=None):
    """Apply config files and overrides from argv to the globals dict g; return the resolved config."""
    argv = sys.argv[1:] if argv is None else argv
    defaults = _keys(g)
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
                    raise ConfigError(f"unexpected argument {arg!r}: give config files (*.py) or --key=value")
                if not os.path.exists(arg):
                    raise ConfigError(f"config file not found: {arg}")
                ns = {}
                try:
                    exec(compile(open(arg).read(), arg, 'exec'), ns)
                except Exception as e:  # a broken config file is one line, not a traceback
                    raise ConfigError(f"{arg}: {type(e).__name__}: {e}")
                for k, v in ns.items():
                    if k.startswith('_') or not isinstance(v, _SIMPLE):
                        continue  # imports, helpers
                    if k not in defaults:
                        raise ConfigError(f"{arg}: unknown config key '{k}'{_nearest(k, defaults)}")
                    cfg[k] = _coerce(k, v, defaults[k], arg)
                i += 1
                continue
            body = arg[2:]
            if '=' in body:
                key, val = body.split('=', 1)
                i += 1
            else:
                key = body
                if i + 1 >= len(argv):
                    raise ConfigError(f"--{key} needs a value (--{key}=VALUE or --{key} VALUE)")
                val = argv[i + 1]
                i += 2
            key = key.replace('-', '_')
            if key not in defaults:
                raise ConfigError(f"unknown config key '--{key}'{_nearest(key, defaults)}; "
                                  f"see --help for the list")
            parsed = _parse_literal(val)
            if isinstance(defaults[key], str) and not isinstance(parsed, str):
                parsed = val  # a string key keeps the text as typed: --steps=64,128 is not a tuple
            cfg[key] = _coerce(key, parsed, defaults[key], 'command line')
    except ConfigError as e:
        print(f"error: {e.msg}", file=sys.stderr)
        raise SystemExit(2)
    g.update(cfg)
    return cfg


def print_config(cfg, file=None):
    """The resolved config, one key per line, so a log records exactly what ran."""
    width = max(len(k) for k in cfg) if cfg else 0
    print('config:', file=file)
    for k, v in cfg.items():
        print(f"  {k.ljust(width)} = {v!r}", file=file)


def die(msg, code=1):
    """One clear line on stderr and a non-zero exit: how the scripts report bad input."""
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(code)
