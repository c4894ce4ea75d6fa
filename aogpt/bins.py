"""
The token files, data/<name>/{split}.bin: flat arrays of token ids (nanoGPT's format) in the one dtype the
vocabulary needs. This module is the one home of that rule and of reading the files back:

    dtype = bin_dtype(codec.vocab_size)       # 'uint16' while every id fits (< 65,536), else 'uint32'
    ids = load_bin('data/ptb', 'val')         # np.memmap in the dtype data/ptb/meta.json records, checked

meta.json records the dtype; one without it (nanoGPT's, and ours before uint32 existed) means uint16. Read
at the wrong width the ids would be garbage with no error, so a file is refused in one line when its size
is not a whole number of ids, when it differs from the token count meta.json records, or when the recorded
dtype cannot hold the recorded vocabulary.
"""

if __name__ == '__main__':  # run as a script (python aogpt/bins.py): one line, not an ImportError
    raise SystemExit("error: aogpt/bins.py is a library module, with nothing to run: the commands are train.py, "
                     "sample.py, eval_ppl.py, eval_harness.py and export.py at the repository's root")

import json
import os

import numpy as np

from aogpt.errors import UserError

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
LEGACY_DTYPE = "uint16"  # a meta.json without "dtype", or none at all: nanoGPT's bins
FIX = "re-run the dataset's prepare.py"


def bin_dtype(vocab_size):
    """The dtype name a vocabulary's ids are stored in: uint16 while the largest id (vocab_size - 1) fits in
    it, so GPT-2 and char bins stay nanoGPT's; uint32 above (Llama 3's 128,256 ids, Qwen's 151,665)."""
    for name, dt in DTYPES.items():
        if vocab_size - 1 <= np.iinfo(dt).max:
            return name
    raise UserError(f"a vocabulary of {vocab_size:,} ids does not fit in uint32 token files")


def read_meta(data_dir):
    """data_dir/meta.json as a dict; {} when there is none (nanoGPT's GPT-2 bins need none)."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path} ({e}); {FIX}")
    if not isinstance(meta, dict):
        raise UserError(f"{path} holds a JSON {type(meta).__name__}, not an object; {FIX}")
    return meta


def meta_dtype(meta, where="meta.json"):
    """The dtype name meta.json records for its bins, checked against its vocabulary."""
    name = meta.get("dtype", LEGACY_DTYPE)
    if name not in DTYPES:
        raise UserError(f"{where}: dtype {name!r} is not a token file dtype (expected {' or '.join(DTYPES)}); {FIX}")
    vocab = meta.get("vocab_size")
    if isinstance(vocab, int) and DTYPES[bin_dtype(vocab)](0).itemsize > DTYPES[name](0).itemsize:
        raise UserError(f"{where}: dtype {name} cannot hold the ids of its {vocab:,}-symbol vocabulary "
                        f"(those need {bin_dtype(vocab)}); {FIX}")
    return name


def bin_problem(path, dtype, tokens=None):
    """Why the file at path cannot be dtype token ids (tokens of them, where a count is known), else None."""
    size, width = os.path.getsize(path), np.dtype(DTYPES[dtype]).itemsize
    if size % width:
        return (f"{path} has {size:,} bytes, " + ("an odd number" if width == 2 else f"not a multiple of {width}") +
                f", so it is not a whole number of {dtype} token ids ({width} bytes each): it is truncated or not a "
                f"token file")
    if tokens is not None and size != tokens * width:
        return (f"{path} has {size:,} bytes, but meta.json records {tokens:,} {dtype} tokens ({tokens * width:,} "
                f"bytes): the bin and its meta.json are from different preparations" +
                (" (or of another dtype)" if size == tokens * (6 - width) else ""))
    return None


def open_bin(path, dtype):
    """The ids of one token file as a read-only np.memmap of the dtype (a name); an empty file, as an empty array
    (np.memmap refuses those). The caller took dtype from meta.json (meta_dtype)."""
    problem = bin_problem(path, dtype)
    if problem:
        raise UserError(f"{problem}; {FIX}")
    if os.path.getsize(path) == 0:
        return np.zeros(0, DTYPES[dtype])
    return np.memmap(path, dtype=DTYPES[dtype], mode="r")


def load_bin(data_dir, split, meta=None):
    """data_dir/{split}.bin read with the dtype of data_dir/meta.json, its size checked against the token count
    meta.json records (meta: that dict, when the caller has it already)."""
    meta = read_meta(data_dir) if meta is None else meta
    where = os.path.join(data_dir, "meta.json")
    dtype, path = meta_dtype(meta, where), os.path.join(data_dir, f"{split}.bin")
    tokens = meta.get(f"{split}_tokens")
    problem = bin_problem(path, dtype, tokens if isinstance(tokens, int) else None)
    if problem:
        raise UserError(f"{problem}; {FIX}")
    return open_bin(path, dtype)
