"""Fit protective degradation's language rule (``reference_engine/degradation/language_rule.py``,
version 2) for the embedded weights, with the three splits kept apart:

1. **Fit** per script the loss from which pruning spares plain requests as it spares English. On
   the plain requests of three development splits (``FIT``), each prompt gets pruning's damage at
   the engine's default configuration (teacher-forced top-1 and KL against pruning off, the
   detector suspended, 16 tokens; measured now, so a change of the default router or sensitivity
   is fitted to) and the model's mean loss on it (the score's own, read through the engine's
   check). Per script, the prompts are pooled from the highest loss down: the script's cut is the
   lowest loss whose prompts at or above it have, pooled, top-1 at least English's minus 0.01 and
   KL at most 1.5x English's, over at least ``MIN_TOKENS`` tokens; a script with no such cut is
   not spared.
2. **Choose** the rule's coverage and margin on two other development splits (``CHOOSE``): each
   item written mostly (>= 90% of letters) in a spared script goes through the engine once, and
   the model-level score of the whole prompt, its mean loss and the request words' share of its
   content are read. The choice: of a grid, the (coverage, margin) that excuses the most plain
   requests in other languages while excusing at most 1% of the odd inputs; ties to the larger
   coverage, then the smaller margin.
3. **Report** on a split that chose nothing: ``rsp-bench degradation`` on the newest held-out
   split.

Writes ``reference_engine/data/calibration/<weights>-script-damage-v2.json`` (``--out`` elsewhere)
and the per-prompt fit rows (``results/language_rule_fit.json``; ``--reuse-fit`` reads them back
instead of measuring), atomically. Reads the score through a wrapper of ``ood.judge`` (a
measurement tool: the engine's path is unchanged). About 25 minutes on 2 cores.

    python scripts/fit_language_rule.py [--reuse-fit]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIT = ("degradation_heldout_2026-12-03", "degradation_heldout_2026-12-03b", "degradation_heldout_2026-12-04b")
CHOOSE = ("degradation_heldout_2026-12-04", "degradation_heldout_2026-12-04c")
FIT_ROWS = REPO / "results" / "language_rule_fit.json"
MIN_SHARE = 0.9
MIN_TOKENS = 128  # 8 prompts of 16 tokens: the fewest a script's spared part is pooled over
COVERAGES = (0.5, 0.7, 0.8, 0.9)
MARGINS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MAX_ODD_EXCUSED = 0.01
DAMAGE_TOKENS = 16  # as rsp-bench degradation's --damage-tokens default


def _items(split: str) -> list[dict]:
    return [json.loads(line) for line in (REPO / "fixtures" / split / "prompts.jsonl").open()]


_ENGINE: list = []


def _engine():
    if not _ENGINE:
        from reference_engine import Engine

        _ENGINE.append(Engine.load())
    return _ENGINE[0]


def read_prompt(text: str) -> dict:
    """What the engine's check sees of one prompt, the language rule left out: the score of the
    whole, its threshold, the whole's mean loss (nats per scored token), the request words' share
    of the content, and the reason it would degrade for (None: pruned)."""
    from reference_engine import PruningConfig, ood

    seen: dict = {}
    judge = ood.judge

    def reading_judge(det, w, hidden, row, offset, ids, lo, hi, *args, **kwargs):
        whole = ood.prompt_stats(w, hidden, row, offset, ids, lo, hi, args[0], args[2] if len(args) > 2 else frozenset(),
                                 args[4] if len(args) > 4 else kwargs.get("scored"))
        seen.update(score=float(det.score(whole)), threshold=float(det.threshold),
                    loss=float(whole.nll.mean()) if whole.nll.size else 0.0)
        tokens = args[3] if len(args) > 3 else kwargs.get("request_tokens")
        words = tokens() if tokens is not None else None
        seen["coverage"] = (len([i for i in words if max(lo, 1) <= i < hi]) / max(1, hi - max(lo, 1))
                            if words is not None else 0.0)
        kwargs["plain_margin"] = None  # the score as it was before the rule
        return judge(det, w, hidden, row, offset, ids, lo, hi, *args[:5], **kwargs)

    ood.judge = reading_judge
    try:
        cfg = PruningConfig(mode="lossy", sensitivity=0.5, hardware_watermark=0.0)
        (res,) = _engine().generate([text], max_new_tokens=1, config=cfg)
    finally:
        ood.judge = judge
    return {"loss": None, "score": None, "threshold": None, "coverage": 0.0, **seen,
            "reason": res.stats["degraded_reason"]}


def measure_fit_rows() -> list[dict]:
    """Per plain request of the fit splits: its language and script, pruning's damage at the
    default configuration and the model's mean loss on it."""
    from reference_engine.degradation.language_rule import dominant_script
    from rsp_bench.degradation_report import damage

    rows = []
    for split in FIT:
        plain = [x for x in _items(split) if x["group"] in ("plain_language", "plain_en")]
        for i, x in enumerate(plain):
            d = damage(_engine(), x["text"], DAMAGE_TOKENS)
            script, share = dominant_script(x["text"])
            rows.append({"split": split, "id": x["id"], "lang": "en" if x["group"] == "plain_en" else x["lang"],
                         "script": script, "share": round(share, 4), "loss": read_prompt(x["text"])["loss"],
                         "tokens": d["tokens"], "top1_hits": d["top1_hits"], "kl_mean": d["kl_mean"]})
            print(f"\rfit {split}: {i + 1}/{len(plain)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    return rows


def _pool(rows: list[dict]) -> dict:
    n = sum(r["tokens"] for r in rows)
    return {"top1": sum(r["top1_hits"] for r in rows) / max(n, 1),
            "kl_mean": sum(r["kl_mean"] * r["tokens"] for r in rows) / max(n, 1), "tokens": n, "prompts": len(rows)}


def fit_cuts(rows: list[dict]) -> tuple[dict[str, float], dict]:
    """Per script, the lowest loss whose plain requests at or above it are, pooled, hurt no more
    than English's (``min_loss``), and the evidence."""
    en = _pool([r for r in rows if r["lang"] == "en"])
    top1_min, kl_max = en["top1"] - 0.01, 1.5 * en["kl_mean"]
    cuts, table = {}, {}
    scripts = sorted({r["script"] for r in rows if r["lang"] != "en" and r["script"]})
    for script in scripts:
        mine = sorted((r for r in rows if r["lang"] != "en" and r["script"] == script and r["share"] >= MIN_SHARE
                       and r["loss"] is not None), key=lambda r: -r["loss"])
        table[script] = {"all": {k: round(v, 4) for k, v in _pool(mine).items()}}
        for k in range(len(mine), 0, -1):  # the most prompts first: the lowest cut that holds
            part = _pool(mine[:k])
            if part["tokens"] >= MIN_TOKENS and part["top1"] >= top1_min and part["kl_mean"] <= kl_max:
                cuts[script] = round(mine[k - 1]["loss"], 4)
                table[script]["spared"] = {**{q: round(v, 4) for q, v in part.items()}, "min_loss": cuts[script]}
                break
    return cuts, {"english": {k: round(v, 4) for k, v in en.items()},
                  "criterion": f"pooled top-1 >= {top1_min:.4f} and KL <= {kl_max:.4f} over >= {MIN_TOKENS} tokens",
                  "scripts": table}


def score_items(cuts: dict[str, float]) -> list[dict]:
    from reference_engine.degradation.language_rule import dominant_script

    rows = []
    for split in CHOOSE:
        items = [x for x in _items(split) if x["group"] != "payload_alone"]
        for i, x in enumerate(items):
            script, share = dominant_script(x["text"])
            row = {"split": split, "id": x["id"], "group": x["group"], "kind": x["kind"], "script": script}
            if script in cuts and share >= MIN_SHARE:
                row.update(read_prompt(x["text"]))
            rows.append(row)
            print(f"\rchoose {split}: {i + 1}/{len(items)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    return rows


def choose(rows: list[dict], cuts: dict[str, float]) -> tuple[float, float, dict]:
    by_score = [r for r in rows if r.get("reason") == "ood_score"]
    n_odd = sum(1 for r in rows if r["group"] == "odd")
    grid = {}
    for c in COVERAGES:
        for m in MARGINS:
            counts = {g: sum(1 for r in by_score if r["group"] == g and r["coverage"] >= c
                             and r["score"] <= r["threshold"] + m and r["loss"] >= cuts[r["script"]])
                      for g in ("plain_language", "data_request", "odd")}
            grid[f"coverage={c},margin={m}"] = counts
    ok = [(counts["plain_language"], c, -m) for c in COVERAGES for m in MARGINS
          if (counts := grid[f"coverage={c},margin={m}"])["odd"] <= MAX_ODD_EXCUSED * n_odd]
    _, c, neg_m = max(ok)
    summary = {"items": len(rows), "odd_items": n_odd,
               "degraded_by_score": {g: sum(1 for r in by_score if r["group"] == g)
                                     for g in ("plain_language", "plain_en", "data_request", "odd")},
               "grid": grid}
    return c, -neg_m, summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="rule file (default: the packaged one for the embedded weights)")
    p.add_argument("--reuse-fit", action="store_true",
                   help=f"read the fit rows from {FIT_ROWS.relative_to(REPO)} instead of measuring them")
    a = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from reference_engine.config import PruningConfig
    from reference_engine.degradation import language_rule
    from reference_engine.engine import weights_digest
    from reference_engine.model_loading import resolve_model
    from rsp_bench.storage import atomic_write_text

    default = PruningConfig()
    if a.reuse_fit:
        fit_rows = json.loads(FIT_ROWS.read_text())["rows"]
    else:
        fit_rows = measure_fit_rows()
        atomic_write_text(FIT_ROWS, json.dumps({
            "what": "per plain request of the language rule's fit splits: pruning's damage at the default and the mean loss",
            "command": "python scripts/fit_language_rule.py", "splits": list(FIT), "damage_tokens": DAMAGE_TOKENS,
            "config": {"mode": default.mode, "router": default.router, "sensitivity": default.sensitivity},
            "rows": fit_rows}, indent=1) + "\n")
    cuts, table = fit_cuts(fit_rows)
    table["measured_with"] = {"mode": default.mode, "router": default.router, "sensitivity": default.sensitivity,
                              "damage_tokens": DAMAGE_TOKENS}
    print(f"spared (script: lowest loss, fitted on {', '.join(FIT)}): {cuts}", file=sys.stderr)
    rows = score_items(cuts)
    c, m, summary = choose(rows, cuts)
    print(f"chosen on {', '.join(CHOOSE)}: coverage {c}, margin {m}; {summary['grid'][f'coverage={c},margin={m}']}",
          file=sys.stderr)
    sha = weights_digest(resolve_model(None)[1])
    out = a.out or language_rule.rule_path(REPO / "reference_engine" / "data", sha)
    doc = {"version": language_rule.VERSION, "weights_sha256": sha, "min_loss": cuts, "min_share": MIN_SHARE,
           "min_coverage": c, "margin": m,
           "info": {"command": "python scripts/fit_language_rule.py", "fitted_on": list(FIT), "chosen_on": list(CHOOSE),
                    "rule": f"spared: per script, the lowest mean prompt loss whose plain requests at or above it are, "
                            f"pooled, {table['criterion']}; chosen: most plain_language excused with odd excused "
                            f"<= {MAX_ODD_EXCUSED:.0%}",
                    "damage": table, "choice": summary}}
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
