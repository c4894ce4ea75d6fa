"""Tiny models shared by the tests."""
import torch

from model import GPT, GPTConfig


def tiny(seed=0, **kw):
    """A small random model; AdaLN weights are made non-trivial so target conditioning matters."""
    args = dict(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16, target_dim=8)
    args.update(kw)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**args))
    with torch.no_grad():  # larger random weights than the 0.02 init, so every path visibly matters
        for name, p in model.named_parameters():
            if 'adaLN' in name or 'wtpe' in name or 'wnonee' in name or 'wpe' in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model.eval()
