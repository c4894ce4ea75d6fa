#!/usr/bin/env bash
# make demo: the whole AO-GPT pipeline on a laptop CPU, on the embedded Penn Treebank (characters).
#   1 prepare PTB   2 train a tiny AO-GPT (config/train_demo.py: 10% L2R, EMA)
#   3 eval_ppl.py on PTB test: L2R, any-order, ensemble x8   4 sample.py: samples and one infilling
#   5 a summary next to a unigram baseline computed on the same test tokens
# Everything goes to out-demo/. Re-running reuses the prepared data, a finished checkpoint and its
# evaluation (an interrupted training run resumes); `rm -rf out-demo` starts over.
# DEMO_CHUNKS: PTB test rows of 64 characters to evaluate (default 1000 of 6,583).
set -euo pipefail
cd "$(dirname "$0")"
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
MAX_ITERS=$($PY -c "ns = {}; exec(open('$CONFIG').read(), ns); print(ns['max_iters'])")
DONE=$($PY -c "import json; print(max([json.loads(l)['iter'] for l in open('$OUT/log.jsonl') if l.strip()] or [0]))" 2>/dev/null || echo 0)
if [ -f "$OUT/ckpt.pt" ] && [ "$DONE" -ge "$MAX_ITERS" ]; then
    echo "done already: $OUT/ckpt.pt reached max_iters ($MAX_ITERS); reusing it (rm -rf $OUT to retrain)"
else
    # train.py logs a line every log_interval iterations; this filter turns them into a progress bar
    # (the full log, resolved config included, is in $OUT/train.log)
    $PY train.py $CONFIG --out_dir=$OUT --init_from=auto 2>&1 | tee -a "$OUT/train.log" | $PY -c "
import re, sys
from tqdm import tqdm
bar = tqdm(total=$MAX_ITERS, initial=$DONE, unit='it', desc='train', dynamic_ncols=True)
for line in sys.stdin:
    m = re.match(r'iter (\d+)/\d+: loss ([\d.]+), .*?([\d,]+) tok/s', line)
    if m:
        bar.update(int(m.group(1)) - bar.n)
        bar.set_postfix_str(f'loss {m.group(2)}, {m.group(3)} tok/s')
    elif re.match(r'(model:|eval |resumed|error|Traceback|\S+Error)', line):
        bar.write(line.rstrip())
bar.close()
"
fi

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
$PY - "$OUT" "$EVAL" <<'EOF'
# The unigram baseline: symbol frequencies of PTB *train* with additive smoothing (alpha chosen on PTB
# val), scored on exactly the test rows eval_ppl.py scored, every symbol counted as the model's are.
import json, math, sys
import numpy as np
import torch
from evalsets import load_eval_chunks
from tokenizer import get_codec

out, ev = sys.argv[1], json.load(open(sys.argv[2]))
ck = torch.load(f'{out}/ckpt.pt', map_location='cpu', weights_only=True)
cfg, it, ma = ck['config'], ck['iter_num'], ck['model_args']
data = f"data/{cfg['dataset']}"
codec = get_codec(data)
unit = 'characters' if codec.name == 'char' else 'tokens'
r, n = ev['datasets']['ptb'], ev['block_size']
counts = np.bincount(np.memmap(f'{data}/train.bin', dtype=np.uint16, mode='r'), minlength=codec.vocab_size)
def unigram_nll(alpha, x):
    p = (counts + alpha) / (counts.sum() + alpha * codec.vocab_size)
    return -np.log(p[x]).mean()
val = load_eval_chunks('ptb', codec, n, split='validation').numpy()
alpha = min((1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001), key=lambda a: unigram_nll(a, val))
test = load_eval_chunks('ptb', codec, n, split='test')
rows_all = len(test)
test = test[:ev['max_chunks'] or None].numpy()
assert test.size == r['tokens'], "the baseline must score exactly the tokens eval_ppl.py scored"
uni = unigram_nll(alpha, test)
stages = [l.rstrip('\n').split('\t') for l in open(f'{out}/stages.tsv')]

params = sum(v.numel() for v in ck['model'].values())
print(f"AO-GPT, {ma['n_layer']} layers x {ma['n_embd']} ({params / 1e6:.2f}M parameters), {it} steps x "
      f"{cfg['batch_size'] * cfg['block_size']:,} {unit} of PTB train (l2r_frac {cfg['l2r_frac']}), EMA weights")
print(f"PTB test: {r['chunks']} of {rows_all} rows x {n} = {r['tokens']:,} {unit}, {codec.name} codec")
table = [(f"unigram of PTB train (add-{alpha:g} smoothing)", uni),
         ("AO-GPT, left to right (exact)", r['l2r']['nll']),
         ("AO-GPT, any-order, 1 random order (bound)", r['any_order']['nll']),
         (f"AO-GPT, any-order, ensemble x{ev['ensemble']} (bound)", r['ensemble']['nll'])]
print(f"  {'':<46} {'nats/' + unit[:-1]:>14} {'PPL':>8}  vs unigram PPL")
for name, nll in table:
    print(f"  {name:<46} {nll:14.3f} {math.exp(nll):8.2f}  {math.exp(nll - uni):.2f}x")
print("wall time: " + ", ".join(f"{s} {float(t):.0f} s" for s, t in stages)
      + f"; total {sum(float(t) for _, t in stages):.0f} s before this summary (plus the venv install)")
EOF
