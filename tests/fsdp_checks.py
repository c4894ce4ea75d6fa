"""Checks of aogpt/parallel.py's sharded model that need a process group: run under torchrun by tests/test_fsdp.py
(`torchrun --nproc_per_node=W tests/fsdp_checks.py CHECK`), each rank comparing its sharded model with the same model
unsharded in the same process. A check prints 'ok CHECK' on every rank, or fails with an AssertionError."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from helpers import BACKBONES  # noqa: E402

from aogpt import parallel  # noqa: E402
from aogpt.ema import EMA  # noqa: E402
from aogpt.optim import configure_optimizers  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

TINY = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, target_dim=16)
FORMULATIONS = {  # every formulation on the paper's block, and AO-GPT on the Llama/Qwen block
    'ao': {}, 'ao_std': dict(adaln_std=0.2, target_std=1.0, adaln_table=True), 'sigma': dict(cond='sigma'),
    'gpt2': dict(cond='none', norm='layer', qk_norm=False, tie_head=True, head_bias=False, gelu='tanh'),
    'mdm': dict(causal=False, cond='none', mask_token_id=63), 'rope': BACKBONES['rope'],
}


def batch(B=4, n=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 60, (B, n), generator=g)
    order = torch.stack([torch.randperm(n, generator=g) for _ in range(B)])
    return x, order


def pair(args, seed=0, **kw):
    """(the model unsharded, the same model built on meta, sharded and filled from the same seed)."""
    torch.manual_seed(seed)
    ref = GPT(GPTConfig(**args))
    torch.manual_seed(seed)
    sharded, _ = parallel.build(args, None, 'cpu', fsdp=True, **kw)
    return ref, sharded


def whole(t):
    return t.full_tensor() if hasattr(t, 'full_tensor') else t


def check_init():
    """From scratch, each rank's rows are GPT(config)'s: the gathered weights equal it bit for bit."""
    for name, extra in FORMULATIONS.items():
        ref, sharded = pair(dict(TINY, **extra))
        mine = dict(sharded.named_parameters())
        for n, p in ref.named_parameters():
            assert torch.equal(whole(mine[n].detach()), p.detach()), (name, n)


def check_steps():
    """Two optimizer steps (AdamW, then Muon in float32) with the EMA and clipping: every loss, gradient norm and
    weight as unsharded, to float32's summation-order tolerance (the reduce-scatter sums the ranks' gradients in
    another order than one process's backward); with activation checkpointing too."""
    for name in ('ao', 'rope', 'mdm'):
        for optimizer, ac in (('adamw', False), ('muon', True)):
            args = dict(TINY, **FORMULATIONS[name])
            ref, sharded = pair(args, activation_checkpointing=ac)
            runs = []
            for m in (ref, sharded):
                opts = configure_optimizers(m, 0.1, 1e-2, (0.9, 0.95), 'cpu', optimizer=optimizer, muon_dtype='float32')
                runs.append((m, opts, EMA(m, 0.9)))
            x, order = batch()
            for step in range(2):
                out = []
                for m, opts, ema in runs:
                    if args.get('causal', True):
                        _, loss = m(x, order=order, targets=x)
                    else:
                        xt = torch.where(order < 6, 63, x)
                        _, loss = m(xt, targets=x, t=torch.full((4,), 0.4))
                    loss.backward()
                    norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
                    for opt in opts:
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                    ema.update()
                    out.append((loss.item(), whole(norm).item()))
                (l0, n0), (l1, n1) = out
                assert abs(l0 - l1) <= 1e-6 * abs(l0) and abs(n0 - n1) <= 1e-5 * n0, (name, optimizer, step, out)
            (m0, _, e0), (m1, _, e1) = runs
            mine = dict(m1.named_parameters())
            for n, p in m0.named_parameters():
                torch.testing.assert_close(whole(mine[n].detach()), p.detach(), atol=2e-6, rtol=1e-5)
                torch.testing.assert_close(whole(e1.params[n]), e0.params[n], atol=2e-6, rtol=1e-5)


def check_muon_step():
    """One Muon step on the same gradients, sharded and not: every rank orthogonalises the whole matrix and keeps its
    rows, so the weights are the unsharded step's bit for bit (torch's own Muon, given the shards, differs)."""
    from torch.distributed.tensor import distribute_tensor
    for name, dtype in (('ao', 'bfloat16'), ('rope', 'float32')):  # rope: SwiGLU's [gate; up] apart
        ref, sharded = pair(dict(TINY, **FORMULATIONS[name]))
        torch.manual_seed(5)
        mine = dict(sharded.named_parameters())
        for n, p in ref.named_parameters():
            p.grad = torch.randn_like(p)
            q = mine[n]
            q.grad = distribute_tensor(p.grad, q.device_mesh, q.placements, src_data_rank=None)
        opt_ref = configure_optimizers(ref, 0.1, 1e-2, (0.9, 0.95), 'cpu', optimizer='muon', muon_dtype=dtype)[1]
        opt = configure_optimizers(sharded, 0.1, 1e-2, (0.9, 0.95), 'cpu', optimizer='muon', muon_dtype=dtype)[1]
        opt_ref.step()
        opt.step()
        for n, p in ref.named_parameters():
            assert torch.equal(whole(mine[n].detach()), p.detach()), (name, n)


def check_entry_points():
    """Every entry point of a sharded model (not only forward, which FSDP hooks) gives the unsharded numbers."""
    from model import parallel_mask  # noqa: F401 (forward_queries builds one)
    ref, sharded = pair(dict(TINY, **FORMULATIONS['ao']))
    x, order = batch()
    tok, pos, tgt = x[:, :5], order[:, :5], order[:, 1:6]
    with torch.no_grad():
        for m in (ref, sharded):
            m.eval()
        pairs = [(lambda m: m(x, order=order)[0]),
                 (lambda m: m.forward_slots(tok, pos, tgt)),
                 (lambda m: m.hidden_slots(tok, pos, tgt, n_last=2)),
                 (lambda m: m.forward_queries(x[:, :3], order[:, :3], order[:, 3:7]))]
        for f in pairs:
            torch.testing.assert_close(f(sharded), f(ref), atol=1e-6, rtol=1e-5)
        enc_ref, enc = pair(dict(TINY, **FORMULATIONS['mdm']))
        torch.testing.assert_close(enc.encoder_logits(enc.encoder_hidden(x)),
                                   enc_ref.encoder_logits(enc_ref.encoder_hidden(x)), atol=1e-6, rtol=1e-5)


def check_bytes():
    """Each rank holds at most 55% of the unsharded run's weights, gradients, AdamW state and EMA (2 ranks)."""
    args = dict(TINY, n_layer=4, n_embd=64, n_head=4)
    ref, sharded = pair(args)
    sizes = []
    for m in (ref, sharded):
        opt = configure_optimizers(m, 0.1, 1e-3, (0.9, 0.95), 'cpu')
        ema = EMA(m, 0.9)
        x, order = batch()
        m(x, order=order, targets=x)[1].backward()
        for o in opt:
            o.step()
        sizes.append(parallel.local_bytes(m, opt, ema))
    full, mine = sizes
    for k in full:
        assert full[k] > 0 and mine[k] <= 0.55 * full[k], (k, mine[k], full[k])


CHECKS = {name[len('check_'):]: f for name, f in list(globals().items()) if name.startswith('check_')}

if __name__ == '__main__':
    torch.set_num_threads(1)
    dist.init_process_group('gloo')
    for name in sys.argv[1:]:
        CHECKS[name]()
        print(f"ok {name} rank {dist.get_rank()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
