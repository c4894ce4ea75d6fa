"""configurator.py: overrides in both syntaxes, type rules, and one-line errors for bad keys; train.py's defaults."""
import ast
import os
import subprocess
import sys

import pytest
import torch

from aogpt.configurator import configure, split_list
from aogpt.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def defaults():
    return dict(learning_rate=6e-4, max_iters=100, compile=False, device='cpu', init_from=None,
                betas=(0.9, 0.95), __file__=__file__)


def test_both_override_syntaxes_and_int_for_float():
    g = defaults()
    cfg = configure(g, ['--learning_rate=1', '--max_iters', '7', '--compile=True', '--device', 'cuda'])
    assert cfg['learning_rate'] == 1.0 and isinstance(cfg['learning_rate'], float)
    assert g['max_iters'] == 7 and g['compile'] is True and g['device'] == 'cuda'


def test_none_default_can_be_overridden_and_tuple_parsed():
    cfg = configure(defaults(), ['--init_from=resume', '--betas=(0.8, 0.99)', '--device=64,128'])
    assert cfg['init_from'] == 'resume' and cfg['betas'] == (0.8, 0.99)
    assert cfg['device'] == '64,128'  # a str key keeps the text, even when it parses as a tuple


def test_config_file_then_command_line(tmp_path):
    f = tmp_path / 'c.py'
    f.write_text('import math\nmax_iters = 5\nlearning_rate = 3e-4\n')
    cfg = configure(defaults(), [str(f), '--max_iters=9'])
    assert cfg['max_iters'] == 9 and cfg['learning_rate'] == 3e-4


@pytest.mark.parametrize('argv,needle', [
    (['--learning_rat=1'], "did you mean 'learning_rate'"),
    (['--max_iters=1.5'], 'max_iters expects int'),
    (['--compile=maybe'], 'compile must be True or False'),
    (['missing.py'], 'config file not found'),
    (['--max_iters'], 'needs a value'),
])
def test_bad_input_is_one_clear_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        configure(defaults(), argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


@pytest.mark.parametrize('argv,needle', [
    (['--learning_rate=1e999'], "command line: learning_rate must be a finite number, got inf"),
    (['--learning_rate=-1e999'], "learning_rate must be a finite number, got -inf"),
    (['NAN'], "learning_rate must be a finite number, got nan"),
    (['--learning_rate=nan'], "command line: learning_rate must be a finite number, got nan"),  # float's words,
    (['--learning_rate', 'NaN'], "learning_rate must be a finite number, got nan"),             # not literals
    (['--learning_rate=-inf'], "learning_rate must be a finite number, got -inf"),
    (['--learning_rate=Infinity'], "learning_rate must be a finite number, got inf"),
    (['--seed=-1'], "command line: seed must be an integer in [0, 2**32), got -1"),
    (['--seed=4294967296'], "seed must be an integer in [0, 2**32), got 4294967296"),
    (['--seed=99999999999999999999999'], "seed must be an integer in [0, 2**32), got 99999999999999999999999"),
    (['--max_iters=9223372036854775808'], "max_iters must be an integer below 2**63 (torch's int64), got 922337"),
    (['--max_iters=-100000000000000000000'], "max_iters must be an integer below 2**63 (torch's int64)"),
    (['--max_iters=1e20'], "command line: max_iters must be an integer below 2**63 (torch's int64)"),
])
def test_non_finite_floats_and_out_of_range_seeds_are_refused(argv, needle, capsys, tmp_path):
    """inf reaches a float key as 1e999 (and nan from a config file); a seed past 2**64 made torch's
    manual_seed raise a traceback after the model had loaded, and one past 2**32 breaks lm-eval's numpy seed. An
    integer past int64 (sample.py --steps or --batch_size 10**20, train.py --gradient_accumulation_steps) was an
    OverflowError traceback where torch took it."""
    f = tmp_path / 'nan.py'
    f.write_text("learning_rate = float('nan')\n")
    with pytest.raises(SystemExit) as e:
        configure(dict(defaults(), seed=1337), [str(f) if a == 'NAN' else a for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert configure(dict(defaults(), seed=1337), ['--seed=0', '--learning_rate=1e-300'])['seed'] == 0
    assert configure(defaults(), ['--max_iters=9223372036854775807'])['max_iters'] == 2 ** 63 - 1


@pytest.mark.parametrize('script', ['sample.py', 'eval_ppl.py', 'eval_harness.py', 'train.py',
                                    'findings/reproduce.py'])
def test_every_command_refuses_a_seed_out_of_range_in_one_line(script):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, os.path.join(ROOT, script), '--seed=99999999999999999999999'],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and 'Traceback' not in p.stderr, p.stderr
    assert p.stderr.strip() == "error: command line: seed must be an integer in [0, 2**32), got 99999999999999999999999"


def test_unknown_key_in_config_file(tmp_path, capsys):
    f = tmp_path / 'c.py'
    f.write_text('max_iter = 5\n')
    with pytest.raises(SystemExit):
        configure(defaults(), [str(f)])
    assert "unknown config key 'max_iter'" in capsys.readouterr().err


def test_help_lists_every_key(capsys):
    with pytest.raises(SystemExit) as e:
        configure(defaults(), ['--help'])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for k in ('learning_rate', 'max_iters', 'compile', 'device', 'init_from', 'betas'):
        assert f'--{k}' in out


@pytest.mark.parametrize('module', ['sample', 'eval_ppl', 'findings.reproduce', 'export', 'train_speed'])
def test_module_constants_are_not_config_keys(module):
    """Config keys are the lowercase simple globals; a module's UPPERCASE constants are not (a public tuple
    once showed up in sample.py's printed config and as a --STEPPERS flag)."""
    import importlib

    from aogpt.configurator import _keys
    g = vars(importlib.import_module(module)) if module != 'train_speed' else {'ORDERS': ('a',), 'lr': 1.0,
                                                                              'ROOT': '/x', '_hidden': 1}
    keys = _keys(g)
    assert keys and all(k == k.lower() for k in keys), sorted(k for k in keys if k != k.lower())
    assert not any(k.isupper() for k in keys)


def test_namespace_leaves_the_defaults_alone():
    from aogpt.configurator import namespace
    g = defaults()
    c = namespace(g, ['--max_iters=7'])
    assert c.max_iters == 7 and c.config['max_iters'] == 7 and g['max_iters'] == 100


def typed_defaults():
    g = dict(vocab_size=None, use_ema=None, prompt='', fixed_counts=False, steps=8, __file__=__file__)
    g['__annotations__'] = {'vocab_size': int, 'use_ema': bool}
    return g


@pytest.mark.parametrize('argv,needle', [
    (['--vocab_size=abc'], 'vocab_size expects int'),
    (['--vocab_size=1.5'], 'vocab_size expects int'),
    (['--use_ema', 'maybe'], 'use_ema must be True or False'),
    (['--steps=True'], 'steps expects int'),
])
def test_a_none_default_key_still_has_a_type(argv, needle, capsys):
    """A key whose default is None takes its type from the annotation beside it: 'abc' is no vocab size."""
    with pytest.raises(SystemExit) as e:
        configure(typed_defaults(), argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and needle in err and len(err.splitlines()) == 1


def test_none_default_keys_parse_their_type_and_none():
    cfg = configure(typed_defaults(), ['--vocab_size=64', '--use_ema', 'no'])
    assert cfg['vocab_size'] == 64 and cfg['use_ema'] is False
    cfg = configure(typed_defaults(), ['--vocab_size=None', '--use_ema=yes'])
    assert cfg['vocab_size'] is None and cfg['use_ema'] is True


def test_string_keys_are_text_never_evaluated():
    long = ' '.join(['word'] * 25000)  # ast.literal_eval of this once ended in a MemoryError
    for text in ('[1, 2]', '(', 'None', '3', long, '"quoted"'):
        assert configure(typed_defaults(), [f'--prompt={text}'])['prompt'] == text
    assert configure(typed_defaults(), ['--prompt', '--x'])['prompt'] == '--x'


def test_a_boolean_key_given_alone_means_true():
    cfg = configure(typed_defaults(), ['--fixed_counts', '--steps', '4'])
    assert cfg['fixed_counts'] is True and cfg['steps'] == 4
    assert configure(typed_defaults(), ['--steps=4', '--fixed_counts'])['fixed_counts'] is True
    assert configure(typed_defaults(), ['--fixed_counts', 'False'])['fixed_counts'] is False
    assert configure(typed_defaults(), ['--use_ema'])['use_ema'] is True  # annotated bool, default None


def test_help_reads_comments_beside_annotated_keys(tmp_path, capsys):
    f = tmp_path / 'script.py'
    f.write_text("vocab_size: int = None  # the padded vocabulary\nsteps = 8  # diffusion steps\n")
    g = typed_defaults()
    g['__file__'] = str(f)
    with pytest.raises(SystemExit):
        configure(g, ['--help'])
    out = capsys.readouterr().out
    assert 'the padded vocabulary' in out and 'diffusion steps' in out


def test_help_reads_a_comment_carried_on_below_its_key(tmp_path, capsys):
    """A comment too long for its key's line goes on, indented, on the next: --help says all of it (sample.py's
    --until_eot stopped mid-parenthesis), and a comment of the script's own after a blank line is not the key's."""
    f = tmp_path / 'script.py'
    f.write_text("steps = 8                  # diffusion steps (the reverse\n"
                 "                           # process's T)\n\n# -- a section\nfixed_counts = False  # counts\n")
    g = typed_defaults()
    g['__file__'] = str(f)
    with pytest.raises(SystemExit):
        configure(g, ['--help'])
    out = capsys.readouterr().out
    assert "diffusion steps (the reverse process's T)" in out and 'section' not in out


def train_defaults():
    """train.py's config keys and their defaults, read from its source (running it would start a run)."""
    out = {}
    for node in ast.parse(open(os.path.join(ROOT, 'train.py')).read()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, 'target', None)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(target, ast.Name):
            if target.id == 'cfg':  # configure(globals()): the defaults end here
                return out
            out[target.id] = ast.literal_eval(node.value)
    raise AssertionError("train.py no longer calls cfg = configure(...)")


def test_train_py_and_gpt_config_agree_on_every_model_default(tmp_path):
    """The model settings are declared twice, as GPTConfig's fields and as train.py's globals (which --help lists
    with their comments): a default changed on one side only would make `python train.py` train another model than
    GPTConfig() describes. The keys train.py leaves to the data (vocab_size, mask_token_id: None) are compared as
    train.py derives them, on GPT-2's data: GPTConfig's 50304 and 50257."""
    from dataclasses import asdict

    from aogpt.startup import model_source
    from aogpt.tokenizer import gpt2_codec
    from model import GPTConfig
    cfg = dict(train_defaults(), out_dir=str(tmp_path))
    assert cfg['init_from'] == 'scratch' and cfg['vocab_size'] is None and cfg['mask_token_id'] is None
    args, weights, ckpt, _, started_from = model_source(cfg, set(), gpt2_codec(), 'data/openwebtext')
    assert weights is None and ckpt is None and started_from is None
    typed = lambda d: {k: (type(v).__name__, v) for k, v in d.items()}  # noqa: E731  (an int 0 for 0.0 drifts too)
    assert typed(args) == typed(asdict(GPTConfig()))


def test_split_list_parses_and_checks_each_value():
    assert split_list('steps', '16, 32,64', int, lambda t: t >= 1) == [16, 32, 64]
    assert split_list('lrs', '3e-3,0.02', float) == [3e-3, 0.02]
    for text, typ, ok in [('16,x', int, lambda t: True), ('', float, lambda v: True), ('1,', int, lambda t: True),
                          ('0.1,1e999', float, lambda v: True), ('nan', float, lambda v: True),
                          ('4,0', int, lambda t: t >= 1), ('ao,foo', str, lambda m: m in ('ao', 'gpt'))]:
        with pytest.raises(UserError, match=r"^--k must be a comma-separated list of") as e:
            split_list('k', text, typ, ok)
        assert e.value.code == 2 and repr(text) in e.value.msg


@pytest.mark.parametrize('err', [torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 8.00 GiB\nmore'),
                                 RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't "
                                              "allocate memory: you tried to allocate 85899345920 bytes."),
                                 MemoryError('Unable to allocate 11.9 GiB for an array with shape (100000000, 16)')])
def test_a_command_out_of_memory_is_one_line(err, capsys):
    """sample.py, eval_ppl.py, eval_harness.py and export.py (errors.command) end in one line when torch runs out of
    memory on a GPU or on the CPU, not a traceback; any other RuntimeError is still raised."""
    from aogpt.errors import command

    @command
    def main(e):
        raise e
    with pytest.raises(SystemExit) as stop:
        main(err)
    line = capsys.readouterr().err.strip()
    assert stop.value.code == 1 and len(line.splitlines()) == 1
    assert line.startswith(f"error: out of memory ({str(err).splitlines()[0]}): run with smaller batches")
    with pytest.raises(RuntimeError, match='shape mismatch'):
        main(RuntimeError('shape mismatch'))


RACE = r'''
import ctypes, signal, sys
sys.path.insert(0, {root!r})
from aogpt import configurator
libc = ctypes.CDLL(None)
libc.signal.restype = ctypes.c_void_p
libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
configurator.stop_at_safe_points()
catch = libc.signal(signal.SIGINT, 1)  # the interpreter's C-level handler (1: SIG_IGN), put straight back
libc.signal(signal.SIGINT, catch)
real = signal.signal

def late(signum, handler):
    """A Ctrl-C that the OS hands over after signal.signal's check of pending signals and before its SIG_IGN
    takes effect: caught by the C handler, left for a Python handler that is no longer there."""
    old = real(signum, handler)
    if signum == signal.SIGINT:
        libc.signal(signal.SIGINT, catch)
        getattr(libc, 'raise')(signal.SIGINT)
        libc.signal(signal.SIGINT, 1)
    return old
signal.signal = late
configurator.ignore_signals()
signal.signal = real
print('ended', configurator.stop_requested(), signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
'''


def test_a_signal_that_races_the_switch_to_ignored_says_nothing():
    """train.py's stop ignores later signals; one that came while the handler changed printed 'OSError: Signal 2
    ignored due to race condition' as a 5-line traceback after the run's one line (CI's 200-signal storm, once).
    Here the race's state is set up exactly (ctypes stands in for the OS's timing): stderr stays empty."""
    p = subprocess.run([sys.executable, '-c', RACE.format(root=ROOT)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.split() == ['ended', 'None', 'True'] and p.stderr == '', p.stderr
