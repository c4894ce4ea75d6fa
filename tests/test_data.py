"""The data layer: tokenizer ids, bin preparation read back to the original text, the PTB corpus,
detokenizers on fixtures, eval chunking counts, and the one-line error for a missing dataset."""
import hashlib
import json
import os
import pickle

import pytest

import tokenizer
from tokenizer import DataError, get_codec, gpt2_encoding


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
    with pytest.raises(DataError, match="not in this char-level vocabulary"):
        c.encode("xyz")
    # nanoGPT's shakespeare_char layout: meta.pkl only
    (tmp_path / "n").mkdir()
    chars = sorted(set("hello world"))
    with open(tmp_path / "n" / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                     "stoi": {ch: i for i, ch in enumerate(chars)}}, f)
    n = get_codec(tmp_path / "n" / "meta.pkl")
    assert n.name == "char" and n.decode(n.encode("hello")) == "hello"
