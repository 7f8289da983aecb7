"""Design experiment (issue 25): which signals, known before a unit runs, predict its per-token cost?

Fit on the unit predictor's own training prompts (TRAIN_PROMPTS: its fixed-seed fit part; the
ridge strength chosen on its held-out part), labels = the KL of bypassing the unit at that token
alone (isolated_bypass). Feature sets, per unit, a ridge on log(KL + floor):
- ``x``: the unit's own normalised input (the engine's predictor, refitted on per-token labels),
- ``prev``: the previous position's final normalised stream (what the model predicted from: known
  before the decode step starts) with the stream entering block 1 at this token (block 0 always
  runs),
- ``x+prev``: both.
Then, on the development prompts of scripts/router_oracle.py (heldout_2026-12-04b is not read),
each predictor picks units per position cheapest per byte first within a budget (as the oracle
script does), against the oracle, the packaged predictor and the best static removal.

    python scripts/router_features.py [--limit N] [--out results/router_features_dev.json]

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import router_oracle as ro  # noqa: E402

from reference_engine import unit_predictor as up  # noqa: E402
from reference_engine.isolated_bypass import forward_unit_alone  # noqa: E402
from reference_engine.model import forward_units, rms_norm  # noqa: E402

SETS = ("x", "prev", "x+prev")


def sample(engine, w, maps, eligible, ids, cont):
    """Clean record, isolated per-token KLs [U, n] and per-position features of one sequence."""
    seq = torch.tensor([ids + cont])
    S, T = len(ids), seq.shape[1]
    rec: dict = {}
    clean = forward_units(w, seq, S, record=rec)
    n = T - 1 - S
    U = 2 * engine.dims.n_layers
    ref_logp = torch.log_softmax(clean[1:].double(), -1)
    kl = np.zeros((U, n))
    for u in range(U):
        if eligible[u]:
            out = forward_unit_alone(w, rec, S, u, maps[u])[1:]
            kl[u] = up._kl_rows(ref_logp, out)
    L = engine.dims.n_layers
    xs = [rec["x_attn" if u % 2 == 0 else "x_mlp"][u // 2][S:T - 1].numpy() for u in range(U)]
    final = rms_norm(rec["h"][L], w.final_norm, engine.dims.rms_eps)
    h1 = rec["h"][1]
    h1 = h1 / h1.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    prev = torch.cat([final[S - 1:T - 2], h1[S:T - 1]], -1).numpy()
    return seq, S, T, n, clean, kl, xs, prev


def feats(kind, xs, prev, u):
    return {"x": xs[u], "prev": prev, "x+prev": np.concatenate([xs[u], prev], 1)}[kind]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--limit", type=int, default=None, help="first N development prompts")
    ap.add_argument("--train-limit", type=int, default=None, help="first N training prompts")
    ap.add_argument("--out", type=Path, default=ro.ROOT / "results" / "router_features_dev.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    engine, pred, maps, ub, eligible = ro.load_setup()
    w = engine.weights
    L = engine.dims.n_layers
    U = 2 * L
    # --- fit on the training prompts, per-token labels
    train = up.TRAIN_PROMPTS[: args.train_limit] if args.train_limit else up.TRAIN_PROMPTS
    held = set(np.random.default_rng(up.SEED).permutation(len(train))[: max(1, len(train) // 4)].tolist())
    data = {"fit": [], "held": []}
    for i, p in enumerate(train):
        ids = engine.encode(p)
        cont = up.greedy_continuation(w, ids, up.CONTINUATION_TOKENS, engine.eos_id)
        _, _, _, n, _, kl, xs, prev = sample(engine, w, maps, eligible, ids, cont)
        if n >= 1:
            data["held" if i in held else "fit"].append((kl, xs, prev))
        print(f"\rtrain {i + 1}/{len(train)}, {time.perf_counter() - t0:.0f} s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    def stack(part, kind, u):
        X = np.concatenate([feats(kind, xs, prev, u) for _, xs, prev in data[part]])
        y = np.log(np.concatenate([kl[u] for kl, _, _ in data[part]]) + up.KL_FLOOR)
        return X, y

    models = {k: {} for k in SETS}
    spear = {k: [] for k in SETS}
    for kind in SETS:
        for u in range(U):
            if not eligible[u]:
                continue
            Xf, yf = stack("fit", kind, u)
            Xh, yh = stack("held", kind, u)
            best = None
            for lam in up.RIDGE_GRID:
                wv, b = up.fit_ridge(Xf, yf, lam)
                err = float(np.mean((Xh @ wv + b - yh) ** 2))
                if best is None or err < best[0]:
                    best = (err, wv, b)
            models[kind][u] = (best[1], best[2])
            spear[kind].append(up.spearman(Xh @ best[1] + best[2], yh))
    report = {k: float(np.mean(v)) for k, v in spear.items()}
    print("within-unit Spearman on the training prompts' held-out part:", report, file=sys.stderr)
    # --- compare on the development prompts
    prompts = ro.dev_prompts()
    if args.limit:
        prompts = prompts[: args.limit]
    methods = ["oracle", "packaged", *SETS]
    acc = {(m, b): [0.0, 0.0, 0.0, 0] for m in methods for b in ro.BUDGETS}
    static_grid = tuple(np.round(np.arange(0.5, 7.01, 0.5), 2))
    acc.update({("static", b): [0.0, 0.0, 0.0, 0] for b in static_grid})
    for i, prompt in enumerate(prompts):
        ids = engine.encode(prompt)
        [ref] = engine.generate([prompt], max_new_tokens=args.tokens, mode="off", log_level="NONE")
        seq, S, T, n, clean, kl, xs, prev = sample(engine, w, maps, eligible, ids, ref.token_ids)
        if n < 1:
            continue
        costs = {"oracle": kl, "static": np.repeat(np.asarray(pred.impact, float)[:, None], n, 1)}
        costs["packaged"] = np.stack([np.exp(pred.log_scores(xs[u], u)) for u in range(U)])
        for kind in SETS:
            c = np.full((U, n), np.inf)
            for u, (wv, b) in models[kind].items():
                c[u] = np.exp(feats(kind, xs, prev, u) @ wv + b)
            costs[kind] = c
        runs = [(m, b) for m in methods for b in ro.BUDGETS] + [("static", b) for b in static_grid]
        for m, b in runs:
            ro.run_selection(w, seq, S, clean[1:], costs[m], ub, eligible, b, maps, acc[(m, b)])
        print(f"\rdev {i + 1}/{len(prompts)}, {time.perf_counter() - t0:.0f} s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    rows, st = ro.summarise(acc, methods, ro.BUDGETS, static_grid)
    res = {"what": __doc__.split("\n")[0], "command": "python scripts/router_features.py " + " ".join(sys.argv[1:]),
           "train_prompts": len(train), "dev_prompts": len(prompts), "tokens": args.tokens,
           "spearman_within_unit_held_out": report, "rows": rows, "static_curve": st,
           "seconds": round(time.perf_counter() - t0, 1)}
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
