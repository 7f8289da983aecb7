"""Design experiment (issue 25): a candidate unit predictor's curve on a development prompt set,
beside the packaged predictor's curve already measured there.

    python scripts/compare_predictor_curve.py --trained /tmp/upt4 \
        --held-out fixtures/router_curve/heldout_2026-12-05.jsonl \
        --against results/router_curve_heldout_2026-12-05.json --out results/predictor_v4_curve_dev.json

The candidate (``FOLDER/unit_predictor/<sha16>-v<N>.npz``, written by
scripts/train_unit_predictor.py) replaces the packaged predictor in a loaded engine, maps and unit
bytes included; ``rsp_bench.router_curve_measure.measure_curve`` then runs as ``rsp-bench
router-curve`` does (sensitivities chosen on its tune prompts, never on the held-out ones), without
the timed runs: top-1 and KL do not depend on the machine. ``--against`` is that command's result
for the packaged predictor on the same prompts. The table is each predictor's lead over its own
best static removal at the same bytes (static removal uses each predictor's maps and impact
ranking), in top-1 points, and both KLs.

Only development prompts belong here: comparing two designs on a set makes it a development set.
Must not be imported by the engine or the harness; it records a design decision.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from reference_engine import Engine
from reference_engine import unit_predictor as up
from rsp_bench.router_curve_measure import measure_curve, read_held_out
from rsp_bench.storage import atomic_write_text


def lead_table(rows: list[dict]) -> dict[int, dict]:
    """Per target budget: blocks' worth, router top-1 lead over the best static, both KLs."""
    out = {}
    for r in rows:
        t = r["target_blocks_worth"]
        if t is None:
            continue
        best = r["static"][r["best_static"]]
        kl_best = min(v["kl"] for v in r["static"].values())
        out[t] = {"blocks_worth": r["router"]["blocks_worth"], "lead_top1": r["router_minus_best_static_top1"],
                  "router_kl": r["router"]["kl"], "best_static_kl": best["kl"], "lowest_static_kl": kl_best}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trained", type=Path, required=True, help="folder holding unit_predictor/<sha16>-v<N>.npz")
    ap.add_argument("--held-out", type=Path, required=True, help="a development prompt file (JSONL)")
    ap.add_argument("--against", type=Path, required=True, help="rsp-bench router-curve's result on the same file")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    try:
        prompts = read_held_out(args.held_out)
        against = json.loads(args.against.read_text())
        old = lead_table(against["held_out"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if against.get("held_out_source") != str(args.held_out) or against.get("tokens") != args.tokens:
        print(f"error: --against {args.against} was measured on {against.get('held_out_source')} with "
              f"{against.get('tokens')} tokens, not {args.held_out} with {args.tokens}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    torch.set_grad_enabled(False)
    engine = Engine.load(None)
    cand = up.load(args.trained, engine.weights_sha256)
    if cand is None:
        print(f"error: no predictor for weights {engine.weights_sha256[:16]} of version {up.PREDICTOR_VERSION} "
              f"under {args.trained}/unit_predictor", file=sys.stderr)
        return 2
    # The engine has no public way to swap its predictor (it loads the packaged one); this experiment does.
    engine._unit_predictor, engine._unit_bytes = cand, None
    curve = measure_curve(engine, prompts, tokens=args.tokens, speed_targets=(), speed_deepest=False)
    new = lead_table(curve["held_out"])
    result = {"what": "candidate unit predictor vs the packaged one on a development set (lead over each one's "
                      "best static removal at equal bytes)",
              "command": "python scripts/compare_predictor_curve.py " + " ".join(sys.argv[1:]),
              "held_out_source": str(args.held_out), "tokens": args.tokens,
              "candidate_report": cand.report, "packaged_result": str(args.against),
              "packaged": old, "candidate": new, "candidate_curve": curve,
              "seconds": round(time.perf_counter() - t0, 1)}
    atomic_write_text(args.out, json.dumps(result, indent=1))
    print("target | packaged: blocks, top-1 lead, KL vs best static (lowest static) | candidate: the same")
    for t in sorted(set(old) | set(new)):
        a, b = old.get(t), new.get(t)
        fa = f"{a['blocks_worth']:.2f}, {100 * a['lead_top1']:+.1f}, {a['router_kl']:.3f} vs {a['best_static_kl']:.3f} ({a['lowest_static_kl']:.3f})" if a else "-"
        fb = f"{b['blocks_worth']:.2f}, {100 * b['lead_top1']:+.1f}, {b['router_kl']:.3f} vs {b['best_static_kl']:.3f} ({b['lowest_static_kl']:.3f})" if b else "-"
        print(f"{t} | {fa} | {fb}")
    print(f"wrote {args.out} in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
