#!/usr/bin/env bash
# The GPU path in one check (scripts/device_check.py): a ~1B Llama-architecture model built locally, the
# project's engine and the vLLM backend in bf16, log-probs against the trainer, decode tokens/s against batch
# size, eta = 0 and eta = 4 training runs; one JSON under docs/results/ (never replaced). Under 8 minutes on
# one GPU. `--cpu`: the same code path at tiny scale in fp32 (run by .ci/run so that it does not rot).
#
#   bash scripts/device_check.sh [--cpu] [--out FILE] [--budget-s S]
#
# Python: $ASYNCRL_PYTHON, else .venv-vllm (vLLM's part runs) when it exists, else .venv (vLLM's part is
# skipped with its reason). On a GPU machine use an environment with the CUDA builds of torch and vllm
# (docs/gpu.md).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${ASYNCRL_PYTHON:-}" ]; then
  PY="$ASYNCRL_PYTHON"
elif [ -x "$REPO/.venv-vllm/bin/python" ]; then
  PY="$REPO/.venv-vllm/bin/python"
else
  PY="$REPO/.venv/bin/python"
fi
cd "$REPO"
exec "$PY" "$REPO/scripts/device_check.py" "$@"
