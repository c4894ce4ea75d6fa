"""
OpenWebText -> data/openwebtext/{train,val}.bin + meta.json: GPT-2 BPE, EOT (50256) after every document,
uint16 token ids (nanoGPT's format: np.memmap(path, dtype=np.uint16, mode='r')).

    python data/openwebtext/prepare.py                          # HF hub (nanoGPT notes ~54 GB of HF cache)
    python data/openwebtext/prepare.py --source=/data/owt.jsonl # or a local copy: text, JSON lines,
                                                                # parquet, a save_to_disk folder, or a
                                                                # folder of such files
Held-out split: val_fraction of the documents (0.0005: ~4k of OpenWebText's 8,013,769, as in nanoGPT),
drawn with a fixed seed; the rest, in their original order, is train.
Tokenization runs on num_proc processes with a progress bar (nanoGPT reports ~9B train tokens, a ~17 GB
train.bin, for OpenWebText). Free disk is checked before writing. Re-running skips finished work, and an
interrupted run resumes where it stopped (data/prepare_common.py); --force=True rebuilds.
A plain text file gives one document per line (text_unit='paragraph' or 'document' to change that).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # data/, for prepare_common
import prepare_common as pc  # noqa: E402  (puts the repo root on sys.path too)
from configurator import configure, die, print_config  # noqa: E402
from evalsets import open_documents  # noqa: E402

source = 'Skylion007/openwebtext'  # HF hub name, or a local file / folder (see above)
split = 'train'                    # which split of the source to read (OpenWebText only has train)
column = 'text'                    # the text column
text_unit = 'line'                 # plain text files: a document per 'line', 'paragraph' or 'document'
val_fraction = 0.0005              # fraction of documents held out as val.bin
seed = 2357                        # seed of the held-out draw (nanoGPT's)
num_proc = min(8, os.cpu_count() or 1)  # tokenizer processes
out_dir = ''                       # '' = data/openwebtext
force = False                      # rebuild even if out_dir is already prepared
print_config(configure(globals()))

import numpy as np  # noqa: E402

out_dir = out_dir or os.path.join(pc.ROOT, "data", "openwebtext")
hint = ("pass a local copy: --source=/path/to/owt (text, JSON lines, parquet, or a "
        "save_to_disk folder)")
ds, column = open_documents(source, split=split, column=column, text_unit=text_unit, all_files=True,
                            hint=hint)
n = len(ds)
if n < 2:
    die(f"{source}: {n} document(s); need at least 2 to hold one out for validation")
if not 0 < val_fraction < 1:
    die(f"val_fraction must be in (0, 1), got {val_fraction}")
n_val = min(n - 1, max(1, round(n * val_fraction)))
is_val = np.zeros(n, dtype=bool)
is_val[np.random.default_rng(seed).choice(n, n_val, replace=False)] = True
splits = {"train": ds.select(np.flatnonzero(~is_val)), "val": ds.select(np.flatnonzero(is_val))}
origin = os.path.abspath(source) if os.path.exists(source) else source
extra = {"source_split": split, "source_documents": n, "val_fraction": val_fraction, "seed": seed,
         "source_fingerprint": getattr(ds, "_fingerprint", None)}
print(f"{origin}: {n:,} documents -> train {n - n_val:,} / val {n_val:,}")
pc.prepare(out_dir, splits, origin, num_proc=num_proc, force=force, column=column, extra=extra)
