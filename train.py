"""
Train AO-GPT, or one of its baselines (GPT, sigma-GPT, encoder MDM), on a tokenized dataset.

    python train.py config/train_ptb_tiny.py                             # CPU, about 4 minutes
    python train.py config/train_ao_gpt_small.py                         # one GPU
    torchrun --standalone --nproc_per_node=8 train.py config/train_ao_gpt_small.py
    torchrun --standalone --nproc_per_node=8 train.py config/adapt_qwen3_8b.py   # fsdp=True: past one GPU's memory

The defaults below are the paper's AO-GPT-Small run on OpenWebText. Config files are small diffs from
them, and --key=value overrides come last; `python train.py --help` lists every key.

Objective. Decoders (AO-GPT, sigma-GPT, GPT) minimise the AO-AR loss: each sequence gets an order drawn
from `order` (aogpt/orders.py: the paper's mix:0.1*l2r+0.9*random, l2r, one fixed order fixed:S, or another
distribution such as semiar:8, nearl2r:4 or mix:0.5*semiar:8+0.5*random; docs/training.md) and the model
predicts its tokens one after another in that order. The encoder
MDM (causal=False) minimises the masked-diffusion ELBO: t ~ U(0, 1], mask each token with prob. t,
weight the NLL of the masked tokens by 1/t.

Randomness. Every training draw (batch offsets, orders, MDM masks, dropout) comes from a generator
seeded by (seed, iteration, global micro-step). The run is therefore a pure function of iter_num: a
resumed run continues bit-identically on CPU, and DDP or FSDP on W ranks draws the same global batch as one
process (rank r takes a contiguous 1/W of the micro-steps); only float summation order differs.

Validation (every eval_interval, on all ranks, NLL sums and token counts all-reduced) runs on a fixed
set of non-overlapping val windows, with the EMA weights when eval_ema. Any-order losses use a fixed
seeded set of eval_orders orders per batch (the same for every run and every eval).

What a run writes (out_dir/log.jsonl's fields, what ckpt.pt holds): docs/training.md.
"""

import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from aogpt.bins import meta_dtype, open_bin, read_meta
from aogpt import sharded
from aogpt.checkpoint import CKPT_NAME, save_checkpoint, weights_sha256
from aogpt.configurator import configure, print_config, stop_at_safe_points, stop_requested
from aogpt.ema import EMA
from aogpt.errors import first_line, out_of_memory
from aogpt.likelihood import mdm_corrupt
from aogpt.optim import configure_optimizers
from aogpt.orders import OLD_KEYS, l2r_mix, old_keys_line, one_block, parse_warmup, warmup_order
from aogpt.parallel import build, check_sharding
from aogpt.paths import append_jsonl
from aogpt.plot import plot_log
from aogpt.preflight import check_config, check_data, check_model, check_step_sizes, cost_warnings, lr_warnings
from aogpt.rundir import LOG_NAME, PLOT_NAME, Run, claim_out_dir, keep_copy, release_out_dir, rewind_out_dir
from aogpt.runtime import autocast, fast_math, gpu_peak_flops, resolve_device, start_ranks
from aogpt.startup import model_source, restarted, resume_state
from aogpt.valloss import progress_of, val_losses, val_passes, val_windows
from model import GPTConfig

stop_at_safe_points()  # a Ctrl-C or SIGTERM is recorded, and the run ends at its next stop_point()

# -----------------------------------------------------------------------------
# defaults: AO-GPT-Small (12/768/12, context 1024) on OpenWebText, as in the paper
# I/O
out_dir = 'out'  # checkpoint, log.jsonl
init_from = 'scratch'  # scratch | resume | auto (resume if ckpt.pt exists) | <HF model dir> | <ckpt, export, hf:...>
init_ema = True  # fine-tuning from a checkpoint file: start from its EMA weights when it has them
eval_interval = 2500  # iterations between evals (and checkpoints)
eval_iters = 96  # val batches per eval, split across ranks
eval_orders = 10  # seeded orders per val batch for the any-order loss and val_order (encoder: mask draws)
eval_ema = True  # evaluate the EMA weights (when ema_decay > 0)
eval_only = False  # evaluate once and exit
log_interval = 10  # iterations between log lines
progress = True  # a progress bar on stderr when it is a terminal (rank 0); False: log lines only
ckpt_interval = 0  # also write ckpt.pt every this many iterations (0: only at evals)
keep_ckpt_every = 0  # keep a copy ckpt_<iter>.pt whenever iter is a multiple of this (0: latest only)
always_save_checkpoint = True  # False: write ckpt.pt at an eval only when val_loss improved
wandb_log = False  # opt-in
wandb_project = 'aogpt'
wandb_run_name = 'ao-gpt-small'
wandb_mode = 'offline'  # offline | disabled | online (online can block on the network)
# data
dataset = 'openwebtext'  # reads <data_root>/<dataset>/{train,val}.bin and meta.json
data_root = 'data'
gradient_accumulation_steps = 32  # micro-steps per optimizer step, in total over all ranks
batch_size = 16  # sequences per micro-step; 16 x 1024 x 32 = 524,288 tokens per step
block_size = 1024  # sequence length n
# model (GPTConfig fields; see model.py)
vocab_size: int = None  # None: the dataset's vocab rounded up to a multiple of 64 (GPT-2: 50304)
n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = True
causal = True  # False: the encoder-only MDM baseline
cond = 'adaln'  # target-position conditioning: adaln (AO-GPT) | sigma (sigma-GPT) | none (GPT, MDM)
target_dim = 128  # width of the AdaLN target-position table
adaln_table = False  # compute AdaLN per position once and gather (same math)
loss_chunk = 0  # head + cross-entropy this many rows at a time, recomputed in backward (same math); 0: all at once
adaln_init = 'gate1'  # gate1 | paper
target_std = 0.02  # init std of the AdaLN target table (the paper's 0.02)
adaln_std: float = None  # init std of the AdaLN Linear weights; None: the generic 0.02 draw
norm = 'rms'  # rms | layer
qk_norm = True
tie_head = False
head_bias = True
gelu = 'exact'  # exact | tanh
mask_token_id: int = None  # the MDM's [MASK]; None: the first padding id (the dataset's vocab size)
# the Llama/Qwen block (config/train_ao_gpt_small_rope.py); a Hugging Face folder's init_from sets these from it
pos = 'learned'  # learned (wpe) | rope (each slot's q and k turned by its own position + 1)
rope_theta = 10000.0
rope_scaling: dict = None  # None | Llama 3's: factor, low_freq_factor, high_freq_factor, original_max_position_emb...
mlp = 'gelu'  # gelu | swiglu
mlp_hidden = 0  # the MLP's width; 0: 4 n_embd
n_kv_head = 0  # key/value heads (grouped-query attention); 0: n_head
head_dim = 0  # 0: n_embd // n_head
norm_eps = 1e-5
qkv_bias: bool = None  # biases in q, k, v; None: as bias
# orders (decoders)
order = 'mix:0.1*l2r+0.9*random'  # the order distribution (aogpt/orders.py): 10% L2R, else uniform (the paper's)
l2r_frac_end: float = None  # if set, the L2R weight of order (random, l2r or a mix of the two) moves linearly here
l2r_frac_iters = 0  # length of that schedule (0: lr_decay_iters)
order_warmup = ''  # '' | nearl2r:A:B | semiar:A:B: trained first, its W or K growing A -> B (geometrically), then order
order_warmup_iters = 0  # the steps order_warmup lasts (evals score `order` throughout)
# optimizer: AdamW (the paper's), or Muon for the blocks' hidden matrices beside AdamW for the rest; every
# group on one schedule, warmup then cosine decay
optimizer = 'adamw'  # adamw | muon
learning_rate = 6e-4  # AdamW's peak (optimizer=muon: for the embeddings, head, norms and biases)
max_iters = 500000
weight_decay = 0.05
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0: no clipping
decay_lr = True
warmup_iters = 2000
lr_decay_iters = 500000
min_lr = 6e-5
target_lr_scale = 1.0  # the target table's and AdaLN Linears' peak and floor, times this (adapting a GPT: finding 11)
muon_lr = 0.02  # optimizer=muon: Muon's peak; it decays to the same fraction of it as learning_rate to min_lr
muon_adaln = True  # optimizer=muon: the AdaLN Linears in Muon too (measured better: finding 9); False: AdamW
muon_dtype = 'bfloat16'  # optimizer=muon: Newton-Schulz in bfloat16 (torch's) | float32 (faster on CPUs without bf16 units)
ema_decay = 0.9999  # EMA of the weights, warm-up min(decay, (1+n)/(10+n)); 0 disables
# system
device = 'auto'  # auto (cuda if available, else cpu) | cpu | cuda | cuda:N
dtype = 'auto'  # auto: bfloat16 autocast on CUDA (float16 if unsupported), float32 on CPU
compile = False  # torch.compile the model (opt-in)
fsdp = False  # shard weights, gradients, optimizer states and EMA over the ranks (FSDP2: past one GPU); saves DCP folders
activation_checkpointing = False  # recompute each block in backward instead of keeping its activations (same math)
peak_flops = 0.0  # peak FLOP/s of one device for MFU (0: known GPUs by name; none on CPU)
seed = 1337
# -----------------------------------------------------------------------------
_given = set()  # the keys the config files and the command line set
cfg = configure(globals(), given=_given, moved=(OLD_KEYS, old_keys_line))

ddp = int(os.environ.get('RANK', -1)) != -1
rank = int(os.environ.get('RANK', 0))
master = rank == 0
show_bar = progress and master and sys.stderr.isatty()
run = Run(master)  # its progress bar and out_dir lock, and one line and a released out_dir however it ends
say, fail = run.say, run.fail  # and `with run.failing():` makes a library's UserError fail's line
iter_num, last_saved = 0, None  # optimizer steps done; (path, iteration) of the last checkpoint


def out_of_memory_line(kind, e, tb, previous=sys.excepthook):
    """Out of memory anywhere in the run (a step, an eval, a save): fail's one line, what to change and what is
    kept, not torch's traceback; any other exception as before."""
    if not out_of_memory(e):
        return previous(kind, e, tb)
    fail(f"out of memory at iteration {iter_num} ({first_line(e, 160)}): lower batch_size and raise "
         f"gradient_accumulation_steps as much (the same tokens per step), or set loss_chunk (the head and its loss a "
         f"chunk of rows at a time); " + (f"{last_saved[0]} (iteration {last_saved[1]}) is intact, and a run with "
                                         f"init_from=auto goes on from it" if last_saved else
                                         "no checkpoint was written"))


sys.excepthook = out_of_memory_line


def interrupted_at():
    """What a Ctrl-C says: where the run stands, and how to continue."""
    return f"interrupted at iteration {iter_num}: " + (
        f"{last_saved[0]} (iteration {last_saved[1]}) is intact; continue with the same command and "
        f"--init_from=auto" if last_saved and not eval_only else "no checkpoint was written")


def stop_point(agreed=None):
    """A safe point (nothing half-written, the lock still held): after a Ctrl-C or SIGTERM, the run ends here with
    interrupted_at's line (Run.stop). Under DDP every rank must stop at the same point, or a peer waits forever in
    a collective: there only the end of a step counts, where the ranks agree (agreed: the largest signal number
    any rank got, 0 for none)."""
    if ddp:
        if agreed is not None:
            run.stop(interrupted_at, agreed)
        return
    run.stop(interrupted_at, stop_requested())


with run.failing():
    train_order = check_config(cfg, _given)  # every key, before anything is read or written; the parsed order

# ------------------------------------------------------------------ devices and processes
with run.failing():
    device = resolve_device(device)
rank, world_size, device = start_ranks(device, group=fsdp)  # one process, or this torchrun rank's (on its own GPU)
device_type = device.split(':')[0]
if gradient_accumulation_steps % world_size:
    fail(f"gradient_accumulation_steps ({gradient_accumulation_steps}) counts micro-steps over all "
         f"ranks and must be a multiple of the world size ({world_size})")
local_steps = gradient_accumulation_steps // world_size
my_micro_steps = range(rank * local_steps, (rank + 1) * local_steps)  # global micro-step ids
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size

ctx, dtype = autocast(device, dtype)
with run.failing():
    check_sharding(fsdp, device_type, dtype)  # what the sharded path cannot run: one line, never a fallback
fast_math(device)  # TF32 on CUDA; on the CPU, denormals flushed to zero

restart = torch.tensor(0)  # a fine-tune's command run again (torchrun --max-restarts) into its own run: resume it
if master:
    with run.failing():
        restart += restarted(out_dir, init_from, cfg['init_ema'], eval_only)
if dist.is_initialized():
    dist.broadcast(restart, 0)
if restart:
    say(f"{out_dir} holds the run this command started from {init_from} (the same weights' sha256): resuming it")
    init_from = cfg['init_from'] = 'resume'
if master:
    with run.failing():  # made, locked and proven writable before the first step; and no other run's (check_room)
        run.lock = claim_out_dir(out_dir, init_from, eval_only)
    print_config(cfg)
ckpt_path = os.path.join(out_dir, CKPT_NAME)
log_path = os.path.join(out_dir, LOG_NAME)

# ------------------------------------------------------------------ data
with run.failing():
    data_dir, codec, n_train, n_val = check_data(cfg, say)  # codec: saved in every checkpoint
    data_dtype = meta_dtype(read_meta(data_dir))  # the bins' dtype (aogpt/bins.py), checked by check_data
data_vocab = codec.vocab_size


def read_windows(split, starts):
    """Token windows [s, s + block_size) as a (B, n) LongTensor on the device."""
    # re-open the memmap every call: a long-lived one keeps growing the page cache (nanoGPT #428)
    path = os.path.join(data_dir, f'{split}.bin')
    data = open_bin(path, data_dtype)
    if len(data) < (n_train if split == 'train' else n_val):  # replaced mid-run: windows would run off its end
        fail(f"{path} now holds {len(data):,} tokens, fewer than the {n_train if split == 'train' else n_val:,} it "
             f"held when the run started: it was replaced or cut mid-run; put the full file back and continue with "
             f"--init_from=auto" + (f" (the last checkpoint is iteration {last_saved[1]})" if last_saved else ""))
    # one gather (B, n) from a view of every window: a batch past the memory fails in the allocator at once (a
    # MemoryError: the out-of-memory line), where a list of B slices filled the memory first
    windows = np.lib.stride_tricks.sliding_window_view(data, block_size)[np.asarray(starts, dtype=np.int64)]
    top = int(windows.max())
    if top >= data_vocab:  # a hand-made bin: such an id would train the padding rows, or be the mask
        fail(f"{path} holds token id {top}, but its codec (meta.json) has {data_vocab} "
             f"symbols: the bins and their metadata disagree; re-run the dataset's prepare.py")
    x = torch.from_numpy(windows.astype(np.int64))
    if device_type == 'cuda':
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def seed_for(*keys):
    """A well-mixed 63-bit seed from (seed, *keys): the counter-based source of all training draws."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1, np.uint64)[0]) >> 1


cpu_gen = torch.Generator()
dev_gen = torch.Generator(device=device)

# ------------------------------------------------------------------ model
torch.manual_seed(seed)  # the initial weights (identical on every rank; DDP also broadcasts rank 0's)

with run.failing():
    source_args, weights, ckpt, resume_path, started_from = model_source(cfg, _given, codec, data_dir, say, lazy=fsdp)
model_args = dict(source_args, dropout=dropout, adaln_table=adaln_table, loss_chunk=loss_chunk)
# the record (ckpt.pt's config, an export's train_config, its model card) says what the model is: a resume or a
# fine-tune takes its shape from the checkpoint, whatever defaults the config left in place (block_size stays the
# length trained on, which may be shorter than the model's)
cfg.update({k: v for k, v in model_args.items() if k in cfg and k != 'block_size'})
try:
    GPTConfig(**model_args)
except ValueError as e:  # e.g. a mask_token_id beyond the vocab_size derived from the data
    fail(f"{e} (vocab_size {model_args['vocab_size']} for the {data_vocab} ids of {data_dir})")
with run.failing():
    check_model(model_args, cfg, train_order, data_vocab, data_dir, _given)  # against the data, orders, settings
# model: what the loop calls (compiled, DDP); raw_model: the GPT (sharded in place with fsdp) the rest takes
if compile:
    say("compiling the model (takes a minute)...")
model, raw_model = build(model_args, weights, device, fsdp=fsdp, ddp=ddp, dtype=dtype, compile=compile,
                         activation_checkpointing=activation_checkpointing,
                         frozen=[] if model_args['causal'] else ['transformer.wnonee.weight'])  # encoder: no [None]
if started_from is not None and started_from['weights_sha256'] is None:  # a source read in shards: hash what arrived
    started_from['weights_sha256'] = weights_sha256(raw_model, names=set(weights))
del weights
say(f"model: {raw_model.get_num_params() / 1e6:.2f}M parameters; {world_size} rank(s){' (FSDP)' * fsdp} on "
    f"{device_type}, {dtype}; {tokens_per_iter:,} tokens per iteration ({batch_size} x {block_size} x "
    f"{gradient_accumulation_steps} micro-steps)")

# ------------------------------------------------------------------ orders
warmup = parse_warmup(order_warmup)  # None, or (kind, A, B): trained before `order` (checked in check_config)
fixed_order = None  # (n,) for a fixed order (fixed:S, fixedblocks:K:S)
if model_args['causal'] and train_order.fixed:
    fixed_order = train_order.permutation(block_size)
    if ckpt is not None and ckpt.get('order') is not None and not torch.equal(ckpt['order'], fixed_order):
        say("using the fixed order saved in the checkpoint (the config now gives a different one)")
        fixed_order = ckpt['order'].clone()
    fixed_order = fixed_order.to(device)


def order_at(it):
    """The order distribution trained at iteration it: order, or on the l2r_frac_end schedule its L2R weight
    moved linearly from order's toward l2r_frac_end (orders.l2r_mix)."""
    if l2r_frac_end is None:
        return train_order
    w, start = min(it / max(1, l2r_frac_iters or lr_decay_iters), 1.0), train_order.l2r_weight
    return l2r_mix(start + w * (l2r_frac_end - start))


def train_micro_batch(it, m, law):
    """Global micro-step m of iteration it: a pure function of (seed, it, m), whatever the world size."""
    cpu_gen.manual_seed(seed_for(it, m, 0))
    starts = torch.randint(n_train - block_size + 1, (batch_size,), generator=cpu_gen).numpy()
    x = read_windows('train', starts)
    dev_gen.manual_seed(seed_for(it, m, 1))
    s = seed_for(it, m, 2)  # dropout draws from the default generators
    torch.default_generator.manual_seed(s)
    if device_type == 'cuda':
        torch.cuda.manual_seed(s)
    if not model_args['causal']:
        xt, t = mdm_corrupt(x, model_args['mask_token_id'], generator=dev_gen)
        return dict(idx=xt, targets=x, t=t)
    if law.is_l2r:  # the model's own left-to-right pass
        sigma = None
    elif fixed_order is not None:
        sigma = fixed_order.expand(batch_size, -1)
    else:
        sigma = law.draw(batch_size, block_size, device=device, generator=dev_gen)  # (B, n)
    return dict(idx=x, order=sigma, targets=x)


# ------------------------------------------------------------------ optimizer, EMA, scaler
# [AdamW] or [AdamW, Muon], each param group with its own peak and floor on the one schedule (get_lr)
optimizers = configure_optimizers(raw_model, weight_decay, learning_rate, (beta1, beta2), device_type,
                                  optimizer=optimizer, min_lr=min_lr, muon_lr=muon_lr, muon_adaln=muon_adaln,
                                  muon_dtype=muon_dtype, target_lr_scale=target_lr_scale)
with run.failing():
    check_step_sizes(optimizers, cfg)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))
ema = EMA(raw_model, ema_decay) if ema_decay > 0 else None  # see ema.py
best_val_loss, elapsed, t_start = float('inf'), 0.0, time.time()  # elapsed: the run's seconds before t_start
train_losses = []  # the training losses since the last eval, averaged into its train_loss
if ckpt is not None:
    def setup(c):  # what the saved optimizer states fit: another optimizer or AdaLN placement groups them otherwise
        muon = c.get('optimizer') == 'muon'
        return c.get('optimizer', 'adamw') + (f", muon_adaln={c.get('muon_adaln')}" if muon else '') + \
            (', target_lr_scale != 1' if c.get('target_lr_scale', 1.0) != 1 else '')  # its own groups
    if setup(ckpt['config']) != setup(cfg):
        fail(f"{resume_path} was trained with optimizer={setup(ckpt['config'])}, but this config asks for "
             f"optimizer={setup(cfg)}: its optimizer state fits only its own setting, so resume with that, or "
             f"fine-tune from it with a fresh optimizer (init_from={resume_path}, in another out_dir)")
    with run.failing():
        iter_num, best_val_loss, elapsed, train_losses = resume_state(ckpt, optimizers, scaler, ema, raw_model,
                                                                      resume_path)
    last_saved = (resume_path, iter_num)
    say(f"resumed {resume_path} at iteration {iter_num}")
    if iter_num >= max_iters and not eval_only:
        say(f"it has reached max_iters ({max_iters}): nothing to train (raise max_iters to train on)")
    del ckpt
start_iter = iter_num
stop_point()



def get_lr(it, peak=learning_rate, floor=min_lr):
    """The schedule at iteration it for a param group peaking at `peak` and ending at `floor` (its initial_lr and
    min_lr; learning_rate's by default). Written as peak and floor, not as one multiplier of the peak: the two
    round apart in float64, and the written form is the one every run so far trained with."""
    if not decay_lr:
        return peak
    if it < warmup_iters:
        return peak * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return floor
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return floor + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak - floor)


# ------------------------------------------------------------------ validation
val_batches = val_windows(n_val, block_size, eval_iters, batch_size)  # fixed, the same at every eval


def evaluate():
    """The val losses (valloss.py): this rank's share of the val batches, summed over ranks; with the EMA
    weights when eval_ema."""
    use_ema = eval_ema and ema is not None
    if use_ema:
        ema.swap()
    mine = list(range(rank, len(val_batches), world_size))
    if fsdp:  # a forward all-gathers: every rank makes as many (None: a pass not counted)
        mine += [None] * (-(-len(val_batches) // world_size) - len(mine))
    mine = progress_of(mine, f"eval {iter_num}", show_bar, say)
    mine = (stop_point() or i for i in mine)  # a long eval still answers a Ctrl-C within a val batch
    out = val_losses(raw_model, val_batches, mine, read_windows, ctx, eval_orders, order_at(iter_num), fixed_order)
    if use_ema:
        ema.swap()
    return dict(out, ema=use_ema)


# ------------------------------------------------------------------ checkpoints and logs
def save():
    """Write the checkpoint: ckpt.pt (rank 0), and its copy every keep_ckpt_every; with fsdp, a sharded folder
    ckpt_<iter>.dcp that every rank writes its rows into (aogpt/sharded.py), the older ones then dropped but those
    keep_ckpt_every keeps. A Ctrl-C meanwhile is answered at the next stop_point, after the write; a failed write (a
    full disk) stops the run with one line and leaves the previous checkpoint as it was."""
    global last_saved
    record = dict(model_args=model_args, codec=codec.record(), scaler=scaler.state_dict(), iter_num=iter_num,
                  best_val_loss=best_val_loss, config=cfg, train_losses=train_losses, tokens=iter_num * tokens_per_iter,
                  elapsed=elapsed + time.time() - t_start, started_from=started_from)
    path = os.path.join(out_dir, sharded.save_name(iter_num)) if fsdp else ckpt_path
    try:
        if fsdp:
            ema_record = dict(decay=ema.decay, num_updates=ema.num_updates) if ema is not None else None
            sharded.save(out_dir, iter_num, raw_model, optimizers, ema, dict(
                record, ema=ema_record, optimizers=[type(o).__name__ for o in optimizers],
                order=fixed_order.tolist() if fixed_order is not None else None), keep_ckpt_every)
        elif master:
            save_checkpoint(dict(record, format='aogpt-v1', model=raw_model.state_dict(),
                                 ema=ema.state_dict() if ema is not None else None,
                                 optimizers=[opt.state_dict() for opt in optimizers],
                                 order=fixed_order.cpu() if fixed_order is not None else None), ckpt_path)
            if keep_ckpt_every and iter_num % keep_ckpt_every == 0:
                keep_copy(ckpt_path, iter_num)
    except OSError as e:  # the temp file or folder is gone
        fail(f"could not write {path} at iteration {iter_num} ({e}); "
             + (f"the previous one (iteration {last_saved[1]}) is intact" if last_saved else
                "no checkpoint was written"))
    say(f"saved {path} (iteration {iter_num})")
    last_saved = (path, iter_num)


if master:
    with run.failing():
        try:
            rewind_out_dir(out_dir, log_path, start_iter, eval_only, say)  # as the checkpoint resumed left it
        except OSError as e:
            fail(f"cannot rewrite {log_path} ({e.strerror or e}); the checkpoint is untouched")
    if wandb_log:
        import wandb
        wandb.init(project=wandb_project, name=wandb_run_name, config=cfg, mode=wandb_mode, dir=out_dir)

# ------------------------------------------------------------------ what the run will cost
# Said before the first eval, which for a GPU-sized config on a CPU can take many silent minutes.
flops_per_token = raw_model.estimate_flops_per_token(block_size)  # training: forward + backward
if peak_flops <= 0 and device_type == 'cuda':
    peak_flops = gpu_peak_flops(torch.cuda.get_device_name())
passes = val_passes(raw_model, eval_orders, fixed_order, order_at(iter_num))  # forward passes per val batch
cost_warnings(cfg, device_type == 'cpu', flops_per_token, val_batches, passes, iter_num, say)
lr_warnings(cfg, get_lr, say)
if one_block(train_order, block_size):
    say(f"note: {one_block(train_order, block_size)}")

# ------------------------------------------------------------------ the loop
interval_losses = []
t_interval, tokens_interval, t_eval_window, tokens_eval_window = 0.0, 0, 0.0, 0


def speed():
    """Throughput since the last log line, and with peak_flops the MFU of one rank."""
    tps = tokens_interval / t_interval
    mfu = f", mfu {flops_per_token * tps / world_size / peak_flops:.1%}" if peak_flops > 0 else ""
    return f"{tps:,.0f} tok/s{mfu}"


if show_bar and not eval_only:
    run.bar = tqdm(total=max_iters, initial=iter_num, desc='train', unit='it', dynamic_ncols=True, file=sys.stderr)

while True:
    lr = get_lr(iter_num)  # learning_rate's, the one logged
    for opt in optimizers:
        for group in opt.param_groups:  # each group on the one curve, between its own peak and floor
            group['lr'] = get_lr(iter_num, group['initial_lr'], group['min_lr'])
    law = warmup_order(warmup, iter_num / order_warmup_iters) if iter_num < order_warmup_iters else order_at(iter_num)

    resumed_here = iter_num == start_iter > 0 and not eval_only  # that eval is already in the log
    if (iter_num % eval_interval == 0 or iter_num == max_iters or eval_only) and not resumed_here:
        res = evaluate()
        if res['val_loss'] is not None and not math.isfinite(res['val_loss']):
            fail(f"non-finite val loss at iteration {iter_num}; not writing a checkpoint"
                 + (f" (the last good one, iteration {last_saved[1]}, is untouched)" if last_saved else ""))
        rec = dict(iter=iter_num, tokens=iter_num * tokens_per_iter,
                   train_loss=sum(train_losses) / len(train_losses) if train_losses else None,
                   **{k: res[k] for k in ('val_loss', 'val_l2r', 'val_ao', 'val_order', 'val_elbo')},
                   lr=lr, l2r_frac=law.l2r_weight if (model_args['causal'] and law.l2r_weight is not None and
                                                      not law.is_l2r) else None,
                   ema=res['ema'], time=round(elapsed + time.time() - t_start, 2),
                   tok_per_s=round(tokens_eval_window / t_eval_window) if t_eval_window else None)
        train_losses, t_eval_window, tokens_eval_window = [], 0.0, 0
        if master:
            shown = ', '.join(f"{k[4:]} {v:.4f}" for k, v in rec.items() if k.startswith('val_') and v is not None)
            tl = f", train {rec['train_loss']:.4f}" if rec['train_loss'] is not None else ""
            say(f"eval {iter_num}: {shown}{tl}{' (EMA)' if rec['ema'] else ''}")
            try:
                append_jsonl(log_path, rec, say)  # the whole line or nothing
            except OSError as e:
                fail(f"could not append the iteration-{iter_num} eval to {log_path} ({e.strerror or e}); "
                     + (f"{last_saved[0]} (iteration {last_saved[1]}) is intact" if last_saved else
                        "no checkpoint was written"))
            with run.failing():
                plot_log(log_path, os.path.join(out_dir, PLOT_NAME))
            if wandb_log:
                wandb.log({k: v for k, v in rec.items() if v is not None}, step=iter_num)
        improved = res['val_loss'] is not None and res['val_loss'] < best_val_loss
        if improved:
            best_val_loss = res['val_loss']
        if iter_num > 0 and not eval_only and (always_save_checkpoint or improved):
            save()
    elif ckpt_interval and iter_num % ckpt_interval == 0 and iter_num > start_iter and not eval_only:
        save()
    if iter_num >= max_iters or eval_only:
        break
    stop_point()  # between steps: the eval's records and the checkpoint above are complete

    # one optimizer step: local_steps micro-steps on this rank, gradients all-reduced on the last
    t0 = time.time()
    loss_sum = torch.zeros((), device=device)
    for j, m in enumerate(my_micro_steps):
        stop_point()  # a step's gradients are dropped with it: the checkpoint is of the last whole step
        batch = train_micro_batch(iter_num, m, law)
        if ddp and not fsdp:  # (FSDP reduce-scatters every micro-step: no whole gradient is ever held)
            model.require_backward_grad_sync = (j == local_steps - 1)
        with ctx:
            _, loss = model(**batch)  # through the DDP / compiled wrapper, so its hooks run
            loss = loss / local_steps
        loss_sum += loss.detach()
        scaler.scale(loss).backward()
    if ddp:
        dist.all_reduce(loss_sum)
        loss_sum /= world_size
        agreed = torch.tensor(stop_requested() or 0, device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        stop_point(int(agreed))  # before the update: every rank's checkpoint is of the last whole step
    lossf = loss_sum.item()  # one sync per step; every rank sees the same value and stops together
    if not math.isfinite(lossf):
        fail(f"non-finite training loss ({lossf}) at iteration {iter_num}: stopped before the update. "
             + (f"The last good checkpoint, {last_saved[0]} (iteration {last_saved[1]}), is untouched"
                if last_saved else "No checkpoint was written")
             + "; try a lower learning_rate or dtype=float32")
    if grad_clip > 0:
        for opt in optimizers:
            scaler.unscale_(opt)
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)  # before clipping
    for opt in optimizers:
        scaler.step(opt)  # float16: skipped for an optimizer whose gradients overflowed
    scaler.update()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    if ema is not None:
        ema.update()
    iter_num += 1

    dt = time.time() - t0
    train_losses.append(lossf)
    interval_losses.append(lossf)
    t_interval += dt
    tokens_interval += tokens_per_iter
    t_eval_window += dt
    tokens_eval_window += tokens_per_iter
    if run.bar is not None:  # the bar stands in for the log lines: the same numbers, since the last log_interval
        run.bar.set_postfix_str(f"loss {sum(interval_losses) / len(interval_losses):.4f}, lr {lr:.2e}, {speed()}",
                                refresh=False)
        run.bar.update()
    if iter_num % log_interval == 0:
        gn = f", grad norm {gnorm.item():.2f}" if grad_clip > 0 else ""
        if run.bar is None:
            say(f"iter {iter_num}/{max_iters}: loss {sum(interval_losses) / len(interval_losses):.4f}, "
                f"lr {lr:.2e}{gn}, {speed()}, {1000 * t_interval / len(interval_losses):.0f} ms/iter")
        interval_losses, t_interval, tokens_interval = [], 0.0, 0

if run.bar is not None:
    run.bar.close()
    run.bar = None
stop_point()  # a signal during the last eval or save: the run is whole, but the line and status still say so
if master and wandb_log:
    wandb.finish()  # it writes into out_dir: before the lock goes
run.lock = release_out_dir(run.lock)  # the OS would at exit; a caller that runs train.py in-process may start another run here
if dist.is_initialized():  # torchrun's ranks, or fsdp's world of one
    dist.barrier()  # no rank tears down gloo while a peer still has a collective in flight
    dist.destroy_process_group()
if ddp:
    # torch 2.13's gloo backend can still abort the process at interpreter exit ("terminate called
    # without an active exception", now and then on a loaded 2-core machine), and torchrun then
    # reports a finished run as failed. Everything is saved and flushed by now, so leave without
    # running the interpreter's teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
