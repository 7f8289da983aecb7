"""Design experiment (issue 25): does a small non-linear predictor rank units within a token better
than the packaged linear one?

On the per-token labels cached by scripts/router_allocation.py (``--cache``: the isolated KL of
bypassing each unit at each decode token, the predictor's 48 training prompts and the first 24
development prompts; the blind heldout_2026-12-04b is not read), a network per unit input
x_u -> relu(W1 x_u + e_u) -> w2_u . h + b_u (W1 shared by all units, e_u and the readout per
unit; ``--hidden`` units) is fitted to log(KL + floor) on the training prompts' fitting part
(Adam, early stopping on their held-out quarter), and its scores pick units per position within
each budget as router_oracle.py does, against the packaged predictor and the best static removal.

    python scripts/router_mlp.py [--hidden 32] [--cache /tmp/rc] [--out results/router_mlp_dev.json]

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
import router_allocation as ra  # noqa: E402
import router_oracle as ro  # noqa: E402

from reference_engine import unit_predictor as up  # noqa: E402
from reference_engine.model import forward_units  # noqa: E402


def unit_inputs(w, d: dict, L: int) -> list[np.ndarray]:
    seq = torch.from_numpy(d["ids"].astype(np.int64))[None]
    S, T = int(d["S"]), seq.shape[1]
    rec: dict = {}
    d["clean"] = forward_units(w, seq, S, record=rec)[1:]
    return [rec["x_attn" if u % 2 == 0 else "x_mlp"][u // 2][S:T - 1].numpy() for u in range(2 * L)]


class UnitMLP(torch.nn.Module):
    def __init__(self, dim: int, units: int, hidden: int):
        super().__init__()
        self.w1 = torch.nn.Linear(dim, hidden)
        self.emb = torch.nn.Parameter(torch.zeros(units, hidden))
        self.w2 = torch.nn.Parameter(torch.randn(units, hidden) * 0.05)
        self.b2 = torch.nn.Parameter(torch.zeros(units))

    def forward(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.w1(x) + self.emb[u])
        return (h * self.w2[u]).sum(-1) + self.b2[u]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/rc"))
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--out", type=Path, default=ro.ROOT / "results" / "router_mlp_dev.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    torch.manual_seed(0)
    engine, pred, maps, ub, eligible = ro.load_setup()
    w = engine.weights
    L = engine.dims.n_layers
    U = 2 * L
    load = lambda tag, n: [dict(np.load(args.cache / f"{tag}_{i:03d}.npz")) for i in range(n)]  # noqa: E731
    train, dev = load("train", len(up.TRAIN_PROMPTS)), load("dev", args.limit)
    held = set(np.random.default_rng(up.SEED).permutation(len(train))[: max(1, len(train) // 4)].tolist())
    parts = {"fit": ([], [], []), "held": ([], [], [])}
    for i, d in enumerate(train):
        xs = unit_inputs(w, d, L)
        X, Y, Uu = parts["held" if i in held else "fit"]
        for u in np.flatnonzero(eligible):
            X.append(xs[u]); Y.append(np.log(d["kl"][u] + up.KL_FLOOR)); Uu.append(np.full(len(xs[u]), u))
    tensors = {k: (torch.from_numpy(np.concatenate(X)).float(), torch.from_numpy(np.concatenate(Y)).float(),
                   torch.from_numpy(np.concatenate(Uu)).long()) for k, (X, Y, Uu) in parts.items()}
    Xf, Yf, Uf = tensors["fit"]
    Xh, Yh, Uh = tensors["held"]
    # per-unit standardisation of the target is left to the per-unit bias; inputs as the engine has them
    model = UnitMLP(Xf.shape[1], U, args.hidden)
    with torch.no_grad():  # start each unit's bias at its mean log cost
        for u in np.flatnonzero(eligible):
            model.b2[u] = Yf[Uf == u].mean()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-5)
    best = (float("inf"), None)
    for epoch in range(args.epochs):
        torch.set_grad_enabled(True)
        perm = torch.randperm(len(Xf))
        for k in range(0, len(perm), 512):
            idx = perm[k:k + 512]
            loss = torch.nn.functional.mse_loss(model(Xf[idx], Uf[idx]), Yf[idx])
            opt.zero_grad(); loss.backward(); opt.step()
        torch.set_grad_enabled(False)
        err = float(torch.nn.functional.mse_loss(model(Xh, Uh), Yh))
        if err < best[0]:
            best = (err, {k: v.clone() for k, v in model.state_dict().items()}, epoch)
        print(f"\repoch {epoch + 1}/{args.epochs}: held-out MSE {err:.3f} (best {best[0]:.3f})", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    model.load_state_dict(best[1])
    torch.set_grad_enabled(False)
    ph = model(Xh, Uh).numpy()
    rho = float(np.mean([up.spearman(ph[(Uh == u).numpy()], Yh[Uh == u].numpy()) for u in np.flatnonzero(eligible)]))
    rho_lin = float(np.mean([up.spearman(pred.log_scores(Xh[Uh == u].numpy(), int(u)), Yh[Uh == u].numpy())
                             for u in np.flatnonzero(eligible)]))
    print(f"within-unit Spearman on the held-out quarter: mlp {rho:.3f}, packaged {rho_lin:.3f}", file=sys.stderr)
    static_grid = tuple(np.round(np.arange(0.5, 7.01, 0.5), 2))
    methods = ["packaged", "mlp"]
    acc = {(m, b): [0.0, 0.0, 0.0, 0] for m in methods for b in ro.BUDGETS}
    acc.update({("static", b): [0.0, 0.0, 0.0, 0] for b in static_grid})
    impact = np.asarray(pred.impact, float)
    for i, d in enumerate(dev):
        xs = unit_inputs(w, d, L)
        n = d["kl"].shape[1]
        if n < 1:
            continue
        mlp = np.full((U, n), np.inf)
        for u in np.flatnonzero(eligible):
            mlp[u] = np.exp(model(torch.from_numpy(xs[u]).float(), torch.full((n,), int(u))).numpy())
        costs = {"packaged": d["score"], "mlp": mlp}
        for m in methods:
            for b in ro.BUDGETS:
                ra.run(w, d, ro.select(costs[m], ub, eligible, b), ub, maps, acc[(m, b)])
        for b in static_grid:
            ra.run(w, d, ro.select(np.repeat(impact[:, None], n, 1), ub, eligible, b), ub, maps, acc[("static", b)])
        print(f"\rdev {i + 1}/{len(dev)}, {time.perf_counter() - t0:.0f} s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    rows, st = ro.summarise(acc, methods, ro.BUDGETS, static_grid)
    res = {"what": __doc__.split("\n")[0], "command": "python scripts/router_mlp.py " + " ".join(sys.argv[1:]),
           "hidden": args.hidden, "best_epoch": best[2], "held_out_mse": best[0],
           "spearman_within_unit_held_out": {"mlp": rho, "packaged": rho_lin},
           "train_prompts": len(train), "dev_prompts": len(dev), "rows": rows, "static_curve": st,
           "seconds": round(time.perf_counter() - t0, 1)}
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
