"""What the bench scripts share: their settings checked before anything is built, and appending a measured table
to BENCHMARKS.md with device, date and command."""

if __name__ == '__main__':  # run as a script (python bench/common.py): one line, not an ImportError
    raise SystemExit('error: bench/common.py holds what the bench scripts share, with nothing to run: run one of '
                     'bench/*.py')
import os
import sys
import time
from datetime import date

import torch

from aogpt.errors import UserError
from aogpt.runtime import resolve_device
from model import GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the variables that choose a CPU's kernels and threads: a table measured under them says so in its command
KERNEL_ENV = ('ATEN_CPU_CAPABILITY', 'ONEDNN_MAX_CPU_ISA', 'OMP_NUM_THREADS')


def append_benchmark(title, cuda, description, table):
    """Append `table` under a heading naming the device, the date and torch, with the exact command."""
    dev = torch.cuda.get_device_name() if cuda else (f'CPU ({os.cpu_count()} cores, '
                                                     f'{torch.backends.cpu.get_cpu_capability()} kernels)')
    env = ''.join(f'{k}={os.environ[k]} ' for k in KERNEL_ENV if k in os.environ)  # part of the command
    with open(os.path.join(ROOT, 'BENCHMARKS.md'), 'a') as f:
        f.write(f"\n### {title}: {dev}, {date.today()}, torch {torch.__version__}\n\n"
                f"`{env}python {' '.join(sys.argv)}`  \n{description}\n\n{table}\n")


def _mean_seconds(fn, device, warmup, reps):
    """Seconds per call of fn, the device synchronised on both sides of the timed calls."""
    sync = torch.cuda.synchronize if str(device).startswith('cuda') else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps


def measure_matmul_peak(device, size=8192):
    """bf16 dense matmul FLOP/s on this device (size^3 products, the mean of 20 after 3 warm-ups): the rate an
    MFU or a compute-bound floor is counted against, what the chip reaches rather than its datasheet."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    return 2 * size ** 3 / _mean_seconds(lambda: a @ b, device, 3, 20)


def measure_copy_bandwidth(device, numel=2 ** 30):
    """Memory bytes/s of a device-to-device copy of numel bf16 values (2 GiB; bytes read + bytes written, the
    mean of 10 after 3 warm-ups): the rate a memory-bound floor is counted against."""
    src = torch.empty(numel, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / _mean_seconds(lambda: dst.copy_(src), device, 3, 10)


def check_settings(config, at_least=None, one_of=None, model=None):
    """A bench script's settings, before any model is built (exit_in_one_line prints the UserError as its one
    line): each key of at_least at or above its minimum, each of one_of among its choices, a --device this
    machine has, and the model's shape by GPTConfig's own checks (a plain ValueError: model.py imports nothing
    of ours)."""
    for key, low in (at_least or {}).items():
        if not config[key] >= low:
            raise UserError(f"--{key} must be at least {low}, got {config[key]!r}")
    for key, choices in (one_of or {}).items():
        if config[key] not in choices:
            raise UserError(f"--{key} must be one of {', '.join(choices)}, got {config[key]!r}")
    if 'device' in config:
        try:
            resolve_device(config['device'])
        except UserError as e:
            raise UserError(f"--{e.msg}") from None
    if model is not None:
        try:
            GPTConfig(**model)
        except ValueError as e:
            raise UserError(f"the model: {e}") from None
