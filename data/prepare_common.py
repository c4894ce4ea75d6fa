"""
What every data/<name>/prepare.py shares: documents -> token ids -> {split}.bin + meta.json.

Each document is tokenized (after an optional detokenizer) and followed by the codec's EOT id (GPT-2:
50256; char codecs have no EOT and use a newline instead), and the splits are written as flat arrays
in the dtype aogpt/bins.py picks from the vocabulary: uint16 (nanoGPT's format) while every id fits,
uint32 for larger vocabularies (Llama 3, Qwen); aogpt.bins.load_bin reads them back.
meta.json beside the bins records tokenizer, vocab_size, eot, dtype, {split}_tokens, {split}_docs and
source; a source model's tokenizer (--tokenizer) also its bos, the sha256 of its tokenizer.json, a copy
of which is written beside meta.json, and where it came from.

Resumable and idempotent:
  * a finished directory (meta.json with the same fingerprint, bins of the recorded sizes) is skipped;
  * a split is written to {split}.bin.partial and renamed only when complete;
  * while it runs, .prepare_state.json records (documents, tokens) done after each flush, so a re-run
    after Ctrl-C, a crash or a full disk truncates the partial file to the last record and continues.
Tokenization runs on num_proc worker processes (each reads its own slice of the dataset), results are
written in document order, so the bins do not depend on num_proc.
"""

if __name__ == '__main__':  # run as a script (python data/prepare_common.py): one line, not an ImportError
    raise SystemExit('error: data/prepare_common.py holds what the prepare scripts share, with nothing to run: run '
                     'data/<name>/prepare.py')

import errno
import json
import os
import shutil
import signal
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from aogpt.bins import DTYPES, bin_dtype  # noqa: E402  (the one rule for the bins' dtype)
from aogpt.configurator import die_with_parent  # noqa: E402
from aogpt.errors import UserError  # noqa: E402
from aogpt.evalsets import doc_end  # noqa: E402  (the ids that end a document: [EOT], or '\n' for char level)
from aogpt.paths import atomic_json, atomic_write, make_folder  # noqa: E402  (atomic_json: the scripts' too)
from aogpt.tokenizer import (TOKENIZER_FILE, TOKENIZERS, char_codec, codec_from_record, gpt2_codec,  # noqa: E402
                             source_codec)  # noqa: F401  (the scripts' --tokenizer)

STATE = ".prepare_state.json"
FLUSH_EVERY_S = 30  # seconds between resume records: at most this much work is redone after a crash


def tokenizer_name(spec):
    """A --tokenizer spec's short name, for a default out_dir: hf:owner/name@rev -> name, a folder -> its name."""
    if spec.startswith("hf:"):
        return spec[3:].split("@")[0].split("/")[-1]
    return os.path.basename(os.path.abspath(spec))


def as_dataset(docs):
    """A list of str -> an in-memory HF Dataset with a 'text' column (what prepare() consumes)."""
    import datasets
    return datasets.Dataset.from_dict({"text": list(docs)})


# ------------------------------------------------------------------------ worker side (one per process)
_W = {}


def _init_pool_worker(parent, *args):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (one line, not one per worker)
    die_with_parent(parent)  # a SIGKILLed parent: no worker left waiting on the task queue
    _init_worker(*args)


def _init_worker(ds, column, detok, record):
    # the codec travels as its record (plain values, unlike the codec's functions) and is rebuilt here
    codec = codec_from_record(record)
    _W.update(ds=ds, column=column, detok=detok, codec=codec, dtype=DTYPES[bin_dtype(codec.vocab_size)])


def _tokenize_range(ab):
    a, b = ab
    codec, detok = _W["codec"], _W["detok"]
    ids = []
    for text in _W["ds"][a:b][_W["column"]]:
        ids.extend(codec.encode(detok(text) if detok else text))
        ids.extend(doc_end(codec))
    return np.array(ids, dtype=_W["dtype"])


# ------------------------------------------------------------------------------------------ main side

def _text_bytes(ds):
    """Rough size of the split's text, for the free-disk check (Arrow bytes scaled to the selected rows)."""
    table = ds.data
    return int(table.nbytes * len(ds) / max(1, table.num_rows))


def disk_full(e, what):
    """Re-raise an OSError from writing `what`; a full disk becomes one line (the run resumes from its last
    record when re-run)."""
    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
        raise e
    raise UserError(f"disk full while writing {what}; free some space and re-run: it resumes from its last record")


def _existing(folder):
    folder = os.path.abspath(folder)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    return folder


def same_disk(a, b):
    """Do folders a and b (or their nearest existing parents) live on one filesystem?"""
    return os.stat(_existing(a)).st_dev == os.stat(_existing(b)).st_dev


def check_disk(folder, need, what):
    """UserError if the filesystem holding folder (or its nearest existing parent) has < need bytes free."""
    folder = _existing(folder)
    free = shutil.disk_usage(folder).free
    if free < need:
        raise UserError(f"not enough disk for {what}: about {human_bytes(need)} needed in {folder}, "
                        f"{human_bytes(free)} free; free space or choose another out_dir")


def rebuild_reason(old, new):
    """Why prepared bins are not reused, in words: the settings that changed (old -> new), else their sizes."""
    def flat(d, pre=""):
        out = {}
        for k, v in (d or {}).items():
            out.update(flat(v, f"{pre}{k}.") if isinstance(v, dict) else {pre + k: v})
        return out
    a, b = flat(old), flat(new)
    changed = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    short = lambda v: repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."  # noqa: E731
    return (", ".join(f"{k} {short(a.get(k))} -> {short(b.get(k))}" for k in changed[:4]) +
            (", ..." if len(changed) > 4 else "") if changed else "the bins do not have the sizes meta.json records")


def human_bytes(n):
    """3 significant digits in the unit that fits: a small need on a full disk is not '0.00 GB ... 0.00 GB'."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} bytes"


def _write_split(ds, column, path, state, key, detok, codec, num_proc, batch_docs, save_state):
    """Tokenize ds into path (resuming from state[key]); returns (docs, tokens)."""
    from tqdm import tqdm
    width = np.dtype(DTYPES[bin_dtype(codec.vocab_size)]).itemsize
    n = len(ds)
    st = state.setdefault(key, {"docs": 0, "tokens": 0, "done": False})
    partial = path + ".partial"
    if st["docs"] and os.path.exists(partial) and os.path.getsize(partial) >= width * st["tokens"]:
        print(f"resuming {os.path.basename(path)} at document {st['docs']:,}/{n:,}")
    else:
        st.update(docs=0, tokens=0)
    # ~1 id per 4 bytes of text (GPT-2 averages ~4 chars/token); char level writes 1 id per char
    per_byte = width * (1.0 if codec.name == "char" else 0.25)
    check_disk(os.path.dirname(path), int(_text_bytes(ds) * (n - st["docs"]) / max(n, 1) * per_byte),
                os.path.basename(path))
    if num_proc > 1:  # small inputs: enough tasks to keep every process busy
        batch_docs = max(1, min(batch_docs, (n - st["docs"]) // (8 * num_proc)))
    tasks = [(a, min(a + batch_docs, n)) for a in range(st["docs"], n, batch_docs)]
    args = (ds, column, detok, codec.record())
    pool = None
    if num_proc > 1 and len(tasks) > 1:
        import multiprocessing as mp
        pool = mp.Pool(num_proc, _init_pool_worker, (os.getpid(), *args))
        results = pool.imap(_tokenize_range, tasks)  # ordered: the bin is the same for any num_proc
    else:
        _init_worker(*args)
        results = map(_tokenize_range, tasks)
    bar = tqdm(total=n, initial=st["docs"], unit="doc", desc=os.path.basename(path), mininterval=1.0)
    last = time.time()
    try:
        with open(partial, "r+b" if st["docs"] else "wb") as f:
            f.truncate(width * st["tokens"])  # drop anything written after the last resume record
            f.seek(width * st["tokens"])
            for (a, b), ids in zip(tasks, results):
                f.write(ids.tobytes())
                st["docs"], st["tokens"] = b, st["tokens"] + len(ids)
                bar.update(b - a)
                bar.set_postfix(tokens=f"{st['tokens']:,}", refresh=False)
                if time.time() - last > FLUSH_EVERY_S:
                    f.flush()
                    os.fsync(f.fileno())
                    save_state()
                    last = time.time()
            f.flush()
            os.fsync(f.fileno())
        if pool is not None:  # done: let the workers finish and exit on their own
            pool.close()
            pool.join()
            pool = None
    except OSError as e:
        disk_full(e, partial)
    finally:
        bar.close()
        if pool is not None:  # an error or an interrupt: stop them (SIGTERM)
            pool.terminate()
    os.replace(partial, path)
    st["done"] = True
    save_state()
    return st["docs"], st["tokens"]


def prepare(out_dir, splits, source, chars=None, detok=None, num_proc=1, batch_docs=1024, force=False,
            column="text", extra=None, codec=None, codec_source=None):
    """Write out_dir/{split}.bin for each (split name -> HF Dataset) in splits, then meta.json.
    source: where the documents came from (str); extra: more facts for meta.json (dict). Both are part of
    the fingerprint that decides whether existing bins can be reused.
    chars: None for GPT-2 BPE, else the ordered char-level vocabulary (also written to meta.pkl).
    codec: a source model's codec instead (tokenizer.source_codec), codec_source: where it came from.
    detok: optional str -> str applied to each document before tokenizing. Returns the meta dict."""
    if num_proc < 1:  # was taken as 1 without a word
        raise UserError(f"num_proc must be at least 1, got {num_proc}")
    make_folder(out_dir, "out_dir")  # a file in the way: one line, not a FileExistsError
    meta_path, state_path = os.path.join(out_dir, "meta.json"), os.path.join(out_dir, STATE)
    codec = codec or (char_codec(chars) if chars else gpt2_codec())
    dtype = bin_dtype(codec.vocab_size)
    width = np.dtype(DTYPES[dtype]).itemsize
    fingerprint = {"source": source, "tokenizer": codec.name, "chars": "".join(chars) if chars else None,
                   "detokenizer": detok.__name__ if detok else None,
                   "docs": {k: len(v) for k, v in splits.items()}, "extra": extra}
    if codec.name == TOKENIZERS:  # the tokenizer file and the ids it names decide the bins
        fingerprint.update(tokenizer_sha256=codec.sha256, eot=codec.eot)
    bins = {k: os.path.join(out_dir, f"{k}.bin") for k in splits}
    if not force and os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("fingerprint") == fingerprint and all(
                os.path.exists(p) and os.path.getsize(p) == width * meta.get(f"{k}_tokens", -1)
                for k, p in bins.items()) and (codec.name != TOKENIZERS or os.path.exists(
                os.path.join(out_dir, TOKENIZER_FILE))):
            sizes = ", ".join(f"{k}: {meta[k + '_tokens']:,} tokens" for k in splits)
            print(f"{out_dir} is already prepared ({sizes}); nothing to do (--force=True redoes it)")
            return meta
    state = {}
    if not force and os.path.exists(state_path):
        with open(state_path) as f:
            state = json.load(f)
    if state.get("fingerprint") != fingerprint:  # different input or settings: start over
        state = {"fingerprint": fingerprint, "splits": {}}
        for p in bins.values():
            if os.path.exists(p + ".partial"):
                os.remove(p + ".partial")
    if os.path.exists(meta_path):
        if not force:
            with open(meta_path) as f:
                print(f"rebuilding {out_dir}: {rebuild_reason(json.load(f).get('fingerprint'), fingerprint)}")
        os.remove(meta_path)  # the bins are about to change: never leave a stale meta.json beside them

    def save_state():
        atomic_json(state_path, state)

    counts = {}
    for k, ds in splits.items():
        st = state["splits"].get(k, {})
        if st.get("done") and os.path.exists(bins[k]) and os.path.getsize(bins[k]) == width * st["tokens"]:
            print(f"{k}.bin already complete ({st['tokens']:,} tokens)")
        else:
            _write_split(ds, column, bins[k], state["splits"], k, detok, codec, num_proc, batch_docs,
                         save_state)
        counts[k] = state["splits"][k]

    meta = {"tokenizer": codec.name, "vocab_size": codec.vocab_size, "eot": codec.eot, "dtype": dtype}
    if codec.name == TOKENIZERS:  # the dataset carries its tokenizer: get_codec checks it against this sha256
        meta.update(bos=codec.bos, tokenizer_sha256=codec.sha256, tokenizer_source=codec_source)
        atomic_write(os.path.join(out_dir, TOKENIZER_FILE), lambda f: f.write(codec.tokenizer_json.encode()))
    for k in splits:
        meta[f"{k}_tokens"] = counts[k]["tokens"]
    for k in splits:
        meta[f"{k}_docs"] = counts[k]["docs"]
    meta["source"] = source
    meta["detokenizer"] = fingerprint["detokenizer"]
    meta.update(extra or {})
    if chars:
        meta["chars"] = list(chars)
        import pickle
        atomic_write(os.path.join(out_dir, "meta.pkl"),  # nanoGPT's char-level metadata
                     lambda f: pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                                            "stoi": {ch: i for i, ch in enumerate(chars)}}, f))
    meta["fingerprint"] = fingerprint
    atomic_json(meta_path, meta)
    os.remove(state_path)
    for k in splits:
        print(f"{k}.bin: {meta[k + '_tokens']:,} tokens from {meta[k + '_docs']:,} documents")
    print(f"wrote {out_dir}/meta.json ({codec.name}, vocab {codec.vocab_size})")
    return meta
