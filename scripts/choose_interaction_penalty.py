"""Design experiment for the unit router (issue 25), on the development split only: does a unit
cost more when units before it at the same token were already bypassed?

    python scripts/choose_interaction_penalty.py [--gammas 0,0.1,0.3] [--targets 1,5.5]
                                                 [--out results/interaction_penalty_dev.json]

The predictor's labels are each unit bypassed *alone* at one token (isolated_bypass), so its
scores ignore what the units decided earlier in the same step did: at 5-6 blocks' worth about a
dozen units go at one token, and costs measured one unit at a time do not add up (docs/unit-router.md,
"Spending the budget unevenly"). The variant here adds gamma x (blocks' worth of weight bytes
this token has already bypassed) to each unit's log score before it is compared with its
threshold, so a unit late in a heavily pruned step must look cheaper to go. gamma 0 is the
shipped router.

The variant is patched into the torch decode path (``model._gate_says_bypass``), so every design,
gamma 0 included, runs on the torch kernel here (the native kernel computes the same decisions;
tests/test_unit_router.py). For each design and target budget the raw threshold scale is found by
bisection on the first 8 development prompts, then the design is measured on all of them:
teacher-forced top-1 and mean KL against pruning off, beside every static removal of the same bytes
(as scripts/choose_tau_weight.py). No blind file is read.

Result (stop 46, ``--gammas 0.03,0.1 --targets 5.5``, results/interaction_penalty_dev.json, 523 s
on 2 cores; gamma 0 is scripts/choose_tau_weight.py's alpha-1 row, +7.6 / -0.193 at 5.40 blocks'
worth, the torch and native kernels measured equal on the same prompts): gamma 0.03 +6.5 / -0.197 at
5.59, gamma 0.1 +3.0 / -0.153 at 5.68. The penalty only hurts (to spend the same bytes the
threshold must rise, so the bypasses shift towards each step's earlier units; which units then
went was not measured). Not adopted.

Must not be imported by the engine or the harness; it records a design decision.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from choose_tau_weight import measure_designs, write_result  # noqa: E402
from reference_engine import Engine  # noqa: E402
from reference_engine import model as model_mod  # noqa: E402


class _Penalty:
    """Patches the torch path's per-unit decision with the running-bytes penalty."""

    def __init__(self, gamma: float, unit_bytes, block_bytes: int):
        self.gamma = gamma
        self.share = [float(b) / block_bytes for b in unit_bytes]
        self._orig = model_mod._gate_says_bypass
        self.saved = 0.0

    def __enter__(self):
        def decide(gate, unit: int, x):
            if unit == 0:  # units are decided in order; unit 0 opens every step
                self.saved = 0.0
            s = torch.mv(x, gate.weight[unit]) + gate.bias[unit] + self.gamma * self.saved
            gate.scores[:, unit] = s
            by = bool((s < gate.log_tau[:, unit]).all())
            gate.decisions[unit] = 1 if by else 0
            if by:
                self.saved += self.share[unit]
            return by

        model_mod._gate_says_bypass = decide
        return self

    def __exit__(self, *exc):
        model_mod._gate_says_bypass = self._orig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gammas", default="0,0.1,0.3")
    ap.add_argument("--targets", default="1,5.5")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "interaction_penalty_dev.json")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    torch.set_grad_enabled(False)
    engine = Engine.load(None)
    engine.decode_kernel = "torch"  # the patched decision lives in the torch path
    ub, bb = engine.unit_bytes()
    designs = [({"gamma": g}, _Penalty(g, ub, bb)) for g in (float(v) for v in args.gammas.split(",") if v)]
    rows, n = measure_designs(engine, designs, [float(t) for t in args.targets.split(",") if t], args.tokens, args.smoke)
    write_result(args.out, __doc__, "choose_interaction_penalty.py", args.tokens, n, rows, t0, kernel="torch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
