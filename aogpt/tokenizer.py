"""
Tokenizers ("codecs") for aogpt: GPT-2 BPE, and nanoGPT-style character level.

GPT-2 BPE works offline. tiktoken.get_encoding('gpt2') downloads its vocab files on first use, which
fails on a machine without internet. The same ranks ship inside the PyPI package openai-whisper
(whisper/assets/gpt2.tiktoken, byte-identical to tiktoken's r50k_base file, checked by sha256), so we
build the tiktoken.Encoding from that file. The ids are exactly those of get_encoding('gpt2'):
"Hello world" -> [15496, 995], <|endoftext|> -> 50256 (tests/test_data.py checks both). Install it with
    pip install --no-deps openai-whisper==20250625     # --no-deps: we only need the file, not numba
We never `import whisper` (its __init__ pulls torch and numba); importlib.metadata finds the file.
If the package is missing we fall back to tiktoken's own download/cache, which yields the same ids.

    enc = gpt2_encoding()          # tiktoken.Encoding, cached
    codec = get_codec('data/ptb')  # Codec from data/ptb/meta.json (or meta.pkl); None or no metadata -> GPT-2
    ids = codec.encode("Hello world"); text = codec.decode(ids); codec.eot; codec.vocab_size; codec.name

Codec.encode treats its input as plain text: a literal "<|endoftext|>" inside a document is encoded
as ordinary characters (as nanoGPT's prepare.py does). Insert codec.eot yourself where a document ends.

A source model's own tokenizer (Llama, Qwen, SmolLM: a tokenizer.json) is a codec too, read with the
`tokenizers` library (it comes with transformers; no BPE is written here):
    codec = source_codec('path/to/folder')          # tokenizer.json + config.json / tokenizer_config.json
    codec = source_codec('hf:HuggingFaceTB/SmolLM2-135M@main')   # the same files, through the HF cache
Its end of document (eot) is the source's eos: config.json's eos_token_id (the first, where it is a list),
else tokenizer_config.json's eos_token, or the token given as eot_token; its bos is read like its eos
(None where the source has none). A dataset
prepared with it holds a copy of tokenizer.json beside meta.json, which records its sha256; a checkpoint
stores the whole file in its codec record, hashed again when rebuilt, so the bytes checked are the bytes
parsed, and a model never needs the folder it was prepared from.
"""

if __name__ == '__main__':  # run as a script (python aogpt/tokenizer.py): one line, not an ImportError
    raise SystemExit("error: aogpt/tokenizer.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import base64
import functools
import hashlib
import json
import os
import pickle
import re

from aogpt.bins import read_meta
from aogpt.errors import UserError, first_line

GPT2_EOT = 50256
GPT2_VOCAB = 50257  # real vocabulary; models pad it to 50304 for fast matmuls
TOKENIZERS = "tokenizers"  # the name of a codec read from a tokenizer.json (meta.json's "tokenizer")
TOKENIZER_FILE = "tokenizer.json"
SOURCE_FILES = (TOKENIZER_FILE, "config.json", "tokenizer_config.json", "special_tokens_map.json")
# tiktoken's r50k_base / gpt2 pre-tokenisation regex (tiktoken_ext/openai_public.py, tiktoken 0.14).
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# sha256 tiktoken itself expects for r50k_base.tiktoken; whisper's gpt2.tiktoken is that file.
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
INSTALL_HINT = "pip install --no-deps openai-whisper==20250625"


def gpt2_file():
    """Path of whisper's gpt2.tiktoken, found without importing whisper; None if not installed."""
    from importlib.metadata import PackageNotFoundError, distribution
    try:
        path = str(distribution("openai-whisper").locate_file("whisper/assets/gpt2.tiktoken"))
    except PackageNotFoundError:
        return None
    return path if os.path.exists(path) else None


@functools.lru_cache(maxsize=None)
def gpt2_encoding():
    """GPT-2 BPE as a tiktoken.Encoding, ids identical to tiktoken.get_encoding('gpt2')."""
    import tiktoken
    path = gpt2_file()
    if path is None:  # no local asset: tiktoken's normal path (network or TIKTOKEN_CACHE_DIR)
        try:
            return tiktoken.get_encoding("gpt2")
        except Exception as e:
            raise UserError(f"GPT-2 BPE unavailable: openai-whisper is not installed and tiktoken could "
                            f"not download the vocab ({type(e).__name__}). Fix: {INSTALL_HINT}")
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != R50K_SHA256:
        raise UserError(f"{path} has sha256 {digest[:12]}..., expected {R50K_SHA256[:12]}... "
                        f"(corrupt or changed file); reinstall: {INSTALL_HINT}")
    # The ranks are parsed from the very bytes just checked. tiktoken's own loader would copy the file
    # into a cache under the temp directory and read that copy on later calls without checking it, so
    # anyone who can write the temp directory could change every token id.
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": GPT2_EOT}, explicit_n_vocab=GPT2_VOCAB)


def byte_chars():
    """{byte: the character a byte-level BPE's tokenizer.json writes it as}: the printable Latin-1 bytes as
    themselves, every other byte as chr(256 + n) in byte order (GPT-2's convention, which tokenizers keeps)."""
    keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    moved = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(moved)}}


def is_gpt2_vocabulary(folder):
    """Whether a GPT-2 folder's ids are GPT-2's BPE, tiktoken's gpt2 codec: it holds no tokenizer.json (a GPT-2
    config names GPT-2's vocabulary, as a bare GPT-2 folder always did), or one whose vocabulary is GPT-2's, id for
    id (the hub's openai-community/gpt2). A GPT-2 folder with a tokenizer of its own uses it, as every family does."""
    path = os.path.join(folder, TOKENIZER_FILE)
    if not os.path.isfile(path):
        return True
    try:
        with open(path, encoding="utf-8") as f:
            vocab = json.load(f)["model"]["vocab"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"cannot read {path} ({first_line(e, 150)})")
    if not isinstance(vocab, dict) or len(vocab) != GPT2_VOCAB or vocab.get("<|endoftext|>") != GPT2_EOT:
        return False
    unbyte, enc = {c: b for b, c in byte_chars().items()}, gpt2_encoding()
    try:
        ours = {i: bytes(unbyte[c] for c in t) for t, i in vocab.items() if t != "<|endoftext|>"}
    except (KeyError, TypeError):  # a character no byte-level BPE writes: another tokenizer
        return False
    return sorted(ours) == list(range(GPT2_EOT)) and all(enc.decode_single_token_bytes(i) == t for i, t in ours.items())


class Codec:
    """text <-> token ids. name: 'gpt2', 'char' or 'tokenizers' (a tokenizer.json); eot: end-of-document id or
    None; bos: the source's beginning-of-sequence id or None (tokenizers codecs only); vocab_size: real
    vocabulary size, the largest id + 1 (a model may use a larger, padded embedding)."""

    def __init__(self, name, vocab_size, eot, encode, decode, chars=None, bos=None, tokenizer_json=None):
        self.name, self.vocab_size, self.eot, self.chars, self.bos = name, vocab_size, eot, chars, bos
        self.tokenizer_json = tokenizer_json  # the text of tokenizer.json, for name 'tokenizers'
        self._encode, self._decode = encode, decode

    def record(self):
        """What identifies this codec exactly, as plain JSON-able values. A checkpoint stores it, so that
        re-preparing a dataset under a model can never change what the model's ids decode to."""
        rec = {"tokenizer": self.name, "vocab_size": self.vocab_size, "eot": self.eot}
        if self.name == "gpt2":
            rec["ranks_sha256"] = R50K_SHA256
        elif self.name == TOKENIZERS:
            rec.update(bos=self.bos, sha256=self.sha256, json=self.tokenizer_json)
        else:
            rec["chars"] = "".join(self.chars)
        return rec

    @property
    def sha256(self):
        """sha256 of the tokenizer.json a 'tokenizers' codec was parsed from (its UTF-8 bytes), else None."""
        return None if self.tokenizer_json is None else hashlib.sha256(self.tokenizer_json.encode()).hexdigest()

    def encode(self, text):
        return self._encode(text)

    def decode(self, ids):
        """Ids outside the vocabulary (padding ids a model may sample, -1 fill) become U+FFFD."""
        return self._decode([int(i) for i in ids])

    def __repr__(self):
        return f"Codec({self.name!r}, vocab_size={self.vocab_size}, eot={self.eot})"


def _decode_runs(decode, vocab_size):
    """decode, with every id outside 0..vocab_size-1 shown as U+FFFD between the decoded runs of valid ids
    (tiktoken would raise on them, tokenizers would drop them without a trace)."""
    def run_decode(ids):
        if all(0 <= i < vocab_size for i in ids):
            return decode(ids)  # the common case
        out, run = [], []
        for i in ids:
            if 0 <= i < vocab_size:
                run.append(i)
            else:
                out += [decode(run), "\ufffd"]
                run = []
        return "".join(out) + decode(run)
    return run_decode


@functools.lru_cache(maxsize=None)
def gpt2_codec():
    enc = gpt2_encoding()
    return Codec("gpt2", GPT2_VOCAB, GPT2_EOT, enc.encode_ordinary, _decode_runs(enc.decode, GPT2_VOCAB))


def char_codec(chars):
    """nanoGPT's character-level codec over an ordered vocabulary (id = index in chars)."""
    chars = list(chars)
    stoi = {ch: i for i, ch in enumerate(chars)}

    def encode(text):
        try:
            return [stoi[c] for c in text]
        except KeyError as e:
            raise UserError(f"character {e.args[0]!r} is not in this char-level vocabulary "
                            f"({len(chars)} symbols)")

    def decode(ids):
        return "".join(chars[i] if 0 <= i < len(chars) else "\ufffd" for i in ids)

    return Codec("char", len(chars), None, encode, decode, chars=chars)


def parse_tokenizer(text):
    """A tokenizers.Tokenizer from a tokenizer.json's text, or one line (tokenizers raises a bare Exception)."""
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_str(text)
    except Exception as e:
        raise UserError(f"not a readable {TOKENIZER_FILE} ({first_line(e, 150)})")


def tokenizers_codec(text, eot=None, bos=None, tok=None):
    """The codec of a tokenizer.json, given as its text (so the bytes a caller hashed are the bytes parsed; tok:
    that text already parsed by parse_tokenizer, which a 10 MB file makes worth passing on).
    Text is plain text: the source's special tokens spelled inside a document are characters, and nothing is
    added around it (no BOS); eot and bos are the ids the source names (source_codec reads them)."""
    tok = parse_tokenizer(text) if tok is None else tok
    tok.encode_special_tokens = True  # a literal '<|endoftext|>' in a document is characters, as in GPT-2's codec
    vocab = max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    for what, i in (("eot", eot), ("bos", bos)):
        if i is not None and not (isinstance(i, int) and 0 <= i < vocab):
            raise UserError(f"the source's {what} id {i!r} is not one of its {TOKENIZER_FILE}'s {vocab} ids")

    def encode(t):
        return tok.encode(t, add_special_tokens=False).ids

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=False)

    return Codec(TOKENIZERS, vocab, eot, encode, _decode_runs(decode, vocab), bos=bos, tokenizer_json=text)


def _read_json(path):
    """A small JSON file of a source folder as a dict ({} when absent); one line when unreadable."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path} ({first_line(e, 150)})")
    return out if isinstance(out, dict) else {}


def _special_id(config, tok_config, tokenize, key):
    """The source's `key` ('eos' or 'bos') id: config.json's {key}_token_id (the first of a list, the order in
    which the source lists them), else tokenizer_config.json / special_tokens_map.json's {key}_token
    looked up in the vocabulary; None where neither names one."""
    i = config.get(f"{key}_token_id")
    if isinstance(i, list):
        i = i[0] if i else None
    if i is not None:
        return i
    t = tok_config.get(f"{key}_token")
    t = t.get("content") if isinstance(t, dict) else t
    return tokenize(t) if isinstance(t, str) else None


def folder_codec(folder, eot_token="", eot_id=None):
    """The codec of a source model's folder: its tokenizer.json, with eot and bos from its config.json and
    tokenizer_config.json (special_tokens_map.json for what that lacks). eot_token: the token that ends a
    document instead of the source's eos (Qwen3-0.6B's config.json names <|im_end|>, a chat turn's end, while
    its pretraining documents end with <|endoftext|>). eot_id: that token as an id, as a dataset prepared with
    this tokenizer.json recorded it in meta.json (train.py reads a source's codec with its data's end)."""
    path = os.path.join(folder, TOKENIZER_FILE)
    if not os.path.isfile(path):
        raise UserError(f"{folder} holds no {TOKENIZER_FILE}: a source's tokenizer is read from its fast-tokenizer "
                        f"file (tokenizer.json, as Llama, Qwen and SmolLM ship it)")
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")  # UTF-8 round trips: text.encode() is the file's bytes, sha256 and all
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path} ({first_line(e, 150)})")
    config = _read_json(os.path.join(folder, "config.json"))
    tok_config = {**_read_json(os.path.join(folder, "special_tokens_map.json")),
                  **_read_json(os.path.join(folder, "tokenizer_config.json"))}
    try:
        tok = parse_tokenizer(text)
    except UserError as e:
        raise UserError(f"{path} is {e.msg}")  # "... is not a readable tokenizer.json (...)"
    lookup = tok.token_to_id
    eot, bos = (_special_id(config, tok_config, lookup, k) for k in ("eos", "bos"))
    if eot_id is not None:
        eot = eot_id  # tokenizers_codec checks that it is one of the file's ids
    elif eot_token:
        eot = lookup(eot_token)
        if eot is None:
            raise UserError(f"--eot_token {eot_token!r} is not a token of {path}")
    if eot is None:  # documents need an end the model can learn and sample.py --until_eot can stop at
        raise UserError(f"{folder} names no eos (config.json eos_token_id, tokenizer_config.json eos_token): pass "
                        f"--eot_token, the token that ends a document")
    try:
        return tokenizers_codec(text, eot, bos, tok)
    except UserError as e:
        raise UserError(f"{path}: {e.msg}")


def source_folder(spec):
    """(local folder, where it came from) of a --tokenizer spec: a folder, or hf:owner/name[@revision], whose
    tokenizer files are fetched into the HF cache (offline: read from it) and named by the commit read."""
    if not spec.startswith("hf:"):
        if not os.path.isdir(spec):
            raise UserError(f"--tokenizer {spec}: no such folder (give a model folder holding {TOKENIZER_FILE}, "
                            f"or hf:owner/name[@revision])")
        return spec, os.path.abspath(spec)
    m = re.fullmatch(r"hf:([\w.-]+/[\w.-]+)(?:@([\w./-]+))?", spec)
    if not m:
        raise UserError(f"--tokenizer {spec}: write hf:owner/name or hf:owner/name@revision")
    repo, rev = m.groups()
    from huggingface_hub import errors, hf_hub_download

    from aogpt.hub import go_offline, hub_reachable
    if not hub_reachable():
        go_offline()  # the cache only, failing at once instead of after retries
    got = None
    for name in SOURCE_FILES:
        try:
            path = hf_hub_download(repo, name, revision=rev)
        except errors.LocalEntryNotFoundError:  # (before its base class EntryNotFoundError) not cached, offline
            if name != TOKENIZER_FILE:
                continue
            raise UserError(f"--tokenizer {spec}: {name} is not in the Hugging Face cache and the hub cannot be "
                            f"reached; on a machine with internet run `hf download {repo} {' '.join(SOURCE_FILES)}"
                            f"{f' --revision {rev}' if rev else ''} --local-dir DIR`, copy DIR here and pass "
                            f"--tokenizer DIR")
        except errors.EntryNotFoundError:  # a file this repo does not have (only tokenizer.json is needed)
            continue
        except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.GatedRepoError) as e:
            raise UserError(f"--tokenizer {spec}: {first_line(e, 150)}")
        got = got or os.path.dirname(path)
    if got is None:
        raise UserError(f"--tokenizer {spec}: {repo} has no {TOKENIZER_FILE}")
    commit = os.path.basename(got)  # the cache keeps each commit's files in snapshots/<commit>/
    return got, f"hf:{repo}@{commit}"


def source_codec(spec, eot_token=""):
    """The codec a prepare script's --tokenizer names: '' or 'gpt2' for GPT-2 BPE, else a source model's
    tokenizer (source_folder: a folder or hf:owner/name[@rev]; eot_token: see folder_codec). Returns (codec,
    where it came from)."""
    if spec in ("", "gpt2"):
        if eot_token:
            raise UserError("--eot_token picks the end of a document of a --tokenizer; GPT-2's is <|endoftext|>")
        return gpt2_codec(), "gpt2"
    folder, origin = source_folder(spec)
    return folder_codec(folder, eot_token), origin


def codec_from_record(rec):
    """The codec a Codec.record() describes; one line (UserError) if the record is not one we can rebuild."""
    kind = rec.get("tokenizer") if isinstance(rec, dict) else None
    if kind == "gpt2":
        if rec.get("ranks_sha256", R50K_SHA256) != R50K_SHA256 or rec.get("vocab_size") != GPT2_VOCAB:
            raise UserError(f"the checkpoint's GPT-2 codec is not the standard one ({rec}); it cannot be rebuilt here")
        return gpt2_codec()
    if kind == "char" and isinstance(rec.get("chars"), str) and len(rec["chars"]) == rec.get("vocab_size"):
        return char_codec(rec["chars"])
    if kind == TOKENIZERS and isinstance(rec.get("json"), str):
        codec = tokenizers_codec(rec["json"], rec.get("eot"), rec.get("bos"))
        if codec.sha256 != rec.get("sha256") or codec.vocab_size != rec.get("vocab_size"):
            raise UserError(f"the codec record's {TOKENIZER_FILE} has sha256 {codec.sha256[:12]}... and "
                            f"{codec.vocab_size} ids, but the record says {str(rec.get('sha256'))[:12]}... and "
                            f"{rec.get('vocab_size')}: it was changed after it was recorded")
        return codec
    shown = {k: v for k, v in rec.items() if k != "json"} if isinstance(rec, dict) else rec
    raise UserError(f"unreadable codec record {str(shown)[:200]}: expected {{'tokenizer': 'gpt2' | 'char' | "
                    f"'{TOKENIZERS}', ...}}")


def get_codec(path=None):
    """The codec of a dataset. path: a data dir (data/<name>), its meta.json or meta.pkl, or None.
    meta.json {"tokenizer": "gpt2" | "char" | "tokenizers", ...} decides; a dir with only nanoGPT's meta.pkl
    is char level; None, or a dir without metadata, means GPT-2 (nanoGPT's convention). A 'tokenizers'
    dataset's codec is its own copy of tokenizer.json, whose sha256 must be the one meta.json records."""
    if path is None:
        return gpt2_codec()
    path = str(path)
    if path.endswith((".json", ".pkl")):  # a metadata file rather than its directory
        path = os.path.dirname(path) or "."
    meta_json, meta_pkl = os.path.join(path, "meta.json"), os.path.join(path, "meta.pkl")
    meta = read_meta(path)
    if not meta and os.path.exists(meta_pkl):
        meta = {"tokenizer": "char"}
    name = meta.get("tokenizer", "gpt2")
    if name == "gpt2":
        codec = gpt2_codec()
    elif name == TOKENIZERS:
        codec = _dataset_tokenizer(path, meta)
    elif name != "char":
        raise UserError(f"{meta_json}: unknown tokenizer {name!r} (expected 'gpt2', 'char' or '{TOKENIZERS}')")
    elif "chars" in meta:  # our char datasets keep the vocabulary in meta.json too: no pickle needed
        codec = char_codec(meta["chars"])
    elif not os.path.exists(meta_pkl):
        raise UserError(f"char-level dataset without its vocabulary: {meta_pkl} not found")
    else:
        codec = char_codec(_read_meta_pkl(meta_pkl))
    if "vocab_size" in meta and meta["vocab_size"] != codec.vocab_size:
        raise UserError(f"{meta_json} says vocab_size {meta['vocab_size']!r}, but its {codec.name} codec has "
                        f"{codec.vocab_size} symbols; re-run the dataset's prepare.py")
    return codec


def _dataset_tokenizer(path, meta):
    """A 'tokenizers' dataset's codec: path/tokenizer.json checked against meta.json's sha256, eot and bos."""
    tj = os.path.join(path, TOKENIZER_FILE)
    if not os.path.isfile(tj):
        raise UserError(f"{path}/meta.json names a {TOKENIZERS} codec but {tj} is missing; re-run the dataset's "
                        f"prepare.py")
    with open(tj, "rb") as f:
        raw = f.read()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != meta.get("tokenizer_sha256"):
        raise UserError(f"{tj} has sha256 {digest[:12]}..., but {path}/meta.json records "
                        f"{str(meta.get('tokenizer_sha256'))[:12]}...: it is not the tokenizer the bins were made "
                        f"with; re-run the dataset's prepare.py")
    try:
        return tokenizers_codec(raw.decode("utf-8"), meta.get("eot"), meta.get("bos"))
    except (UserError, UnicodeDecodeError) as e:
        raise UserError(f"{tj}: {getattr(e, 'msg', e)}")


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):  # builtins only: a meta.pkl never needs to run code
        raise UserError(f"meta.pkl refers to {module}.{name}; only plain dicts, strings and ints are read")


def _read_meta_pkl(path):
    """nanoGPT's {'vocab_size', 'itos', 'stoi'}, read without executing anything: the chars in id order."""
    try:
        with open(path, "rb") as f:
            itos = _PlainUnpickler(f).load()["itos"]
        return [itos[i] for i in range(len(itos))]
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as e:
        raise UserError(f"cannot read {path} as nanoGPT's meta.pkl ({type(e).__name__}: {e})")
