"""
Export a checkpoint to a folder ready for the Hugging Face hub, then share it with one upload.

    python export.py --ckpt out/ckpt.pt --dest hub/ao-gpt-ptb --repo_id me/ao-gpt-ptb
    hf upload me/ao-gpt-ptb hub/ao-gpt-ptb
    python sample.py --ckpt hf:me/ao-gpt-ptb          # anyone, anywhere (eval_ppl.py and train.py too)

The folder holds three files, none of them pickled:
  config.json        the model's GPTConfig, its codec (what its token ids mean), a format tag and version,
                     which weights (EMA or raw), the training config and provenance (iter_num, tokens, source,
                     and started_from: the model its training run started from, and whether it was adapted)
  model.safetensors  one set of weights (EMA by default); a tied head is stored once, as the embedding
  README.md          a model card: hub metadata, the model, its eval results (from eval_ppl.json files
                     beside the checkpoint), the commands that sample and evaluate it, and how to upload
The folder itself loads wherever a checkpoint does (--ckpt FOLDER), and so does its hub copy (hf:owner/repo).
"""

import errno
import json
import os
import shutil
import sys
from dataclasses import asdict
from types import SimpleNamespace

import torch

from aogpt import checkpoint
from aogpt.errors import UserError, command
from aogpt.orders import order_of_config
from aogpt.tokenizer import TOKENIZERS, parse_tokenizer

EXPORT_FILES = {checkpoint.EXPORT_CONFIG, checkpoint.EXPORT_WEIGHTS, 'README.md',  # what an export writes
                'tokenizer.json', 'tokenizer_config.json'}  # (the last two for a source model's tokenizer)

ckpt = ''                  # checkpoint file or dir, exported folder, or hf:owner/repo[/path.pt]; overrides out_dir
out_dir = 'out'            # run directory (its ckpt.pt) when --ckpt is empty
dest = ''                  # folder to write; '' = <checkpoint's folder>/<its name>-hub (hf: sources: ./<name>-hub)
overwrite = False          # replace dest if it holds an earlier export
use_ema: bool = None       # None: the EMA weights when the checkpoint has them; False: the raw weights
dtype = 'float32'          # float32 | bfloat16 | float16: the stored weights (16-bit halves the size, logits shift)
dataset = ''               # a data dir to check the codec against (or supply it, for checkpoints without one)
repo_id = ''               # owner/name on the hub, for the card's commands ('' = <owner>/<repo> placeholders)
license = ''               # the card's license, e.g. mit or apache-2.0 ('' = other: a placeholder to replace)
evals = ''                 # eval_ppl.json files for the card (comma list); '' = those beside the checkpoint

_KINDS = {('adaln', True): ('AO-GPT', 'an any-order decoder; the target position enters through AdaLN'),
          ('sigma', True): ('sigma-GPT', 'an any-order decoder; the target position is embedded at the input'),
          ('none', True): ('GPT', 'a left-to-right decoder'),
          ('none', False): ('encoder MDM', 'a bidirectional masked diffusion model')}
_HUB_DATASETS = {'openwebtext': 'Skylion007/openwebtext', 'ptb': 'ptb-text-only/ptb_text_only'}


@command
def main(argv=None):
    from aogpt.configurator import configure, print_config
    from aogpt.errors import die, first_line
    cfg = configure(dict(globals()), argv)  # a copy: main() can run more than once in one process (tests)
    print_config(cfg)
    c = SimpleNamespace(**cfg)
    if c.dtype not in ('float32', 'bfloat16', 'float16'):
        die(f"--dtype must be float32, bfloat16 or float16, got {c.dtype!r}")
    if c.repo_id:  # the card's commands say hf:<repo_id>: a name the hub refuses would make them all wrong
        from huggingface_hub.utils import HFValidationError, validate_repo_id
        try:
            validate_repo_id(c.repo_id)
            if c.repo_id.count('/') != 1:
                raise HFValidationError("it must be owner/name")
        except HFValidationError as e:
            die(f"--repo_id {c.repo_id!r} is not a hub repo id ({first_line(e)}): write owner/name, e.g. "
                f"me/ao-gpt-ptb")
    src = c.ckpt or c.out_dir
    target = c.dest or default_dest(src)
    check_dest(target, c.overwrite)  # before the (possibly long) load
    model, ck, used_ema, codec = checkpoint.load_model(src, 'cpu', c.use_ema, dataset=c.dataset)
    config = export_config(model, ck, codec, used_ema, src, c.dtype)
    weights_id = checkpoint.fingerprint(model)
    results = find_evals(src, c.evals, ck.get('iter_num'), used_ema, weights_id)
    repo = c.repo_id or '<owner>/<repo>'
    card = model_card(config, results, repo, c.license, os.path.basename(os.path.abspath(target)),
                      c.repo_id.rpartition('/')[2])
    from eval_harness import model_card_section  # the lm-eval table, when eval_harness.py scored these weights
    card = card.replace('## Model\n', model_card_section(src, ck.get('iter_num'), used_ema, weights_id) + '## Model\n', 1)
    write_folder(target, config, weights(model, c.dtype), card, c.overwrite)
    print(f"wrote {target}: {config['weights']} weights as {c.dtype}, a model card with {len(results)} eval "
          f"result(s)\nupload: hf upload {repo} {target}")


def default_dest(src):
    """<folder>/<name>-hub beside a local checkpoint; ./<name>-hub for a hub one."""
    if src.startswith(checkpoint.HUB_PREFIX):
        return os.path.splitext(os.path.basename(src.rstrip('/')).split('@')[0])[0] + '-hub'
    where = checkpoint.resolve_path(src)
    stem = os.path.splitext(os.path.basename(os.path.abspath(where)))[0]
    return os.path.join(os.path.dirname(os.path.abspath(where)), stem + '-hub')


def check_dest(path, overwrite):
    """Refuse to replace anything but an earlier export (--overwrite) or an empty folder."""
    from aogpt.errors import die
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        die(f"--dest {path} is a file, not a folder")
    exported = checkpoint.is_export(path)
    if os.listdir(path) and not (overwrite and exported):
        die(f"--dest {path} already exists: pass --overwrite to replace an earlier export, or another --dest"
            if exported else f"--dest {path} is a non-empty folder that holds no export; pick another --dest")


def export_config(model, ck, codec, used_ema, src, dtype):
    """config.json: what rebuilds the model and reads its ids, and where the weights came from."""
    ema = ck.get('ema') or {}
    order = ck.get('order')
    prior = ck.get('export') or {}  # re-exporting an export keeps its provenance
    source = {'checkpoint': src, 'format': ck.get('source', 'aogpt')}
    if prior:
        source['origin'] = prior.get('source')
    return {
        'format': checkpoint.EXPORT_FORMAT, 'format_version': checkpoint.EXPORT_VERSION,
        'model_args': asdict(model.config),
        'codec': codec.record(),
        'weights': 'ema' if used_ema else 'raw',
        'ema_decay': ema.get('decay', prior.get('ema_decay')) if used_ema else None,
        'dtype': dtype,
        'parameters': sum(p.numel() for p in model.parameters()),
        'iter_num': ck.get('iter_num'),
        'tokens': ck.get('tokens'),
        'best_val_loss': ck.get('best_val_loss', prior.get('best_val_loss')),
        'source': source,
        'started_from': ck.get('started_from'),
        'fixed_order': None if order is None else torch.as_tensor(order).view(-1).tolist(),
        'train_config': json.loads(json.dumps(ck.get('config') or {}, default=str)),
    }


def weights(model, dtype):
    """The state dict for safetensors: a tied lm_head dropped (it is wte; safetensors refuses shared
    storage, and the loader re-ties it), every tensor contiguous in the requested float type. A tensor
    that would not fit that type (float16 ends at 65504, and turns larger values into inf without a word)
    is refused by name: an export of inf scores and samples as if nothing were wrong."""
    from aogpt.errors import die
    sd = model.state_dict()
    if model.config.tie_head:
        del sd['lm_head.weight']
    dt = getattr(torch, dtype)
    out = {}
    for k, v in sd.items():
        w = (v.to(dt) if v.is_floating_point() else v).contiguous().clone()
        if w.is_floating_point() and not bool(torch.isfinite(w).all()):  # (load_model refused non-finite sources)
            die(f"{k} does not fit {dtype}: its largest magnitude {v.abs().max().item():.4g} exceeds "
                f"{torch.finfo(dt).max:.6g}; export as bfloat16 or float32")
        out[k] = w
    return out


def tokenizer_files(codec):
    """{file name: text} of a source model's tokenizer beside the export, so that data for a fine-tune can be
    prepared in the model's codec (data/text/prepare.py --tokenizer=<this folder or its hf: id>): tokenizer.json,
    byte for byte the one config.json's codec holds, and tokenizer_config.json naming its end of document and
    bos by token, which is how folder_codec reads them back (this config.json has no eos_token_id). {} for the
    GPT-2 and character codecs, which need no file."""
    if codec['tokenizer'] != TOKENIZERS:
        return {}
    token = parse_tokenizer(codec['json']).id_to_token
    names = {'eos_token': token(codec['eot']), 'bos_token': None if codec.get('bos') is None else token(codec['bos'])}
    return {'tokenizer.json': codec['json'], 'tokenizer_config.json': json.dumps(names, indent=2) + '\n'}


def write_folder(path, config, tensors, card, overwrite=False):
    """The export, written whole or not at all (paths.atomic_folder). An overwrite replaces the export, not
    the records the eval scripts wrote beside it (eval_ppl.json, its .jsonl history, harness.json, plots):
    those are carried into the new folder. Without --overwrite the rename itself refuses a folder that
    another export filled meanwhile."""
    from safetensors.torch import save_file

    from aogpt.errors import die
    from aogpt.paths import atomic_folder
    path = os.path.abspath(path)

    def fill(tmp):
        save_file(tensors, os.path.join(tmp, checkpoint.EXPORT_WEIGHTS), metadata={'format': 'pt'})
        # checked on every load: a corrupted or swapped weights file is refused, not sampled from
        cfg = dict(config, weights_sha256=checkpoint.file_sha256(os.path.join(tmp, checkpoint.EXPORT_WEIGHTS)))
        cfg['config_sha256'] = checkpoint.config_digest(cfg)  # what runs the weights is checked too
        with open(os.path.join(tmp, checkpoint.EXPORT_CONFIG), 'w') as f:
            json.dump(cfg, f, indent=2)
            f.write('\n')
        with open(os.path.join(tmp, 'README.md'), 'w') as f:
            f.write(card)
        for name, text in tokenizer_files(config['codec']).items():
            with open(os.path.join(tmp, name), 'wb') as f:
                f.write(text.encode('utf-8'))
        # safetensors writes its file private (0600); an export is for sharing: the mode open() gave
        os.chmod(os.path.join(tmp, checkpoint.EXPORT_WEIGHTS), os.stat(os.path.join(tmp, 'README.md')).st_mode)

    def keep_records(old, tmp):  # an earlier export (check_dest): its records go into the new one
        if not checkpoint.is_export(old):  # filled by something else meanwhile: not ours to replace
            raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), old)
        for f in sorted(set(os.listdir(old)) - EXPORT_FILES):
            (shutil.copytree if os.path.isdir(os.path.join(old, f)) else shutil.copy2)(
                os.path.join(old, f), os.path.join(tmp, f))

    try:
        atomic_folder(path, fill, carry=keep_records if overwrite else None)
    except Exception as e:  # a full disk, no permission, a race: atomic_folder left things as they were
        if isinstance(e, OSError) and e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            die(f"--dest {path} was filled by another export while this one ran; nothing was changed there: "
                f"pass another --dest, or --overwrite to replace it")
        die(f"cannot write {path} ({getattr(e, 'strerror', None) or e}); nothing was changed there")


# ------------------------------------------------------------------------------------------ eval results
def find_evals(src, listed, iter_num, used_ema, weights_id):
    """[(file name, record)] of the eval_ppl.py results that describe exactly these weights: the listed
    files, else every eval_ppl.json / *.eval_ppl.json beside the checkpoint. A result of other weights (another
    checkpoint, another iteration: ckpt.pt moves on as training runs, or the other weight set) is refused if it
    was listed, else left out with a note: a card must never show another model's numbers."""
    from aogpt.errors import die
    if listed:
        paths = [p.strip() for p in listed.split(',') if p.strip()]
    elif src.startswith(checkpoint.HUB_PREFIX):
        paths = []
    else:
        where = checkpoint.resolve_path(src)
        d = where if os.path.isdir(where) else os.path.dirname(os.path.abspath(where))
        paths = sorted(os.path.join(d, f) for f in os.listdir(d)
                       if f == 'eval_ppl.json' or f.endswith('.eval_ppl.json'))
    out = []
    for p in paths:
        try:
            with open(p) as f:
                rec = json.load(f)
            if not isinstance(rec, dict) or not isinstance(rec.get('datasets'), dict):
                raise ValueError("no 'datasets' table")
            for key, want in (('iter_num', int), ('ema', bool), ('weights', str)):  # eval_ppl.py writes these
                v = rec.get(key)
                if v is not None and (not isinstance(v, want) or (want is int and isinstance(v, bool))):
                    raise ValueError(f"its {key} is {v!r}, a {type(v).__name__}, not {'an' if want is int else 'a'} {want.__name__}")
        except (OSError, ValueError) as e:
            if listed:
                die(f"--evals {p}: not an eval_ppl.py result ({type(e).__name__}: {e})")
            print(f"note: {p} is not an eval_ppl.py result; left out of the card", file=sys.stderr)
            continue
        why = None
        if rec.get('weights') is not None and rec['weights'] != weights_id:
            why = (f"scored other weights than {src}'s (fingerprint {rec['weights']} of {rec.get('checkpoint')} at "
                   f"iteration {rec.get('iter_num')}, not {weights_id})")
        elif rec.get('iter_num') != iter_num:
            why = f"evaluated iteration {rec.get('iter_num')}, this checkpoint is at {iter_num}"
        elif bool(rec.get('ema')) != used_ema:
            why = (f"evaluated the {'EMA' if rec.get('ema') else 'raw'} weights, the export holds the "
                   f"{'EMA' if used_ema else 'raw'} ones")
        elif rec.get('weights') is None and listed:
            why = "does not name the weights it scored (written by an older eval_ppl.py): evaluate the checkpoint again"
        if why is None:
            out.append((os.path.basename(p), rec))
        elif listed:
            die(f"--evals {p} {why}: its numbers are not this model's; evaluate {src} with eval_ppl.py, or leave "
                f"--evals out")
        else:
            print(f"note: {p} {why}; left out of the card", file=sys.stderr)
    return out


def _cell(col):
    if not col:
        return 'n/a'
    return f"{col['ppl']:.2f}" + (f" ({col['bpc']:.4f} bpc)" if 'bpc' in col else '')


def eval_table(name, rec):
    head = ['dataset', 'tokens', 'L2R PPL', f"any-order PPL (<=, {eval_orders(rec)} order(s))"]
    if rec.get('ensemble'):
        head.append(f"ens x{rec['ensemble']} PPL (<=)")
    rows = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for ds, r in rec['datasets'].items():
        cells = [ds, f"{r.get('tokens', 0):,}", _cell(r.get('l2r')), _cell(r.get('any_order'))]
        if rec.get('ensemble'):
            cells.append(_cell(r.get('ensemble')))
        rows.append('| ' + ' | '.join(cells) + ' |')
    split = ("; WikiText-2 from its train split, as the paper's tables" if rec.get('paper_split') else "")
    info = (f"From `{name}`: {'EMA' if rec.get('ema') else 'raw'} weights, block_size {rec.get('block_size')}, "
            f"{rec.get('precision')}, seed {rec.get('seed')}" +
            (f", ensemble mode {rec.get('ensemble_mode')}" if rec.get('ensemble') else "") +
            (f", first {rec['max_chunks']} chunks of each set" if rec.get('max_chunks') else "") + split + ".")
    return info + '\n\n' + '\n'.join(rows)


def eval_orders(rec):
    """An eval_ppl record's orders per chunk (named orders in records written before --eval_orders)."""
    return rec.get('eval_orders', rec.get('orders', 1))


def eval_command(spec, rec, block_size):
    """The eval_ppl.py line that recomputes a result from the hub copy."""
    args = [f"python eval_ppl.py --ckpt {spec} --datasets {','.join(rec['datasets'])}"]
    if rec.get('block_size') and rec['block_size'] != block_size:
        args.append(f"--block_size {rec['block_size']}")
    if eval_orders(rec) != 1:
        args.append(f"--eval_orders {eval_orders(rec)}")
    if rec.get('ensemble'):
        args.append(f"--ensemble {rec['ensemble']}")
        if rec.get('ensemble_mode', 'fast') != 'fast':
            args.append(f"--ensemble_mode {rec['ensemble_mode']}")
        if rec.get('ensemble_draws', 1) != 1:
            args.append(f"--ensemble_draws {rec['ensemble_draws']}")
    if rec.get('paper_split'):
        args.append("--paper_split True")
    if rec.get('max_chunks'):
        args.append(f"--max_chunks {rec['max_chunks']}")
    if rec.get('seed', 1337) != 1337:
        args.append(f"--seed {rec['seed']}")
    return ' '.join(args)


# ------------------------------------------------------------------------------------------ the model card
def use_commands(spec, ma, codec, cfg):
    """The card's sampling lines, each one that runs as written on this model: a length and a template that
    fit its context, a prompt only in an alphabet that has it."""
    n = min(64, ma['block_size'])
    gpt2 = codec['tokenizer'] == 'gpt2'
    bpe = codec['tokenizer'] != 'char'  # any BPE reads any prompt; a char alphabet may lack its letters
    if ma['causal'] and ma['cond'] == 'none':
        return [f'python sample.py --ckpt {spec}' + (' --prompt "The"' if bpe else '') + f' --length {n}']
    out = [f"python sample.py --ckpt {spec} --steps {n} --batch_size 4 --length {n}"]
    if gpt2 and ma['block_size'] >= 24:  # the template is 20 tokens
        out.append(f'python sample.py --ckpt {spec} --template "The [BLANK] rose [BLANK:3] in October."')
    return out


def finetune_command(spec, ma, cfg):
    """The card's fine-tune line: the model's own context, and its run's batch (when the export records it), so
    it starts as written; short (1,000 steps) into a new folder. train.py says before the first step how long
    a run will take on the machine it is given (the card cannot know that machine)."""
    keys = dict(block_size=ma['block_size'])
    if ma['causal'] and ma['cond'] == 'none':  # a GPT trains in the order it was trained in (random ones it cannot)
        try:
            trained = order_of_config(cfg)
        except UserError:
            trained = None
        keys['order'] = trained.spec if trained is not None and trained.fixed else 'l2r'
    for k in ('batch_size', 'gradient_accumulation_steps'):
        if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool):
            keys[k] = cfg[k]
    keys.update(max_iters=1000, lr_decay_iters=1000, warmup_iters=50, eval_interval=250, out_dir='out-finetune')
    return (f"python train.py --init_from={spec} --dataset <data> " + ' '.join(f"--{k}={v}" for k, v in keys.items())
            + "   # fine-tune: data in the same codec")


def prepare_command(spec, codec):
    """The card's line that prepares fine-tuning data in a source tokenizer's codec (the export holds its files)."""
    if codec['tokenizer'] != TOKENIZERS:
        return []
    return [f"python data/text/prepare.py --input=<text file> --tokenizer={spec} --out_dir=data/<data>   # data in "
            f"its codec"]


def started_from_lines(origin, cond):
    """The card's line on the model its training run started from (train.py's started_from), if any."""
    if not origin:
        return []
    weights = f"{origin['weights']} weights, " if origin.get('weights') else ''
    src = f"`{origin['init_from']}` ({weights}sha256 of its float32 weights `{origin['weights_sha256']}`)"
    hf = origin.get('source')  # a Hugging Face model: which family and commit, the sha256 of each file read
    about = ''
    if hf:
        files = ', '.join(f"{name} `{sha}`" for name, sha in (hf.get('weights_sha256') or {}).items())
        about = (f" It was a Hugging Face {hf['family']} model" + (f" at revision `{hf['revision']}`" if
                 hf.get('revision') else '') + (f" (sha256 of its files: {files})" if files else '') +
                 f"; [None] took the embedding of its token {hf['none_id']} ({hf['none_from']}), so that in the "
                 f"left-to-right order the model was the source reading that token first.")
    if origin.get('adapted'):
        return [f"**Adapted** from the left-to-right GPT {src} into cond={cond!r}: every weight of the GPT copied, the "
                f"new ones set so that at step 0 the model computed exactly the GPT's distribution, then trained on "
                f"as above." + about, '']
    return [f"Fine-tuned from {src}." + about, '']


def model_card(config, results, repo, license, folder, title=''):
    ma, codec, cfg = config['model_args'], config['codec'], config['train_config']
    spec = f"hf:{repo}"
    kind, what = _KINDS.get((ma['cond'], ma['causal']), ('model', f"cond={ma['cond']}, causal={ma['causal']}"))
    data = cfg.get('dataset') or cfg.get('train_dataset') or ''
    tags = ['aogpt', 'masked-diffusion', 'any-order-autoregressive', 'text-generation']
    front = ['---', 'library_name: aogpt', f"license: {license or 'other'}", 'pipeline_tag: text-generation',
             'tags:'] + [f"- {t}" for t in tags]
    if data in _HUB_DATASETS:
        front += ['datasets:', f"- {_HUB_DATASETS[data]}"]
    front.append('---')

    tokens = f", {config['tokens']:,} tokens" if config.get('tokens') else ""
    weights = ('EMA weights' + (f" (decay {config['ema_decay']})" if config.get('ema_decay') else '')
               if config['weights'] == 'ema' else 'raw (non-EMA) weights')
    vocab = (f"GPT-2 BPE ({codec['vocab_size']} tokens)" if codec['tokenizer'] == 'gpt2' else
             f"a source model's tokenizer.json ({codec['vocab_size']} ids, sha256 {codec['sha256'][:12]}...; the "
             f"file is inside config.json's codec)" if codec['tokenizer'] == TOKENIZERS else
             f"character level ({codec['vocab_size']} symbols)")
    adapted = (config.get('started_from') or {}).get('adapted')
    lines = front + ['', f"# {title or folder}", '',
                     f"**{kind}** ({what}): {config['parameters'] / 1e6:.2f}M parameters, {ma['n_layer']} layers, "
                     f"{ma['n_head']} heads, width {ma['n_embd']}, context {ma['block_size']}; tokenizer {vocab}. "
                     + ("Adapted from a left-to-right GPT (see Training), then trained" if adapted else "Trained") +
                     f" {config['iter_num']} iterations{tokens}" + (f" on {data}" if data else "") +
                     f"; these are its {weights}, stored as {config['dtype']}.", '']
    if not license:
        lines += ["**License: not set.** Replace `license: other` in the metadata above with the license of these "
                  "weights before uploading.", '']

    lines += ['## Use', '', 'With the aogpt code (`pip install -r requirements.txt` in its folder):', '', '```bash']
    lines += use_commands(spec, ma, codec, cfg)
    if results:
        lines += [eval_command(spec, rec, ma['block_size']) for _, rec in results]
    elif codec['tokenizer'] != 'char':  # any BPE: the eval sets are encoded with the model's own codec
        lines += [f"python eval_ppl.py --ckpt {spec} --datasets ptb --max_chunks 20   # a quick check, offline",
                  f"python eval_ppl.py --ckpt {spec}" + (" --ensemble 8" if ma['cond'] != 'none' else "") +
                  "   # LAMBADA, WikiText2, PTB, WikiText103, 1BW"]
    else:
        lines.append(f"python eval_ppl.py --ckpt {spec} --datasets ptb --data_path ptb=test.txt   "
                     f"# test.txt: held-out text in the model's alphabet")
    lines += prepare_command(spec, codec)
    lines.append(finetune_command(spec, ma, cfg))
    lines += ['```', '', "Eval sets other than ptb come from the hub on first use, or from local copies with "
              "`--data_path NAME=FILE`.", '', 'In Python:', '', '```python', 'from aogpt.checkpoint import load_model',
              f"model, ckpt, _ = load_model('{spec}')   # model.py's GPT, eval mode; ckpt['codec'] decodes its ids",
              '```', '']

    lines += ['## Evaluation', '']
    if results:
        lines.append("Zero-shot perplexity from `eval_ppl.py` (`<=`: an upper bound, the any-order ELBO).")
        for fname, rec in results:
            lines += ['', eval_table(fname, rec)]
    else:
        lines.append("No eval_ppl.py results were beside the checkpoint when it was exported.")
    lines.append('')

    lines += ['## Model', '', '| field | value |', '|---|---|'] + [f"| {k} | {v} |" for k, v in ma.items()] + ['']
    prov = config['source'] or {}
    lines += ['## Training', '', f"Exported from `{prov.get('checkpoint')}` ({prov.get('format')} format), "
              f"iteration {config['iter_num']}" + (f", best val loss {config['best_val_loss']:.4f}"
                                                   if config.get('best_val_loss') is not None else "") + '.', '']
    lines += started_from_lines(config.get('started_from'), ma['cond'])
    if cfg:
        lines += ['<details><summary>training config</summary>', '', '| key | value |', '|---|---|']
        lines += [f"| {k} | `{json.dumps(v)}` |" for k, v in cfg.items()]
        lines += ['', '</details>', '']

    lines += ['## Files', '',
              f"- `{checkpoint.EXPORT_CONFIG}`: the model config, its codec, which weights, the training "
              f"config, provenance",
              f"- `{checkpoint.EXPORT_WEIGHTS}`: the weights" +
              (" (the tied output head is the token embedding)" if ma['tie_head'] else ""),
              '- `README.md`: this card']
    if codec['tokenizer'] == TOKENIZERS:
        lines.append("- `tokenizer.json`, `tokenizer_config.json`: the source model's tokenizer (the codec config.json "
                     "holds) and its end of document, to prepare data with")
    lines += ['', 'Nothing here is pickled. Upload the folder with the `hf` CLI of huggingface_hub:', '', '```bash',
              f"hf upload {repo} {folder}", '```', '']
    return '\n'.join(lines)


if __name__ == '__main__':
    from aogpt.configurator import stop_on_ctrl_c
    stop_on_ctrl_c('nothing was changed at --dest')
    main()
