"""
AO-GPT: a decoder-only transformer that is a masked diffusion model (Xue et al., arXiv 2506.19935).
One file, one model class; GPTConfig's switches select the formulation:

  AO-GPT     causal=True,  cond='adaln'   any-order AR; the target position enters through per-token AdaLN
  sigma-GPT  causal=True,  cond='sigma'   any-order AR; a target-position embedding added at the input
  GPT        causal=True,  cond='none'    plain left-to-right GPT (the order must be the identity)
  MDM        causal=False, cond='none'    encoder-only masked diffusion model with a [MASK] token

The GPT-2 switches (norm='layer', qk_norm=False, tie_head=True, head_bias=False, gelu='tanh') make the L2R mode
Hugging Face's GPT-2; pos='rope', mlp='swiglu', n_kv_head, head_dim, qkv_bias make it Llama, Qwen2 or Qwen3
(aogpt/families.py loads their folders; tests/test_backbones.py checks the logits against transformers').

Slot layout (the paper's, so its checkpoints load unchanged). A decoder sees n slots for n tokens:
  slot 0      the learned [None] start token:  wnonee + wpe[0]
  slot k>=1   the token revealed k-th, x[order[k-1]]:  wte[x] + wpe[order[k-1] + 1]
(pos='rope': no wpe; slot k's q and k turn by order[k-1] + 1 instead, [None]'s by 0: the source on [BOS] + x.)
Slot k must predict the token at position order[k] (its *target*). With cond='adaln' the target enters
each block as the shift/scale/gate of its norms, computed from a shared narrow table wtpe[order[k]].
Attention is plain causal over slots, i.e. causal in the permuted order. With order = identity this is
a GPT whose BOS is [None].

Public interface
  logits, loss = model(idx, order=None, targets=None)
      idx (B, n) tokens at their natural positions; order (B, n) a permutation per row (None = L2R).
      logits[:, i] is the distribution of the token at position order[:, i] given the tokens at
      order[:, :i]. targets (B, n) tokens at natural positions (usually idx; -1 = ignore); the loss is
      the mean cross-entropy over all n predictions, the first made from [None]. reduction='none'
      returns the per-slot NLL (B, n). Encoder (MDM): idx holds [MASK] ids, logits are at natural
      positions, and with t (B,) the loss is the ELBO estimate (1/n) sum_{masked i} -log p(x_i | x_t) / t.
      With loss_chunk > 0 and targets given, logits is None: the loss never holds them all (head_loss).
  model.forward_slots(tok, pos, tgt, mask=None, kv=None, n_logits=None)
      The slot-level pass the rest is built on. tok/pos/tgt (B, r): token id (-1 = [None]), its own
      position (-1 for [None]) and its target position (-1 = none). mask (r, K) or (B, 1, r, K), bool:
      which keys each row sees; None = causal over these rows (and with a cache, a single row sees all of
      it). kv = (cache, input_pos, span) is the hook for cached K/V (engine.KVCache): each layer calls
      cache.update(layer, input_pos, k, v, span), which writes these rows' K/V at the slots input_pos (r,)
      and returns the keys and values of the slots [0, span) to attend over.
  model.forward_queries(ctx, ctx_pos, query_pos)
      A context in any order plus k query target positions -> k distributions, in one pass: the copies
      of the last context slot form a *parallel block* (parallel_mask) and cannot see each other.
"""

import math
import numbers
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.utils.checkpoint
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024     # max sequence length n; wpe has block_size + 1 rows (row 0 is [None]'s)
    vocab_size: int = 50304    # GPT-2's 50257 padded up to a multiple of 64 for fast matmuls
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True          # biases in Linear layers (and in LayerNorm when norm='layer')
    causal: bool = True        # decoder (AO-GPT, sigma-GPT, GPT) vs encoder-only MDM
    cond: str = 'adaln'        # target-position conditioning: 'adaln' | 'sigma' | 'none'
    target_dim: int = 128      # width of the shared target-position table for AdaLN
    adaln_table: bool = False  # compute AdaLN per target position once, then gather (same math, less work)
    adaln_init: str = 'gate1'  # 'gate1': gates start at 1 (a plain pre-norm block); 'paper': all biases 0
    target_std: float = 0.02   # init std of the AdaLN target table (0.02 as in the paper; see README, finding 5)
    adaln_std: float = None    # init std of the AdaLN Linear weights; None: the generic 0.02 (the paper's)
    norm: str = 'rms'          # 'rms' (AO-GPT) | 'layer' (GPT-2, sigma-GPT)
    qk_norm: bool = True       # RMSNorm on per-head q and k
    tie_head: bool = False     # tie lm_head to wte (GPT-2, sigma-GPT)
    head_bias: bool = True     # bias in lm_head (AO-GPT's is untied and biased)
    gelu: str = 'exact'        # 'exact' | 'tanh' (GPT-2's gelu_new)
    mask_token_id: int = 50257  # the encoder MDM's [MASK]: GPT-2's first padding id
    # the Llama/Qwen block (aogpt/families.py); each default is the paper's block, so older checkpoints load unchanged
    pos: str = 'learned'       # 'learned' (wpe) | 'rope': a slot's own position p rotates its q and k by p + 1
    rope_theta: float = 10000.0
    rope_scaling: dict = None  # None, or Llama 3's dict (LLAMA3_KEYS)
    mlp: str = 'gelu'          # 'gelu' (c_proj(gelu(c_fc x))) | 'swiglu' (c_fc holds [gate; up]: silu(gate) * up)
    mlp_hidden: int = 0        # the MLP's width; 0: 4 n_embd
    n_kv_head: int = 0         # key/value heads (grouped-query attention); 0: n_head
    head_dim: int = 0          # 0: n_embd // n_head (Qwen3 sets its own)
    norm_eps: float = 1e-5     # every norm's eps (qk_norm's too)
    qkv_bias: bool = None      # biases in q, k, v (Qwen2: only there); None: as bias
    loss_chunk: int = 0        # the loss's head + cross-entropy this many rows at a time (head_loss); 0: all at once

    @property
    def heads(self):
        """(query heads, key/value heads, head width): what attention and the KV cache are sized by."""
        return self.n_head, self.n_kv_head or self.n_head, self.head_dim or self.n_embd // self.n_head

    def __post_init__(self):
        self.validate()

    def validate(self):
        """Raise ValueError naming the first field that cannot make a model and the values it may take (GPT(config)
        checks again: a config may be edited); errors, not asserts, so `python -O` keeps them as one line each."""
        def need(ok, key, what):
            if not ok:
                raise ValueError(f"{key} must be {what}, got {getattr(self, key)!r}")

        def is_int(v):
            return isinstance(v, numbers.Integral) and not isinstance(v, bool)

        for k in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'target_dim'):
            need(is_int(getattr(self, k)) and getattr(self, k) >= 1, k, "an integer >= 1")
        for k in ('bias', 'causal', 'adaln_table', 'qk_norm', 'tie_head', 'head_bias'):
            need(isinstance(getattr(self, k), bool), k, "True or False")
        need(self.head_dim != 0 or self.n_embd % self.n_head == 0, 'n_embd', f"a multiple of n_head ({self.n_head})")
        for k in ('mlp_hidden', 'n_kv_head', 'head_dim', 'loss_chunk'):
            need(is_int(getattr(self, k)) and getattr(self, k) >= 0, k, "an integer >= 0 (0: the default)")
        need(self.n_head % self.heads[1] == 0, 'n_kv_head', f"a divisor of n_head ({self.n_head})")
        need(self.pos in ('learned', 'rope'), 'pos', "'learned' or 'rope'")
        need(self.mlp in ('gelu', 'swiglu'), 'mlp', "'gelu' or 'swiglu'")
        need(self.qkv_bias in (None, True, False), 'qkv_bias', "True, False or None (as bias)")
        for k in ('rope_theta', 'norm_eps'):
            need(isinstance(getattr(self, k), numbers.Real) and 0 < getattr(self, k) < math.inf, k, "a number > 0")
        r = self.rope_scaling if isinstance(self.rope_scaling, dict) else {}  # Llama 3's law: rotary divides by each
        law = set(r) == set(LLAMA3_KEYS) and all(isinstance(v, numbers.Real) and not isinstance(v, bool) and
                                                  math.isfinite(v) for v in r.values())
        law = law and r['factor'] >= 1 and 0 < r['low_freq_factor'] < r['high_freq_factor']
        law = law and is_int(r['original_max_position_embeddings']) and r['original_max_position_embeddings'] >= 1
        need(self.rope_scaling is None or law, 'rope_scaling', "None or Llama 3's dict: factor >= 1, 0 < "
             "low_freq_factor < high_freq_factor, original_max_position_embeddings an integer >= 1")
        need(isinstance(self.dropout, numbers.Real) and 0 <= self.dropout < 1, 'dropout', "in [0, 1)")
        need(self.cond in ('adaln', 'sigma', 'none'), 'cond', "'adaln', 'sigma' or 'none'")
        need(self.norm in ('rms', 'layer'), 'norm', "'rms' or 'layer'")
        need(self.gelu in ('exact', 'tanh'), 'gelu', "'exact' or 'tanh'")
        need(self.adaln_init in ('gate1', 'paper'), 'adaln_init', "'gate1' or 'paper'")
        # init stds: trunc_normal_ with a negative std draws nonsense, and 0 makes the table constant
        need(isinstance(self.target_std, numbers.Real) and 0 < self.target_std < math.inf, 'target_std',
             "an init std > 0")
        need(self.adaln_std is None or (isinstance(self.adaln_std, numbers.Real) and 0 < self.adaln_std < math.inf),
             'adaln_std', "an init std > 0, or None (the generic 0.02 draw)")
        if not self.causal:
            need(self.cond == 'none', 'cond', "'none' for the encoder MDM (causal=False), which takes no target")
            need(is_int(self.mask_token_id) and 0 <= self.mask_token_id < self.vocab_size, 'mask_token_id',
                 f"a token id in [0, vocab_size={self.vocab_size}) for the encoder MDM's [MASK]")


# ---------------------------------------------------------------------- the blocks

class Norm(nn.Module):
    """RMSNorm (weight only) or LayerNorm (weight, optional bias); eps 1e-5 like GPT-2 and the paper (norm_eps)."""

    def __init__(self, ndim, kind='rms', bias=False, eps=1e-5):
        super().__init__()
        self.rms, self.eps = kind == 'rms', eps
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if (kind == 'layer' and bias) else None

    def forward(self, x):
        # weights cast to the activations' dtype: under bf16 autocast a float32 weight would send
        # rms_norm down its slow unfused path
        w = self.weight.to(x.dtype)
        if self.rms:
            return F.rms_norm(x, w.shape, w, self.eps)
        return F.layer_norm(x, w.shape, w, None if self.bias is None else self.bias.to(x.dtype), self.eps)


LLAMA3_KEYS = ('factor', 'low_freq_factor', 'high_freq_factor', 'original_max_position_embeddings')


def rotary(config, pos):
    """cos, sin (B, 1, r, hd) turning the slots at positions pos (B, r): p by p + 1 (wpe's row), [None] (-1) by 0.
    In float32 whatever the model's dtype, as Hugging Face computes them (so a float64 model is its source to 1e-10);
    with rope_scaling, Llama 3's: long wavelengths slowed by factor, the middle ones (old/high to old/low) blended."""
    hd = config.heads[2]
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, hd, 2, device=pos.device).float() / hd)
    if config.rope_scaling is not None:
        factor, low, high, old = (config.rope_scaling[k] for k in LLAMA3_KEYS)
        wavelen = 2 * math.pi / inv_freq
        blend = (old / wavelen - low) / (high - low)                  # in [0, 1] where it is used
        slowed = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        inv_freq = torch.where((wavelen >= old / high) & (wavelen <= old / low),
                               (1 - blend) * slowed / factor + blend * slowed, slowed)
    angle = (pos + 1).float()[..., None] * inv_freq                  # (B, r, hd/2)
    angle = torch.cat([angle, angle], dim=-1)[:, None]               # (B, 1, r, hd): pairs (i, i + hd/2)
    return angle.cos(), angle.sin()


def rotate(x, cos, sin):
    """x (B, h, r, hd) turned by the slots' angles, Hugging Face's rotate_half convention."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)


class CausalSelfAttention(nn.Module):
    # named for nanoGPT/GPT-2 compatibility; with causal=False (the MDM) it is bidirectional

    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.heads
        qkv_bias = config.bias if config.qkv_bias is None else config.qkv_bias
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=qkv_bias)
        self.c_proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=config.bias)
        if config.qk_norm:  # per head, over head_dim, before the rotation: Qwen3's q_norm / k_norm are this function
            self.q_norm = Norm(self.head_dim, 'rms', eps=config.norm_eps)
            self.k_norm = Norm(self.head_dim, 'rms', eps=config.norm_eps)
        self.qk_norm = config.qk_norm
        self.causal = config.causal
        self.layer_idx = layer_idx  # which of the cache's layers this one reads and writes
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, mask=None, kv=None, rope=None):
        B, r, C = x.shape
        nh, nkv, hd = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.c_attn(x).split([nh * hd, nkv * hd, nkv * hd], dim=2)
        q = q.view(B, r, nh, hd).transpose(1, 2)                       # (B, nh, r, hd)
        k = k.view(B, r, nkv, hd).transpose(1, 2)                      # (B, nkv, r, hd)
        v = v.view(B, r, nkv, hd).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # each slot by its own position: the cache stores keys already turned
            q, k = rotate(q, *rope), rotate(k, *rope)
        if kv is not None:  # write these rows at input_pos; attend over the cache's first `span` slots
            cache, input_pos, span = kv
            k, v = cache.update(self.layer_idx, input_pos, k, v, span)  # (B, nh, span, hd)
            if mask is None and 1 < r < span:  # is_causal would align the rows with the first keys
                raise ValueError("rows after cached slots need a mask: model.parallel_mask(r, k, cached)")
        # no mask: causal (decoder) or full (encoder) attention; one row sees everything cached either way
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and self.causal and r > 1,
                                           dropout_p=self.dropout if self.training else 0.0, enable_gqa=nkv != nh)
        y = y.transpose(1, 2).contiguous().view(B, r, nh * hd)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        hidden, self.swiglu = config.mlp_hidden or 4 * config.n_embd, config.mlp == 'swiglu'
        self.c_fc = nn.Linear(config.n_embd, (2 if self.swiglu else 1) * hidden, bias=config.bias)
        self.gelu = nn.GELU(approximate='tanh' if config.gelu == 'tanh' else 'none')
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        if self.swiglu:
            gate, up = self.c_fc(x).chunk(2, dim=-1)                  # (B, r, hidden) each
            return self.dropout(self.c_proj(F.silu(gate) * up))
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


# ---------------------------------------------------------------------- the target's conditioning (AdaLN)
# What a block asks of the conditioning it is given: for these rows, one modulation for its attention branch
# and one for its MLP branch (cond.branches(block)), each of which normalises the branch's input
# (mod.norm(ln, x)) and adds its output back (mod.residual(x, y)); what the final norm asks
# (cond.final(transformer)); and the conditioning of the last n rows only (cond.last(n)). Three answer it:
#   NO_TARGET    GPT, sigma-GPT, the encoder: ln(x) and x + y, nanoGPT's pre-norm block
#   PerToken     AdaLN (DiT): each slot's target embedding -> its shift, scale and gate
#   TargetTable  adaln_table=True: the same function, computed once per target position and gathered

def modulate(x, shift, scale):
    return x * (1 + scale) + shift


class NoTarget:
    """No conditioning: every branch is plain pre-norm (this object is its own modulation)."""

    def branches(self, block):
        return self, self

    def final(self, transformer):
        return self

    def last(self, n):
        return self

    def norm(self, ln, x):
        return ln(x)

    def residual(self, x, y):
        return x + y


NO_TARGET = NoTarget()


class Modulation:
    """One branch's shift, scale and gate (B, r, C) for these rows (the final norm has no gate)."""

    def __init__(self, shift, scale, gate=None):
        self.shift, self.scale, self.gate = shift, scale, gate

    def norm(self, ln, x):
        return modulate(ln(x), self.shift, self.scale)

    def residual(self, x, y):
        return x + self.gate * y


class PerToken:
    """AdaLN, per token: the target embedding of each slot, emb (B, r, td), zero for a slot with no target."""

    def __init__(self, emb):
        self.emb = emb

    def branches(self, block):
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = block.adaLN(self.emb).chunk(6, dim=-1)
        return Modulation(shift_a, scale_a, gate_a), Modulation(shift_m, scale_m, gate_m)

    def final(self, transformer):
        return Modulation(*transformer.adaLN_f(self.emb).chunk(2, dim=-1))

    def last(self, n):
        return PerToken(self.emb[:, -n:])


class TargetTable:
    """adaln_table=True, a memory optimisation of AdaLN with the same parameters and function
    (tests/test_model.py checks logits and gradients). The modulation depends only on the target position,
    so each block computes it once per position, table = adaLN(rows) with rows the block_size target
    embeddings plus a zero row for "no target", and each slot gathers its row by idx (B, r). In training
    the gathered copies are recomputed in the backward pass instead of stored: the block then keeps about
    two (B, r, C) tensors over a plain GPT block (the branch outputs the gates multiply), not six gathered
    shift/scale/gate tensors and the normed inputs."""

    def __init__(self, idx, rows):
        self.idx, self.rows = idx, rows                                  # (B, r), (block_size + 1, td)

    def branches(self, block):
        C = block.adaLN[1].out_features // 6
        shift_scale_a, gate_a, shift_scale_m, gate_m = block.adaLN(self.rows).split([2 * C, C, 2 * C, C], dim=1)
        return GatheredModulation(self.idx, shift_scale_a, gate_a), GatheredModulation(self.idx, shift_scale_m, gate_m)

    def final(self, transformer):
        return GatheredModulation(self.idx, transformer.adaLN_f(self.rows))

    def last(self, n):
        return TargetTable(self.idx[:, -n:], self.rows)


class GatheredModulation:
    """A Modulation whose rows are gathered from a table (one row per target position) by idx (B, r)."""

    def __init__(self, idx, shift_scale, gate=None):
        self.idx, self.shift_scale, self.gate = idx, shift_scale, gate  # (B, r), (T, 2C), (T, C)

    def norm(self, ln, x):
        return _recompute(_gathered_modulate, ln, x, self.idx, self.shift_scale)

    def residual(self, x, y):
        return _recompute(_gathered_gate, x, y, self.idx, self.gate)


def _gathered_modulate(norm, x, idx, table):
    shift, scale = F.embedding(idx, table).chunk(2, dim=-1)            # (B, r, C) each
    return modulate(norm(x), shift, scale)


def _gathered_gate(x, y, idx, table):
    return x + F.embedding(idx, table) * y


def _recompute(fn, *args):
    """fn(*args), recomputed in the backward pass instead of stored when training."""
    if torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


class Block(nn.Module):

    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = Norm(config.n_embd, config.norm, config.bias, config.norm_eps)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = Norm(config.n_embd, config.norm, config.bias, config.norm_eps)
        self.mlp = MLP(config)
        if config.cond == 'adaln':
            # SiLU -> Linear(target_dim -> 6 n_embd): shift/scale/gate for attention, then for the MLP
            self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(config.target_dim, 6 * config.n_embd))

    def forward(self, x, cond=NO_TARGET, mask=None, kv=None, rope=None):
        attn, mlp = cond.branches(self)  # how the target modulates each branch, for these rows (see above)
        x = attn.residual(x, self.attn(attn.norm(self.ln_1, x), mask, kv, rope))
        return mlp.residual(x, self.mlp(mlp.norm(self.ln_2, x)))


def _open_gates(bias):
    """An AdaLN Linear's bias with both gates at 1 (a plain pre-norm block: as the GPT baseline starts)."""
    bias.view(6, -1)[[2, 5]] = 1.0  # rows: shift, scale, gate for attention, then for the MLP
    return bias


@torch.no_grad()
def trunc_normal_(w, std, a, b):
    """normal(0, std) draws, each outside [a, b] drawn again until none is: ours, as torch's changes between releases
    (an inverse CDF up to 2.11), so that a seed makes the same model on any torch, the one every run trained from."""
    lo, hi = (w.new_tensor(v, device='cpu').item() for v in (a, b))  # the bounds as w's dtype holds them
    x = w.normal_(0.0, std)
    while bool((out := (x < lo) | (x > hi)).any()):
        x = torch.where(out, torch.empty_like(x).normal_(0.0, std), x)  # a whole fresh draw, as torch's
    return w.copy_(x)


def parallel_mask(r, n_parallel, L=0, device=None):
    """(r, L + r) bool: which keys each of r rows sees after L cached slots, when the last n_parallel rows
    form a parallel block. Every row sees the cache; a row before the block sees the rows up to itself
    (causal); a row of the block sees the rows before the block and itself, never the block's others,
    so each copy computes exactly the conditional it would compute alone."""
    i = torch.arange(r, device=device)[:, None]
    j = torch.arange(r, device=device)[None, :]
    m = (j <= i) & ((j < r - n_parallel) | (j == i))                    # (r, r)
    return torch.cat([m.new_ones(r, L), m], dim=1)


def head_loss(head, h, y, reduction='mean', chunk=0):
    """(logits, loss) of final hidden states h (B, n, C) against targets y (B, n), -1 ignored: head (..., C) ->
    (..., V); reduction 'mean' over the targets, or 'none': the NLL (B, n), 0 where ignored. chunk (loss_chunk)
    > 0: the head and the float32 cross-entropy run chunk rows at a time, each chunk recomputed in backward instead
    of stored (its logits are freed before the next chunk's), and the logits are None: the peak holds one chunk's
    logits, not B n V (5 GB at a 151k vocabulary and 8 x 1024). Each row's NLL is the same function either way;
    only the order in which the loss and the head's gradient are summed changes."""
    B, n, C = h.shape
    if chunk:
        rows, ys, grad = h.reshape(B * n, C), y.reshape(B * n), torch.is_grad_enabled()
        nll = torch.cat([torch.utils.checkpoint.checkpoint(_row_nll, head, rows[a:a + chunk], ys[a:a + chunk],
                                                           use_reentrant=False) if grad else
                         _row_nll(head, rows[a:a + chunk], ys[a:a + chunk]) for a in range(0, B * n, chunk)])
        logits = None
    else:
        logits = head(h)
        nll = _row_nll(nn.Identity(), logits.view(B * n, -1), y.reshape(B * n))
    nll = nll.view(B, n)
    return logits, nll if reduction == 'none' else nll.sum() / (y >= 0).sum().clamp(min=1)


def _row_nll(head, h, y):
    return F.cross_entropy(head(h).float(), y, ignore_index=-1, reduction='none')


# ---------------------------------------------------------------------- the model

class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        config.validate()
        self.config = config
        d = config.n_embd
        self.transformer = nn.ModuleDict(dict(  # in this order: a seed draws the same init as before rope existed
            wte=nn.Embedding(config.vocab_size, d),  # wpe row 0: [None]; a token at p uses row p+1 (rope: the turns)
            **({'wpe': nn.Embedding(config.block_size + 1, d)} if config.pos == 'learned' else {}),
            wnonee=nn.Embedding(1, d),                      # the [None] start token (the paper's name)
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=Norm(d, config.norm, config.bias, config.norm_eps),
        ))
        if config.cond == 'adaln':
            self.transformer.wtpe = nn.Embedding(config.block_size, config.target_dim)
            self.transformer.adaLN_f = nn.Sequential(nn.SiLU(), nn.Linear(config.target_dim, 2 * d))
        elif config.cond == 'sigma':
            self.transformer.wtpe = nn.Embedding(config.block_size, d)  # full width, added at the input
        self.lm_head = nn.Linear(d, config.vocab_size, bias=config.head_bias)
        if config.tie_head:
            self.transformer.wte.weight = self.lm_head.weight
        if not self.lm_head.weight.is_meta:  # on the meta device the caller fills the weights (aogpt/parallel.py)
            params = dict(self.named_parameters())
            with torch.no_grad():
                for name, value in self.initial_values():
                    params[name].copy_(value)

    def initial_values(self):
        """The initial weights as (name, whole value on the CPU), in the order a seed draws them: what GPT(config)
        copies in, and what a model built on the meta device takes its rows of, one tensor at a time (parallel.py).
        A name can come again: c_proj's and AdaLN's own draws replace the generic ones, drawn first all the same."""
        cfg, names = self.config, {p: n for n, p in self.named_parameters()}  # a tied weight: by its first name

        def draw(p, std, a=-0.06, b=0.06):  # truncated normal (+-3 sigma) as in the paper's code
            return names[p], trunc_normal_(torch.empty(p.shape, device='cpu'), std, a, b)
        for m in self.modules():  # what self.apply visited (the leaves: the same order)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                yield draw(m.weight, 0.02)
            if isinstance(m, Norm):
                yield names[m.weight], torch.ones(m.weight.shape)
            if isinstance(m, (nn.Linear, Norm)) and m.bias is not None:
                gates = cfg.adaln_init == 'gate1' and '.adaLN.' in names[m.bias]  # a block's AdaLN (not adaLN_f)
                yield names[m.bias], _open_gates(torch.zeros(m.bias.shape)) if gates else torch.zeros(m.bias.shape)
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):  # GPT-2's scaled init of the residual projections
                yield draw(p, 0.02 / math.sqrt(2 * cfg.n_layer))
        if cfg.cond == 'adaln':
            # The target reaches the residual stream only through table -> SiLU -> Linear, a product of
            # two init-scale factors. At 0.02 each (the paper's) a small model sits ~1000 steps on a
            # plateau at the unigram loss; target_std=1 alone does not shorten it, target_std=1 with
            # adaln_std=0.2 removes it (README, finding 5a).
            s = cfg.target_std
            yield draw(self.transformer.wtpe.weight, s, -3 * s, 3 * s)
            if cfg.adaln_std is not None:
                s = cfg.adaln_std
                for lin in [b.adaLN[1] for b in self.transformer.h] + [self.transformer.adaLN_f[1]]:
                    yield draw(lin.weight, s, -3 * s, 3 * s)

    @property
    def any_order(self):
        """True if the model can condition on an arbitrary generation order."""
        return self.config.causal and self.config.cond != 'none'

    # ------------------------------------------------------------------ the slots
    def _embed(self, tok, pos, tgt):
        """Slot inputs (B, r) -> the residual stream x (B, r, C), and the conditioning its blocks are given:
        NO_TARGET without AdaLN; PerToken, each slot's target embedding (zero for a slot with no target); with
        adaln_table, a TargetTable of the target embeddings and each slot's row in it."""
        cfg, tr = self.config, self.transformer
        x = tr.wte(tok.clamp(min=0))                                      # (B, r, C)
        x = torch.where((tok < 0).unsqueeze(-1), tr.wnonee.weight[0].to(x.dtype), x)
        x = x + tr.wpe(pos + 1) if cfg.pos == 'learned' else x
        has_tgt = (tgt >= 0).unsqueeze(-1)
        if cfg.cond == 'sigma':
            x = x + tr.wtpe(tgt.clamp(min=0)) * has_tgt.to(x.dtype)
        cond = NO_TARGET
        if cfg.cond == 'adaln' and cfg.adaln_table:
            rows = torch.cat([tr.wtpe.weight, tr.wtpe.weight.new_zeros(1, cfg.target_dim)])  # row block_size: none
            cond = TargetTable(torch.where(tgt >= 0, tgt, cfg.block_size), rows)
        elif cfg.cond == 'adaln':
            cond = PerToken(tr.wtpe(tgt.clamp(min=0)) * has_tgt.to(tr.wtpe.weight.dtype))  # (B, r, td)
        return tr.drop(x), cond

    def forward_slots(self, tok, pos, tgt, mask=None, kv=None, n_logits=None):
        """The slot-level decoder pass (see the module docstring): logits (B, n_logits or r, V) of the
        last rows."""
        return self.lm_head(self.hidden_slots(tok, pos, tgt, mask, kv, n_logits))

    def hidden_slots(self, tok, pos, tgt, mask=None, kv=None, n_last=None):
        """forward_slots without the head: final-norm hidden states (B, n_last or r, C) of the last rows."""
        assert self.config.causal, "the slot pass is the decoder's; the encoder MDM uses forward(idx)"
        x, cond = self._embed(tok, pos, tgt)
        rope = rotary(self.config, pos) if self.config.pos == 'rope' else None
        for block in self.transformer.h:
            x = block(x, cond, mask, kv, rope)
        if n_last is not None:
            x = x[:, -n_last:]
            cond = cond.last(n_last)
        return cond.final(self.transformer).norm(self.transformer.ln_f, x)  # ln_f, and with AdaLN its shift/scale

    # ------------------------------------------------------------------ training and likelihood
    def forward(self, idx, order=None, targets=None, t=None, reduction='mean'):
        cfg = self.config
        _check_ids('idx', idx)
        B, n = idx.shape
        for name, x in (('order', order), ('targets', targets)):
            _check_ids(name, x, idx.shape)
        if n > cfg.block_size:
            raise ValueError(f"sequence length {n} > block_size {cfg.block_size}")
        if not cfg.causal:
            return self._forward_encoder(idx, targets, t, reduction)
        if order is None:
            xs, pos = idx, torch.arange(n, device=idx.device).expand(B, n)
        else:
            xs, pos = idx.gather(1, order), order                        # tokens in reveal order (B, n)
        none = torch.full((B, 1), -1, dtype=torch.long, device=idx.device)
        tok = torch.cat([none, xs[:, :-1]], dim=1)                       # [None], x_s0 .. x_s(n-2)
        spos = torch.cat([none, pos[:, :-1]], dim=1)
        h = self.hidden_slots(tok, spos, pos)                            # slot i predicts position pos[:, i]
        if targets is None:
            return self.lm_head(h), None
        y = targets if order is None else targets.gather(1, order)
        return head_loss(self.lm_head, h, y, reduction, cfg.loss_chunk)  # (None, loss) with loss_chunk

    def encoder_hidden(self, idx):
        """The encoder MDM's trunk: final-norm hidden states (B, n, C) for idx (B, n). The sampler runs
        lm_head only on the rows it reveals."""
        n = idx.size(1)
        tr = self.transformer
        pos = torch.arange(n, device=idx.device)                         # token i at row i + 1, or turned by i + 1
        rope = rotary(self.config, pos.expand_as(idx)) if self.config.pos == 'rope' else None
        x = tr.drop(tr.wte(idx) + tr.wpe(pos + 1) if rope is None else tr.wte(idx))  # (n, C) rows: wpe's grad as before
        for block in tr.h:
            x = block(x, rope=rope)  # full attention: the encoder's blocks are not causal
        return tr.ln_f(x)

    def encoder_logits(self, h):
        """The encoder MDM's logits from encoder_hidden's states (any leading shape, C last): the head, with
        [MASK] never predicted (MDLM's "SUBS" parameterisation). What forward and eval_harness.py score with."""
        logits = self.lm_head(h)
        logits[..., self.config.mask_token_id] = torch.finfo(logits.dtype).min
        return logits

    def _forward_encoder(self, idx, targets, t, reduction):
        cfg = self.config
        B, n = idx.shape
        h = self.encoder_hidden(idx)
        if targets is None:
            return self.encoder_logits(h), None
        masked = (idx == cfg.mask_token_id) & (targets >= 0)
        logits, nll = head_loss(self.encoder_logits, h, torch.where(masked, targets, -1), 'none', cfg.loss_chunk)
        if reduction == 'none':
            return logits, nll
        if t is not None:  # ELBO: (1/n) sum_{masked} -log p / t, averaged over the batch
            return logits, (nll.sum(1) / t / n).mean()
        return logits, nll.sum() / masked.sum().clamp(min=1)

    def forward_queries(self, ctx, ctx_pos, query_pos):
        """p(x at query_pos[:, j] | the context) for j < k, in one pass: (B, k, V).

        ctx (B, nc) tokens in the order they were revealed, at positions ctx_pos (B, nc); nc may be 0.
        The context slots carry chained targets; the last context token (or [None] if nc = 0) is copied
        k times, each copy conditioned on one query target, and the copies cannot see each other.
        """
        B, nc = ctx.shape
        k = query_pos.size(1)
        none = torch.full((B, 1), -1, dtype=torch.long, device=query_pos.device)
        last_tok = ctx[:, -1:] if nc else none
        last_pos = ctx_pos[:, -1:] if nc else none
        tok = torch.cat([none, ctx[:, :-1], last_tok.expand(B, k)], dim=1) if nc else none.expand(B, k)
        pos = torch.cat([none, ctx_pos[:, :-1], last_pos.expand(B, k)], dim=1) if nc else none.expand(B, k)
        tgt = torch.cat([ctx_pos, query_pos], dim=1)
        mask = parallel_mask(tok.size(1), k, device=tok.device) if k > 1 else None
        return self.forward_slots(tok, pos, tgt, mask=mask, n_logits=k)

    # ------------------------------------------------------------------ sizes
    def get_num_params(self):
        """All parameters (tied ones once), the lookup tables included."""
        return sum(p.numel() for p in self.parameters())

    def estimate_flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward): 6 x matmul params + attention, as in PaLM/nanoGPT.

        Counts every Linear a token passes through (blocks, per-token AdaLN, head), not the embedding
        lookups. The attention term counts the full T x T score matrix, as nanoGPT does.
        """
        cfg = self.config
        T = seq_len or cfg.block_size
        d, (nh, nkv, hd), hidden = cfg.n_embd, cfg.heads, cfg.mlp_hidden or 4 * cfg.n_embd
        n_fc = 2 if cfg.mlp == 'swiglu' else 1
        block = (d * (nh + 2 * nkv) * hd + nh * hd * d + (n_fc + 1) * hidden * d  # 12 d^2 for the paper's block
                 + (13 * d if cfg.bias else 0))
        adaln = 0
        if cfg.cond == 'adaln' and not cfg.adaln_table:
            adaln = cfg.n_layer * (cfg.target_dim * 6 * d) + cfg.target_dim * 2 * d
        n_matmul = cfg.n_layer * block + adaln + d * cfg.vocab_size
        return 6 * n_matmul + 12 * cfg.n_layer * nh * hd * T


def adapt(gpt, cond, adaln_std=None, **new):
    """A GPT (causal, cond='none') as an any-order decoder (cond 'adaln' or 'sigma') of the same shape that
    computes exactly the GPT's distribution at step 0, for every order: slot k predicts from the tokens revealed
    before it, as the GPT does, whatever its target (for the L2R order, the GPT's own logits). Every weight the
    two share is copied; what the new model adds starts so that the target changes nothing yet, each step an
    identity that is exact in floating point (x * 1, x + 0, 1 * y), so the logits are the GPT's bit for bit:
      adaln  the modulation Linear(SiLU(table[target])) is its bias when either factor is zero: biases zero but
             the gates', 1 (shift = scale = 0, gate = 1: x * (1 + 0) + 0 and x + 1 * y; the final norm alike), and
             adaln_std None: the Linears' weights zero, the table keeps its draw (target_std), so the Linears'
             gradient (upstream times SiLU(table)) is not zero; adaln_std s: the Linears keep their draw at std s,
             the table is zero (SiLU(0) = 0) and its gradient is SiLU'(0) = 1/2 times W^T upstream.
      sigma  the target table zero: x + 0 at the input; its gradient is the input's.
    new: the new model's keys the GPT has no use for (target_dim, target_std); it draws as GPT(config) does."""
    model = GPT(adapted_config(gpt.config, cond, adaln_std, **new))  # its biases: zero, the gates' 1 (gate1)
    missing, unexpected = model.load_state_dict(gpt.state_dict(), strict=False)
    assert not unexpected and all('wtpe' in k or 'adaLN' in k for k in missing), (missing, unexpected)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in missing:
            adapted_start(model.config, name, params[name])
    return model


def adapted_config(config, cond, adaln_std=None, **new):
    """The config adapt gives a GPT's config (one line for a model or a cond it cannot adapt)."""
    if not (config.causal and config.cond == 'none') or cond not in ('adaln', 'sigma' if adaln_std is None
                                                                     else 'adaln'):
        raise ValueError(f"adapt turns a GPT (causal=True, cond='none') into cond 'adaln' or 'sigma' (adaln_std: "
                         f"'adaln' only), not a model with causal={config.causal}, cond={config.cond!r} into "
                         f"cond={cond!r} with adaln_std={adaln_std}")
    return GPTConfig(**dict(asdict(config), **new, cond=cond, adaln_init='gate1', adaln_std=adaln_std))


def adapted_start(config, name, value):
    """A new parameter of an adapted model (config: adapted_config's) as adapt starts it from its draw, in place."""
    table = name.endswith('wtpe.weight') and (config.cond == 'sigma' or config.adaln_std is not None)
    linear = 'adaLN' in name and name.endswith('.weight') and config.adaln_std is None
    return value.zero_() if table or linear else value


# ---------------------------------------------------------------------- helpers shared by the scripts

def _check_ids(name, x, shape=None):
    """forward's inputs, idx (B, n) and order / targets of its shape, are integer tensors: a wrong one is one line
    naming it, not a dtype error from deep inside an embedding or gather (values unread: a device sync a call)."""
    if x is None and shape is not None:
        return
    ok = torch.is_tensor(x) and not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)
    if not ok or (x.dim() != 2 if shape is None else x.shape != shape):
        got = f"{x.dtype} of shape {tuple(x.shape)}" if torch.is_tensor(x) else type(x).__name__
        want = "(B, n)" if shape is None else f"idx's shape {tuple(shape)}"
        raise ValueError(f"GPT.forward: {name} must be an integer tensor of {want}, got {got}")


def strip_prefixes(sd):
    """A state dict's names without torch.compile's '_orig_mod.' and DDP's 'module.', wherever they are: GPT's own."""
    return {k.replace('_orig_mod.', '').replace('module.', ''): v for k, v in sd.items()}


def config_fields():
    return {f.name: f.default for f in fields(GPTConfig)}
