"""fsdp=True: train.py's sharded path (aogpt/parallel.py, aogpt/sharded.py) on CPU, with gloo ranks under torchrun,
against the same runs unsharded in one process."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVIRON = dict(os.environ, OMP_NUM_THREADS='1', WANDB_MODE='disabled')


def torchrun(script, *argv, nproc=2, check=True):
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}', script, *argv]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENVIRON, cwd=ROOT, timeout=600)
    if p.returncode != 0 and 'connectFullMesh' in p.stderr:  # gloo's loopback connect can race on a loaded machine
        p = subprocess.run(cmd, capture_output=True, text=True, env=ENVIRON, cwd=ROOT, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return p


CHECKS = os.path.join(ROOT, 'tests', 'fsdp_checks.py')


def test_a_sharded_model_is_the_unsharded_one():
    """On 2 gloo ranks (tests/fsdp_checks.py): built on meta from a seed, every formulation's gathered weights are
    GPT(config)'s bit for bit; every entry point gives its numbers; a Muon step on the same gradients is the
    unsharded one bit for bit; each rank holds at most 55% of the weights, gradients, AdamW state and EMA."""
    p = torchrun(CHECKS, 'init', 'entry_points', 'muon_step', 'bytes')
    for check in ('init', 'entry_points', 'muon_step', 'bytes'):
        assert p.stdout.count(f'ok {check} ') == 2, p.stdout


@pytest.mark.slow
def test_sharded_steps_are_the_unsharded_ones():
    """Two steps of AdamW, and of Muon with activation checkpointing, with clipping and the EMA, on the paper's
    block, the rope block and the encoder: losses, norms, weights and EMA as one process's."""
    p = torchrun(CHECKS, 'steps')
    assert p.stdout.count('ok steps ') == 2, p.stdout
