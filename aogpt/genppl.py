"""
Generative perplexity: how likely a judge model finds the samples, both ways the field averages it, with
the samples' unigram entropy (low-temperature and repetitive samples flatter both perplexities).
"""

if __name__ == '__main__':  # run as a script (python aogpt/genppl.py): one line, not an ImportError
    raise SystemExit("error: aogpt/genppl.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import hashlib
import math
import os

import torch
from torch.nn import functional as F


@torch.no_grad()
def judge_token_nll(judge, seqs, mode='none', batch_size=16, windows=False):
    """-log p of every token the judge scores, per sequence: a list of 1-D float tensors. seqs: id
    sequences (lists or 1-D tensors) of any lengths, each read left to right.

    mode 'none': every token is scored, the first from [None] (for a GPT-2 loaded with
    aogpt.families.load_hf, [None] is <|endoftext|>): up to block_size tokens in one pass.
    mode 'hf': the paper code's recipe (HF GPT-2 on the raw sample): no BOS, the first token is only
    context: up to block_size + 1 tokens (1024 for GPT-2).
    A longer sequence is an error, or with windows=True is scored in consecutive windows, each read from
    scratch (re-tokenized text has a length nobody chose).
    """
    cfg = judge.config
    if not cfg.causal:
        raise ValueError("the judge must be a decoder (an L2R GPT, GPT-2, or an AO-GPT read L2R)")
    if mode not in ('none', 'hf'):
        raise ValueError(f"mode must be 'none' or 'hf', got {mode!r}")
    W = cfg.block_size if mode == 'none' else cfg.block_size + 1
    dev = next(judge.parameters()).device
    pieces = []  # (sequence index, ids of one pass)
    for i, s in enumerate(seqs):
        s = torch.as_tensor(s, dtype=torch.long).view(-1)
        if len(s) > W and not windows:
            raise ValueError(f"{len(s)} tokens do not fit the judge's context ({W} in mode {mode!r})")
        pieces += [(i, s[a:a + W]) for a in range(0, len(s), W)]
    out = [[] for _ in seqs]
    for a in range(0, len(pieces), batch_size):
        batch = pieces[a:a + batch_size]
        n = max(len(p) for _, p in batch)
        x = torch.zeros(len(batch), n, dtype=torch.long)                    # padded at the end: a causal
        y = torch.full((len(batch), n), -1, dtype=torch.long)               # judge never reads the pads
        for j, (_, p) in enumerate(batch):
            x[j, :len(p)] = y[j, :len(p)] = p
        x, y = x.to(dev), y.to(dev)
        if mode == 'none':
            _, nll = judge(x, targets=y, reduction='none')                  # (b, n)
        else:
            pos = torch.arange(-1, n - 1, device=dev).expand(len(batch), n)  # token i at GPT-2's wpe[i]
            logits = judge.forward_slots(x, pos, pos + 1)[:, :-1]
            nll = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y[:, 1:].reshape(-1),
                                  ignore_index=-1, reduction='none').view(len(batch), n - 1)
        skip = 0 if mode == 'none' else 1                                   # hf: the first token is context
        for j, (i, p) in enumerate(batch):
            out[i].append(nll[j, :max(0, len(p) - skip)].float().cpu())
    return [torch.cat(parts) if parts else torch.zeros(0) for parts in out]


def judge_nll(judge, tokens, mode='none', batch_size=16):
    """Per-sample mean NLL (B,) of tokens (B, n) under a decoder judge, each sample in one pass (the
    paper code's protocol; see judge_token_nll for the modes)."""
    return torch.stack([t.mean() for t in judge_token_nll(judge, list(tokens), mode, batch_size)])


def generative_ppl(judge, judge_codec, samples, codec, mode='none', batch_size=16, per_document=False):
    """Both generative perplexities of samples (N, n) under a judge, with the samples' unigram entropy:
      per_sequence  the mean over samples of exp(mean NLL of the sample), read as the sampler's own ids
                    (the paper's code and SEDD; with another judge codec, on the re-tokenized text);
      token         one token-weighted exp(total NLL / total tokens), after decoding each sample,
                    dropping what follows its first end of document, and re-tokenizing with the judge's
                    codec (MDLM and DUO). A sample that ends early counts for fewer tokens, not for a
                    perplexity as large as a full one.
    Low-temperature and repetitive samples flatter both; the unigram entropy (nats, mean over samples
    of the entropy of each sample's token histogram) shows it.
    per_document: samples is a list of documents instead (id lists of any length, each ending with the
    codec's end symbol where the document ended, sample.py --until_eot): the per-sequence mean is then
    over documents, each scored with its end symbol (predicting where it ends is part of its text);
    `protocol` in the result says which was done.
    Nothing to score: in mode 'hf' a sequence's first token is only context, so a one-token sample or document
    (an empty document is its end symbol alone) has no perplexity. It is left out of the per-sequence mean and
    named in `unscored` (its index), never dropped unsaid; the token-weighted number counts only scored tokens
    anyway. Where no sequence has a token to score, either average would be 0/0: a UserError, in one line."""
    from aogpt.errors import UserError
    from aogpt.evalsets import doc_end
    eos, texts = doc_end(codec)[0], []
    rows = [list(map(int, r)) for r in samples] if per_document else samples.tolist()
    for row in rows:
        cut = row.index(eos) if eos in row else None
        texts.append((codec.decode(row[:cut]), cut is not None))
    try:
        retok = [judge_codec.encode(t) + (doc_end(judge_codec) if ended else []) for t, ended in texts]
    except UserError as e:
        raise UserError(f"the judge's {judge_codec.name} codec cannot encode the samples: {e.msg}") from None
    same = judge_codec.record() == codec.record()
    per_seq = judge_token_nll(judge, [torch.tensor(r, dtype=torch.long) for r in rows] if same else retok, mode,
                              batch_size, windows=not same)
    tok = judge_token_nll(judge, retok, mode, batch_size, windows=True)
    n_tok = sum(len(t) for t in tok)
    unscored = [i for i, t in enumerate(per_seq) if not len(t)]
    if len(unscored) == len(per_seq) or not n_tok:
        raise UserError(f"nothing to score: in mode {mode!r} " + ("the first token of a sequence is only context, and "
                        "every " + ("document" if per_document else "sample") + " here is at most one token" if mode ==
                        'hf' else "no sequence holds a token") + " (" + ("per sequence" if len(unscored) == len(per_seq)
                        else "after cutting at the first end of document and re-tokenizing") + ")")
    seq_ppl = torch.stack([t.double().mean().exp() for t in per_seq if len(t)])
    H = unigram_entropy(rows)
    return dict(per_sequence=seq_ppl.mean().item(), per_sequence_std=seq_ppl.std().item() if len(seq_ppl) > 1 else 0.0,
                unscored=unscored,
                per_sequence_tokens='sample ids' if same else 're-tokenized',
                token=math.exp(sum(t.double().sum().item() for t in tok) / max(1, n_tok)), tokens_scored=n_tok,
                ended_early=sum(ended for _, ended in texts), unigram_entropy=H.mean().item(), mode=mode,
                per_sample=seq_ppl.tolist(), protocol=protocol(per_document, same, mode))


def protocol(per_document, same, mode):
    """In words, what generative_ppl scored: the record carries it, so a number says how it was made."""
    unit = ("per document (sample.py --until_eot): each sample cut at its first end symbol after the given "
            "text; the document's ids and that end symbol, where it ended, are what is scored" if per_document
            else "per window: each sample's n ids as drawn, end symbols and whatever follows them included")
    return (f"{unit}. per_sequence: mean over samples of exp(mean NLL), on the sample ids" +
            ("" if same else " re-tokenized (decode, then the judge's codec; an end symbol is re-encoded as the "
             "judge's)") + ("; mode hf: no BOS, the first token is only context" if mode == 'hf' else
                            "; mode none: every token scored, the first from [None]") +
            ("; a sequence of one token has nothing to score and no perplexity: it is left out of the "
             "per-sequence mean and listed in unscored (per_sample holds the others)" if mode == 'hf' else "") +
            ". token: exp(total NLL / total tokens) after decoding, dropping what follows the first end symbol "
            "(kept, as the judge's end symbol, where there is one) and re-tokenizing with the judge's codec")


def unigram_entropy(tokens):
    """Per-sample entropy (nats) of the token histogram (B,): low values expose degenerate repetition.
    tokens: (B, n), or sequences of any lengths (an empty one has entropy 0)."""
    out = []
    for row in tokens:
        row = torch.as_tensor(row, dtype=torch.long).cpu()
        p = torch.bincount(row).double()
        p = p[p > 0] / max(1, row.numel())
        out.append(-(p * p.log()).sum().item())
    return torch.tensor(out, dtype=torch.float64)


def load_judge(path, device, samples_codec=None):
    """A judge model, its codec, and whether it is an HF GPT-2 folder, which alone can take the HF GPT-2 recipe
    (mode 'hf'). A Hugging Face folder (local or hf:) goes through the one loader (families.hf_source: every tensor
    checked) with its own codec: GPT-2's BPE, or the folder's tokenizer.json (a GPT-2 of another vocabulary, a
    Llama or Qwen judge, whose [None] is its BOS or document separator, scores every token from it: mode 'none').
    Where the samples were drawn in that same tokenizer.json (samples_codec: a model trained from this source), the
    judge ends documents where they do (their eot: a Qwen's <|endoftext|>, not the <|im_end|> its config.json
    names). Else a checkpoint of ours."""
    from aogpt.checkpoint import is_export, load_model, resolve_path
    from aogpt.errors import UserError
    from aogpt.families import load_hf, read_config
    from aogpt.startup import hf_folder
    from aogpt.tokenizer import TOKENIZER_FILE, folder_codec, gpt2_codec, is_gpt2_vocabulary
    where = hf_folder(path) if path.startswith('hf:') else resolve_path(path)
    if where is not None and os.path.isdir(where) and not is_export(where):
        if read_config(where)['model_type'] == 'gpt2' and is_gpt2_vocabulary(where):  # else its tokenizer.json, below
            return load_hf(where).to(device).eval(), gpt2_codec(), True
        if not os.path.isfile(os.path.join(where, TOKENIZER_FILE)):
            raise UserError(f"judge {path} holds no {TOKENIZER_FILE}, so nothing says which text its ids are: a "
                            f"judge folder needs its tokenizer")
        with open(os.path.join(where, TOKENIZER_FILE), 'rb') as f:
            same = samples_codec is not None and samples_codec.sha256 == hashlib.sha256(f.read()).hexdigest()
        codec = folder_codec(where, eot_id=samples_codec.eot if same else None)
        return load_hf(where, doc_end=codec.eot).to(device).eval(), codec, False
    model, _, _, codec = load_model(path if where is None else where, device, dataset='')  # its codec, checked to fit
    return model, codec, False
