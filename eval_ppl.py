"""
Zero-shot perplexity of a checkpoint: exact L2R, the any-order bound, and the context-order ensemble.

    python eval_ppl.py --ensemble 8                          # out/ckpt.pt, EMA weights, the paper's 5 sets
    python eval_ppl.py --datasets ptb --max_chunks 20        # a quick look
    python eval_ppl.py --order semiar:8 --eval_orders 4      # + the bound under an order distribution
    python eval_ppl.py --datasets wikitext2 --data_path wikitext2=/data/wiki.test.raw
    torchrun --standalone --nproc_per_node 8 eval_ppl.py --ensemble 8

Every requested set is loaded before the first forward pass. One that cannot be had (offline and not in
the HF cache, with no --data_path) is skipped, with one line naming it (--skip_missing False fails
instead); PTB ships with the package, so the default command scores something even offline. The record
goes to eval_ppl.json beside the checkpoint (where exactly: checkpoint.record_path, eval_harness.py's rule
too), is appended to eval_ppl.jsonl (every run is kept), and is drawn as eval_ppl.png. It names what it scored: the weights by a hash (`weights`) and each set's token ids by
another (`datasets.<name>.data`), so two records compare only when both agree.

Columns (per-token NLL -> PPL = exp(mean NLL) over every token of every block_size chunk):
  L2R        exact likelihood in the identity order; n predictions per chunk, the first made from [None]
             (HF GPT-2 with labels=input makes n-1: it never predicts the first token).
  any-order  E_sigma[-sum_i log p(x_sigma_i | x_sigma_<i)] over uniform orders: an upper bound on the
             NLL (Jensen: -log E_sigma p(x|sigma) <= E_sigma -log p(x|sigma)), not a likelihood. For the
             encoder MDM it is its ELBO, which is the same quantity (paper eq. 5).
  order      (--order SPEC) the same expectation with sigma drawn from an order distribution
             (aogpt/orders.py: semiar:K, nearl2r:W, mix:...; --eval_orders draws per chunk): again an upper
             bound, on -log of the mixture over that distribution; L2R and uniform are its two ends.
  ens xM     paper eq. 7: each conditional is the mixture (1/M) sum_m p(x_j | context in order pi_m) over
             M orderings of the same context set. Each mixture is a normalised conditional, so the chain
             rule still gives a valid likelihood (of the mixture model) and its any-order average is again
             an upper bound; by Jensen it is never worse than the mean member. The table shows
             any-order - (mean member - ensemble), the gain measured on identical draws (a control
             variate: same expectation, much less noise); the JSON also has the direct estimate.

End of text (EOT; a char codec's newline) is scored as an ordinary token of the window in every set, never
skipped; how each set is read and cut into windows across its documents: aogpt/evalsets.py.

The estimators are aogpt/likelihood.py's; each returns a token-weighted sum (sum_nll, n_tokens), so DDP ranks
all-reduce sums and PPL = exp(sum_nll / n_tokens).
"""

import difflib
import math
import os
import sys
import time

import torch

from aogpt.checkpoint import check_record_path, fingerprint, load_model, record_path, save_record
from aogpt.configurator import namespace, print_config, stop_on_ctrl_c
from aogpt.errors import UserError, command, die
from aogpt.evalsets import EVAL_SETS, chunks_fingerprint, load_eval_chunks, parse_paths, parse_revisions
from aogpt.likelihood import MAX_DRAWS, nll_any_order, nll_ensemble, nll_fixed, nll_l2r, nll_order
from aogpt.orders import one_block, order_of_config, parse_order
from aogpt.plot import plot_eval
from aogpt.runtime import autocast, script_device, start_ranks

# ----------------------------------------------------------------------------------------------- CLI defaults
out_dir = 'out'          # checkpoint directory (evaluates out_dir/ckpt.pt)
ckpt = ''                # checkpoint file or dir, export.py folder, or hf:owner/repo[/path.pt]; overrides out_dir
use_ema: bool = None     # None: EMA weights when the checkpoint has them; True/False to force
dataset = ''             # a data dir or name to check the codec against ('' = the checkpoint's own codec)
datasets = 'lambada,wikitext2,ptb,wikitext103,lm1b'  # comma list; also ag_news,pubmed,arxiv,owt
data_path = ''           # local-file overrides, e.g. 'wikitext2=/data/wiki.test.raw,lambada=/data/l.jsonl'
skip_missing = True      # skip a set that cannot be loaded (offline, not cached), with a line; False: fail
split = ''               # '' = each set's default split (see evalsets.py)
revisions = ''           # HF hub revision per set instead of evalsets' pins, e.g. 'lambada=<commit>,lm1b=main'
paper_split = False      # True: the paper's WikiText-2 *train* split (inherited from RADD), to match its tables
block_size = 0           # chunk length, >= 1; 0 = the model's block_size
max_chunks = 0           # evaluate only the first max_chunks chunks of each set, >= 1 (0 = all)
batch_size = 8           # sequences of length block_size per forward pass
eval_orders = 1          # orders drawn per chunk for the any-order and order columns (MC draws for the encoder MDM)
order = ''               # an order distribution (semiar:K, nearl2r:W, mix:..., see aogpt/orders.py): its column
ensemble = 0             # M, context orderings per conditional for the ensemble column (0 = no column)
ensemble_mode = 'fast'   # 'fast': M passes per Monte Carlo draw | 'exact': the paper's n*M passes per chunk
ensemble_draws = 1       # Monte Carlo draws (reveal counts) per chunk for ensemble_mode='fast'
mdm_l2r = False          # encoder MDM: also compute exact L2R (n forward passes per chunk: slow)
seed = 1337              # orders and reveal counts come from this seed (plus the DDP rank)
device = 'auto'          # auto (cuda if available, else cpu) | cpu | cuda | cuda:N
dtype = 'auto'           # auto (bf16 autocast on CUDA, fp16 without bf16, fp32 elsewhere); float32 | bfloat16 | float16
compile = False          # torch.compile the model
json_out = ''            # results file; '' = eval_ppl.json beside the checkpoint (+ every run in eval_ppl.jsonl)
plot = True              # also draw the table as a PNG next to the JSON
progress = True          # tqdm bars (rank 0 only)


# ----------------------------------------------------------------------------------------------- DDP

def rank_slice(n_chunks, rank, world_size):
    """The contiguous shard of chunks that DDP rank `rank` evaluates: every chunk goes to exactly one
    rank (no DistributedSampler-style padding, which would count some chunks twice)."""
    return slice(n_chunks * rank // world_size, n_chunks * (rank + 1) // world_size)


@command
def main(argv=None):
    c = read_config(argv)
    rank, world, dev = start_ranks(c.device)
    master = rank == 0
    if master:
        print_config(c.config)
    quiet_hf_bars(master and c.progress)
    model, ck, used_ema, codec, n = load_for_eval(c, dev)
    if master and c.law and one_block(c.law, n):
        print(f"note: {one_block(c.law, n)}")
    data, skipped = load_sets(c, codec, n, master)
    ctx, precision = autocast(dev, c.dtype)
    results = {name: evaluate_set(model, name, chunks, c, ctx, rank, world, codec.name == 'char')
               for name, chunks in data.items()}
    if master:
        print_table(model, c, results, skipped, used_ema, codec, n, world)
        record = dict(checkpoint=c.ckpt or c.out_dir, model=_kind(model, c.own), ema=used_ema, codec=codec.name,
                      block_size=n, precision=precision, world_size=world, seed=c.seed,
                      eval_orders=c.eval_orders, order=c.order if model.any_order else c.own[0] if c.own else '',
                      ensemble=c.ensemble if model.any_order else 0, ensemble_mode=c.ensemble_mode,
                      ensemble_draws=c.ensemble_draws, paper_split=c.paper_split, max_chunks=c.max_chunks,
                      iter_num=ck.get('iter_num'), weights=fingerprint(model), datasets=results, skipped=skipped,
                      notes=_notes(model, c, results),
                      time=time.strftime('%Y-%m-%d %H:%M:%S'))
        write_record(record, c)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def moved_line(old):
    """The line for this command's old flags ({flag: value}): --order_mode is --order, --orders is --eval_orders."""
    said = []
    if 'order_mode' in old:
        said.append(f"--order_mode is now --order (the order distribution): use --order {old['order_mode']}")
    if 'orders' in old:
        said.append(f"--orders (a count) is now --eval_orders, the orders drawn per chunk: use --eval_orders "
                    f"{old['orders']}; --order names the order distribution")
    return '; '.join(said)


def read_config(argv):
    """The resolved config (a namespace: main() may run more than once in one process), checked."""
    c = namespace(globals(), argv, moved=(('order_mode', 'orders'), moved_line))
    for key, ok in (('eval_orders', c.eval_orders >= 1), ('ensemble', c.ensemble >= 0), ('batch_size', c.batch_size >= 1),
                    ('ensemble_draws', c.ensemble_draws >= 1), ('block_size', c.block_size >= 0),
                    ('max_chunks', c.max_chunks >= 0), ('ensemble_mode', c.ensemble_mode in ('fast', 'exact'))):
        if not ok:
            die(f"invalid --{key}={getattr(c, key)!r} (see --help for the valid values)")
    if c.ensemble > MAX_DRAWS:
        die(f"--ensemble must be from 0 to {MAX_DRAWS} orderings (each is a forward pass per draw), got {c.ensemble}")
    c.law = None  # the parsed --order, once
    if str(c.order).isdigit():  # the old --orders was this count: never read a number as a distribution
        die(f"--order names the order distribution (e.g. semiar:{c.order}); the orders drawn per chunk are "
            f"--eval_orders {c.order}")
    if c.order:
        try:
            c.law = parse_order(c.order)
        except UserError as e:
            die(f"--order: {e.msg}")
    for key in ('ensemble_mode', 'ensemble_draws'):  # given on purpose, never silently unused
        if key in c.given and not c.ensemble:
            die(f"--{key} is an option of the ensemble column: add --ensemble M (M >= 1), or drop --{key}")
    c.names = [s.strip() for s in c.datasets.split(',') if s.strip()]
    if not c.names:
        die("--datasets is empty")
    unknown = [n for n in c.names if n not in EVAL_SETS]
    if unknown:  # a typo is never "skipped": --skip_missing is for sets that cannot be had here
        near = difflib.get_close_matches(unknown[0], EVAL_SETS, n=1)
        die(f"unknown eval set {unknown[0]!r}" + (f" (did you mean {near[0]!r}?)" if near else "") +
            f"; choose from {', '.join(EVAL_SETS)}")
    c.paths = parse_paths(c.data_path)
    unused = sorted(set(c.paths) - set(c.names))
    if unused:
        die(f"--data_path names {unused} are not in --datasets {c.names}")
    c.sources = {}
    c.revision_of = parse_revisions(c.revisions)
    extra = sorted(set(c.revision_of) - set(c.names))
    if extra:
        die(f"--revisions names {extra}, which are not in --datasets {c.names}")
    c.device = script_device(c.device, c.dtype)[0]  # a device this machine lacks, or a bad --dtype: one line
    check_record_path(c.json_out, c.ckpt or c.out_dir, 'eval_ppl', 'json_out')  # not hours later
    return c


def quiet_hf_bars(show):
    if not show:  # HF datasets' own bars too (e.g. reading a local text file)
        os.environ['HF_DATASETS_DISABLE_PROGRESS_BARS'] = '1'
        if 'datasets' in sys.modules:
            sys.modules['datasets'].disable_progress_bars()


def load_for_eval(c, dev):
    """The model (EMA weights by default), its checkpoint dict, whether EMA was used, its codec, the
    chunk length."""
    model, ck, used_ema, codec = load_model(c.ckpt or c.out_dir, dev, c.use_ema, dataset=c.dataset)
    cfg = model.config
    if c.mdm_l2r and cfg.causal:
        die("--mdm_l2r computes an encoder MDM's L2R column; this decoder's L2R column is exact anyway: drop it")
    n = c.block_size or cfg.block_size
    if n > cfg.block_size:
        die(f"--block_size {n} exceeds the model's block_size {cfg.block_size}")
    c.own = own_order(c, model, ck, n)
    if c.compile:
        model = torch.compile(model)
    return model, ck, used_ema, codec, n


def own_order(c, model, ck, n):
    """(spec, permutation (n,)) for a GPT (cond='none') trained on one fixed order (train.py --order=fixed:S): it is
    never told which position comes next, so its exact likelihood is along that order, its own, never L2R. None
    for any other model."""
    if not (model.config.causal and not model.any_order and ck.get('order') is not None):
        return None
    saved = torch.as_tensor(ck['order']).view(-1)
    try:
        spec = order_of_config(ck.get('config')).spec
    except (UserError, AttributeError):
        spec = 'its fixed order'
    if n != saved.numel():
        die(f"this GPT was trained on one fixed order of all {saved.numel()} positions ({spec}), so it scores whole "
            f"windows of {saved.numel()} tokens only: drop --block_size")
    if c.law is not None and not (c.law.fixed and torch.equal(c.law.permutation(n), saved)):
        die(f"--order {c.law}: this GPT (cond='none') was trained on the fixed order {spec} alone and is never told "
            f"which position comes next, so it is scored exactly in that order: drop --order")
    return spec, saved


def load_sets(c, codec, n, master):
    """Every requested set, cut into chunks, before the first forward pass: a set that cannot be had
    fails (or is skipped) in seconds, not after the others were evaluated. Returns ({name: chunks},
    {skipped name: why})."""
    data, skipped = {}, {}
    for name in c.names:
        c.sources[name] = {}  # what the set was read from (hub repo and commit, or a local path), for the JSON
        try:
            chunks = load_eval_chunks(name, codec, n, split=c.split or None, path=c.paths.get(name),
                                      paper_split=c.paper_split, revision=c.revision_of.get(name),
                                      record=c.sources[name])
        except UserError as e:
            if not c.skip_missing or name in c.paths:  # a local file the user named must load
                die(f"{e.msg} [eval_ppl.py: --data_path {name}=PATH]")
            skipped[name] = e.msg  # the real reason: offline is only one of them
            continue
        data[name] = chunks[:c.max_chunks] if c.max_chunks else chunks
        if len(data[name]) == 0:
            die(f"{name}: fewer than block_size={n} tokens, so no chunk to evaluate (try a smaller --block_size)")
    if skipped and not data:
        die(f"none of the requested sets could be loaded ({', '.join(skipped)}): " +
            '; '.join(f"{name}: {msg}" for name, msg in skipped.items()))
    if skipped and master:  # each with its real reason: offline is only one of them
        print(f"skipping {', '.join(skipped)} (--skip_missing False fails instead):", flush=True)
        for name, msg in skipped.items():
            print(f"  {name}: {msg}", flush=True)
    return data, skipped


def evaluate_set(model, name, chunks, c, ctx, rank, world, char):
    """One table row: the columns this model has, token-weighted over every chunk of every rank."""
    from tqdm import tqdm
    cfg = model.config
    decoder, any_order = cfg.causal, model.any_order
    do_l2r, do_ao, M = (decoder or c.mdm_l2r) and not c.own, any_order or not decoder, c.ensemble if any_order else 0
    spec = c.law if any_order else None  # a fixed-order GPT's own order (c.own) is scored exactly instead
    if len(chunks) < world and rank == 0:
        print(f"warning: {name} has {len(chunks)} chunks for {world} ranks; some ranks get none")
    mine = chunks[rank_slice(len(chunks), rank, world)]
    cols = [k for k, on in (('l2r', do_l2r), ('any_order', do_ao), ('order', spec is not None or bool(c.own)),
                            ('ensemble', M > 0)) if on]
    # On a terminal the bar is wiped when done; elsewhere (a log, a pipe) it ends its line, so that what follows,
    # an error above all, starts a line of its own. Closed on the way out of an exception too.
    bar = tqdm(total=len(mine) * len(cols), desc=name, unit='chunk', leave=not sys.stderr.isatty(),
               disable=not (rank == 0 and c.progress), file=sys.stderr)
    # one generator per column, seeded by (seed, rank): adding a column never changes another's draws
    gen = lambda: torch.Generator().manual_seed(c.seed + 100_003 * rank)  # noqa: E731
    sums = {}
    with ctx, bar:
        if do_l2r:
            bar.set_description(f"{name} L2R")
            sums['l2r'] = nll_l2r(model, mine, c.batch_size, bar)
        if do_ao:
            bar.set_description(f"{name} any-order")
            sums['any_order'] = nll_any_order(model, mine, c.eval_orders, gen(), c.batch_size, bar)
        if spec is not None:
            bar.set_description(f"{name} {spec}")
            sums['order'] = nll_order(model, mine, spec, c.eval_orders, gen(), c.batch_size, bar)
        if c.own:
            bar.set_description(f"{name} {c.own[0]}")
            sums['order'] = nll_fixed(model, mine, c.own[1], c.batch_size, bar)
        if M:
            bar.set_description(f"{name} ens x{M}")
            # the ensemble's sums, plus the mean member on the *same* draws: a paired, low-noise
            # measure of what ensembling gains
            ens, member = nll_ensemble(model, mine, M, c.ensemble_mode, gen(), c.ensemble_draws, c.batch_size, bar)
            sums['ensemble'] = (ens.sum().item(), mine.numel())
            sums['member'] = (member.sum().item(), mine.numel())
    keys = cols + (['member'] if M else [])
    t = torch.tensor([v for k in keys for v in sums.get(k, (0.0, 0))], dtype=torch.float64,
                     device=next(model.parameters()).device)
    if world > 1:
        torch.distributed.all_reduce(t)
    mean = {k: t[2 * i].item() / t[2 * i + 1].item() for i, k in enumerate(keys)}
    row = {'chunks': len(chunks), 'tokens': chunks.numel(), 'source': c.sources.get(name),
           'data': chunks_fingerprint(chunks)}
    for k in ('l2r', 'any_order', 'order', 'ensemble'):
        row[k] = {'nll': mean[k], 'ppl': math.exp(mean[k])} if k in cols and k != 'ensemble' else None
    if spec is not None:
        row['order']['spec'] = spec.spec
    if c.own:  # exact: the one order this GPT was trained on
        row['order'].update(spec=c.own[0], exact=True)
    if M:
        # Reported as a control variate: the any-order column (full orders, low noise) minus the
        # ensemble's gain measured on identical draws. Same expectation as the direct estimate
        # (E[any-order] = E[mean member]), far less Monte Carlo noise, and never above the any-order
        # column (Jensen holds per target on the same draws). The direct one is kept too.
        cv = mean['any_order'] - (mean['member'] - mean['ensemble'])
        row['ensemble'] = {'nll': cv, 'ppl': math.exp(cv), 'members': M, 'mode': c.ensemble_mode,
                           'draws': c.ensemble_draws, 'nll_direct': mean['ensemble'],
                           'mean_member_nll': mean['member'], 'gain_nats': mean['member'] - mean['ensemble']}
    if char:  # one token is one character
        for k in cols:
            row[k]['bpc'] = row[k]['nll'] / math.log(2)
    return row


def _kind(model, own=None):
    c = model.config
    if not c.causal:
        return 'encoder MDM'
    return {'adaln': 'AO-GPT', 'sigma': 'sigma-GPT', 'none': f"GPT ({own[0] if own else 'L2R'})"}[c.cond]


def _columns(model, c, char):
    """(header, result key, show as bits per character) of each table column."""
    ao_head = 'ELBO PPL (<=)' if not model.config.causal else f"any-order PPL (<=, {c.eval_orders} ord)"
    heads = [('L2R PPL', 'l2r', False), (ao_head, 'any_order', False)]
    if c.law and model.any_order:
        heads.append((f"{c.law} PPL (<=)", 'order', False))
    if c.own:
        heads.append((f"{c.own[0]} PPL (exact)", 'order', False))
    if c.ensemble:
        heads.append((f"ens x{c.ensemble} PPL (<=)", 'ensemble', False))
    if char:
        heads += [(h.replace('PPL', 'bpc'), k, True) for h, k, _ in heads]
    return heads


def _fmt(col, bpc=False):
    if col is None:
        return 'n/a'
    return f"{col['bpc']:.4f}" if bpc else f"{col['ppl']:.2f}"


def _notes(model, c, results):
    notes = []
    if not model.config.causal:
        notes.append("encoder MDM: the any-order column is its ELBO; ensemble n/a (an encoder is order-invariant)"
                     + ("" if c.mdm_l2r else "; L2R costs n passes per chunk: --mdm_l2r True computes it"))
    elif c.own:
        notes.append(f"GPT trained on the fixed order {c.own[0]}: its exact likelihood is along that order, its own "
                     f"(the {c.own[0]} column); L2R would read it in an order it never saw, so it is not computed")
    elif not model.any_order:
        notes.append("L2R GPT: only the L2R column is meaningful (no target-position conditioning)")
    if c.law and not model.any_order and not c.own:
        notes.append(f"--order {c.law}: not scored, the model cannot condition on an order")
    if 'wikitext2' in results:  # a skipped set has no numbers to explain
        notes.append("wikitext2: " + ("the paper's train split (--paper_split True)" if c.paper_split else
                                      "standard split; the paper's tables use the train split (--paper_split True)"))
    return notes


def print_table(model, c, results, skipped, used_ema, codec, n, world):
    print(f"\n{_kind(model, c.own)} {c.ckpt or c.out_dir} ({'EMA' if used_ema else 'raw'} weights), {codec.name} codec, "
          f"block_size {n}, {world} rank(s)")
    heads = _columns(model, c, codec.name == 'char')
    w = max(8, max(len(s) for s in c.names))
    print(f"{'dataset':<{w}} {'chunks':>7} " + ' '.join(f"{h:>{max(10, len(h))}}" for h, _, _ in heads))
    for name, row in results.items():
        print(f"{name:<{w}} {row['chunks']:>7} " +
              ' '.join(f"{_fmt(row[k], b):>{max(10, len(h))}}" for h, k, b in heads))
    for name in skipped:
        print(f"{name:<{w}} {'skipped':>7}")
    for s in _notes(model, c, results):
        print(f"note: {s}")


def json_path(c):
    """Where the record goes: checkpoint.record_path's rule, shared with eval_harness.py."""
    return record_path(c.json_out, c.ckpt or c.out_dir, 'eval_ppl')


def write_record(record, c):
    """The record as JSON (atomically), appended to the .jsonl history beside it (so an eval of other sets
    never loses an earlier one), and plotted."""
    out = json_path(c)
    record['checkpoint'] = os.path.abspath(record['checkpoint']) if os.path.exists(record['checkpoint']) \
        else record['checkpoint']
    try:
        history = save_record(out, record)
    except OSError as e:
        die(f"cannot write {e.filename or out} ({e.strerror or e}); the table above has the numbers; pass --json_out FILE")
    print(f"wrote {out} (history: {history})")
    if c.plot and record['datasets']:
        png = os.path.splitext(out)[0] + '.png'
        plot_eval(record, png)
        print(f"wrote {png}")


if __name__ == '__main__':
    stop_on_ctrl_c('no results were written (eval_ppl.json and its history are as they were)')
    main()
