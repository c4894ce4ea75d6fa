"""
The Hugging Face hub for data, and the reachability probe every hub user shares: whether the hub can be
reached, switching the HF libraries to offline mode when it cannot (cache only: an immediate failure
instead of ~20 s of retries), and reading one split of a dataset repo. Data (evalsets.py,
data/*/prepare.py) goes through all of it; checkpoints keep their own hf: resolution in checkpoint.py
(parse_hub_spec, fetch_from_hub: one torch file or an export's two files) and use the probe from here.

    paths, commit = dataset_files("dvruette/lm1b", split="test", revision=None)   # local parquet files

dataset_files reads the repo's files itself instead of calling datasets.load_dataset(repo): that would
download and prepare every split (LM1B's ~30M-sentence train split for its test split), and since
datasets 4 it refuses any repo that still holds a loading script. Which files belong to which config and
split comes from the README's `configs:` header, else from the file names (datasets' convention).
"""

if __name__ == '__main__':  # run as a script (python aogpt/hub.py): one line, not an ImportError
    raise SystemExit("error: aogpt/hub.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import glob
import os
import re
import sys
import threading

from aogpt.errors import UserError, first_line

_TRUE = ("1", "ON", "YES", "TRUE")
_COMMIT = re.compile(r"[0-9a-f]{40}")

# Repos that hold only a loading script (datasets >= 4 refuses them) and what to read instead.
_SCIENTIFIC = ("read ccdv/arxiv-summarization or ccdv/pubmed-summarization instead (config document, column "
               "article: the same articles, parquet); evalsets' arxiv and pubmed do")
_OWT = "run `python data/openwebtext/prepare.py`, which reads the repo's archives itself"
MOVED = {"armanc/scientific_papers": _SCIENTIFIC, "scientific_papers": _SCIENTIFIC,
         "Skylion007/openwebtext": _OWT, "openwebtext": _OWT}


# -------------------------------------------------------------------------------------- reachability

def offline():
    """Is offline mode on: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, or go_offline() earlier in this process?"""
    if any(os.environ.get(v, "").upper() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return True
    hf = sys.modules.get("huggingface_hub")
    return bool(hf is not None and hf.constants.HF_HUB_OFFLINE)


def hub_reachable(timeout=1.5):
    """Does huggingface_hub's endpoint answer? huggingface_hub sends the request, so its endpoint
    (HF_ENDPOINT: a mirror), its HTTP client's proxies (HTTPS_PROXY, ALL_PROXY, NO_PROXY) and its offline
    flag all count. One HEAD request, no retries; it runs in a thread so that a slow DNS lookup cannot hold
    us past the timeout either. Any answer but a 5xx (a gateway or proxy error) means reachable."""
    if offline():
        return False
    from huggingface_hub import constants, get_session
    ok = []

    def probe():
        try:
            ok.append(get_session().head(constants.ENDPOINT + "/", timeout=timeout).status_code < 500)
        except Exception:  # connection refused, timeout, proxy error, offline mode: all mean "cannot reach"
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(ok and ok[0])


def go_offline():
    """Put HF datasets/hub in offline mode (cache only, immediate failure instead of ~20 s of retries)."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    if "huggingface_hub" in sys.modules:  # already imported: they read the variables at import time
        sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        sys.modules["datasets"].config.HF_HUB_OFFLINE = True
        sys.modules["datasets"].config.HF_DATASETS_OFFLINE = True


# ---------------------------------------------------------------------------- which files hold a split

_DATA_EXT = (".parquet", ".arrow", ".jsonl", ".json", ".csv", ".txt")
# datasets' split naming convention: one of these words as a folder name or as a word of the file name
_SPLIT_WORDS = {"train": {"train", "training"}, "validation": {"validation", "valid", "val", "dev"},
                "test": {"test", "testing", "eval", "evaluation"}}


def _is_data(path):
    name = path.lower()[:-3] if path.lower().endswith(".gz") else path.lower()
    return name.endswith(_DATA_EXT) and os.path.basename(name) not in ("readme.txt", "license.txt")


def _named_split(path):
    """The split a file's path names (data/test-00000-of-00001.parquet, test/0.parquet), or None."""
    words = {w for part in path.lower().split("/") for w in re.split(r"[-_. 0-9]+", part)}
    named = [s for s, keys in _SPLIT_WORDS.items() if words & keys]
    return named[0] if len(named) == 1 else None


def _glob(pattern):
    """A datasets data_files pattern as a regex over repo paths: * and ? stop at '/', ** does not."""
    p, out, i = pattern.removeprefix("./"), [], 0
    while i < len(p):
        if p.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif p.startswith("**", i):
            out.append(".*")
            i += 2
        else:
            out.append({"*": "[^/]*", "?": "[^/]"}.get(p[i], re.escape(p[i])))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _config_patterns(entry):
    """{split: [pattern]} of one `configs:` entry of a README header (data_files in any of its forms)."""
    files, prefix = entry.get("data_files"), (entry.get("data_dir") or "").strip("/")
    if files is None:
        return None
    if isinstance(files, str) or (isinstance(files, list) and all(isinstance(f, str) for f in files)):
        files = {"train": files}
    elif isinstance(files, list):
        files = {f["split"]: f["path"] for f in files}
    pre = prefix + "/" if prefix else ""
    return {s: [pre + x for x in ([p] if isinstance(p, str) else p)] for s, p in files.items()}


def split_files(repo, listing, readme, config, split):
    """The repo paths in `listing` that hold `split` of `config` (None: the default config), by the README's
    `configs:` header (readme: its local path, or None), else by datasets' naming convention."""
    script = repo.split("/")[-1] + ".py"
    if script in listing:
        instead = MOVED.get(repo) or "pass a local copy with path= (a parquet/jsonl/text file or folder)"
        raise UserError(f"{repo} holds a loading script ({script}), which datasets >= 4 no longer runs; {instead}")
    from huggingface_hub import metadata_load
    configs = (metadata_load(readme) or {}).get("configs") if readme else None
    where = f"{repo}" + (f" ({config})" if config else "")
    by_split = None
    if configs:
        names = [c.get("config_name", "default") for c in configs]
        if config is None:
            picks = ([c for c in configs if c.get("default")] or
                     [c for c, n in zip(configs, names) if n == "default"])
            entry = picks[0] if picks else configs[0] if len(configs) == 1 else None
            if entry is None:
                raise UserError(f"{repo} has configs {names} and none is the default; name one")
        elif config in names:
            entry = configs[names.index(config)]
        else:
            raise UserError(f"{repo} has configs {names}, not {config!r}")
        patterns = _config_patterns(entry)
        if patterns is not None:
            by_split = {s: sorted(f for f in listing if any(_glob(p).match(f) for p in ps) and _is_data(f))
                        for s, ps in patterns.items()}
        elif entry.get("data_dir"):
            listing = [f for f in listing if f.startswith(entry["data_dir"].strip("/") + "/")]
    elif config is not None:  # no header: a config can only be a folder
        listing = [f for f in listing if f.startswith(config + "/")]
        if not listing:
            raise UserError(f"{repo} has no config {config!r} (no `configs:` header, no {config}/ folder)")
    if by_split is None:
        data = sorted(f for f in listing if _is_data(f))
        named = {f: _named_split(f) for f in data}
        by_split = ({s: [f for f in data if named[f] == s] for s in _SPLIT_WORDS} if any(named.values())
                    else {"train": data})
        by_split = {s: fs for s, fs in by_split.items() if fs}
    if split not in by_split:
        raise UserError(f"{where} has splits {sorted(by_split)}, not {split!r}")
    if not by_split[split]:
        raise UserError(f"{where}: no data files for split {split!r}")
    return by_split[split]


# ------------------------------------------------------------------------------------ reading a split

def _cached_snapshot(repo, revision):
    """(commit, snapshot folder) of `revision` in the HF cache, or (None, a note on what the cache holds)."""
    from huggingface_hub import constants
    root = os.path.join(constants.HF_HUB_CACHE, "datasets--" + repo.replace("/", "--"))
    commit = revision if _COMMIT.fullmatch(revision) else None
    ref = os.path.join(root, "refs", revision)
    if commit is None and os.path.isfile(ref):
        commit = open(ref).read().strip()
    if commit and os.path.isdir(os.path.join(root, "snapshots", commit)):
        return commit, os.path.join(root, "snapshots", commit)
    refs = os.path.join(root, "refs")
    held = [f"{r}={open(os.path.join(refs, r)).read().strip()[:7]}" for r in
            (sorted(os.listdir(refs)) if os.path.isdir(refs) else []) if os.path.isfile(os.path.join(refs, r))]
    return None, f" (it holds {', '.join(held)})" if held else ""


def _cached_listing(repo, commit, folder):
    """Every file of the commit: the tree listing huggingface_hub cached when it downloaded (so a split that
    was only partly downloaded shows), else what the snapshot folder holds."""
    try:
        from huggingface_hub import get_cached_repo_tree
        return [f.path for f in get_cached_repo_tree(repo, repo_type="dataset", revision=commit)]
    except Exception:  # an older huggingface_hub, or a cache filled by hand: no listing cached
        return [os.path.relpath(os.path.join(d, f), folder).replace(os.sep, "/")
                for d, _, fs in os.walk(folder) for f in fs]


def dataset_files(repo, config=None, split="train", revision=None, hint="pass a local copy"):
    """(local paths of the data files of one split of HF dataset `repo`, the commit they come from).
    revision: a branch, tag or commit (None = 'main'). Online only that split's files (and README.md) are
    downloaded, into the HF cache. Offline (see offline()), the cache's refs/<revision> names the commit
    and its snapshot must hold the whole split. Failures raise UserError: one line, ending with `hint`."""
    rev = revision or "main"
    where = f"HF dataset {repo!r}" + (f" ({config})" if config else "") + (f" at {rev}" if revision else "")
    if offline():
        commit, folder = _cached_snapshot(repo, rev)
        if commit is None:
            raise UserError(f"cannot load {where}: offline and not in the HF cache{folder}; {hint}")
        listing = _cached_listing(repo, commit, folder)
        readme = os.path.join(folder, "README.md")
        files = split_files(repo, listing, readme if os.path.isfile(readme) else None, config, split)
        missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
        if missing:
            raise UserError(f"cannot load {where}: offline, and the HF cache lacks {len(missing)} of the "
                            f"{len(files)} files of split {split!r} (e.g. {missing[0]}); {hint}")
        return [os.path.join(folder, f) for f in files], commit
    from huggingface_hub import HfApi, snapshot_download
    try:
        api = HfApi()
        info = api.dataset_info(repo, revision=rev)
        listing = [s.rfilename for s in info.siblings]
        readme = (api.hf_hub_download(repo, "README.md", repo_type="dataset", revision=info.sha)
                  if "README.md" in listing else None)
        files = split_files(repo, listing, readme, config, split)
        # by `rev`, not the commit, so that the cache records refs/<rev> for offline use
        folder = snapshot_download(repo, repo_type="dataset", revision=rev,
                                   allow_patterns=[glob.escape(f) for f in files + ["README.md"]])
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"cannot load {where}: {type(e).__name__}: {first_line(e)}; {hint}")
    if os.path.basename(folder) != info.sha:
        raise UserError(f"cannot load {where}: {rev} moved from {info.sha[:7]} to "
                        f"{os.path.basename(folder)[:7]} while it was read; run again")
    return [os.path.join(folder, f) for f in files], info.sha
