# Two commands for a new user: `make demo` and `make test`. Each creates (or reuses) .venv first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp

.PHONY: help install test test-all demo findings findings-quick findings-optimizers findings-adapt findings-length clean

help:  ## this list: each target, what it does
	@awk '/^[a-z][a-z-]*:.*## / { t = $$0; sub(/:.*/, "", t); d = $$0; sub(/.*## /, "", d); printf "  make %-20s %s\n", t, d }' $(MAKEFILE_LIST)

$(STAMP): requirements.txt requirements-dev.txt
	@$(PY) -c 'import sys; assert sys.version_info >= (3, 11), "aogpt needs Python 3.11+"'
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first and pinned: here that takes the 2.13.0 CPU wheel, never a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements.txt -r requirements-dev.txt
	# the GPT-2 BPE file ships in openai-whisper; --no-deps keeps numba/triton out
	$(BIN)/pip install -q --no-deps openai-whisper==20250625
	touch $(STAMP)

install: $(STAMP)  ## creates .venv with the pinned torch and the requirements

# make test's pytest-xdist workers, one torch thread each (measured faster than one 2-thread process on 2 cores)
WORKERS ?= 2
test: $(STAMP)  ## the test suite but the slow end-to-end checks: a few minutes on 2 cores
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests -m 'not slow' -n $(WORKERS)

test-all: $(STAMP)  ## the whole suite, slow end-to-end checks included (what CI runs)
	$(BIN)/python -m pytest -q tests

demo: $(STAMP)  ## prepares PTB, trains a tiny AO-GPT on the CPU, evaluates and samples (~5 min)
	PYTHON=$(BIN)/python bash findings/demo.sh

# about 30 minutes on 2 CPU cores with 4 seeds (29.6 on 2026-11-28), + finding 10's runs (about 60 CPU-core-minutes
# on 4 seeds)
findings: $(STAMP)  ## the paper's findings and finding 10 at small scale, on the CPU; writes results/
	$(BIN)/python findings/reproduce.py
	$(BIN)/python findings/orders.py

findings-quick: $(STAMP)  ## the same pipeline with tiny runs, a few minutes; judges nothing
	$(BIN)/python findings/reproduce.py --quick
	$(BIN)/python findings/orders.py --quick

# about 45 CPU-core-minutes of its own runs
findings-optimizers: $(STAMP)  ## finding 9, Muon against AdamW; its section joins results/README.md
	$(BIN)/python findings/optimizers.py

# 15 levers, the recipe on 4 seeds and its parts from scratch: about 127 CPU-core-minutes of its own runs (the parts'
# 8 runs: 26.9 on 2026-11-28) (finding 9's scratch runs reused from results/)
findings-adapt: $(STAMP)  ## finding 11, a trained GPT adapted into an AO-GPT; its section joins results/README.md
	$(BIN)/python findings/adapt.py

# 4 seeds of AO-GPT and the encoder MDM at 32, 128 and 512 characters, the rope block and sigma-GPT at 32 and 128:
# about 150 CPU-core-minutes of its own runs (147 on 2026-11-28, across three invocations; reproduce.py's runs at 32
# reused when it trained them)
findings-length: $(STAMP)  ## finding 12, any-order against the encoder MDM as the window grows; its section joins results/README.md
	$(BIN)/python findings/length.py

clean:  ## removes out-demo and the caches
	rm -rf out-demo __pycache__ tests/__pycache__
