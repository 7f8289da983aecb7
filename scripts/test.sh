#!/usr/bin/env bash
# The README's test command: set up, then the unit tests and every quick suite (equivalence,
# extraction, throughput, adversarial, lm-eval), gated against the committed baseline in
# results/baselines/ when one exists for this machine kind (a missing one warns).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
. .venv/bin/activate
python -m pytest tests -q -p no:cacheprovider
python -m pytest suites --rsp-quick --rsp-ci -q -p no:cacheprovider
