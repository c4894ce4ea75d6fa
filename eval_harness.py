"""
Downstream tasks with EleutherAI's lm-evaluation-harness (lm-eval): an LM class registered as 'aogpt'
and a launcher in the house style.

    python eval_harness.py --tasks hellaswag,piqa,arc_easy,lambada_openai --ckpt out
    python eval_harness.py --tasks lambada_openai --ckpt out --likelihood orders:8
    python eval_harness.py --tasks mytask --include_path tasks/ --ckpt hf:owner/repo --limit 100

Estimators of log p(continuation | context) (--likelihood; the JSON records which one ran):
  l2r        exact, left to right, ONE pass per request (batched, sorted by length); is_greedy from the
             same pass. Comparable with GPT-2's numbers from the harness's own hf class.
  orders:K   the context left to right, then the continuation in K random orders (seeded by the context's
             tokens, so every choice of a multiple-choice question gets the same random numbers). Two
             numbers per request: the mean of the K chain-rule sums (the any-order bound, what MDM papers
             report as their ELBO) and their log-mean-exp (importance-weighted, tighter). The harness
             scores one of them (--orders_score, default mean); the launcher then rescores with the other
             from a memo (no second forward pass) and writes both. is_greedy comes from an L2R pass.
  ensemble:M the paper's context-order ensemble (eq. 7) on the continuation: each continuation token, left
             to right, is scored by the mean probability over M orderings of the context (member 0 = L2R,
             the others seeded by the context). M passes per request; an exact likelihood of the ensemble.
  encoder MDM (causal=False): its ELBO, --mc masks per request over the continuation only (the context
             is never masked), reveal counts stratified, seeded by the context; is_greedy from one pass
             with the whole continuation masked. This is what the MDM repos (LLaDA, SMDM) plug in.
The orders, context orderings and masks are drawn by aogpt/likelihood.py (continuation_orders,
context_orderings, stratified_counts and uniform_subsets), from what eval_ppl.py's estimators draw with.
loglikelihood_rolling (perplexity tasks) is exact L2R for a decoder (the ELBO for an encoder), over the
harness's own rolling windows (natively: eval_ppl.py's chunks, the last partial one with left context).
generate_until is L2R KV-cache decoding (generate.generate_ar), greedy
unless the task asks for sampling.

Where the sequence starts (--bos; docs/downstream.md has the details):
  none  (default) every window starts with the model's learned [None] slot, so the first token is
        scored; a window holds block_size tokens. Rolling windows are then eval_ppl.py's chunks.
  hf    what lm-eval's hf class does with a GPT-2: no start token unless the context is empty (then
        <|endoftext|>), windows of block_size+1 tokens. Only for a GPT-2 loaded from Hugging Face
        (aogpt.families.load_hf), whose [None] is <|endoftext|>; it reproduces the hf class exactly.

Results: the harness's table on the console, and a JSON (harness.json beside the checkpoint, or --out; where
exactly is checkpoint.record_path, eval_ppl.py's rule too), also appended to harness.jsonl beside it, where every
run is kept.
The lm_eval CLI can use the class too, once this module is imported:
    python -c "import eval_harness; from lm_eval.__main__ import cli_evaluate; cli_evaluate()" \\
        --model aogpt --model_args ckpt=out,likelihood=orders:4 --tasks piqa
"""

import hashlib
import json
import math
import os
import time

import torch
from torch.nn import functional as F

from aogpt.configurator import namespace, print_config, stop_on_ctrl_c
from aogpt.errors import UserError, command, die, first_line
from aogpt.likelihood import (MAX_DRAWS, context_orderings, continuation_orders, mixture_nll, stratified_counts,
                              uniform_subsets)
from aogpt.runtime import autocast, resolve_device, script_device, start_ranks

# ----------------------------------------------------------------------------------------------- CLI defaults
tasks = ''               # comma list of harness task (or group) names
out_dir = 'out'          # checkpoint directory (evaluates out_dir/ckpt.pt)
ckpt = ''                # checkpoint file or dir, export.py folder, or hf:owner/repo[/path.pt]; overrides out_dir
use_ema: bool = None     # None: EMA weights when the checkpoint has them; True/False to force
dataset = ''             # a data dir or name whose codec to use ('' = the checkpoint's own codec)
likelihood = 'l2r'       # l2r | orders:K (K random continuation orders) | ensemble:M (M context orderings)
orders_score = 'mean'    # orders:K: what the harness scores first: 'mean' (any-order bound) | 'lme' (log-mean-exp)
mc = 128                 # encoder MDM: Monte-Carlo masks per loglikelihood request (its ELBO)
bos = 'none'             # 'none': [None] starts every window | 'hf': lm-eval's hf class convention (HF GPT-2)
include_path = ''        # a folder of local task YAMLs (how to run tasks offline)
builtin_tasks = True     # index the harness's own ~15k task YAMLs too (False: only --include_path, seconds faster)
limit = 0                # evaluate only the first `limit` docs of each task (0 = all)
num_fewshot: int = None  # None: each task's default
batch_size = 16          # rows per forward pass
max_gen_toks = 256       # generate_until's default when a task does not say
seed = 1234              # orders, MC masks and sampling; also the harness's own seeds
bootstrap_iters = 100000  # the harness's stderr bootstrap (0 = none)
log_samples = False      # keep every request's inputs and outputs in the JSON
device = 'auto'          # auto (cuda if available, else cpu) | cpu | cuda | cuda:N
dtype = 'auto'           # auto (bf16 autocast on CUDA, fp32 elsewhere) | float32 | bfloat16 | float16
out = ''                 # results JSON; '' = harness.json beside the checkpoint

NONE = -1                # token id of the [None] slot (model.forward_slots' convention)
GEN_CHUNK = 32           # generate_until checks its stop strings every GEN_CHUNK tokens

try:  # the registry decorator, when lm-eval is installed; without it the module still imports (for --help)
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ImportError:  # pragma: no cover
    TemplateLM, register_model = object, (lambda *names: (lambda cls: cls))


def parse_likelihood(spec):
    """'l2r' -> ('l2r', 0); 'orders:K' -> ('orders', K); 'ensemble:M' -> ('ensemble', M), K and M in
    [1, MAX_DRAWS]. A ValueError names the valid forms."""
    kind, _, k = str(spec).partition(':')
    if kind == 'l2r' and not k:
        return 'l2r', 0
    if kind in ('orders', 'ensemble') and k.isascii() and k.isdigit() and len(k) < 19 and 1 <= int(k) <= MAX_DRAWS:
        return kind, int(k)
    raise ValueError(f"--likelihood must be l2r, orders:K or ensemble:M with K, M from 1 to {MAX_DRAWS} (each is a "
                     f"forward pass per request), got {str(spec)[:60]!r}")


def context_seed(seed, tokens):
    """A generator seed from the run's seed and a token list: stable across processes and runs (Python's
    hash() is salted), so every choice of one question, and every rank, draws the same numbers."""
    h = hashlib.sha256(f"{seed}:{','.join(map(str, tokens))}".encode()).digest()
    return int.from_bytes(h[:8], 'little') & ((1 << 63) - 1)


# ----------------------------------------------------------------------------------------------- the LM class

@register_model('aogpt')
class AOGPTLM(TemplateLM):
    """lm-eval's interface over an aogpt checkpoint (or a GPT model object, with its codec)."""

    def __init__(self, ckpt='', model=None, codec=None, likelihood='l2r', orders_score='mean', mc=128,
                 bos='none', batch_size=16, max_gen_toks=256, device='cpu', dtype='auto', use_ema=None,
                 dataset='', seed=1234, max_batch_size=None):
        # max_batch_size: the lm_eval CLI passes it to every model; a fixed batch_size is used instead
        super().__init__()
        self.estimator, self.K = parse_likelihood(likelihood)
        if orders_score not in ('mean', 'lme'):
            raise ValueError(f"orders_score must be 'mean' or 'lme', got {orders_score!r}")
        if bos not in ('none', 'hf'):
            raise ValueError(f"bos must be 'none' or 'hf', got {bos!r}")
        dev = resolve_device(device or 'auto')
        self.ckpt, self.used_ema, self.iter_num = ckpt, None, None
        if model is None:
            from aogpt.checkpoint import load_model
            model, ck, self.used_ema, codec = load_model(ckpt, dev, use_ema, dataset=dataset)
            self.iter_num = ck.get('iter_num')
        elif codec is None:
            from aogpt.tokenizer import gpt2_codec
            codec = gpt2_codec()
        self.model, self.codec = model.to(dev).eval(), codec
        cfg = model.config
        if codec.vocab_size > cfg.vocab_size:  # a model object and codec passed in (load_model checked its own)
            raise ValueError(f"the {codec.name} codec has {codec.vocab_size} symbols but the model only "
                             f"{cfg.vocab_size}")
        if bos == 'hf' and not (cfg.causal and cfg.cond == 'none' and self.estimator == 'l2r'):
            raise ValueError("bos=hf reproduces lm-eval's hf class for a GPT-2 (cond='none') and l2r only")
        if self.estimator != 'l2r' and cfg.causal and not model.any_order:
            raise ValueError(f"{likelihood} needs an any-order model (cond adaln or sigma); this one is L2R only")
        self.encoder = not cfg.causal
        self.hf, self.orders_score, self.mc, self.seed = bos == 'hf', orders_score, int(mc), int(seed)
        if not 1 <= self.mc <= MAX_DRAWS:
            raise ValueError(f"mc must be from 1 to {MAX_DRAWS} masks (each is a forward pass per request), got {mc}")
        self._batch = int(batch_size) if str(batch_size).isdigit() else 16  # the harness may pass 'auto'
        self._max_gen_toks = int(max_gen_toks)
        self._device = torch.device(dev)
        self.autocast, self.precision = autocast(dev, dtype)
        self.memo = {}           # estimator -> (context ids, continuation ids) -> every number computed
        self.gen_memo = {}       # (context, generation kwargs) -> text, so a rescoring pass decodes nothing
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self._rank, self._world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()

    # ------------------------------------------------------------------ what the harness asks of a TemplateLM
    @property
    def eot_token_id(self):
        return self.codec.eot

    @property
    def prefix_token_id(self):
        # what an empty context becomes: [None] natively (a sentinel no real token equals), HF's EOT in hf mode
        return self.codec.eot if self.hf else NONE

    @property
    def max_length(self):
        """Tokens a window may hold: block_size after [None]; with bos=hf, block_size+1 token slots (the
        first real token takes [None]'s position 0), i.e. GPT-2's n_positions, as the hf class uses."""
        return self.model.config.block_size + (1 if self.hf else 0)

    @property
    def device(self):
        return self._device

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        try:
            return list(self.codec.encode(string))
        except UserError as e:  # a char-level checkpoint meeting a character it does not have
            raise UserError(f"{e.msg}: this checkpoint's codec cannot encode the task's text")

    def tok_decode(self, tokens):
        return self.codec.decode(tokens)

    # ------------------------------------------------------------------ DDP plumbing the evaluator calls
    def all_gather(self, tensor):
        out = [torch.zeros_like(tensor) for _ in range(self.world_size)]
        torch.distributed.all_gather(out, tensor)
        return torch.stack(out)

    def gather_object(self, obj, dst=0):
        out = [None] * self.world_size if self.rank == dst else None
        torch.distributed.gather_object(obj, out, dst=dst)
        return out

    def barrier(self):
        torch.distributed.barrier()

    # ------------------------------------------------------------------ loglikelihood
    def _window(self, ctx, cont):
        """The tokens one pass sees: context (the [None] sentinel dropped) + continuation, cut from the left
        to what fits: natively max_length = block_size tokens after [None]; with bos=hf the hf class's
        max_length + 1 (the last one only a target)."""
        if len(cont) > self.max_length:
            raise ValueError(f"a continuation of {len(cont)} tokens does not fit the model's {self.max_length}")
        seq = [t for t in ctx if t != NONE] + list(cont)
        return seq[-(self.max_length + (1 if self.hf else 0)):]

    def _loglikelihood_tokens(self, requests, disable_tqdm=False):
        """requests: ((context, continuation) strings, context ids, continuation ids) -> (log p, is_greedy)."""
        keys = [(tuple(c), tuple(x)) for _, c, x in requests]
        memo = self.memo.setdefault(self.estimator, {})
        todo = [k for k in dict.fromkeys(keys) if k not in memo]  # repeated requests are scored once
        with torch.no_grad(), self.autocast:
            if self.encoder:
                self._score_encoder(todo, memo)
            else:
                self._score_decoder(todo, memo)
        out = [self._answer(memo[k]) for k in keys]
        if not all(math.isfinite(ll) for ll, _ in out):  # a NaN is never ranked (NaN scored acc = acc_norm = 1.0)
            raise UserError("the model's log-likelihoods are NaN or inf (non-finite logits: an overflow in float16, "
                            "or non-finite weights); no accuracy is computed from them (try --dtype float32)")
        return out

    def _answer(self, m):
        if self.estimator == 'orders' and not self.encoder:
            return m['orders_' + self.orders_score], m['greedy']
        return m['ll'], m['greedy']

    def _score_decoder(self, todo, memo):
        rows = []  # (key, slot tokens, slot positions, slot targets, target ids, scored tail, order index)
        for key in todo:
            ctx, cont = key
            w = self._window(ctx, cont)
            n, L = len(w), len(cont)
            if self.hf:  # the first token sits in [None]'s slot (position 0), as GPT-2 sees it in HF
                rows.append((key, w[:-1], list(range(-1, n - 2)), list(range(n - 1)), w[1:], L, -1))
                continue
            orders = [list(range(n))]  # the L2R pass: exact log-likelihood and the greedy check
            g = torch.Generator().manual_seed(context_seed(self.seed, ctx))
            if self.estimator == 'orders':  # the continuation in K seeded orders after the L2R context
                orders += continuation_orders(self.K, n - L, n, g).tolist()
            if self.estimator == 'ensemble':  # member 0 is the L2R pass; M-1 seeded orderings of the context
                orders += context_orderings(self.K, n - L, n, g)[1:].tolist()
            for j, o in enumerate(orders):
                y = [w[i] for i in o]
                rows.append((key, [NONE] + y[:-1], [NONE] + o[:-1], o, y, L, j - 1))
        out = self._run_slots(rows)
        for key in todo:
            l2r = out[(key, -1)]
            m = dict(ll=l2r[0], greedy=l2r[1], l2r=l2r[0])
            if self.estimator == 'orders':
                s = torch.tensor([out[(key, j)][0] for j in range(self.K)], dtype=torch.float64)
                m.update(ll=s.mean().item(), orders_mean=s.mean().item(), orders_lme=-mixture_nll(-s).item(),
                         orders=s.tolist())
            if self.estimator == 'ensemble':  # likelihood.context_orderings: an exact log-likelihood of the ensemble
                lp = torch.stack([out[(key, j)][2] for j in range(-1, self.K - 1)])       # (M, L)
                ens = -mixture_nll(-lp).sum().item()
                m.update(ll=ens, ensemble=ens)
            memo[key] = m

    def _run_slots(self, rows):
        """Every row's sum of log p over its last L slots, and whether each of them was the argmax. Rows are
        sorted longest first (the hf class's order: padding is small, memory peaks at once) and right-padded:
        the slot pass is causal, so padding after a row never changes it."""
        model, dev = self.model, self.device
        rows = sorted(rows, key=lambda r: -len(r[1]))
        out = {}
        for s in range(0, len(rows), self._batch):
            chunk = rows[s:s + self._batch]
            r = len(chunk[0][1])
            tok = torch.zeros(len(chunk), r, dtype=torch.long)
            pos, tgt = torch.zeros_like(tok), torch.zeros_like(tok)
            for i, (_, t, p, q, _, _, _) in enumerate(chunk):
                tok[i, :len(t)], pos[i, :len(p)], tgt[i, :len(q)] = torch.tensor(t), torch.tensor(p), torch.tensor(q)
            h = model.hidden_slots(tok.to(dev), pos.to(dev), tgt.to(dev))                 # (B, r, C)
            # only the scored slots go through the head: (sum L, C) -> (sum L, V), not (B, r, V)
            idx = [(i, j) for i, row in enumerate(chunk) for j in range(len(row[1]) - row[5], len(row[1]))]
            ii = torch.tensor([a for a, _ in idx], device=dev)
            jj = torch.tensor([b for _, b in idx], device=dev)
            logits = model.lm_head(h[ii, jj])                                              # (sum L, V)
            logp = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
            y = torch.tensor([t for row in chunk for t in row[4][-row[5]:]], device=dev)  # (sum L,)
            lp = logp.gather(1, y[:, None])[:, 0].double().cpu()
            hit = (logp.argmax(-1) == y).cpu()
            a = 0
            for key, _, _, _, _, L, j in chunk:
                out[(key, j)] = (lp[a:a + L].sum().item(), bool(hit[a:a + L].all()), lp[a:a + L])
                a += L
        return out

    def _score_encoder(self, todo, memo):
        """The encoder MDM: an MC estimate of its ELBO of the continuation given the (unmasked) context.
        With L continuation tokens, E over a uniform reveal count k in 1..L and a uniform k-subset S of
        (L/k) sum_{i in S} log p(x_i | everything outside S) is the any-order bound (eval_ppl's nll_mdm_elbo,
        restricted to the continuation). Counts are stratified over the mc draws (likelihood.stratified_counts,
        uniform_subsets: nll_mdm_elbo's draws)."""
        model, mask = self.model, self.model.config.mask_token_id
        for key in todo:
            ctx, cont = key
            w = torch.tensor(self._window(ctx, cont))
            n, L = len(w), len(cont)
            g = torch.Generator().manual_seed(context_seed(self.seed, ctx))
            k = stratified_counts(self.mc, L, g)                                             # (mc,)
            masked = torch.zeros(self.mc + 1, n, dtype=torch.bool)
            masked[:-1, n - L:] = uniform_subsets(k, L, g)
            masked[-1, n - L:] = True  # the last row: all of the continuation masked, for the greedy check
            rows = torch.where(masked, mask, w)                                              # (mc+1, n)
            lp, hit = [], []
            for s in range(0, self.mc + 1, self._batch):
                h = model.encoder_hidden(rows[s:s + self._batch].to(self.device))[:, n - L:]  # (b, L, C)
                logits = model.encoder_logits(h)                                             # (b, L, V)
                logp = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
                y = w[n - L:].to(self.device).expand(len(h), L)
                lp.append(logp.gather(2, y[..., None])[..., 0].double().cpu())               # (b, L)
                hit.append((logp.argmax(-1) == y).cpu())
            lp, hit = torch.cat(lp), torch.cat(hit)                                          # (mc+1, L)
            draws = (lp[:-1] * masked[:-1, n - L:]).sum(1) * L / k.double()                  # (mc,)
            greedy = bool(hit[-1].all())
            memo[key] = dict(ll=draws.mean().item(), greedy=greedy, elbo_draws=self.mc,
                             elbo_se=(draws.std().item() / math.sqrt(self.mc)) if self.mc > 1 else math.nan)

    # ------------------------------------------------------------------ rolling (perplexity tasks)
    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """Sum of log p over a whole text, in the harness's own windows (get_rolling_token_windows with one
        token of carried context, made disjoint), each scored like a loglikelihood request. Natively a
        window is block_size tokens after [None] and the one carried token falls off the left edge, so the
        full windows are eval_ppl.py's disjoint chunks; a last partial window is scored after the tokens
        before it (up to block_size in all). With bos=hf they are the hf class's windows exactly."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
        saved, self.estimator = self.estimator, 'l2r'  # exact L2R for a decoder, whatever scored the choices
        try:
            per_text = []
            for (text,) in [r.args for r in requests]:
                windows = get_rolling_token_windows(self.tok_encode(text), self.prefix_token_id,
                                                    self.max_length, context_len=1)
                per_text.append([(None, c, x) for c, x in map(make_disjoint_window, windows)])
            flat = [w for ws in per_text for w in ws]
            scores = iter(self._loglikelihood_tokens(flat))
            return [sum(next(scores)[0] for _ in ws) for ws in per_text]
        finally:
            self.estimator = saved

    # ------------------------------------------------------------------ generation
    def generate_until(self, requests, disable_tqdm=False):
        """Greedy (or, where the task samples, temperature/top_p) L2R decoding of max_gen_toks tokens at most,
        the text cut at the first stop string or end-of-text. The context is cut from the left to leave
        room for max_gen_toks, as the hf class does. One request at a time (generate_ar shares one prompt
        across its batch); tokens come GEN_CHUNK at a time, so a stop string ends the request early."""
        if self.encoder:  # one line, also from inside the harness (it does not catch SystemExit)
            die("generate_until tasks need a decoder: the encoder MDM has no L2R decoder here; drop the "
                "generation tasks from --tasks")
        out = []
        for context, gen_kwargs in [r.args for r in requests]:
            key = (context, json.dumps(gen_kwargs, sort_keys=True, default=str))
            if key not in self.gen_memo:
                self.gen_memo[key] = self._generate_one(context, gen_kwargs)
            out.append(self.gen_memo[key])
        return out

    def _generate_one(self, context, gen_kwargs):
        """One request: the text generated after context, cut at its first stop string."""
        kw = dict(gen_kwargs or {})
        until = kw.pop('until', None) or []
        until = [s for s in ([until] if isinstance(until, str) else until) if s]
        n_new = min(int(kw.pop('max_gen_toks', self._max_gen_toks)), self.max_length - 1)
        temperature = float(kw.get('temperature', 0.0) or 0.0) if kw.get('do_sample', False) else 0.0
        top_p = float(kw.get('top_p', 1.0) or 1.0) if temperature > 0 else 1.0
        prompt = self.tok_encode(context)[-(self.max_length - n_new):]
        g = torch.Generator().manual_seed(context_seed(self.seed, prompt))
        new = []
        with torch.no_grad(), self.autocast:
            while len(new) < n_new:
                more = self._decode(prompt + new, min(GEN_CHUNK, n_new - len(new)), temperature, top_p, g)
                new += more
                if self.codec.eot in more or any(s in self.tok_decode(new) for s in until):
                    break
        if self.codec.eot is not None and self.codec.eot in new:
            new = new[:new.index(self.codec.eot)]
        text = self.tok_decode(new)
        for stop in until:
            text = text.split(stop)[0]
        return text

    def _decode(self, ids, k, temperature, top_p, g):
        """k more tokens after ids. Natively generate.generate_ar ([None] + ids, KV cache). With bos=hf the
        first token sits in [None]'s slot, which generate_ar does not do: a plain loop of full passes
        (what HF GPT-2 computes; this mode is for checking against the hf class, not for speed)."""
        from aogpt.generate import generate_ar, sample_tokens
        from aogpt.samplers import Sampling
        s = Sampling(temperature=temperature, top_p=top_p, vocab_size=self.codec.vocab_size, generator=g)
        if not self.hf:
            toks, _ = generate_ar(self.model, len(ids) + k, 1, s, prompt=ids)
            return toks[0, len(ids):].tolist()
        seq = list(ids)
        for _ in range(k):
            n = len(seq)
            tok = torch.tensor(seq, device=self.device)[None]                              # (1, n)
            pos = torch.arange(-1, n - 1, device=self.device)[None]
            logits = self.model.forward_slots(tok, pos, pos + 1, n_logits=1)[:, -1]       # (1, V)
            seq.append(int(sample_tokens(logits, s.rand(1), **s.transform)[0]))
        return seq[len(ids):]

    def describe(self):
        """What the JSON records about how the numbers were made."""
        cfg = self.model.config
        d = dict(likelihood=('l2r' if self.estimator == 'l2r' else f'{self.estimator}:{self.K}'),
                 bos=('hf' if self.hf else 'none'), max_length=self.max_length, codec=self.codec.name,
                 precision=self.precision, seed=self.seed, batch_size=self._batch,
                 rolling='exact L2R over the harness rolling windows',
                 generation=('full passes, first token in slot 0 (bos=hf)' if self.hf else
                             'generate.generate_ar: L2R KV cache from [None] + context') +
                 ', greedy unless the task sets do_sample')
        if self.encoder:
            d.update(likelihood=f'mdm_elbo:mc={self.mc}', rolling=f'MDM ELBO, {self.mc} masks per window',
                     generation='n/a (encoder MDM)',
                     harness_loglikelihood='MC ELBO of the continuation, context unmasked (a lower bound)')
        elif self.estimator == 'orders':
            d['harness_loglikelihood'] = {'mean': f'mean of {self.K} chain-rule sums (the any-order bound)',
                                          'lme': f'log-mean-exp of {self.K} chain-rule sums (importance-weighted '
                                                 f'bound)'}[self.orders_score]
        elif self.estimator == 'ensemble':
            d['harness_loglikelihood'] = (f'exact log-likelihood of a {self.K}-member context-order ensemble: '
                                          f'each continuation token (L2R) scored by the mean probability over '
                                          f'{self.K} orderings of the context (member 0 = L2R)')
        else:
            d['harness_loglikelihood'] = 'exact L2R log-likelihood'
        d['model'] = dict(causal=cfg.causal, cond=cfg.cond, block_size=cfg.block_size, n_layer=cfg.n_layer,
                          n_embd=cfg.n_embd, params=self.model.get_num_params())
        return d


# ----------------------------------------------------------------------------------------------- the launcher

@command
def main(argv=None):
    c = read_config(argv)
    rank, c.world_size, c.device = start_ranks(c.device)
    if rank == 0:
        print_config(c.config)
    task_manager, task_names = find_tasks(c)
    lm = load_lm(c)
    gen = sorted(t for t, kind in c.output_types.items() if kind == 'generate_until')
    if lm.encoder and gen:
        die(f"{', '.join(gen)}: generation tasks need a decoder, and this checkpoint is an encoder MDM")
    check_alphabet(lm.codec, c)
    results = run_harness(lm, task_manager, task_names, c)
    record = None
    if rank == 0:  # the harness gathers every rank's requests onto rank 0; the others return None
        print_tables(results)
        record = make_record(lm, c, results)
        write_record(record, c)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return record


def read_config(argv):
    c = namespace(globals(), argv)
    c.task_names = [s.strip() for s in c.tasks.split(',') if s.strip()]
    if not c.task_names:
        die("--tasks is empty: name one or more harness tasks (e.g. --tasks hellaswag,piqa)")
    try:
        parse_likelihood(c.likelihood)
    except ValueError as e:
        die(str(e))
    for key, ok in (('orders_score', c.orders_score in ('mean', 'lme')), ('bos', c.bos in ('none', 'hf')),
                    ('batch_size', c.batch_size >= 1), ('limit', c.limit >= 0),
                    ('max_gen_toks', c.max_gen_toks >= 1), ('num_fewshot', c.num_fewshot is None or c.num_fewshot >= 0)):
        if not ok:
            die(f"invalid --{key}={getattr(c, key)!r} (see --help for the valid values)")
    if not 1 <= c.mc <= MAX_DRAWS:
        die(f"--mc must be from 1 to {MAX_DRAWS} masks (each is a forward pass per request), got {c.mc}")
    if c.include_path and not os.path.isdir(c.include_path):
        die(f"--include_path {c.include_path}: no such folder")
    c.device = script_device(c.device, c.dtype)[0]  # a device this machine lacks, or a bad --dtype: one line
    from aogpt.checkpoint import check_record_path
    check_record_path(c.out, c.ckpt or c.out_dir, 'harness', 'out')  # before hours of tasks
    return c


def find_tasks(c):
    """The harness's task index (plus --include_path), and the requested names checked against it and
    loaded once, so an unknown name or data that cannot be had here is one line before the model loads."""
    import logging
    logging.getLogger('lm_eval').setLevel(logging.WARNING)
    from lm_eval.tasks import TaskManager
    tm = TaskManager(include_path=c.include_path or None, include_defaults=c.builtin_tasks)
    unknown = [t for t in c.task_names if t not in tm.all_tasks]
    if unknown:
        import difflib
        near = {t: difflib.get_close_matches(t, tm.all_tasks, n=1) for t in unknown}
        hint = '; '.join(f"did you mean {m[0]!r} for {t!r}?" for t, m in near.items() if m)
        die(f"unknown task(s) {', '.join(unknown)}" + (f" ({hint})" if hint else "") +
            "; `lm_eval ls tasks` lists them, --include_path DIR adds local task YAMLs")
    try:
        loaded = tm.load(list(c.task_names))['tasks']
    except Exception as e:  # offline and not in the HF cache, or a broken local YAML/data file
        die(f"cannot load task data for {', '.join(c.task_names)} ({type(e).__name__}: {first_line(e)}); "
            f"offline, the data must be in the HF cache, or give a local copy: --include_path DIR with a task "
            f"YAML using dataset_path: json and data_files (see docs/downstream.md)")
    c.loaded = loaded
    c.output_types = {name: t.config.output_type for name, t in loaded.items()}
    return tm, c.task_names


def check_alphabet(codec, c):
    """A character-level checkpoint meets the tasks' text: every character of the documents it will see
    (prompt, target, choices) must be in its alphabet, checked before any work (few-shot examples are
    checked when they are encoded: a UserError then, also one line)."""
    if codec.name != 'char':
        return
    alphabet, missing = set(codec.chars), {}
    for name, task in c.loaded.items():
        docs = list(task.eval_docs)[:c.limit or None]
        for doc in docs:
            parts = [task.doc_to_text(doc), task.doc_to_target(doc)]
            if task.config.output_type == 'multiple_choice':
                parts += list(task.doc_to_choice(doc))
            for ch in set(''.join(p for p in parts if isinstance(p, str))) - alphabet:
                missing.setdefault(ch, name)
    if missing:
        shown = ', '.join(f"{ch!r} ({t})" for ch, t in sorted(missing.items())[:8])
        die(f"this checkpoint's char-level codec ({len(alphabet)} symbols) lacks {len(missing)} character(s) "
            f"of the tasks' text: {shown}; such a task cannot be scored with this checkpoint")


def load_lm(c):
    try:
        lm = AOGPTLM(ckpt=c.ckpt or c.out_dir, likelihood=c.likelihood, orders_score=c.orders_score, mc=c.mc,
                     bos=c.bos, batch_size=c.batch_size, max_gen_toks=c.max_gen_toks, device=c.device,
                     dtype=c.dtype, use_ema=c.use_ema, dataset=c.dataset, seed=c.seed)
    except UserError as e:
        die(e.msg)
    except ValueError as e:
        die(first_line(e))
    # a setting given on purpose that this model and estimator never read: refused, not ignored without a word
    if 'mc' in c.given and not lm.encoder:
        die(f"--mc sets the encoder MDM's Monte-Carlo masks, but {lm.ckpt} is a decoder (causal): leave --mc out "
            f"(--likelihood picks a decoder's estimator)")
    if 'orders_score' in c.given and (lm.encoder or lm.estimator != 'orders'):
        die(f"--orders_score picks which number of --likelihood=orders:K the harness scores, but this run scores "
            f"{'the encoder MDM ELBO' if lm.encoder else f'--likelihood={c.likelihood}'}: leave --orders_score out"
            + ("" if lm.encoder else ", or use --likelihood=orders:K"))
    return lm


def run_harness(lm, tm, task_names, c):
    """simple_evaluate on our LM object; for orders:K a second pass that scores the other number of the
    pair (mean / log-mean-exp) straight from the LM's memo, so both accuracies come from the same draws."""
    from lm_eval import simple_evaluate

    kw = dict(tasks=task_names, task_manager=tm, limit=c.limit or None, num_fewshot=c.num_fewshot,
              bootstrap_iters=c.bootstrap_iters, log_samples=c.log_samples, random_seed=c.seed,
              numpy_random_seed=c.seed, torch_random_seed=c.seed, fewshot_random_seed=c.seed)
    res = {'primary': simple_evaluate(model=lm, **kw)}  # a UserError inside is main's one line (errors.command)
    if lm.estimator == 'orders' and not lm.encoder:
        lm.orders_score = 'lme' if c.orders_score == 'mean' else 'mean'
        res['other'] = simple_evaluate(model=lm, **kw)
        lm.orders_score = c.orders_score
    return res


def print_tables(results):
    from lm_eval.utils import make_table
    for name, r in results.items():
        if r is None:
            continue
        if name == 'other':
            print("\nthe same draws, the other orders:K score:")
        print(make_table(r))
        if r.get('groups'):
            print(make_table(r, 'groups'))


def make_record(lm, c, results):
    import lm_eval
    from lm_eval.utils import handle_non_serializable
    keep = ('results', 'groups', 'versions', 'n-shot', 'higher_is_better', 'n-samples', 'configs')
    if c.log_samples:
        keep += ('samples',)

    def clean(r):  # the harness's dict, JSON-safe
        return json.loads(json.dumps({k: r[k] for k in keep if k in r}, default=handle_non_serializable))
    ckpt_path = c.ckpt or c.out_dir
    from aogpt.checkpoint import fingerprint
    record = dict(checkpoint=os.path.abspath(ckpt_path) if os.path.exists(ckpt_path) else ckpt_path,
                  ema=lm.used_ema, iter_num=lm.iter_num, weights=fingerprint(lm.model), estimator=lm.describe(),
                  lm_eval_version=lm_eval.__version__,
                  tasks=c.task_names, world_size=c.world_size, limit=c.limit, num_fewshot=c.num_fewshot,
                  include_path=c.include_path,
                  time=time.strftime('%Y-%m-%d %H:%M:%S'), **clean(results['primary']))
    if 'other' in results:
        other = 'lme' if c.orders_score == 'mean' else 'mean'
        record['results_' + other] = clean(results['other'])['results']
        record['estimator']['results_' + other] = f"the same requests scored by orders_{other}"
    record['table'] = harness_table(results['primary'])
    return record


def harness_table(r):
    """The harness's markdown table of a result dict (what export.py's model card shows)."""
    from lm_eval.utils import make_table
    return make_table(r)


def json_path(c):
    """Where the record goes: checkpoint.record_path's rule, shared with eval_ppl.py."""
    from aogpt.checkpoint import record_path
    return record_path(c.out, c.ckpt or c.out_dir, 'harness')


def write_record(record, c):
    """The record as JSON (atomically), and appended to the .jsonl history beside it, as eval_ppl.py does: a run
    of other tasks replaces harness.json, never an earlier run's results."""
    from aogpt.checkpoint import save_record
    path = json_path(c)
    try:
        history = save_record(path, record)
    except OSError as e:
        die(f"cannot write {e.filename or path} ({e.strerror or e}); the table above has the numbers; pass --out FILE")
    print(f"wrote {path} (history: {history})")


def model_card_section(src, iter_num=None, used_ema=None, weights=None):
    """The 'Downstream tasks' markdown for export.py's model card: the harness table from the harness.json
    that eval_harness.py wrote for checkpoint `src` (checkpoint.record_path), or '' when there is none or
    it describes other weights (another iteration, EMA vs raw, or another checkpoint.fingerprint). Export
    only calls it."""
    from aogpt.checkpoint import record_path
    path = record_path('', src, 'harness')
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return ''
    if (iter_num is not None and rec.get('iter_num') not in (None, iter_num)) or \
            (used_ema is not None and rec.get('ema') not in (None, used_ema)) or \
            (weights is not None and rec.get('weights') != weights):
        return ''
    est = rec.get('estimator', {})
    lines = ["## Downstream tasks", '',
             f"Zero-shot, EleutherAI lm-evaluation-harness {rec.get('lm_eval_version', '?')} through "
             f"`eval_harness.py`: log-likelihood estimator `{est.get('likelihood', '?')}` "
             f"({est.get('harness_loglikelihood', '')})" + (f", first {rec['limit']} docs per task" if rec.get('limit')
                                                           else "") + '.', '', rec.get('table', '').strip(), '']
    return '\n'.join(lines) + '\n'


if __name__ == '__main__':
    stop_on_ctrl_c('nothing was written (harness.json is as it was)')
    main()
