"""Language-rule files judged on a reported split against what pruning does *now* (issue 26).

``scripts/language_rule_effect.py`` counts a rule's false alarms with the split's own report's
per-language verdicts. Those verdicts were measured at the default the report ran: 12-05b's at
stop 42's (English KL 0.327, 36 languages "not hurt more", French, Spanish and Russian among them),
while every rule since is fitted at the current default (English KL about 0.15). An arm that
degrades a language pruning now hurts more was counted a false alarm. This script measures the
split's plain requests again at the current default (teacher-forced KL and top-1 against pruning
off, 16 tokens, ``rsp-bench degradation``'s damage and per-language test), reads each item's check
once (the score, its threshold, the pooled direction, the request words' coverage; the rule left
out: ``fit_language_rule.read_prompts``), and decides every arm offline, as the engine's
``ood.judge`` does. It prints the counts under both labellings, the report's and today's, so the
offline decisions can be checked against ``language_rule_effect.py``'s engine runs.

    python scripts/language_rule_arms.py --report results/degradation_heldout_2026-12-05b.json \\
        --arm packaged --arm none --arm six-split=/tmp/lr_more_rule.npz [--grid] --out results/X.json

Stop 50 (results/language_rule_arms_dev.json, 12-05b; results/language_rule_arms_05f_dev.json, 12-05f
after its report): the offline decisions equal the engine's counts on both; the packaged rule
leaves the fewest requests degraded in languages not shown hurt more (28 / 72 and 26 / 72; the
six-split bank 30-35 and 28-32); a margin of 2.0 instead of 1.5 would spare 1 and 4 more with no
odd input excused on either, 3.0 2 and 7 more (on the choose splits 3.0 excused 13 of 275 odd
inputs against 2).

Run only on a split that has had its one report. Must not be imported by the engine or the
harness; it records a measurement.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
GROUPS = ("lang_not_hurt", "lang_hurt", "plain_en", "odd", "data_request")
GRID_RATIOS = (1.0, 1.25, 1.5, 2.0)
GRID_MARGINS = (1.5, 2.0, 3.0)


def _arm(spec: str, engine) -> tuple[str, object]:
    from reference_engine.degradation import language_rule

    name, _, file = spec.partition("=")
    if spec == "none":
        return "none", None
    if spec == "packaged":
        path = language_rule.rule_path(ROOT / "reference_engine" / "data", engine.weights_sha256)
    else:
        path = Path(file or name)
    rule = language_rule.load(path, engine.weights_sha256)
    if rule is None:
        raise SystemExit(f"error: --arm {spec}: {path} is not a language rule for weights {engine.weights_sha256[:16]}")
    return name, rule


def degraded(r: dict, rule) -> bool:
    """The engine's decision for one read item under ``rule`` (None: no rule), as ``ood.judge``
    makes it: only an ``ood_score`` verdict the request words did not excuse can get the margin."""
    if r["reason"] is None:
        return False
    if r["reason"] != "ood_score" or rule is None or r["pooled"] is None:
        return True
    margin = rule.margin_for(r["text"], {rule.block: r["pooled"]})
    return not (margin > 0 and r["coverage"] >= rule.min_coverage and r["score"] <= r["threshold"] + margin)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--report", type=Path, required=True, help="the split's rsp-bench degradation report (JSON)")
    ap.add_argument("--arm", action="append", required=True,
                    help="'packaged', 'none', or NAME=FILE (a rule file for the same weights); repeatable")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/language_rule_arms.pkl"),
                    help="the measured damage and reads, kept between runs (keyed by the report)")
    ap.add_argument("--grid", action="store_true",
                    help="also the packaged bank at kl_ratio x margin of GRID_RATIOS x GRID_MARGINS (today's verdicts)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        rep = json.loads(a.report.read_text())
        prompts = ROOT / rep["prompts"]
        old_verdicts = {L: bool(v["hurts_more_than_en"]) for L, v in rep["languages_damage"].items() if L != "en"}
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: cannot read the report {a.report}: {e}", file=sys.stderr)
        return 2
    from fit_language_rule import DAMAGE_TOKENS, _engine, read_prompts
    from reference_engine.config import PruningConfig
    from rsp_bench.degradation_report import damage, language_damage, load_items
    from rsp_bench.storage import atomic_write_json

    items = [it for it in load_items(prompts) if it.group in ("plain_language", "plain_en", "odd", "data_request")]
    engine = _engine()
    default = PruningConfig()
    from reference_engine import degradation

    # the reads depend on the detector (score file, text rules), the damage on the default
    config = {"mode": default.mode, "router": default.router, "sensitivity": default.sensitivity,
              "damage_tokens": DAMAGE_TOKENS, "text_rules": degradation.text_rules_fingerprint(),
              "weights_sha256": engine.weights_sha256}
    cache = pickle.loads(a.cache.read_bytes()) if a.cache.exists() else {}
    if cache.get("report") != str(a.report) or cache.get("config") != config:
        cache = {"report": str(a.report), "config": config}
    if "damage" not in cache:
        plain = [it for it in items if it.group in ("plain_language", "plain_en")]
        cache["damage"] = {}
        for i, it in enumerate(plain):
            cache["damage"][it.id] = damage(engine, it.text, DAMAGE_TOKENS)
            print(f"\rdamage {i + 1}/{len(plain)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        a.cache.write_bytes(pickle.dumps(cache))
    if "reads" not in cache:
        cache["reads"] = dict(zip((it.id for it in items), read_prompts([it.text for it in items])))
        a.cache.write_bytes(pickle.dumps(cache))
    plain_items = [it for it in items if it.group in ("plain_language", "plain_en")]
    now = language_damage(plain_items, [{"degraded": False}] * len(plain_items), cache["damage"])
    new_verdicts = {L: bool(v["hurts_more_than_en"]) for L, v in now.items() if L != "en"}
    arms = [_arm(s, engine) for s in a.arm]
    reads = [{**cache["reads"][it.id], "text": it.text} for it in items]

    shown = {L for L, v in now.items() if v.get("no_more_than_en")}

    def counts(rule, verdict: dict[str, bool], within: set[str] = frozenset()) -> dict[str, str]:
        """Degraded / n per group; ``within``: languages shown within the ratio (today's test only)."""
        n: dict[str, list[int]] = {g: [0, 0] for g in GROUPS + ("lang_shown_within",)}
        for it, r in zip(items, reads):
            if it.group == "plain_language" and it.lang in within:
                n["lang_shown_within"][0] += degraded(r, rule)
                n["lang_shown_within"][1] += 1
            g = it.group if it.group != "plain_language" else (
                "lang_hurt" if verdict.get(it.lang, True) else "lang_not_hurt")
            n[g][0] += degraded(r, rule)
            n[g][1] += 1
        return {g: f"{d}/{t}" for g, (d, t) in n.items() if t or g != "lang_shown_within"}

    out = {"what": "language-rule arms on a reported split, decided offline from one read of each item, counted "
                   "with the report's per-language verdicts and with verdicts measured again at the current default",
           "report": str(a.report), "config": config,
           "command": "python scripts/language_rule_arms.py " + " ".join(argv or sys.argv[1:]),
           "english_now": now.get("en"), "english_in_report": rep["languages_damage"].get("en"),
           "not_hurt_more_in_report": sorted(L for L, h in old_verdicts.items() if not h),
           "not_hurt_more_now": sorted(L for L, h in new_verdicts.items() if not h),
           "shown_within_now": sorted(shown),
           "languages_now": {L: v for L, v in now.items() if L != "en"},
           "arms": {name: {"report_labels": counts(rule, old_verdicts), "current_labels": counts(rule, new_verdicts, shown)}
                    for name, rule in arms}}
    if a.grid:
        import dataclasses

        _, bank = _arm("packaged", engine)
        out["grid_packaged_bank"] = {
            f"kl_ratio={r},margin={m}": counts(dataclasses.replace(bank, kl_ratio=r, margin=m), new_verdicts, shown)
            for r in GRID_RATIOS for m in GRID_MARGINS}
    atomic_write_json(a.out, out)
    print(f"English now: KL {now['en']['kl_mean']}, top-1 {now['en']['top1']} "
          f"(report: {rep['languages_damage']['en']['kl_mean']}, {rep['languages_damage']['en']['top1']})")
    print(f"not hurt more: report {len(out['not_hurt_more_in_report'])}, now {len(out['not_hurt_more_now'])}: "
          f"{out['not_hurt_more_now']}; shown within the ratio now: {out['shown_within_now']}")
    for name, c in out["arms"].items():
        print(f"{name:>12}  report labels {c['report_labels']}\n{'':>12}  current labels {c['current_labels']}")
    for key, c in out.get("grid_packaged_bank", {}).items():
        print(f"packaged bank {key}: {c}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
