"""
Any local text file -> data/<name>/{train,val}.bin + meta.json, in one command, the same format as
OpenWebText and PTB (so train.py --dataset=<name> just works).

    python data/text/prepare.py --input=book.txt                 # GPT-2 BPE -> data/book
    python data/text/prepare.py --input=book.txt --char=True     # char level -> data/book_char
    python data/text/prepare.py --input=book.txt --tokenizer=hf:HuggingFaceTB/SmolLM2-135M
                                                   # a source model's tokenizer -> data/book_SmolLM2-135M

The last val_fraction of the file's lines is held out as val.bin (a contiguous tail, as nanoGPT does for
Shakespeare: a random split of sentences would leak context into validation). Documents, each followed
by EOT (a newline for char level), are: 'file' - each part is one document; 'paragraph' - blank-line
separated blocks; 'line' - non-empty lines. Re-running skips finished work; --force=True rebuilds.
--tokenizer takes a model folder holding tokenizer.json (with its config.json / tokenizer_config.json,
which name its end of document), or hf:owner/name[@revision] read through the HF cache; ids past 65,535
are written as uint32 (meta.json records the dtype).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # data/, for prepare_common
import prepare_common as pc  # noqa: E402  (puts the repo root on sys.path too)

from aogpt.configurator import configure, print_config, stop_on_ctrl_c  # noqa: E402
from aogpt.errors import die, exit_in_one_line  # noqa: E402

input = ''            # the text file (UTF-8)
out_dir = ''          # '' = data/<input file name without extension> (+ '_char' with char=True)
val_fraction = 0.1    # the last fraction of lines held out as val.bin
doc_unit = 'file'     # what one document is: 'file', 'paragraph' or 'line'
char = False          # character-level codec (vocabulary = the file's characters + '\n') instead of GPT-2
tokenizer = ''        # a source model's tokenizer, not GPT-2: a folder with tokenizer.json, or hf:owner/name[@rev]
eot_token = ''        # with --tokenizer: the token that ends a document instead of the source's eos
num_proc = 1          # tokenizer processes (only helps with many documents)
force = False         # rebuild even if out_dir is already prepared
exit_in_one_line()  # from here on a UserError is its one line, not a traceback
print_config(configure(globals()))
stop_on_ctrl_c("run the same command again to go on: what is done is kept, and the bins come out the same")

if char and tokenizer:
    die("give either --char=True or --tokenizer, not both: each is the dataset's whole codec")
if not input:
    die("give the text file: python data/text/prepare.py --input=path/to/file.txt")
if not os.path.isfile(input):
    die(f"no such file: {input}")
if doc_unit not in ("file", "paragraph", "line"):
    die(f"doc_unit must be 'file', 'paragraph' or 'line', got {doc_unit!r}")
if not 0 < val_fraction < 1:
    die(f"val_fraction must be in (0, 1), got {val_fraction}")
try:
    with open(input, encoding="utf-8") as f:
        text = f.read()
except UnicodeDecodeError as e:
    die(f"{input} is not UTF-8 text ({e.reason} at byte {e.start})")

lines = text.splitlines(keepends=True)
cut = round(len(lines) * (1 - val_fraction))
if cut < 1 or cut >= len(lines):
    die(f"{input} has {len(lines)} lines: too few to hold out {val_fraction:.0%} of them for val.bin")
parts = {"train": "".join(lines[:cut]), "val": "".join(lines[cut:])}


def documents(part):
    if doc_unit == "file":
        return [part]
    if doc_unit == "paragraph":
        return [p.strip("\n") for p in re.split(r"\n[ \t]*\n", part) if p.strip()]
    return [ln.rstrip("\n") for ln in part.splitlines() if ln.strip()]


codec, codec_source = pc.source_codec(tokenizer, eot_token) if tokenizer or eot_token else (None, None)
suffix = "_char" if char else f"_{pc.tokenizer_name(tokenizer)}" if tokenizer else ""
name = os.path.splitext(os.path.basename(input))[0] + suffix
out_dir = out_dir or os.path.join(pc.ROOT, "data", name)
chars = sorted(set(text) | {"\n"}) if char else None
st = os.stat(input)
extra = {"source_bytes": st.st_size, "source_mtime": int(st.st_mtime), "val_fraction": val_fraction,
         "doc_unit": doc_unit}
pc.prepare(out_dir, {k: pc.as_dataset(documents(p)) for k, p in parts.items()}, os.path.abspath(input),
           chars=chars, num_proc=num_proc, force=force, extra=extra, codec=codec, codec_source=codec_source)
