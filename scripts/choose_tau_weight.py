"""Design choice for the unit router's per-unit threshold weight (issue 25), on the development split only.

    python scripts/choose_tau_weight.py [--alphas 1,0.5,1.5] [--flat-factors] [--targets 1,5.5]
                                        [--out results/tau_weight_dev.json]

The unit router compares a unit's predicted cost with tau x w_u, where w_u = (bytes_u / block
bytes) ** alpha (router.UNIT_TAU_WEIGHT "bytes" is alpha = 1: nats per block's worth of bytes
saved). Alpha decides how much cheaper per byte an attention unit (0.19 of a block's bytes) must
look than an MLP (0.75) before it goes. ``--flat-factors`` also runs alpha 1 with the entropy and
gradient factors held at 1 (FACTOR_LO = FACTOR_HI = 1).

For each design and each target budget (blocks' worth of weight bytes per token) the raw threshold
scale is found by bisection on the first 8 development prompts, then the design is measured on all
of them: teacher-forced top-1 and mean KL against pruning off, beside every static removal of the
same bytes (interpolated at the router's measured bytes, as ``rsp-bench router-curve`` does). The
development prompts are choose_unit_prior.py's (the built-in HELD_OUT_PROMPTS and
fixtures/router_curve/heldout_2026-12-03.jsonl). No blind file is read.

Result (stop 46, ``--alphas 1,0.5,1.5 --flat-factors --targets 1,5.5``, results/tau_weight_dev.json,
888 s on 2 cores, 36 prompts x 32 tokens): top-1 lead over the best static removal / KL minus its
lowest, at about 1 and 5.5 blocks' worth:

| design | ~1 block | ~5.5 blocks |
|---|---|---|
| alpha 1 (shipped) | +5.8 / -0.077 at 1.09 | +7.6 / -0.193 at 5.40 |
| alpha 0.5 | +5.9 / -0.080 at 1.07 | +3.7 / -0.076 at 5.53 |
| alpha 1.5 | +5.4 / -0.067 at 1.03 | +7.7 / -0.214 at 5.70 |
| alpha 1, factors held at 1 | +5.6 / -0.070 at 1.04 | +6.4 / -0.223 at 5.61 |

No variant moves the 1-block lead by more than half a point (about a third of its standard error
over ~1,150 positions); halving alpha costs 4 points at 5.5; the entropy and gradient factors are
worth about a point there. The shipped design (alpha 1 with the factors) stays: the weight and the
factors are not where the blind sets' shortfalls at the two ends of the curve come from.

Must not be imported by the engine or the harness; it records a design decision.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from reference_engine import Engine
from reference_engine import router as router_mod
from rsp_bench.router_curve_measure import HELD_OUT_PROMPTS, Case, Removal, router_point, static_orders
from rsp_bench.storage import atomic_write_json

ROOT = Path(__file__).resolve().parents[1]
DEV_FILE = ROOT / "fixtures" / "router_curve" / "heldout_2026-12-03.jsonl"


class _Design:
    """Patches UnitRouter so every router the engine builds uses this design's weights and factors."""

    def __init__(self, alpha: float, flat_factors: bool):
        self.alpha, self.flat = alpha, flat_factors
        self._init = router_mod.UnitRouter.__init__
        self._lo_hi = (router_mod.FACTOR_LO, router_mod.FACTOR_HI)

    def __enter__(self):
        alpha, init = self.alpha, self._init

        def patched(obj, *a, **k):
            init(obj, *a, **k)
            obj.tau_weight[:] = (obj.unit_bytes / obj.block_bytes) ** alpha  # in place: the C step holds it

        router_mod.UnitRouter.__init__ = patched
        if self.flat:
            router_mod.FACTOR_LO = router_mod.FACTOR_HI = 1.0
        return self

    def __exit__(self, *exc):
        router_mod.UnitRouter.__init__ = self._init
        router_mod.FACTOR_LO, router_mod.FACTOR_HI = self._lo_hi


def _find_x(engine, probe, target: float, lo: float = 1e-3, hi: float = 1.0, steps: int = 6) -> float:
    """Raw scale whose measured bytes on ``probe`` are closest to ``target`` blocks' worth (log bisection)."""
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        got = router_point(engine, probe, mid)["blocks_worth"]
        lo, hi = (mid, hi) if got < target else (lo, mid)
    return math.sqrt(lo * hi)


def measure_designs(engine: Engine, designs: list, targets: list[float], tokens: int, smoke: bool) -> tuple[list[dict], int]:
    """Each design, a (label dict, context manager that installs it) pair, at each target budget:
    the raw scale found by bisection on the first 8 development prompts, then top-1 / KL on all of
    them beside every static removal at the bytes measured. Returns the rows and the prompt count."""
    dev_prompts = list(HELD_OUT_PROMPTS) + [json.loads(x)["text"] for x in DEV_FILE.read_text().splitlines() if x.strip()]
    if smoke:
        dev_prompts = dev_prompts[:3]
    orders = static_orders(engine, engine.unit_predictor(), {0, engine.dims.n_layers - 1})
    rows = []
    with engine.raw_unit_scale():
        dev = [Case(engine, p, tokens) for p in dev_prompts]
        probe = dev[:8]
        statics = {name: Removal(engine, dev, g) for name, g in orders.items()}
        for label, design in designs:
            with design:
                for target in targets:
                    x = _find_x(engine, probe, target)
                    rp = router_point(engine, dev, x)
                    st = {name: r.at_bytes(rp["blocks_worth"]) for name, r in statics.items()}
                    row = {**label, "target": target, "x": x, "router": rp, "static": st,
                           "top1_lead": rp["top1"] - max(v["top1"] for v in st.values()),
                           "kl_minus_best": rp["kl"] - min(v["kl"] for v in st.values())}
                    rows.append(row)
                    print(f"{label} target {target}: x {x:.4f}, {rp['blocks_worth']:.2f} blocks, top-1 {rp['top1']:.3f} "
                          f"(lead {row['top1_lead']:+.3f}), KL {rp['kl']:.3f} (minus best static {row['kl_minus_best']:+.3f})",
                          flush=True)
    return rows, len(dev_prompts)


def write_result(out: Path, doc: str, script: str, tokens: int, n_prompts: int, rows: list[dict], t0: float, **extra) -> None:
    result = {"what": doc.split("\n")[0], "command": f"python scripts/{script} " + " ".join(sys.argv[1:]),
              "dev_prompts": n_prompts, "tokens": tokens, "threads": torch.get_num_threads(), **extra,
              "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
    atomic_write_json(out, result)
    print(f"wrote {out} in {result['seconds']} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--alphas", default="1,0.5,1.5")
    ap.add_argument("--flat-factors", action="store_true")
    ap.add_argument("--targets", default="1,5.5")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "tau_weight_dev.json")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    torch.set_grad_enabled(False)
    engine = Engine.load(None)
    designs = [(float(a), False) for a in args.alphas.split(",") if a] + ([(1.0, True)] if args.flat_factors else [])
    rows, n = measure_designs(engine, [({"alpha": a, "flat_factors": f}, _Design(a, f)) for a, f in designs],
                              [float(t) for t in args.targets.split(",") if t], args.tokens, args.smoke)
    write_result(args.out, __doc__, "choose_tau_weight.py", args.tokens, n, rows, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
