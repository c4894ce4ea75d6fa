"""
Checkpoints: atomic saves, safe loads (weights_only=True), and one loader every script uses.

Our format (a plain dict, so `torch.load(weights_only=True)` reads it):
  format      'aogpt-v1'
  model_args  GPTConfig fields
  model       state dict, keys without the torch.compile ('_orig_mod.') or DDP ('module.') prefixes
  ema         {'decay': float, 'num_updates': int, 'params': {name: tensor}} keyed by parameter *name*
              (the paper's EMA is a positional list, which silently scrambles if modules are reordered)
  plus, from train.py: optimizer, scaler, iter_num, config, rng, data cursor, fixed order, ...

The paper's released checkpoints (scxue/AO-GPT-MDM on Hugging Face: AO-GPT and sigma-GPT, Small and
Medium) load through the same `load_model`: the format is detected from the state-dict keys and the
file is converted in memory to ours (see convert_paper_checkpoint). No second model class is needed,
because model.py uses the paper's slot layout; only names, switches and the EMA list need mapping.
"""

import os
import re
import sys
import warnings
from dataclasses import asdict

import torch

from configurator import die
from model import GPT, GPTConfig
from tokenizer import DataError, codec_from_record, get_codec

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
    """torch.load with weights_only=True on CPU; a corrupt or foreign file is one clear error line.

    Tries mmap first: tensors are then paged in only when used, so the optimizer state in a 7 GB
    paper checkpoint is never read when we only evaluate. Files in the legacy (non-zip) format cannot
    be mmapped and are read normally.
    """
    path = resolve_path(path)
    # torch warns while it fails on a foreign file (e.g. "pickle protocol 240"): a failure is our one
    # line alone, and the warnings of a load that works are shown as usual
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        try:
            ckpt = torch.load(path, map_location='cpu', weights_only=True, mmap=True)
        except Exception:
            try:
                ckpt = torch.load(path, map_location='cpu', weights_only=True)
            except Exception as e:
                _die_unreadable(path, e)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if not isinstance(ckpt, dict):
        die(f"{path} holds a {type(ckpt).__name__}, not a checkpoint dict")
    return ckpt


def _die_unreadable(path, e):
    with open(path, 'rb') as f:
        head = f.read(4)
    if head[:2] != b'PK' and head[:1] != b'\x80':  # torch.save writes a zip archive, or (legacy) a pickle
        die(f"{path} is not a checkpoint: torch files are zip archives (or legacy pickles), this one starts "
            f"with the bytes {head!r}")
    text = str(e)
    m = re.search(r'Unsupported global: GLOBAL ([\w.]+)', text)
    if m:
        die(f"cannot read checkpoint {path} with weights_only=True: it pickles {m.group(1)}, not just tensors, "
            f"numbers, strings, lists and dicts (if you trust the file, allow that type with "
            f"torch.serialization.add_safe_globals, or re-save the checkpoint without it)")
    msg = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    die(f"cannot read checkpoint {path}: it is truncated or corrupt ({msg[:200]})")


def strip_prefixes(sd):
    """Drop the '_orig_mod.' (torch.compile) and 'module.' (DDP) prefixes, wherever they are."""
    out = {}
    for k, v in sd.items():
        for p in ('_orig_mod.', 'module.'):
            k = k.replace(p, '')
        out[k] = v
    return out


def detect_format(ckpt):
    """'aogpt' (ours), 'paper-aogpt', 'paper-sigma' (the paper's released files), or None."""
    if ckpt.get('format') == 'aogpt-v1':
        return 'aogpt'
    sd = ckpt.get('model')
    if not isinstance(sd, dict):
        return None
    keys = set(strip_prefixes(sd))
    if not {'transformer.wte.weight', 'transformer.wpe.weight', 'transformer.wtpe.weight',
            'transformer.wnonee.weight'} <= keys:
        return None
    if 'transformer.final_layer.adaLN_final.1.weight' in keys:
        return 'paper-aogpt'
    if 'transformer.ln_f.weight' in keys and not any('adaLN' in k for k in keys):
        return 'paper-sigma'
    return None


def load_model(path, device='cpu', use_ema=None):
    """Build the model a checkpoint describes. use_ema=None means: EMA weights when the file has them.

    Reads our checkpoints and the paper's released AO-GPT / sigma-GPT files alike (detected from the
    keys). Returns (model in eval mode on `device`, the checkpoint dict in our format, whether EMA
    weights were used). For a paper file the dict also has 'source' ('paper-aogpt' | 'paper-sigma')
    and 'tokenizer': 'gpt2'.
    """
    ckpt = load_checkpoint(path)
    fmt = detect_format(ckpt)
    if fmt is None:
        die(f"{resolve_path(path)} is neither an aogpt checkpoint (format='aogpt-v1') nor one of the "
            f"paper's AO-GPT / sigma-GPT checkpoints: {_describe(ckpt)}")
    if fmt != 'aogpt':
        ckpt = convert_paper_checkpoint(ckpt, fmt)
    model = GPT(GPTConfig(**ckpt['model_args']))
    sd = strip_prefixes(ckpt['model'])
    try:
        missing, unexpected = model.load_state_dict(sd, strict=False)
    except RuntimeError as e:  # a size mismatch
        die(f"checkpoint weights do not fit its model_args: {str(e).strip().splitlines()[-1].strip()[:300]}")
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
    if ckpt.get('source') == 'paper-sigma' and use_ema:
        print("note: using sigma-GPT's EMA weights; the paper evaluated its sigma-GPT checkpoints with the "
              "raw weights (--use_ema=False; train.py: --init_ema=False)", file=sys.stderr)
    model.to(device).eval()
    return model, ckpt, use_ema


def find_dataset(name, data_root='data'):
    """A dataset directory: `name` itself if it is a directory, else data_root/name, else the repo's
    data/name. None if none exists."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (name, os.path.join(data_root, name), os.path.join(here, 'data', name)):
        if os.path.isdir(d):
            return d
    return None


def checkpoint_codec(ckpt, dataset=''):
    """The codec that a checkpoint's token ids mean; the one place eval, sampling and training look it up.

    train.py stores the codec it trained with (Codec.record()), and that record wins: re-preparing the
    dataset afterwards (another text file, or --char=True into the same folder) must never change what
    a model decodes or how it is scored. `dataset` (a data directory, or a name under the run's
    data_root or data/) is then only a check, and a codec that disagrees is refused in one line.
    Checkpoints without a record (older ones, the paper's): the codec of `dataset`, else of the dataset
    the run trained on (looked up under the data_root it trained with), else GPT-2.
    """
    cfg = ckpt.get('config') or {}
    root = cfg.get('data_root') or 'data'
    chosen = None
    if dataset:
        d = find_dataset(dataset, root)
        if d is None:
            die(f"--dataset {dataset}: no such data directory (tried {dataset}, {os.path.join(root, dataset)} "
                f"and data/{dataset}); leave it empty to use the checkpoint's codec")
        chosen = _codec_of(d)
    try:
        stored = codec_from_record(ckpt['codec']) if ckpt.get('codec') else None
    except DataError as e:
        die(e.msg)
    if stored is not None:
        if chosen is not None and chosen.record() != stored.record():
            die(f"--dataset {dataset} uses a {_describe_codec(chosen)} codec, but the checkpoint was trained "
                f"with a {_describe_codec(stored)} one: its ids would be misread; leave --dataset out")
        return stored
    if chosen is not None:
        return chosen
    d = find_dataset(cfg['dataset'], root) if cfg.get('dataset') else None
    return _codec_of(d) if d else get_codec(None)


def _codec_of(d):
    try:
        return get_codec(d)
    except DataError as e:
        die(e.msg)


def _describe_codec(codec):
    return f"{codec.name} ({codec.vocab_size} symbols)"


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


def _describe(ckpt):
    """What a foreign checkpoint holds, in one line, so the user can tell what they passed."""
    out = f"top-level keys {sorted(map(str, ckpt))[:10]}"
    sd = ckpt.get('model', ckpt)
    if isinstance(sd, dict):
        tensors = [str(k) for k, v in sd.items() if torch.is_tensor(v)]
        if tensors:
            out += f", tensors like {tensors[:4]}"
    return out


# ---------------------------------------------------------------------- the paper's released checkpoints
# The paper's files (torch.save of a plain dict):
#   model       state dict of its AOGPT class (model_AOGPT_AdaLN6_NoRep_cond_128_trunc_qknorm.py or
#               model_sigmaGPT.py); same names as ours except AO-GPT's final norm lives in `final_layer`
#   ema_model   {'decay', 'num_updates', 'shadow_params': [tensor, ...]}, a LIST in the order of the
#               paper's model.parameters() (tied weights once); the paper's eval uses these weights
#   optimizer   AdamW state dict, indices in the paper's configure_optimizers order
#   model_args  {n_layer, n_head, n_embd, block_size, bias, vocab_size, dropout}; iter_num; config
# Forward semantics (see ../shared/reference/paper-checkpoints.md and tests/test_paper_ckpt.py): n+1
# slots, [None] first, target of the last slot zero. Ours feeds n slots; the paper's last slot predicts
# nothing and causal attention keeps it from touching the others, so the n logits are identical.

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
    """A paper checkpoint dict -> our format: model_args, renamed state dict, name-keyed EMA, optimizer."""
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
        die(f"{label} checkpoint does not have the documented parameters: missing "
            f"{sorted(expected - set(sd))[:5]}, unexpected {sorted(set(sd) - expected)[:5]}")
    if fmt == 'paper-aogpt':
        n_head = n_embd // sd['transformer.h.0.attn.q_norm.weight'].numel()  # q_norm spans one head
        switches = dict(cond='adaln', target_dim=sd['transformer.wtpe.weight'].shape[1], norm='rms',
                        qk_norm=True, tie_head=False, head_bias=True, gelu='exact')
    else:
        if 'n_head' not in ma:
            die(f"{label} checkpoint has no model_args['n_head'] (it cannot be read from the weights)")
        n_head = ma['n_head']
        switches = dict(cond='sigma', norm='layer', qk_norm=False, tie_head=True, head_bias=False,
                        gelu='exact')
    found = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=wpe.shape[0] - 1,
                 vocab_size=vocab_size, bias=bias)
    bad = {k: (ma[k], v) for k, v in found.items() if k in ma and ma[k] is not None and ma[k] != v}
    if bad or n_embd % n_head:
        die(f"{label} checkpoint is inconsistent: model_args vs weights {bad}, n_embd {n_embd}, n_head {n_head}")
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
            die(f"{label} checkpoint's EMA list has {len(shadow)} tensors, expected {len(names)} "
                f"(one per parameter in the paper's model.parameters() order)")
        for n, s in zip(names, shadow):  # a scrambled list shows up as a shape mismatch somewhere
            if tuple(s.shape) != tuple(sd[n].shape):
                die(f"{label} checkpoint's EMA list does not follow the documented order: entry for {n} "
                    f"has shape {tuple(s.shape)}, the weight has {tuple(sd[n].shape)}")
        out['ema'] = dict(decay=ema.get('decay', ckpt.get('ema_rate')), num_updates=ema.get('num_updates'),
                          params={_ours(n): s for n, s in zip(names, shadow)})
    if ckpt.get('optimizer'):
        out['optimizer'] = _remap_optimizer(ckpt['optimizer'], names, config, sd)
    return out


def _remap_optimizer(opt, names, config, sd):
    """Renumber an AdamW state dict from the paper's parameter order to GPT.configure_optimizers'.

    Both split the parameters the same way (matrices decayed, vectors not), each group in its model's
    parameter order; the orders differ, so the indices must be renumbered by name. Returns None (with a
    note) if the groups do not have the expected sizes: the weights still load, the moments start fresh.
    """
    def layout(order):  # flat optimizer index of each parameter name
        decay = [n for n in order if sd[n].dim() >= 2]
        no_decay = [n for n in order if sd[n].dim() < 2]
        return decay, no_decay, {n: i for i, n in enumerate(decay + no_decay)}

    to_paper = {_ours(n): n for n in names}
    with torch.device('meta'):  # our parameter order, without allocating a model
        ours = [to_paper[n] for n, _ in GPT(config).named_parameters()]
    p_decay, p_no, p_idx = layout(names)
    o_decay, o_no, o_idx = layout(ours)
    groups = opt.get('param_groups', [])
    if [len(g['params']) for g in groups] != [len(p_decay), len(p_no)]:
        print(f"note: the paper checkpoint's optimizer has groups of {[len(g['params']) for g in groups]} "
              f"parameters, expected {[len(p_decay), len(p_no)]}; its state is not carried over",
              file=sys.stderr)
        return None
    flat = [i for g in groups for i in g['params']]  # the saved ids, in the paper's order
    state = {}
    for n, i in p_idx.items():
        if flat[i] in opt['state']:
            state[o_idx[n]] = opt['state'][flat[i]]
    new_groups = [dict(groups[0], params=[o_idx[n] for n in o_decay]),
                  dict(groups[1], params=[o_idx[n] for n in o_no])]
    return {'state': state, 'param_groups': new_groups}

