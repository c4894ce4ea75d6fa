"""A source model's tokenizer as a codec (aogpt/tokenizer.py, read with `tokenizers`) and the token files' dtype rule
(aogpt/bins.py): round trips on a tiny BPE trained here, a vocabulary past 65,535 written as uint32 by the real
prepare script and read back, mismatches refused in one line, the checkpoint's codec record, and eval sets encoded
again with the source's codec. Nothing here touches the network: the sources are folders in the real layout."""
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from aogpt import bins, evalsets, tokenizer
from aogpt.checkpoint import checkpoint_codec, load_checkpoint, save_checkpoint
from aogpt.errors import UserError
from aogpt.tokenizer import codec_from_record, get_codec, source_codec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "data"))
import prepare_common as pc  # noqa: E402

TEXT = "Ünïcödé, emoji 🙂, tabs\tand  spaces\n\nnew paragraph with <|endoftext|> spelled out."


def tiny_bpe(folder, config=None, tok_config=None):
    """A byte-level BPE trained here (as GPT-2, Llama 3 and Qwen are byte-level), saved as a model folder is:
    tokenizer.json, config.json, tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<|im_end|>", "<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog", TEXT] * 20, trainer)
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    # eos_token_id as a list, the way chat models list theirs: the first is the end of a document
    for name, d in (("config.json", config if config is not None else {"eos_token_id": [0, 1]}),
                    ("tokenizer_config.json", tok_config if tok_config is not None else
                     {"bos_token": {"content": "<s>", "special": True}})):
        with open(os.path.join(folder, name), "w") as f:
            json.dump(d, f)
    return str(folder)


def offset_bpe(folder, offset=70_000):
    """tiny_bpe with every id moved up by offset: a byte-level BPE over any text whose ids are all past 65,535
    (its end of document, <|endoftext|>, is offset itself)."""
    tiny_bpe(folder, config={}, tok_config={"eos_token": "<|endoftext|>"})
    path = os.path.join(folder, "tokenizer.json")
    with open(path) as f:
        tj = json.load(f)
    tj["model"]["vocab"] = {t: i + offset for t, i in tj["model"]["vocab"].items()}
    for t in tj["added_tokens"]:
        t["id"] += offset
    with open(path, "w") as f:
        json.dump(tj, f)
    return str(folder)


def wide_vocab(folder, n=70_000):
    """A word-level tokenizer of n words (ids 0..n-1) and [UNK]: ids past 65,535 with a tiny file."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {f"w{i}": i for i in range(n)}
    vocab["[UNK]"] = n
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": f"w{n - 1}"}, f)  # no config.json: the end of a document named by its token
    return str(folder)


def test_source_tokenizer_round_trips_and_names_its_specials(tmp_path):
    codec, origin = source_codec(tiny_bpe(tmp_path / "src"))
    assert origin == str(tmp_path / "src") and codec.name == "tokenizers"
    assert (codec.eot, codec.bos) == (0, 2)  # config.json's first eos id; tokenizer_config.json's bos token
    ids = codec.encode(TEXT)
    assert codec.decode(ids) == TEXT
    assert 0 not in ids and 1 not in ids  # a special token spelled in a document is text, as in the GPT-2 codec
    assert codec.decode([0]) == "<|endoftext|>" and evalsets.doc_end(codec) == [0]
    # ids a model may sample past the vocabulary, and -1 fill, are U+FFFD (tokenizers alone drops them unseen)
    hi = codec.encode("hi")
    assert codec.decode(hi + [codec.vocab_size, -1] + hi) == "hi\ufffd\ufffdhi"
    # what the record holds rebuilds the same codec, and a changed tokenizer.json inside it is refused
    rec = codec.record()
    assert rec["sha256"] == hashlib.sha256((tmp_path / "src" / "tokenizer.json").read_bytes()).hexdigest()
    again = codec_from_record(json.loads(json.dumps(rec)))
    assert again.record() == rec and again.encode(TEXT) == ids
    with pytest.raises(UserError, match="changed after it was recorded"):
        codec_from_record(dict(rec, json=rec["json"] + " "))  # any edit, even one that parses the same


def test_eot_from_tokenizer_config_and_no_bos(tmp_path):
    """No eos in config.json: tokenizer_config.json's eos_token, looked up in the vocabulary; no bos anywhere: None
    (Qwen prepends nothing)."""
    codec, _ = source_codec(tiny_bpe(tmp_path / "q", config={}, tok_config={"eos_token": "<|im_end|>"}))
    assert (codec.eot, codec.bos) == (1, None)
    # Qwen3-0.6B's case: its eos ends a chat turn; --eot_token names the token its documents end with
    assert source_codec(str(tmp_path / "q"), "<|endoftext|>")[0].eot == 0
    with pytest.raises(UserError, match=re.escape("'<|eos|>' is not a token of")):
        source_codec(str(tmp_path / "q"), "<|eos|>")
    with pytest.raises(UserError, match="end of a document of a --tokenizer"):
        source_codec("", "<|endoftext|>")
    tiny_bpe(tmp_path / "none", config={}, tok_config={})
    with pytest.raises(UserError, match="names no eos"):
        source_codec(str(tmp_path / "none"))
    assert source_codec(str(tmp_path / "none"), "<|im_end|>")[0].eot == 1
    with pytest.raises(UserError, match="holds no tokenizer.json"):
        source_codec(str(tmp_path))
    with pytest.raises(UserError, match="no such folder"):
        source_codec(str(tmp_path / "nowhere"))


def test_hf_spec_reads_the_hf_cache_offline(tmp_path, monkeypatch):
    """hf:owner/name resolves through huggingface_hub's cache (its real layout: refs/main -> snapshots/<commit>/),
    offline, and the source is recorded as the commit read."""
    from huggingface_hub import constants
    commit = "a" * 40
    repo = tmp_path / "hub" / "models--org--tiny"
    tiny_bpe(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    codec, origin = source_codec("hf:org/tiny")
    assert origin == f"hf:org/tiny@{commit}" and (codec.eot, codec.bos) == (0, 2)
    with pytest.raises(UserError, match="not in the Hugging Face cache"):
        source_codec("hf:org/other")


def test_one_dtype_rule_and_mismatches_refused_in_one_line(tmp_path):
    assert [bins.bin_dtype(v) for v in (256, 50257, 65536, 65537, 151_936)] == \
        ["uint16", "uint16", "uint16", "uint32", "uint32"]
    assert bins.meta_dtype({}) == "uint16"  # nanoGPT's meta.json, and ours before uint32: uint16
    with pytest.raises(UserError, match="dtype uint16 cannot hold the ids of its 70,001-symbol vocabulary"):
        bins.meta_dtype({"dtype": "uint16", "vocab_size": 70_001})
    with pytest.raises(UserError, match="'int8' is not a token file dtype"):
        bins.meta_dtype({"dtype": "int8"})
    d = tmp_path / "d"
    d.mkdir()
    np.arange(70_000, 70_003, dtype=np.uint32).tofile(d / "val.bin")
    (d / "meta.json").write_text(json.dumps({"dtype": "uint32", "vocab_size": 70_003, "val_tokens": 3}))
    assert bins.load_bin(str(d), "val").tolist() == [70_000, 70_001, 70_002]
    # the same bytes claimed as uint16 (6 ids): the recorded count tells, and says which way it went wrong
    with pytest.raises(UserError, match=r"records 3 uint16 tokens \(6 bytes\).*another dtype"):
        bins.load_bin(str(d), "val", {"dtype": "uint16", "val_tokens": 3})
    (d / "val.bin").write_bytes(b"\0" * 6)
    with pytest.raises(UserError, match="6 bytes, not a multiple of 4, so it is not a whole number of uint32"):
        bins.load_bin(str(d), "val", {"dtype": "uint32"})


def test_uint32_bins_through_the_real_prepare_script_and_train_check(tmp_path):
    """data/text/prepare.py --tokenizer with ids past 65,535: uint32 bins, meta.json's dtype, the tokenizer copied
    beside them, read back by load_bin and get_codec exactly; preflight.check_data reads them; a tokenizer.json
    swapped afterwards is refused."""
    src = wide_vocab(tmp_path / "wide")
    words = [f"w{i}" for i in (3, 65_535, 65_536, 69_998, 70_000 + 5, 12)]  # 70,005 is [UNK]
    (tmp_path / "book.txt").write_text("".join(" ".join(words) + "\n" for _ in range(20)))
    out = tmp_path / "data" / "book"
    cmd = [sys.executable, "data/text/prepare.py", f"--input={tmp_path / 'book.txt'}", f"--tokenizer={src}",
           f"--out_dir={out}", "--doc_unit=line"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["dtype"], meta["vocab_size"], meta["eot"], meta["tokenizer"]) == ("uint32", 70_001, 69_999,
                                                                                  "tokenizers")
    assert meta["tokenizer_source"] == src and (out / "tokenizer.json").read_bytes() == \
        (tmp_path / "wide" / "tokenizer.json").read_bytes()
    codec = get_codec(out)
    doc = [3, 65_535, 65_536, 69_998, 70_000, 12, 69_999]  # the line's ids, then the end of the document
    for split, n in (("train", 18), ("val", 2)):
        assert os.path.getsize(out / f"{split}.bin") == 4 * meta[f"{split}_tokens"]
        assert bins.load_bin(str(out), split).tolist() == doc * n
    assert codec.decode(doc[:4]) == "w3 w65535 w65536 w69998"
    from aogpt.preflight import check_data
    _, got, n_train, n_val = check_data({"data_root": str(tmp_path / "data"), "dataset": "book", "block_size": 8})
    assert got.record() == codec.record() and (n_train, n_val) == (126, 14)
    # rerun: reused; a tokenizer.json changed beside the bins: refused, naming the fix
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "already prepared" in r.stdout
    wide_vocab(tmp_path / "other", n=70_001)
    (out / "tokenizer.json").write_bytes((tmp_path / "other" / "tokenizer.json").read_bytes())
    with pytest.raises(UserError, match="not the tokenizer the bins were made with"):
        get_codec(out)


def test_prepare_refuses_char_and_tokenizer_together(tmp_path):
    (tmp_path / "t.txt").write_text("a\nb\nc\n")
    r = subprocess.run([sys.executable, "data/text/prepare.py", f"--input={tmp_path / 't.txt'}", "--char=True",
                        f"--tokenizer={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "either --char=True or --tokenizer" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_checkpoint_keeps_the_whole_tokenizer_and_checks_a_dataset_against_it(tmp_path):
    """The record survives torch.save / weights_only load; it rebuilds the codec without the source folder; a
    dataset of another codec is refused, and one prepared with the same tokenizer.json passes."""
    codec, _ = source_codec(tiny_bpe(tmp_path / "src"))
    save_checkpoint({"codec": codec.record(), "config": {}}, str(tmp_path / "ckpt.pt"))
    for f in os.listdir(tmp_path / "src"):
        os.remove(tmp_path / "src" / f)  # the source is gone: the checkpoint does not need it
    ck = load_checkpoint(str(tmp_path / "ckpt.pt"))
    assert checkpoint_codec(ck).encode(TEXT) == codec.encode(TEXT)
    same = tmp_path / "same"
    pc.prepare(str(same), {"train": pc.as_dataset(["a b"]), "val": pc.as_dataset(["c"])}, "test", codec=codec)
    assert checkpoint_codec(ck, str(same)).record() == codec.record()
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "meta.json").write_text(json.dumps({"tokenizer": "gpt2"}))
    with pytest.raises(UserError, match="trained with a tokenizers"):
        checkpoint_codec(ck, str(gpt2))


def test_eval_sets_are_encoded_with_the_source_codec(tmp_path):
    """A hub-style set: each document detokenized, encoded with the source's codec, its eot after it. owt's val.bin
    (GPT-2 ids): each document decoded, then encoded again with the source's codec."""
    codec, _ = source_codec(tiny_bpe(tmp_path / "src"))
    x = evalsets.load_eval_chunks("ptb", codec, 16)
    docs = evalsets.ptb_documents("test")
    flat = x.flatten().tolist()
    first = codec.encode(evalsets.ptb_detokenize(docs[0])) + [0] + codec.encode(evalsets.ptb_detokenize(docs[1]))
    assert flat[:len(first)] == first
    owt_docs = ["caf\u00e9 \U0001F642 one", "two <|endoftext|> spelled", "three\n\nlines"]
    pc.prepare(str(tmp_path / "owt"), {"val": pc.as_dataset(owt_docs)}, "test")  # GPT-2, as OpenWebText's
    read = {}
    y = evalsets.load_eval_chunks("owt", codec, 4, path=str(tmp_path / "owt"), keep_partial=True, record=read)
    want = [i for d in owt_docs for i in codec.encode(d) + [0]]
    assert y.flatten().tolist()[:len(want)] == want and read["retokenized_from"] == "gpt2"
    gpt2 = evalsets.load_eval_chunks("owt", get_codec(None), 4, path=str(tmp_path / "owt"), record=read)
    assert gpt2.flatten().tolist() == bins.load_bin(str(tmp_path / "owt"), "val").tolist()[:gpt2.numel()]
    assert tokenizer.gpt2_codec().record() == get_codec(str(tmp_path / "owt")).record()


def test_train_reads_uint32_windows_and_its_checkpoint_rebuilds_the_codec(tmp_path, monkeypatch):
    """train.py on a dataset of ids past 65,535: the windows it trains on are the ids written (a uint16 reader would
    see each id's two halves, all inside the vocabulary, so no check would fire), and the checkpoint's codec is
    the source's, rebuilt by load_model from the checkpoint alone."""
    from test_train import TINY, run_inprocess

    from aogpt.checkpoint import load_model
    codec, _ = source_codec(wide_vocab(tmp_path / "wide"))
    rng = np.random.default_rng(0)
    docs = {s: [" ".join(f"w{i}" for i in rng.integers(65_530, 65_546, 50)) for _ in range(n)]
            for s, n in (("train", 40), ("val", 8))}
    data = tmp_path / "data" / "wide"
    pc.prepare(str(data), {k: pc.as_dataset(v) for k, v in docs.items()}, "test", codec=codec)
    (tmp_path / "tiny.py").write_text(TINY.replace("dataset = 'runs'", "dataset = 'wide'"))
    ns = run_inprocess(monkeypatch, [str(tmp_path / "tiny.py"), f"--data_root={tmp_path / 'data'}",
                                     f"--out_dir={tmp_path / 'out'}", "--max_iters=1", "--eval_interval=1"])
    x = ns["read_windows"]("train", [3])[0].tolist()
    assert x == bins.load_bin(str(data), "train")[3:3 + len(x)].tolist() and min(x) >= 65_530
    _, _, _, got = load_model(str(tmp_path / "out"), dataset="")
    assert got.record() == codec.record()
    # an export carries it too (inside config.json's codec), and its card names it instead of "character level"
    r = subprocess.run([sys.executable, "export.py", f"--ckpt={tmp_path / 'out'}", f"--dest={tmp_path / 'exp'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert load_model(str(tmp_path / "exp"), dataset="")[3].record() == codec.record()
    card = (tmp_path / "exp" / "README.md").read_text()
    assert f"tokenizer.json (70001 ids, sha256 {codec.sha256[:12]}" in card and "character level" not in card
