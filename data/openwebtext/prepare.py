"""
OpenWebText -> data/openwebtext/{train,val}.bin + meta.json: GPT-2 BPE, EOT (50256) after every document,
uint16 token ids (nanoGPT's format: np.memmap(path, dtype=np.uint16, mode='r')). --tokenizer=<folder | hf:ID>
takes a source model's tokenizer instead (its end of document after each one, uint32 ids past 65,535,
meta.json records the dtype and the tokenizer, a copy of whose tokenizer.json goes beside it).

    python data/openwebtext/prepare.py                       # the hub's archives, via the HF cache
    python data/openwebtext/prepare.py --source=/data/owt    # the same archives fetched before (hf download,
                                                             # git lfs): a folder of urlsf_subsetNN.tar (flat
                                                             # or under subsets/), or of the .xz inside them
    python data/openwebtext/prepare.py --source=/data/owt.jsonl  # or documents in any local form: text,
                                                             # JSON lines, parquet, a save_to_disk folder, or
                                                             # a folder of such files

The hub repo Skylion007/openwebtext still holds a loading script, which `datasets` >= 4 refuses to run, so
its raw data is read directly: the 21 files subsets/urlsf_subsetNN.tar (12.9 GB), downloaded with
huggingface_hub into the HF cache (resumable; --revision is resolved to one commit for all files, and
that commit goes into meta.json), then read in place with tarfile + lzma, never extracted. Document
order and text are data/openwebtext/owt_archives.py's: archives, .xz members and .txt files by name; the
hub script's text rule (3+ newlines -> 2, stripped). Invalid UTF-8 bytes become U+FFFD: such documents
are kept and counted (printed at the end, non_utf8_docs in meta.json).
Each archive is tokenized by one of num_proc processes into a shard under out_dir/shards/; then the
held-out documents are drawn and train.bin / val.bin are assembled from the shards, each shard deleted
once copied (data/prepare_shards.py). Disk: the archives in the HF cache, plus in out_dir the bins
(nanoGPT: 17 GB + 8.5 MB) and at most one shard (~1 GB) more while they are assembled; free space is
checked first. A killed run, even by SIGKILL, resumes: it redoes at most the archives in flight, and the
bins are byte-identical to an uninterrupted run's, for any num_proc. --force=True rebuilds.
Held-out split: val_fraction of the documents (0.0005: ~4k of OpenWebText's 8,013,769, as in nanoGPT),
np.random.default_rng(seed).choice(n, n_val, replace=False) over the document index; the rest, in
order, is train (val.bin keeps the held-out ones in order too).
A plain text file gives one document per line (text_unit='paragraph' or 'document' to change that).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # data/, for prepare_common
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder, for owt_archives
import prepare_common as pc  # noqa: E402  (puts the repo root on sys.path too)

from aogpt.configurator import configure, print_config, stop_on_ctrl_c  # noqa: E402
from aogpt.errors import die, exit_in_one_line  # noqa: E402

source = 'Skylion007/openwebtext'  # HF hub repo, or a local folder / file (see above)
revision = 'main'                  # hub revision of the archives: a branch, tag or commit
split = 'train'                    # local documents: which split to read (OpenWebText only has train)
column = 'text'                    # local documents: the text column
text_unit = 'line'                 # local plain text files: a document per 'line', 'paragraph' or 'document'
val_fraction = 0.0005              # fraction of documents held out as val.bin
seed = 2357                        # seed of the held-out draw (nanoGPT's)
num_proc = min(8, os.cpu_count() or 1)  # tokenizer processes (archives in parallel)
out_dir = ''                       # '' = data/openwebtext (data/openwebtext_<name> with a tokenizer)
tokenizer = ''                     # a source model's tokenizer, not GPT-2: a folder or hf:owner/name[@rev]
eot_token = ''                     # with --tokenizer: the token ending a document, not the source's eos
force = False                      # rebuild even if out_dir is already prepared
exit_in_one_line()  # from here on a UserError is its one line, not a traceback
print_config(configure(globals()))
stop_on_ctrl_c("run the same command again to go on: what is done is kept, and the bins come out the same")

import json  # noqa: E402
import shutil  # noqa: E402

import numpy as np  # noqa: E402
import owt_archives as owt  # noqa: E402
import prepare_shards as ps  # noqa: E402

from aogpt.bins import DTYPES, bin_dtype  # noqa: E402
from aogpt.tokenizer import TOKENIZER_FILE, source_codec  # noqa: E402

if not 0 < val_fraction < 1:
    die(f"val_fraction must be in (0, 1), got {val_fraction}")
if num_proc < 1:
    die(f"num_proc must be at least 1, got {num_proc}")
# GPT-2 without --tokenizer; a bad one is one line now, not one per worker
codec, codec_source = source_codec(tokenizer, eot_token)
dtype = bin_dtype(codec.vocab_size)
width = np.dtype(DTYPES[dtype]).itemsize
out_dir = out_dir or os.path.join(pc.ROOT, "data", f"openwebtext_{pc.tokenizer_name(tokenizer)}" if tokenizer
                                  else "openwebtext")
hint = "pass a local copy: --source=/path/to/folder of the urlsf_subsetNN.tar files (or of documents)"
from_hub = source.lower() == owt.HUB_REPO.lower() and not os.path.exists(source)
archives = [] if from_hub or not os.path.exists(source) else owt.find_archives(source)

if not from_hub and not archives:  # documents in any other form: the general path, as for any corpus
    if os.path.isdir(source):
        entries = [f for f in os.listdir(source) if not f.startswith(".")]
        if not any(os.path.isfile(os.path.join(source, f)) for f in entries) or "subsets" in entries:
            die(f"{source}: no OpenWebText archives (urlsf_subsetNN.tar, flat or under subsets/, or the .xz "
                f"files inside them) and no data files (text, .jsonl, .parquet, a save_to_disk folder)")
    from aogpt.evalsets import open_documents
    ds, column = open_documents(source, split=split, column=column, text_unit=text_unit, all_files=True,
                                hint=hint)
    n = len(ds)
    if n < 2:
        die(f"{source}: {n} document(s); need at least 2 to hold one out for validation")
    n_val = min(n - 1, max(1, round(n * val_fraction)))
    is_val = np.zeros(n, dtype=bool)
    is_val[np.random.default_rng(seed).choice(n, n_val, replace=False)] = True
    splits = {"train": ds.select(np.flatnonzero(~is_val)), "val": ds.select(np.flatnonzero(is_val))}
    origin = os.path.abspath(source) if os.path.exists(source) else source
    extra = {"source_split": split, "source_documents": n, "val_fraction": val_fraction, "seed": seed,
             "source_fingerprint": getattr(ds, "_fingerprint", None)}
    print(f"{origin}: {n:,} documents -> train {n - n_val:,} / val {n_val:,}")
    pc.prepare(out_dir, splits, origin, num_proc=num_proc, force=force, column=column, extra=extra,
               codec=None if codec.name == "gpt2" else codec, codec_source=codec_source)
    sys.exit(0)

# ------------------------------------------------------------------------- OpenWebText's own archives
origin = owt.HUB_REPO if from_hub else os.path.abspath(source)
shard_dir = os.path.join(out_dir, "shards")
meta_path = os.path.join(out_dir, "meta.json")
# GPT-2's rule is spelled as before --tokenizer existed, so a prepared data/openwebtext stays prepared
tok_id = "gpt2" if codec.name == "gpt2" else f"{codec.name}:{codec.sha256}:eot={codec.eot}"
rule = {"tokenizer": tok_id, "text": owt.TEXT, "val_fraction": val_fraction, "seed": seed}
# what decides "already prepared": known before any download, so a prepared dir needs neither network
# nor the HF cache
done_fp = dict(rule, source=origin, revision=revision if from_hub else None,
               archives=None if from_hub else [[a.name, a.size] for a in archives])
if force:
    for f in ("train.bin", "val.bin", "meta.json", ps.STATE, "train.bin.partial", "val.bin.partial"):
        if os.path.exists(os.path.join(out_dir, f)):
            os.remove(os.path.join(out_dir, f))
    shutil.rmtree(shard_dir, ignore_errors=True)
if os.path.exists(meta_path):
    with open(meta_path) as f:
        meta = json.load(f)
    if meta.get("fingerprint") == done_fp and all(
            os.path.exists(os.path.join(out_dir, f"{s}.bin"))
            and os.path.getsize(os.path.join(out_dir, f"{s}.bin")) == width * meta.get(f"{s}_tokens", -1)
            for s in ("train", "val")) and (codec.name == "gpt2" or os.path.exists(os.path.join(out_dir,
                                                                                             TOKENIZER_FILE))):
        print(f"{out_dir} is already prepared (train: {meta['train_tokens']:,} tokens, val: "
              f"{meta['val_tokens']:,} tokens); nothing to do (--force=True redoes it)")
        shutil.rmtree(shard_dir, ignore_errors=True)  # left over if a run was killed at its very end
        sys.exit(0)
    print(f"rebuilding {out_dir}: {pc.rebuild_reason(meta.get('fingerprint'), done_fp)}")
    os.remove(meta_path)  # the bins are about to change: never leave a stale meta.json beside them

commit = None
if from_hub:
    commit, archives = owt.hub_archives(revision, hint)
print(f"{origin}: {len(archives)} archive(s), {sum(a.size for a in archives) / 1e9:.2f} GB"
      + (f" (commit {commit})" if commit else ""))

# shards are reused when made from an archive of the same name and size with the same tokenizer and text
# rule; the assembly record when the whole list and the held-out draw are the same
key = {a.name: {"tokenizer": tok_id, "text": owt.TEXT, "size": a.size} for a in archives}
fingerprint = dict(rule, archives=[[a.name, a.size] for a in archives])
ps.clean_temporaries(shard_dir)
state = ps.load_state(out_dir, fingerprint, dtype)
consumed = state["next"] if state else 0  # shards already in the bins (and deleted)
todo = [a for a in archives[consumed:] if ps.read_shard(shard_dir, a.name, key[a.name]) is None]
if consumed or len(todo) < len(archives):
    print(f"resuming: {len(archives) - len(todo)} of {len(archives)} archives already tokenized")

# disk: shards take ~1.4x the archives' bytes (nanoGPT's 9.04e9 tokens, 18.1 GB as uint16, from the hub's
# 12.9 GB; twice that as uint32), and one more shard while the bins are assembled; 1.5x leaves some room
need = {out_dir: int(1.5 * width / 2 * (sum(a.size for a in todo) + max(a.size for a in archives)))}
if from_hub:
    from huggingface_hub import constants
    need[constants.HF_HUB_CACHE] = sum(a.size for a in todo if a.files[0] is None)
if len(need) == 2 and pc.same_disk(*need):
    need = {out_dir: sum(need.values())}
for folder, nbytes in need.items():
    pc.check_disk(folder, nbytes, "the token shards and bins" if folder == out_dir else "the HF cache downloads")

pc.make_folder(out_dir, "out_dir")  # a file in the way: one line
os.makedirs(shard_dir, exist_ok=True)
if from_hub and any(a.files[0] is None for a in todo):
    print(f"downloading {sum(a.files[0] is None for a in todo)} archive(s) into the HF cache "
          f"({constants.HF_HUB_CACHE}); an interrupted download resumes")
    todo = [owt.hub_download(commit, a, hint) if a.files[0] is None else a for a in todo]
if todo:
    print(f"tokenizing {len(todo)} archive(s) on {min(num_proc, len(todo))} process(es) into {shard_dir}")
todo_names = {a.name for a in todo}
ps.make_shards([(a, shard_dir, key[a.name]) for a in todo], owt.tokenize, num_proc,
               total_bytes=sum(a.size for a in archives[consumed:]),
               done_bytes=sum(a.size for a in archives[consumed:] if a.name not in todo_names), codec=codec)

if state is None:
    state = ps.new_state(out_dir, fingerprint, [ps.read_shard(shard_dir, a.name, key[a.name])
                                               for a in archives])
n = sum(r["docs"] for r in state["records"])
if n < 2:
    die(f"{origin}: {n} document(s); need at least 2 to hold one out for validation")
n_val = min(n - 1, max(1, round(n * val_fraction)))
is_val = np.zeros(n, dtype=bool)
is_val[np.random.default_rng(seed).choice(n, n_val, replace=False)] = True
print(f"{n:,} documents -> train {n - n_val:,} / val {n_val:,}")
counts = ps.assemble(out_dir, shard_dir, state, is_val, dtype)

bad = sum(r.get("non_utf8", 0) for r in state["records"])
meta = {"tokenizer": codec.name, "vocab_size": codec.vocab_size, "eot": codec.eot, "dtype": dtype}
if codec.name != "gpt2":  # the dataset carries its tokenizer: get_codec checks it against this sha256
    meta.update(bos=codec.bos, tokenizer_sha256=codec.sha256, tokenizer_source=codec_source)
    pc.atomic_write(os.path.join(out_dir, TOKENIZER_FILE), lambda f: f.write(codec.tokenizer_json.encode()))
for s in ("train", "val"):
    meta[f"{s}_tokens"] = counts[s][1]
for s in ("train", "val"):
    meta[f"{s}_docs"] = counts[s][0]
meta.update(source=origin, revision=revision if from_hub else None, commit=commit, detokenizer=None,
            text=owt.TEXT, archives=len(archives), source_documents=n, val_fraction=val_fraction, seed=seed,
            non_utf8_docs=bad, non_utf8="kept, invalid bytes replaced by U+FFFD", fingerprint=done_fp)
pc.atomic_json(meta_path, meta)
os.remove(os.path.join(out_dir, ps.STATE))
shutil.rmtree(shard_dir, ignore_errors=True)
for s in ("train", "val"):
    print(f"{s}.bin: {meta[s + '_tokens']:,} tokens from {meta[s + '_docs']:,} documents")
example = next((r["first_non_utf8"] for r in state["records"] if r.get("first_non_utf8")), None)
print(f"in all: {n:,} documents, {meta['train_tokens'] + meta['val_tokens']:,} tokens; {bad:,} document(s) "
      f"not valid UTF-8 (kept, invalid bytes replaced by U+FFFD)" + (f", e.g. {example}" if example else ""))
print(f"wrote {meta_path} ({codec.name}, vocab {codec.vocab_size}, {dtype})")
