"""
How train.py's model spreads over the ranks, from this one room (as torchtitan's parallelize functions do: model.py
never hears of it). One key chooses:
  DDP       (the default) every rank holds the whole model, its gradients, optimizer state and EMA, and the
            gradients are all-reduced: about 20 bytes a parameter per rank, so it ends near 1.5B on an 80 GB GPU.
  FSDP2     fsdp=True: torch's fully_shard, each block its own group, then the root. Every weight, gradient,
            optimizer state and the EMA are DTensors cut along their first dimension, 1/W of the rows per rank; a
            block's weights are all-gathered just before it runs and freed after, its gradients reduce-scattered.
            bfloat16 (dtype): a MixedPrecisionPolicy computes in bfloat16 from float32 shards and reduces in float32.
Either with activation_checkpointing: each block is recomputed in backward (non-reentrant) instead of keeping its
activations: the same math, a third more compute.

    model, raw = build(model_args, weights, device, fsdp=..., ddp=..., activation_checkpointing=..., ...)
        raw: the GPT the optimizers, the EMA and the checkpoints take (sharded in place under FSDP); model: what the
        loop calls (raw, compiled, or wrapped in DDP). weights: None (GPT's own init), a state dict, or for FSDP
        {name: a tensor, or rows(a, b) -> its rows [a, b), read only when asked} (the rest drawn: start_values)
    check_sharding(fsdp, device_type, dtype)   what fsdp=True cannot run (float16, a device without NCCL or gloo)
    shard_rows(n, rank, world)      the rows [a, b) of a first dimension of n that fully_shard gives a rank
    local_rows(p)                   (a, b, the tensor holding them): the rows of a parameter on this rank
    local_bytes(raw, optimizers, ema)   this rank's bytes of weights, gradients, optimizer states and EMA

FSDP's meta-device start: the model is built on the meta device (no memory), sharded, then each rank fills only its
own rows, one tensor at a time, from GPT.initial_values (from scratch: bit for bit GPT(config)'s weights, on any
world size) or from the source's rows (families.source_rows reads only those rows of the files).
"""

if __name__ == '__main__':  # run as a script (python aogpt/parallel.py): one line, not an ImportError
    raise SystemExit("error: aogpt/parallel.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import functools
import itertools
import warnings

import torch
import torch.distributed as dist
import torch.utils.checkpoint

from aogpt.errors import UserError
from model import GPT, GPTConfig, adapted_start

# GPT's entry points besides forward: FSDP2 all-gathers the root's weights (embeddings, final norm, head) only around
# forward, so each of these gathers them itself when called from outside without gradients (sampling, scoring)
ENTRY_POINTS = ('forward_slots', 'hidden_slots', 'forward_queries', 'encoder_hidden', 'encoder_logits')


def build(model_args, weights, device, *, fsdp=False, ddp=False, activation_checkpointing=False, dtype='float32',
          compile=False, frozen=()):
    """(model, raw): see the module's docstring. frozen: names of parameters that train.py does not train (the
    encoder's [None]), set before sharding."""
    config = GPTConfig(**model_args)
    if not fsdp:
        raw = GPT(config)
        if weights is not None:
            raw.load_state_dict(weights)
        _freeze(raw, frozen)
        raw.to(device)
        if activation_checkpointing:
            recompute_blocks(raw)
        model = torch.compile(raw) if compile else raw
        if ddp:
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[torch.cuda.current_device()] if device.startswith('cuda') else None)
        return model, raw
    with torch.device('meta'):
        raw = GPT(config)  # no memory, no draws
    _freeze(raw, frozen)
    if activation_checkpointing:
        recompute_blocks(raw)
    if compile:  # each block before it is sharded (torchtitan's order): FSDP's hooks stay outside the graphs
        for block in raw.transformer.h:
            block.compile()
    shard(raw, device, dtype)
    materialise(raw, device, start_values(raw, weights))
    return raw, raw


def start_values(raw, weights):
    """The (name, value) a model built on meta starts from: GPT(config)'s init where weights is None; else weights
    (name -> a tensor, or rows(a, b)), and for the parameters they lack (what an adaptation of a GPT adds: the
    target table, the AdaLN Linears) the values model.adapt starts them at, from the draws GPT(config) makes (made
    again here, whole values dropped but those new ones): what the unsharded run computes, bit for bit."""
    init = itertools.chain(constructor_draws(raw), raw.initial_values())
    if weights is None:
        return init
    params = dict(raw.named_parameters(remove_duplicate=False))
    if {id(p) for p in params.values()} <= {id(params[n]) for n in weights if n in params}:
        return weights.items()
    drawn = ((n, adapted_start(raw.config, n, v)) for n, v in init if n not in weights)
    return itertools.chain(drawn, weights.items())


def constructor_draws(model):
    """No values: the draws GPT(config) made before its own init, made again. Built on the CPU, torch's Linear and
    Embedding draw a default init when constructed (reset_parameters), which GPT's then replaces; built on the meta
    device they drew nothing. Each is made again here (one module at a time, then dropped), so that the generator
    stands where GPT(config)'s did when initial_values draws."""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device='cpu')
        elif isinstance(m, torch.nn.Embedding):
            torch.nn.Embedding(m.num_embeddings, m.embedding_dim, device='cpu')
    yield from ()


def check_sharding(fsdp, device_type, dtype):
    """What fsdp=True cannot run, refused in one line (a UserError) rather than run some other way."""
    if not fsdp:
        return
    if device_type not in ('cuda', 'cpu'):
        raise UserError(f"fsdp=True shards over NCCL (CUDA) or gloo (the CPU), not over {device_type}: use "
                        f"device=cuda or cpu, or fsdp=False")
    if dtype == 'float16':
        raise UserError("fsdp=True trains in bfloat16 or float32: float16 needs a gradient scaler, which the sharded "
                        "path does not take; use dtype=bfloat16 (or float32)")


def _freeze(model, names):
    params = dict(model.named_parameters())
    for n in names:
        params[n].requires_grad_(False)


def recompute_blocks(model):
    """Each block recomputed in backward instead of keeping its activations (torch.utils.checkpoint, non-reentrant;
    the dropout draws replayed). The block's own forward is replaced on the instance, so its parameters keep their
    names: a checkpoint is the same with or without it, and a resume may switch it."""
    for block in model.transformer.h:
        block.forward = functools.partial(_checkpointed, block.forward)


def _checkpointed(forward, *args, **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def shard(model, device, dtype='float32'):
    """fully_shard each block, then the root, over all the ranks (a 1-D mesh); bfloat16: compute in bfloat16 from
    the float32 shards, reduce the gradients in float32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device.split(':')[0], (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if dtype == 'bfloat16' else \
        MixedPrecisionPolicy()
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for name in ENTRY_POINTS:
        setattr(model, name, functools.partial(_gathered, model, getattr(model, name)))
    # forward's logits are a view (the head's matmul, reshaped); FSDP warns that an in-place op on one would skip its
    # backward hook, but nothing here changes them in place (train.py's loss is divided out of place)
    warnings.filterwarnings('ignore', message=r'FSDP2-wrapped module \(FSDPGPT\) returned a view tensor')
    model.register_forward_pre_hook(lambda m, args: _depth(m, +1))  # inside forward, the root is gathered already
    model.register_forward_hook(_after_forward)
    return model


def _after_forward(model, args, out):
    """FSDP2 keeps the root's weights gathered after its forward, for the backward that follows; after a forward
    without gradients (an eval) nothing follows, and the gathered copies would stay registered as the model's
    parameters: the optimizers would not find theirs at a save, and an EMA swap would write into the shards while
    the next forward reads the stale gathered copy. So such a forward lets them go."""
    _depth(model, -1)
    if not torch.is_grad_enabled() and not model.__dict__['_inside']:
        model.reshard()


def _depth(model, step):
    model.__dict__['_inside'] = model.__dict__.get('_inside', 0) + step


def _gathered(model, method, *args, **kwargs):
    """An entry point of a sharded model: the root's weights all-gathered around it when it is called from outside
    (sampling, scoring: without gradients). With gradients it runs inside forward or its recomputation in backward
    (loss_chunk's head), where FSDP holds the root's weights gathered already."""
    if model.__dict__.get('_inside', 0) or torch.is_grad_enabled():
        return method(*args, **kwargs)
    model.unshard()
    _depth(model, +1)
    try:
        return method(*args, **kwargs)
    finally:
        _depth(model, -1)
        model.reshard()


def shard_rows(n, rank, world):
    """The rows [a, b) of a first dimension of n that rank holds: torch.chunk's cut, as fully_shard makes it
    (ceil(n / world) rows each, the last ranks fewer or none)."""
    size = -(-n // world)
    return min(n, rank * size), min(n, (rank + 1) * size)


def local_rows(p):
    """A parameter's rows on this rank: (a, b, the tensor that holds them): rows [a, b) of p, all of p unless it is
    sharded."""
    from torch.distributed.tensor import DTensor
    if not isinstance(p, DTensor):
        return 0, p.shape[0], p
    local = p.to_local()
    a, b = shard_rows(p.shape[0], p.device_mesh.get_local_rank(), p.device_mesh.size())
    assert local.shape[0] == b - a, (p.shape, local.shape, a, b)  # fully_shard's cut, as shard_rows says
    return a, b, local


@torch.no_grad()
def materialise(model, device, values):
    """Storage for a model built on the meta device, filled from values: (name, value) pairs, a name's last value
    standing, where a value is a whole tensor (its rows are taken) or rows(a, b) (called for this rank's rows only).
    Every parameter must be filled: one left with to_empty's garbage would train silently."""
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)  # else a tied head's two modules get two weights
    try:
        model.to_empty(device=device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    params, filled = dict(model.named_parameters(remove_duplicate=False)), set()  # a tied weight: by both names
    for name, value in values:
        a, b, local = local_rows(params[name])
        local.copy_(value(a, b) if callable(value) else value[a:b])
        filled.add(id(params[name]))
    missing = [n for n, p in model.named_parameters() if id(p) not in filled]
    if missing:
        raise ValueError(f"materialise: no value for {missing[:5]}")


def local_bytes(model, optimizers=(), ema=None):
    """{weights, gradients, optimizer, ema: this rank's bytes}, read from the tensors this rank holds (a sharded one's
    local rows)."""
    from torch.distributed.tensor import DTensor
    size = lambda t: (t.to_local() if isinstance(t, DTensor) else t).numel() * t.element_size()  # noqa: E731
    params = list(model.parameters())
    states = [v for opt in optimizers for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return dict(weights=sum(map(size, params)), gradients=sum(size(p.grad) for p in params if p.grad is not None),
                optimizer=sum(map(size, states)), ema=sum(map(size, ema.params.values())) if ema is not None else 0)
