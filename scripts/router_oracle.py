"""Design experiment (issue 25): how far can per-token unit routing get above static removal?

On the development prompts only (the curve script's built-in HELD_OUT_PROMPTS and
fixtures/router_curve/heldout_2026-12-03 and _2026-12-04, all used before; heldout_2026-12-04b is
not read), teacher-forced on pruning off's own 32-token greedy continuation: at each decode
position the units (blocks 0 and L-1 protected) are taken cheapest per byte first until a budget
of blocks' worth of weight bytes per token would be exceeded, where "cheapest" is
- ``oracle``: the measured KL of bypassing that unit at that token alone (isolated_bypass; a
  reference for what a perfect per-token cost predictor could do, interactions aside),
- ``predicted``: the unit predictor's score at that token (what the engine's predictor knows),
- ``static``: the unit's mean cost (``impact``), the same at every token: the best static removal
  (per unit, impact per byte), swept finely and interpolated at the other methods' bytes.
Each decision set runs through one per-position pass (isolated_bypass.forward_units_per_position)
with the unit maps; top-1 agreement and mean KL against pruning off.

    python scripts/router_oracle.py [--limit N] [--out results/router_oracle_dev.json]

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
from reference_engine.isolated_bypass import forward_unit_alone, forward_units_per_position
from reference_engine.model import forward_units
from rsp_bench import metrics
from rsp_bench.router_curve_measure import HELD_OUT_PROMPTS

ROOT = Path(__file__).resolve().parents[1]
DEV_FILES = ("heldout_2026-12-03.jsonl", "heldout_2026-12-04.jsonl")
BUDGETS = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
STATIC_GRID = tuple(np.round(np.arange(0.25, 8.01, 0.25), 2))


def select(cost: np.ndarray, ub: np.ndarray, eligible: np.ndarray, budget: float) -> np.ndarray:
    """cost [U, n] -> skip [n, U]: per position, units cheapest per byte first while the bytes
    stay within ``budget``."""
    U, n = cost.shape
    skip = np.zeros((n, U), bool)
    per_byte = np.where(eligible[:, None], cost / ub[:, None], np.inf)
    order = np.argsort(per_byte, axis=0, kind="stable")
    for t in range(n):
        used = 0.0
        for u in order[:, t]:
            if not eligible[u]:
                break
            if used + ub[u] > budget:
                continue  # a smaller unit later in the order may still fit
            skip[t, u] = True
            used += ub[u]
    return skip


def dev_prompts() -> list[str]:
    """The development prompts: the built-in set, then heldout_2026-12-03 and _2026-12-04."""
    return list(HELD_OUT_PROMPTS) + [json.loads(x)["text"] for f in DEV_FILES
                                     for x in (ROOT / "fixtures" / "router_curve" / f).read_text().splitlines() if x.strip()]


def extra_training_prompts(through: str) -> list[str]:
    """More training text for the predictor: the plain English requests of the degradation splits
    up to the one dated ``through`` (a folder suffix such as "2026-12-05b"; the undated first split
    always counts), none of them a curve prompt (development or blind), in a fixed shuffle. The
    list depends on the splits it reads, so every use names its last split: the label cache of
    ``router_allocation.py --extra`` read through 2026-12-05b (406 requests); the first 116 through
    2026-12-05c (455) are frozen in reference_engine/data/training_text/plain_en.jsonl, the
    packaged predictor's training text."""
    folders = sorted((ROOT / "fixtures").glob("degradation_heldout*"))
    if not any(f.name.endswith(through) for f in folders):
        raise ValueError(f"no degradation split dated {through!r} under fixtures/")
    folders = [f for f in folders if f.name == "degradation_heldout" or f.name[len("degradation_heldout_"):] <= through]
    texts = [r["text"] for f in folders for r in map(json.loads, (f / "prompts.jsonl").read_text().splitlines())
             if r.get("group") == "plain_en"]
    curve = {json.loads(x)["text"] for f in (ROOT / "fixtures" / "router_curve").glob("*.jsonl")
             for x in f.read_text().splitlines() if x.strip()}
    texts = [t for t in texts if t not in curve]
    return [texts[i] for i in np.random.default_rng(25).permutation(len(texts))]


def run_selection(w, seq: torch.Tensor, S: int, clean_rows: torch.Tensor, cost: np.ndarray, ub: np.ndarray,
                  eligible: np.ndarray, budget: float, maps, acc: list) -> None:
    """Run one decision set (``select`` of ``cost`` within ``budget``) through a per-position pass
    and add its top-1 hits, summed KL, bytes (blocks' worth) and positions to ``acc``."""
    T, U = seq.shape[1], len(ub)
    skip_dec = select(cost, ub, eligible, budget)
    skip = torch.zeros(T, U, dtype=torch.bool)
    skip[S:T - 1] = torch.from_numpy(skip_dec)
    out = forward_units_per_position(w, seq, S, skip, maps)[1:]
    acc[0] += float(metrics.top1_matches(clean_rows, out).sum())
    acc[1] += float(metrics.kl_per_token(clean_rows, out).sum())
    acc[2] += float((skip_dec * ub[None, :]).sum())
    acc[3] += skip_dec.shape[0]


def summarise(acc: dict, methods: list[str], budgets, static_grid) -> tuple[list[dict], list[dict]]:
    """Per budget and method: bytes, top-1 and mean KL, and the best static removal (the
    ``static`` sweep) interpolated at the method's bytes; and the static curve itself."""
    def point(key):
        agree, kl, by, n = acc[key]
        return {"blocks_worth": by / n, "top1": agree / n, "kl_mean": kl / n, "positions": n}

    st = sorted((point(("static", b)) for b in static_grid), key=lambda p: p["blocks_worth"])
    xs = [p["blocks_worth"] for p in st]
    rows = []
    for b in budgets:
        row = {"budget": b}
        for m in methods:
            p = point((m, b))
            s_top1 = float(np.interp(p["blocks_worth"], xs, [q["top1"] for q in st]))
            s_kl = float(np.interp(p["blocks_worth"], xs, [q["kl_mean"] for q in st]))
            row[m] = {**p, "static_top1": s_top1, "static_kl": s_kl,
                      "top1_lead_points": 100 * (p["top1"] - s_top1), "kl_minus_static": p["kl_mean"] - s_kl}
        rows.append(row)
        print(f"budget {b}: " + "; ".join(f"{m} {row[m]['blocks_worth']:.2f} bw {row[m]['top1_lead_points']:+.1f} pts, "
                                          f"KL {row[m]['kl_mean']:.3f} vs {row[m]['static_kl']:.3f}" for m in methods))
    return rows, st


def load_setup():
    """The embedded engine, its unit predictor and unit maps, each unit's bytes in blocks' worth,
    and which units may go (blocks 0 and L - 1 protected, as the engine's default blacklist)."""
    torch.set_grad_enabled(False)
    engine = Engine.load(None)
    pred = engine.unit_predictor()
    ub_raw, block_bytes = engine.unit_bytes()
    L = engine.dims.n_layers
    eligible = np.array([u // 2 not in (0, L - 1) for u in range(2 * L)])
    return engine, pred, pred.bypass_maps(), np.asarray(ub_raw, float) / block_bytes, eligible


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--limit", type=int, default=None, help="first N development prompts (a smoke run)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "router_oracle_dev.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    engine, pred, maps, ub, eligible = load_setup()
    w = engine.weights
    L = engine.dims.n_layers
    U = 2 * L
    prompts = dev_prompts()
    if args.limit:
        prompts = prompts[: args.limit]
    methods = ["oracle", "predicted"]
    acc = {(m, b): [0.0, 0.0, 0.0, 0] for m in methods for b in BUDGETS}  # agree, kl sum, bytes sum, n
    acc.update({("static", b): [0.0, 0.0, 0.0, 0] for b in STATIC_GRID})
    for i, prompt in enumerate(prompts):
        ids = engine.encode(prompt)
        [ref] = engine.generate([prompt], max_new_tokens=args.tokens, mode="off", log_level="NONE")
        seq = torch.tensor([ids + ref.token_ids])
        S, T = len(ids), seq.shape[1]
        rec: dict = {}
        clean = forward_units(w, seq, S, record=rec)
        n = T - 1 - S  # scored decode positions S .. T-2
        if n < 1:
            continue
        ref_rows = clean[1:]
        ref_logp = torch.log_softmax(ref_rows.double(), -1)
        oracle = np.zeros((U, n))
        for u in range(U):
            if eligible[u]:
                out = forward_unit_alone(w, rec, S, u, maps[u])[1:]
                oracle[u] = up._kl_rows(ref_logp, out)
        predicted = np.zeros((U, n))
        for layer in range(L):
            for k, key in enumerate(("x_attn", "x_mlp")):
                x = rec[key][layer][S:T - 1].numpy()
                predicted[2 * layer + k] = np.exp(pred.log_scores(x, 2 * layer + k))
        static = np.repeat(np.asarray(pred.impact, float)[:, None], n, 1)
        runs = [(m, b, c) for m, c in (("oracle", oracle), ("predicted", predicted)) for b in BUDGETS]
        runs += [("static", b, static) for b in STATIC_GRID]
        for m, b, cost in runs:
            run_selection(w, seq, S, ref_rows, cost, ub, eligible, b, maps, acc[(m, b)])
        print(f"\r{i + 1}/{len(prompts)} prompts, {time.perf_counter() - t0:.0f} s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    rows, st = summarise(acc, methods, BUDGETS, STATIC_GRID)
    res = {"what": __doc__.split("\n")[0], "command": "python scripts/router_oracle.py " + " ".join(sys.argv[1:]),
           "prompts": len(prompts), "tokens": args.tokens, "rows": rows, "static_curve": st,
           "seconds": round(time.perf_counter() - t0, 1)}
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
