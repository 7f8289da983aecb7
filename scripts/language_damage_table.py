"""Analysis (issue 26): which languages does pruning at the current default hurt no more than English,
per language rather than per script, on every set that measured it?

    python scripts/language_damage_table.py [--out results/language_damage_per_language_dev.json]

Reads only stored rows, measures nothing: the language rule's fit rows for the current default
(``results/language_rule_fit.json``: plain requests of three fit splits, 16 teacher-forced tokens
each, per prompt its language, script, mean prompt loss and KL against pruning off) and the
per-language verdicts of the two blind reports made with the same default
(``results/degradation_heldout_2026-12-05c.json`` and ``_2026-12-05d.json``, both development
splits now). Per language of the fit: n, mean loss, mean KL and the one-sided permutation p of
its per-prompt KL above English's (``rsp_bench.metrics.permutation_mean_greater_p``, seed 26, the
report's test), beside each report's ``hurts_more_than_en``.

Why: the packaged rule pools damage by script and keys it on the prompt's own loss, and spares no
script at the current default; the blind reports judge per language, with 4 prompts. Where the
two disagree, this table says which languages are consistently spared by pruning (not hurt more on
every set that has them) and whether a per-prompt loss cut could single them out.

Result (stop 46, results/language_damage_per_language_dev.json): 12 of 71 languages are hurt no
more than English on every set that has them: Swahili, Estonian, Lithuanian and Basque on all three
(fit KL 0.12-0.22 against English's 0.155; n 2-8), and lv, nb, tl, ga, ne, kk, uz, zu with fewer
sets. Others the 12-05d report found "not hurt more" with 4 prompts are hurt more in the fit with 6-8
(Croatian, Malay, Turkish p 0.001; Italian, Danish, Bulgarian about 0.01). A loss cut cannot single
the spared ones out: their prompts' losses reach down to 4.42 nats, and from there 154 prompts of 27
other Latin languages lie at or above it. Sparing them needs a rule keyed on the language itself,
which needs a language signal the detector does not have.

Must not be imported by the engine or the harness; it records an analysis.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rsp_bench.metrics.intervals import permutation_mean_greater_p  # noqa: E402
from rsp_bench.storage import atomic_write_json  # noqa: E402

FIT = ROOT / "results" / "language_rule_fit.json"
REPORTS = {"12-05c": ROOT / "results" / "degradation_heldout_2026-12-05c.json",
           "12-05d": ROOT / "results" / "degradation_heldout_2026-12-05d.json"}
ALPHA = 0.05


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "language_damage_per_language_dev.json")
    args = ap.parse_args()
    fit = json.loads(FIT.read_text())
    by: dict[str, list[dict]] = defaultdict(list)
    for row in fit["rows"]:
        by[row["lang"]].append(row)
    en_kl = [r["kl_mean"] for r in by["en"]]
    reports = {k: json.loads(p.read_text())["languages_damage"] for k, p in REPORTS.items()}
    table = []
    for lang, rows in by.items():
        if lang == "en":
            continue
        kl = [r["kl_mean"] for r in rows]
        entry = {"lang": lang, "script": Counter(r["script"] for r in rows).most_common(1)[0][0], "n": len(rows),
                 "loss_mean": round(sum(r["loss"] for r in rows) / len(rows), 3),
                 "loss_range": [round(min(r["loss"] for r in rows), 3), round(max(r["loss"] for r in rows), 3)],
                 "kl_mean": round(sum(kl) / len(kl), 4),
                 "kl_p_more_than_en": round(permutation_mean_greater_p(kl, en_kl, seed=26), 4)}
        entry["fit_hurts_more"] = entry["kl_p_more_than_en"] < ALPHA
        for name, rep in reports.items():
            entry[f"{name}_hurts_more"] = rep.get(lang, {}).get("hurts_more_than_en")
        verdicts = [entry["fit_hurts_more"]] + [entry[f"{n}_hurts_more"] for n in reports
                                                if entry[f"{n}_hurts_more"] is not None]
        entry["never_hurt_more"] = not any(verdicts)
        table.append(entry)
    table.sort(key=lambda e: e["kl_p_more_than_en"])
    spared = [e for e in table if e["never_hurt_more"]]
    latin = [e for e in table if e["script"] == "Latin"]
    # could a loss cut single out the spared Latin languages? the other Latin prompts at or above
    # the lowest loss any spared Latin prompt has
    spared_latin = {e["lang"] for e in spared if e["script"] == "Latin"}
    cut = min((r["loss"] for e in latin if e["lang"] in spared_latin for r in by[e["lang"]]), default=None)
    above = [] if cut is None else [r for e in latin for r in by[e["lang"]] if r["loss"] >= cut]
    others_above = Counter(r["lang"] for r in above if r["lang"] not in spared_latin)
    res = {"what": __doc__.split("\n")[0], "command": "python scripts/language_damage_table.py " + " ".join(sys.argv[1:]),
           "english": {"n": len(en_kl), "kl_mean": round(sum(en_kl) / len(en_kl), 4)},
           "never_hurt_more": [e["lang"] for e in spared],
           "latin_loss_cut_of_the_spared": None if cut is None else round(cut, 3),
           "latin_prompts_at_or_above_that_cut": {"spared_languages": sum(r["lang"] in spared_latin for r in above),
                                                  "other_languages": dict(others_above.most_common())},
           "languages": table}
    atomic_write_json(args.out, res)
    print(f"English: {res['english']}")
    for e in table:
        print(f"{e['lang']:4s} {e['script']:10s} n={e['n']} loss {e['loss_mean']:.2f} KL {e['kl_mean']:.3f} "
              f"p {e['kl_p_more_than_en']:.3f}  12-05c {e['12-05c_hurts_more']}  12-05d {e['12-05d_hurts_more']}"
              + ("  <- never hurt more" if e["never_hurt_more"] else ""))
    print(f"never hurt more: {res['never_hurt_more']}")
    print(f"Latin prompts from {res['latin_loss_cut_of_the_spared']} nats: {res['latin_prompts_at_or_above_that_cut']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
