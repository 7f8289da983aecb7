"""Design experiment (issue 25): does a unit's cost predictor gain from seeing the unit decided
just before it, on the cached per-token labels, development prompts only?

    python scripts/router_context_features.py [--cache /tmp/rc] [--more N] [--out results/router_context_features_dev.json]

The packaged predictor scores unit u from its own normalised input x_u alone (a ridge on
log(isolated KL + floor)); docs/unit-router.md left "a predictor that sees more than one unit's
input" to try. Here, on the labels scripts/router_allocation.py cached (``--cache``: isolated
per-token KLs of the 48 built-in training prompts, 116 extra plain English requests and 24
development prompts, made with the maps of their day), each unit gets two ridges of the packaged
form, fitted on the training and extra prompts (ridge strength chosen on a fixed quarter of them):
- ``x``: x_u (the packaged form, refitted on these labels: the fair comparison),
- ``x+prev``: x_u and x_{u-1}, the input of the unit decided just before it at the same token
  (block l's attention for its MLP, block l-1's MLP for its attention): available when u is
  decided, at the cost of a second D-long dot product per unit.
Both are judged on the development prompts: within-unit Spearman of predicted against measured
cost, and the top-1 / mean KL against pruning off when each position's units are taken cheapest
per byte first over the prompt's tokens up to a budget (``router_allocation.select_global``, as
the engine's threshold spends), at 1-6 blocks' worth, through one per-position pass
(``isolated_bypass.forward_units_per_position``) with the packaged predictor's unit maps.
The unit inputs are recomputed from each cached sequence (one clean forward pass each).

``--more N`` asks the other question left open, more training text, the same way: N more plain
English requests of the development degradation splits are labelled into the cache (about 10 s
each on 2 cores; with the packaged predictor's maps, where the cached 116 have the maps of their
day) and ``x`` fitted with them is compared with ``x`` fitted without.

Result (stop 46, results/router_context_features_dev.json, 659 s on 2 cores): within-unit Spearman
on the development prompts 0.507 (x) and 0.515 (x+prev); top-1 / KL at 1-6 blocks' worth, x then
x+prev: 0.932 / 0.045 and 0.931 / 0.042; 0.880 / 0.117 and 0.868 / 0.118; 0.836 / 0.239 and
0.844 / 0.223; 0.758 / 0.378 and 0.775 / 0.369; 0.720 / 0.549 and 0.722 / 0.522; 0.669 / 0.711 and
0.664 / 0.723. The neighbour's input moves top-1 by -1.2 to +1.7 points (about one standard error
over these ~740 positions) and KL by a few hundredths: no gain worth a second dot product per
unit. (The labels' own day's predictor, version 2, for scale: 0.909 / 0.077 at 1, 0.606 / 1.060 at
6.) Not adopted.

``--more 120`` (results/router_more_text_v3_dev.json, 1,652 s, most of it labelling): x fitted on
284 prompts against 164: Spearman 0.507 -> 0.522; top-1 / KL at 1-6 blocks' worth 0.932 / 0.045 ->
0.937 / 0.047, 0.880 / 0.117 -> 0.873 / 0.113, 0.836 / 0.239 -> 0.831 / 0.196, 0.758 / 0.378 ->
0.786 / 0.311, 0.720 / 0.549 -> 0.722 / 0.496, 0.669 / 0.711 -> 0.680 / 0.678. KL falls by 5-18%
from 2 blocks' worth on; top-1 moves -0.7 to +2.8 points, +0.5 and +1.1 at the two ends. (The 120
new labels were made with the packaged maps, the 164 with their day's: part of the difference may
be that.) A lead for the next predictor, not enough alone for the ends of the curve.

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import router_allocation as ra  # noqa: E402
import router_oracle as ro  # noqa: E402

from reference_engine import unit_predictor as up  # noqa: E402
from reference_engine.model import forward_units  # noqa: E402
from rsp_bench.storage import atomic_write_json  # noqa: E402

def _load(cache: Path, tag: str) -> list[dict]:
    out = []
    for f in sorted(cache.glob(f"{tag}_*.npz")):
        z = np.load(f)
        out.append({k: z[k] for k in z.files})
    return out


def _inputs(w, d: dict, U: int) -> None:
    """d["xs"]: [U, n, D] unit inputs at the labelled positions; d["clean"]: pruning off's logits."""
    seq = torch.from_numpy(d["ids"].astype(np.int64))[None]
    S, T = int(d["S"]), seq.shape[1]
    rec: dict = {}
    d["clean"] = forward_units(w, seq, S, record=rec)[1:]
    d["xs"] = np.stack([rec["x_attn" if u % 2 == 0 else "x_mlp"][u // 2][S:T - 1].numpy() for u in range(U)])


def _features(d: dict, u: int, variant: str) -> np.ndarray:
    x = d["xs"][u]
    return x if variant == "x" else np.concatenate([x, d["xs"][u - 1]], 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/rc"))
    ap.add_argument("--more", type=int, default=0, metavar="N",
                    help="instead of x+prev: label N more plain English requests (router_oracle.extra_training_prompts "
                         "through 2026-12-05b, after the 116 cached) and compare x fitted with them")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "router_context_features_dev.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    engine, pred, maps, ub, eligible = ro.load_setup()
    w = engine.weights
    U = 2 * engine.dims.n_layers
    base = _load(args.cache, "train") + _load(args.cache, "extra")[:116]
    dev = _load(args.cache, "dev")
    if not base or not dev:
        raise SystemExit(f"{args.cache}: no cached labels (make them with scripts/router_allocation.py --extra 116 --labels-only)")
    more: list[dict] = []
    if args.more:
        prompts = ro.extra_training_prompts("2026-12-05b")[: 116 + args.more]
        more = ra.build(engine, w, maps, eligible, pred, args.cache, prompts, "extra",
                        lambda p, ids: up.greedy_continuation(w, ids, up.CONTINUATION_TOKENS, engine.eos_id))[116:]
    variants = ({"x": ("x", base), f"x+{len(more)} prompts": ("x", base + more)} if more else
                {"x": ("x", base), "x+prev": ("x+prev", base)})
    for d in base + more + dev:
        _inputs(w, d, U)
    print(f"inputs of {len(base) + len(more)} fit and {len(dev)} development prompts, {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)
    costs = {v: [np.full_like(d["kl"], np.inf) for d in dev] for v in variants}
    spearman = {v: [] for v in variants}
    for v, (kind, fit) in variants.items():
        held = set(np.random.default_rng(up.SEED).permutation(len(fit))[: len(fit) // 4].tolist())
        for u in range(U):
            if not eligible[u]:
                continue
            y = [np.log(d["kl"][u] + up.KL_FLOOR) for d in fit]
            X = [_features(d, u, kind) for d in fit]
            xf = np.concatenate([X[i] for i in range(len(fit)) if i not in held])
            yf = np.concatenate([y[i] for i in range(len(fit)) if i not in held])
            xh = np.concatenate([X[i] for i in held])
            yh = np.concatenate([y[i] for i in held])
            lam, wv, b = up.choose_ridge(xf, yf, xh, yh)
            wv, b = up.fit_ridge(np.concatenate(X), np.concatenate(y), lam)
            pred_dev = [_features(d, u, kind) @ wv + b for d in dev]
            for i, p in enumerate(pred_dev):
                costs[v][i][u] = np.exp(p)
            spearman[v].append(up.spearman(np.concatenate(pred_dev), np.concatenate([np.log(d["kl"][u] + up.KL_FLOOR)
                                                                                       for d in dev])))
    print(f"fits {time.perf_counter() - t0:.0f} s; within-unit Spearman on dev: "
          + ", ".join(f"{v} {np.mean(s):.3f}" for v, s in spearman.items()), file=sys.stderr)
    # the score cached beside each label: the predictor of the labels' day (version 2), for reference
    methods = {"cached_v2": [d["score"] for d in dev], **costs}
    acc = {(m, b): [0.0, 0.0, 0.0, 0] for m in methods for b in ro.BUDGETS}
    for i, d in enumerate(dev):
        for m, c in methods.items():
            for bud in ro.BUDGETS:
                ra.run(w, d, ra.select_global(c[i], ub, eligible, bud), ub, maps, acc[(m, bud)])
        print(f"\rdev eval {i + 1}/{len(dev)}, {time.perf_counter() - t0:.0f} s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    rows = []
    for bud in ro.BUDGETS:
        row = {"budget": bud}
        for m in methods:
            agree, kl, by, n = acc[(m, bud)]
            row[m] = {"top1": round(agree / n, 4), "kl_mean": round(kl / n, 4), "blocks_worth": round(by / n, 3)}
        rows.append(row)
        print(f"{bud}: " + "  ".join(f"{m} {row[m]['top1']:.3f} / {row[m]['kl_mean']:.3f}" for m in methods))
    res = {"what": __doc__.split("\n")[0], "command": "python scripts/router_context_features.py " + " ".join(sys.argv[1:]),
           "fit_prompts": {v: len(fit) for v, (_, fit) in variants.items()}, "dev_prompts": len(dev),
           "within_unit_spearman_dev": {v: round(float(np.mean(s)), 4) for v, s in spearman.items()},
           "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
    atomic_write_json(args.out, res)
    print(f"wrote {args.out} in {res['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
