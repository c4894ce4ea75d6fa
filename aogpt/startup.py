"""
Where train.py's model and state come from, by init_from: a new model (scratch), the run being resumed, GPT-2's
weights, or a checkpoint to fine-tune (ours, an export, or the paper's); and what a resumed checkpoint puts back
besides the weights (optimizer, scaler, EMA, where the run stood). A run keeps the model it starts from: a config
key that contradicts it is refused (a UserError: train.py's one line), never quietly overruled.

    source_args, weights, ckpt, resume_path = model_source(cfg, given, codec, data_dir, say)
    iter_num, best_val_loss, elapsed, train_losses = resume_state(ckpt, optimizer, scaler, ema)
"""

import json
import os
from dataclasses import asdict

from aogpt.checkpoint import CKPT_NAME, checkpoint_codec, load_checkpoint, load_model, read_hf_weights, run_checkpoints
from aogpt.errors import UserError
from model import GPT, GPTConfig, config_fields, strip_prefixes


def model_source(cfg, given, codec, data_dir, say=print):
    """The model train.py starts from, by init_from: (its GPTConfig arguments, its weights or None, the checkpoint
    being resumed or None, that checkpoint's path or None). Only the shape comes from here; how the weights train
    (dropout, adaln_table: the same function computed another way) always follows the run's config. given: the
    keys the config files and command line set (only these may contradict a fine-tune's source); codec: that of
    the data in data_dir. say: how train.py speaks (rank 0 prints). A source that cannot be used is a UserError."""
    out_dir, init_from, block_size = cfg['out_dir'], cfg['init_from'], cfg['block_size']
    held = run_checkpoints(out_dir)  # ckpt.pt, else the newest periodic copy (ckpt.pt deleted or lost)
    resume_path = held[0] if held else os.path.join(out_dir, CKPT_NAME)
    if init_from == 'auto':
        init_from = 'resume' if held else 'scratch'
    if init_from == 'scratch' and held:
        raise UserError(f"{out_dir} already holds checkpoints ({', '.join(os.path.basename(h) for h in held[:3])}"
                        f"{', ...' if len(held) > 3 else ''}): continue with init_from=resume (or auto), or pick "
                        f"another out_dir; starting from scratch here would overwrite them (to start over, delete them "
                        "first)")
    if init_from == 'scratch':
        args = {k: cfg[k] for k in config_fields() if k in cfg}
        if args['vocab_size'] is None:  # pad for fast matmuls; the MDM needs one id for [MASK]
            args['vocab_size'] = -(-(codec.vocab_size + (0 if cfg['causal'] else 1)) // 64) * 64
        if args['mask_token_id'] is None:
            args['mask_token_id'] = codec.vocab_size  # the first padding id (50257 for GPT-2)
        return args, None, None, None
    if init_from == 'resume':
        if not os.path.exists(resume_path):
            raise UserError(f"init_from=resume but {resume_path} does not exist: use init_from=scratch, or auto")
        ck = load_checkpoint(resume_path)
        if ck.get('format') != 'aogpt-v1' or 'optimizer' not in ck:
            raise UserError(f"{resume_path} is not a train.py checkpoint, so it cannot be resumed: fine-tune from it "
                            f"with init_from={resume_path}")
        check_codec(ck, codec, data_dir, resume_path)
        trained = asdict(GPTConfig(**ck['model_args']))  # keys older checkpoints lack take their defaults
        # A value given on purpose is accepted if it is the model's, or the one the run was started with; a default
        # is not asked for (a fine-tune takes its shape from the source, and its saved config says so: train.py).
        asked = {k: v for k, v in shape_keys(cfg, trained, given).items() if v != ck['config'].get(k, trained[k])}
        refuse_other_model(trained, asked, cfg, resume_path, "a resumed run keeps its model. Resume with the config "
                           "it was trained with, or train the new model in another out_dir")
        changed = {k: (ck['config'].get(k), v) for k, v in cfg.items() if k in ck['config'] and
                   ck['config'][k] != v and k != 'init_from' and (k in given or k not in trained)}
        if changed:
            say("resuming with changed keys (checkpoint -> now): " +
                ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items()))
        return trained, strip_prefixes(ck['model']), ck, resume_path
    if init_from.startswith('gpt2:'):
        hf_dir = init_from[len('gpt2:'):]
        if not os.path.exists(os.path.join(hf_dir, 'config.json')):
            raise UserError(f"{hf_dir} is not a local Hugging Face GPT-2 directory (config.json + model.safetensors)")
        n_pos = json.load(open(os.path.join(hf_dir, 'config.json')))['n_positions']
        if block_size > n_pos - 1:
            raise UserError(f"GPT-2 has {n_pos} positions and the [None] start slot takes one: use "
                            f"block_size<={n_pos - 1}")
        if not cfg['causal']:
            raise UserError("init_from=gpt2:... warm-starts a decoder; the encoder MDM starts from scratch")
        # GPT-2's own architecture (layer norm, tied head, ...) with our conditioning switches on top
        src = GPT.from_pretrained(hf_dir, read_hf_weights(hf_dir), cond=cfg['cond'], target_dim=cfg['target_dim'],
                                  adaln_init=cfg['adaln_init'], block_size=block_size)
        say(f"warm start from GPT-2 weights in {hf_dir}: model shape from its config.json")
    else:  # fine-tune from a checkpoint (ours, an export, or the paper's released ones)
        src, src_ckpt, used_ema = load_model(init_from, 'cpu', use_ema=None if cfg['init_ema'] else False)
        check_codec(src_ckpt, codec, data_dir, init_from)
        if src.config.block_size < block_size:
            raise UserError(f"{init_from} was trained with block_size {src.config.block_size}: use block_size<= that")
        shape = ', '.join(f"{k}={getattr(src.config, k)!r}" for k in ('causal', 'cond', 'n_layer', 'n_head', 'n_embd'))
        say(f"fine-tuning from {init_from} ({'EMA' if used_ema else 'raw'} weights); model shape from it ({shape}), "
            f"whatever the config above says of keys not set")
    args = asdict(src.config)  # a fine-tune or warm start: only the keys set may contradict it
    refuse_other_model(args, shape_keys(cfg, args, given), cfg, init_from, "a fine-tuned model keeps its source's "
                       "shape. Leave these keys out (the shape comes from the checkpoint), or train the new model "
                       "from scratch")
    return args, src.state_dict(), None, None


def resume_state(ckpt, optimizer, scaler, ema):
    """Put back what a resumed train.py checkpoint holds besides the weights: the optimizer's, the scaler's and
    the EMA's state (ema.py; an EMA the checkpoint lacks starts from the resumed weights). Returns (iter_num,
    best_val_loss, elapsed seconds, the training losses since the last eval, which a save between evals
    carries on). No RNG state or data cursor: every draw is a function of (seed, iteration)."""
    optimizer.load_state_dict(ckpt['optimizer'])
    if ckpt.get('scaler'):
        scaler.load_state_dict(ckpt['scaler'])
    if ema is not None and ckpt.get('ema'):
        ema.load_state_dict(ckpt['ema'])
    return (ckpt['iter_num'], ckpt.get('best_val_loss', float('inf')), ckpt.get('elapsed', 0.0),
            list(ckpt.get('train_losses') or []))


def check_codec(ckpt, codec, data_dir, where):
    """Training on from a checkpoint must read the data with the codec its ids were trained in."""
    theirs = checkpoint_codec(ckpt)
    if theirs.record() != codec.record():
        raise UserError(f"{data_dir} is tokenized with a {codec.name} codec ({codec.vocab_size} symbols), but {where} "
                        f"was trained with a {theirs.name} one ({theirs.vocab_size}): its ids would mean other "
                        f"symbols. Use the dataset it was trained on, or re-prepare the data with its codec")


def shape_keys(cfg, model, only=None):
    """The config's values of the model's keys that say which model it is: not dropout or adaln_table (how
    the same weights train), not block_size (the training length, which may be shorter than the model's),
    not a None vocab_size / mask_token_id (the model's)."""
    return {k: cfg[k] for k in model if k in cfg and k not in ('dropout', 'adaln_table', 'block_size')
            and (only is None or k in only) and not (cfg[k] is None and k in ('vocab_size', 'mask_token_id'))}


def refuse_other_model(model, asked, cfg, where, why):
    """A run keeps the model it starts from, so a key asked for that contradicts it is refused, not quietly
    overruled: the saved config must say what was trained."""
    other = [k for k, v in asked.items() if v != model[k]]
    if other:
        raise UserError(f"{where} holds a model with {', '.join(f'{k}={model[k]!r}' for k in other)}, but this config "
                        f"asks for {', '.join(f'{k}={cfg[k]!r}' for k in other)}: {why}")
