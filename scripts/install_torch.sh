#!/usr/bin/env bash
# Install torch into the given python's environment without pulling a multi-GB CUDA build onto a
# machine that has no GPU. Order: already installed -> GPU present (default wheel) -> the CPU
# build (`torch==X+cpu`, found in pip's configured find-links/indexes, e.g. a local wheel) ->
# PyTorch's CPU index.
set -euo pipefail
PY="${1:-python3}"
if "$PY" -c "import torch" 2>/dev/null; then
  exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "$PY" -m pip install "torch>=2.4,<2.15"
  exit 0
fi
# A `+cpu` local version exists only as a CPU build, never on PyPI's CUDA default.
if "$PY" -m pip install "torch==2.13.0+cpu"; then
  exit 0
fi
"$PY" -m pip install --index-url https://download.pytorch.org/whl/cpu "torch>=2.4,<2.15"
