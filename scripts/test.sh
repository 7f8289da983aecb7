#!/usr/bin/env bash
# The README's test command (what CI runs): set up (llama-cpp-python included: a source build the
# first time), then the unit tests, every quick suite of the reference engine, and the quick
# equivalence, extraction and throughput suites of llama.cpp's ladder (F32, Q8_0, Q4_K_M, Q4_1
# against reference/off), each session gated in CI mode (--rsp-ci) against the committed
# baselines in results/baselines/: quality on any machine, speed on its own machine.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
bash scripts/bootstrap.sh
. .venv/bin/activate
echo "[test.sh] setup took $(( $(date +%s) - started )) s"
python -m pytest tests -n 2 -q -p no:cacheprovider  # two workers: this runner's two cores
python -m pytest tests --run-slow -m slow -q -p no:cacheprovider  # the tests that start torch processes
python -m pytest suites --rsp-quick --rsp-ci -q -p no:cacheprovider
python -m pytest suites/test_equivalence.py suites/test_extraction.py suites/test_throughput.py \
  --rsp-quick --rsp-ci --rsp-engine llama-cpp -q -p no:cacheprovider
echo "[test.sh] total $(( $(date +%s) - started )) s"
