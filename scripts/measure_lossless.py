"""Moved: ``rsp-bench lossless`` (rsp_bench/lossless_measure.py) since stop 45. This name stays
so that the commands recorded in results/lossless*.json still run: it passes its arguments on."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rsp_bench.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(["lossless", *sys.argv[1:]]))
