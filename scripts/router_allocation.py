"""Design experiment (issue 25): does spending the byte budget unevenly across tokens beat a fixed
per-token budget, and can a cheap per-token signal tell which tokens to spend it on?

scripts/router_oracle.py gives every decode position the same budget, so it cannot reward a
router for knowing which *tokens* are cheap; the engine's router, a threshold on predicted cost
per byte, does spend unevenly. Here, on the development prompts only (as router_oracle.py; the
blind file heldout_2026-12-04b is not read), teacher-forced on pruning off's 32-token greedy
continuation, each prompt's (position, unit) pairs are taken cheapest per byte first until the
prompt's bytes reach budget x positions ("global"), against the per-position selection ("local"),
for the oracle (isolated per-token KL), the packaged predictor and static removal. Per-token
arrays are cached (``--cache``) so selection rules can be compared without relabelling.

    python scripts/router_allocation.py [--limit N] [--cache /tmp/rc] [--extra N --labels-only] [--out results/router_allocation_dev.json]

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
import router_features as rf  # noqa: E402
import router_oracle as ro  # noqa: E402

from reference_engine import unit_predictor as up  # noqa: E402
from reference_engine.isolated_bypass import forward_units_per_position  # noqa: E402
from reference_engine.model import forward_units  # noqa: E402
from rsp_bench import metrics  # noqa: E402


def label(engine, w, maps, eligible, pred, ids, cont):
    """Per-token arrays of one sequence: isolated KL [U, n], packaged score [U, n], clean top-1
    margin (log-prob gap) [n], the block-1 stream [n, D] (router_features.sample's labels)."""
    seq, S, T, n, clean, kl, xs, prev = rf.sample(engine, w, maps, eligible, ids, cont)
    score = np.stack([np.exp(pred.log_scores(xs[u], u)) for u in range(len(xs))])
    top2 = torch.log_softmax(clean[1:].double(), -1).topk(2, -1).values
    margin = (top2[:, 0] - top2[:, 1]).numpy()
    h1 = prev[:, engine.dims.hidden:]
    return {"ids": seq[0].numpy(), "S": S, "kl": kl, "score": score, "margin": margin, "h1": h1}


def build(engine, w, maps, eligible, pred, cache: Path, prompts, tag, cont_fn):
    out = []
    for i, p in enumerate(prompts):
        f = cache / f"{tag}_{i:03d}.npz"
        if not f.exists():
            ids = engine.encode(p)
            d = label(engine, w, maps, eligible, pred, ids, cont_fn(p, ids))
            np.savez(f, **{k: np.asarray(v) for k, v in d.items()})
        z = np.load(f)
        out.append({k: z[k] for k in z.files})
        print(f"\r{tag} {i + 1}/{len(prompts)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return out


def select_global(cost, ub, eligible, budget):
    U, n = cost.shape
    per_byte = np.where(eligible[:, None], cost / ub[:, None], np.inf)
    order = np.argsort(per_byte, axis=None, kind="stable")
    skip = np.zeros((U, n), bool)
    used, total = 0.0, budget * n
    for k in order:
        u, t = divmod(int(k), n)
        if not eligible[u]:
            break
        if used + ub[u] > total:
            continue
        skip[u, t] = True
        used += ub[u]
    return skip.T


def run(w, d, skip_dec, ub, maps, acc):
    seq = torch.from_numpy(d["ids"].astype(np.int64))[None]
    S, T = int(d["S"]), seq.shape[1]
    skip = torch.zeros(T, len(ub), dtype=torch.bool)
    skip[S:T - 1] = torch.from_numpy(skip_dec)
    out = forward_units_per_position(w, seq, S, skip, maps)[1:]
    clean = d["clean"]
    acc[0] += float(metrics.top1_matches(clean, out).sum())
    acc[1] += float(metrics.kl_per_token(clean, out).sum())
    acc[2] += float((skip_dec * ub[None, :]).sum())
    acc[3] += skip_dec.shape[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/rc"))
    ap.add_argument("--labels-only", action="store_true")
    ap.add_argument("--extra", type=int, default=0,
                    help="also label the first N plain English requests of the degradation splits "
                         "(router_oracle.extra_training_prompts) under the tag 'extra', as training text")
    ap.add_argument("--extra-through", default="2026-12-05b",
                    help="the last degradation split the extra requests come from (the cache of stop 43: 2026-12-05b)")
    ap.add_argument("--out", type=Path, default=ro.ROOT / "results" / "router_allocation_dev.json")
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    engine, pred, maps, ub, eligible = ro.load_setup()
    w = engine.weights
    train = build(engine, w, maps, eligible, pred, args.cache, up.TRAIN_PROMPTS, "train",
                  lambda p, ids: up.greedy_continuation(w, ids, up.CONTINUATION_TOKENS, engine.eos_id))
    if args.extra:
        build(engine, w, maps, eligible, pred, args.cache, ro.extra_training_prompts(args.extra_through)[: args.extra], "extra",
              lambda p, ids: up.greedy_continuation(w, ids, up.CONTINUATION_TOKENS, engine.eos_id))
    prompts = ro.dev_prompts()[: args.limit] if args.limit else ro.dev_prompts()
    dev = build(engine, w, maps, eligible, pred, args.cache, prompts, "dev",
                lambda p, ids: engine.generate([p], max_new_tokens=args.tokens, mode="off", log_level="NONE")[0].token_ids)
    print(f"labels {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.labels_only:
        return 0
    evaluate(engine, w, maps, ub, eligible, train, dev, args, t0)
    return 0


def token_factor(train: list[dict], eligible: np.ndarray):
    """A ridge from the block-1 stream to the token's common cost factor: the mean over units of
    log(isolated KL + floor) - log(packaged score), fitted on the training prompts."""
    X = np.concatenate([d["h1"] for d in train])
    y = np.concatenate([np.mean(np.log(d["kl"][eligible] + up.KL_FLOOR) - np.log(d["score"][eligible]), 0)
                        for d in train])
    held = len(X) // 4
    best = None
    for lam in up.RIDGE_GRID:
        wv, b = up.fit_ridge(X[held:], y[held:], lam)
        err = float(np.mean((X[:held] @ wv + b - y[:held]) ** 2))
        if best is None or err < best[0]:
            best = (err, wv, b, up.spearman(X[:held] @ wv + b, y[:held]))
    return best


def evaluate(engine, w, maps, ub, eligible, train, dev, args, t0) -> None:
    err, wv, b, rho = token_factor(train, eligible)
    print(f"token factor: held-out Spearman {rho:.3f}", file=sys.stderr)
    static_grid = tuple(np.round(np.arange(0.5, 7.01, 0.5), 2))
    methods = {"oracle": "kl", "packaged": "score", "packaged+token": "token", "packaged+oracle_token": "otoken"}
    acc = {(m, a, bud): [0.0, 0.0, 0.0, 0] for m in methods for a in ("local", "global") for bud in ro.BUDGETS}
    acc.update({("static", "local", bud): [0.0, 0.0, 0.0, 0] for bud in static_grid})
    impact = np.asarray(engine.unit_predictor().impact, float)
    for i, d in enumerate(dev):
        seq = torch.from_numpy(d["ids"].astype(np.int64))[None]
        d["clean"] = forward_units(w, seq, int(d["S"]))[1:]
        n = d["kl"].shape[1]
        if n < 1:
            continue
        oracle_r = np.mean(np.log(d["kl"][eligible] + up.KL_FLOOR) - np.log(d["score"][eligible]), 0)
        costs = {"kl": d["kl"], "score": d["score"], "token": d["score"] * np.exp(d["h1"] @ wv + b)[None, :],
                 "otoken": d["score"] * np.exp(oracle_r)[None, :]}
        for m, key in methods.items():
            for bud in ro.BUDGETS:
                run(w, d, ro.select(costs[key], ub, eligible, bud), ub, maps, acc[(m, "local", bud)])
                run(w, d, select_global(costs[key], ub, eligible, bud), ub, maps, acc[(m, "global", bud)])
        for bud in static_grid:
            run(w, d, ro.select(np.repeat(impact[:, None], n, 1), ub, eligible, bud), ub, maps, acc[("static", "local", bud)])
        print(f"\rdev eval {i + 1}/{len(dev)}, {time.perf_counter() - t0:.0f} s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    flat = {(f"{m}/{a}", bud): v for (m, a, bud), v in acc.items() if m != "static"}
    flat.update({("static", bud): v for (m, a, bud), v in acc.items() if m == "static"})
    names = [f"{m}/{a}" for m in methods for a in ("local", "global")]
    rows, st = ro.summarise(flat, names, ro.BUDGETS, static_grid)
    res = {"what": __doc__.split("\n")[0], "command": "python scripts/router_allocation.py " + " ".join(sys.argv[1:]),
           "train_prompts": len(train), "dev_prompts": len(dev), "tokens": args.tokens,
           "token_factor_spearman_held_out": rho, "rows": rows, "static_curve": st,
           "seconds": round(time.perf_counter() - t0, 1)}
    args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.exit(main())
