"""
A corpus too big to hold in one process: one token shard per source archive, then the train/val bins.

Each archive is tokenized by a worker process into a shard under <out_dir>/shards/:
    <name>.ids   token ids, EOT (GPT-2: 50256) after every document: the bins' own format and dtype
    <name>.lens  uint32 tokens of each document, its EOT included
    <name>.json  documents, tokens and the key the shard was made with (tokenizer, text rule, archive size)
The .ids and .lens files are written under names unique to the writing process, then renamed, and the
.json is written last: a shard is finished exactly when its .json is there. A killed worker leaves only
temporary files, removed by the next run, which redoes just the archives that were in flight.

assemble() then writes train.bin and val.bin from the shards, in order, splitting each shard by document
ranges, and deletes each shard as soon as its tokens are in the bins: disk peaks at the bins plus one
shard, not twice the bins. It appends to {split}.bin.partial and records its progress in .assemble.json
after each shard (before deleting it), so a killed assembly resumes from that record. Either way the
bins are byte-identical to an uninterrupted run's, and they do not depend on the number of processes.
"""

if __name__ == '__main__':  # run as a script (python data/prepare_shards.py): one line, not an ImportError
    raise SystemExit('error: data/prepare_shards.py holds what the prepare scripts share, with nothing to run: run '
                     'data/<name>/prepare.py')

import json
import multiprocessing as mp
import os
import signal

import numpy as np
from prepare_common import disk_full

from aogpt.bins import DTYPES, bin_dtype
from aogpt.configurator import die_with_parent
from aogpt.errors import UserError
from aogpt.paths import atomic_json, atomic_write, is_temp
from aogpt.tokenizer import gpt2_codec

STATE = ".assemble.json"


def _paths(shard_dir, name):
    return {ext: os.path.join(shard_dir, f"{name}.{ext}") for ext in ("ids", "lens", "json")}


def read_shard(shard_dir, name, key):
    """The record of a finished shard made with this key, else None."""
    p = _paths(shard_dir, name)
    try:
        with open(p["json"]) as f:
            rec = json.load(f)
        width = np.dtype(DTYPES[rec.get("dtype", "uint16")]).itemsize
        ok = (rec.get("key") == key and os.path.getsize(p["ids"]) == width * rec["tokens"]
              and os.path.getsize(p["lens"]) == 4 * rec["docs"])
    except (OSError, ValueError, KeyError):
        return None
    return rec if ok else None


def clean_temporaries(shard_dir):
    """Remove what killed workers left behind (paths.atomic_write's temp files); finished shards stay."""
    if os.path.isdir(shard_dir):
        for f in os.listdir(shard_dir):
            if is_temp(f):
                os.remove(os.path.join(shard_dir, f))


# ------------------------------------------------------------------------ worker side (one per process)
_W = {"progress": None, "stop": None, "parent": None, "codec": None}


def _init_worker(progress, stop, parent, codec=None):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the pool
    die_with_parent(parent)  # an idle worker never reaches advance()'s check of the parent
    _W.update(progress=progress, stop=stop, parent=parent, codec=codec)  # forked: the codec is inherited as is


def advance(nbytes):
    """Called by readers as they go: moves the parent's progress bar. A worker stops here, rather than
    finish its archive for nobody, once the parent has stopped (bad input elsewhere, Ctrl-C) or died."""
    if _W["parent"] is not None and (_W["stop"].value or os.getppid() != _W["parent"]):
        os._exit(1)
    if _W["progress"] is not None:
        with _W["progress"].get_lock():
            _W["progress"].value += nbytes


def write_shard(shard_dir, name, key, texts, stats=None, codec=None):
    """Tokenize texts (an iterable of str, in order) into the shard `name`; returns its record. stats: a
    dict the caller fills while texts is consumed; it is stored in the record. codec: the pool's (make_shards),
    else GPT-2."""
    codec = codec or _W["codec"] or gpt2_codec()
    enc, eot, dtype = codec.encode, codec.eot, bin_dtype(codec.vocab_size)
    p = _paths(shard_dir, name)
    lens, tokens = [], 0

    def write_ids(f):
        nonlocal tokens
        buf = []
        for text in texts:
            ids = enc(text)
            ids.append(eot)
            buf += ids
            lens.append(len(ids))
            if len(buf) >= 1 << 20:
                f.write(np.array(buf, dtype=DTYPES[dtype]).tobytes())
                tokens += len(buf)
                buf = []
        f.write(np.array(buf, dtype=DTYPES[dtype]).tobytes())
        tokens += len(buf)

    # each file whole or not at all; the shard counts only once its json (written last) is there
    atomic_write(p["ids"], write_ids)
    atomic_write(p["lens"], lambda f: f.write(np.array(lens, dtype=np.uint32).tobytes()))
    rec = {"name": name, "key": key, "docs": len(lens), "tokens": tokens, "dtype": dtype, **(stats or {})}
    atomic_json(p["json"], rec)
    return rec


# ------------------------------------------------------------------------------------------ main side

def make_shards(jobs, work, num_proc, total_bytes, done_bytes=0, desc="tokenizing", codec=None):
    """Run work(*job) for every job on num_proc worker processes; each returns a shard record, or
    {"error": msg} for bad input, which stops everything with that one line. A progress bar counts the
    compressed bytes read (workers call advance()). codec: what write_shard encodes with (None: GPT-2). Returns
    the records, in the order of jobs."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    from tqdm import tqdm
    if not jobs:
        return []
    ctx = mp.get_context("fork")  # spawn would re-run the calling script in every worker
    progress, stop = ctx.Value("q", 0), ctx.Value("b", 0)
    # not multiprocessing.Pool: it replaces a worker that dies (out of memory, kill -9) and waits forever
    # for that worker's archive; the executor reports it
    pool = ProcessPoolExecutor(min(num_proc, len(jobs)), ctx, _init_worker, (progress, stop, os.getpid(), codec))
    bar = tqdm(total=total_bytes, initial=done_bytes, unit="B", unit_scale=True, desc=desc, mininterval=1.0)
    try:
        futures = {pool.submit(work, *job): i for i, job in enumerate(jobs)}
        pending, recs = set(futures), {}
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            bar.update(done_bytes + progress.value - bar.n)
            for f in done:
                try:
                    rec = f.result()  # a bug in a worker re-raises here, with its traceback
                except BrokenProcessPool:
                    raise UserError("a tokenizer process died (killed, or out of memory?); re-run to go on: "
                                    "finished archives are kept")
                if "error" in rec:
                    raise UserError(rec["error"])
                recs[futures[f]] = rec
                bar.set_postfix(docs=f"{sum(r['docs'] for r in recs.values()):,}", refresh=False)
    finally:
        stop.value = 1
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
    return [recs[i] for i in range(len(jobs))]


def _width(dtype):
    return np.dtype(DTYPES[dtype]).itemsize


def _resumable(out_dir, state, split, dtype):
    """Does the split's file hold at least what state records? (.partial, or the bin once renamed)"""
    path, need = os.path.join(out_dir, f"{split}.bin"), _width(dtype) * state[split][1]
    if os.path.exists(path + ".partial"):
        return os.path.getsize(path + ".partial") >= need
    return state["next"] == len(state["records"]) and os.path.exists(path) and os.path.getsize(path) == need


def load_state(out_dir, fingerprint, dtype="uint16"):
    """The assembly record of an interrupted run with this fingerprint, else None (and then any partial
    bins of another run are removed). dtype: the bins' (bins.bin_dtype of the codec)."""
    try:
        with open(os.path.join(out_dir, STATE)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = {}
    if state.get("fingerprint") == fingerprint and all(_resumable(out_dir, state, s, dtype) for s in ("train", "val")):
        return state
    for f in (STATE, "train.bin.partial", "val.bin.partial"):
        if os.path.exists(os.path.join(out_dir, f)):
            os.remove(os.path.join(out_dir, f))
    return None


def new_state(out_dir, fingerprint, records):
    """Start an assembly over these shard records (in document order)."""
    state = {"fingerprint": fingerprint, "records": records, "next": 0, "train": [0, 0], "val": [0, 0]}
    atomic_json(os.path.join(out_dir, STATE), state)
    return state


def _copy(f, ids, a, b, step=1 << 24):
    for i in range(a, b, step):
        f.write(ids[i:min(b, i + step)].tobytes())


def assemble(out_dir, shard_dir, state, is_val, dtype="uint16"):
    """Write train.bin (documents with is_val False, in order) and val.bin (the others, in order) from the
    shards named in state, resuming where state says; dtype: the shards' and bins'. Returns {split: (docs,
    tokens)}."""
    width = _width(dtype)
    from tqdm import tqdm
    recs, k0 = state["records"], state["next"]
    starts = np.concatenate([[0], np.cumsum([r["docs"] for r in recs])])
    assert len(is_val) == starts[-1]
    path = {s: os.path.join(out_dir, f"{s}.bin") for s in ("train", "val")}
    files = {}
    for s in path:
        if k0 and not os.path.exists(path[s] + ".partial"):
            continue  # renamed already: the run was killed between the last record and meta.json
        files[s] = open(path[s] + ".partial", "r+b" if k0 else "wb")
        files[s].truncate(width * state[s][1])  # drop anything written after the last record
        files[s].seek(width * state[s][1])
    bar = tqdm(total=len(recs), initial=k0, unit="shard", desc="train.bin / val.bin")
    try:
        for k in range(k0, len(recs)):
            p = _paths(shard_dir, recs[k]["name"])
            ids = (np.memmap(p["ids"], dtype=DTYPES[dtype], mode="r") if recs[k]["tokens"]
                   else np.zeros(0, DTYPES[dtype]))
            lens = np.fromfile(p["lens"], dtype=np.uint32).astype(np.int64)
            ends = np.cumsum(lens)
            begins = ends - lens
            held = np.flatnonzero(is_val[starts[k]:starts[k + 1]])
            a = 0  # train takes the runs between held-out documents, val takes each held-out one
            for j in held:
                _copy(files["train"], ids, a, begins[j])
                _copy(files["val"], ids, begins[j], ends[j])
                a = ends[j]
            _copy(files["train"], ids, a, len(ids))
            del ids
            n_val, t_val = len(held), int(sum(ends[j] - begins[j] for j in held))
            state["train"] = [state["train"][0] + recs[k]["docs"] - n_val,
                              state["train"][1] + recs[k]["tokens"] - t_val]
            state["val"] = [state["val"][0] + n_val, state["val"][1] + t_val]
            state["next"] = k + 1
            for f in files.values():
                f.flush()
                os.fsync(f.fileno())
            atomic_json(os.path.join(out_dir, STATE), state)
            for f in (p["json"], p["ids"], p["lens"]):  # the json first: without it a shard does not count
                if os.path.exists(f):
                    os.remove(f)
            bar.update(1)
    except OSError as e:
        disk_full(e, f"train.bin / val.bin in {out_dir}")
    finally:
        bar.close()
        for f in files.values():
            f.close()
    for s in files:
        os.replace(path[s] + ".partial", path[s])
    return {s: tuple(state[s]) for s in path}
