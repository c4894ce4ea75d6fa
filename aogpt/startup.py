"""
Where train.py's model and state come from, by init_from: a new model (scratch), the run being resumed, or a
model to fine-tune (ours, an export, the paper's, or a Hugging Face folder: GPT-2, Llama, Mistral, Qwen2, Qwen3, read by
aogpt/families.py); and what a resumed checkpoint
puts back besides the weights (optimizer, scaler, EMA, where the run stood). A run keeps the model it starts from:
a config key that contradicts it is refused (a UserError: train.py's one line), never quietly overruled. The one
change of shape allowed is a GPT's cond: --cond=adaln or sigma adapts it into an any-order decoder that computes
exactly the GPT's distribution at step 0 (model.adapt); a Hugging Face folder takes the run's cond, adaln by default.

    source_args, weights, ckpt, resume_path, started_from = model_source(cfg, given, codec, data_dir, say)
    iter_num, best_val_loss, elapsed, train_losses = resume_state(ckpt, optimizers, scaler, ema)
"""

if __name__ == '__main__':  # run as a script (python aogpt/startup.py): one line, not an ImportError
    raise SystemExit("error: aogpt/startup.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import hashlib
import os
from dataclasses import asdict

import torch.distributed as dist

from aogpt import sharded
from aogpt.checkpoint import (CKPT_NAME, checkpoint_codec, is_export, load_checkpoint, load_model, resolve_path,
                              run_checkpoints, weights_sha256)
from aogpt.errors import UserError
from aogpt.families import hf_source, open_weights, read_config, source_rows
from aogpt.orders import new_spelling
from aogpt.tokenizer import TOKENIZER_FILE, TOKENIZERS, folder_codec, gpt2_codec, is_gpt2_vocabulary
from model import GPTConfig, adapt, adapted_config, config_fields, strip_prefixes


def model_source(cfg, given, codec, data_dir, say=print, lazy=False):
    """The model train.py starts from, by init_from: (its GPTConfig arguments, its weights or None, the checkpoint
    being resumed or None, that checkpoint's path or None, and started_from: where the model came from, which every
    checkpoint of the run keeps, {init_from, path, weights: 'ema' | 'raw' | None, weights_sha256 of the source as
    loaded, its cond, adapted: whether its cond changed}, or None). Only the shape comes from here; how the weights
    train (dropout, adaln_table: the same function computed another way) always follows the run's config. given: the
    keys the config files and command line set (only these may contradict a fine-tune's source); codec: that of
    the data in data_dir. say: how train.py speaks (rank 0 prints). A source that cannot be used is a UserError.
    lazy (fsdp=True): a Hugging Face folder's weights come as {name: rows(a, b)}, read only where a rank asks
    (families.source_rows; their weights_sha256 is left None, for train.py to hash the sharded model), and a sharded
    run's save is resumed from its meta.json alone (weights None: sharded.load puts them in after sharding)."""
    out_dir, init_from, block_size = cfg['out_dir'], cfg['init_from'], cfg['block_size']
    held = run_checkpoints(out_dir)  # ckpt.pt, else the newest periodic copy (ckpt.pt deleted or lost)
    resume_path = held[0] if held else os.path.join(out_dir, CKPT_NAME)
    if init_from == 'auto':
        init_from = 'resume' if held else 'scratch'
    # a start that would overwrite a run held there (scratch, a fine-tune) was refused before this (claim_out_dir)
    if init_from == 'scratch':
        args = {k: cfg[k] for k in config_fields() if k in cfg}
        if args['vocab_size'] is None:  # pad for fast matmuls; the MDM needs one id for [MASK]
            args['vocab_size'] = -(-(codec.vocab_size + (0 if cfg['causal'] else 1)) // 64) * 64
        if args['mask_token_id'] is None:
            args['mask_token_id'] = codec.vocab_size  # the first padding id (50257 for GPT-2)
        return args, None, None, None, None
    if init_from == 'resume':
        if not os.path.exists(resume_path):
            raise UserError(f"init_from=resume but {resume_path} does not exist: use init_from=scratch, or auto")
        if sharded.is_save(resume_path) != bool(cfg.get('fsdp')):
            raise UserError(f"{resume_path} is a {'sharded' if sharded.is_save(resume_path) else 'single-file'} "
                            f"checkpoint, so its run resumes with fsdp={sharded.is_save(resume_path)}: its optimizer "
                            f"state is kept in that layout (to change it, fine-tune from it into another out_dir)")
        ck = sharded.read_meta(resume_path) if sharded.is_save(resume_path) else load_checkpoint(resume_path)
        if ck.get('format') not in ('aogpt-v1', sharded.FORMAT) or optimizer_states(ck) is None:
            raise UserError(f"{resume_path} is not a train.py checkpoint, so it cannot be resumed: fine-tune from it "
                            f"with init_from={resume_path}")
        check_codec(checkpoint_codec(ck), codec, data_dir, resume_path)
        trained = asdict(GPTConfig(**ck['model_args']))  # keys older checkpoints lack take their defaults
        saved = new_spelling(ck['config'])  # an old checkpoint's order_mode etc. as the `order` it trained on
        # A value given on purpose is accepted if it is the model's, or the one the run was started with; a default
        # is not asked for (a fine-tune takes its shape from the source, and its saved config says so: train.py).
        asked = {k: v for k, v in shape_keys(cfg, trained, given).items() if v != saved.get(k, trained[k])}
        refuse_other_model(trained, asked, cfg, resume_path, "a resumed run keeps its model. Resume with the config "
                           "it was trained with, or train the new model in another out_dir")
        changed = {k: (saved.get(k), v) for k, v in cfg.items() if k in saved and
                   saved[k] != v and k != 'init_from' and (k in given or k not in trained)}
        if changed:
            say("resuming with changed keys (checkpoint -> now): " +
                ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items()))
        weights = strip_prefixes(ck['model']) if 'model' in ck else None  # sharded: sharded.load, after sharding
        return trained, weights, ck, resume_path, ck.get('started_from')
    return _fine_tune(cfg, given, codec, data_dir, init_from, say, lazy)


def _fine_tune(cfg, given, codec, data_dir, init_from, say, lazy):
    """model_source for a model to fine-tune or adapt: a Hugging Face folder, or a checkpoint (ours, an export, the
    paper's released ones)."""
    hf_dir = hf_folder(init_from)
    gpt2 = hf_dir is not None and read_config(hf_dir)['model_type'] == 'gpt2'
    bpe = gpt2 and is_gpt2_vocabulary(hf_dir)  # GPT-2's ids: tiktoken's codec; a tokenizer.json of its own is read
    src = weights = None
    if hf_dir is not None:  # the source itself (cond='none'), then the same path as any: by default into the run's cond
        theirs = gpt2_codec() if bpe else source_tokenizer(hf_dir, codec, data_dir, init_from)
        doc_end = None if theirs is None or bpe else theirs.eot
        if lazy:  # each parameter's rows, read where a rank asks for them; the files' sha256 (a whole read) on rank 0,
            # the one that writes the record
            first = not dist.is_initialized() or dist.get_rank() == 0
            config, source, weights = source_rows(hf_dir, doc_end=doc_end, hash_files=first, say=say)
        else:
            src, source = hf_source(hf_dir, doc_end=doc_end, say=say)
            config = src.config
        if theirs is not None and not bpe:  # GPT-2's [None] is its bos_token_id, as before (its codec is tiktoken's)
            check_none(source, theirs, init_from)
        used_ema, path = None, hf_dir
        given = set(given) | {'cond'}
    else:  # a checkpoint (ours, an export, or the paper's released ones)
        src, src_ckpt, used_ema = load_model(init_from, 'cpu', use_ema=None if cfg['init_ema'] else False)
        theirs, path, config = checkpoint_codec(src_ckpt), resolve_path(init_from), src.config
    if theirs is None:  # a folder with no tokenizer.json: no codec to compare; its ids are the data's, checked to fit
        if codec.vocab_size > config.vocab_size:
            raise UserError(f"{data_dir}'s codec has {codec.vocab_size} symbols, more than {init_from}'s vocabulary "
                            f"({config.vocab_size}): tokenize the data with {init_from}'s tokenizer")
        say(f"warning: {init_from} holds no {TOKENIZER_FILE}, so {data_dir}'s ids ({codec.name} codec) are read as its "
            f"token ids unchecked")
    else:
        check_codec(theirs, codec, data_dir, init_from)
    if config.block_size < cfg['block_size']:
        raise UserError(f"{init_from} holds a model of block_size {config.block_size}" +
                        (" (GPT-2's positions less the one the [None] start slot takes)" if gpt2 else "") +
                        f": use block_size<={config.block_size}")
    started_from = dict(init_from=init_from, path=os.path.abspath(path), weights=(None if used_ema is None else
                        'ema' if used_ema else 'raw'), weights_sha256=None if src is None else weights_sha256(src),
                        cond=config.cond, adapted=False)
    if hf_dir is not None:  # which family, which token [None] took, the sha256 of each weights file read
        started_from['source'] = source
    which = '' if used_ema is None else f" ({'EMA' if used_ema else 'raw'} weights)"
    if 'cond' in given and cfg['cond'] != config.cond and config.cond == 'none':
        cond, std, new = adapted(config, cfg, given, init_from)
        config = adapted_config(config, cond, std, **new)  # lazy: the new parameters are drawn once sharded
        src = None if src is None else adapt(src, cond, adaln_std=std, **new)
        started_from['adapted'] = True
        say(f"adapting the GPT {init_from}{which} into cond={cfg['cond']!r}: every weight copied, the new ones set "
            f"so that at step 0 it computes exactly its source's distribution")
    else:
        shape = ', '.join(f"{k}={getattr(config, k)!r}" for k in ('causal', 'cond', 'n_layer', 'n_head', 'n_embd'))
        say(f"fine-tuning from {init_from}{which}; model shape from it ({shape}), whatever the config above says of "
            f"keys not set")
    args = asdict(config)  # a fine-tune or an adaptation: only the keys set may contradict it
    refuse_other_model(args, shape_keys(cfg, args, given), cfg, init_from, "a fine-tuned model keeps its source's "
                       "shape (only a GPT's cond may change: cond='adaln' or 'sigma' adapts it). Leave these keys "
                       "out (the shape comes from the checkpoint), or train the new model from scratch")
    return args, weights if src is None else src.state_dict(), None, None, started_from


def restarted(out_dir, init_from, init_ema, eval_only):
    """Whether out_dir holds checkpoints of a run started from init_from's very weights (its started_from: the same
    sha256, of the files of a Hugging Face folder, else of the model's weights): the same fine-tune or adaptation
    command run again, as torchrun --max-restarts does after a failure, which resumes its own run. Another source
    into that folder stays refused (rundir.check_room); before the first save there is nothing to resume, and the
    command starts over from its source."""
    held = run_checkpoints(out_dir)
    if eval_only or not held or init_from in ('scratch', 'resume', 'auto'):
        return False
    record = (sharded.read_meta(held[0]) if sharded.is_save(held[0]) else load_checkpoint(held[0])).get('started_from')
    if not record or record.get('init_from') is None:
        return False
    folder = hf_folder(init_from)
    if folder is not None:
        recorded = (record.get('source') or {}).get('weights_sha256')
        return bool(recorded) and open_weights(folder)[1] == recorded
    model, _, _ = load_model(init_from, 'cpu', use_ema=None if init_ema else False)
    return weights_sha256(model) == record.get('weights_sha256')


def source_tokenizer(folder, codec, data_dir, where):
    """A Hugging Face source's codec: its tokenizer.json, which the data must have been prepared with
    (data/text/prepare.py --tokenizer=<folder>), read with the data's end of document (meta.json's eot: the
    source's eos, or the --eot_token it was prepared with). None for a folder with no tokenizer.json (a
    SentencePiece-only one, or a test's bare model): model_source then only checks that the data's ids fit."""
    path = os.path.join(folder, TOKENIZER_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if codec.name != TOKENIZERS or codec.sha256 != digest:
        raise UserError(f"{data_dir} is tokenized with a {codec.name} codec ({codec.vocab_size} symbols), not "
                        f"{where}'s {TOKENIZER_FILE} (sha256 {digest[:12]}...): its ids would mean other symbols. "
                        f"Prepare the data with data/text/prepare.py --tokenizer={folder}")
    theirs = folder_codec(folder, eot_id=codec.eot)
    ours, mine = theirs.record(), codec.record()
    other = [k for k in ours if ours[k] != mine.get(k)]  # the same file and eot: only bos can differ
    if other:
        raise UserError(f"{data_dir} was prepared with {where}'s {TOKENIZER_FILE}, but its meta.json says " +
                        ", ".join(f"{k} {mine.get(k)!r}" for k in other) + " where the folder now says " +
                        ", ".join(f"{k} {ours[k]!r}" for k in other) + f": prepare the data again with "
                        f"data/text/prepare.py --tokenizer={folder}")
    return theirs


def check_none(source, codec, where):
    """[None] is the source's BOS, or where it has none the data's end of document (hf_source(doc_end=)): the
    token families read from config.json must be the one the tokenizer names, or the run would start every
    sequence from a token the data never puts there."""
    want = codec.bos if codec.bos is not None else codec.eot
    if source['none_id'] != want:
        raise UserError(f"{where}: [None] would take token {source['none_id']} ({source['none_from']} of its "
                        f"config.json), but its tokenizer's " + ("bos" if codec.bos is not None else "end of "
                        "document") + f" is {want}: make config.json's bos_token_id and the tokenizer files agree")


def hf_folder(init_from):
    """The Hugging Face model folder init_from names: gpt2:DIR, a local folder whose config.json is a transformers
    one (not an export of ours, no ckpt.pt), or hf:owner/repo[@rev] whose fetched files are one; else None."""
    if init_from.startswith('gpt2:'):
        folder = init_from[len('gpt2:'):]
        if not os.path.exists(os.path.join(folder, 'config.json')):
            raise UserError(f"{folder} is not a local Hugging Face GPT-2 directory (config.json + model.safetensors)")
        return folder
    folder = resolve_path(init_from) if init_from.startswith('hf:') else init_from
    if os.path.isdir(folder) and os.path.exists(os.path.join(folder, 'config.json')) and not is_export(folder) \
            and not os.path.exists(os.path.join(folder, CKPT_NAME)):
        return folder
    return None


def adapted(config, cfg, given, where):
    """How a GPT of this config adapts into the run's cond (model.adapt: exactly the GPT at step 0): (cond, adaln_std,
    the new keys), or the one line that says why it cannot: an encoder is not a GPT, closed gates are not the GPT,
    and of the two init scales (target_std: the table drawn, the Linears zero; adaln_std: the Linears drawn, the
    table zero) one is the start's."""
    if not config.causal:
        raise UserError(f"{where} is an encoder MDM (causal=False): its attention sees every position, so it is no "
                        f"left-to-right model to adapt into cond={cfg['cond']!r}; adapt a GPT (causal=True, "
                        f"cond='none'), or train cond={cfg['cond']!r} from scratch")
    if cfg['cond'] == 'adaln' and 'adaln_init' in given and cfg['adaln_init'] != 'gate1':
        raise UserError(f"adapting {where} into cond='adaln' opens the AdaLN gates (adaln_init='gate1'), so that the "
                        f"model is its source at step 0; adaln_init={cfg['adaln_init']!r} would close them: leave it "
                        f"out")
    std = cfg['adaln_std'] if cfg['cond'] == 'adaln' else None
    if std is not None and 'target_std' in given:  # the table starts at zero: its std is never drawn with
        raise UserError(f"adapting {where} with adaln_std={std} draws the AdaLN Linears and starts the target table "
                        f"at zero (so that the model is its source at step 0), so target_std={cfg['target_std']} "
                        f"would be ignored: set one of the two (target_std: the table drawn, the Linears at zero)")
    return cfg['cond'], std, dict(target_dim=cfg['target_dim'], target_std=cfg['target_std'])


def resume_state(ckpt, optimizers, scaler, ema, raw=None, path=None):
    """Put back what a resumed train.py checkpoint holds besides the weights: the optimizers' states (in
    configure_optimizers' order), the scaler's and the EMA's (ema.py; an EMA the checkpoint lacks starts from the
    resumed weights). Returns (iter_num, best_val_loss, elapsed seconds, the training losses since the last eval,
    which a save between evals carries on). No RNG state or data cursor: every draw is a function of (seed,
    iteration). The settings stay the config's: each group keeps the hyperparameters it was configured with
    (initial_lr, min_lr, weight_decay, betas, ...), where torch's load_state_dict would put back the saved groups'
    ones (or none of the newer keys, from an older checkpoint): a resume that changes --weight_decay trains with
    the new value, as the 'resuming with changed keys' line says. lr itself is set by the schedule every step.
    A sharded save (ckpt: its meta.json) puts its tensors into raw (the sharded model), the optimizers and the EMA
    from the folder at path (sharded.load: each rank its rows, at any world size)."""
    if ckpt.get('format') == sharded.FORMAT:  # the tensors from the folder; the EMA's count from meta.json
        sharded.load(path, raw, optimizers, ema)
        if ema is not None and ckpt.get('ema'):
            ema.num_updates = ckpt['ema']['num_updates']
    else:
        _load_optimizers(ckpt, optimizers)
        if ema is not None and ckpt.get('ema'):
            ema.load_state_dict(ckpt['ema'])
    if ckpt.get('scaler'):
        scaler.load_state_dict(ckpt['scaler'])
    return (ckpt['iter_num'], ckpt.get('best_val_loss', float('inf')), ckpt.get('elapsed', 0.0),
            list(ckpt.get('train_losses') or []))


def _load_optimizers(ckpt, optimizers):
    """A ckpt.pt's optimizer states into the run's optimizers, each group keeping its configured settings."""
    states = optimizer_states(ckpt)
    if len(states) != len(optimizers):  # train.py refuses another setup before this, by its config keys
        raise UserError(f"the checkpoint holds {len(states)} optimizer states, but this run steps {len(optimizers)} "
                        f"optimizers: resume with the optimizer it was trained with")
    for opt, state in zip(optimizers, states):
        configured = [{k: v for k, v in g.items() if k not in ('params', 'lr')} for g in opt.param_groups]
        opt.load_state_dict(state)
        for g, mine in zip(opt.param_groups, configured):
            g.update(mine)


def optimizer_states(ckpt):
    """A train.py checkpoint's optimizer states, one per optimizer in configure_optimizers' order: its
    'optimizers' list, or from a checkpoint written before that list, AdamW's 'optimizer' and (optimizer=muon)
    Muon's 'muon'. None for a file with neither (an export, the paper's, a fine-tune's source)."""
    if 'optimizers' in ckpt:
        return ckpt['optimizers']
    if 'optimizer' not in ckpt:
        return None
    return [ckpt['optimizer']] + ([ckpt['muon']] if ckpt.get('muon') is not None else [])


def check_codec(theirs, codec, data_dir, where):
    """Training on from a model must read the data with the codec (theirs) its ids were trained in."""
    if theirs.record() != codec.record():
        raise UserError(f"{data_dir} is tokenized with a {codec.name} codec ({codec.vocab_size} symbols), but {where} "
                        f"was trained with a {theirs.name} one ({theirs.vocab_size}): its ids would mean other "
                        f"symbols. Use the dataset it was trained on, or re-prepare the data with its codec")


def shape_keys(cfg, model, only=None):
    """The config's values of the model's keys that say which model it is: not dropout, adaln_table or loss_chunk
    (how the same weights train), not block_size (the training length, which may be shorter than the model's),
    not a None vocab_size / mask_token_id (the model's)."""
    return {k: cfg[k] for k in model if k in cfg and k not in ('dropout', 'adaln_table', 'loss_chunk', 'block_size')
            and (only is None or k in only) and not (cfg[k] is None and k in ('vocab_size', 'mask_token_id'))}


def refuse_other_model(model, asked, cfg, where, why):
    """A run keeps the model it starts from, so a key asked for that contradicts it is refused, not quietly
    overruled: the saved config must say what was trained."""
    other = [k for k, v in asked.items() if v != model[k]]
    if other:
        raise UserError(f"{where} holds a model with {', '.join(f'{k}={model[k]!r}' for k in other)}, but this config "
                        f"asks for {', '.join(f'{k}={cfg[k]!r}' for k in other)}: {why}")
