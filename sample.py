"""
Sample from a checkpoint: AO-GPT / sigma-GPT with the KV-cached any-order sampler, an encoder MDM with
the masked-diffusion reverse process, or an L2R GPT with plain KV-cache decoding (dispatched on
model.config). EMA weights by default.

    python sample.py --steps 1024                                        # from out/ckpt.pt
    python sample.py --prompt "The company said" --length 64 --steps 64  # a prefix
    python sample.py --template "The [BLANK] sat on the [BLANK:3] mat."  # infilling
    python sample.py --steps 256 --batch_size 32 --gen_ppl out-l2r      # + generative perplexity
    python sample.py --order semiar:64 --steps 256                       # semi-AR: blocks left to right
    python sample.py --order nearl2r:8 --speculative auto                # near L2R, exact parallel decoding
    python sample.py --order confidence --steps 64                       # the surest positions first
    python sample.py --order confidence --threshold 0.9                  # all with top prob >= 0.9 per step
    python sample.py --until_eot True --order semiar:8                   # one document each, stopping early

The samplers themselves are in generate.py, how each forward call runs in engine.py, and generative
perplexity in genppl.py.
"""

import json
import os
import re
import sys
import time
import unicodedata

import torch

from aogpt import engine, generate, genppl
from aogpt.configurator import namespace, print_config, stop_on_ctrl_c
from aogpt.errors import command, die
from aogpt.errors import UserError
from aogpt.orders import GRAMMAR, L2R, UNIFORM, Order, one_block, order_of_config, spec_of_config
from aogpt.paths import check_writable
from aogpt.runtime import script_device
from aogpt.samplers import MDM_COUNTS, SAMPLERS, SCORES, EncoderPlan, Sampling, unread
from aogpt.speculative import Speculation, generate_speculative, row_stepper

# -----------------------------------------------------------------------------
# CLI config (python sample.py --help lists these with their comments)
out_dir = 'out'            # checkpoint directory (its ckpt.pt)
ckpt = ''                  # checkpoint file or dir, export.py folder, or hf:owner/repo[/path.pt]; overrides out_dir
use_ema: bool = None       # None: the EMA weights if the checkpoint has them; True/False to force
dataset = ''               # a data dir or name to check the codec against; '' = the checkpoint's codec
batch_size = 4             # samples per batch (they share the per-step counts, see the docstring)
num_batches = 1            # batches to draw (more samples for --gen_ppl)
steps = 256                # T: diffusion steps (not for a GPT, --speculative or --threshold: refused there)
length = -1                # total length n; -1: block_size (with --template: the template's length)
order = 'auto'             # auto | an order spec (aogpt/orders.py) | FILE | confidence | margin | entropy (a sampler)
threshold = 0.0            # confidence samplers: reveal every position whose top probability is >= this (0: counts)
fixed_counts = False       # the paper code's deterministic counts instead of Binomial draws
schedule = 'linear'        # linear | cosine (t = cos(pi/2 (1 - u))): fraction still masked per step
temperature = 1.0          # softmax temperature, >= 0; 0 = greedy
top_p = 1.0                # nucleus sampling, in (0, 1]: keep the most likely tokens up to this mass
prompt = ''                # text the samples start with
suffix = ''                # text the samples end with
template = ''              # text with [BLANK] (blank_len tokens) or [BLANK:k] (k tokens) spans to fill
blank_len = 8              # tokens per [BLANK], >= 1
speculative = ''           # K (draft length >= 2) or auto: exact speculative sampling along --order (speculative.py)
fused = False              # speculative: one forward call a round (the next drafts hang off the verify call)
stepper = 'dynamic'        # forward calls: dynamic | static (fixed padded shapes) | cuda_graph (static, replayed)
cache_trick = True         # encoder MDM: a step that reveals nothing reuses the last pass (MDLM)
mdm_counts = 'shared'      # encoder MDM: shared (one count per step for the batch) | independent (per sample)
gen_ppl = ''               # judge: a checkpoint of ours (any --ckpt form), or a Hugging Face model (a folder or
                           # hf:owner/repo): GPT-2, or a Llama, Mistral, Qwen2 or Qwen3 with its tokenizer.json
gen_ppl_mode = 'auto'      # none: all n scored after [None]; hf: no BOS, token 0 unscored; auto: hf for an HF GPT-2
judge_batch_size = 16      # judge forward batch, >= 1
trace = ''                 # write an HTML page of how each sample (of the last batch) filled in, step by step
save = ''                  # write the samples (ids, text) and stats as JSON to this file (its folder must exist)
seed = 1337
device = 'auto'            # auto | cpu | cuda | cuda:1 | mps
dtype = 'auto'             # auto (bfloat16 autocast on CUDA, float32 elsewhere) | float32 | bfloat16 | float16
quiet = False              # do not print the samples
until_eot = False          # each sample is its first document, cut at its first end symbol (EOT; a char codec's
                           # newline) after the given text; samplers stop once it is settled (docs/sampling.md)
# -----------------------------------------------------------------------------

# ----------------------------------------------------------------------------- CLI helpers

_BLANK = re.compile(r'\[BLANK(?::([^\[\]]*))?\]')


def encode_template(text, codec, blank_len, limit=None):
    """Template text -> ids with -1 for each position to fill. `[BLANK]` is blank_len tokens and
    `[BLANK:k]` is k tokens, k >= 1. Whitespace before a blank is left to the blank: with GPT-2's BPE a
    word carries its leading space, so "The [BLANK] sat" gives "The", k free tokens, " sat". A malformed
    blank ([BLANK:-2], [BLANK:x], an unclosed [BLANK) is an error, never kept as literal text. limit: the
    most tokens the template may take (the model's window), checked before a blank's positions are made (a
    [BLANK:9999999999] would fill the memory first)."""
    if blank_len < 1:
        raise ValueError(f"--blank_len must be >= 1, got {blank_len}")
    ids, at = [], 0
    for m in _BLANK.finditer(text):
        digits = m.group(1)
        k = blank_len if digits is None else int(digits) if digits.isdigit() and len(digits) < 19 else \
            2 ** 63 if digits.isdigit() else 0  # 19 digits and more: past any window (and int64)
        if k < 1:
            raise ValueError(f"{m.group(0)}: a blank is [BLANK] or [BLANK:k] with k >= 1 tokens")
        piece = text[at:m.start()].rstrip()
        ids += codec.encode(piece) if piece else []
        if limit is not None and len(ids) + k > limit:
            what = m.group(0) if digits else f"[BLANK] (--blank_len {blank_len})"
            raise ValueError(f"the template is too long: {what} takes it past the model's block_size, {limit} tokens")
        ids += [-1] * k
        at = m.end()
    if '[BLANK' in text[at:] or any('[BLANK' in text[a:b] for a, b in _gaps(text)):
        raise ValueError("an unclosed or malformed [BLANK in the template: write [BLANK] or [BLANK:k]")
    return ids + (codec.encode(text[at:]) if text[at:] else [])


def _gaps(text):
    """The stretches of text between blanks (where a stray '[BLANK' would be a typo)."""
    at = 0
    for m in _BLANK.finditer(text):
        yield at, m.start()
        at = m.end()


def read_order_file(path, n):
    """A generation order from a file (.npy, or text of integers): a permutation of range(L), L >= n;
    positions >= n are dropped, the rest keep their order."""
    import numpy as np
    try:
        vals = np.load(path).reshape(-1).tolist() if path.endswith('.npy') else \
            [int(v) for v in re.split(r'[\s,]+', open(path).read().strip()) if v]
    except (ValueError, OSError) as e:
        die(f"--order {path}: cannot read a list of integers ({e})")
    return order_for_length(vals, n, f"--order {path}")


def order_for_length(vals, n, what):
    vals = [int(v) for v in vals]
    if sorted(vals) != list(range(len(vals))) or len(vals) < n:
        die(f"{what}: not a permutation of range(L) with L >= length {n}")
    return torch.tensor([v for v in vals if v < n])


def printable(text):
    """Sample text for a terminal: control characters (an untrained model emits them) as escapes, so
    they cannot move the cursor or clear the screen; newlines and tabs stay."""
    return ''.join(ch if ch in '\n\t' or unicodedata.category(ch)[0] != 'C' else
                   ch.encode('unicode_escape').decode('ascii') for ch in text)


# ----------------------------------------------------------------------------- main

@command
def main(argv=None):
    c = read_config(argv)
    print_config(c.config)
    model, ck, used_ema, codec, family = load_for_sampling(c)
    sampler = choose_sampler(c, model, family)
    given, n = layout(c, codec, model.config.block_size, family)
    order = gpt_order(c, ck, n, given) if family == 'ar' else generation_order(c, ck, family, n, sampler)
    end = document_end(c, codec, given, family, sampler)
    judge = load_judge_for(c, codec, n) if c.gen_ppl else None  # before sampling: a bad judge costs seconds
    samples, stats, wall = draw(c, model, sampler, n, given, order, codec, end if c.until_eot else None)
    docs = documents(c, samples, given, end, stats)
    texts = [codec.decode(row.tolist()) for row in samples] if docs is None else \
        [codec.decode(d) for d in docs['ids']]
    if not c.quiet:
        for i, text in enumerate(texts):
            print(f"---------- sample {i}\n{printable(text)}")
        print("----------")
    N = samples.size(0)
    steps = f"{'threshold-chosen' if stats['steps'] is None else stats['steps']} steps"  # that revealed a token
    if 'steps' in SAMPLERS[sampler].reads and not c.threshold and stats['steps'] is not None and \
            stats['steps'] < c.steps:  # with a threshold, the steps are not --steps' counts
        steps += f" (of --steps {c.steps}: the others revealed no token)"
    print(f"{N} samples x {n} tokens ({stats['tokens_generated']} generated each), {steps}: "
          f"{wall:.2f} s wall, {N * stats['tokens_generated'] / wall:.1f} tokens/s; per sample "
          f"{stats['token_passes']:g} token-passes ({stats['token_passes'] / n:.2f} n) in "
          f"{stats['forward_calls']:g} forward calls (last batch)")
    if docs is not None:
        print(docs.pop('line'))
    if c.speculative:
        print(f"speculative (k={c.speculative}{', fused' if c.fused else ''}): {stats['tokens_generated'] / stats['forward_calls']:.2f} tokens per "
              f"forward call of the batch, {stats['tokens_generated'] / stats['calls_per_sample']:.2f} per call a "
              f"sample needs on its own ({stats['calls_per_sample']:.1f} calls); {stats['rounds_per_sample']:.1f} "
              f"rounds per sample (the batch: {stats['rounds']}), "
              f"{stats['tokens_generated'] / stats['rounds_per_sample']:.2f} tokens committed per round; drafts "
              f"accepted in {stats['accept_rate']:.1%} of the tests")
    if c.trace:
        from aogpt import tracepage
        what = f"speculative k={c.speculative}{', fused' if c.fused else ''}" if c.speculative else f"{family}, {stats['steps']} steps"
        try:
            tracepage.write(c.trace, samples[-c.batch_size:], stats, int((given >= 0).sum()),
                            lambda t: codec.decode([t]), f"{c.ckpt or c.out_dir}: {what}")
        except OSError as e:
            die(f"cannot write --trace {c.trace} ({e.strerror or e}); nothing was written there")
        print(f"trace: {c.trace}")
    result = dict(config=c.config, n=n, wall_s=wall, stats={k: v for k, v in stats.items()
                                                            if k not in ('order', 'events', 'step_of')},
                  samples=samples.tolist() if docs is None else docs['ids'], texts=texts)
    if docs is not None:
        result['documents'] = {k: v for k, v in docs.items() if k not in ('ids', 'judged')}
    if judge is not None:
        result['gen_ppl'] = score(c, judge, samples if docs is None else docs['judged'], codec, docs is not None)
    if c.save:
        from aogpt.paths import atomic_write
        try:  # atomically, as checkpoints are written: a full disk leaves no 0-byte file
            atomic_write(c.save, lambda f: json.dump(result, f), 'w')
        except OSError as e:
            die(f"cannot write --save {c.save} ({e.strerror or e}); nothing was written there")
        print(f"saved {c.save}")


def read_config(argv=None):
    """The resolved config (a namespace; the module's defaults stay untouched), every value and every
    destination checked before anything loads or samples."""
    c = namespace(globals(), argv)
    bad = Sampling.invalid(schedule=c.schedule, top_p=c.top_p, temperature=c.temperature,
                           threshold=c.threshold)  # the settings' own rules
    if bad:
        die(f"invalid --{bad[0]}={getattr(c, bad[0])!r}: {bad[1]} (see --help)")
    for key, ok in (('mdm_counts', c.mdm_counts in MDM_COUNTS),
                    ('gen_ppl_mode', c.gen_ppl_mode in ('auto', 'none', 'hf')), ('steps', c.steps >= 1),
                    ('batch_size', c.batch_size >= 1), ('num_batches', c.num_batches >= 1),
                    ('stepper', c.stepper in engine.STEPPERS), ('blank_len', c.blank_len >= 1),
                    ('judge_batch_size', c.judge_batch_size >= 1), ('length', c.length == -1 or c.length >= 1),
                    ('speculative', c.speculative in ('', 'auto') or
                     c.speculative.isascii() and c.speculative.isdigit() and int(c.speculative) >= 2)):
        if not ok:
            die(f"invalid --{key}={getattr(c, key)!r} (see --help for the valid values)")
    c.device, c.ctx, c.precision = script_device(c.device, c.dtype)
    if c.stepper == 'cuda_graph' and not c.device.startswith('cuda'):
        die(f"--stepper cuda_graph needs a CUDA device (got --device {c.device}); use static or dynamic")
    if c.until_eot and c.trace:
        die("--trace draws how the whole window filled in; with --until_eot a sample stops part way: drop one")
    for flag, owner in (('gen_ppl_mode', 'gen_ppl'), ('judge_batch_size', 'gen_ppl'), ('blank_len', 'template')):
        if flag in c.given and not getattr(c, owner):  # the judge's and the template's own settings
            die(f"--{flag} is not used here: it is --{owner}'s setting, and there is no --{owner}; drop --{flag}")
    for flag, example in (('save', 'samples.json'), ('trace', 'trace.html')):
        if getattr(c, flag):
            check_writable(getattr(c, flag), flag, example)
    return c


def load_for_sampling(c):
    """The model (EMA weights by default), its checkpoint dict, its codec, and which sampler it takes:
    'ao' (an any-order decoder), 'mdm' (an encoder) or 'ar' (a left-to-right GPT)."""
    from aogpt.checkpoint import load_model
    model, ck, used_ema, codec = load_model(c.ckpt or c.out_dir, c.device, c.use_ema, dataset=c.dataset)
    mc = model.config
    family = 'mdm' if not mc.causal else ('ao' if model.any_order else 'ar')
    ar = 'L2R GPT' if ck.get('order') is None else 'fixed-order GPT'
    print(f"model: {dict(mdm='encoder MDM', ao='any-order decoder', ar=ar)[family]} "
          f"(cond={mc.cond!r}), {model.get_num_params() / 1e6:.2f}M params, "
          f"{'EMA' if used_ema else 'raw'} weights; codec {codec.name} (vocab {codec.vocab_size})")
    return model, ck, used_ema, codec, family


def layout(c, codec, block_size, family):
    """(given (n,) LongTensor: the token ids given by --prompt/--suffix/--template, -1 where to generate; n)."""
    if c.template and (c.prompt or c.suffix):
        die("use either --template or --prompt/--suffix, not both")
    try:
        lay = encode_template(c.template, codec, c.blank_len, block_size) if c.template else []
    except ValueError as e:
        die(f"--template: {e}")
    if 'blank_len' in c.given and c.template and all(m.group(1) is not None for m in _BLANK.finditer(c.template)):
        die("--blank_len is not used here: it is the length of a bare [BLANK], and every blank of this template says "
            "its own ([BLANK:k]); drop --blank_len")
    n = (len(lay) if c.template else block_size) if c.length == -1 else c.length
    if n > block_size:
        die(f"length {n} exceeds the model's block_size {block_size}" + (": the template is too long"
                                                                         if c.template else ""))
    if c.template:
        if len(lay) > n:
            die(f"the template is {len(lay)} tokens but --length is {n}")
        lay += [-1] * (n - len(lay))  # free positions after the template
    else:
        p, s = codec.encode(c.prompt) if c.prompt else [], codec.encode(c.suffix) if c.suffix else []
        if len(p) + len(s) >= n:
            die(f"the prompt and suffix take {len(p) + len(s)} tokens of length {n}: no room left to "
                f"generate; raise --length (at most block_size {block_size}) or shorten them")
        lay = p + [-1] * (n - len(p) - len(s)) + s
    if n < 1 or all(v >= 0 for v in lay):
        die("no position left to generate: add a [BLANK] or raise --length")
    if family == 'ar' and (c.suffix or c.template):
        die("a GPT (cond='none') can only continue a prompt: --suffix/--template need an any-order "
            "model or an encoder MDM")
    return torch.tensor(lay), n


# Each flag of a setting that only some samplers read, and the setting's name in samplers.SAMPLERS (the one table
# of which sampler reads what): such a flag given to a sampler that does not read it is refused, never recorded
# and ignored. --until_eot is every sampler's (one that cannot stop early cuts after the full draw).
FLAGS = dict(steps='steps', schedule='schedule', fixed_counts='fixed_counts', threshold='threshold',
             mdm_counts='counts', cache_trick='cache_trick', fused='speculation', temperature='temperature',
             top_p='top_p')


def choose_sampler(c, model, family):
    """The sampler that draws, a key of samplers.SAMPLERS: 'speculative' (--speculative), a confidence sampler
    (--order confidence, margin or entropy), else the model's family ('ao', 'mdm' or 'ar'). One line if the model
    cannot take it, or for the first flag given that it does not read."""
    if c.speculative and c.order in SCORES:
        die(f"--speculative needs an order fixed before the draws ({GRAMMAR}, or a file): --order {c.order} picks "
            f"the positions from the drawn values, so it would not be exact")
    sampler = 'speculative' if c.speculative else c.order if c.order in SCORES else family
    if not SAMPLERS[sampler].needs(model):
        die(f"--order {sampler}: {SAMPLERS[sampler].lacks}" if sampler in SCORES else SAMPLERS[sampler].lacks)
    flag_of = {setting: flag for flag, setting in FLAGS.items()}
    bad = unread(sampler, **{setting: getattr(c, flag) for flag, setting in FLAGS.items() if flag in c.given})
    if bad:
        die(f"--{flag_of[bad[0]]} is not used here: {bad[1]}; drop --{flag_of[bad[0]]}")
    return sampler


def generation_order(c, ck, family, n, sampler):
    """The order, parsed once: an orders.Order or a (n,) permutation; None for a confidence sampler, which picks
    the positions as it draws. auto: the order the model was trained on, when it was trained on one (a fixed
    order saved in the checkpoint, L2R, or an order distribution; a checkpoint's config in the old spelling read
    as its spec), else random."""
    o = c.order
    if sampler in SCORES:
        return None
    if o == 'auto':
        fixed = ck.get('order')
        try:
            law = order_of_config(ck.get('config'))
        except UserError:  # a record this version cannot read: sampled as random, as any unknown order was
            law = None
        o = L2R if family == 'ar' or (family == 'ao' and law is not None and law.is_l2r) else UNIFORM
        if family == 'ao' and law is not None and law.l2r_weight is None and not law.fixed:
            o = law
            print(f"order: the checkpoint's training order distribution, {o}")
        if fixed is not None and family == 'ao':
            o = order_for_length(torch.as_tensor(fixed).view(-1).tolist(), n, "the checkpoint's fixed order")
            print("order: the checkpoint's fixed training order")
    elif os.path.exists(o):
        o = read_order_file(o, n)
    elif os.sep in o or o.endswith(('.npy', '.txt')):  # meant as a file: say it is missing, not "unknown order"
        die(f"--order {o}: no such file (an order file is a .npy or text list of positions)")
    else:
        try:
            o = generate.check_order(o)  # a spec: its Order, parsed here once
        except ValueError as e:
            die(f"--order: {e}; or a file of positions")
    if isinstance(o, Order) and o.fixed:
        try:
            o = o.permutation(n)
        except ValueError as e:
            die(f"--order: {e}")
    if isinstance(o, Order) and one_block(o, n):
        print(f"note: {one_block(o, n)}")
    if sampler == 'mdm' and c.mdm_counts == 'independent' and (c.fixed_counts or not isinstance(o, Order) or
                                                             o.spec != 'random'):
        die("--mdm_counts independent draws a reveal time per position: no --fixed_counts or --order")
    return o


def gpt_order(c, ck, n, given):
    """A GPT's order (cond='none'): L2R, or for one trained on a fixed order (train.py --order=fixed:S) that order,
    saved in its checkpoint, as a (n,) permutation. A GPT is never told which position comes next, so it samples
    right only along the order it was trained on: any other --order, a shorter window and given tokens anywhere
    but at that order's first positions are refused."""
    saved = ck.get('order')
    if saved is None:
        if c.order not in ('auto', 'l2r'):
            die("a GPT (cond='none') generates left to right only: use --order l2r (or auto)")
        return L2R
    perm = torch.as_tensor(saved).view(-1)
    spec = spec_of_config(ck.get('config')) or 'its fixed order'
    why = f"this GPT (cond='none') was trained on the fixed order {spec} alone and is never told which position comes next"
    if c.order != 'auto':
        try:
            o = generate.check_order(c.order)
            same = o.fixed and torch.equal(o.permutation(perm.numel()), perm)
        except (ValueError, AttributeError):
            same = False
        if not same:
            die(f"--order {c.order}: {why}, so it samples along that order: use --order auto")
    if n != perm.numel():
        die(f"--length {n}: {why} over all {perm.numel()} positions, so it samples whole windows only: drop --length")
    g = int((given >= 0).sum())
    if g and set(perm[:g].tolist()) != set((given >= 0).nonzero().view(-1).tolist()):
        die(f"{why}: given tokens must sit at that order's first positions ({', '.join(map(str, perm[:min(g, 8)].tolist()))}"
            f"{', ...' if g > 8 else ''}), so it cannot continue this prompt: sample without one")
    print(f"order: the checkpoint's fixed training order ({spec}), along which this GPT decodes")
    return perm


def speculation(c):
    """The speculative sampler's settings: --speculative K (or auto) drafts, --fused, per-sample commits."""
    return Speculation(k='auto' if c.speculative == 'auto' else int(c.speculative), fused=c.fused,
                       trace=bool(c.trace))


def make_stepper(c, sampler, model, n, given):
    """The stepper `sampler` keeps for all batches, so that its graphs are captured once."""
    if sampler == 'mdm':
        return engine.EncoderStepper(model, c.batch_size, n, c.stepper)
    if sampler == 'speculative':
        return row_stepper(model, c.batch_size, c.stepper, n, speculation(c), int((given >= 0).sum()))
    return engine.SlotStepper(model, c.batch_size, c.stepper)


def draw_batch(c, sampler, model, n, given, order, s, stp):
    """One batch (tokens, stats) from `sampler` under the settings s (samplers.Sampling). The flags a sampler does
    not read were refused (choose_sampler), so those not passed here are at their defaults."""
    steps = None if c.threshold else c.steps  # a threshold replaces the counts (samplers.unread)
    if sampler == 'ao':
        return generate.generate_ao(model, n, c.batch_size, steps, s, order=order, given=given, stepper=stp)
    if sampler in SCORES:
        return generate.generate_confident(model, n, c.batch_size, steps, s, score=sampler, given=given, stepper=stp)
    if sampler == 'mdm':
        return generate.generate_mdm(model, n, c.batch_size, steps, s, order=order, given=given, stepper=stp,
                                     plan=EncoderPlan(c.mdm_counts, c.cache_trick))
    if sampler == 'ar':  # left to right, or a fixed-order GPT's own order (gpt_order); the prompt at its first positions
        first = torch.arange(n) if isinstance(order, Order) else order
        return generate.generate_ar(model, n, c.batch_size, s, prompt=given[first[:int((given >= 0).sum())]],
                                    order=order, stepper=stp)
    return generate_speculative(model, n, c.batch_size, s, speculation=speculation(c), order=order, given=given,
                                stepper=stp)


def document_end(c, codec, given, family, sampler):
    """The id that ends a document (EOT; a char codec's newline, as its data were prepared), or None where
    the codec has none (then --until_eot is refused). With --until_eot the given text must lie inside one
    document, and a sampler that does not stop early says that it cuts after the full draw."""
    from aogpt.errors import UserError
    from aogpt.evalsets import doc_end
    try:
        end = doc_end(codec)[0]
    except UserError:
        end = None
    if not c.until_eot:
        return end
    if end is None:
        die(f"--until_eot: this checkpoint's {codec.name} codec has no end-of-document symbol (no EOT, and no "
            f"newline among its {codec.vocab_size} characters); drop --until_eot")
    what = 'EOT' if codec.eot is not None else 'a newline, the char codec\'s end symbol'
    if bool((given == end).any()):
        die(f"--until_eot: the given text holds the end symbol ({what}) at token {int((given == end).nonzero()[0])}: "
            f"a sample is one document, so its prompt, template and suffix must lie inside one; remove it")
    if 'until' not in SAMPLERS[sampler].reads:
        print(f"note: --until_eot: {'the encoder MDM' if family == 'mdm' else f'--order {sampler}'} does not stop "
              f"early here: it draws the whole window, then each sample is cut at its first end symbol (no calls "
              f"saved)")
    return end


def documents(c, samples, given, end, stats):
    """Each sample's first document and the line that reports it, or None without --until_eot. An end
    symbol drawn into a blank before the last given token is inside the given text's document: it is
    reported, not cut (and without --until_eot reported all the same)."""
    n = samples.size(1)
    start = generate.doc_start(given, n)
    free_before = (given < 0) & (torch.arange(n) < start)
    in_blank = [] if end is None else ((samples == end) & free_before).any(1).nonzero().squeeze(1).tolist()
    if in_blank:
        print(f"note: {len(in_blank)} of {samples.size(0)} samples drew the end symbol into a blank, inside the "
              f"given text's document (samples {', '.join(map(str, in_blank[:8]))}{', ...' if len(in_blank) > 8 else ''}); "
              f"kept as drawn (docs/sampling.md, infilling)")
    if not c.until_eot:
        return None
    L = generate.doc_lengths(samples, end, start)
    ended = L < n
    ids = [row[:int(l)] for row, l in zip(samples.tolist(), L)]
    kept = [int(l) - int((given[:int(l)] >= 0).sum()) for l in L]        # generated tokens in the document
    gen, calls, N = stats['all_generated'], stats['all_calls'], samples.size(0)
    g = int((given >= 0).sum())
    full = sum(stats['all_full'])
    how = (f"in {sum(calls) / N:.1f} forward calls each, the full draw's {full / N:.1f} " +
           f"({1 - sum(calls) / full:.0%} saved); the batch stops when all its samples have"
           if 'calls_full' in stats else f"in {sum(calls) / N:.1f} forward calls each (speculative: its own "
           f"calls; a stopped sample leaves the rounds)" if stats['stopped'] else "the full draw, then cut")
    line = (f"documents (--until_eot): each kept {sum(kept) / N:.1f} generated tokens (min {min(kept)}, max "
            f"{max(kept)}) and generated {sum(gen) / N:.1f} of {n - g} before stopping, {how}; {int(ended.sum())}"
            f" of {N} ended with the end symbol, the rest ran to the window's end")
    return dict(line=line, ids=ids, judged=[d + [end] if e else d for d, e in zip(ids, ended.tolist())],
                end_symbol=end, start=start, lengths=L.tolist(), ended=ended.tolist(), kept=kept, generated=gen,
                forward_calls=calls, end_in_blank=in_blank)


def load_judge_for(c, codec, n):
    """The judge for --gen_ppl, checked against the samples' codec and their length n: (model, its codec, scoring
    mode)."""
    judge, judge_codec, is_hf = genppl.load_judge(c.gen_ppl, c.device, codec)
    if judge.config.vocab_size < judge_codec.vocab_size:
        die(f"judge {c.gen_ppl}: its {judge_codec.name} codec has {judge_codec.vocab_size} symbols, the model "
            f"only {judge.config.vocab_size}")
    if not judge.config.causal:
        die(f"judge {c.gen_ppl} is an encoder MDM, which has no exact likelihood to score text with: judge with a "
            f"decoder (a GPT, AO-GPT or sigma-GPT checkpoint, or a Hugging Face model folder)")
    if judge_codec.name == 'char':  # it must read every character the samples can hold
        lacking = sorted(set(codec.chars) - set(judge_codec.chars)) if codec.name == 'char' else None
        if lacking is None or lacking:
            die(f"judge {c.gen_ppl} reads {judge_codec.vocab_size} characters, " +
                (f"not {''.join(lacking)!r}, which the samples can hold" if lacking else
                 f"and the samples are {codec.name} text, which can hold any") +
                ": judge with a model whose codec covers the samples' (e.g. one trained on the same data)")
    mode = c.gen_ppl_mode if c.gen_ppl_mode != 'auto' else ('hf' if is_hf else 'none')
    if mode == 'hf' and not is_hf:
        die("--gen_ppl_mode hf is the HF GPT-2 recipe (no BOS); our checkpoints score from [None] (none)")
    if mode == 'hf' and n < 2:
        die(f"--gen_ppl: the HF judge scores each token after a sample's first, which is only context (mode hf), and "
            f"--length {n} leaves nothing to score: use --length 2 or more")
    if judge_codec.record() != codec.record():
        print(f"note: the judge reads {judge_codec.name}, the samples are {codec.name}: both perplexities are "
              f"computed on the re-tokenized text")
    return judge, judge_codec, mode


def draw(c, model, sampler, n, given, order, codec, until=None):
    """num_batches batches of batch_size samples: (tokens (N, n) on the CPU, the last batch's stats,
    wall seconds). One CPU generator drives every draw, so a seed fixes the samples on any device.
    until: the end symbol where the sampler stops a sample once its document is settled (-1 past it);
    stats then hold every batch's per-sample generated tokens and calls (all_generated, all_calls)."""
    from tqdm import tqdm
    samples, stats, gen_all, calls_all, full_all = [], None, [], [], []
    stops = until is not None and 'until' in SAMPLERS[sampler].reads
    # the options a sampler does not read were refused (choose_sampler), so they are at their defaults here
    settings = Sampling(temperature=c.temperature, top_p=c.top_p, vocab_size=codec.vocab_size,
                        generator=torch.Generator().manual_seed(c.seed), schedule=c.schedule,
                        fixed_counts=c.fixed_counts, threshold=c.threshold, until=until if stops else None)
    sync = torch.cuda.synchronize if c.device.startswith('cuda') else (lambda: None)
    sync()
    t0 = time.time()
    with c.ctx:
        stp = make_stepper(c, sampler, model, n, given)  # one stepper for all batches: its graphs are kept
        for _ in tqdm(range(c.num_batches), desc='batches', unit='batch', disable=c.num_batches == 1,
                      file=sys.stderr):
            x, stats = draw_batch(c, sampler, model, n, given, order, settings, stp)
            samples.append(x.cpu())
            gen_all += stats.get('generated', [stats['tokens_generated']] * c.batch_size)
            calls_all += stats.get('stop_call', [stats.get('calls_per_sample', stats['forward_calls'])] * c.batch_size)
            full_all += [stats.get('calls_full', 0)] * c.batch_size
    stats = dict(stats, all_generated=gen_all, all_calls=calls_all, all_full=full_all, stopped=stops)
    sync()
    return torch.cat(samples), stats, time.time() - t0


def score(c, judge, samples, codec, per_document=False):
    """Generative perplexity of the samples (N, n), or with per_document of the documents (id lists, each
    with its end symbol where it ended), under the judge (model, its codec, mode), both averages, with
    their unigram entropy."""
    judge_model, judge_codec, mode = judge
    try:
        r = genppl.generative_ppl(judge_model, judge_codec, samples, codec, mode, c.judge_batch_size,
                                  per_document=per_document)
    except ValueError as e:
        die(f"--gen_ppl: {e}")
    unit = 'document' if per_document else 'sample'
    left = (f" over the {len(samples) - len(r['unscored'])} {unit}s with a token to score ({len(r['unscored'])} of "
            f"one token, only context in mode hf, have no perplexity)" if r['unscored'] else "")
    print(f"gen ppl ({c.gen_ppl}, mode {mode}{', per document' if per_document else ''}): per-sequence mean "
          f"{r['per_sequence']:.3f}{left} (the paper's code, SEDD), token-weighted {r['token']:.3f} after re-tokenizing and cutting at the first end of "
          f"document (MDLM, DUO; {r['tokens_scored']} tokens, {r['ended_early']} samples ended early); "
          f"unigram entropy {r['unigram_entropy']:.3f} nats per sample")
    return dict(judge=c.gen_ppl, **r)


if __name__ == '__main__':
    stop_on_ctrl_c('nothing was saved')
    main()
