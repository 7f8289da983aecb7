#!/usr/bin/env bash
# The README's main command: set up, then `rsp-bench run` on the embedded model (pass --quick
# for the CI-sized subset; any other rsp-bench run option is passed through).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
. .venv/bin/activate
rsp-bench run "$@"
