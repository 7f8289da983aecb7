"""Design experiment (issue 25): does the unit predictor learn more from per-token labels?

Labels "sequence" (the unit bypassed on every decode position; the KL at t carries the earlier
bypasses) against "token" (bypassed at t alone, reference_engine/isolated_bypass.py), on the
predictor's own training prompts only (its fixed-seed fit / held-out split, the packaged maps):
per unit a ridge fitted on each label kind, and the within-unit and pooled Spearman of each
prediction with each label kind on the held-out part. Reads no curve or fixture prompt.

    python scripts/compare_unit_labels.py [--prompts N] [--out results/unit_labels_dev.json]

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
from reference_engine import unit_predictor as up

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16, help="first N training prompts (default 16)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "unit_labels_dev.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    torch.set_grad_enabled(False)
    engine = Engine.load(None)
    pred = engine.unit_predictor()
    maps = pred.bypass_maps()
    w = engine.weights
    prompts = up.TRAIN_PROMPTS[: args.prompts]
    seqs = []
    for p in prompts:
        ids = engine.encode(p)
        seqs.append((ids + up.greedy_continuation(w, ids, up.CONTINUATION_TOKENS, engine.eos_id), len(ids)))
    order = np.random.default_rng(up.SEED).permutation(len(prompts))
    held = set(order[: max(1, len(prompts) // 4)].tolist())
    samples = {k: up.collect(w, seqs, lambda m: print(k, m, flush=True), maps, labels=k) for k in ("sequence", "token")}
    is_held = np.array([p in held for p in samples["sequence"].prompt])
    n_units = pred.n_units
    preds = {}
    for k, s in samples.items():
        target = np.log(s.kl + up.KL_FLOOR)
        out = np.zeros((n_units, int(is_held.sum())))
        for u in range(n_units):
            best = None
            for lam in up.RIDGE_GRID:
                wv, b = up.fit_ridge(s.x[u][~is_held], target[u][~is_held], lam)
                err = float(np.mean((s.x[u][is_held] @ wv + b - target[u][is_held]) ** 2))
                if best is None or err < best[0]:
                    best = (err, wv, b)
            out[u] = s.x[u][is_held] @ best[1] + best[2]
        preds[k] = out
    res = {"what": __doc__.split("\n")[0], "command": "python scripts/compare_unit_labels.py " + " ".join(sys.argv[1:]),
           "prompts": len(prompts), "held_out_prompts": len(held), "positions_held_out": int(is_held.sum())}
    for pk, pv in preds.items():
        for lk, s in samples.items():
            kl = s.kl[:, is_held]
            res[f"spearman_within_unit_pred_{pk}_vs_label_{lk}"] = float(np.mean([up.spearman(pv[u], kl[u]) for u in range(n_units)]))
            res[f"spearman_pooled_pred_{pk}_vs_label_{lk}"] = up.spearman(pv.ravel(), kl.ravel())
    for lk, s in samples.items():
        res[f"mean_kl_{lk}"] = s.kl.mean(1).tolist()
        res[f"spearman_labels_within_unit"] = float(np.mean([up.spearman(samples["sequence"].kl[u], samples["token"].kl[u])
                                                             for u in range(n_units)]))
    res["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if not k.startswith("mean_kl")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
