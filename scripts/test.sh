#!/usr/bin/env bash
# The README's test command: set up, then the unit tests and the quick suites (with the gate
# against the committed baseline).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
. .venv/bin/activate
python -m pytest tests -q -p no:cacheprovider
python -m pytest suites --rsp-quick -q -p no:cacheprovider
