"""
Checkpoints: atomic saves, safe loads (weights_only=True), and one loader every script uses.

Our format (a plain dict, so `torch.load(weights_only=True)` reads it):
  format      'aogpt-v1'
  model_args  GPTConfig fields
  model       state dict, keys without the torch.compile ('_orig_mod.') or DDP ('module.') prefixes
  ema         {'decay': float, 'num_updates': int, 'params': {name: tensor}} keyed by parameter *name*
              (the paper's EMA is a positional list, which silently scrambles if modules are reordered)
  plus, from train.py: optimizer, scaler, iter_num, config, rng, data cursor, fixed order, ...
"""

import os

import torch

from configurator import die
from model import GPT, GPTConfig

CKPT_NAME = 'ckpt.pt'


def save_checkpoint(obj, path):
    """Write to a temp file, fsync, then rename: a kill mid-save never corrupts or loses `path`."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f'.{os.path.basename(path)}.tmp.{os.getpid()}')
    with open(tmp, 'wb') as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:  # make the rename itself durable
        fd = os.open(d, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    except OSError:
        pass


def resolve_path(path):
    """A checkpoint file, or a directory holding ckpt.pt."""
    if os.path.isdir(path):
        path = os.path.join(path, CKPT_NAME)
    if not os.path.exists(path):
        die(f"checkpoint not found: {path} (train one with `python train.py config/<name>.py`, "
            f"or pass --ckpt FILE / --out_dir DIR)")
    return path


def load_checkpoint(path):
    """torch.load with weights_only=True on CPU; a corrupt or foreign file is one clear error line."""
    path = resolve_path(path)
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        die(f"cannot read checkpoint {path}: it is truncated, corrupt or not a torch file ({msg[:200]})")
    if not isinstance(ckpt, dict):
        die(f"{path} holds a {type(ckpt).__name__}, not a checkpoint dict")
    return ckpt


def strip_prefixes(sd):
    """Drop the '_orig_mod.' (torch.compile) and 'module.' (DDP) prefixes, wherever they are."""
    out = {}
    for k, v in sd.items():
        for p in ('_orig_mod.', 'module.'):
            k = k.replace(p, '')
        out[k] = v
    return out


def detect_format(ckpt):
    if ckpt.get('format') == 'aogpt-v1':
        return 'aogpt'
    return None


def load_model(path, device='cpu', use_ema=None):
    """Build the model a checkpoint describes. use_ema=None means: EMA weights when the file has them.

    Returns (model in eval mode on `device`, the checkpoint dict, whether EMA weights were used).
    """
    ckpt = load_checkpoint(path)
    fmt = detect_format(ckpt)
    if fmt is None:
        die(f"{resolve_path(path)} is not an aogpt checkpoint: found keys {sorted(ckpt)[:12]}")
    model = GPT(GPTConfig(**ckpt['model_args']))
    sd = strip_prefixes(ckpt['model'])
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (model.config.tie_head and k == 'lm_head.weight')]
    if missing or unexpected:
        die(f"checkpoint does not match its model_args: missing {missing[:5]}, unexpected {unexpected[:5]}")
    ema = ckpt.get('ema')
    if use_ema is None:
        use_ema = bool(ema)
    if use_ema:
        if not ema:
            die("--use_ema=True but the checkpoint has no EMA weights")
        apply_ema(model, ema['params'])
    model.to(device).eval()
    return model, ckpt, use_ema


def apply_ema(model, ema_params):
    """Copy name-keyed EMA tensors into the model's parameters."""
    params = dict(model.named_parameters())
    ema_params = strip_prefixes(ema_params)
    unknown = [k for k in ema_params if k not in params]
    if unknown:
        die(f"EMA holds parameters the model lacks: {unknown[:5]}")
    with torch.no_grad():
        for k, v in ema_params.items():
            params[k].copy_(v)
