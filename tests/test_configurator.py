"""configurator.py: overrides in both syntaxes, type rules, and one-line errors for bad keys."""
import pytest

from configurator import configure


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


@pytest.mark.parametrize('module', ['sample', 'eval_ppl'])
def test_module_constants_are_not_config_keys(module):
    """configure(globals()) takes every public simple global as a key, so a module constant must be private
    (a public tuple once showed up in sample.py's printed config and as a --STEPPERS flag)."""
    import importlib
    from configurator import _keys
    keys = _keys(vars(importlib.import_module(module)))
    assert keys and all(k == k.lower() for k in keys), sorted(k for k in keys if k != k.lower())
