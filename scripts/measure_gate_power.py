"""Power of the speed gate: how often a planted slowdown of ``speedup_vs_off`` fails the gate.

Real sample sets come from run records (every ``speedup_vs_off*`` / ``speedup_vs_hf_generate*``
metric with samples: per-round ratios measured interleaved in one process). Each set is centred
on its own median in log space and the centred log-ratios are pooled: that pool is this
machine's round-to-round noise. For each sample count n, a trial draws a baseline of n and a
run of n from the pool (with replacement), multiplies the run by (1 - slowdown), and asks the
real gate (rsp_bench.gate.compare with the default policy: 10% tolerance plus a Mann-Whitney
test at the policy's alpha) for its verdict. The detection rate is the share of trials that
regressed; the 0% row is the false-alarm rate.

    python scripts/measure_gate_power.py results/runs/*.json --out results/gate_power.json

The throughput suite's round count is chosen from this output (suites/test_throughput.py).
Must not import torch or the engine.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

from rsp_bench.gate import compare, load_policy
from rsp_bench.records import RunRecordBuilder, load_record
from rsp_bench.storage import atomic_write_json

METRIC = "speedup_vs_off"
MACHINE = {"fingerprint": "000000000000", "hostname": "sim", "platform": "sim", "cpu": "sim", "cores": 2,
           "memory_gb": 1.0, "gpu": None}
VERSIONS = {"python": "3", "torch": None, "transformers": None, "rsp_bench": "0"}


def pooled_log_noise(paths: list[str]) -> tuple[list[float], list[str]]:
    """Centred log-ratios of every timing sample set in the records, and where they came from."""
    pool, sources = [], []
    for path in paths:
        record = load_record(path)
        for cid, conf in sorted(record["configurations"].items()):
            for name, metric in sorted(conf["metrics"].items()):
                samples = metric.get("samples") or []
                if name.startswith(("speedup_vs_off", "speedup_vs_hf_generate")) and len(samples) >= 4:
                    logs = [math.log(x) for x in samples if x > 0]
                    centre = statistics.median(logs)
                    pool.extend(x - centre for x in logs)
                    sources.append(f"{Path(path).name}:{cid}:{name} ({len(samples)})")
    return pool, sources


def _record(samples: list[float]) -> dict:
    b = RunRecordBuilder(model_name="sim", machine=MACHINE, commit=None, versions_info=VERSIONS)
    b.add_metric("reference/lossy/s=0.50", METRIC, statistics.median(samples), n=len(samples), unit="x",
                 samples=samples)
    return b.build(wall_time_s=0.0)


def detection_rate(pool: list[float], n: int, slowdown: float, trials: int, rng: random.Random) -> float:
    policy = load_policy()
    hits = 0
    for _ in range(trials):
        base = [math.exp(rng.choice(pool)) for _ in range(n)]
        run = [math.exp(rng.choice(pool)) * (1.0 - slowdown) for _ in range(n)]
        hits += not compare(_record(base), _record(run), policy).passed
    return hits / trials


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", help="run records holding timing samples")
    p.add_argument("--n", default="6,10,16,24,32", help="sample counts per side to try (default 6,10,16,24,32)")
    p.add_argument("--slowdowns", default="0,0.10,0.15,0.20", help="planted slowdowns (default 0,0.10,0.15,0.20)")
    p.add_argument("--trials", type=int, default=400, help="trials per cell (default 400)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/gate_power.json")
    args = p.parse_args(argv)
    pool, sources = pooled_log_noise(args.records)
    if len(pool) < 10:
        print(f"error: only {len(pool)} timing samples in those records; need at least 10", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    ns = [int(x) for x in args.n.split(",")]
    slowdowns = [float(x) for x in args.slowdowns.split(",")]
    table = {str(n): {f"{s:.2f}": detection_rate(pool, n, s, args.trials, rng) for s in slowdowns} for n in ns}
    spread = statistics.pstdev(pool)
    print(f"{len(pool)} centred log-ratio samples from {len(sources)} sets; sd {spread:.3f} (about {spread:.0%})")
    print("n per side | " + " | ".join(f"{s:.0%} slower" for s in slowdowns))
    for n in ns:
        print(f"{n:>10} | " + " | ".join(f"{table[str(n)][f'{s:.2f}']:.2f}" for s in slowdowns))
    atomic_write_json(args.out, {"metric": METRIC, "alpha": load_policy().alpha, "pool_size": len(pool),
                                 "log_sd": spread, "sources": sources, "trials": args.trials, "seed": args.seed,
                                 "detection_rate": table, "command": "python scripts/measure_gate_power.py " +
                                 " ".join(args.records)})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
