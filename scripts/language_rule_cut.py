"""Design experiment (issue 26): would a lower Latin loss cut in the language rule stop degrading
plain requests in the languages pruning does not hurt more, and what would it cost in odd input?

The language rule (reference_engine/degradation/language_rule.py) spares Latin-script plain
requests from 7.20 nats of mean prompt loss: the lowest cut where the plain requests at or above
it are, pooled, hurt no more than English's. Per language the picture differs: with 8 plain
requests a language (results/language_rule_fit_predictor_v2.json, three fit splits), a one-sided permutation
test of per-item KL against English's (``rsp_bench.metrics.permutation_mean_greater_p``, p >= 0.05, as ``rsp-bench degradation``) finds
25 languages not hurt more, most of them Latin-script languages the model reads poorly (Welsh,
Swahili, Estonian, Finnish, Croatian, Lithuanian), which the score degrades, while the ones it
hurts more (German, French, Spanish, Polish) are seldom degraded. Here every development item's
check, cached by scripts/ood_design.py (``--cache``; the eight development splits, 12-05 the
newest), is decided again with the Latin cut and the margin varied (offline decisions at the
packaged cut and margin equal the engine's on every item, asserted).

    python scripts/language_rule_cut.py [--cache /tmp/ood_design.pkl] [--out results/language_rule_cut_dev.json]

Must not be imported by the engine or the harness; it records a design decision of stop 43, made on
the rule and fit rows of the predictor-v2 default (``results/language_rule_fit_predictor_v2.json``).
Since stop 45 the packaged rule, refitted to the v3 default, spares no script, so the offline
decisions equal the engine's only at the commits before that refit (1847a26 and earlier).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import ood_design as od  # noqa: E402

from reference_engine.degradation.language_rule import dominant_script  # noqa: E402
from reference_engine.engine import Engine  # noqa: E402
from rsp_bench.degradation_report import KL_ALPHA  # noqa: E402
from rsp_bench.metrics import permutation_mean_greater_p  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/ood_design.pkl"))
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "language_rule_cut_dev.json")
    args = ap.parse_args()
    if not args.cache.is_file():
        print(f"error: no cache at {args.cache}; run scripts/ood_design.py --cache {args.cache} first", file=sys.stderr)
        return 2
    items = pickle.loads(args.cache.read_bytes())["items"]
    engine = Engine.load()
    det, rule = engine.ood_detector(), engine.language_rule()
    if not hasattr(rule, "min_loss"):
        print("error: this script records stop 43's decision against the version-2 rule (a loss cut per script); "
              "the packaged rule is version 3 since stop 47: run it at commit e68dcfe", file=sys.stderr)
        return 2
    texts = {(split, x["id"]): x["text"] for split in od.DEV_SPLITS
             for x in map(json.loads, (ROOT / "fixtures" / split / "prompts.jsonl").read_text().splitlines())}
    fit = json.loads((ROOT / "results" / "language_rule_fit_predictor_v2.json").read_text())["rows"]
    kl = defaultdict(list)
    for r in fit:
        kl[r["lang"]].append(r["kl_mean"])
    not_worse = sorted(L for L in kl if L != "en" and permutation_mean_greater_p(kl[L], kl["en"], seed=26) >= KL_ALPHA)

    def decide(it: dict, cut: float, margin: float) -> bool:
        if it["text_reason"] is not None or it["check"] is None:
            return (it["text_reason"] or it["engine_reason"]) is not None
        whole, sub, _margin, cover = it["check"]
        reason = det.reason(whole)
        if reason != "ood_score":
            return reason is not None
        if sub is not None and det.score(sub) <= det.threshold:
            return False
        script, share = dominant_script(texts[(it["split"], it["id"])])
        loss = float(whole.nll.mean()) if whole.nll.size else 0.0
        m = margin if script == "Latin" and share >= rule.min_share and loss >= cut else 0.0
        return not (m > 0 and cover and det.score(whole) <= det.threshold + m)

    packaged = (rule.min_loss["Latin"], rule.margin)
    agree = sum(decide(it, *packaged) == (it["engine_reason"] is not None) for it in items)
    assert agree == len(items), f"offline decisions equal the engine's on {agree} of {len(items)}"
    rows = []
    for cut in (packaged[0], 6.0, 5.0, 4.0, 0.0):
        for margin in (2.0, 3.0, 4.0):
            c: Counter = Counter()
            for it in items:
                g = it["group"]
                if g == "plain_language":
                    g = "plain_language/not_hurt_more" if it["lang"] in not_worse else (
                        "plain_language/hurt_more" if it["lang"] in kl else "plain_language/unmeasured")
                c[g, "n"] += 1
                c[g, "degraded"] += decide(it, cut, margin)
            rows.append({"latin_cut": round(cut, 4), "margin": margin,
                         **{g: f"{c[g, 'degraded']}/{c[g, 'n']}" for g in sorted({k for k, _ in c})}})
            print(rows[-1], file=sys.stderr)
    args.out.write_text(json.dumps({"what": __doc__.split("\n")[0],
                                    "command": "python scripts/language_rule_cut.py " + " ".join(sys.argv[1:]),
                                    "not_hurt_more": not_worse, "packaged": {"latin_cut": packaged[0], "margin": packaged[1]},
                                    "items": len(items), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
