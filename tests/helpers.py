"""Tiny models and a fake Hugging Face cache, shared by the tests."""
import hashlib
import os

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


def hub_cache(root, repo, files, sha=None, refs=('main',), repo_type='model'):
    """One repo in an HF hub cache, laid out as huggingface_hub writes it: blobs/<sha256> hold the bytes,
    snapshots/<commit>/<path> are symlinks to them, refs/<ref> names the commit (no newline). files:
    {path in the repo: bytes, str, or a local file to copy}. Returns the commit (sha, or one derived
    from the contents)."""
    data = {p: (open(v, 'rb').read() if isinstance(v, os.PathLike) else v.encode() if isinstance(v, str) else v)
            for p, v in files.items()}
    sha = sha or hashlib.sha1(repr(sorted(data.items())).encode()).hexdigest()
    store = root / (f'{repo_type}s--' + repo.replace('/', '--'))
    for path, b in data.items():
        blob = store / 'blobs' / hashlib.sha256(b).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(b)
        link = store / 'snapshots' / sha / path
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(os.path.relpath(blob, link.parent))
    (store / 'refs').mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (store / 'refs' / ref).write_text(sha)
    return sha
