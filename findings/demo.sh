#!/usr/bin/env bash
# make demo: the whole AO-GPT pipeline on a laptop CPU, on the embedded Penn Treebank (characters).
#   1 prepare PTB   2 train a tiny AO-GPT (config/train_demo.py: 10% L2R, EMA)
#   3 eval_ppl.py on PTB test: L2R, any-order, ensemble x8   4 sample.py: samples and one infilling
#   5 demo_summary.py: the perplexities beside a unigram baseline on the same test characters
# Everything goes to out-demo/. Re-running reuses the prepared data, a finished checkpoint and its
# evaluation (an interrupted training run resumes); `rm -rf out-demo` starts over.
# DEMO_CHUNKS: PTB test rows of 64 characters to evaluate (default 1000 of 6,583).
set -euo pipefail
cd "$(dirname "$0")/.."  # the repository root
PY=${PYTHON:-.venv/bin/python}
OUT=${DEMO_OUT:-out-demo}
CHUNKS=${DEMO_CHUNKS:-1000}
CONFIG=${DEMO_CONFIG:-config/train_demo.py}
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
mkdir -p "$OUT"
: > "$OUT/stages.tsv"
T0=$EPOCHREALTIME
stage() {  # stage KEY TITLE: record the previous stage's wall time, print a header
    local now=$EPOCHREALTIME
    [ -n "${STAGE:-}" ] && awk -v k="$STAGE" -v a="$T0" -v b="$now" 'BEGIN { printf "%s\t%.1f\n", k, b - a }' >> "$OUT/stages.tsv"
    T0=$now; STAGE=$1
    [ -n "${2:-}" ] && echo -e "\n=== $2" || true
}
hide_config() { sed -u -E '/^config:$/d; /^  [a-z_0-9]+ += /d'; }  # the resolved config stays in the logs

stage prepare "1/5 prepare PTB, character level (data/ptb/prepare.py --char=True)"
$PY data/ptb/prepare.py --char=True 2>&1 | hide_config

stage train "2/5 train a tiny AO-GPT ($CONFIG, out_dir=$OUT)"
# init_from=auto resumes an interrupted run and trains nothing once max_iters is reached. On a terminal
# train.py draws its own progress bar (stderr) in place of the per-step log lines; the whole log, the
# resolved config included, is also in $OUT/train.log.
$PY train.py $CONFIG --out_dir=$OUT --init_from=auto | tee -a "$OUT/train.log" | hide_config

stage eval "3/5 eval_ppl.py on PTB test (the first $CHUNKS rows)"
EVAL="$OUT/eval_ppl.json"
if [ -f "$EVAL" ] && [ "$EVAL" -nt "$OUT/ckpt.pt" ] && grep -q "\"max_chunks\": $CHUNKS," "$EVAL"; then
    echo "done already: $EVAL is newer than the checkpoint; reusing it"
else
    $PY eval_ppl.py --out_dir $OUT --datasets ptb --max_chunks $CHUNKS --ensemble 8 --json_out "$EVAL" \
        2>&1 | hide_config
fi

stage sample "4/5 sample.py: 3 samples in 32 steps, then one infilling"
$PY sample.py --out_dir $OUT --batch_size 3 --steps 32 --seed 7 2>&1 | hide_config
echo
$PY sample.py --out_dir $OUT --batch_size 3 --steps 8 --seed 7 \
    --template "the company said [BLANK:12] in the third quarter" 2>&1 | hide_config

stage summary "5/5 summary"
# the summary's check (clearly below the unigram) is the demo's promise, made for its own config only
CHECK=True; [ "$CONFIG" = config/train_demo.py ] || CHECK=False
$PY findings/demo_summary.py --out_dir=$OUT --check=$CHECK
