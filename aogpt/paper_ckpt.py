"""
The paper's released checkpoints (Cauthyyy/AO-GPT-MDM on Hugging Face: AO-GPT and sigma-GPT, Small and
Medium), converted in memory to our format: checkpoint.load_model detects them from their keys
(detect_format) and calls convert_paper_checkpoint. No second model class is needed, because model.py uses
the paper's slot layout; only names, switches and the EMA list need mapping.

The paper's files (torch.save of a plain dict):
  model       state dict of its AOGPT class (model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm.py or
              model_sigmaGPT.py); same names as ours except AO-GPT's final norm lives in `final_layer`
  ema_model   {'decay', 'num_updates', 'shadow_params': [tensor, ...]}, a LIST in the order of the
              paper's model.parameters() (tied weights once); the paper's eval uses these weights
  optimizer   AdamW state dict, indices in the paper's configure_optimizers order
  model_args  {n_layer, n_head, n_embd, block_size, bias, vocab_size, dropout}; iter_num; config
Forward semantics (docs/paper-checkpoints.md; tests/test_paper_ckpt.py checks them): n+1
slots, [None] first, target of the last slot zero. Ours feeds n slots; the paper's last slot predicts
nothing and causal attention keeps it from touching the others, so the n logits are identical.
"""

if __name__ == '__main__':  # run as a script (python aogpt/paper_ckpt.py): one line, not an ImportError
    raise SystemExit("error: aogpt/paper_ckpt.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import re
from dataclasses import asdict

from aogpt.errors import UserError
from model import GPTConfig, strip_prefixes

_PAPER_RENAME = (('transformer.final_layer.ln_f.', 'transformer.ln_f.'),
                 ('transformer.final_layer.adaLN_final.', 'transformer.adaLN_f.'))


def paper_param_names(fmt, n_layer, bias=True):
    """The paper's model.parameters() order, tied weights once: the order of its EMA list.

    Written out from the paper's module definitions (not derived from our model, whose module order
    differs: our wtpe and adaLN_f come after ln_f).
    """
    if fmt == 'paper-aogpt':
        block = ['ln_1.weight', 'attn.c_attn.weight', 'attn.c_attn.bias', 'attn.c_proj.weight',
                 'attn.c_proj.bias', 'attn.q_norm.weight', 'attn.k_norm.weight', 'ln_2.weight',
                 'mlp.c_fc.weight', 'mlp.c_fc.bias', 'mlp.c_proj.weight', 'mlp.c_proj.bias',
                 'adaLN.1.weight', 'adaLN.1.bias']
        tail = ['transformer.final_layer.ln_f.weight', 'transformer.final_layer.adaLN_final.1.weight',
                'transformer.final_layer.adaLN_final.1.bias', 'lm_head.weight', 'lm_head.bias']
    elif fmt == 'paper-sigma':
        block = ['ln_1.weight', 'ln_1.bias', 'attn.c_attn.weight', 'attn.c_attn.bias', 'attn.c_proj.weight',
                 'attn.c_proj.bias', 'ln_2.weight', 'ln_2.bias', 'mlp.c_fc.weight', 'mlp.c_fc.bias',
                 'mlp.c_proj.weight', 'mlp.c_proj.bias']
        tail = ['transformer.ln_f.weight', 'transformer.ln_f.bias']  # lm_head.weight is wte (tied)
    else:
        raise ValueError(fmt)
    if not bias:  # config.bias switches the Linear (and LayerNorm) biases; AdaLN and lm_head keep theirs
        block = [b for b in block if not b.endswith('.bias') or b.startswith('adaLN')]
        tail = [t for t in tail if t != 'transformer.ln_f.bias']
    head = ['transformer.wte.weight', 'transformer.wpe.weight', 'transformer.wtpe.weight',
            'transformer.wnonee.weight']
    return head + [f'transformer.h.{i}.{b}' for i in range(n_layer) for b in block] + tail


def _ours(name):
    for a, b in _PAPER_RENAME:
        if name.startswith(a):
            return b + name[len(a):]
    return name


def convert_paper_checkpoint(ckpt, fmt):
    """A paper checkpoint dict -> our format: model_args, renamed state dict, name-keyed EMA. The optimizer
    state is not carried over: a paper checkpoint is evaluated, sampled or fine-tuned with a fresh AdamW."""
    label = {'paper-aogpt': "the paper's AO-GPT", 'paper-sigma': "the paper's sigma-GPT"}[fmt]
    sd = strip_prefixes(ckpt['model'])
    # the causal-mask buffer ('h.i.attn.bias') exists only when torch lacked SDPA; it is not a weight
    sd = {k: v for k, v in sd.items() if not k.endswith('.attn.bias')}
    ma = ckpt.get('model_args') or {}
    wte, wpe = sd['transformer.wte.weight'], sd['transformer.wpe.weight']
    vocab_size, n_embd = wte.shape
    layers = {int(m.group(1)) for k in sd for m in [re.match(r'transformer\.h\.(\d+)\.', k)] if m}
    n_layer = len(layers)
    bias = 'transformer.h.0.attn.c_attn.bias' in sd
    names = paper_param_names(fmt, n_layer, bias)
    expected = set(names) | ({'lm_head.weight'} if fmt == 'paper-sigma' else set())
    if set(sd) != expected:
        raise UserError(f"{label} checkpoint does not have the documented parameters: missing "
                        f"{sorted(expected - set(sd))[:5]}, unexpected {sorted(set(sd) - expected)[:5]}")
    if fmt == 'paper-aogpt':
        n_head = n_embd // sd['transformer.h.0.attn.q_norm.weight'].numel()  # q_norm spans one head
        switches = dict(cond='adaln', target_dim=sd['transformer.wtpe.weight'].shape[1], norm='rms',
                        qk_norm=True, tie_head=False, head_bias=True, gelu='exact')
    else:
        if 'n_head' not in ma:
            raise UserError(f"{label} checkpoint has no model_args['n_head'] (it cannot be read from the weights)")
        n_head = ma['n_head']
        switches = dict(cond='sigma', norm='layer', qk_norm=False, tie_head=True, head_bias=False,
                        gelu='exact')
    found = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=wpe.shape[0] - 1,
                 vocab_size=vocab_size, bias=bias)
    bad = {k: (ma[k], v) for k, v in found.items() if k in ma and ma[k] is not None and ma[k] != v}
    if bad or n_embd % n_head:
        raise UserError(f"{label} checkpoint is inconsistent: model_args vs weights {bad}, n_embd {n_embd}, n_head "
                        f"{n_head}")
    config = GPTConfig(**found, dropout=float(ma.get('dropout', 0.0)), **switches)
    model_sd = {_ours(k): v for k, v in sd.items()}

    out = dict(format='aogpt-v1', source=fmt, tokenizer='gpt2', model_args=asdict(config), model=model_sd,
               iter_num=ckpt.get('iter_num', 0),
               # the paper's own train config: it has no 'dataset' key (it says train_dataset), so the
               # scripts fall back to the GPT-2 codec, which is what the paper's runs used
               config=dict(ckpt.get('config') or {}))
    ema = ckpt.get('ema_model')
    if ema:
        shadow = ema.get('shadow_params') or []
        if len(shadow) != len(names):
            raise UserError(f"{label} checkpoint's EMA list has {len(shadow)} tensors, expected {len(names)} "
                            f"(one per parameter in the paper's model.parameters() order)")
        for n, s in zip(names, shadow):  # a scrambled list shows up as a shape mismatch somewhere
            if tuple(s.shape) != tuple(sd[n].shape):
                raise UserError(f"{label} checkpoint's EMA list does not follow the documented order: entry for {n} "
                                f"has shape {tuple(s.shape)}, the weight has {tuple(sd[n].shape)}")
        out['ema'] = dict(decay=ema.get('decay', ckpt.get('ema_rate')), num_updates=ema.get('num_updates'),
                          params={_ours(n): s for n, s in zip(names, shadow)})
    return out
