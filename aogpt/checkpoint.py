"""
Checkpoints: atomic saves, safe loads (weights_only=True), and one loader every script uses.

Our format (a plain dict, so `torch.load(weights_only=True)` reads it):
  format      'aogpt-v1'
  model_args  GPTConfig fields
  model       state dict, keys without the torch.compile ('_orig_mod.') or DDP ('module.') prefixes
  ema         {'decay': float, 'num_updates': int, 'params': {name: tensor}} keyed by parameter *name*
              (the paper's EMA is a positional list, which silently scrambles if modules are reordered)
  plus, from train.py: optimizers, scaler, iter_num, config, codec, the fixed order, the training losses since
  the last eval, ... (no RNG state or data cursor: every training draw is a function of (seed, iteration))

The paper's released checkpoints (Cauthyyy/AO-GPT-MDM on Hugging Face: AO-GPT and sigma-GPT, Small and
Medium) load through the same `load_model`: the format is detected from the state-dict keys and the
file is converted in memory to ours (paper_ckpt.py).

Exported folders (export.py: config.json + model.safetensors + README.md, one set of weights) are the
format for sharing: they load without unpickling anything. Where a checkpoint can be, resolve_path
takes (the one resolver every script goes through):
  FILE                          a torch checkpoint (ours or the paper's)
  DIR                           DIR/ckpt.pt (a train.py run), else DIR as an exported folder
  hf:owner/repo[@rev]           an exported folder on the Hugging Face hub (config.json + model.safetensors)
  hf:owner/repo[@rev]/sub       the same, in the repo's folder sub
  hf:owner/repo[@rev]/p/f.pt    one torch checkpoint in the repo (.pt, .pth, .ckpt, .bin)
Hub files go through huggingface_hub into its cache (HF_HUB_CACHE), only the files named; offline the
cache serves, and a file that is not cached fails at once in one line saying how to get it.
"""

if __name__ == '__main__':  # run as a script (python aogpt/checkpoint.py): one line, not an ImportError
    raise SystemExit("error: aogpt/checkpoint.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import hashlib
import io
import json
import os
import pickletools
import re
import sys
import warnings
from dataclasses import fields

import torch

from aogpt import ROOT, sharded
from aogpt.errors import UserError, first_line
from aogpt.paths import append_jsonl, atomic_write, check_writable
from aogpt.paper_ckpt import convert_paper_checkpoint
from aogpt.tokenizer import codec_from_record, get_codec
from model import GPT, GPTConfig, strip_prefixes

CKPT_NAME = 'ckpt.pt'
EXPORT_FORMAT, EXPORT_VERSION = 'aogpt-export', 1
EXPORT_CONFIG, EXPORT_WEIGHTS = 'config.json', 'model.safetensors'
HUB_PREFIX = 'hf:'
TORCH_SUFFIXES = ('.pt', '.pth', '.ckpt', '.bin')  # what names a torch file inside a hub repo


def save_record(path, record, say=print):
    """An eval record as JSON at path (atomically), and appended to the .jsonl history beside it, where every run
    is kept: a run of other sets or tasks replaces the JSON, never an earlier run's numbers (say: how the
    history's cut last line is reported, append_jsonl). Returns the history's path; a failed write raises
    OSError, its filename the file that failed."""
    history = os.path.splitext(path)[0] + '.jsonl'
    try:
        atomic_write(path, lambda f: json.dump(record, f, indent=2), 'w')
    except OSError as e:  # named, as append_jsonl names the history: the caller's line says which file failed
        raise OSError(e.errno, e.strerror or str(e), e.filename or path) from e
    append_jsonl(history, record, say)
    return history


def record_path(out, ckpt, kind):
    """Where an eval command writes its record, one rule for eval_ppl.py (kind 'eval_ppl', --json_out) and
    eval_harness.py (kind 'harness', --out): `out` when given; else beside the checkpoint `ckpt`, as
    DIR/{kind}.json for a run or export folder, {kind}.json beside a ckpt.pt and {stem}.{kind}.json beside
    any other file (ckpt_0002000.pt -> ckpt_0002000.{kind}.json); for hf:owner/repo[@rev][/path], in the
    current folder (never into the HF cache) as {repo}[@rev][_path].{kind}.json, the path's folders joined
    by '_' and a torch file's suffix dropped. The .jsonl history goes beside it (save_record)."""
    if out:
        return out
    if ckpt.startswith(HUB_PREFIX):
        repo, rev, sub = parse_hub_spec(ckpt)
        sub = sub[:-len(os.path.splitext(sub)[1])] if sub.endswith(TORCH_SUFFIXES) else sub
        name = repo.split('/')[1] + (f'@{rev}' if rev else '') + (f"_{sub.replace('/', '_')}" if sub else '')
        return f'{name}.{kind}.json'
    if os.path.isdir(ckpt):
        return os.path.join(ckpt, f'{kind}.json')
    stem = os.path.splitext(os.path.basename(ckpt))[0]
    return os.path.join(os.path.dirname(ckpt) or '.', f'{kind}.json' if stem == 'ckpt' else f'{stem}.{kind}.json')


def check_record_path(out, ckpt, kind, flag):
    """record_path, checked writable before the evaluation that fills it (paths.check_writable's one line,
    which says when the path is the default beside the checkpoint). Returns the path."""
    path = record_path(out, ckpt, kind)
    check_writable(path, flag, f'{kind}.json', create=True, given=bool(out))
    return path


def save_checkpoint(obj, path):
    """torch.save through atomic_write: a kill or a full disk mid-save never corrupts or loses `path`."""
    atomic_write(path, lambda f: torch.save(obj, f))


def resolve_path(path):
    """Where a checkpoint lives on this machine: a torch file, or a folder holding an export (config.json
    + model.safetensors, checked when read). hf: specs are fetched into the HF cache first."""
    if path.startswith(HUB_PREFIX):
        return fetch_from_hub(path)
    if os.path.isdir(path):
        run, export = os.path.join(path, CKPT_NAME), os.path.join(path, EXPORT_CONFIG)
        if sharded.is_save(path) or (os.path.exists(export) and not os.path.exists(run)):  # a run's ckpt.pt wins
            return path
        held = [] if os.path.exists(run) else sharded.saves(path)
        if held:  # a sharded run: its newest save
            return held[0]
        path = run
    elif os.path.basename(path) in (EXPORT_CONFIG, EXPORT_WEIGHTS) and os.path.exists(path):
        return os.path.dirname(path) or '.'  # a file of an export names its folder
    if not os.path.exists(path):
        folder = os.path.dirname(path) or '.'
        held = run_checkpoints(folder)
        if held and os.path.basename(path) == CKPT_NAME:  # its ckpt.pt is gone, its periodic copies are not
            raise UserError(f"{folder} holds no {CKPT_NAME} but periodic copies "
                            f"({', '.join(os.path.basename(h) for h in held[:3])}{', ...' if len(held) > 3 else ''}): "
                            f"pass one with --ckpt {held[0]}")
        if os.path.exists(os.path.join(folder, EXPORT_WEIGHTS)) and not os.path.exists(
                os.path.join(folder, EXPORT_CONFIG)):
            raise UserError(f"{folder} holds {EXPORT_WEIGHTS} but no {EXPORT_CONFIG}, so it is not a complete "
                            f"export.py folder (and it has no {CKPT_NAME}): copy the export's {EXPORT_CONFIG} beside "
                            f"it, or export the checkpoint again")
        repo = re.fullmatch(r'[\w-][\w.-]*/[\w.-]+', path) and not path.endswith(TORCH_SUFFIXES)
        found = runs_here()
        raise UserError(f"checkpoint not found: {path} (" +
                        (f"checkpoints here: {', '.join(found)}; pass one with --out_dir DIR or --ckpt" if found else
                         "train one with `python train.py config/<name>.py`, or pass --ckpt FILE / --out_dir DIR, an "
                         "export.py folder or hf:owner/repo") +
                        (f"; for a Hugging Face repo write hf:{path})" if repo else ")"))
    return path


def run_checkpoints(folder):
    """The checkpoints a train.py run dir holds, the one to resume first: ckpt.pt (always the newest, since
    the periodic copies ckpt_<iter>.pt are links to earlier ones), then the copies, newest first; a sharded run's
    (fsdp=True) whole save folders ckpt_<iter>.dcp, newest first (aogpt/sharded.py)."""
    try:
        copies = sorted((f for f in os.listdir(folder) if re.fullmatch(r'ckpt_\d+\.pt', f)), reverse=True)
    except OSError:
        return []
    return [os.path.join(folder, f) for f in [CKPT_NAME] * os.path.exists(os.path.join(folder, CKPT_NAME)) + copies] \
        + sharded.saves(folder)


def runs_here(root='.', limit=6):
    """The folders under root (one level) that hold a checkpoint: a train.py run or an export."""
    try:
        dirs = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith('.'))
    except OSError:
        return []
    found = [d for d in dirs if os.path.exists(os.path.join(root, d, CKPT_NAME)) or
             is_export(os.path.join(root, d))]
    return found[:limit] + (['...'] if len(found) > limit else [])


def load_checkpoint(path):
    """torch.load with weights_only=True on CPU; a corrupt or foreign file is one clear error line.

    Tries mmap first: tensors are then paged in only when used, so the optimizer state in a 7 GB
    paper checkpoint is never read when we only evaluate. Files in the legacy (non-zip) format cannot
    be mmapped and are read normally. An exported folder is read by read_export (no torch.load at all).
    """
    path = resolve_path(path)
    if sharded.is_save(path):
        return sharded.read(path)
    if os.path.isdir(path):
        return read_export(path)
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
                _raise_unreadable(path, e)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if not isinstance(ckpt, dict):
        raise UserError(f"{path} holds a {type(ckpt).__name__}, not a checkpoint dict")
    return ckpt


def _raise_unreadable(path, e):
    with open(path, 'rb') as f:
        head = f.read(64)
    if head[:2] != b'PK' and head[:1] != b'\x80':  # torch.save writes a zip archive, or (legacy) a pickle
        raise UserError(f"{path} is not a checkpoint: torch files are zip archives (or legacy pickles), this one "
                        f"starts with the bytes {head[:4]!r}")
    if head[:1] == b'\x80' and not _legacy_torch(head):
        raise UserError(f"refused {path}: it is a plain Python pickle (pickle.dump), not a torch checkpoint, and "
                        f"unpickling it could run any code it names; save the weights with torch.save (tensors, "
                        f"numbers, strings, lists and dicts) or as safetensors")
    text = str(e)
    # torch's wording varies by what is named ("Unsupported global: GLOBAL print ...", "Trying to load unsupported
    # GLOBAL posix.system whose module posix is blocked"); the name after GLOBAL is what the file asks for
    m = re.search(r'GLOBAL ([\w.]+)', text)
    if m:
        raise UserError(f"refused {path}: it holds a pickled {m.group(1)}, which loading would run as code "
                        f"(weights_only: a checkpoint may hold tensors, numbers, strings, lists and dicts only). "
                        f"Re-save it without that object; only for a class you trust, "
                        f"torch.serialization.add_safe_globals allows it")
    # torch's own first sentence says what failed; its next ones are advice about its internals
    raise UserError(f"cannot read checkpoint {path}: it is truncated or corrupt "
                    f"({first_line(e).split('. ')[0].rstrip('.')}); copy it again, or pass another checkpoint")


def _legacy_torch(head):
    """Whether a pickle's first bytes are a legacy (non-zip) torch.save file's: its first pickle is torch's magic
    number. Read with pickletools, which only lists the opcodes (nothing is unpickled)."""
    try:
        for op, arg, _ in pickletools.genops(io.BytesIO(head)):
            if op.name == 'STOP':
                return False
            if op.name.startswith(('LONG', 'INT')) and arg == torch.serialization.MAGIC_NUMBER:
                return True
    except ValueError:  # the 64 bytes end mid-opcode
        pass
    return False


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


def load_model(path, device='cpu', use_ema=None, dataset=None):
    """Build the model a checkpoint describes. use_ema=None means: EMA weights when the file has them.

    Reads our checkpoints and the paper's released AO-GPT / sigma-GPT files alike (detected from the
    keys). Returns (model in eval mode on `device`, the checkpoint dict in our format, whether EMA
    weights were used). For a paper file the dict also has 'source' ('paper-aogpt' | 'paper-sigma')
    and 'tokenizer': 'gpt2'.
    dataset: a command's --dataset ('' for none): then also the codec the model's ids mean
    (checkpoint_codec), refused in one line unless it fits the model (codec_misfit), as a fourth item:
    (model, ckpt, used_ema, codec). What every command that scores, samples or exports calls.
    """
    where = resolve_path(path)
    ckpt = load_checkpoint(where)
    fmt = detect_format(ckpt)
    if fmt is None:
        raise UserError(f"{where} is neither an aogpt checkpoint (format='aogpt-v1') nor one of the "
                        f"paper's AO-GPT / sigma-GPT checkpoints: {_describe(ckpt)}")
    if fmt != 'aogpt':
        ckpt = convert_paper_checkpoint(ckpt, fmt)
    try:
        model = GPT(GPTConfig(**ckpt['model_args']))
    except (AssertionError, ValueError, TypeError) as e:
        raise UserError(f"{where}: its model_args do not describe a valid model ({first_line(e)}): "
                        f"{ckpt['model_args']}")
    sd = strip_prefixes(ckpt['model'])
    head, wte = sd.get('lm_head.weight'), sd.get('transformer.wte.weight')
    if model.config.tie_head and head is not None and wte is not None and not torch.equal(head, wte):
        # tied, the two names are one tensor: loading both would keep whichever comes last and drop the other
        raise UserError(f"{where}: its model_args say tie_head=True (one tensor for the embedding and the head), but "
                        f"it holds two different ones (transformer.wte.weight and lm_head.weight): it was trained "
                        f"with tie_head=False; set that back in its model_args")
    try:
        missing, unexpected = model.load_state_dict(sd, strict=False)
    except RuntimeError as e:  # a size mismatch
        raise UserError(f"{where}: the weights do not fit its model_args: "
                        f"{str(e).strip().splitlines()[-1].strip()[:300]}")
    missing = [k for k in missing if not (model.config.tie_head and k == 'lm_head.weight')]
    if missing or unexpected:
        raise UserError(f"{where} does not match its model_args: missing {missing[:5]}, unexpected {unexpected[:5]}")
    try:
        misfit = ckpt.get('codec') and codec_misfit(codec_from_record(ckpt['codec']), model.config, ckpt.get('config'))
    except UserError as e:
        raise UserError(f"{where}: {e.msg}")
    if misfit:
        raise UserError(f"{where}: {misfit}, so it is not the codec this model was trained with (a config.json edited "
                        f"or mixed up with another export's?); export the checkpoint again")
    if ckpt.get('weights'):  # an export holds one set of weights, chosen when it was exported
        held = ckpt['weights'] == 'ema'
        if use_ema is not None and use_ema != held:
            raise UserError(f"{path} holds only its {'EMA' if held else 'raw'} weights, so --use_ema={use_ema} cannot "
                            f"be honoured: leave --use_ema out, or export the original checkpoint with "
                            f"--use_ema={use_ema}")
        use_ema = held
    else:
        ema = ckpt.get('ema')
        if use_ema is None:
            use_ema = bool(ema)
        if use_ema:
            if not ema:
                raise UserError("--use_ema=True but the checkpoint has no EMA weights")
            apply_ema(model, ema['params'])
    bad = nonfinite_weight(model)
    if bad:
        raise UserError(f"{where}: {bad[0]} holds {bad[1]} in its {'EMA' if use_ema else 'raw'} weights, so every "
                        f"score and sample would be meaningless; load an earlier checkpoint (or the other weight "
                        f"set with --use_ema)")
    if ckpt.get('source') == 'paper-sigma' and use_ema:
        print("note: using sigma-GPT's EMA weights; the paper evaluated its sigma-GPT checkpoints with the "
              "raw weights (--use_ema=False; train.py: --init_ema=False)", file=sys.stderr)
    model.to(device).eval()
    if dataset is None:
        return model, ckpt, use_ema
    codec = checkpoint_codec(ckpt, dataset)  # a stored codec was checked above; one from data is checked here
    misfit = codec_misfit(codec, model.config, ckpt.get('config'))
    if misfit:
        raise UserError(f"{where}: {misfit}, so its ids cannot be read with that codec; " +
                        ("pick the --dataset it was trained on" if dataset else
                         "pass --dataset, the data it was trained on"))
    return model, ckpt, use_ema, codec


def nonfinite_weight(model):
    """(name, 'NaN' or 'inf') of the first parameter or buffer holding a non-finite number, or None: such
    weights give NaN logits, which no score or draw may pass off as a number."""
    for name, t in model.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name, 'NaN' if bool(t.isnan().any()) else 'inf'
    return None


def find_dataset(name, data_root='data'):
    """A dataset directory: `name` itself if it is a directory, else data_root/name, else the repo's
    data/name. None if none exists."""
    for d in (name, os.path.join(data_root, name), os.path.join(ROOT, 'data', name)):
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
            tried = list(dict.fromkeys([dataset, os.path.join(root, dataset), os.path.join('data', dataset)]))
            tried = ', '.join(tried[:-1]) + ' and ' + tried[-1] if len(tried) > 1 else tried[0]
            raise UserError(f"--dataset {dataset}: no such data directory (tried {tried}); leave it empty to use the "
                            f"checkpoint's codec")
        chosen = get_codec(d)
    stored = codec_from_record(ckpt['codec']) if ckpt.get('codec') else None
    if stored is not None:
        if chosen is not None and chosen.record() != stored.record():
            raise UserError(f"--dataset {dataset} uses a {_describe_codec(chosen)} codec, but the checkpoint was "
                            f"trained with a {_describe_codec(stored)} one: its ids would be misread; leave "
                            "--dataset out")
        return stored
    if chosen is not None:
        return chosen
    d = find_dataset(cfg['dataset'], root) if cfg.get('dataset') else None
    return get_codec(d if d else None)


def _describe_codec(codec):
    return f"{codec.name} ({codec.vocab_size} symbols)"


def apply_ema(model, ema_params):
    """Copy name-keyed EMA tensors into the model's parameters."""
    params = dict(model.named_parameters())
    ema_params = strip_prefixes(ema_params)
    unknown = [k for k in ema_params if k not in params]
    if unknown:
        raise UserError(f"EMA holds parameters the model lacks: {unknown[:5]}")
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


# ---------------------------------------------------------------------- exported folders (export.py)
# config.json: {"format": "aogpt-export", "format_version": 1, "model_args": GPTConfig fields,
#   "codec": Codec.record(), "weights": "ema" | "raw", "fixed_order": [...] or null, "train_config": {...},
#   plus provenance (iter_num, tokens, source, ...)}; model.safetensors: the state dict, a tied lm_head
#   stored once (as transformer.wte.weight). Nothing in the folder is pickled.

def is_export(folder):
    """Does `folder` hold an export of ours (rather than, say, a Hugging Face transformers model)?"""
    try:
        with open(os.path.join(folder, EXPORT_CONFIG)) as f:
            return json.load(f).get('format') == EXPORT_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_export(folder):
    """An exported folder -> a checkpoint dict in our format (one set of weights, no optimizer)."""
    cfg_path, w_path = os.path.join(folder, EXPORT_CONFIG), os.path.join(folder, EXPORT_WEIGHTS)
    try:
        with open(cfg_path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {cfg_path} ({first_line(e)}): an export.py folder holds config.json + "
                        "model.safetensors")
    if not isinstance(meta, dict) or meta.get('format') != EXPORT_FORMAT:
        hf = isinstance(meta, dict) and 'model_type' in meta
        raise UserError(f"{folder} is not an export.py folder: its {EXPORT_CONFIG} lacks \"format\": "
                        f"\"{EXPORT_FORMAT}\"" +
                        (f" (it is a Hugging Face transformers {meta['model_type']!r} model: train.py starts from it as "
                         f"--init_from=DIR, sample.py reads GPT-2 as a --gen_ppl judge)" if hf else ""))
    if meta.get('format_version') != EXPORT_VERSION:
        raise UserError(f"{cfg_path} is export format version {meta.get('format_version')!r}; this aogpt reads version "
                        f"{EXPORT_VERSION} (update aogpt)")
    _check_model_args(meta.get('model_args'), cfg_path)
    try:
        codec_from_record(meta.get('codec'))
    except UserError as e:
        raise UserError(f"{cfg_path}: {e.msg}")
    if meta.get('weights') not in ('ema', 'raw'):
        raise UserError(f"{cfg_path}: \"weights\" must be \"ema\" or \"raw\", got {meta.get('weights')!r}")
    order = meta.get('fixed_order')
    if order is not None and not (isinstance(order, list) and all(type(i) is int for i in order)):
        raise UserError(f"{cfg_path}: \"fixed_order\" must be a list of positions or null")
    if not os.path.exists(w_path):
        raise UserError(f"{folder} has {EXPORT_CONFIG} but no {EXPORT_WEIGHTS}: copy the whole export.py folder")
    want = meta.get('config_sha256')
    if want is not None and config_digest(meta) != want:
        raise UserError(f"{cfg_path} was changed after export: it no longer matches the sha256 it records, and what it "
                        f"says (the model's args, its codec, its weight set, its order) defines the model these weights "
                        f"run as; copy or download the folder again (if you changed it on purpose, delete "
                        f"\"config_sha256\" from {EXPORT_CONFIG})")
    want = meta.get('weights_sha256')
    if want is not None and file_sha256(w_path) != want:
        raise UserError(f"{w_path} does not match the sha256 that {EXPORT_CONFIG} records for it: the file is corrupt "
                        f"or was changed; copy or download it again (if you changed the weights on purpose, delete "
                        f"\"weights_sha256\"" + (" and \"config_sha256\"" if 'config_sha256' in meta else "")
                        + f" from {EXPORT_CONFIG})")
    from safetensors.torch import load_file
    try:
        sd = load_file(w_path, device='cpu')
    except Exception as e:
        raise UserError(f"cannot read {w_path}: it is truncated, corrupt or not a safetensors file ({first_line(e)})")
    return dict(format='aogpt-v1', source='export', model_args=meta['model_args'], codec=meta['codec'], model=sd,
                weights=meta['weights'], iter_num=meta.get('iter_num'), tokens=meta.get('tokens'),
                config=meta.get('train_config') or {}, order=None if order is None else torch.tensor(order),
                started_from=meta.get('started_from'), export=meta)


def config_digest(meta):
    """The sha256 an export's config.json records of itself (config_sha256): of every other key, in a canonical
    JSON form, the weights' own sha256 included. Any edit that keeps the shapes (a norm, a GELU, a codec's
    order of characters, the weight set) would otherwise run the same weights as another model, silently."""
    body = {k: v for k, v in meta.items() if k != 'config_sha256'}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(',', ':')).encode()).hexdigest()


def file_sha256(path):
    """The sha256 of a file, read in 16 MB pieces (about a second for GPT-2 small's 500 MB)."""
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 24), b''):
            h.update(block)
    return h.hexdigest()


def weights_sha256(model, names=None):
    """The sha256 of a model's weights as float32, by name (so a float32 export of a checkpoint has the
    checkpoint's, and a tied head counts once): what a run records of the model it started from. names: only
    those (a source's, in the model adapted from it). A sharded model's (FSDP) is its whole weights', each
    gathered in turn: every rank must call it."""
    h = hashlib.sha256()
    for k, v in sorted(strip_prefixes(model.state_dict()).items()):  # a compiled model's keys too
        if (model.config.tie_head and k == 'lm_head.weight') or (names is not None and k not in names):
            continue
        v = v.full_tensor() if hasattr(v, 'full_tensor') else v
        h.update(k.encode())
        h.update(v.detach().to('cpu', torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def fingerprint(model):
    """weights_sha256's first 16 hex digits: what an eval record names, so its numbers are never published for
    other weights."""
    return weights_sha256(model)[:16]


def codec_misfit(codec, config, train_config):
    """Why a codec cannot be this model's (None if it can): train.py makes the model's vocabulary the codec's
    ids, plus the encoder's [MASK], padded to a multiple of 64, unless its config set vocab_size by hand (a
    model not from train.py, whose config has no vocab_size, is only checked to cover the codec)."""
    mdm = not config.causal
    if 'vocab_size' not in (train_config or {}):
        train_config = dict(vocab_size=config.vocab_size)
    asked_vocab = train_config['vocab_size']
    if codec.vocab_size > config.vocab_size:
        return f"its {codec.name} codec has {codec.vocab_size} symbols but the model only {config.vocab_size}"
    if mdm and config.mask_token_id < codec.vocab_size:
        return f"the model's [MASK] id {config.mask_token_id} is a real token of its {codec.name} codec"
    derived = (codec.vocab_size, codec.vocab_size + mdm, -(-(codec.vocab_size + mdm) // 64) * 64, asked_vocab)
    if config.vocab_size not in derived:
        return (f"its {codec.name} codec has {codec.vocab_size} symbols, far fewer than the model's vocab_size "
                f"{config.vocab_size}")
    return None


def _check_model_args(args, where):
    """GPTConfig fields only, each of its type: a foreign or hand-edited config.json is one clear line."""
    known = {f.name: f for f in fields(GPTConfig)}
    if not isinstance(args, dict):
        raise UserError(f"{where}: \"model_args\" must be an object of GPTConfig fields, got {type(args).__name__}")
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise UserError(f"{where}: unknown model_args {unknown} (exported by a newer aogpt?); GPTConfig has "
                        f"{', '.join(known)}")
    for k, v in args.items():
        want, default = known[k].type, known[k].default
        ok = ((v is None and default is None) or (want is float and type(v) in (int, float)) or
              type(v) is want)
        if not ok:
            raise UserError(f"{where}: model_args {k} must be {want.__name__}, got {v!r}")


# ---------------------------------------------------------------------- the Hugging Face hub
def parse_hub_spec(spec):
    """'hf:owner/repo[@revision][/path]' -> (repo id, revision or None, path inside the repo or '')."""
    parts = spec[len(HUB_PREFIX):].rstrip('/').split('/')
    name, at, rev = parts[1].partition('@') if len(parts) > 1 else ('', '', '')
    if (len(parts) < 2 or not re.fullmatch(r'[\w.-]+', parts[0]) or not re.fullmatch(r'[\w.-]+', name)
            or (at and not re.fullmatch(r'[\w.-]+', rev)) or '' in parts[2:]):
        raise UserError(f"{spec!r} names no hub checkpoint: write hf:owner/repo (an export.py folder), "
                        f"hf:owner/repo/sub (one in a folder of the repo) or hf:owner/repo/path/to/ckpt.pt (one torch "
                        f"file); hf:owner/repo@revision/... picks a branch, tag or commit")
    return f"{parts[0]}/{name}", rev or None, '/'.join(parts[2:])


def hub_files(spec):
    """(repo id, revision, the files in the repo a spec needs): one torch file, or an export's two."""
    repo, rev, sub = parse_hub_spec(spec)
    if sub.endswith(TORCH_SUFFIXES):
        return repo, rev, [sub]
    if sub.rpartition('/')[2] in (EXPORT_CONFIG, EXPORT_WEIGHTS):
        sub = sub.rpartition('/')[0]  # a file of an export names its folder
    return repo, rev, [f"{sub}/{n}" if sub else n for n in (EXPORT_CONFIG, EXPORT_WEIGHTS)]


def fetch_from_hub(spec):
    """The local path of what a hub spec names: the torch file, or the folder (an export's two files, or a Hugging
    Face model's: source_files), inside the HF cache (downloaded once; offline, served from the cache)."""
    from aogpt import hub
    repo, rev, names = hub_files(spec)
    forced = os.environ.get('HF_HUB_OFFLINE', '').upper() in ('1', 'ON', 'YES', 'TRUE')
    if not hub.hub_reachable():
        hub.go_offline()  # cache only: a file the cache lacks fails now, not after retries
    try:
        from huggingface_hub import constants, errors, hf_hub_download
    except ImportError:
        raise UserError(f"{spec}: reading the Hugging Face hub needs huggingface_hub (pip install huggingface_hub)")
    revision = rev

    def fetch(name, optional=False):
        """One file's local path (None for an optional file the repo, or offline the cache, does not hold)."""
        nonlocal revision
        try:
            path = hf_hub_download(repo, name, revision=revision)
        except errors.LocalEntryNotFoundError:
            if optional:
                return None
            why = "HF_HUB_OFFLINE is set" if forced else "huggingface.co cannot be reached"
            local = f"DIR/{names[0]}" if len(names) == 1 else os.path.join('DIR', os.path.dirname(names[0]))
            get = f"hf download {repo} {' '.join(names)}{f' --revision {rev}' if rev else ''} --local-dir DIR"
            raise UserError(f"{spec}: {' and '.join(names) if name in names else name} not in the Hugging Face cache "
                            f"({constants.HF_HUB_CACHE}) and {why}: connect and rerun (it is then cached), or on a "
                            f"machine with internet run `{get}`, copy DIR here and pass {local.rstrip('/')}")
        except errors.GatedRepoError:
            raise UserError(f"{spec}: {repo} is gated: accept its terms on huggingface.co, then log in (`hf auth "
                            "login`)")
        except errors.RepositoryNotFoundError:
            raise UserError(f"{spec}: no repository {repo} on the Hugging Face hub (a private one needs `hf auth "
                            "login`)")
        except errors.RevisionNotFoundError:
            raise UserError(f"{spec}: {repo} has no revision {rev!r}")
        except errors.EntryNotFoundError:
            if optional:
                return None
            raise UserError(f"{spec}: {repo}{f'@{rev}' if rev else ''} has no file {name}" +
                            ("" if len(names) == 1 else " (hf:owner/repo[/sub] reads an export.py folder or a Hugging "
                                                        "Face model folder; name a torch checkpoint by its path, e.g. "
                                                        f"hf:{repo}/path/to/ckpt.pt)"))
        except Exception as e:  # an invalid repo id, a network error mid-download, a full disk, ...
            raise UserError(f"{spec}: fetching {name} from {repo} failed ({type(e).__name__}: {first_line(e)})")
        commit = os.path.normpath(path).split(os.sep)[-len(name.split('/')) - 1]
        if re.fullmatch(r'[0-9a-f]{40}', commit):
            revision = commit  # every later file from the same commit as the first
        return path

    first = fetch(names[0])
    if len(names) == 1:
        return first
    folder = os.path.dirname(first)
    if is_export(folder):
        fetch(names[1])
    else:
        source_files(spec, folder, os.path.dirname(names[0]), fetch)
    return folder


def source_files(spec, folder, sub, fetch):
    """A Hugging Face model folder's files beside its config.json: its weights (model.safetensors, else the
    shards model.safetensors.index.json names, else GPT-2's pytorch_model.bin), and its tokenizer files where the
    repo has them (tokenizer.json is the run's codec: startup.source_tokenizer)."""
    from aogpt.tokenizer import SOURCE_FILES
    at = lambda name: f"{sub}/{name}" if sub else name  # noqa: E731
    if fetch(at('model.safetensors'), optional=True) is None:
        index = fetch(at('model.safetensors.index.json'), optional=True)
        if index is not None:
            try:
                with open(index) as f:
                    shards = sorted(set(json.load(f)['weight_map'].values()))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise UserError(f"cannot read {index}: not a safetensors index with a weight_map ({e})")
            for shard in shards:
                fetch(at(shard))
        elif fetch(at('pytorch_model.bin'), optional=True) is None:
            raise UserError(f"{spec}: {folder} holds a Hugging Face config.json but neither model.safetensors, "
                            f"model.safetensors.index.json nor pytorch_model.bin (in the cache, or on the hub)")
    for name in SOURCE_FILES:
        if name != 'config.json':
            fetch(at(name), optional=True)
