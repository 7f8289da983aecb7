"""Fit protective degradation's language rule (``reference_engine/degradation/language_rule.py``)
for the embedded weights, with the three splits kept apart:

1. **Fit** which scripts pruning spares as it spares English, from the per-language damage on the
   plain requests of two development splits (``fixtures/degradation_heldout_2026-12-03`` and
   ``..._2026-12-03b``: teacher-forced top-1 and KL against pruning off at the engine's default
   configuration, the detector suspended, 16 tokens; measured now, so a change of the default
   router or sensitivity is fitted to; ``--from-reports`` reads the committed reports' figures
   instead), pooled per script: spared where top-1 is at least English's minus 0.01, KL at most
   1.5x English's, over at least 256 tokens.
2. **Choose** the rule's coverage and margin on two other development splits
   (``fixtures/degradation_heldout`` and ``fixtures/degradation_heldout_2026-12-04``): each of their
   items written mostly (>= 90% of letters) in a spared script goes through the engine once, and the
   model-level score of the whole prompt and the request words' share of its content are read. The
   choice: of a grid, the (coverage, margin) that excuses the most plain requests in other languages
   while excusing at most 1% of the odd inputs; ties to the larger coverage, then the smaller margin.
3. **Report** on a split that chose nothing: ``rsp-bench degradation`` on
   ``fixtures/degradation_heldout_2026-12-04b``.

Writes ``reference_engine/data/calibration/<weights>-script-damage-v1.json`` (``--out`` elsewhere),
atomically. Reads the score through a wrapper of ``ood.judge`` (a measurement tool: the engine's
path is unchanged). About 12 minutes on 2 cores (6 with ``--from-reports``).

    python scripts/fit_language_rule.py
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIT = ("degradation_heldout_2026-12-03", "degradation_heldout_2026-12-03b")
CHOOSE = ("degradation_heldout", "degradation_heldout_2026-12-04")
MIN_SHARE = 0.9
COVERAGES = (0.5, 0.7, 0.8, 0.9)
MARGINS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MAX_ODD_EXCUSED = 0.01
DAMAGE_TOKENS = 16  # as rsp-bench degradation's --damage-tokens default


def _items(split: str) -> list[dict]:
    return [json.loads(line) for line in (REPO / "fixtures" / split / "prompts.jsonl").open()]


def measure_damage(split: str, n_tokens: int = DAMAGE_TOKENS) -> dict[str, dict]:
    """Per language (and "en"), pruning's damage at the engine's default configuration on the
    split's plain requests, pooled over tokens: the shape of a report's ``languages_damage``."""
    from reference_engine import Engine
    from rsp_bench.degradation_report import damage

    engine = _engine(Engine)
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0.0])
    plain = [x for x in _items(split) if x["group"] in ("plain_language", "plain_en")]
    for i, x in enumerate(plain):
        d = damage(engine, x["text"], n_tokens)
        a = acc["en" if x["group"] == "plain_en" else x["lang"]]
        a[0] += d["top1_hits"]
        a[1] += d["tokens"]
        a[2] += d["kl_mean"] * d["tokens"]
        print(f"\rdamage {split}: {i + 1}/{len(plain)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {lang: {"top1": h / n, "tokens": n, "kl_mean": kl / n} for lang, (h, n, kl) in acc.items()}


_ENGINE: list = []


def _engine(cls):
    if not _ENGINE:
        _ENGINE.append(cls.load())
    return _ENGINE[0]


def fit_scripts(from_reports: bool = False) -> tuple[list[str], dict]:
    from reference_engine.degradation.language_rule import dominant_script

    pooled: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0.0])  # top-1 hits, tokens, KL sum
    en = [0.0, 0, 0.0]
    for split in FIT:
        script_of = {x["lang"]: dominant_script(x["text"])[0] for x in _items(split) if x["group"] == "plain_language"}
        damage = (json.loads((REPO / "results" / f"{split}.json").read_text())["languages_damage"] if from_reports
                  else measure_damage(split))
        for lang, v in damage.items():
            acc = en if lang == "en" else pooled[script_of[lang]]
            acc[0] += v["top1"] * v["tokens"]
            acc[1] += v["tokens"]
            acc[2] += v["kl_mean"] * v["tokens"]
    en_top1, en_kl = en[0] / en[1], en[2] / en[1]
    table = {s: {"top1": round(h / n, 4), "kl_mean": round(kl / n, 4), "tokens": n} for s, (h, n, kl) in pooled.items()}
    spared = sorted(s for s, v in table.items()
                    if v["tokens"] >= 256 and v["top1"] >= en_top1 - 0.01 and v["kl_mean"] <= 1.5 * en_kl)
    return spared, {"english": {"top1": round(en_top1, 4), "kl_mean": round(en_kl, 4), "tokens": en[1]},
                    "scripts": dict(sorted(table.items()))}


def score_items(spared: list[str]) -> list[dict]:
    from reference_engine import Engine, PruningConfig, ood
    from reference_engine.degradation.language_rule import dominant_script

    seen: dict = {}
    judge = ood.judge

    def reading_judge(det, w, hidden, row, offset, ids, lo, hi, *args, **kwargs):
        whole = ood.prompt_stats(w, hidden, row, offset, ids, lo, hi, args[0], args[2] if len(args) > 2 else frozenset(),
                                 args[4] if len(args) > 4 else kwargs.get("scored"))
        seen.update(score=float(det.score(whole)), threshold=float(det.threshold))
        tokens = args[3] if len(args) > 3 else kwargs.get("request_tokens")
        words = tokens() if tokens is not None else None
        seen["coverage"] = (len([i for i in words if max(lo, 1) <= i < hi]) / max(1, hi - max(lo, 1))
                            if words is not None else 0.0)
        kwargs["plain_margin"] = None  # the score as it was before the rule
        return judge(det, w, hidden, row, offset, ids, lo, hi, *args[:5], **kwargs)

    ood.judge = reading_judge
    try:
        engine = _engine(Engine)
        cfg = PruningConfig(mode="lossy", sensitivity=0.5, hardware_watermark=0.0)
        rows = []
        for split in CHOOSE:
            for x in _items(split):
                script, share = dominant_script(x["text"])
                if x["group"] == "payload_alone" or script not in spared or share < MIN_SHARE:
                    continue
                seen.clear()
                (res,) = engine.generate([x["text"]], max_new_tokens=1, config=cfg)
                rows.append({"split": split, "id": x["id"], "group": x["group"], "kind": x["kind"],
                             "reason": res.stats["degraded_reason"], **seen})
        return rows
    finally:
        ood.judge = judge


def choose(rows: list[dict]) -> tuple[float, float, dict]:
    by_score = [r for r in rows if r["reason"] == "ood_score"]
    n_odd = sum(1 for r in rows if r["group"] == "odd")
    grid = {}
    for c in COVERAGES:
        for m in MARGINS:
            counts = {g: sum(1 for r in by_score if r["group"] == g and r["coverage"] >= c
                             and r["score"] <= r["threshold"] + m) for g in ("plain_language", "data_request", "odd")}
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
    p.add_argument("--from-reports", action="store_true",
                   help="take the fit splits' damage from their committed reports (results/<split>.json, measured "
                        "with the default configuration of their day) instead of measuring it now")
    a = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from reference_engine.degradation import language_rule
    from reference_engine.engine import weights_digest
    from reference_engine.model_loading import resolve_model
    from rsp_bench.storage import atomic_write_text

    from reference_engine.config import PruningConfig

    spared, table = fit_scripts(a.from_reports)
    default = PruningConfig()
    table["measured_with"] = ("the fit splits' committed reports" if a.from_reports else
                              {"mode": default.mode, "router": default.router, "sensitivity": default.sensitivity,
                               "damage_tokens": DAMAGE_TOKENS})
    print(f"spared scripts (fitted on {', '.join(FIT)}): {spared}", file=sys.stderr)
    rows = score_items(spared)
    c, m, summary = choose(rows)
    print(f"chosen on {', '.join(CHOOSE)}: coverage {c}, margin {m}; {summary['grid'][f'coverage={c},margin={m}']}",
          file=sys.stderr)
    sha = weights_digest(resolve_model(None)[1])
    out = a.out or language_rule.rule_path(REPO / "reference_engine" / "data", sha)
    doc = {"version": language_rule.VERSION, "weights_sha256": sha, "scripts": spared, "min_share": MIN_SHARE,
           "min_coverage": c, "margin": m,
           "info": {"command": "python scripts/fit_language_rule.py" + (" --from-reports" if a.from_reports else ""),
                    "fitted_on": list(FIT), "chosen_on": list(CHOOSE),
                    "rule": "spared: pooled top-1 >= English's - 0.01 and KL <= 1.5x English's over >= 256 tokens; "
                            f"chosen: most plain_language excused with odd excused <= {MAX_ODD_EXCUSED:.0%}",
                    "damage": table, "choice": summary}}
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
