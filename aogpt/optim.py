"""
The optimizers train.py steps: AdamW (the paper's) for everything, or Muon for the blocks' hidden matrices beside
AdamW for the rest, each parameter group with its own peak and floor on train.py's one schedule.

    optimizers = configure_optimizers(model, weight_decay, learning_rate, betas, device_type, optimizer='adamw', ...)
    OPTIMIZER_KEYS   each optimizer's train.py keys (preflight refuses a key of another optimizer than the run's)
"""

if __name__ == '__main__':  # run as a script (python aogpt/optim.py): one line, not an ImportError
    raise SystemExit("error: aogpt/optim.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import math

import torch

from aogpt.parallel import local_rows


# configure_optimizers' setups, each with the train.py keys only it reads (a key of another setup would be ignored)
OPTIMIZER_KEYS = {'adamw': (), 'muon': ('muon_lr', 'muon_adaln', 'muon_dtype')}


class Muon(torch.optim.Muon):
    """torch.optim.Muon with its Newton-Schulz iteration in ns_dtype. torch runs the iteration in bfloat16, which is
    fast on GPUs and on CPUs with bf16 matrix units; a CPU without them emulates every bf16 matmul, and float32 is
    then several times faster (bench/train_speed.py --optimizer). With bfloat16 the step is torch's own; with
    another dtype it is _step, the same update with only the iteration's dtype changed (a test checks that _step in
    bfloat16 is torch's step bit for bit). The state is torch's (momentum_buffer), so a checkpoint resumes under
    either dtype; ns_dtype is not saved with it (it is train.py's muon_dtype).

    pieces {parameter: m}: a parameter that stacks m logical matrices of equal height, each orthogonalised (and its
    lr adjusted) on its own, as if it were its own parameter: SwiGLU's c_fc holds gate and up, two maps into the
    nonlinearity, and one iteration over both would make the stacked pair's update orthogonal, not each map's
    (Muon's convention, as in modded-nanogpt: one logical matrix, one orthogonalisation). Derived from the model,
    not saved. A parameter with pieces always takes _step (torch's step knows only whole matrices)."""

    def __init__(self, params, ns_dtype=torch.bfloat16, pieces=None, **kw):
        super().__init__(params, **kw)
        self.ns_dtype, self.pieces = ns_dtype, dict(pieces or {})

    @torch.no_grad()
    def step(self, closure=None):
        sharded = any(_is_sharded(p) for g in self.param_groups for p in g['params'])
        if self.ns_dtype == torch.bfloat16 and not self.pieces and not sharded:
            return super().step(closure)
        return self._step(closure)  # torch's step takes FSDP's row shards for whole matrices: silently wrong

    @torch.no_grad()
    def _step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group['lr'], group['momentum']
            for p in group['params']:
                if p.grad is None:
                    continue
                state = self.state[p]
                if 'momentum_buffer' not in state:
                    state['momentum_buffer'] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state['momentum_buffer']
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group['nesterov'] else buf
                p.mul_(1 - lr * group['weight_decay'])
                # Newton-Schulz needs each matrix whole: a sharded update (FSDP: this rank's rows) is all-gathered,
                # every rank orthogonalises the whole matrix and keeps its own rows of the result (Moonlight's
                # distributed Muon: exact, at the price of W copies of the iteration)
                whole = update.full_tensor() if _is_sharded(update) else update
                a, b, rows = local_rows(p)  # the rows [a, b) of p held here, and the tensor holding them
                m = self.pieces.get(p, 1)
                for i, u in enumerate(whole.chunk(m)):  # (m = 1: p itself, torch's step)
                    u = newton_schulz(u, group['ns_coefficients'], group['ns_steps'], group['eps'], self.ns_dtype)
                    A, B = u.shape[:2]  # torch's two lr adjustments: 'original' (its default), 'match_rms_adamw'
                    ratio = 0.2 * math.sqrt(max(A, B)) if group['adjust_lr_fn'] == 'match_rms_adamw' else \
                        math.sqrt(max(1, A / B))
                    lo, hi = max(a, i * A), min(b, (i + 1) * A)  # the piece's rows [i A, (i + 1) A) held here
                    if lo < hi:
                        rows[lo - a:hi - a].add_(u[lo - i * A:hi - i * A], alpha=-lr * ratio)
        return loss


def _is_sharded(t):
    from torch.distributed.tensor import DTensor
    return isinstance(t, DTensor)


def newton_schulz(g, coefficients, steps, eps, dtype):
    """The quintic Newton-Schulz iteration torch.optim.Muon runs (in bfloat16) to push g's singular values towards 1,
    here in `dtype`, op for op as torch writes it: on the wide orientation, after scaling to Frobenius norm 1."""
    a, b, c = coefficients
    x = g.to(dtype)
    if g.size(0) > g.size(1):
        x = x.T
    x = x.div(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if g.size(0) > g.size(1) else x


def configure_optimizers(model, weight_decay, learning_rate, betas, device_type, optimizer='adamw', min_lr=0.0,
                         muon_lr=0.02, muon_adaln=True, muon_dtype='bfloat16', target_lr_scale=1.0):
    """The optimizers to step, AdamW first: optimizer='adamw' [AdamW] (the paper's), 'muon' [AdamW, Muon].

    Muon (torch.optim.Muon) takes the blocks' hidden matrices (attention c_attn/c_proj, MLP c_fc/c_proj; SwiGLU's c_fc
    as its two matrices, gate and up, see Muon's pieces), and
    with muon_adaln the AdaLN Linears (target_dim -> 6d per block, -> 2d before the head) as well (on AO-GPT
    they train faster there: finding 9); AdamW the rest: embeddings, head, norms, biases. Both decay their
    matrices by weight_decay in the same decoupled form (p -= lr * weight_decay * p). Each parameter is in one
    group, in named_parameters order, so the saved states (positional, as torch keeps them) line up on resume.
    muon_dtype: the dtype of Muon's Newton-Schulz iteration (see Muon below).

    Every param group carries its own schedule: initial_lr, its peak (AdamW's learning_rate, Muon's muon_lr),
    and min_lr, its floor, the same fraction min_lr / learning_rate of its peak for every group; the caller
    moves each group's lr along one warmup-and-decay curve between the two (train.py's get_lr). Another
    optimizer is one more entry here and in OPTIMIZER_KEYS: train.py's schedule, steps and checkpoint take the
    list as it is.

    target_lr_scale: the target conditioning (the target table wtpe, the AdaLN Linears: what an adaptation adds to
    a GPT) in groups of their own, each optimizer's peak and floor times this (finding 11's lever: the new parts
    learn at their own rate beside the copied ones). At 1 there are no such groups, so the groups, and a saved
    state's layout, are the ones every run before it had."""
    if optimizer not in OPTIMIZER_KEYS:
        raise ValueError(f"optimizer must be {' or '.join(OPTIMIZER_KEYS)}, got {optimizer!r}")
    # Decay every matrix (embeddings and AdaLN included, as in the paper's code); not biases or norms.
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    hidden = ('.attn.c_attn.weight', '.attn.c_proj.weight', '.mlp.c_fc.weight', '.mlp.c_proj.weight')

    def to_muon(name):
        adaln = muon_adaln and 'adaLN' in name and name.endswith('.weight')
        return optimizer == 'muon' and (name.endswith(hidden) or adaln)
    muon = [(n, p) for n, p in named if to_muon(n)]
    swiglu = getattr(model, 'config', None) is not None and model.config.mlp == 'swiglu'
    pieces = {p: 2 for n, p in named if swiglu and to_muon(n) and n.endswith('.mlp.c_fc.weight')}  # [gate; up]
    decay = [(n, p) for n, p in named if p.dim() >= 2 and not to_muon(n)]
    no_decay = [(n, p) for n, p in named if p.dim() < 2]
    target = (lambda n: 'wtpe' in n or 'adaLN' in n) if target_lr_scale != 1 else (lambda n: False)

    def split(pairs, peak, floor, **kw):
        """pairs' parameters as one group on (peak, floor), the target conditioning's as a group on the scaled pair
        (only when it has any)."""
        own = [{'params': [p for n, p in pairs if not target(n)], 'initial_lr': peak, 'min_lr': floor, **kw}]
        new = [p for n, p in pairs if target(n)]
        return own + ([{'params': new, 'initial_lr': peak * target_lr_scale, 'min_lr': floor * target_lr_scale,
                        **kw}] if new else [])
    groups = split(decay, learning_rate, min_lr, weight_decay=weight_decay) + \
        split(no_decay, learning_rate, min_lr, weight_decay=0.0)
    fused = device_type == 'cuda'
    optimizers = [torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)]
    if optimizer == 'muon':  # its floor: min_lr's fraction of muon_lr (min_lr <= learning_rate: 0 when that is)
        floor = min_lr * muon_lr / learning_rate if learning_rate > 0 else 0.0
        optimizers.append(Muon(split(muon, muon_lr, floor), lr=muon_lr, weight_decay=weight_decay,
                               ns_dtype=getattr(torch, muon_dtype), pieces=pieces))
    return optimizers
