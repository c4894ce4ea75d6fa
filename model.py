"""
AO-GPT: a decoder-only transformer that is a masked diffusion model (Xue et al., arXiv 2506.19935).
One file, one model class, three formulations selected by switches in GPTConfig:

  AO-GPT   causal=True,  cond='adaln'   any-order AR; target position enters through per-token AdaLN
  sigma-GPT causal=True, cond='sigma'   any-order AR; target-position embedding added at the input
  GPT      causal=True,  cond='none'    plain left-to-right GPT (order must be the identity)
  MDM      causal=False, cond='none'    encoder-only masked diffusion model with a [MASK] token

The GPT-2 switches (norm='layer', qk_norm=False, tie_head=True, head_bias=False, gelu='tanh') make the
L2R mode reproduce Hugging Face GPT-2 exactly (see from_pretrained).

Slot layout (the paper's, so its checkpoints load unchanged). A decoder sees n slots for n tokens:
  slot 0      the learned [None] start token:  wnonee + wpe[0]
  slot k>=1   the token revealed k-th, x[order[k-1]]:  wte[x] + wpe[order[k-1] + 1]
Slot k must predict the token at position order[k] (its *target*); with cond='adaln' the target enters
each block as shift/scale/gate of the norms, computed from a shared narrow table wtpe[order[k]].
Attention is plain causal over slots, i.e. causal in the permuted order. With order = identity this is
a GPT whose BOS is [None].

Public interface
  logits, loss = model(idx, order=None, targets=None)
      idx (B, n) tokens at their natural positions; order (B, n) a permutation per row (None = L2R).
      logits[:, i] is the distribution of the token at position order[:, i] given the tokens at
      order[:, :i]. targets (B, n) tokens at natural positions (usually idx; -1 = ignore); the loss is
      the mean cross-entropy over all n predictions, the first one made from [None].
      reduction='none' returns the per-slot NLL (B, n) instead of the mean.
      Encoder (MDM): idx holds [MASK] ids, logits are at natural positions, and with t (B,) the loss is
      the ELBO estimate (1/n) sum_{masked i} -log p(x_i | x_t) / t (see mdm_corrupt).
  model.forward_slots(tok, pos, tgt, cache=None, n_parallel=0)
      The slot-level pass everything else is built on. tok/pos/tgt (B, r): token id (-1 = [None]),
      its own position (-1 for [None]) and its target position (-1 = none). With a KVCache the rows
      attend to the cached slots first. The last n_parallel rows form a *parallel block*: each sees the
      cache, the rows before the block and itself, never the other rows of the block. The cache then
      keeps the rows before the block plus the block's first row; the other rows were throw-away
      queries (copies of the last revealed token that carry other targets).
  model.forward_queries(ctx, ctx_pos, query_pos)
      A context in any order plus k query target positions -> k distributions, in one pass.
  KVCache(model, batch_size)   a preallocated static cache (no copies of the cache per step).
  model.forward_static(tok, pos, tgt, cache, L, blk, r)
      forward_slots at a fixed shape for CUDA graphs: every row attends over the whole static cache
      under a mask, with L (cached slots) as a device tensor (sample.py's SlotStepper uses it).
"""

import math
import json
import os
from dataclasses import dataclass, asdict, fields

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


class Norm(nn.Module):
    """RMSNorm (weight only) or LayerNorm (weight, optional bias); eps 1e-5 like GPT-2 and the paper."""

    def __init__(self, ndim, kind='rms', bias=False):
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if (kind == 'layer' and bias) else None

    def forward(self, x):
        # weights cast to the activations' dtype: under bf16 autocast a float32 weight would send
        # rms_norm down its slow unfused path
        w = self.weight.to(x.dtype)
        if self.kind == 'rms':
            return F.rms_norm(x, w.shape, w, 1e-5)
        return F.layer_norm(x, w.shape, w, None if self.bias is None else self.bias.to(x.dtype), 1e-5)


class CausalSelfAttention(nn.Module):
    # named for nanoGPT/GPT-2 compatibility; with causal=False (the MDM) it is bidirectional

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        if config.qk_norm:
            self.q_norm = Norm(self.head_dim, 'rms')
            self.k_norm = Norm(self.head_dim, 'rms')
        self.qk_norm = config.qk_norm
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, attn, kv=None):
        # attn: (mask, is_causal) shared by all layers; kv: (cache, layer index) or None
        B, r, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, r, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, r, hd)
        k = k.view(B, r, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, r, self.n_head, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if kv is not None:
            cache, i = kv
            k, v = cache.append(i, k, v)  # (B, nh, L + r, hd): the cached slots, then these rows
        mask, is_causal = attn
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, r, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate='tanh' if config.gelu == 'tanh' else 'none')
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = Norm(config.n_embd, config.norm, config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = Norm(config.n_embd, config.norm, config.bias)
        self.mlp = MLP(config)
        if config.cond == 'adaln':
            # SiLU -> Linear(target_dim -> 6 n_embd): shift/scale/gate for attention, then for the MLP
            self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(config.target_dim, 6 * config.n_embd))

    def forward(self, x, mod, attn, kv=None):
        if mod is None:  # plain pre-norm block (GPT, sigma-GPT, MDM)
            x = x + self.attn(self.ln_1(x), attn, kv)
            return x + self.mlp(self.ln_2(x))
        if isinstance(mod, tuple):  # adaln_table: (idx (B, r), table (block_size + 1, 6C))
            idx, tab = mod
            C = x.size(-1)
            x = _gated_residual(x, self.attn(_modulated_norm(self.ln_1, x, idx, tab[:, :2 * C]), attn, kv),
                                idx, tab[:, 2 * C:3 * C])
            return _gated_residual(x, self.mlp(_modulated_norm(self.ln_2, x, idx, tab[:, 3 * C:5 * C])),
                                   idx, tab[:, 5 * C:])
        # mod: (B, r, 6C), per token, because every slot has its own target position
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mod.chunk(6, dim=-1)
        x = x + gate_a * self.attn(self.ln_1(x) * (1 + scale_a) + shift_a, attn, kv)
        return x + gate_m * self.mlp(self.ln_2(x) * (1 + scale_m) + shift_m)


def _mod_norm(norm, x, idx, tab):
    shift, scale = F.embedding(idx, tab).chunk(2, dim=-1)   # (B, r, C) each, gathered by target
    return norm(x) * (1 + scale) + shift


def _gate_res(x, y, idx, tab):
    return x + F.embedding(idx, tab) * y


# With adaln_table the modulation is a gather from a small table, so in training we recompute it in the
# backward pass instead of storing shift/scale/gate and norm(x) per token: the per-token AdaLN then costs
# about two (B, r, C) tensors per block over a plain GPT block (the branch outputs the gates multiply).
def _modulated_norm(norm, x, idx, tab):
    if torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(_mod_norm, norm, x, idx, tab, use_reentrant=False)
    return _mod_norm(norm, x, idx, tab)


def _gated_residual(x, y, idx, tab):
    if torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(_gate_res, x, y, idx, tab, use_reentrant=False)
    return _gate_res(x, y, idx, tab)


class KVCache:
    """Static per-layer K/V buffers of length block_size, written in place.

    `len` counts the committed slots. A call writes its r rows at [len, len + r) and attends over
    [0, len + r); afterwards only the committed rows count, so the throw-away parallel copies are simply
    overwritten by the next call. The total live length never exceeds n: committed slots plus the rows
    of one call is at most the number of tokens in the sequence.

    static=True is the layout of model.forward_static (fixed shapes, for CUDA graphs): the buffers are
    zeroed (every row attends over all of them under a mask, and a masked NaN would still poison the
    output through 0 * NaN), a call writes at the positions in `write_idx` and attends over the whole
    buffer, and the length is rounded up past block_size so that padding rows have a scratch row.
    """

    @staticmethod
    def static_len(block_size):
        """Slots of a static cache: past block_size (a scratch row), 16-aligned (mask rows for SDPA)."""
        return (block_size // 16 + 1) * 16

    def __init__(self, model, batch_size, device=None, dtype=None, static=False):
        c = model.config
        S = self.static_len(c.block_size) if static else c.block_size
        self.shape = (batch_size, c.n_head, S, c.n_embd // c.n_head)
        self.n_layer, self.device, self.dtype, self.static = c.n_layer, device, dtype, static
        self.k = self.v = None
        self.len = 0
        self.write_idx = None  # static: (R,) cache rows of this call's R rows (set by forward_static)

    def allocate(self, device, dtype):
        new = torch.zeros if self.static else torch.empty
        self.k = [new(self.shape, device=device, dtype=dtype) for _ in range(self.n_layer)]
        self.v = [new(self.shape, device=device, dtype=dtype) for _ in range(self.n_layer)]

    def append(self, i, k, v):
        if self.k is None:  # allocate lazily, so the dtype follows autocast
            self.allocate(k.device, k.dtype)
        if self.write_idx is not None:  # static shapes: no slicing by a host-side length
            self.k[i].index_copy_(2, self.write_idx, k.to(self.k[i].dtype))
            self.v[i].index_copy_(2, self.write_idx, v.to(self.v[i].dtype))
            return self.k[i], self.v[i]
        L, r = self.len, k.size(2)
        if L + r > self.shape[2]:
            raise ValueError(f"KV cache overflow: {L} cached + {r} new rows > block_size {self.shape[2]}")
        self.k[i][:, :, L:L + r] = k.to(self.k[i].dtype)
        self.v[i][:, :, L:L + r] = v.to(self.v[i].dtype)
        return self.k[i][:, :, :L + r], self.v[i][:, :, :L + r]


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.cond in ('adaln', 'sigma', 'none'), f"cond must be adaln|sigma|none, got {config.cond!r}"
        assert config.norm in ('rms', 'layer') and config.gelu in ('exact', 'tanh')
        assert config.adaln_init in ('gate1', 'paper')
        if not config.causal:
            assert config.cond == 'none', "the encoder MDM takes no target conditioning"
            assert 0 <= config.mask_token_id < config.vocab_size, "mask_token_id must be a vocab id"
        self.config = config
        d = config.n_embd
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, d),
            wpe=nn.Embedding(config.block_size + 1, d),  # row 0: [None]; a token at position p uses row p+1
            wnonee=nn.Embedding(1, d),                      # the [None] start token (the paper's name)
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=Norm(d, config.norm, config.bias),
        ))
        if config.cond == 'adaln':
            self.transformer.wtpe = nn.Embedding(config.block_size, config.target_dim)
            self.transformer.adaLN_f = nn.Sequential(nn.SiLU(), nn.Linear(config.target_dim, 2 * d))
        elif config.cond == 'sigma':
            self.transformer.wtpe = nn.Embedding(config.block_size, d)  # full width, added at the input
        self.lm_head = nn.Linear(d, config.vocab_size, bias=config.head_bias)
        if config.tie_head:
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):  # GPT-2's scaled init of the residual projections
                nn.init.trunc_normal_(p, std=0.02 / math.sqrt(2 * config.n_layer), a=-0.06, b=0.06)
        if config.cond == 'adaln':
            # The target reaches the residual stream only through table -> SiLU -> Linear, a product of
            # two init-scale factors. At 0.02 each (the paper's) a small model sits ~1000 steps on a
            # plateau at the unigram loss; target_std=1 alone does not shorten it, target_std=1 with
            # adaln_std=0.2 removes it (README, finding 5a).
            # This redraws the table after self.apply's generic draw on purpose: skipping that first draw
            # would shift every later init value and change the committed results/ and README figures.
            s = config.target_std
            nn.init.trunc_normal_(self.transformer.wtpe.weight, std=s, a=-3 * s, b=3 * s)
            if config.adaln_std is not None:
                s = config.adaln_std
                for lin in [b.adaLN[1] for b in self.transformer.h] + [self.transformer.adaLN_f[1]]:
                    nn.init.trunc_normal_(lin.weight, std=s, a=-3 * s, b=3 * s)
        if config.cond == 'adaln' and config.adaln_init == 'gate1':
            # Gates start at 1 so each block starts as a plain pre-norm block (as the GPT baseline does);
            # the paper's init has all biases 0, i.e. gates near 0, which trains more slowly at first.
            for block in self.transformer.h:
                b = block.adaLN[1].bias.data.view(6, d)
                b[2].fill_(1.0)
                b[5].fill_(1.0)

    def _init_weights(self, module):
        # truncated normal (+-3 sigma) as in the paper's code; biases zero
        if isinstance(module, nn.Linear):
            nn.init.trunc_normal_(module.weight, std=0.02, a=-0.06, b=0.06)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.trunc_normal_(module.weight, std=0.02, a=-0.06, b=0.06)

    # ------------------------------------------------------------------ sizes
    @property
    def any_order(self):
        """True if the model can condition on an arbitrary generation order."""
        return self.config.causal and self.config.cond != 'none'

    def get_num_params(self, non_embedding=False):
        """All parameters (tied ones once). non_embedding drops the lookup tables, not the head."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            tr = self.transformer
            n -= tr.wpe.weight.numel() + tr.wnonee.weight.numel()
            if 'wtpe' in tr:
                n -= tr.wtpe.weight.numel()
            if not self.config.tie_head:
                n -= tr.wte.weight.numel()
        return n

    def estimate_flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward): 6 x matmul params + attention, as in PaLM/nanoGPT.

        Counts every Linear a token passes through (blocks, per-token AdaLN, head), not the embedding
        lookups. The attention term counts the full T x T score matrix, as nanoGPT does.
        """
        c = self.config
        T = seq_len or c.block_size
        d = c.n_embd
        block = 12 * d * d + (13 * d if c.bias else 0)
        adaln = 0
        if c.cond == 'adaln' and not c.adaln_table:
            adaln = c.n_layer * (c.target_dim * 6 * d) + c.target_dim * 2 * d
        n_matmul = c.n_layer * block + adaln + d * c.vocab_size
        return 6 * n_matmul + 12 * c.n_layer * d * T

    def estimate_mfu(self, tokens_per_s, peak_flops, seq_len=None):
        return self.estimate_flops_per_token(seq_len) * tokens_per_s / peak_flops

    # ------------------------------------------------------------------ forward passes
    def _modulation(self, tgt):
        """AdaLN inputs: ('token', None, (B, r, td) embeddings), or ('table', idx, (block_size + 1, td))."""
        tr = self.transformer
        if self.config.adaln_table:
            # The modulation depends only on the target position: each block computes all block_size
            # rows (+1 for "no target") once per pass and gathers them; the backward is an index_add.
            idx = torch.where(tgt >= 0, tgt, self.config.block_size)
            c = torch.cat([tr.wtpe.weight, tr.wtpe.weight.new_zeros(1, self.config.target_dim)])
            return ('table', idx, c)
        c = tr.wtpe(tgt.clamp(min=0)) * (tgt >= 0).unsqueeze(-1).to(tr.wtpe.weight.dtype)
        return ('token', None, c)

    @staticmethod
    def _apply_mod(layer, mod):
        """What a block takes: (B, r, 6C) per token, or (idx, table) in table mode."""
        kind, idx, c = mod
        if kind == 'token':
            return layer(c)
        return (idx, layer(c))

    def _embed(self, tok, pos, tgt):
        """Slot inputs (B, r) -> the residual stream x (B, r, C) and the AdaLN inputs (None without AdaLN)."""
        c, tr = self.config, self.transformer
        x = tr.wte(tok.clamp(min=0))                                      # (B, r, C)
        x = torch.where((tok < 0).unsqueeze(-1), tr.wnonee.weight[0].to(x.dtype), x)
        x = x + tr.wpe(pos + 1)
        mod = None
        if c.cond == 'sigma':
            x = x + tr.wtpe(tgt.clamp(min=0)) * (tgt >= 0).unsqueeze(-1).to(x.dtype)
        elif c.cond == 'adaln':
            mod = self._modulation(tgt)
        return tr.drop(x), mod

    def _trunk(self, x, mod, attn, cache):
        for li, block in enumerate(self.transformer.h):
            m6 = self._apply_mod(block.adaLN, mod) if mod is not None else None
            x = block(x, m6, attn, (cache, li) if cache is not None else None)
        return x

    def _final_norm(self, x, mod, n_logits=None):
        """ln_f (and, with AdaLN, its target modulation) on the last n_logits rows (all if None)."""
        tr = self.transformer
        if n_logits is not None:
            x = x[:, -n_logits:]
        x = tr.ln_f(x)
        if mod is not None:
            kind, idx, cc = mod
            if n_logits is not None:
                idx = idx[:, -n_logits:] if idx is not None else None
                cc = cc[:, -n_logits:] if kind == 'token' else cc
            m2 = self._apply_mod(tr.adaLN_f, (kind, idx, cc))
            if kind == 'table':
                x = _modulated_norm(lambda h: h, x, *m2)
            else:
                shift, scale = m2.chunk(2, dim=-1)
                x = x * (1 + scale) + shift
        return x

    def forward_slots(self, tok, pos, tgt, cache=None, n_parallel=0, n_logits=None):
        """The slot-level decoder pass. Returns logits (B, n_logits or r, V) for the last rows."""
        assert self.config.causal, "forward_slots is the decoder pass; the encoder MDM uses forward(idx)"
        r = tok.size(1)
        x, mod = self._embed(tok, pos, tgt)
        L = cache.len if cache is not None else 0
        if L == 0 and n_parallel <= 1:
            attn = (None, r > 1)  # plain causal: the flash-attention fast path
        elif r == 1:
            attn = (None, False)  # one row sees the whole cache
        else:
            i = torch.arange(r, device=tok.device)[:, None]
            j = torch.arange(r, device=tok.device)[None, :]
            blk = r - n_parallel
            m = (j <= i) & ((j < blk) | (j == i))                          # (r, r)
            attn = (torch.cat([m.new_ones(r, L), m], dim=1), False)      # (r, L + r)
        x = self._trunk(x, mod, attn, cache)
        if cache is not None:
            cache.len = L + (r - n_parallel + 1 if n_parallel > 0 else r)
        return self.lm_head(self._final_norm(x, mod, n_logits))

    def forward_static(self, tok, pos, tgt, cache, L, blk, r):
        """forward_slots with a parallel block, at a fixed shape: what a CUDA graph can capture.

        tok/pos/tgt (B, R): the call's r real rows (blk pending slots, then r - blk parallel copies),
        then R - r padding rows (any valid slot; samplers repeat the last row). L, blk, r: 0-dim long
        tensors on the device, so a captured graph reads their values at replay. cache: a
        KVCache(static=True) holding L committed slots. Returns the final-norm hidden states (B, R, C);
        the caller runs lm_head on the rows it needs and advances cache.len by blk + 1 itself.
        Every row attends over the whole cache buffer under a boolean mask (no shape depends on L):
        a pending row sees the cache and the pending rows up to itself, a copy sees the cache, the
        pending rows and itself, a padding row the same plus slot 0: never an empty softmax, which some
        kernels turn into 0 and others into NaN, and a NaN anywhere in the cache poisons every row
        through 0 * NaN. Real rows are written at L + i; padding rows past the buffer share its last
        (scratch) row, which no real row ever sees.
        """
        assert self.config.causal and cache.static, "forward_static needs a decoder and KVCache(static=True)"
        R, S = tok.size(1), cache.shape[2]
        x, mod = self._embed(tok, pos, tgt)
        i = torch.arange(R, device=tok.device)[:, None]                  # (R, 1) row
        j = torch.arange(S, device=tok.device)[None, :]                  # (1, S) cache slot
        vis = (j < L + torch.minimum(i + 1, blk)) | (j == L + i) | ((i >= r) & (j == 0))   # (R, S)
        cache.write_idx = (L + i[:, 0]).clamp(max=S - 1)                  # (R,)
        try:
            x = self._trunk(x, mod, (vis, False), cache)
        finally:
            cache.write_idx = None
        return self._final_norm(x, mod)

    def forward(self, idx, order=None, targets=None, t=None, reduction='mean'):
        c = self.config
        B, n = idx.shape
        if n > c.block_size:
            raise ValueError(f"sequence length {n} > block_size {c.block_size}")
        if not c.causal:
            return self._forward_encoder(idx, targets, t, reduction)
        if order is None:
            xs, pos = idx, torch.arange(n, device=idx.device).expand(B, n)
        else:
            xs, pos = idx.gather(1, order), order                        # tokens in reveal order (B, n)
        none = torch.full((B, 1), -1, dtype=torch.long, device=idx.device)
        tok = torch.cat([none, xs[:, :-1]], dim=1)                       # [None], x_s0 .. x_s(n-2)
        spos = torch.cat([none, pos[:, :-1]], dim=1)
        logits = self.forward_slots(tok, spos, pos)                      # slot i predicts position pos[:, i]
        if targets is None:
            return logits, None
        y = targets if order is None else targets.gather(1, order)
        return logits, self._ce(logits, y, reduction)

    def encoder_hidden(self, idx):
        """The encoder MDM's trunk: final-norm hidden states (B, n, C) for idx (B, n). The sampler runs
        lm_head only on the rows it reveals."""
        n = idx.size(1)
        tr = self.transformer
        x = tr.drop(tr.wte(idx) + tr.wpe(torch.arange(1, n + 1, device=idx.device)))
        for block in tr.h:
            x = block(x, None, (None, False))  # full attention: no mask, not causal
        return tr.ln_f(x)

    def _forward_encoder(self, idx, targets, t, reduction):
        c = self.config
        B, n = idx.shape
        logits = self.lm_head(self.encoder_hidden(idx))
        # the model never predicts [MASK] (MDLM's "SUBS" parameterisation)
        logits[..., c.mask_token_id] = torch.finfo(logits.dtype).min
        if targets is None:
            return logits, None
        masked = (idx == c.mask_token_id) & (targets >= 0)
        nll = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.clamp(min=0).view(-1),
                              reduction='none').view(B, n) * masked
        if reduction == 'none':
            return logits, nll
        if t is not None:  # ELBO: (1/n) sum_{masked} -log p / t, averaged over the batch
            return logits, (nll.sum(1) / t / n).mean()
        return logits, nll.sum() / masked.sum().clamp(min=1)

    @staticmethod
    def _ce(logits, y, reduction):
        nll = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1),
                              ignore_index=-1, reduction='none').view(y.shape)
        if reduction == 'none':
            return nll
        return nll.sum() / (y >= 0).sum().clamp(min=1)

    def forward_queries(self, ctx, ctx_pos, query_pos):
        """p(x at query_pos[:, j] | the context) for j < k, in one pass: (B, k, V).

        ctx (B, c) tokens in the order they were revealed, at positions ctx_pos (B, c); c may be 0.
        The context slots carry chained targets; the last context token (or [None] if c = 0) is copied k
        times, each copy conditioned on one query target, and the copies cannot see each other.
        """
        B, cl = ctx.shape
        k = query_pos.size(1)
        none = torch.full((B, 1), -1, dtype=torch.long, device=query_pos.device)
        last_tok = ctx[:, -1:] if cl else none
        last_pos = ctx_pos[:, -1:] if cl else none
        tok = torch.cat([none, ctx[:, :-1], last_tok.expand(B, k)], dim=1) if cl else none.expand(B, k)
        pos = torch.cat([none, ctx_pos[:, :-1], last_pos.expand(B, k)], dim=1) if cl else none.expand(B, k)
        tgt = torch.cat([ctx_pos, query_pos], dim=1)
        return self.forward_slots(tok, pos, tgt, n_parallel=k, n_logits=k)

    # ------------------------------------------------------------------ optimizer
    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        # Decay every matrix (embeddings and AdaLN included, as in the paper's code); not biases or norms.
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{'params': decay, 'weight_decay': weight_decay},
                  {'params': no_decay, 'weight_decay': 0.0}]
        fused = device_type == 'cuda'
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    # ------------------------------------------------------------------ GPT-2 weights
    @classmethod
    def from_pretrained(cls, path, **overrides):
        """Load a local Hugging Face GPT-2 directory (config.json + model.safetensors / pytorch_model.bin).

        With the default overrides this is GPT-2 itself (L2R mode equals HF's logits for
        [<|endoftext|>] + x). With cond='adaln' it warm-starts an AO-GPT: AdaLN weights are zero and the
        gate biases one, so the model starts as GPT-2 for every order, and learns to use the target.
        """
        with open(os.path.join(path, 'config.json')) as f:
            hf = json.load(f)
        args = dict(block_size=hf['n_positions'] - 1, vocab_size=hf['vocab_size'], n_layer=hf['n_layer'],
                    n_head=hf['n_head'], n_embd=hf['n_embd'], bias=True, cond='none', norm='layer',
                    qk_norm=False, tie_head=True, head_bias=False, gelu='tanh')
        args.update(overrides)
        model = cls(GPTConfig(**args))
        sd_hf = _load_hf_state_dict(path)
        eot = 50256
        sd = model.state_dict()
        transposed = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')
        with torch.no_grad():
            for k, v in sd_hf.items():
                k = k.removeprefix('transformer.') if k.startswith('transformer.') else k
                if k.endswith(('.attn.bias', '.attn.masked_bias')) or k == 'lm_head.weight':
                    continue  # causal-mask buffers; lm_head is tied to wte
                ours = 'transformer.' + k
                if ours not in sd:
                    raise KeyError(f"unexpected GPT-2 weight {k}")
                v = v.t() if k.endswith(transposed) else v
                if ours == 'transformer.wpe.weight':
                    v = v[:model.config.block_size + 1]
                sd[ours].copy_(v)
            # [None] plays GPT-2's <|endoftext|> at position 0
            sd['transformer.wnonee.weight'].copy_(sd['transformer.wte.weight'][eot:eot + 1])
            if not model.config.tie_head:
                sd['lm_head.weight'].copy_(sd['transformer.wte.weight'])
            if model.config.cond == 'adaln':
                d = model.config.n_embd
                for block in model.transformer.h:
                    block.adaLN[1].weight.zero_()
                    b = block.adaLN[1].bias.view(6, d)
                    b.zero_()
                    b[2].fill_(1.0)
                    b[5].fill_(1.0)
                model.transformer.adaLN_f[1].weight.zero_()
                model.transformer.adaLN_f[1].bias.zero_()
        return model


def _load_hf_state_dict(path):
    st = os.path.join(path, 'model.safetensors')
    if os.path.exists(st):
        from safetensors.torch import load_file
        return load_file(st)
    return torch.load(os.path.join(path, 'pytorch_model.bin'), map_location='cpu', weights_only=True)


# ---------------------------------------------------------------------- helpers shared by the scripts

def random_orders(B, n, device=None, generator=None):
    """B independent uniform permutations of range(n): argsort of uniform noise, on the device."""
    return torch.rand(B, n, device=device, generator=generator).argsort(dim=1)


def mdm_corrupt(x, mask_token_id, generator=None, t=None):
    """The MDM forward process: t ~ U(0, 1] per row (stratified over the batch to cut variance, still
    uniform marginally), each token replaced by [MASK] with probability t. Returns (x_t, t)."""
    B, n = x.shape
    if t is None:
        u = torch.rand(1, device=x.device, generator=generator)
        t = 1 - ((torch.arange(B, device=x.device) + u) / B) % 1.0  # in (0, 1]
        t = t[torch.randperm(B, device=x.device, generator=generator)]
    masked = torch.rand(B, n, device=x.device, generator=generator) < t[:, None]
    return torch.where(masked, torch.full_like(x, mask_token_id), x), t


def config_fields():
    return {f.name: f.default for f in fields(GPTConfig)}


def model_args(config):
    return asdict(config)
