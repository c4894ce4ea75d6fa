"""
What train.py checks before its first step, so that a run that cannot work, or will cost far more than its
config suggests, says so in one line instead of hours later:

    order = check_config(cfg, given)        every key, before anything is read or written; the parsed order
    data_dir, codec, n_train, n_val = check_data(cfg, say)
    check_model(model_args, cfg, order, data_vocab, data_dir)    the model against the data and the orders
    check_step_sizes(optimizers, cfg)       learning rates a float32 step can apply
    cost_warnings(...); lr_warnings(cfg, get_lr, say)     what the run will cost, what its schedule does

Each takes the config as a dict. What cannot work is a UserError, which train.py turns into run.fail's one line
(rank 0 prints; every rank releases out_dir and exits 1); warnings go to say (rank 0, above the progress bar).
"""

if __name__ == '__main__':  # run as a script (python aogpt/preflight.py): one line, not an ImportError
    raise SystemExit("error: aogpt/preflight.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import importlib.util
import math
import os
import re
import time

import torch

from aogpt import ROOT
from aogpt.bins import bin_problem, meta_dtype, open_bin, read_meta
from aogpt.checkpoint import parse_hub_spec
from aogpt.errors import UserError
from aogpt.orders import parse_order, parse_warmup
from aogpt.tokenizer import get_codec
from aogpt.optim import OPTIMIZER_KEYS
from model import GPTConfig, config_fields

# a decoder's order settings (the encoder MDM reads none)
ORDER_KEYS = ('order', 'l2r_frac_end', 'l2r_frac_iters', 'order_warmup', 'order_warmup_iters')

# Which models read each key: every GPTConfig field and every train.py key, by the formulation (AO-GPT, sigma-GPT,
# GPT, encoder MDM) and the block (learned or rotary positions, a GELU or SwiGLU MLP) that reads it. A key given on
# purpose to a model that never reads it is refused in one line (check_model): it would be recorded in the checkpoint
# and the card and change nothing. A new key joins a row (tests/test_train.py fails until it does); one every model
# reads goes in 'every'. Other conditions (the optimizer, the order distribution) are checked beside: OPTIMIZER_KEYS,
# check_orders.
READERS = {  # reader: (whether a model, as its GPTConfig arguments, reads it; what reads it)
    'every': (lambda m: True, "every model"),
    'adaln': (lambda m: m['cond'] == 'adaln', "AO-GPT's AdaLN (cond='adaln')"),
    'target': (lambda m: m['cond'] != 'none', "a target conditioning (cond='adaln' or 'sigma')"),
    'draws': (lambda m: m['cond'] != 'none' or not m['causal'], "a model scored on drawn orders or masks (cond="
              "'adaln' or 'sigma', or the encoder MDM); a GPT's evals are left to right or its fixed order"),
    'decoder': (lambda m: m['causal'], "a decoder (causal=True): the encoder MDM trains on random masks, not orders"),
    'encoder': (lambda m: not m['causal'], "the encoder MDM (causal=False)"),
    'rope': (lambda m: m['pos'] == 'rope', "rotary positions (pos='rope')"),
    'gelu': (lambda m: m['mlp'] == 'gelu', "the GELU MLP (mlp='gelu'; SwiGLU's is silu)"),
}
READ_BY = {
    'every': ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd', 'dropout', 'bias', 'causal', 'cond', 'norm',
              'qk_norm', 'tie_head', 'head_bias', 'pos', 'mlp', 'mlp_hidden', 'n_kv_head', 'head_dim', 'norm_eps',
              'qkv_bias', 'loss_chunk',  # GPTConfig's; then train.py's
              'out_dir', 'init_from', 'init_ema', 'eval_interval', 'eval_iters', 'eval_ema', 'eval_only',
              'log_interval', 'progress', 'ckpt_interval', 'keep_ckpt_every', 'always_save_checkpoint', 'wandb_log',
              'wandb_project', 'wandb_run_name', 'wandb_mode', 'dataset', 'data_root', 'gradient_accumulation_steps',
              'batch_size', 'optimizer', 'learning_rate', 'max_iters', 'weight_decay', 'beta1', 'beta2', 'grad_clip',
              'decay_lr', 'warmup_iters', 'lr_decay_iters', 'min_lr', 'muon_lr', 'muon_dtype', 'ema_decay', 'device',
              'dtype', 'compile', 'fsdp', 'activation_checkpointing', 'peak_flops', 'seed'),
    'adaln': ('target_dim', 'adaln_table', 'adaln_init', 'target_std', 'adaln_std', 'muon_adaln'),
    'target': ('target_lr_scale',),
    'draws': ('eval_orders',),
    'decoder': ORDER_KEYS,
    'encoder': ('mask_token_id',),
    'rope': ('rope_theta', 'rope_scaling'),
    'gelu': ('gelu',),
}


def model_reads(key, model):
    """Whether a model (its GPTConfig arguments) reads this key (READ_BY)."""
    return next(READERS[r][0](model) for r, keys in READ_BY.items() if key in keys)


def describe(model):
    """A model in the words a line refusing a key uses: its formulation, positions and MLP."""
    kind = ('the encoder MDM' if not model['causal'] else {'adaln': 'an AO-GPT', 'sigma': 'a sigma-GPT',
                                                              'none': 'a GPT'}[model['cond']])
    return (f"{kind} (causal={model['causal']}, cond={model['cond']!r}) with {model['pos']} positions and a "
            f"{model['mlp']} MLP")


def check_read(model, cfg, given):
    """A key given on purpose that this model never reads (READ_BY): one line naming it, what reads it, and the
    model (an adaptation's: the source adapted into the run's cond). given: the keys the config files and command
    line set."""
    for reader, keys in READ_BY.items():
        reads, who = READERS[reader]
        unread = [k for k in keys if k in given and not reads(model)]
        if unread:
            one = len(unread) == 1
            raise UserError(f"{', '.join(f'{k}={cfg[k]!r}' for k in unread)}: read only by {who}, and this run trains "
                            f"{describe(model)}, so {'it' if one else 'they'} would be recorded and change nothing; "
                            f"leave {'it' if one else 'them'} out")


def check_config(cfg, given=()):
    """Every key is checked here, before anything is read or written: a bad value costs one line, not a run.
    given: the keys the config files and command line set (a setting the chosen optimizer ignores is refused).
    Returns the run's order, parsed (an orders.Order: what train.py carries)."""
    def need(ok, key, what):
        if not ok:
            raise UserError(f"{key} must be {what}, got {cfg[key]!r}")

    for k in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'max_iters', 'eval_interval', 'eval_iters',
              'eval_orders', 'log_interval'):
        need(cfg[k] >= 1, k, "an integer >= 1")
    for k in ('ckpt_interval', 'keep_ckpt_every', 'warmup_iters', 'lr_decay_iters', 'l2r_frac_iters',
              'order_warmup_iters'):
        need(cfg[k] >= 0, k, "an integer >= 0")
    micro_batch_fits(cfg['batch_size'], cfg['block_size'])
    for k in ('learning_rate', 'min_lr', 'weight_decay', 'grad_clip', 'peak_flops', 'muon_lr'):
        need(0 <= cfg[k] < math.inf, k, "a number >= 0")
    need(not cfg['decay_lr'] or cfg['min_lr'] <= cfg['learning_rate'], 'min_lr',
         f"<= learning_rate ({cfg['learning_rate']}), the peak the cosine decays from (or decay_lr=False)")
    for k in ('beta1', 'beta2', 'ema_decay'):
        need(0 <= cfg[k] < 1, k, "in [0, 1)")
    need(cfg['l2r_frac_end'] is None or 0 <= cfg['l2r_frac_end'] <= 1, 'l2r_frac_end',
         "a probability in [0, 1], or None")
    need(0 < cfg['target_lr_scale'] < math.inf, 'target_lr_scale', "a number > 0 (1: the groups' own rates)")
    need(cfg['optimizer'] in OPTIMIZER_KEYS, 'optimizer', ' or '.join(OPTIMIZER_KEYS))
    need(cfg['muon_dtype'] in ('bfloat16', 'float32'), 'muon_dtype', "bfloat16 or float32")
    for other, keys in OPTIMIZER_KEYS.items():  # a setting of another optimizer than the run's would be ignored
        ignored = [k for k in keys if k in given and k not in OPTIMIZER_KEYS[cfg['optimizer']]]
        if ignored:
            raise UserError(f"{', '.join(ignored)} {'is a setting' if len(ignored) == 1 else 'are settings'} of "
                            f"optimizer={other!r}, but this run uses optimizer={cfg['optimizer']!r}: add "
                            f"--optimizer={other}, or leave {'it' if len(ignored) == 1 else 'them'} out")
    order = parse_order(cfg['order'])  # its line names the order
    if (parse_warmup(cfg['order_warmup']) is None) != (cfg['order_warmup_iters'] == 0):
        raise UserError(f"order_warmup={cfg['order_warmup']!r} and order_warmup_iters={cfg['order_warmup_iters']} go "
                        f"together: an order to start on and the steps it lasts (both, or neither)")
    if order.fixed:
        order.permutation(cfg['block_size'])  # its blocks must divide the length
    need(cfg['dtype'] in ('auto', 'float32', 'bfloat16', 'float16'), 'dtype', "auto, float32, bfloat16 or float16")
    need(re.fullmatch(r'auto|cpu|mps|cuda(:\d+)?', cfg['device']), 'device', "auto, cpu, cuda, cuda:N or mps")
    need(cfg['out_dir'].strip() != '', 'out_dir', "a directory")
    need(cfg['wandb_mode'] in ('offline', 'disabled', 'online'), 'wandb_mode', "offline, disabled or online")
    if cfg['wandb_log'] and importlib.util.find_spec('wandb') is None:
        raise UserError("wandb_log=True but wandb is not installed: pip install wandb, or leave wandb_log off")
    try:  # the model keys: GPTConfig checks them (a None vocab_size or [MASK] id is resolved from the data later)
        m = {k: cfg[k] for k in config_fields() if k in cfg}
        m['mask_token_id'] = 0 if m['mask_token_id'] is None else m['mask_token_id']
        m['vocab_size'] = max(m['mask_token_id'], 0) + 1 if m['vocab_size'] is None else m['vocab_size']
        GPTConfig(**m)
    except ValueError as e:
        raise UserError(str(e)) from None
    init_from = cfg['init_from']
    if not (init_from in ('scratch', 'resume', 'auto') or init_from.startswith(('gpt2:', 'hf:')) or
            init_from.endswith('.pt') or os.path.exists(init_from)):
        raise UserError(f"init_from must be scratch, resume, auto, a Hugging Face model folder (gpt2:DIR or DIR), a "
                        f"checkpoint file, an export.py folder or hf:owner/repo[/path/ckpt.pt], got {init_from!r}")
    if init_from.startswith('hf:'):
        parse_hub_spec(init_from)  # a malformed hub id fails here, before any data is read
    return order


def micro_batch_fits(batch_size, block_size):
    """A micro-batch is gathered on the host as int64 ids before it goes anywhere: one whose ids alone pass this
    machine's memory can never be read, so it is refused before anything is (the gather itself would fail in the
    allocator, but only after the first eval)."""
    try:
        ram = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError, AttributeError):  # not a POSIX system that says: the gather's own line remains
        return
    need = batch_size * block_size * 8
    if need > ram:
        raise UserError(f"batch_size {batch_size:,} x block_size {block_size:,} tokens a micro-step: their ids alone "
                        f"take {need / 2 ** 30:,.0f} GiB as int64, more than this machine's {ram / 2 ** 30:,.0f} GiB "
                        f"of memory; lower batch_size and raise gradient_accumulation_steps as much (the same tokens "
                        f"per step)")


def check_data(cfg, say=print):
    """The dataset's token files (train.bin, val.bin: ids in the dtype meta.json records, aogpt/bins.py) and codec,
    checked before the model is built: returns (its directory, its codec, train tokens, val tokens)."""
    data_dir, block_size = os.path.join(cfg['data_root'], cfg['dataset']), cfg['block_size']
    script = os.path.join('data', cfg['dataset'], 'prepare.py')
    fix = {split: (f"run `python {script}`" if os.path.exists(os.path.join(ROOT, script))
                   else f"write {split}.bin (token ids) and meta.json into {data_dir}") for split in ('train', 'val')}
    for split in ('train', 'val'):
        f = os.path.join(data_dir, f'{split}.bin')
        if not os.path.exists(f):
            raise UserError(f"{f} not found: {fix[split]} first")
        if os.path.getsize(f) == 0:
            raise UserError(f"{f} is empty: {fix[split]} again")
    meta = read_meta(data_dir)
    dtype = meta_dtype(meta, os.path.join(data_dir, 'meta.json'))
    for split in ('train', 'val'):
        tokens = meta.get(f'{split}_tokens')
        tokens = tokens if isinstance(tokens, int) else None
        problem = bin_problem(os.path.join(data_dir, f'{split}.bin'), dtype, tokens)
        if problem:
            raise UserError(f"{problem}; {fix[split]} again")
    if not any(os.path.exists(os.path.join(data_dir, f)) for f in ('meta.json', 'meta.pkl')):
        say(f"no {data_dir}/meta.json: assuming GPT-2 BPE token ids (vocab 50257)")
    codec = get_codec(data_dir)  # saved in every checkpoint: what the model's ids mean
    n_train = len(open_bin(os.path.join(data_dir, 'train.bin'), dtype))
    n_val = len(open_bin(os.path.join(data_dir, 'val.bin'), dtype))
    if n_train < block_size or n_val < block_size:
        raise UserError(f"{data_dir}: train ({n_train}) and val ({n_val}) must each hold at least block_size "
                        f"({block_size}) tokens")
    return data_dir, codec, n_train, n_val


def check_model(model_args, cfg, order, data_vocab, data_dir, given=()):
    """The model against the data it will read, the orders it will train on (order: check_config's) and the
    settings given for it (given: the keys the config files and command line set: a key this model (check_read) or
    order (check_orders) never reads is refused, not trained around bit-identically)."""
    check_read(model_args, cfg, given)
    check_orders(model_args['causal'], cfg, order, given)
    if data_vocab > model_args['vocab_size']:
        raise UserError(f"{cfg['dataset']} has {data_vocab} token ids but the model only {model_args['vocab_size']}")
    if not model_args['causal'] and model_args['mask_token_id'] < data_vocab:
        raise UserError(f"mask_token_id {model_args['mask_token_id']} is a real token of {data_dir} (its codec uses "
                        f"the ids 0..{data_vocab - 1}): the encoder's [MASK] must be an id the data never holds; leave "
                        f"mask_token_id unset (the first padding id, {data_vocab}) or pick one in [{data_vocab}, "
                        "vocab_size)")
    if cfg['block_size'] > model_args['block_size']:
        raise UserError(f"block_size {cfg['block_size']} > the model's {model_args['block_size']}")
    if model_args['causal'] and model_args['cond'] == 'none' and (cfg['order_warmup'] or not (
            order.is_l2r or order.fixed) or cfg['l2r_frac_end'] is not None):  # a schedule mixes random orders in
        raise UserError("a GPT (cond='none') is never told which position to predict, so it cannot train on random "
                        "orders: use order='l2r' (or a fixed order, fixed:S), or cond='adaln' / 'sigma'")


def check_orders(causal, cfg, order, given):
    """An order setting given on purpose that a decoder's run would ignore (the encoder MDM reads none of them:
    check_read): the L2R-weight schedule when its order has no such weight (only random, l2r and their mixes do),
    or its length without its end."""
    if not causal:
        return
    if cfg['order_warmup'] and order.fixed:
        raise UserError(f"order_warmup={cfg['order_warmup']!r} would be ignored: a run on a fixed order "
                        f"({order.spec}) trains on it from the first step; leave it out")
    schedule = [k for k in ORDER_KEYS[1:3] if k in given]
    if schedule and order.l2r_weight is None:
        raise UserError(f"{', '.join(schedule)} move{'s' if len(schedule) == 1 else ''} the L2R weight of order "
                        f"random, l2r or mix:w*l2r+(1-w)*random, but this run trains on order={order.spec!r}, so "
                        f"{'it' if len(schedule) == 1 else 'they'} would be ignored: leave "
                        f"{'it' if len(schedule) == 1 else 'them'} out")
    if 'l2r_frac_iters' in given and cfg['l2r_frac_end'] is None:
        raise UserError("l2r_frac_iters is the length of the l2r_frac_end schedule, but l2r_frac_end is not set, so it "
                        "would be ignored: leave it out, or set l2r_frac_end")


def check_step_sizes(optimizers, cfg):
    """A learning rate so large that an optimizer step cannot even apply it: the step multiplies it into scalars
    that torch converts to the weights' float32, AdamW by up to 1/(1 - beta1) (its bias correction at the first
    step), Muon by sqrt(max(1, rows/cols)) of each matrix (torch's 'original' adjustment), both by weight_decay,
    and the target conditioning's groups by target_lr_scale. Past float32's largest number that is a RuntimeError
    mid-step; any smaller rate that diverges ends as the non-finite-loss line."""
    top = torch.finfo(torch.float32).max
    for opt in optimizers:
        muon = isinstance(opt, torch.optim.Muon)
        key = 'muon_lr' if muon else 'learning_rate'
        for g in opt.param_groups:
            gain = (max((math.sqrt(max(1, p.shape[0] / p.shape[1])) for p in g['params']), default=1.0) if muon
                    else 1 / (1 - g['betas'][0]))
            gain = max(gain, g['weight_decay']) * g['initial_lr'] / cfg[key] if cfg[key] else 0.0  # target_lr_scale
            if cfg[key] * gain >= top:
                raise UserError(f"{key}={cfg[key]:g} is too large for a step on float32 weights: "
                                f"{'Muon' if muon else 'AdamW'} multiplies it by up to {gain:.3g}, past float32's "
                                f"largest number ({top:.2e}), and such a step could only make every weight inf; use "
                                f"a {key} below {top / gain:.1e} (the defaults: learning_rate 6e-4, muon_lr 0.02)")


def duration(sec):
    return (f"{sec:.0f} s" if sec < 90 else f"{sec / 60:.0f} min" if sec < 5400 else f"{sec / 3600:.1f} h" if
            sec < 2 * 86400 else f"{sec / 86400:.0f} days")


def matmul_flops():
    """FLOP/s of a 512 x 512 float32 matmul on this CPU, now: what a training step can reach at best (small
    models reach far less; a busy CPU varies). Takes milliseconds."""
    a = torch.ones(512, 512)
    t0 = time.perf_counter()
    for _ in range(4):
        a @ a
    return 4 * 2 * 512 ** 3 / (time.perf_counter() - t0)


def cost_warnings(cfg, on_cpu, flops_per_token, val_batches, passes, start_iter, say=print):
    """Said before the first eval, which for a GPU-sized config on a CPU can take many silent minutes: a step or
    an eval that a CPU takes minutes over, and an eval that costs more than the training between two evals.
    flops_per_token: of a training step (forward + backward); each of the val_batches takes `passes` forwards."""
    tokens_per_iter = cfg['gradient_accumulation_steps'] * cfg['batch_size'] * cfg['block_size']
    n_windows = sum(map(len, val_batches))
    eval_flops = n_windows * cfg['block_size'] * passes * flops_per_token / 3  # a forward is a third of a step
    step_flops = tokens_per_iter * flops_per_token
    between = max(1, min(cfg['eval_interval'], cfg['max_iters'] - start_iter))  # training steps between evals
    steps = 0 if cfg['eval_only'] else max(0, cfg['max_iters'] - start_iter)
    run_flops = steps * step_flops + (steps // max(1, cfg['eval_interval']) + 1) * eval_flops
    cpu_flops = matmul_flops() if on_cpu and (step_flops > 1e11 or eval_flops > 1e12 or run_flops > 1e13) else None
    if cpu_flops and run_flops / cpu_flops > 3600:  # an hour at the matmul's pace is more in practice: say it first
        say(f"warning: this run needs at least {duration(run_flops / cpu_flops)} on this CPU ({steps:,} steps of "
            f"{tokens_per_iter:,} tokens x {flops_per_token / 1e9:.3f} GFLOP, and its evals, at the "
            f"{cpu_flops / 1e9:.0f} GFLOP/s a matmul reached just now; training reaches less): lower max_iters "
            f"(now {cfg['max_iters']:,}) or the model's size, or run it on a GPU")
    if cpu_flops:
        if step_flops / cpu_flops > 10 or eval_flops / cpu_flops > 60:
            say(f"warning: a GPU-sized run on a CPU: one step is {tokens_per_iter:,} tokens x "
                f"{flops_per_token / 1e9:.2f} GFLOP, roughly {duration(step_flops / cpu_flops)} here (this CPU did "
                f"{cpu_flops / 1e9:.0f} GFLOP/s on a matmul just now), and one eval roughly "
                f"{duration(eval_flops / cpu_flops)}. For a CPU, shrink the run, e.g. to config/train_ptb_tiny.py's "
                f"sizes: --n_layer=4 --n_head=4 --n_embd=128 --block_size=128 --batch_size=16 "
                f"--gradient_accumulation_steps=1 --eval_iters=8 --eval_orders=2")
    if not cfg['eval_only'] and eval_flops > 0.25 * between * step_flops:
        say(f"warning: one eval ({len(val_batches)} val batches x {passes} forward passes) costs about "
            f"{eval_flops / (between * step_flops):.1f}x the {between} training steps before it; lower eval_iters "
            f"(now {cfg['eval_iters']})" + (f" or eval_orders (now {cfg['eval_orders']})" if passes > 2 else "") +
            ", or raise eval_interval")


def lr_warnings(cfg, get_lr, say=print):
    """Learning rates that freeze half the model (one optimizer's peak 0, the other's not: both 0 freezes the
    whole, on purpose), and a schedule that does not fit max_iters: a warmup that never ends, a cosine that
    never decays, or one that decays long before the end."""
    if cfg['eval_only']:
        return
    if cfg['optimizer'] == 'muon' and (cfg['muon_lr'] == 0) != (cfg['learning_rate'] == 0):
        muon, adamw = "the matrices Muon trains", "the embeddings, head, norms and biases AdamW trains"
        frozen, trained, key = (muon, adamw, 'muon_lr') if cfg['muon_lr'] == 0 else (adamw, muon, 'learning_rate')
        say(f"warning: {key}=0 freezes {frozen} while {trained} train: give {key} > 0, or set both to 0 to freeze "
            f"every weight")
    if not cfg['decay_lr']:
        return
    max_iters, warmup_iters, lr_decay_iters = cfg['max_iters'], cfg['warmup_iters'], cfg['lr_decay_iters']
    if warmup_iters >= max_iters:
        say(f"warning: warmup_iters ({warmup_iters}) >= max_iters ({max_iters}): the learning rate never "
            f"reaches learning_rate ({cfg['learning_rate']:.1e}), only {get_lr(max_iters - 1):.1e}; lower "
            f"warmup_iters, e.g. --warmup_iters={max_iters // 10}")
    elif lr_decay_iters > 2 * max_iters:
        say(f"warning: lr_decay_iters ({lr_decay_iters}) is far beyond max_iters ({max_iters}): the cosine ends "
            f"at {get_lr(max_iters):.1e}, not min_lr ({cfg['min_lr']:.1e}); set --lr_decay_iters={max_iters} to "
            f"decay fully (or leave it, if a near-constant learning rate is the plan)")
    elif lr_decay_iters < max_iters / 2:
        say(f"warning: lr_decay_iters ({lr_decay_iters}) is well short of max_iters ({max_iters}): the last "
            f"{max_iters - max(lr_decay_iters, warmup_iters)} iterations run at min_lr ({cfg['min_lr']:.1e}); set "
            f"--lr_decay_iters={max_iters} to decay over the whole run")
