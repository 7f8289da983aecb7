"""The cost of the server's per-token cancel check on the decode loop: pruning off, batch 1,
``Engine._run`` without a stop_check (what the suites and ``Engine.generate`` run) against one
with the server's own check (``RowControl.should_stop``: a heartbeat, a Cancel read, no stop
strings), interleaved A B A B in one process; prints the median per-token time ratio.

    PYTHONPATH=. python scripts/measure_cancel_overhead.py --rounds 12 --tokens 32 --threads 1

Measured (10 rounds x 32 tokens, 1 thread, two other jobs on the 2 cores): median ratio 0.997
(0.51-1.29 per round under that load): no cost that load lets one see.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from reference_engine import Engine, PruningConfig
from reference_engine.generation import PromptRow
from reference_engine.server.runner import RowControl


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine = Engine.load()
    cfg = PruningConfig(mode="off", log_level="NONE")
    ids = engine.encode("Write a long story about a lighthouse keeper.")
    rows = lambda: [PromptRow("x", list(ids))]  # noqa: E731

    def per_token(check: bool) -> float:
        control = RowControl(engine, (), None, None, lambda: None)
        t0 = time.perf_counter()
        [res] = engine._run(rows(), args.tokens, cfg, 0.0, None, None, None,
                            on_token=control.token if check else None,
                            stop_check=control.should_stop if check else None)
        assert len(res.token_ids) == args.tokens or res.token_ids[-1] == engine.eos_id
        return (time.perf_counter() - t0) / len(res.token_ids)

    per_token(False), per_token(True)  # warm-up
    ratios, a, b = [], [], []
    for _ in range(args.rounds):
        x, y = per_token(False), per_token(True)
        a.append(x)
        b.append(y)
        ratios.append(y / x)
    print(json.dumps({"rounds": args.rounds, "tokens": args.tokens, "threads": args.threads,
                      "ms_per_token_without": 1e3 * statistics.median(a), "ms_per_token_with": 1e3 * statistics.median(b),
                      "ratio_with_over_without_median": statistics.median(ratios),
                      "ratio_min": min(ratios), "ratio_max": max(ratios)}, indent=1))


if __name__ == "__main__":
    main()
