import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# Tests never touch the network: HF datasets/hub offline, wandb off.
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('WANDB_MODE', 'disabled')

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_flush_denormal(True)


def pytest_configure(config):
    # `make test` runs `-m "not slow"`; `make test-all` (what CI runs) runs everything
    config.addinivalue_line('markers', 'slow: an end-to-end check of half a minute or more (make test-all runs it)')


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run sample.main() in-process, each call from the module's default config (main() writes the
    resolved config into the module's globals; they are restored before every call and at the end)."""
    import sample
    defaults = {k: v for k, v in vars(sample).items() if not k.startswith('_') and
                isinstance(v, (int, float, bool, str, type(None)))}
    for k, v in defaults.items():
        monkeypatch.setattr(sample, k, v)

    def run(*args):
        for k, v in defaults.items():
            setattr(sample, k, v)
        monkeypatch.setattr(sys, 'argv', ['sample.py', '--device', 'cpu', '--seed', '1', *args])
        code = 0
        try:
            sample.main()
        except SystemExit as e:
            code = e.code
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: a long version of a default test (make test-all)')
