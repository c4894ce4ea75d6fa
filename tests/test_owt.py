"""data/openwebtext/prepare.py on OpenWebText's own archive layout, built here with tarfile + lzma: the bins
equal a direct GPT-2 encoding of the documents in the documented order, for every source form and any
num_proc; a SIGKILLed run resumes to the same bytes; the hub path reads a real HF cache layout offline and
downloads with huggingface_hub from a stand-in hub over HTTP; bad input is one line."""
import errno
import hashlib
import http.server
import io
import json
import lzma
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse

import numpy as np
import pytest
from helpers import processes

from aogpt.errors import UserError
from aogpt.tokenizer import gpt2_codec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "data"))
import prepare_shards as ps  # noqa: E402

PREPARE = os.path.join(ROOT, "data", "openwebtext", "prepare.py")
COMMIT = "5f7e2a1c0d9b8e7f6a5b4c3d2e1f0a9b8c7d6e5f"


# --------------------------------------------------------------------------------- a synthetic OWT

def _tar(files):
    """An uncompressed tar of (name, bytes), in the order given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _xz(files):
    return lzma.compress(_tar(files), preset=0)


def subset_tar(xzs):
    """OWT's .tar: .xz members under openwebtext/, each an xz-compressed tar of .txt files."""
    return _tar([(f"openwebtext/{x}", _xz(files)) for x, files in xzs.items()])


def write_tars(folder, layout):
    os.makedirs(folder, exist_ok=True)
    for subset, xzs in layout.items():
        with open(os.path.join(folder, f"{subset}.tar"), "wb") as f:
            f.write(subset_tar(xzs))


def write_xzs(folder, layout):
    """What `tar -xf` of every subset leaves: openwebtext/<subset>-<k>_data.xz."""
    os.makedirs(folder, exist_ok=True)
    for xzs in layout.values():
        for x, files in xzs.items():
            with open(os.path.join(folder, x), "wb") as f:
                f.write(_xz(files))


def _words(rng, n):
    w = np.array("the of and to in a is that for it as was with be by on not he this are or his from at "
                 "which but have an they you were her she there one all we can".split())
    return " ".join(w[rng.integers(0, len(w), n)])


def small_layout():
    """Two subsets, three .xz each, written out of sorted order (names and members alike), with an empty
    document, an invalid UTF-8 one, runs of newlines, and members that are not documents."""
    rng = np.random.default_rng(0)
    layout, k = {}, 0
    for subset in ["urlsf_subset01", "urlsf_subset00"]:
        layout[subset] = {}
        for part in [3, 1, 20]:
            files = []
            for m in [7, 2, 9, 4]:
                text = f"Doc {k} caf\u00e9 \U0001F642\n\n\n\n{_words(rng, int(rng.integers(3, 120)))}\n\n\nend \n"
                files.append((f"{part:03d}{m}{k:03d}-{k * 7919 % 1000:03x}.txt", text.encode()))
                k += 1
            layout[subset][f"{subset}-{part}_data.xz"] = files
    x = layout["urlsf_subset00"]["urlsf_subset00-1_data.xz"]
    x += [("0010001-empty.txt", b""), ("0010000-latin1.txt", b"na\xefve caf\xe9\n"),
          ("._0010002-resource-fork.txt", b"not a document"), ("0010003-notes.md", b"not a document")]
    return layout


def documented_docs(layout):
    """The documents in the documented order, with the documented text rule, written out independently."""
    docs = []
    for subset in sorted(layout):
        for x in sorted(layout[subset]):
            for name, raw in sorted(layout[subset][x]):
                if name.endswith(".txt") and not name.startswith((".", "__")):
                    docs.append(re.sub(r"\n{3,}", "\n\n", raw.decode("utf-8", errors="replace")).strip())
    return docs


def documented_bins(docs, val_fraction, seed=2357, codec=None, dtype=np.uint16):
    enc = codec or gpt2_codec()
    n = len(docs)
    n_val = min(n - 1, max(1, round(n * val_fraction)))
    held = set(np.random.default_rng(seed).choice(n, n_val, replace=False).tolist())
    out = {"train": [], "val": []}
    for i, d in enumerate(docs):
        out["val" if i in held else "train"] += enc.encode(d) + [enc.eot]
    return {s: np.array(v, dtype=dtype).tobytes() for s, v in out.items()}


def run(*args, env=None, timeout=120, hub_reachable=False):
    """prepare.py in a subprocess, offline unless env says otherwise; hub_reachable=True overrides the
    hub probe (huggingface.co itself is out of reach here), for a stand-in hub at HF_ENDPOINT."""
    e = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TQDM_DISABLE": "1", **(env or {})}
    cmd = [sys.executable, PREPARE]
    if hub_reachable:
        cmd = [sys.executable, "-c", "from aogpt import hub; import runpy, sys; hub.hub_reachable = lambda timeout=1.5: True; "
               f"sys.argv[0] = {PREPARE!r}; runpy.run_path(sys.argv[0], run_name='__main__')"]
    return subprocess.run(cmd + [str(a) for a in args], cwd=ROOT, env=e, capture_output=True, text=True,
                          timeout=timeout)


def bins(out):
    return {s: (out / f"{s}.bin").read_bytes() for s in ("train", "val")}


def one_error_line(r):
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(err) == 1 and err[0].startswith("error: "), r.stderr
    return err[0]


# --------------------------------------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("owt")
    layout = small_layout()
    write_tars(root / "tars", layout)
    r = run(f"--source={root / 'tars'}", f"--out_dir={root / 'out'}", "--val_fraction=0.1", "--num_proc=2")
    assert r.returncode == 0, r.stderr
    return root, layout, r


def test_bins_are_the_documents_in_the_documented_order(small):
    root, layout, r = small
    docs = documented_docs(layout)
    assert len(docs) == 26 and "" in docs and "na\ufffdve caf\ufffd" in docs
    assert bins(root / "out") == documented_bins(docs, 0.1)
    meta = json.loads((root / "out" / "meta.json").read_text())
    assert (meta["train_docs"], meta["val_docs"], meta["source_documents"]) == (23, 3, 26)
    assert meta["train_tokens"] == os.path.getsize(root / "out" / "train.bin") // 2
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot"]) == ("gpt2", 50257, 50256)
    assert meta["non_utf8_docs"] == 1 and meta["source"] == str(root / "tars") and meta["archives"] == 2
    assert "1 document(s) not valid UTF-8 (kept, invalid bytes replaced by U+FFFD)" in r.stdout
    assert "0010000-latin1.txt" in r.stdout
    assert not (root / "out" / "shards").exists() and not (root / "out" / ps.STATE).exists()
    r = run(f"--source={root / 'tars'}", f"--out_dir={root / 'out'}", "--val_fraction=0.1")
    assert r.returncode == 0 and "already prepared" in r.stdout


def test_a_source_tokenizer_past_65535_gives_uint32_bins_of_the_same_documents(tmp_path):
    """--tokenizer on the archives path: the shards and bins are uint32 (every id of this BPE is past 65,535), the
    documents in the documented order, each followed by the source's end of document, for two processes; the
    tokenizer.json is kept beside meta.json, which records it and the dtype."""
    from test_tokenizers import offset_bpe

    from aogpt.tokenizer import get_codec, source_codec
    layout = small_layout()
    write_tars(tmp_path / "tars", layout)
    src = offset_bpe(tmp_path / "tok")
    r = run(f"--source={tmp_path / 'tars'}", f"--out_dir={tmp_path / 'out'}", "--val_fraction=0.1", "--num_proc=2",
            f"--tokenizer={src}")
    assert r.returncode == 0, r.stderr
    codec = source_codec(src)[0]
    assert bins(tmp_path / "out") == documented_bins(documented_docs(layout), 0.1, codec=codec, dtype=np.uint32)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert (meta["dtype"], meta["eot"], meta["tokenizer_source"]) == ("uint32", 70_000, src)
    assert meta["train_tokens"] == os.path.getsize(tmp_path / "out" / "train.bin") // 4
    assert get_codec(tmp_path / "out").record() == codec.record()
    r = run(f"--source={tmp_path / 'tars'}", f"--out_dir={tmp_path / 'out'}", "--val_fraction=0.1",
            f"--tokenizer={src}")
    assert r.returncode == 0 and "already prepared" in r.stdout


@pytest.mark.parametrize("form", ["archives", "jsonl"])
def test_a_rebuild_says_what_changed(small, tmp_path, form):
    """--val_fraction changed on a prepared dir: the bins are rebuilt, and the run says why."""
    root, layout, _ = small
    src = root / "tars"
    if form == "jsonl":
        src = tmp_path / "docs.jsonl"
        src.write_text("".join(json.dumps({"text": d}) + "\n" for d in documented_docs(layout)))
    out = tmp_path / "out"
    assert run(f"--source={src}", f"--out_dir={out}", "--val_fraction=0.1").returncode == 0
    r = run(f"--source={src}", f"--out_dir={out}", "--val_fraction=0.2")
    assert r.returncode == 0 and f"rebuilding {out}: " in r.stdout and "val_fraction 0.1 -> 0.2" in r.stdout, r.stdout


def test_every_source_form_and_num_proc_give_the_same_bins(small, tmp_path):
    root, layout, _ = small
    write_tars(tmp_path / "repo" / "subsets", layout)       # hf download --local-dir, git lfs clone
    (tmp_path / "repo" / "README.md").write_text("the hub repo's card, not data")
    write_xzs(tmp_path / "x" / "openwebtext", layout)        # the tars' members, extracted
    for src, nproc in [(tmp_path / "repo", 1), (tmp_path / "x", 2), (tmp_path / "x" / "openwebtext", 1)]:
        out = tmp_path / f"out-{src.name}-{nproc}"
        r = run(f"--source={src}", f"--out_dir={out}", "--val_fraction=0.1", f"--num_proc={nproc}")
        assert r.returncode == 0, r.stderr
        assert bins(out) == bins(root / "out"), src


def test_documents_still_load_through_the_general_path(tmp_path):
    docs = [f"document {i}\nwith two lines" for i in range(20)]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:12]))
    (tmp_path / "docs" / "b.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[12:]))
    r = run(f"--source={tmp_path / 'docs'}", f"--out_dir={tmp_path / 'out'}", "--val_fraction=0.1",
            "--num_proc=1", env={"HF_HOME": str(tmp_path / "hf")})
    assert r.returncode == 0, r.stderr
    assert bins(tmp_path / "out") == documented_bins(docs, 0.1)


def big_layout(n_subsets=8, words=250_000):
    """Enough text that each archive takes a visible fraction of a second to tokenize."""
    rng = np.random.default_rng(1)
    return {f"urlsf_subset{s:02d}": {f"urlsf_subset{s:02d}-{p}_data.xz":
                                     [(f"{d:07d}.txt", _words(rng, words // 8).encode()) for d in range(4)]
                                     for p in (1, 2)} for s in range(n_subsets)}


def stopped_mid_prepare(tmp_path, out, **popen):
    """The big layout prepared once whole (into tmp_path/clean), then again into `out`, returned running
    once its first shard is written: (the arguments of both runs, the running process)."""
    write_tars(tmp_path / "src", big_layout())
    args = [f"--source={tmp_path / 'src'}", "--val_fraction=0.01", "--num_proc=2"]
    r = run(*args, f"--out_dir={tmp_path / 'clean'}")
    assert r.returncode == 0, r.stderr
    env = dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1")
    p = subprocess.Popen([sys.executable, PREPARE, *args, f"--out_dir={out}"], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, **popen)
    deadline = time.time() + 60
    while not list(out.glob("shards/*.json")) and p.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    return args, p


def test_sigkill_mid_prepare_resumes_to_the_same_bins(tmp_path):
    out = tmp_path / "killed"
    args, p = stopped_mid_prepare(tmp_path, out, stderr=subprocess.DEVNULL)
    p.send_signal(signal.SIGKILL)  # the main process only: its workers are orphaned mid-archive
    assert p.wait() == -signal.SIGKILL, "prepare.py finished before it could be killed"
    assert not (out / "meta.json").exists() and not (out / "train.bin").exists()
    # its workers die with it: an idle one must not wait forever on the task queue (its siblings hold the pipe)
    deadline = time.time() + 15
    while processes(f"--out_dir={out}") and time.time() < deadline:
        time.sleep(0.1)
    left = processes(f"--out_dir={out}")
    for q in left:
        os.kill(q, signal.SIGKILL)
    assert left == [], "workers outlived their SIGKILLed parent"

    r = run(*args, f"--out_dir={out}")
    assert r.returncode == 0, r.stderr
    done = int(re.search(r"resuming: (\d) of 8 archives already tokenized", r.stdout).group(1))
    assert 1 <= done < 8 and f"tokenizing {8 - done} archive(s)" in r.stdout
    assert bins(out) == bins(tmp_path / "clean")
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]


def test_ctrl_c_mid_prepare_is_one_line_and_status_130_then_resumes(tmp_path):
    """Ctrl-C reaches the whole process group (the workers too): one line, exit 130, no traceback from any
    process; the same command then finishes with the bins of an uninterrupted run."""
    out = tmp_path / "stopped"
    args, p = stopped_mid_prepare(tmp_path, out, text=True, stderr=subprocess.PIPE, start_new_session=True)
    os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    err = [ln for ln in p.communicate(timeout=60)[1].splitlines() if ln.strip()]
    assert p.returncode == 130 and len(err) == 1 and err[0].startswith("interrupted: run the same command again"), err
    r = run(*args, f"--out_dir={out}")
    assert r.returncode == 0, r.stderr
    assert bins(out) == bins(tmp_path / "clean")


def test_sizes_are_said_in_the_unit_that_fits():
    import prepare_common as pc
    assert [pc.human_bytes(n) for n in (0, 999, 4_300, 1_234_567, 17e9)] == ["0 bytes", "999 bytes", "4.3 kB",
                                                                               "1.23 MB", "17 GB"]


def _children(pid):
    kids = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                if d.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return kids


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the worker processes through /proc")
def test_a_worker_killed_is_one_line_not_a_hang(tmp_path):
    write_tars(tmp_path / "src", big_layout(n_subsets=4))
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, PREPARE, f"--source={tmp_path / 'src'}", f"--out_dir={out}",
                          "--num_proc=2"], cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not _children(p.pid) and p.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    os.kill(_children(p.pid)[0], signal.SIGKILL)  # as the out-of-memory killer would
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1 and err.strip().splitlines() == [
        "error: a tokenizer process died (killed, or out of memory?); re-run to go on: finished archives are kept"]


TEXTS = [[f"archive {a} document {d} " * (d + 1) for d in range(9)] for a in range(4)]
IS_VAL = np.isin(np.arange(36), [0, 5, 9, 10, 22, 35])


def _shards(out):
    os.makedirs(out / "shards")
    return [ps.write_shard(str(out / "shards"), f"a{a}", {}, t) for a, t in enumerate(TEXTS)]


def _assembled(out, fp):
    ps.assemble(str(out), str(out / "shards"), ps.new_state(str(out), fp, _shards(out)), IS_VAL)
    return bins(out)


def test_assembly_killed_midway_resumes_to_the_same_bins(tmp_path, monkeypatch):
    texts, is_val, fp = TEXTS, IS_VAL, {"test": 1}
    clean = _assembled(tmp_path / "clean", fp)

    out = tmp_path / "killed"
    state = ps.new_state(str(out), fp, _shards(out))
    real_remove, removed = os.remove, []

    def dies_on_the_third_shard(path):
        removed.append(path)
        if len(removed) == 7:  # json, ids, lens of shards 0 and 1; then shard 2's json
            raise KeyboardInterrupt
        real_remove(path)

    monkeypatch.setattr(os, "remove", dies_on_the_third_shard)
    with pytest.raises(KeyboardInterrupt):
        ps.assemble(str(out), str(out / "shards"), state, is_val)
    monkeypatch.setattr(os, "remove", real_remove)
    with open(out / "train.bin.partial", "ab") as f:
        f.write(b"\xff" * 100_000)  # what a crash left after the last record: more than is still to come
    state = ps.load_state(str(out), fp)
    assert state["next"] == 3 and sorted(os.listdir(out / "shards"))[0].startswith("a2")
    counts = ps.assemble(str(out), str(out / "shards"), state, is_val)
    assert bins(out) == clean
    enc = gpt2_codec()
    want = [enc.encode(t) + [50256] for a in texts for t in a]
    assert counts["val"] == (6, sum(len(want[i]) for i in np.flatnonzero(is_val)))
    assert (out / "val.bin").read_bytes() == np.array(sum((want[i] for i in np.flatnonzero(is_val)), []),
                                                      dtype=np.uint16).tobytes()


def test_assembly_after_a_full_disk_or_a_kill_between_the_renames(tmp_path, monkeypatch):
    fp = {"test": 2}
    clean = _assembled(tmp_path / "clean", fp)
    out = tmp_path / "full"
    state = ps.new_state(str(out), fp, _shards(out))
    real_copy, calls = ps._copy, []

    def disk_fills_up(f, ids, a, b):
        calls.append(1)
        if len(calls) == 9:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_copy(f, ids, a, b)

    monkeypatch.setattr(ps, "_copy", disk_fills_up)
    with pytest.raises(UserError, match="disk full while writing train.bin / val.bin .* resumes"):
        ps.assemble(str(out), str(out / "shards"), state, IS_VAL)
    monkeypatch.setattr(ps, "_copy", real_copy)
    state = ps.load_state(str(out), fp)
    assert 0 < state["next"] < 4
    ps.assemble(str(out), str(out / "shards"), state, IS_VAL)
    assert bins(out) == clean
    # killed after renaming train.bin but before val.bin: the record still finishes the job
    os.replace(out / "val.bin", out / "val.bin.partial")
    state = ps.load_state(str(out), fp)
    assert state["next"] == 4
    ps.assemble(str(out), str(out / "shards"), state, IS_VAL)
    assert bins(out) == clean
    # a record whose partial bins are gone cannot be resumed: start over
    os.remove(out / "train.bin")
    assert ps.load_state(str(out), fp) is None and not (out / ps.STATE).exists()


# ---------------------------------------------------------------------------------------- the hub path

def hf_cache(cache, layout, skip=()):
    """The real HF hub cache layout: refs/main -> commit; snapshots/<commit>/subsets/*.tar are symlinks to
    blobs/<sha256>. Every one of the 21 subsets is there unless named in skip."""
    repo = cache / "datasets--Skylion007--openwebtext"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "blobs").mkdir()
    snap = repo / "snapshots" / COMMIT / "subsets"
    snap.mkdir(parents=True)
    for subset, xzs in layout.items():
        if subset in skip:
            continue
        data = subset_tar(xzs)
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f"{subset}.tar").symlink_to(os.path.relpath(blob, snap))
    return snap


def tiny_21():
    return {f"urlsf_subset{s:02d}": {f"urlsf_subset{s:02d}-{p}_data.xz":
                                     [(f"{s:02d}{p}{d}.txt", f"subset {s} part {p} doc {d}".encode())
                                      for d in (2, 1)] for p in (2, 1)} for s in range(21)}


def test_hub_path_reads_the_hf_cache_offline(tmp_path):
    layout = tiny_21()
    hf_cache(tmp_path / "hub", layout)
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hub")}
    r = run(f"--out_dir={tmp_path / 'out'}", "--num_proc=2", "--val_fraction=0.05", env=env)
    assert r.returncode == 0, r.stderr
    assert bins(tmp_path / "out") == documented_bins(documented_docs(layout), 0.05)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert (meta["source"], meta["revision"], meta["commit"]) == ("Skylion007/openwebtext", "main", COMMIT)
    assert meta["source_documents"] == 21 * 4 and meta["non_utf8_docs"] == 0
    # the same files as a local folder: the same bins
    write_tars(tmp_path / "local", layout)
    r = run(f"--source={tmp_path / 'local'}", f"--out_dir={tmp_path / 'out2'}", "--val_fraction=0.05")
    assert r.returncode == 0 and bins(tmp_path / "out2") == bins(tmp_path / "out")
    # prepared: a re-run needs neither the hub nor the cache
    env["HF_HUB_CACHE"] = str(tmp_path / "gone")
    r = run(f"--out_dir={tmp_path / 'out'}", "--val_fraction=0.05", env=env)
    assert r.returncode == 0 and "already prepared" in r.stdout


class StandInHub(http.server.BaseHTTPRequestHandler):
    """Serves only what huggingface_hub asks the hub for here, over real HTTP: a revision's commit, the
    sizes of paths (paths-info), and the files themselves (HEAD, GET)."""
    files = {}

    def log_message(self, *args):
        pass

    def _reply(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?")[0]
        m = re.fullmatch(r"/api/datasets/Skylion007/openwebtext/revision/(.+)", path)
        if m and m.group(1) == "main":
            return self._reply(200, json.dumps({"id": "Skylion007/openwebtext", "sha": COMMIT}).encode())
        if m:
            return self._reply(404, b"{}", [("X-Error-Code", "RevisionNotFound")])
        m = re.fullmatch(rf"/datasets/Skylion007/openwebtext/resolve/{COMMIT}/(.+)", path)
        if m and m.group(1) in self.files:
            data = self.files[m.group(1)]
            return self._reply(200, data, [("X-Repo-Commit", COMMIT),
                                           ("ETag", f'"{hashlib.sha256(data).hexdigest()}"')])
        self._reply(404, b"{}", [("X-Error-Code", "EntryNotFound")])

    do_HEAD = do_GET

    def do_POST(self):
        form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        paths = form["paths"]
        self._reply(200, json.dumps([{"type": "file", "path": p, "size": len(self.files[p]), "oid": "0" * 40}
                                     for p in paths if p in self.files]).encode())


@pytest.fixture
def stand_in_hub():
    StandInHub.files = {f"subsets/{k}.tar": subset_tar(v) for k, v in tiny_21().items()}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_hub_path_downloads_with_huggingface_hub(tmp_path, stand_in_hub):
    env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": stand_in_hub, "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HOME": str(tmp_path / "hf")}
    r = run(f"--out_dir={tmp_path / 'out'}", "--val_fraction=0.05", env=env, hub_reachable=True)
    assert r.returncode == 0, r.stderr
    assert "downloading 21 archive(s) into the HF cache" in r.stdout
    assert bins(tmp_path / "out") == documented_bins(documented_docs(tiny_21()), 0.05)
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["commit"] == COMMIT
    # what it downloaded is an ordinary HF cache: offline, it is all a rebuild needs
    r = run(f"--out_dir={tmp_path / 'out'}", "--val_fraction=0.05", "--force=True",
            env=dict(env, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9"))
    assert r.returncode == 0 and "downloading" not in r.stdout, r.stderr
    assert bins(tmp_path / "out") == documented_bins(documented_docs(tiny_21()), 0.05)
    line = one_error_line(run(f"--out_dir={tmp_path / 'out2'}", "--revision=v9", env=env, hub_reachable=True))
    assert line.startswith("error: cannot resolve Skylion007/openwebtext@v9: RevisionNotFoundError")
    assert "--source=" in line


@pytest.mark.parametrize("cache", ["empty", "partial"])
def test_hub_offline_without_the_archives_is_one_line_naming_source(tmp_path, cache):
    if cache == "partial":
        hf_cache(tmp_path / "hub", tiny_21(), skip={"urlsf_subset07"})
    t = time.time()
    r = run(f"--out_dir={tmp_path / 'out'}", env={"HF_HOME": str(tmp_path / "hf"),
                                                   "HF_HUB_CACHE": str(tmp_path / "hub")})
    line = one_error_line(r)
    assert "--source=" in line and line.startswith("error: offline") and time.time() - t < 30
    if cache == "partial":
        assert "1 of the 21 archives" in line and "urlsf_subset07.tar" in line
    assert not (tmp_path / "out" / "train.bin").exists()


# ----------------------------------------------------------------------------------------- bad input

def _corrupt_middle(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2: len(data) // 2 + 16] = b"\x00" * 16
    path.write_bytes(bytes(data))


def _truncate(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[:keep(data)])


def _tar_cut_at_a_member(path):
    with tarfile.open(path) as tf:
        last = tf.getmembers()[-1]
    _truncate(path, lambda d: last.offset)  # a valid-looking tar, one member and the end marker short


def _bad_input(kind, tmp_path):
    """Sets up one kind of bad input; returns (--source, what the error line must say)."""
    layout = small_layout()
    rng = np.random.default_rng(0)
    noise = lambda: rng.integers(0, 256, 4000, dtype=np.uint8).tobytes()  # noqa: E731 (not UTF-8)
    if kind == "folder of random files":
        (tmp_path / "src").mkdir()
        for name in ("a.txt", "b.dat"):
            (tmp_path / "src" / name).write_bytes(noise())
        return tmp_path / "src", f"{tmp_path / 'src' / 'a.txt'} cannot be read as text data (it is not UTF-8 text)"
    if kind in ("a random file", "a folder of only .bin"):
        f = tmp_path / "src" / "x.bin" if kind.endswith(".bin") else tmp_path / "random"
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(noise())
        return (f.parent if kind.endswith(".bin") else f), f"{f} cannot be read as text data (it is not UTF-8"
    if kind == "a .jsonl with a bad line":
        f = tmp_path / "docs.jsonl"
        f.write_text('{"text": "one"}\n{"text": "two\n{"text": "three"}\n')
        return f, f"{f} cannot be read as json data ("
    if kind == "empty folder":
        (tmp_path / "src" / "subsets").mkdir(parents=True)
        return tmp_path / "src", "no OpenWebText archives"
    if kind in ("corrupt xz", "truncated xz"):
        write_xzs(tmp_path / "src", layout)
        bad = tmp_path / "src" / "urlsf_subset01-20_data.xz"
        _corrupt_middle(bad) if kind == "corrupt xz" else _truncate(bad, lambda d: len(d) * 2 // 3)
        return tmp_path / "src", f"{bad}: corrupt or truncated"
    write_tars(tmp_path / "src", layout)
    tar = tmp_path / "src" / "urlsf_subset01.tar"
    if kind == "truncated tar":
        _tar_cut_at_a_member(tar)
        return tmp_path / "src", f"{tar}: corrupt or truncated"
    if kind == "xz corrupt inside a tar":
        with tarfile.open(tar) as tf:
            m = [m for m in tf.getmembers() if m.name.endswith("-3_data.xz")][0]
        data = bytearray(tar.read_bytes())
        data[m.offset_data + m.size // 2] ^= 0xFF
        tar.write_bytes(bytes(data))
        return tmp_path / "src", f"{tar}:openwebtext/urlsf_subset01-3_data.xz: corrupt or truncated"
    if kind == "git-lfs pointer":
        tar.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 633789440\n")
        return tmp_path / "src", "is a git-lfs pointer, not the archive: fetch the data (git lfs pull"
    if kind == "tar of something else":
        tar.write_bytes(_tar([("photos/cat.jpg", b"\xff\xd8 not text")]))
        return tmp_path / "src", "no .xz members, so not an OpenWebText archive"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["empty folder", "corrupt xz", "truncated xz", "truncated tar",
                                  "xz corrupt inside a tar", "git-lfs pointer", "tar of something else",
                                  "folder of random files", "a random file", "a folder of only .bin",
                                  "a .jsonl with a bad line"])
def test_bad_archives_are_one_line(tmp_path, kind):
    src, says = _bad_input(kind, tmp_path)
    line = one_error_line(run(f"--source={src}", f"--out_dir={tmp_path / 'out'}", "--num_proc=2"))
    assert says in line, line
    if "corrupt or truncated" in says:
        assert "delete" in line and "download it again" in line
    assert not (tmp_path / "out" / "train.bin").exists() and not (tmp_path / "out" / "meta.json").exists()


def test_truncated_file_in_the_hf_cache_says_so(tmp_path):
    snap = hf_cache(tmp_path / "hub", tiny_21())
    blob = os.path.realpath(snap / "urlsf_subset03.tar")
    _tar_cut_at_a_member(snap / "urlsf_subset03.tar")
    r = run(f"--out_dir={tmp_path / 'out'}", env={"HF_HOME": str(tmp_path / "hf"),
                                                   "HF_HUB_CACHE": str(tmp_path / "hub")})
    line = one_error_line(r)
    assert "urlsf_subset03.tar: corrupt or truncated" in line and f"in the HF cache: delete {blob}" in line


def test_config_and_disk_errors_are_one_line(tmp_path):
    write_tars(tmp_path / "src", small_layout())
    assert "val_fraction must be in (0, 1)" in one_error_line(run(f"--source={tmp_path / 'src'}",
                                                                  "--val_fraction=0"))
    # a full disk is found before anything is written
    wrapper = ("import runpy, shutil, sys; "
               "shutil.disk_usage = lambda p: shutil._ntuple_diskusage(1e12, 1e12, 1000); "
               f"sys.argv = [{PREPARE!r}, {'--source=' + str(tmp_path / 'src')!r}, "
               f"{'--out_dir=' + str(tmp_path / 'out')!r}]; runpy.run_path(sys.argv[0], run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", wrapper], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, TQDM_DISABLE="1"))
    assert "not enough disk for the token shards and bins" in one_error_line(r)
    assert not list((tmp_path / "out").glob("**/*.*"))


def test_help_lists_the_keys_and_the_policies():
    r = subprocess.run([sys.executable, PREPARE, "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0
    for s in ("--revision", "--source", "--num_proc", "U+FFFD", "SIGKILL", "urlsf_subsetNN.tar"):
        assert s in r.stdout, s
