#!/usr/bin/env bash
# The README's test command: set up, then the unit tests and the quick suites (with the gate
# against the committed baseline when one exists for this machine). Only the suites whose quick
# run has been verified green on this machine kind are in this command (adversarial and
# throughput); the quality and lm-eval suites run with `rsp-bench run --quick` or
# `pytest suites --rsp-quick -m "equivalence or extraction or lm_eval"`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
. .venv/bin/activate
python -m pytest tests -q -p no:cacheprovider
python -m pytest suites --rsp-quick -q -p no:cacheprovider -m "adversarial or throughput"
