#!/usr/bin/env bash
# make demo: filled in by the demo issue. For now it runs what exists: the model's tests.
set -euo pipefail
PYTHON=${PYTHON:-python}
$PYTHON -m pytest -q tests/test_model.py
