"""Would judging a plain request against its neighbours' own scores spare more languages? (issue 26,
stop 60; a development measurement, not a rule the engine runs).

The language rule (``reference_engine/degradation/language_rule.py``, version 3) excuses a plain
request the score finds odd when its nearest bank requests are another language that pruning hurts
no more than English and its score is at most the threshold plus one margin. Welsh degrades on every
split although pruning hurts it no more than English: its plain requests score far over that margin.
The lead stop 59 left: a reference per language, the nearest bank requests' own scores, so Welsh is
judged against Welsh. This script adds the bank's scores and decides, offline and as
``fit_language_rule.choose`` does, a grid of arms: the packaged rule's (``none``), and the same rule
that also excuses a request whose score is at most the mean, median or max of its ``k`` neighbours'
scores plus ``m2``. Each arm's best setting is chosen by ``choose``'s own order (most excused in
languages not hurt more minus those hurt more, odd excused <= 1%), on ``fit_language_rule.CHOOSE``
and, with ``--with-reported``, 12-06k added (reported at stop 59, a development split since).

    python scripts/language_rule_neighbour_scores.py [--reads DIR] [--with-reported] --out results/X.json

``--reads DIR`` keeps the engine's reads of the bank's and the choosing splits' prompts
(``bank.pkl``, ``choose.pkl``; ~15 min on 2 idle cores to make). Must not be imported by the engine
or the harness; it records a measurement.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pickle
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
import fit_language_rule as F  # noqa: E402

REPORTED = "degradation_heldout_2026-12-06k"
REFS = ("none", "mean", "median", "max")
REF_MARGINS = (-0.5, 0.0, 0.5, 1.0)


def reads(folder: Path | None) -> tuple[list[dict], list[dict], list[dict]]:
    """(fit rows, their reads, the choosing splits' rows with their reads), from ``folder`` when
    it holds them, else read now through the engine (and kept there)."""
    fit = json.loads(F.FIT_ROWS.read_text())["rows"]
    if folder is not None and (folder / "bank.pkl").is_file() and (folder / "choose.pkl").is_file():
        bank = pickle.loads((folder / "bank.pkl").read_bytes())
        return bank["fit"], bank["bank"], pickle.loads((folder / "choose.pkl").read_bytes())
    texts = {(s, x["id"]): x["text"] for s in F.FIT for x in F._items(s)}
    bank_reads = F.read_prompts([texts[(r["split"], r["id"])] for r in fit])
    rows = [{"split": s, "id": x["id"], "group": x["group"], "kind": x["kind"], "lang": x.get("lang"),
             "text": x["text"]} for s in F.CHOOSE + (REPORTED,) for x in F._items(s) if x["group"] != "payload_alone"]
    for r, s in zip(rows, F.read_prompts([r["text"] for r in rows])):
        r.update(s)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "bank.pkl").write_bytes(pickle.dumps({"fit": fit, "bank": bank_reads}))
        (folder / "choose.pkl").write_bytes(pickle.dumps(rows))
    return fit, bank_reads, rows


def main(argv: list[str] | None = None) -> int:
    from reference_engine.degradation.language_rule import dominant_script
    from rsp_bench.storage import atomic_write_json

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reads", type=Path, default=None, help="folder keeping the engine's reads between runs")
    p.add_argument("--with-reported", action="store_true", help=f"add {REPORTED} (reported) to the choosing splits")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    fit, bank_reads, rows = reads(a.reads)
    keep = [(r, s) for r, s in zip(fit, bank_reads) if s["pooled"] is not None]
    bank = np.stack([s["pooled"] / np.linalg.norm(s["pooled"]) for _, s in keep]).astype(np.float32)
    kl = np.array([r["kl_mean"] for r, _ in keep], np.float32)
    lang = [r["lang"] for r, _ in keep]
    score = np.array([s["score"] for _, s in keep])
    english = float(kl[[x == "en" for x in lang]].mean())
    hurt = F.verdicts(fit)
    splits = F.CHOOSE + ((REPORTED,) if a.with_reported else ())
    rows = [r for r in rows if r["split"] in splits]
    n_odd = sum(r["group"] == "odd" for r in rows)
    by = [r for r in rows if r["reason"] == "ood_score" and r["pooled"] is not None
          and dominant_script(r["text"])[1] >= F.MIN_SHARE]
    V = np.stack([r["pooled"] / np.linalg.norm(r["pooled"]) for r in by])
    order = np.argsort(-(V @ bank.T), axis=1, kind="stable")
    arms: dict[str, dict] = {}
    for k in F.KS:
        near = order[:, :k]
        est = kl[near].mean(1)
        near_lang = [Counter(lang[i] for i in row).most_common(1)[0][0] for row in near]
        ref_of = {"none": np.full(len(by), -np.inf), "mean": score[near].mean(1), "median": np.median(score[near], 1),
                  "max": score[near].max(1)}
        for ratio, c, m, ref in itertools.product(F.KL_RATIOS, F.COVERAGES, F.MARGINS, REFS):
            for m2 in ((0.0,) if ref == "none" else REF_MARGINS):
                counts = Counter()
                for i, r in enumerate(by):
                    if near_lang[i] == "en" or est[i] > ratio * english or r["coverage"] < c:
                        continue
                    if not (r["score"] <= r["threshold"] + m or r["score"] <= ref_of[ref][i] + m2):
                        continue
                    g = r["group"]
                    if g == "plain_language":
                        h = hurt.get(r["lang"])
                        g = "spared_language" if h is False else "hurt_language" if h else "unjudged_language"
                    counts[g] += 1
                if counts["odd"] > F.MAX_ODD_EXCUSED * n_odd:
                    continue
                rank = (counts["spared_language"] - counts["hurt_language"], -m, -ratio, c, k)
                if ref not in arms or rank > tuple(arms[ref]["rank"]):
                    arms[ref] = {"rank": list(rank), "k": k, "kl_ratio": ratio, "min_coverage": c, "margin": m,
                                 "ref_margin": None if ref == "none" else m2, "counts": dict(counts)}
    by_lang = {L: {"bank_requests": int(sum(x == L for x in lang)), "bank_score_mean": round(float(score[[x == L for x in lang]].mean()), 3),
                   "bank_kl_over_english": round(float(kl[[x == L for x in lang]].mean()) / english, 3)}
               for L in sorted(set(lang))}
    out = {"what": "development: the language rule's best setting per arm (the packaged rule's, 'none'; and "
                   "excusing also a score <= the k neighbours' mean / median / max score + ref_margin) on the "
                   "choosing splits, odd excused <= 1%",
           "command": "python scripts/language_rule_neighbour_scores.py " + " ".join(argv or sys.argv[1:]),
           "splits": list(splits), "threshold": by[0]["threshold"] if by else None, "items": len(rows),
           "odd_items": n_odd, "by_score_in_one_script": len(by), "arms": arms, "bank_by_language": by_lang}
    atomic_write_json(a.out, out)
    for ref, v in arms.items():
        print(f"{ref:7s} k={v['k']} ratio={v['kl_ratio']} coverage={v['min_coverage']} margin={v['margin']} "
              f"ref_margin={v['ref_margin']}: {v['counts']}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
