#!/usr/bin/env bash
# The worked example of docs/gating-a-kernel-change.md, run end to end: baseline the rung "prod"
# as one quantization, rerun it unchanged, then swap its quantization and let the gate judge.
# Usage: bash scripts/demo_gate_quant.sh [BASE_QUANT] [CHANGED_QUANT...]   (default q8_0 q4_1 q4_k_m)
# Writes into a temporary folder (printed); exit status 0 only when every step gave the verdict the
# doc says: the baseline is written, the unchanged rerun passes --rsp-ci, and every planted change
# fails it (a rung that regressed, or one that improved past its tolerance: either way CI is red).
set -uo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
base=${1:-q8_0}; shift || true
changed=("$@"); [ ${#changed[@]} -gt 0 ] || changed=(q4_1 q4_k_m)
out=$(mktemp -d /tmp/gate_demo.XXXXXX)
echo "[demo] folder $out"
suite() {  # $1 = quantization of the rung "prod"; the rest: extra pytest options
  local q=$1; shift
  RSP_LLAMA_CPP_LADDER="prod=$q" python -m pytest suites/test_equivalence.py --rsp-quick --rsp-engine llama-cpp \
    --rsp-results "$out" --rsp-baselines "$out/baselines" -q -p no:cacheprovider "$@"
}
echo "[demo] 1. baseline: prod=$base"
suite "$base" --rsp-update-baseline --rsp-reason "demo: baseline prod=$base" > "$out/1-baseline.log" 2>&1; rc1=$?
echo "[demo]    exit $rc1"
echo "[demo] 2. unchanged rerun: prod=$base"
suite "$base" --rsp-ci > "$out/2-unchanged.log" 2>&1; rc2=$?; echo "[demo]    exit $rc2"
sed -n '/^gate:/,$p' "$out/2-unchanged.log" | grep -E "llama-cpp/prod|^gate|passed|failed" | head -20
status=0
if [ $rc1 -ne 0 ] || ! grep -q "baseline updated:" "$out/1-baseline.log"; then
  echo "[demo] FAIL: the baseline step did not write a baseline (exit $rc1)"; status=1
fi
if [ $rc2 -ne 0 ]; then echo "[demo] FAIL: the unchanged rerun did not pass --rsp-ci (exit $rc2)"; status=1; fi
for q in "${changed[@]}"; do
  echo "[demo] 3. planted change: prod=$q against the prod=$base baseline"
  suite "$q" --rsp-ci > "$out/3-$q.log" 2>&1; rc=$?; echo "[demo]    exit $rc"
  grep -E "llama-cpp/prod" "$out/3-$q.log" | grep -E "regressed|improved|ok " | head -20
  if [ "$q" = "$base" ]; then continue; fi
  if [ $rc -ne 1 ] || ! grep -qE "llama-cpp/prod .*(REGRESSED|improved)" "$out/3-$q.log"; then
    echo "[demo] FAIL: planted change prod=$q was not failed by the gate (exit $rc)"; status=1
  fi
done
echo "[demo] $([ $status -eq 0 ] && echo "every step gave the expected verdict" || echo "FAILED")"
exit $status
