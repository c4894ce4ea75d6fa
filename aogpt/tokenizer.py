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

from aogpt.errors import UserError

GPT2_EOT = 50256
GPT2_VOCAB = 50257  # real vocabulary; models pad it to 50304 for fast matmuls
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


class Codec:
    """text <-> token ids. name: 'gpt2' or 'char'; eot: end-of-document id or None; vocab_size: real
    vocabulary size (a model may use a larger, padded embedding)."""

    def __init__(self, name, vocab_size, eot, encode, decode, chars=None):
        self.name, self.vocab_size, self.eot, self.chars = name, vocab_size, eot, chars
        self._encode, self._decode = encode, decode

    def record(self):
        """What identifies this codec exactly, as plain JSON-able values. A checkpoint stores it, so that
        re-preparing a dataset under a model can never change what the model's ids decode to."""
        rec = {"tokenizer": self.name, "vocab_size": self.vocab_size, "eot": self.eot}
        if self.name == "gpt2":
            rec["ranks_sha256"] = R50K_SHA256
        else:
            rec["chars"] = "".join(self.chars)
        return rec

    def encode(self, text):
        return self._encode(text)

    def decode(self, ids):
        """Ids outside the vocabulary (padding ids a model may sample, -1 fill) become U+FFFD."""
        return self._decode([int(i) for i in ids])

    def __repr__(self):
        return f"Codec({self.name!r}, vocab_size={self.vocab_size}, eot={self.eot})"


@functools.lru_cache(maxsize=None)
def gpt2_codec():
    enc = gpt2_encoding()

    def decode(ids):
        if all(0 <= i < GPT2_VOCAB for i in ids):
            return enc.decode(ids)  # the common case; invalid UTF-8 byte runs become U+FFFD
        out, run = [], []
        for i in ids:
            if 0 <= i < GPT2_VOCAB:
                run.append(i)
            else:
                out += [enc.decode(run), "\ufffd"]
                run = []
        return "".join(out) + enc.decode(run)

    return Codec("gpt2", GPT2_VOCAB, GPT2_EOT, enc.encode_ordinary, decode)


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


def codec_from_record(rec):
    """The codec a Codec.record() describes; one line (UserError) if the record is not one we can rebuild."""
    kind = rec.get("tokenizer") if isinstance(rec, dict) else None
    if kind == "gpt2":
        if rec.get("ranks_sha256", R50K_SHA256) != R50K_SHA256 or rec.get("vocab_size") != GPT2_VOCAB:
            raise UserError(f"the checkpoint's GPT-2 codec is not the standard one ({rec}); it cannot be rebuilt here")
        return gpt2_codec()
    if kind == "char" and isinstance(rec.get("chars"), str) and len(rec["chars"]) == rec.get("vocab_size"):
        return char_codec(rec["chars"])
    raise UserError(f"unreadable codec record {str(rec)[:200]}: expected {{'tokenizer': 'gpt2' | 'char', ...}}")


def get_codec(path=None):
    """The codec of a dataset. path: a data dir (data/<name>), its meta.json or meta.pkl, or None.
    meta.json {"tokenizer": "gpt2" | "char", ...} decides; a dir with only nanoGPT's meta.pkl is char
    level; None, or a dir without metadata, means GPT-2 (nanoGPT's convention)."""
    if path is None:
        return gpt2_codec()
    path = str(path)
    if path.endswith((".json", ".pkl")):  # a metadata file rather than its directory
        path = os.path.dirname(path) or "."
    meta_json, meta_pkl = os.path.join(path, "meta.json"), os.path.join(path, "meta.pkl")
    meta = {}
    if os.path.exists(meta_json):
        try:
            with open(meta_json) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read {meta_json} ({e}); re-run the dataset's prepare.py")
        if not isinstance(meta, dict):
            raise UserError(f"{meta_json} holds a JSON {type(meta).__name__}, not an object; re-run the "
                            f"dataset's prepare.py")
    elif os.path.exists(meta_pkl):
        meta = {"tokenizer": "char"}
    name = meta.get("tokenizer", "gpt2")
    if name == "gpt2":
        codec = gpt2_codec()
    elif name != "char":
        raise UserError(f"{meta_json}: unknown tokenizer {name!r} (expected 'gpt2' or 'char')")
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
