"""What the language rule itself does on a reported split (issue 26): the split's plain requests
in other languages, odd inputs and data requests go through the engine twice, with the packaged
language rule and with it unloaded, and the degraded counts are printed per group ("not hurt more"
and "hurt more" as the split's own report judged each language).

    python scripts/language_rule_effect.py --report results/degradation_heldout_2026-12-05e.json
    python scripts/language_rule_effect.py --report R --also OTHER_RULE.npz [--only-also]

``--also`` adds an arm with another rule file for the same weights (stop 49 compared a six-split
bank with the packaged rule this way on 12-05b, results/language_rule_more_effect_dev.json);
``--also-probe`` one with another instruction probe file and the packaged rule (a refit of the probe,
on a split reported with the packaged one).

Its "not hurt more" is the report's verdict, measured at the default the report ran; where that
default has changed since, ``scripts/language_rule_arms.py`` measures the damage again and counts
with today's verdicts (stop 50: 12-05b's report ran at English KL 0.327, today's is 0.145).

Run only on a split that has had its one report (it re-reads its prompts; a comparison of rules
makes it a split that chose, which a reported split may be).
Result (stop 47, 12-05e, 8.7 min on 2 cores): with the rule 26 / 72 and 34 / 120, odd 102 / 150,
data 3 / 160 (equal to the report's); without it 34 / 72 and 39 / 120, odd 102 / 150, data 3 / 160.

Must not be imported by the engine or the harness; it records a measurement.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("lang_not_hurt", "lang_hurt", "odd", "data_request")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", type=Path, required=True, help="the split's rsp-bench degradation report (JSON)")
    ap.add_argument("--also", type=Path, default=None,
                    help="a third arm: another rule file for the same weights (an earlier fit, say)")
    ap.add_argument("--also-probe", type=Path, default=None,
                    help="another arm: another instruction probe file for the same weights, with the packaged rule")
    ap.add_argument("--only-also", action="store_true", help="run the --also and --also-probe arms alone")
    a = ap.parse_args(argv)
    if a.only_also and a.also is None and a.also_probe is None:
        print("error: --only-also needs --also FILE or --also-probe FILE", file=sys.stderr)
        return 2
    try:
        rep = json.loads(a.report.read_text())
        prompts = ROOT / rep["prompts"] if not Path(rep["prompts"]).is_absolute() else Path(rep["prompts"])
        items = [json.loads(line) for line in prompts.read_text().splitlines() if line.strip()]
        damage = rep["languages_damage"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: cannot read the report {a.report}: {e}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from reference_engine import Engine, PruningConfig

    not_hurt = {L for L, v in damage.items() if L != "en" and not v["hurts_more_than_en"]}
    items = [x for x in items if x["group"] in ("plain_language", "odd", "data_request")]
    engine = Engine.load(None)
    # (label, rule, its file, probe, its file); None: the packaged one, loaded again on first use
    arms: list[tuple] = [("with the rule", None, None, None, None), ("without it", False, None, None, None)]
    arms = arms[2:] if a.only_also else arms
    if a.also is not None:
        from reference_engine.degradation import language_rule

        other = language_rule.load(a.also, engine.weights_sha256)
        if other is None:
            print(f"error: --also {a.also}: not a language rule for weights {engine.weights_sha256[:16]}",
                  file=sys.stderr)
            return 2
        arms.append((f"with {a.also.name}", other, a.also.name, None, None))
    if a.also_probe is not None:
        from reference_engine.degradation import instruction_probe

        probe = instruction_probe.load(a.also_probe, engine.weights_sha256)
        if probe is None:
            print(f"error: --also-probe {a.also_probe}: not an instruction probe for weights "
                  f"{engine.weights_sha256[:16]}", file=sys.stderr)
            return 2
        arms.append((f"with the probe {a.also_probe.name}", None, None, probe, a.also_probe.name))
    cfg = PruningConfig(mode="lossy", sensitivity=0.5, hardware_watermark=0.0)
    for label, rule, file, probe, probe_file in arms:
        engine._language_rule, engine._language_rule_file = rule, file
        engine._instruction_probe, engine._instruction_probe_file = probe, probe_file
        count: collections.Counter = collections.Counter()
        by_lang: collections.Counter = collections.Counter()
        for at in range(0, len(items), 8):
            batch = items[at:at + 8]
            for x, r in zip(batch, engine.generate([x["text"] for x in batch], max_new_tokens=1, config=cfg)):
                g = x["group"] if x["group"] != "plain_language" else (
                    "lang_not_hurt" if x["lang"] in not_hurt else "lang_hurt")
                count[g, "n"] += 1
                count[g, "degraded"] += r.stats["degraded_reason"] is not None
                if x["group"] == "plain_language":
                    by_lang[x["lang"]] += r.stats["degraded_reason"] is not None
        print(label, {g: f"{count[g, 'degraded']}/{count[g, 'n']}" for g in GROUPS}, flush=True)
        print("  plain requests degraded per language:", dict(sorted(by_lang.items())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
