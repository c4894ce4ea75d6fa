"""
Where the scripts run: the device and the precision, decided in one place so that `device='auto'` and
`dtype='auto'` mean the same in train.py, eval_ppl.py and sample.py.

    dev = resolve_device('auto')               # 'cuda' if available, else 'cpu'
    ctx, name = autocast('cuda', 'auto')       # bf16 autocast (fp16 where bf16 is unsupported)
    dev, ctx, name = script_device(c.device, c.dtype)   # both, for a script's flags: one line if impossible
    fast_math(dev)                             # TF32 on CUDA; flushed denormals elsewhere

'auto' is bfloat16 autocast on CUDA (float16 on GPUs without bf16) and float32 on every other device:
CPU autocast to bf16 is slower than fp32 on most CPUs and changes the numbers the CPU tests pin.
Weights stay float32 under autocast; only the matmuls run in the lower precision. Sampling draws its
tokens in float64 whatever this says (generate.sample_tokens). A device or dtype this machine cannot run
is a UserError with a one-line message, which each script reports its own way (train.py from rank 0).
"""

if __name__ == '__main__':  # run as a script (python aogpt/runtime.py): one line, not an ImportError
    raise SystemExit("error: aogpt/runtime.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import os
from contextlib import nullcontext

import torch

from aogpt.errors import UserError

DEVICES = 'auto | cpu | cuda | cuda:N | mps'
DTYPES = ('auto', 'float32', 'bfloat16', 'float16')


def cpu_cores():
    """The CPU cores this process may run on: its affinity (what a container or taskset grants), not the
    host's count. Scripts that run several CPU jobs at once give each cpu_cores() // jobs threads."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)


def resolve_device(device):
    """'auto' -> 'cuda' or 'cpu'; a device this machine does not have is one clear line."""
    if device == 'auto':
        return 'cuda' if torch.cuda.is_available() else 'cpu'
    kind, _, index = device.partition(':')
    if kind not in ('cpu', 'cuda', 'mps') or (index and not index.isdigit()):
        raise UserError(f"device must be {DEVICES}, got {device!r}")
    if kind == 'cuda':
        if not torch.cuda.is_available():
            raise UserError(f"device {device}, but CUDA is not available on this machine: use device cpu (or auto)")
        if index and int(index) >= torch.cuda.device_count():
            raise UserError(f"device {device}, but this machine has {torch.cuda.device_count()} CUDA device(s)")
    if kind == 'mps' and not torch.backends.mps.is_available():
        raise UserError(f"device {device}, but MPS is not available on this machine: use device cpu (or auto)")
    return device


def autocast(device, dtype='auto'):
    """(context manager, dtype name) for running the model on `device` at `dtype`."""
    if dtype not in DTYPES:
        raise UserError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    kind = device.split(':')[0]
    if dtype == 'auto':
        dtype = ('bfloat16' if torch.cuda.is_bf16_supported() else 'float16') if kind == 'cuda' else 'float32'
    if dtype == 'float32':
        return nullcontext(), dtype
    return torch.autocast(device_type=kind, dtype=getattr(torch, dtype)), dtype


def script_device(device, dtype):
    """A script's --device and --dtype: (device, autocast context, dtype name), or a UserError naming the flag
    when this machine cannot run them, before the model loads."""
    try:
        device = resolve_device(device)
        return (device, *autocast(device, dtype))
    except UserError as e:
        raise UserError(f"--{e.msg}") from None


def fast_math(device):
    """Process-wide settings for speed: TF32 matmuls on CUDA; elsewhere denormals flushed to zero (in the
    cross-entropy gradient they can make CPU matmuls 10x slower)."""
    if device.startswith('cuda'):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_flush_denormal(True)


# Dense bf16 peak FLOP/s of one GPU, for MFU, by a substring of its name (first match wins: 'H100 PCIe'
# before 'H100'). A GPU not listed gets 0 (no MFU); pass peak_flops to train.py for it.
PEAK_FLOPS = (('H100 PCIe', 756e12), ('H100', 989e12), ('H200', 989e12), ('H800', 989e12), ('GH200', 989e12),
              ('A100', 312e12), ('A800', 312e12), ('L40S', 362e12), ('A10', 125e12), ('4090', 165e12))


def gpu_peak_flops(device_name):
    return next((f for key, f in PEAK_FLOPS if key in device_name), 0.0)


def start_ranks(device, group=False):
    """(rank, world size, this rank's device): one process, or one per torchrun rank (NCCL on CUDA, gloo
    on the CPU), each rank on its own GPU. group: one process gets a process group of its own too (a world of
    one: FSDP shards over a group, even of one)."""
    import torch.distributed as dist
    if int(os.environ.get('RANK', -1)) == -1:
        if group:
            if dist.is_initialized():  # an earlier run in this process (a caller running train.py in-process)
                dist.destroy_process_group()
            dist.init_process_group(backend='nccl' if device.startswith('cuda') else 'gloo', store=dist.HashStore(),
                                    rank=0, world_size=1)
        return 0, 1, device
    rank, world_size = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    if device.startswith('cuda'):
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        torch.cuda.set_device(device)
    # torchrun restarts workers against the same TCPStore server, which still holds the keys the
    # failed attempt wrote (gloo's peer addresses among them): a restarted rank can read a dead
    # peer's address and fail or hang in connectFullMesh. Each attempt gets its own key prefix.
    store, _, _ = next(dist.rendezvous('env://'))
    attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
    dist.init_process_group(backend='nccl' if device.startswith('cuda') else 'gloo',
                            store=dist.PrefixStore(f'attempt{attempt}/', store), rank=rank, world_size=world_size)
    return rank, world_size, device
