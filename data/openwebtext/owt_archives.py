"""
OpenWebText's canonical archives, read in place (nothing is extracted to disk).

The hub repo Skylion007/openwebtext (repo_type='dataset') holds subsets/urlsf_subset00.tar ...
urlsf_subset20.tar. Each .tar holds .xz members (openwebtext/urlsf_subset00-1_data.xz, ...); each .xz is
an xz-compressed tar of .txt files, one document each (8,013,769 in all). An "archive" here is the unit
of work that becomes one shard: one .tar, or, for a folder of loose .xz members, the members of one
subset (the part of their name before the first '-': urlsf_subset00-1_data.xz -> urlsf_subset00, the
.tar they came from), so both forms give the same documents in the same order.

Document order: archives by name, then .xz members by file name, then .txt files by name, all sorted.
Text of a document, as the hub's loading script made its `text` column (so the tokens are those the
old load_dataset path gave): UTF-8, runs of 3+ newlines collapsed to 2, stripped. An empty .txt is an
empty document (it becomes a lone EOT). Bytes that are not valid UTF-8 become U+FFFD and the document is
kept and counted (skipping it would shift every later document's index, and so the held-out draw).
Members whose names start with '.' or '__' (macOS resource forks, ...) are not documents.
"""

if __name__ == '__main__':  # run as a script (python data/openwebtext/owt_archives.py): one line, not an ImportError
    raise SystemExit('error: data/openwebtext/owt_archives.py holds what the prepare scripts share, with nothing to '
                     'run: run data/<name>/prepare.py')

import errno
import lzma
import os
import re
import tarfile
from collections import namedtuple

HUB_REPO = "Skylion007/openwebtext"
HUB_FILES = [f"subsets/urlsf_subset{i:02d}.tar" for i in range(21)]
# identifies the text rule above in shard keys and meta.json: change it if the rule changes
TEXT = "utf-8 (invalid bytes -> U+FFFD), 3+ newlines -> 2, strip"

# name: the subset ('urlsf_subset00'); files: the one .tar, or the subset's loose .xz files; size: bytes
Archive = namedtuple("Archive", "name files size")


class ArchiveError(Exception):
    """A corrupt, truncated or foreign archive; its message is the one line the user sees."""


def _hidden(name):
    return os.path.basename(name).startswith((".", "__"))


def subset_of(xz_name):
    """urlsf_subset00-1_data.xz -> urlsf_subset00: the .tar a loose .xz member came from."""
    base = os.path.basename(xz_name)
    return base.split("-", 1)[0] if "-" in base else base[: -len(".xz")]


def _files(folder, ext):
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, f) for f in os.listdir(folder)
                  if f.endswith(ext) and not _hidden(f) and os.path.isfile(os.path.join(folder, f)))


def find_archives(path):
    """The archives at path, in order, or [] if there are none: a .tar or .xz file itself, a folder of
    .tar files (flat or under subsets/), or a folder of .xz members (flat, or under openwebtext/ as
    `tar -xf` leaves them)."""
    if os.path.isfile(path):
        tars, xzs = ([path], []) if path.endswith(".tar") else ([], [path] if path.endswith(".xz") else [])
    else:
        tars = _files(path, ".tar") or _files(os.path.join(path, "subsets"), ".tar")
        xzs = []
        for sub in ("", "openwebtext", os.path.join("subsets", "openwebtext")):
            xzs = xzs or _files(os.path.join(path, sub), ".xz")
    if tars:
        return sorted((Archive(os.path.basename(t)[: -len(".tar")], (t,), os.path.getsize(t)) for t in tars),
                      key=lambda a: (a.name, a.files))
    groups = {}
    for x in sorted(xzs, key=lambda p: (os.path.basename(p), p)):
        groups.setdefault(subset_of(x), []).append(x)
    return [Archive(name, tuple(fs), sum(os.path.getsize(f) for f in fs)) for name, fs in sorted(groups.items())]


def in_hf_cache(path):
    """The cached blob behind path if path is a file of the HF hub cache (a snapshot symlink), else None."""
    real = os.path.realpath(path)
    return real if real != os.path.abspath(path) and os.path.basename(os.path.dirname(real)) == "blobs" else None


def _damaged(where, file, why):
    blob = in_hf_cache(file)
    if blob:
        fix = f"it is in the HF cache: delete {blob} and re-run, which downloads it again"
    else:
        fix = f"delete {file}, download it again and re-run"
    return ArchiveError(f"{where}: corrupt or truncated ({why}); {fix} (finished archives are kept)")


def _xz_members(archive):
    """(label, file the bytes live in, open binary stream, compressed size) of each .xz, in order."""
    if archive.files[0].endswith(".tar"):
        tar_path = archive.files[0]
        with open(tar_path, "rb") as f:
            if f.read(24) == b"version https://git-lfs.":
                raise ArchiveError(f"{tar_path} is a git-lfs pointer, not the archive: fetch the data "
                                   f"(git lfs pull, or hf download) and re-run")
            try:
                f.seek(0)
                tf = tarfile.open(fileobj=f, mode="r:")
                members = tf.getmembers()
                # a .tar cut at a member boundary reads as a shorter archive: its end marker (two zero
                # blocks) is what tells them apart
                f.seek(tf.offset)
                if f.read(1024) != bytes(1024):
                    raise tarfile.ReadError("no end-of-archive marker")
            except (tarfile.TarError, OSError, EOFError) as e:
                raise _damaged(tar_path, tar_path, e)
            xzs = sorted((m for m in members if m.isreg() and m.name.endswith(".xz") and not _hidden(m.name)),
                         key=lambda m: (os.path.basename(m.name), m.name))
            if not xzs:
                raise ArchiveError(f"{tar_path}: no .xz members, so not an OpenWebText archive "
                                   f"(expected urlsf_subsetNN.tar from {HUB_REPO})")
            for m in xzs:
                yield f"{tar_path}:{m.name}", tar_path, tf.extractfile(m), m.size
    else:
        for x in archive.files:
            with open(x, "rb") as f:
                yield x, x, f, os.path.getsize(x)


def _read_xz(label, file, stream):
    """[(name, bytes)] of the .txt documents in one .xz, sorted by name."""
    try:
        with lzma.open(stream) as xz:
            docs = []
            with tarfile.open(fileobj=xz, mode="r|") as inner:
                for m in inner:
                    if m.isreg() and m.name.endswith(".txt") and not _hidden(m.name):
                        docs.append((m.name, inner.extractfile(m).read()))
            while xz.read(1 << 20):  # to the end of the xz stream: its checksum and end marker are checked
                pass
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as e:
        raise _damaged(label, file, f"{type(e).__name__}: {e}")
    return sorted(docs)


_NEWLINES = re.compile("\n\n\n+")


def documents(archive, progress=None):
    """Yield (where, text, valid_utf8) for each document of archive, in order. progress(nbytes) is called
    with each .xz member's compressed size once it is read."""
    for label, file, stream, size in _xz_members(archive):
        for name, raw in _read_xz(label, file, stream):
            try:
                text, ok = raw.decode("utf-8"), True
            except UnicodeDecodeError:
                text, ok = raw.decode("utf-8", errors="replace"), False
            yield f"{label}/{name}", _NEWLINES.sub("\n\n", text).strip(), ok
        if progress:
            progress(size)


# ------------------------------------------------------------------------------------------ from the hub

def _first_line(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:200]}" if msg else type(e).__name__


def hub_archives(revision, hint):
    """(commit, archives) for the hub's 21 files at revision, resolved once to a commit so that every file
    comes from the same one. An archive not yet in the HF cache has files == (None,), and its size is the
    hub's. Offline (hub.hub_reachable() says so), only the cache is read, and anything missing is one
    UserError line ending with hint."""
    from aogpt.errors import UserError
    from aogpt.hub import go_offline, hub_reachable
    offline = not hub_reachable()
    if offline:
        go_offline()
    import huggingface_hub as hf
    from huggingface_hub.errors import RevisionResolutionError
    where = f"{HUB_REPO}@{revision}"
    try:
        commit = hf.resolve_revision(HUB_REPO, repo_type="dataset", revision=revision,
                                     local_files_only=offline).resolved
    except RevisionResolutionError:
        raise UserError(f"offline (the HF hub cannot be reached, or HF_HUB_OFFLINE=1) and {where} is not in "
                        f"the HF cache ({hf.constants.HF_HUB_CACHE}); {hint}")
    except Exception as e:  # the hub answered: no such repo or revision, no access, ...
        raise UserError(f"cannot resolve {where}: {_first_line(e)}; {hint}")
    paths = {}
    for f in HUB_FILES:
        p = hf.try_to_load_from_cache(HUB_REPO, f, revision=commit, repo_type="dataset")
        paths[f] = p if isinstance(p, str) and os.path.isfile(p) else None
    missing = [f for f in HUB_FILES if paths[f] is None]
    sizes = {f: os.path.getsize(p) for f, p in paths.items() if p}
    if missing and offline:
        raise UserError(f"offline (the HF hub cannot be reached, or HF_HUB_OFFLINE=1) and {len(missing)} of "
                        f"the {len(HUB_FILES)} archives of {HUB_REPO} (commit {commit[:10]}) are not in the HF "
                        f"cache, e.g. {missing[0]}; {hint}")
    if missing:
        try:
            info = hf.HfApi().get_paths_info(HUB_REPO, missing, repo_type="dataset", revision=commit)
        except Exception as e:
            raise UserError(f"cannot list {HUB_REPO} (commit {commit[:10]}): {_first_line(e)}; {hint}")
        sizes.update({i.path: i.size for i in info})
        if set(missing) - set(sizes):
            raise UserError(f"{HUB_REPO} (commit {commit[:10]}) has no {sorted(set(missing) - set(sizes))[0]}; "
                            f"choose another --revision, or {hint}")
    archives = [Archive(os.path.basename(f)[: -len(".tar")], (paths[f],), sizes[f]) for f in HUB_FILES]
    return commit, archives


def hub_download(commit, archive, hint):
    """The archive's hub file, downloaded into the HF cache at commit (resumable, with its own progress
    bar); returns the archive with its local path."""
    import huggingface_hub as hf

    from aogpt.errors import UserError
    f = f"subsets/{archive.name}.tar"
    try:
        path = hf.hf_hub_download(HUB_REPO, f, repo_type="dataset", revision=commit)
    except Exception as e:
        raise UserError(f"downloading {f} from {HUB_REPO} failed ({_first_line(e)}); re-run to resume, "
                        f"or {hint}")
    return archive._replace(files=(path,), size=os.path.getsize(path))


# ----------------------------------------------------------------------------------- worker: one shard

def tokenize(archive, shard_dir, key):
    """An archive -> its token shard (prepare_shards.write_shard), run in a worker process. Bad input comes
    back as {"error": the one line for the user}, since an exception would not cross processes as one."""
    import prepare_shards as ps

    from aogpt.errors import UserError
    stats = {"non_utf8": 0, "first_non_utf8": None}
    counted = [0]

    def progress(nbytes):
        counted[0] += nbytes
        ps.advance(nbytes)

    def texts():
        for where, text, ok in documents(archive, progress):
            if not ok:
                stats["non_utf8"] += 1
                stats["first_non_utf8"] = stats["first_non_utf8"] or where
            yield text

    try:
        rec = ps.write_shard(shard_dir, archive.name, key, texts(), stats)
    except ArchiveError as e:
        return {"error": str(e)}
    except UserError as e:  # bad input: the parent raises its line (see the docstring)
        return {"error": e.msg}
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        return {"error": f"disk full while writing the shard of {archive.name} in {shard_dir}; free some "
                         f"space and re-run (finished archives are kept)"}
    ps.advance(archive.size - counted[0])  # the .tar's own headers: the bar ends at the archive's size
    return rec
