#!/usr/bin/env bash
# rsp-bench ab on a second machine (issue #24, "fails on another machine, without any stored speed
# baseline"): an A/A run and a planted 15% slowdown of the C decode step, each repeated, on a machine
# whose fingerprint has no speed baseline here. Written for the device tool's lent machine (x86-64,
# 16 cores, Python 3.12 with its own torch, no network); run from the repository root there:
#     bash scripts/device/ab_second_machine.sh            (results under $OUT, default /tmp/out)
# What it needs under .devcheck/ (ignored by git; made here by scripts/device/prepare.sh):
#   whl/            (optional) wheels to install first
#   smollm2-shape/  SmolLM2-135M-Instruct's config.json and tokenizer files (no weights)
#   slow15.diff     the planted slowdown (one extra pass over 84% of the LM head's rows a step)
# The embedded weights (93 MB) cannot travel there, so the model is SmolLM2-135M's shapes and
# tokenizer with seeded random weights: decode speed depends on the shapes, not the values, and an
# A/A run must still come out token-identical. Then, if a GPU is there, the GPU tests that are
# skipped everywhere else (tests/test_gpu_timeline.py, the throughput suite's `gpu` test).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DC=.devcheck
PY=${PY:-python3}
log() { echo "== $(date -u +%H:%M:%S) $*"; }

if [ -d "$DC/whl" ] && ls "$DC"/whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$DC"/whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
log "environment"
$PY - <<'PY' | tee "$OUT/environment.txt"
import os, platform, torch, transformers, numpy
print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__,
      "numpy", numpy.__version__, "cpus", os.cpu_count(), "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
from rsp_bench.records import machine_info
print(machine_info())
PY
lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node0" | tee -a "$OUT/environment.txt"

log "random model of SmolLM2-135M's shapes"
MODEL=/tmp/smollm2-shape-random
$PY - "$DC/smollm2-shape" "$MODEL" <<'PY' || exit 4
import shutil, sys, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(20261204)
model = LlamaForCausalLM(LlamaConfig.from_pretrained(src)).eval()
with torch.no_grad():  # as make_tiny_model: decisive greedy tokens instead of near-uniform logits
    model.model.embed_tokens.weight.mul_(20.0)
model.save_pretrained(dst, safe_serialization=True)
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, dst / f.name)
print("params", sum(p.numel() for p in model.parameters()))
PY

log "git: base = this tree, head = base + the planted slowdown"
export GIT_AUTHOR_NAME=devcheck GIT_AUTHOR_EMAIL=devcheck@localhost GIT_COMMITTER_NAME=devcheck GIT_COMMITTER_EMAIL=devcheck@localhost
if ! git rev-parse --verify HEAD >/dev/null 2>&1; then git init -q && git add -A && git commit -qm "base (copy of the tree)"; fi
git add -A >/dev/null 2>&1; git diff --cached --quiet || git commit -qm "uncommitted changes of the copy"
BASE=$(git rev-parse HEAD)
git branch -f devcheck/slow15 "$BASE" && git worktree add -q /tmp/plant15 devcheck/slow15 \
  && git -C /tmp/plant15 apply "$PWD/$DC/slow15.diff" && git -C /tmp/plant15 commit -qam "planted 15% slowdown" || exit 5
HEAD15=$(git rev-parse devcheck/slow15); git worktree remove --force /tmp/plant15
echo "base $BASE head15 $HEAD15" | tee -a "$OUT/environment.txt"

AB_REPEAT_AA=${AB_REPEAT_AA:-2}; AB_REPEAT_SLOW=${AB_REPEAT_SLOW:-3}
# The slowdown first: it is the check no other machine has made.
log "planted 15% slowdown x $AB_REPEAT_SLOW"
$PY -m rsp_bench.cli ab --base "$BASE" --head "$HEAD15" --model "$MODEL" --repeat "$AB_REPEAT_SLOW" ${AB_ARGS:-} \
  --power-out "$OUT/ab_power_second_machine.json" --power-name "slow15_second_machine${AB_NAME_SUFFIX:-}" \
  --power-note "head = base + one extra pass over 84% of the LM head's rows per decode step; device tool's machine (CPU side), random weights of SmolLM2-135M's shapes" \
  --out "$OUT/ab_slow15_last.json" 2>&1 | tee -a "$OUT/ab.log"
[ "$AB_REPEAT_AA" -gt 0 ] && log "A/A x $AB_REPEAT_AA" && $PY -m rsp_bench.cli ab --base "$BASE" --head "$BASE" --model "$MODEL" --repeat "$AB_REPEAT_AA" \
  --power-out "$OUT/ab_power_second_machine.json" --power-name aa_second_machine \
  --power-note "A/A on the device tool's machine (CPU side), random weights of SmolLM2-135M's shapes" \
  --out "$OUT/ab_aa_last.json" 2>&1 | tee -a "$OUT/ab.log"

if [ "${SKIP_GPU:-0}" != 1 ] && $PY -c "import torch,sys; sys.exit(not torch.cuda.is_available())"; then
  log "GPU tests"
  # the plugin is an entry point of the installed package; a bare copy names it
  PLUGIN=$($PY -c "import importlib.metadata as m; print('' if any(e.name == 'rsp_bench' for e in m.entry_points(group='pytest11')) else '-p rsp_bench.plugin')")
  timeout ${GPU_T1:-60} $PY -m pytest -q -p no:cacheprovider $PLUGIN tests/test_gpu_timeline.py 2>&1 | tail -5 | tee "$OUT/gpu_tests.log"
  timeout ${GPU_T2:-150} $PY -m pytest -q -p no:cacheprovider $PLUGIN suites/test_throughput.py -m gpu --rsp-model "$MODEL" \
    --rsp-no-gate --rsp-results "$OUT/gpu" 2>&1 | tail -25 | tee -a "$OUT/gpu_tests.log"
fi
log "done"
