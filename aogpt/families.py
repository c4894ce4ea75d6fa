"""
Open causal language models from a local Hugging Face folder, as our GPT (model.py): the families' names for
their weights mapped to ours.

    model = load_hf(folder, state_dict=None, cond='none', **overrides)
"""

if __name__ == '__main__':  # run as a script (python aogpt/families.py): one line, not an ImportError
    raise SystemExit("error: aogpt/families.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import json
import os

import torch

from model import GPT, GPTConfig, adapt


def load_hf(path, state_dict=None, cond='none', **overrides):
    """Load a local Hugging Face GPT-2 directory (config.json + model.safetensors / pytorch_model.bin);
    state_dict: its weights already read (aogpt.checkpoint.read_hf_weights, with one-line errors).

    With the default overrides this is GPT-2 itself (L2R mode equals HF's logits for
    [<|endoftext|>] + x). With cond='adaln' or 'sigma' it is GPT-2 adapted into an any-order decoder
    (adapt below), which starts as GPT-2 for every order and learns to use the target.
    """
    with open(os.path.join(path, 'config.json')) as f:
        hf = json.load(f)
    args = dict(block_size=hf['n_positions'] - 1, vocab_size=hf['vocab_size'], n_layer=hf['n_layer'],
                n_head=hf['n_head'], n_embd=hf['n_embd'], bias=True, cond='none', norm='layer',
                qk_norm=False, tie_head=True, head_bias=False, gelu='tanh')
    args.update(overrides)
    model = GPT(GPTConfig(**args))
    sd_hf = _load_hf_state_dict(path) if state_dict is None else state_dict
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
    return model if cond == 'none' else adapt(model, cond)


def _load_hf_state_dict(path):
    st = os.path.join(path, 'model.safetensors')
    if os.path.exists(st):
        from safetensors.torch import load_file
        return load_file(st)
    return torch.load(os.path.join(path, 'pytorch_model.bin'), map_location='cpu', weights_only=True)
