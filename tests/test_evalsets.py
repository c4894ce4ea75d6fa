"""Eval sets with today's hub (datasets >= 4): the ccdv copies of arXiv/PubMed, reading one split of a hub
repo from an HF cache laid out as huggingface_hub lays it out (offline, in a fresh process), the revision
pins and what was read, the hub probe against real local HTTP servers, and the one-line errors."""
import hashlib
import http.server
import io
import json
import os
import socket
import subprocess
import sys
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import hub_cache

from aogpt import evalsets
from aogpt.errors import UserError
from aogpt.evalsets import EVAL_SETS, lm1b_detokenize, load_eval_chunks, parse_revisions, scientific_detokenize
from aogpt.tokenizer import get_codec, gpt2_encoding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EOT = 50256


def stream(docs, detok):
    """The eval protocol by hand: each document detokenized, GPT-2 encoded, then EOT."""
    enc = gpt2_encoding()
    return [i for d in docs for i in enc.encode_ordinary(detok(d) if detok else d) + [EOT]]


def parquet(**columns):
    buf = io.BytesIO()
    pq.write_table(pa.table(columns), buf)
    return buf.getvalue()


def commit(tag):
    return hashlib.sha1(tag.encode()).hexdigest()


def offline_env(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
               HF_HUB_CACHE=str(tmp_path / "hub"), HF_DATASETS_DISABLE_PROGRESS_BARS="1")
    env.pop("HF_DATASETS_CACHE", None)
    return env


# A corrupt parquet file: any code path that reads it fails, so a split that loads did not read it.
TRAP = b"PAR1 this is not a parquet file PAR1"
README = """---
configs:
{}
---
# a dataset card
"""


def config_yaml(name, splits):
    return (f"- config_name: {name}\n  data_files:\n" +
            "".join(f"  - split: {s}\n    path: {name if name != 'default' else 'data'}/{s}-*\n" for s in splits))


# ------------------------------------------------------------------------------ arXiv / PubMed (ccdv)

ARTICLES = ["we study the cat @-@ like thing ( see fig . 1 ) . \nit 's fine .",
            "the model , trained on @xmath0 tokens , improves by 3 @.@ 5 points . \nwe do n't know why ."]


@pytest.mark.parametrize("name", ["arxiv", "pubmed"])
def test_ccdv_and_scientific_papers_local_copies(tmp_path, monkeypatch, name):
    """A local copy in the ccdv schema (article, abstract) or in scientific_papers' (article, abstract,
    section_names) gives the chunks of a direct encoding of the detokenized articles + EOT."""
    import datasets
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    codec = get_codec(None)
    want = stream(ARTICLES, scientific_detokenize)
    ccdv = tmp_path / "ccdv_test.parquet"
    ccdv.write_bytes(parquet(article=ARTICLES, abstract=["a", "b"]))
    old = tmp_path / "scientific_papers_test.jsonl"
    old.write_text("".join(json.dumps({"article": a, "abstract": "x", "section_names": "intro\nend"}) + "\n"
                           for a in ARTICLES))
    for path in (ccdv, old):
        ds, col = evalsets.open_documents(str(path))
        assert col == "article" and list(ds[col]) == ARTICLES
        record = {}
        x = load_eval_chunks(name, codec, 7, path=str(path), keep_partial=True, record=record)
        assert [i for i in x.flatten().tolist() if i >= 0] == want
        assert x.shape[1] == 7 and record == {"path": str(path)}
    assert EVAL_SETS[name].hub == f"ccdv/{name}-summarization" and EVAL_SETS[name].config == "document"


# ------------------------------------------------------------------------ hub repos from the HF cache

LM1B = ["The cat sat on the mat .", "It 's \" fine \" , he said ( twice ) .", "Prices rose 5 % in May ."]
ARXIV_PIN = ["pinned article one . \nsecond line .", "pinned article two ."]
ARXIV_MAIN = ["a newer article on main ."]
AG = ["Stocks rally as oil falls.", "Team wins the cup."]


def fill_cache(hub):
    pin = EVAL_SETS["arxiv"].revision
    assert pin and len(pin) == 40  # the test below reads the pinned commit from the cache
    lm1b = README.format(config_yaml("default", ["train", "test"]))
    hub_cache(hub, "dvruette/lm1b", sha=commit("lm1b"), repo_type='dataset', files={
        "README.md": lm1b, "data/test-00000-of-00001.parquet": parquet(text=LM1B),
        "data/train-00000-of-00002.parquet": TRAP, "data/train-00001-of-00002.parquet": TRAP})
    ccdv = README.format(config_yaml("document", ["train", "validation", "test"]) +
                         config_yaml("section", ["train", "validation", "test"]))
    arxiv = {"README.md": ccdv, "document/train-00000-of-00015.parquet": TRAP,
             "document/validation-00000-of-00001.parquet": TRAP}  # section/ never downloaded
    hub_cache(hub, "ccdv/arxiv-summarization", sha=pin, repo_type='dataset', files=dict(arxiv, **{
        "document/test-00000-of-00001.parquet": parquet(article=ARXIV_PIN, abstract=["x", "y"])}), refs=())
    hub_cache(hub, "ccdv/arxiv-summarization", sha=commit("arxiv main"), repo_type='dataset', files=dict(
        arxiv, **{"document/test-00000-of-00001.parquet": parquet(article=ARXIV_MAIN, abstract=["z"])}))
    # no README: splits come from the file names
    hub_cache(hub, "fancyzhx/ag_news", sha=commit("ag_news"), repo_type='dataset', files={
        "data/test-00000-of-00001.parquet": parquet(text=AG, label=[2, 1]),
        "data/train-00000-of-00001.parquet": TRAP, ".gitattributes": "*.parquet filter=lfs\n"})


READ = """
import json, sys
from aogpt import evalsets
from aogpt.errors import UserError
from aogpt.tokenizer import get_codec
out = {}
for key, name, split, rev in json.loads(sys.argv[1]):
    record = {}
    try:
        x = evalsets.load_eval_chunks(name, get_codec(None), 8, split=split, keep_partial=True,
                                      revision=rev, record=record)
        out[key] = {"ids": [i for i in x.flatten().tolist() if i >= 0], "record": record}
    except UserError as e:
        out[key] = {"error": e.msg}
    except Exception as e:  # reading a trap file
        out[key] = {"crash": type(e).__name__}
print("RESULT " + json.dumps(out))
"""


def test_hub_sets_read_offline_from_the_hf_cache(tmp_path):
    """In a fresh process with HF_HUB_OFFLINE=1 and HF_HUB_CACHE set before import: each set reads exactly
    its split's files at the pinned (or asked) revision, records the commit read, and never opens the
    train files (corrupt here: the same loader fails when asked for the train split)."""
    fill_cache(tmp_path / "hub")
    pin = EVAL_SETS["arxiv"].revision
    queries = [("lm1b", "lm1b", None, None), ("lm1b_train", "lm1b", "train", None),
               ("arxiv", "arxiv", None, None), ("arxiv_main", "arxiv", None, "main"),
               ("ag_news", "ag_news", None, None), ("lm1b_v9", "lm1b", None, "v9"),
               ("pubmed", "pubmed", None, None)]
    r = subprocess.run([sys.executable, "-c", READ, json.dumps(queries)], cwd=ROOT, env=offline_env(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("RESULT ", 1)[1])
    lm1b = out["lm1b"]
    assert lm1b["ids"] == stream(LM1B, lm1b_detokenize)
    assert lm1b["record"] == {"hub": "dvruette/lm1b", "config": None, "split": "test", "revision": "main",
                              "commit": commit("lm1b")}
    assert "cannot be read as" in out["lm1b_train"]["error"]  # the trap is live: reading train would have failed
    assert out["arxiv"]["ids"] == stream(ARXIV_PIN, scientific_detokenize)
    assert out["arxiv"]["record"]["commit"] == out["arxiv"]["record"]["revision"] == pin
    assert out["arxiv_main"]["ids"] == stream(ARXIV_MAIN, scientific_detokenize)
    assert out["arxiv_main"]["record"]["commit"] == commit("arxiv main")
    assert out["ag_news"]["ids"] == stream(AG, None)
    assert out["ag_news"]["record"]["commit"] == commit("ag_news")
    err = out["lm1b_v9"]["error"]  # a revision the cache lacks: say what it does hold
    assert "offline and not in the HF cache" in err and f"main={commit('lm1b')[:7]}" in err and "path=" in err
    assert "ccdv/pubmed-summarization" in out["pubmed"]["error"] and "\n" not in out["pubmed"]["error"]


def test_eval_ppl_json_records_the_commit_read(tmp_path):
    from test_eval import make_ckpt
    fill_cache(tmp_path / "hub")
    make_ckpt(tmp_path / "out")
    out = tmp_path / "r.json"
    cmd = [sys.executable, "eval_ppl.py", "--out_dir", str(tmp_path / "out"), "--datasets", "lm1b,ag_news",
           "--block_size", "8", "--revisions", "lm1b=main", "--progress", "False", "--json_out", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, env=offline_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    sets = json.loads(out.read_text())["datasets"]
    assert sets["lm1b"]["source"] == {"hub": "dvruette/lm1b", "config": None, "split": "test",
                                      "revision": "main", "commit": commit("lm1b")}
    assert sets["ag_news"]["source"]["commit"] == commit("ag_news")
    assert sets["lm1b"]["tokens"] == len(stream(LM1B, lm1b_detokenize)) // 8 * 8


def test_script_only_repos_name_their_replacement(tmp_path):
    """A repo that still holds only a loading script: one line on stderr naming what to read instead."""
    hub = tmp_path / "hub"
    hub_cache(hub, "armanc/scientific_papers", sha=commit("sp"), repo_type='dataset', files={
        "README.md": "# scientific papers\n", "scientific_papers.py": "import datasets\n"})
    hub_cache(hub, "Skylion007/openwebtext", sha=commit("owt"), repo_type='dataset', files={
        "openwebtext.py": "import datasets\n", "subsets/urlsf_subset00.tar": b"\0" * 512})
    for args, names in ([["arxiv", "--path=armanc/scientific_papers"], "ccdv/arxiv-summarization"],
                        [["owt", "--path=Skylion007/openwebtext", "--split=train"],
                         "data/openwebtext/prepare.py"]):
        r = subprocess.run([sys.executable, "-m", "aogpt.evalsets", *args], cwd=ROOT, env=offline_env(tmp_path),
                           capture_output=True, text=True, timeout=120)
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 1 and len(err) == 1 and err[0].startswith("error: "), r.stderr[-2000:]
        assert "loading script" in err[0] and names in err[0]


def test_split_files_follow_the_datasets_conventions(tmp_path):
    from aogpt.hub import split_files
    card = tmp_path / "README.md"
    card.write_text(README.format("- config_name: en\n  data_files: en/*.parquet\n"
                                  "- config_name: all\n  default: true\n  data_files:\n"
                                  "  - split: test\n    path: [de/test-*, en/test-*]\n"))
    listing = ["README.md", "de/test-0.parquet", "en/test-0.parquet", "en/x/test-1.parquet", "en/index.duckdb"]
    assert split_files("o/r", listing, str(card), None, "test") == ["de/test-0.parquet", "en/test-0.parquet"]
    assert split_files("o/r", listing, str(card), "en", "train") == ["en/test-0.parquet"]  # `*` stops at '/'
    with pytest.raises(UserError, match=r"has configs \['en', 'all'\], not 'fr'"):
        split_files("o/r", listing, str(card), "fr", "test")
    with pytest.raises(UserError, match=r"has splits \['test'\], not 'validation'"):
        split_files("o/r", listing, str(card), None, "validation")
    # no card: the split is the one a folder or file name says; names that say none are all train
    plain = ["data/train-00000.parquet", "data/test-00000.parquet", "eval/a.jsonl", "lambada_test.jsonl",
             "notes.txt", ".gitattributes"]
    assert split_files("o/r", plain, None, None, "test") == ["data/test-00000.parquet", "eval/a.jsonl",
                                                             "lambada_test.jsonl"]
    assert split_files("o/r", ["a.parquet", "b.parquet"], None, None, "train") == ["a.parquet", "b.parquet"]
    with pytest.raises(UserError, match="loading script"):
        split_files("o/r", ["r.py", "data/test.parquet"], None, None, "test")


# ------------------------------------------------------------------------------------ revisions

def test_revision_overrides_parse_and_bad_ones_are_one_line(capsys):
    assert parse_revisions("") == {}
    assert parse_revisions(" lambada = abc123 ,lm1b=main") == {"lambada": "abc123", "lm1b": "main"}
    for bad, says in [("wikitext=abc", "'wikitext' is not an eval set read from the HF hub"),
                      ("ptb=abc", "'ptb' is not an eval set read from the HF hub"),
                      ("lambada", "name=revision"), ("lambada=", "name=revision")]:
        with pytest.raises(UserError, match=says):
            parse_revisions(bad)
    import eval_ppl as E
    for argv, says in [(["--revisions", "wikitext=abc"], "--revisions: 'wikitext' is not an eval set"),
                       (["--revisions", "lm1b=main", "--datasets", "ptb"], "not in --datasets")]:
        with pytest.raises(SystemExit) as e:  # refused before any checkpoint is looked for
            E.main(argv + ["--out_dir", "/no/such/dir", "--progress", "False"])
        err = capsys.readouterr().err.strip()
        assert e.value.code != 0 and len(err.splitlines()) == 1 and says in err
    with pytest.raises(UserError, match="no revision"):
        evalsets.eval_documents("ptb", revision="main")


# ---------------------------------------------------------------------------------- the hub probe

class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request with 200, a proxy's CONNECT with 502; records each request line."""
    seen = []

    def do_HEAD(self):
        Recorder.seen.append(self.requestline)
        self.send_response(200)
        self.end_headers()

    do_GET = do_HEAD

    def do_CONNECT(self):
        Recorder.seen.append(self.requestline)
        self.send_response(502)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    Recorder.seen = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    return port


PROBE = ("import json, time; from aogpt import hub; t = time.time(); ok = hub.hub_reachable(); "
         "print(json.dumps([ok, time.time() - t]))")


def probe(**env):
    base = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("HF_")}
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=dict(base, **env), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_probe_asks_the_endpoint_huggingface_hub_uses(server):
    ok, _ = probe(HF_ENDPOINT=f"http://127.0.0.1:{server}")
    assert ok and any(line.startswith("HEAD / ") for line in Recorder.seen)
    Recorder.seen.clear()
    ok, _ = probe(HF_ENDPOINT=f"http://127.0.0.1:{server}", HF_HUB_OFFLINE="1")
    assert not ok and Recorder.seen == []  # offline: not even asked


def test_probe_fails_fast_when_the_endpoint_does_not_answer():
    ok, took = probe(HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")  # connection refused
    assert not ok and took < 2
    silent = socket.socket()  # accepts connections (the kernel does), never answers a request
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        ok, took = probe(HF_ENDPOINT=f"http://127.0.0.1:{silent.getsockname()[1]}")
    finally:
        silent.close()
    assert not ok and took < 2.5  # the 1.5 s timeout, not ~20 s of retries


def test_probe_goes_through_the_proxy(server):
    """A mirror reachable only through a proxy: ALL_PROXY makes it reachable (the proxy sees the request);
    HTTPS_PROXY is where an https endpoint's CONNECT goes."""
    closed = free_port()
    assert not probe(HF_ENDPOINT=f"http://127.0.0.2:{closed}")[0]
    ok, _ = probe(HF_ENDPOINT=f"http://127.0.0.2:{closed}", ALL_PROXY=f"http://127.0.0.1:{server}")
    assert ok and any(f"http://127.0.0.2:{closed}/" in line for line in Recorder.seen)
    ok, _ = probe(HF_ENDPOINT=f"https://127.0.0.2:{closed}", HTTPS_PROXY=f"http://127.0.0.1:{server}")
    assert not ok and any(line.startswith(f"CONNECT 127.0.0.2:{closed}") for line in Recorder.seen)


# ------------------------------------------------------------------------- online, against a local hub

class FakeHub(http.server.BaseHTTPRequestHandler):
    """The few hub routes huggingface_hub uses to read a dataset repo, served from `repo` (path -> bytes) at
    commit `sha` (branch main). Every request is recorded, so a test can see which files were fetched."""
    repo, name, sha, seen = {}, "", "", []

    def _send(self, code, body=b"", **headers):
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        FakeHub.seen.append(f"{self.command} {self.path}")
        path = self.path.split("?")[0]
        api, resolve = f"/api/datasets/{self.name}/", f"/datasets/{self.name}/resolve/"
        if path in (api + "revision/main", api + f"revision/{self.sha}"):
            info = {"id": self.name, "sha": self.sha, "siblings": [{"rfilename": f} for f in self.repo]}
            return self._send(200, json.dumps(info).encode(), Content_Type="application/json")
        if path.startswith(api + f"tree/{self.sha}"):
            tree = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for f, b in self.repo.items()]
            return self._send(200, json.dumps(tree).encode(), Content_Type="application/json")
        for rev in ("main", self.sha):
            f = path.removeprefix(resolve + rev + "/")
            if path.startswith(resolve + rev + "/") and f in self.repo:
                return self._send(200, self.repo[f], X_Repo_Commit=self.sha,
                                  ETag=f'"{hashlib.sha256(self.repo[f]).hexdigest()}"')
        self._send(404, b'{"error": "not found"}', X_Error_Code="EntryNotFound")

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def serve(name, files, sha):
    FakeHub.name, FakeHub.repo, FakeHub.sha, FakeHub.seen = name, files, sha, []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def online_env(tmp_path, srv):
    env = {k: v for k, v in offline_env(tmp_path).items() if "proxy" not in k.lower() and "OFFLINE" not in k}
    return dict(env, HF_ENDPOINT=f"http://127.0.0.1:{srv.server_address[1]}")


@pytest.mark.slow
def test_hub_set_read_online_downloads_only_its_split(tmp_path):
    """Online (a local hub on 127.0.0.1 via HF_ENDPOINT): only the README and the test split's files are
    downloaded; the cache then serves the same chunks offline; a split left half-downloaded is refused."""
    first, second = LM1B[:2], LM1B[2:]
    srv = serve("dvruette/lm1b", {"README.md": README.format(config_yaml("default", ["train", "test"])).encode(),
                                  "data/test-00000-of-00002.parquet": parquet(text=first),
                                  "data/test-00001-of-00002.parquet": parquet(text=second),
                                  "data/train-00000-of-00001.parquet": TRAP}, commit("online"))
    env = online_env(tmp_path, srv)
    want = {"hub": "dvruette/lm1b", "config": None, "split": "test", "revision": "main", "commit": FakeHub.sha}
    try:
        q = json.dumps([("lm1b", "lm1b", None, None)])
        r = subprocess.run([sys.executable, "-c", READ, q], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.split("RESULT ", 1)[1])["lm1b"]
    assert got.get("ids") == stream(LM1B, lm1b_detokenize), got
    assert got["record"] == want
    fetched = {line.split(" ", 1)[1] for line in FakeHub.seen if "/resolve/" in line}
    assert any("data/test-00001-of-00002.parquet" in p for p in fetched)
    assert not any("train" in p for p in fetched), fetched
    # offline now: the same chunks and commit, from what the online run cached
    r = subprocess.run([sys.executable, "-c", READ, q], cwd=ROOT, env=offline_env(tmp_path), capture_output=True,
                       text=True, timeout=300)
    assert json.loads(r.stdout.split("RESULT ", 1)[1])["lm1b"] == got, r.stderr[-3000:]
    snap = tmp_path / "hub" / "datasets--dvruette--lm1b" / "snapshots" / FakeHub.sha
    os.remove(snap / "data" / "test-00001-of-00002.parquet")  # as if the download had been cut short
    r = subprocess.run([sys.executable, "-c", READ, q], cwd=ROOT, env=offline_env(tmp_path), capture_output=True,
                       text=True, timeout=300)
    err = json.loads(r.stdout.split("RESULT ", 1)[1])["lm1b"].get("error", "")
    assert "lacks 1 of the 2 files" in err, r.stdout[-2000:]


def test_script_only_repo_online_is_the_same_one_line(tmp_path):
    srv = serve("armanc/scientific_papers",
                {"README.md": b"# card\n", "scientific_papers.py": b"import datasets\n"}, commit("sp online"))
    try:
        r = subprocess.run([sys.executable, "-m", "aogpt.evalsets", "pubmed", "--path=armanc/scientific_papers"], cwd=ROOT,
                           env=online_env(tmp_path, srv), capture_output=True, text=True, timeout=120)
    finally:
        srv.shutdown()
        srv.server_close()
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(err) == 1 and "ccdv/pubmed-summarization" in err[0], r.stderr[-2000:]
    assert any("/api/datasets/armanc/scientific_papers/" in line for line in FakeHub.seen)  # asked online
