"""Design experiment (issue 25): would more training text make the unit predictor rank units better?

On the per-token labels cached by scripts/router_allocation.py (``--cache``: the isolated KL of
bypassing each unit at each decode token, for the predictor's 48 training prompts and the first 24
development prompts; the blind heldout_2026-12-04b is not read), per-unit ridges of log(KL + floor)
on the unit's input, the packaged predictor's form, are fitted on growing numbers of prompts and
scored on a fixed evaluation part that no fit sees: the first ``--eval`` development prompts. The
fitting pool is the 48 training prompts and the remaining development prompts; each size is fitted
``--repeats`` times on random draws from the pool (the ridge strength chosen per unit on a quarter of
the draw, as ``unit_predictor.train`` does). The figure is the within-unit Spearman of predicted and
measured cost on the evaluation tokens, mean over units; its slope against log(prompts) says what
more text of this kind would buy.

    python scripts/router_data_curve.py [--cache /tmp/rc] [--eval 12] [--repeats 3] [--extra]

With ``--extra`` the pool also holds the plain English requests labelled by ``router_allocation.py
--extra N`` (the degradation splits' ``plain_en`` items; none is a curve prompt).

Must not be imported by the engine or the harness; it records a design decision.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import router_oracle as ro  # noqa: E402
from router_mlp import unit_inputs  # noqa: E402

from reference_engine import unit_predictor as up  # noqa: E402


def fit_units(parts: list[tuple[list[np.ndarray], np.ndarray]], units: np.ndarray, seed: int
              ) -> dict[int, tuple[np.ndarray, float]]:
    """Per unit, a ridge on the draw's prompts, its strength chosen on a quarter of them."""
    rng = np.random.default_rng(seed)
    held = set(rng.permutation(len(parts))[: max(1, len(parts) // 4)].tolist())
    out = {}
    for u in units:
        xf = np.concatenate([x[u] for i, (x, _) in enumerate(parts) if i not in held])
        yf = np.concatenate([y[u] for i, (_, y) in enumerate(parts) if i not in held])
        xh = np.concatenate([x[u] for i, (x, _) in enumerate(parts) if i in held])
        yh = np.concatenate([y[u] for i, (_, y) in enumerate(parts) if i in held])
        lam, _, _ = up.choose_ridge(xf, yf, xh, yh)
        # refit on the whole draw at the chosen strength: every prompt of the size counts
        out[int(u)] = up.fit_ridge(np.concatenate([x[u] for x, _ in parts]),
                                   np.concatenate([y[u] for _, y in parts]), lam)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/rc"))
    ap.add_argument("--eval", type=int, default=12, help="first N development prompts scored, never fitted")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--extra", action="store_true",
                    help="add the cached plain-English requests (router_allocation.py --extra N) to the pool")
    ap.add_argument("--out", type=Path, default=ro.ROOT / "results" / "router_data_curve_dev.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    engine, pred, _maps, _ub, eligible = ro.load_setup()
    w, L = engine.weights, engine.dims.n_layers
    files = {tag: sorted(args.cache.glob(f"{tag}_*.npz")) for tag in ("train", "dev", "extra")}
    files["extra"] = files["extra"] if args.extra else []
    if len(files["dev"]) <= args.eval or not files["train"]:
        print(f"error: {args.cache} holds {len(files['train'])} training and {len(files['dev'])} development "
              f"label files; run scripts/router_allocation.py --cache {args.cache} first", file=sys.stderr)
        return 2
    units = np.flatnonzero(eligible)

    def prompt_part(path: Path) -> tuple[list[np.ndarray], np.ndarray]:
        d = dict(np.load(path))
        return unit_inputs(w, d, L), np.log(d["kl"] + up.KL_FLOOR)

    evaluation = [prompt_part(p) for p in files["dev"][: args.eval]]
    pool = [prompt_part(p) for p in files["train"] + files["dev"][args.eval:] + files["extra"]]
    print(f"inputs: {len(pool)} pool, {len(evaluation)} evaluation prompts, {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)

    def within_unit(model: dict[int, tuple[np.ndarray, float]] | None) -> float:
        rhos = []
        for u in units:
            x = np.concatenate([x[u] for x, _ in evaluation])
            y = np.concatenate([y[u] for _, y in evaluation])
            p = pred.log_scores(x, int(u)) if model is None else x @ model[int(u)][0] + model[int(u)][1]
            rhos.append(up.spearman(p, y))
        return float(np.mean(rhos))

    sizes = [n for n in (6, 12, 24, 36, 48, 96) if n < len(pool)] + [len(pool)]
    rows = []
    for n in sizes:
        reps = 1 if n == len(pool) else args.repeats
        vals = []
        for r in range(reps):
            draw = np.random.default_rng(1000 * n + r).permutation(len(pool))[:n]
            vals.append(within_unit(fit_units([pool[i] for i in draw], units, seed=r)))
        rows.append({"prompts": n, "spearman_within_unit": float(np.mean(vals)), "draws": vals})
        print(f"{n:3d} prompts: within-unit Spearman {np.mean(vals):.3f} ({', '.join(f'{v:.3f}' for v in vals)})",
              file=sys.stderr)
    logs = np.log([r["prompts"] for r in rows])
    slope = float(np.polyfit(logs, [r["spearman_within_unit"] for r in rows], 1)[0])
    res = {"what": __doc__.split("\n")[0], "command": "python scripts/router_data_curve.py " + " ".join(sys.argv[1:]),
           "evaluation_prompts": len(evaluation), "pool_prompts": len(pool), "rows": rows,
           "packaged_predictor_spearman_within_unit": within_unit(None),
           "slope_per_doubling": slope * np.log(2), "seconds": round(time.perf_counter() - t0, 1)}
    args.out.write_text(json.dumps(res, indent=1))
    print(f"slope: {res['slope_per_doubling']:+.3f} Spearman per doubling of the prompts; packaged "
          f"{res['packaged_predictor_spearman_within_unit']:.3f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
