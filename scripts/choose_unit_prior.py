"""Design choice for the unit router's static prior (issue 25), on the development split only.

    python scripts/choose_unit_prior.py [--lambdas 0.3,1] [--ks 6,8,10] [--xs 0.1,0.2]
                                        [--out results/unit_prior_dev.json]

Teacher-forced top-1 and mean KL against pruning off on the development prompts (the built-in
HELD_OUT_PROMPTS and fixtures/router_curve/heldout_2026-12-03.jsonl, both used to compare designs
before), 32 tokens each, beside every static removal of the same bytes (interpolated at the
router's measured bytes, as ``rsp-bench router-curve`` does), for
- the static prior at each lambda (router.UNIT_PRIOR_LAMBDA) and each candidate count K (the
  first K units by impact per byte; default: the K whose bytes are 1.5 to 9 blocks' worth), and
- the free router (UNIT_PRIOR_LAMBDA None) at each raw threshold scale of ``--xs``.
No sensitivity is tuned: every row is compared at the bytes it measured. The blind file
fixtures/router_curve/heldout_2026-12-04.jsonl is not read here: it reports the chosen design
once, through ``rsp-bench router-curve``.

results/unit_prior_dev.json was measured at de293b0, where the experiment's hook took K itself;
here K becomes the candidate share that holds exactly the first K units (the same candidates),
and the mean cost carries the predictor's KL floor (1e-4 nats; the smallest mean cost is 0.003).

results/unit_design_v3_dev.json (2026-12-05, 850 s): the same comparison for predictor version 3
(`--lambdas 1 --xs 0.03,0.05,0.08,0.12,0.16,0.22,0.3`), which made the free router the default
(router.UNIT_PRIOR_LAMBDA None).

Must not be imported by the engine or the harness; it records a design decision.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from reference_engine import Engine
from reference_engine import router as router_mod
from rsp_bench.router_curve_measure import HELD_OUT_PROMPTS, Case, Removal, router_point, static_orders
from rsp_bench.storage import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
DEV_FILE = ROOT / "fixtures" / "router_curve" / "heldout_2026-12-03.jsonl"


def _point(engine, dev, statics, label: dict) -> dict:
    rp = router_point(engine, dev, 0.5 if label.get("x") is None else label["x"])
    st = {name: r.at_bytes(rp["blocks_worth"]) for name, r in statics.items()}
    best_top1 = max(v["top1"] for v in st.values())
    best_kl = min(v["kl"] for v in st.values())
    row = {**label, "router": rp, "static": st, "top1_lead": rp["top1"] - best_top1, "kl_minus_best": rp["kl"] - best_kl}
    print(f"{label}: {rp['blocks_worth']:.2f} blocks, top-1 {rp['top1']:.3f} (lead {row['top1_lead']:+.3f}), "
          f"KL {rp['kl']:.3f} (best static {best_kl:.3f}, {min(st, key=lambda n: st[n]['kl'])})", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lambdas", default="0.3,1", help="prior factors, comma list")
    ap.add_argument("--ks", default="")
    ap.add_argument("--xs", default="0.1,0.2,0.3,0.4,0.5,0.75", help="raw scales of the router without prior")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "unit_prior_dev.json")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    torch.set_grad_enabled(False)
    engine = Engine.load(None)
    pred = engine.unit_predictor()
    dev_prompts = list(HELD_OUT_PROMPTS) + [json.loads(x)["text"] for x in DEV_FILE.read_text().splitlines() if x.strip()]
    if args.smoke:
        dev_prompts = dev_prompts[:2]
    L = engine.dims.n_layers
    blacklist = {0, L - 1}
    default_lambda = router_mod.UNIT_PRIOR_LAMBDA
    orders = static_orders(engine, pred, blacklist)
    ub, bb = engine.unit_bytes()
    cum = np.cumsum([ub[g[0]] for g in orders["unit_impact_per_byte"]]) / bb
    ks = [int(k) for k in args.ks.split(",")] if args.ks else \
        [int(np.searchsorted(cum, b)) + 1 for b in (1.5, 3.0, 4.5, 6.0, 7.5, 9.0)]
    print("K grid", ks, "static bytes", [round(float(cum[k - 1]), 2) for k in ks], flush=True)
    rows = []
    with engine.raw_unit_scale():
        dev = [Case(engine, p, args.tokens) for p in dev_prompts]
        statics = {name: Removal(engine, dev, g) for name, g in orders.items()}
        for x in [float(v) for v in args.xs.split(",") if v]:
            router_mod.UNIT_PRIOR_LAMBDA = None
            rows.append(_point(engine, dev, statics, {"design": "router", "x": x}))
        eligible = float(sum(ub[g[0]] for g in orders["unit_impact_per_byte"]))
        for lam in [float(v) for v in args.lambdas.split(",") if v]:
            for k in ks:  # the candidate share that holds exactly the first k units
                router_mod.UNIT_PRIOR_LAMBDA = lam
                x = float(cum[k - 1] * bb) / eligible
                rows.append(_point(engine, dev, statics, {"design": "prior", "lambda": lam, "k": k, "x": x}))
    router_mod.UNIT_PRIOR_LAMBDA = default_lambda
    result = {"what": __doc__.split("\n")[0], "command": "python scripts/choose_unit_prior.py " + " ".join(sys.argv[1:]),
              "dev_prompts": len(dev_prompts), "tokens": args.tokens, "threads": torch.get_num_threads(),
              "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
    atomic_write_text(args.out, json.dumps(result, indent=1))
    print(f"wrote {args.out} in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
