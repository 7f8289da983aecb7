"""Fit protective degradation's language rule (``reference_engine/degradation/language_rule.py``,
version 6: a damage bank, nearest neighbours, a language probe, a per-language damage table and
agreeing neighbours) for the embedded weights, with the three splits kept apart:

1. **Fit** the damage bank. On the plain requests of three development splits (``FIT``), each
   prompt gets pruning's damage at the engine's default configuration (teacher-forced top-1 and KL
   against pruning off, the detector suspended, 16 tokens; measured now, so a change of the default
   router or sensitivity is fitted to; ``--reuse-fit`` reads the stored rows instead) and the unit
   direction of its pooled hidden state at ``BLOCK``, read through the engine's own check.
2. **Choose** the neighbours ``k``, the damage ratio to English and the rule's coverage and margin
   on four other development splits (``CHOOSE``; 12-06i and 12-06j joined at stop 59, each after
   its one blind report): every item but the bare payloads goes through the
   engine once and the score of the whole prompt, its threshold, its pooled direction and the
   request words' share of its content are read. Each plain request's language is judged on the
   fit rows: "hurt more" when its mean per-prompt KL is above English's at p < 0.05 (a one-sided
   permutation test, as ``rsp-bench degradation`` judges one). The choice: of a grid, the setting
   that excuses the most plain requests in languages not hurt more, minus those in languages hurt
   more, while excusing at most 1% of the odd inputs; ties to the smaller margin, then the smaller
   ratio, then the larger coverage.
   Version 4 (stop 61) also fits a *language probe* (``language_rule.LanguageProbe``) on
   ``PROBE_FIT``, development splits neither the bank nor the choice uses: a logistic model on the
   same pooled direction, plain requests in other languages (positive) against odd inputs, both
   where the score finds them odd. Its threshold (a quantile of the fit's odd inputs' log-odds)
   and its margin join the grid, ranked as above under the same cap (ties also to the smaller probe
   margin, and to no probe).
   Version 5 (stop 64) adds the *damage table* (``damage_table``): each language's mean KL over
   English's, pooled over the bank's fit splits and the per-language damage the reports of
   ``TABLE_REPORTS`` (development splits, not CHOOSE's) measured; the neighbours' most common
   language is looked up in it. Its "hurt more" verdicts (a sign test over splits) are the ones the
   choice counts. ``--reuse-rule FILE`` keeps a stored rule's bank, probe, k, coverage and margins
   and chooses only the damage ratio again (stop 64, from version 4's file: 17 minutes, most of it
   reading the choose splits, which ``--choose-reads FILE`` keeps).
   Version 6 (stop 65) lets neighbours that agree on a language stand in for their own mean
   (``AGREEMENTS``: how many of the k, and the table's bound on the language), chosen with the
   ratio by ``--reuse-rule`` from version 5's file; 12-07d (reported blind for version 5, not in the
   table) joined CHOOSE then, so that the choice sees Welsh requests the score finds odd.
3. **Report** on a split that chose nothing: ``rsp-bench degradation`` on the newest held-out
   split.

Writes ``reference_engine/data/calibration/<weights>-language-damage-v6.npz`` (``--out``
elsewhere), the per-prompt fit rows (``results/language_rule_fit.json``) and the choice's grid
(``results/language_rule_choice.json``), atomically. Reads the score through a wrapper of
``ood.judge`` (a measurement tool: the engine's path is unchanged). About 6 minutes on 2 cores with
``--reuse-fit`` (25 more to measure the fit rows), plus 15 to read the probe's fit splits
(``--probe-reads FILE`` keeps that read in FILE and reuses it).

    python scripts/fit_language_rule.py [--reuse-fit] [--probe-reads FILE]
    python scripts/fit_language_rule.py --reuse-fit --reuse-rule OLD_RULE.npz [--choose-reads FILE]   # stops 64, 65
    python scripts/fit_language_rule.py --reuse-fit --fit-more --out /tmp/more.npz   # stop 49's comparison

Stop 49's six-split bank (``--fit-more``, 1,264 requests; the 723 new rows took 16 min on 2 idle
cores, the choice 9 more) chose k 8, ratio 1.0, coverage 0.9, margin 2.0. On the development split
12-05b (``scripts/language_rule_effect.py --also``) it left 54 of the 144 plain requests in languages
12-05b's report finds not hurt more degraded, the same bank with the packaged rule's k, ratio,
coverage and margin 49, the packaged rule 47, no rule 60; odd inputs (117 / 150) and data requests
(1 / 160) the same in all four. Not adopted (results/language_rule_more_effect_dev.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FIT = ("degradation_heldout_2026-12-03", "degradation_heldout_2026-12-03b", "degradation_heldout_2026-12-04b")
# Stop 49 tried a bank of six splits (these three and 12-05c, 12-05d, 12-05e: --fit-more); on the
# development split 12-05b it spared fewer requests than the packaged rule, so it was not adopted
# (docs/degradation.md, results/language_rule_fit_more_dev.json).
FIT_MORE = FIT + ("degradation_heldout_2026-12-05c", "degradation_heldout_2026-12-05d", "degradation_heldout_2026-12-05e")
CHOOSE = ("degradation_heldout_2026-12-04", "degradation_heldout_2026-12-04c", "degradation_heldout_2026-12-06i",
          "degradation_heldout_2026-12-06j", "degradation_heldout_2026-12-07d")
# The language probe's fit (version 4): development splits that neither the bank nor CHOOSE uses,
# the newest first (their odd kinds are the ones blind splits keep writing).
PROBE_FIT = tuple("degradation_heldout_2026-" + s for s in ("12-05f", "12-05g", "12-06b", "12-06c", "12-06d", "12-06e",
                                                            "12-06k", "12-06l", "12-06m"))
# Version 5's damage table: besides the bank's rows, the per-language damage that the reports of
# these development splits measured (each split's languages against its own English; all at the
# default since stop 55's predictor). Not CHOOSE's splits, and never a held-out one.
TABLE_REPORTS = tuple("degradation_heldout_2026-" + s for s in ("12-06b", "12-06c", "12-06d", "12-06e", "12-06f",
                                                                "12-06g", "12-06h", "12-06k", "12-06l", "12-06m",
                                                                "12-07a", "12-07b", "12-07c"))
PROBE_RIDGE = 0.01
PROBE_ODD_QUANTILES = (None, 0.9, 0.95, 0.98, 0.99)  # None: no probe (version 3's rule)
PROBE_MARGINS = (3.0, 4.0, 5.0, 6.0)
FIT_ROWS = REPO / "results" / "language_rule_fit.json"
CHOICE = REPO / "results" / "language_rule_choice.json"
BLOCK = 27  # the deepest block the score pools (ood.blocks_for(30)): language sits there, not noise
MIN_SHARE = 0.9
KS = (4, 8, 16)
KL_RATIOS = (1.0, 1.25, 1.5, 2.0)
# Version 6: (neighbours of the k that must agree on the language, the table's bound on it); (None,
# None) asks the neighbours' mean always, as version 5 did.
AGREEMENTS = ((None, None),) + tuple((n, r) for n in (5, 6, 7, 8) for r in (1.0, 1.25, 1.5))
COVERAGES = (0.5, 0.7, 0.8, 0.9)
MARGINS = (0.5, 1.0, 1.5, 2.0, 3.0)
MAX_ODD_EXCUSED = 0.01
DAMAGE_TOKENS = 16  # as rsp-bench degradation's --damage-tokens default
BATCH = 8


def _items(split: str) -> list[dict]:
    return [json.loads(line) for line in (REPO / "fixtures" / split / "prompts.jsonl").open()]


_ENGINE: list = []


def _engine():
    if not _ENGINE:
        from reference_engine import Engine

        _ENGINE.append(Engine.load())
    return _ENGINE[0]


def read_prompts(texts: list[str]) -> list[dict]:
    """What the engine's check sees of each prompt, the language rule left out: the score of the
    whole, its threshold, the whole's pooled direction at ``BLOCK``, the request words' share of the
    content, and the reason it would degrade for (None: pruned). Batches of ``BATCH`` prompts of
    similar length, as ``rsp-bench degradation`` runs them."""
    from reference_engine import PruningConfig, ood

    judge = ood.judge
    seen: list[dict] = []

    def reading_judge(det, w, hidden, row, offset, ids, lo, hi, *args, **kwargs):
        whole = ood.prompt_stats(w, hidden, row, offset, ids, lo, hi, args[0], args[2] if len(args) > 2 else frozenset(),
                                 args[4] if len(args) > 4 else kwargs.get("scored"))
        tokens = args[3] if len(args) > 3 else kwargs.get("request_tokens")
        words = tokens() if tokens is not None else None
        seen.append({"row": row, "score": float(det.score(whole)), "threshold": float(det.threshold),
                     "pooled": whole.pooled[BLOCK],
                     "coverage": (len([i for i in words if max(lo, 1) <= i < hi]) / max(1, hi - max(lo, 1))
                                  if words is not None else 0.0)})
        kwargs["plain_margin"] = None  # the score as it was before the rule
        return judge(det, w, hidden, row, offset, ids, lo, hi, *args[:5], **kwargs)

    engine = _engine()
    order = sorted(range(len(texts)), key=lambda i: len(engine.encode(texts[i])))
    out: list[dict] = [{} for _ in texts]
    cfg = PruningConfig(mode="lossy", sensitivity=0.5, hardware_watermark=0.0)
    ood.judge = reading_judge
    try:
        for at in range(0, len(order), BATCH):
            batch = order[at:at + BATCH]
            seen.clear()
            results = engine.generate([texts[i] for i in batch], max_new_tokens=1, config=cfg)
            by_row = {s.pop("row"): s for s in seen}
            for b, (i, res) in enumerate(zip(batch, results)):
                out[i] = {"score": None, "threshold": None, "pooled": None, "coverage": 0.0, **by_row.get(b, {}),
                          "reason": res.stats["degraded_reason"]}
            print(f"\rread {min(at + BATCH, len(order))}/{len(order)}", end="", file=sys.stderr, flush=True)
    finally:
        ood.judge = judge
    print(file=sys.stderr)
    return out


def measure_fit_rows(fit: tuple[str, ...], stored: list[dict], save: Callable[[list[dict]], None]) -> list[dict]:
    """Per plain request of the fit splits: its language and script and pruning's damage at the
    default configuration. The ``stored`` rows of a split are kept (``--reuse-fit``); a split with
    none is measured and ``save``d as soon as it is done, so an interrupted run keeps its splits."""
    from reference_engine.degradation.language_rule import dominant_script
    from rsp_bench.degradation_report import damage

    rows = []
    for split in fit:
        kept = [r for r in stored if r["split"] == split]
        if kept:
            rows += kept
            continue
        plain = [x for x in _items(split) if x["group"] in ("plain_language", "plain_en")]
        for i, x in enumerate(plain):
            d = damage(_engine(), x["text"], DAMAGE_TOKENS)
            script, share = dominant_script(x["text"])
            rows.append({"split": split, "id": x["id"], "lang": "en" if x["group"] == "plain_en" else x["lang"],
                         "script": script, "share": round(share, 4),
                         "tokens": d["tokens"], "top1_hits": d["top1_hits"], "kl_mean": d["kl_mean"]})
            print(f"\rfit {split}: {i + 1}/{len(plain)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        save(rows)
    return rows


def verdicts(rows: list[dict]) -> dict[str, bool]:
    """Per language of the fit rows: True where pruning hurts it more than English (mean per-prompt
    KL above English's at ``KL_ALPHA``, one-sided permutation test)."""
    from rsp_bench.degradation_report import KL_ALPHA
    from rsp_bench.metrics.intervals import permutation_mean_greater_p

    en = [r["kl_mean"] for r in rows if r["lang"] == "en"]
    langs = sorted({r["lang"] for r in rows} - {"en"})
    return {L: permutation_mean_greater_p([r["kl_mean"] for r in rows if r["lang"] == L], en, seed=26) < KL_ALPHA
            for L in langs}


def damage_table(fit_rows: list[dict], reports: tuple[str, ...]) -> tuple[dict[str, float], dict[str, dict]]:
    """Version 5's per-language damage table: each language's mean KL over English's, pooled over
    the sources that measured both (each fit split's bank rows, and each report's per-language
    damage; ``rsp_bench.language_damage_pool.pool``), and the evidence per language (items, splits,
    splits above English, and "hurt more" by its sign test over the splits; with fewer splits than
    it needs, by ``verdicts`` on the bank's rows)."""
    from rsp_bench.language_damage_pool import pool

    sources = []
    for split in sorted({r["split"] for r in fit_rows}):
        rows = [r for r in fit_rows if r["split"] == split]
        sources.append({lang: {"items": len(kl), "kl_mean": float(np.mean(kl))}
                        for lang in {r["lang"] for r in rows}
                        for kl in [[r["kl_mean"] for r in rows if r["lang"] == lang]]})
    sources += [json.loads((REPO / "results" / f"{split}.json").read_text())["languages_damage"] for split in reports]
    bank_verdicts = verdicts(fit_rows)
    table, evidence = {}, {}
    for lang, d in pool(sources).items():
        hurt = d["hurt_more"] if d["hurt_more"] is not None else bool(bank_verdicts.get(lang, False))
        table[lang] = d["ratio_to_en"]
        evidence[lang] = {"items": d["items"], "splits": d["splits"], "splits_above_english": d["splits_above_en"],
                          "sign_p": None if d["sign_p"] is None else round(d["sign_p"], 5), "hurt_more": hurt}
    return table, evidence


def read_probe_fit(cache: Path | None) -> list[dict]:
    """The plain requests in other languages and the odd inputs of ``PROBE_FIT``, read as
    ``read_prompts`` reads them; from ``cache`` (a pickle this wrote) when it holds these splits."""
    import pickle

    if cache is not None and cache.exists():
        rows = pickle.loads(cache.read_bytes())
        if sorted({r["split"] for r in rows}) == sorted(PROBE_FIT):
            return rows
        print(f"warning: {cache} holds other splits; reading again", file=sys.stderr)
    rows = [{"split": split, "id": x["id"], "group": x["group"], "kind": x["kind"], "lang": x.get("lang"),
             "text": x["text"]} for split in PROBE_FIT for x in _items(split) if x["group"] in ("plain_language", "odd")]
    for r, s in zip(rows, read_prompts([r["text"] for r in rows])):
        r.update(s)
    if cache is not None:
        tmp = cache.with_name(cache.name + ".tmp")
        tmp.write_bytes(pickle.dumps(rows))
        tmp.replace(cache)
    return rows


def fit_probe(rows: list[dict]):
    """The language probe (``language_rule.LanguageProbe``, threshold and margin left for the
    choice) on the rows the score finds odd: plain requests in other languages against odd
    inputs; and the fit's odd inputs' log-odds, whose quantiles the choice's thresholds are."""
    from reference_engine.degradation.instruction_probe import fit_logistic
    from reference_engine.degradation.language_rule import LanguageProbe, unit

    over = [r for r in rows if r["reason"] == "ood_score" and r["pooled"] is not None]
    pos = np.array([unit(r["pooled"]) for r in over if r["group"] == "plain_language" and r["lang"] != "en"])
    neg = np.array([unit(r["pooled"]) for r in over if r["group"] == "odd"])
    X = np.vstack([pos, neg])
    mu, sd = X.mean(0), X.std(0) + 1e-6
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    w = fit_logistic((X - mu) / sd, y, np.r_[np.full(len(pos), 0.5 / len(pos)), np.full(len(neg), 0.5 / len(neg))],
                     PROBE_RIDGE)
    probe = LanguageProbe(mu, sd, w[:-1], float(w[-1]), float("inf"), 0.0)
    return probe, np.array([probe.log_odds(x) for x in neg]), {"languages": len(pos), "odd": len(neg)}


def choose(rows: list[dict], bank, hurt: dict[str, bool], probe=None, odd_log_odds=None) -> tuple[dict, dict]:
    """The grid's best setting (module docstring) and the grid."""
    from reference_engine.degradation.language_rule import dominant_script, unit

    by_score = [r for r in rows if r["reason"] == "ood_score" and r["pooled"] is not None
                and dominant_script(r["text"])[1] >= MIN_SHARE]
    n_odd = sum(1 for r in rows if r["group"] == "odd")
    reads = [probe.log_odds(unit(r["pooled"])) if probe is not None else -np.inf for r in by_score]
    table = bank.language_ratio or {}  # version 5: the language's measured damage must be within the ratio too
    arms = [(None, None)] + [(q, pm) for q in PROBE_ODD_QUANTILES if q is not None and probe is not None
                             for pm in PROBE_MARGINS]
    grid, best = {}, None
    for k in KS:
        near = [dataclasses.replace(bank, k=k).estimate(r["pooled"]) for r in by_score]
        for ratio, c, m, (q, pm) in ((ratio, c, m, arm) for ratio in KL_RATIOS for c in COVERAGES for m in MARGINS
                                     for arm in arms):
            t = float(np.quantile(odd_log_odds, q)) if q is not None else np.inf
            excused = [r for r, (est, lang), lo in zip(by_score, near, reads)
                       if lang != "en" and est <= ratio and table.get(lang, est) <= ratio and r["coverage"] >= c
                       and r["score"] <= r["threshold"] + (max(m, pm) if lo > t else m)]
            counts = _counts(excused, hurt)
            key = f"k={k},kl_ratio={ratio},coverage={c},margin={m}" + (
                f",probe_odd_quantile={q},probe_margin={pm}" if q is not None else "")
            grid[key] = counts
            if counts["odd"] <= MAX_ODD_EXCUSED * n_odd:
                rank = (counts["spared_language"] - counts["hurt_language"], -m, -(pm or 0.0), -ratio, c, k,
                        q or 0.0)
                if best is None or rank > best[0]:
                    best = (rank, {"k": k, "kl_ratio": ratio, "min_coverage": c, "margin": m, "key": key,
                                   "probe_odd_quantile": q, "probe_margin": pm, "probe_threshold": t})
    degraded = {g: sum(1 for r in rows if r["reason"] is not None and r["group"] == g)
                for g in ("plain_language", "plain_en", "data_request", "odd")}
    return best[1], {"items": len(rows), "odd_items": n_odd, "degraded_without_the_rule": degraded,
                     "by_score_in_one_script": len(by_score), "grid": grid}


def _counts(excused: list[dict], hurt: dict[str, bool]) -> dict[str, int]:
    return {"odd": sum(r["group"] == "odd" for r in excused),
            "data_request": sum(r["group"] == "data_request" for r in excused),
            "plain_en": sum(r["group"] == "plain_en" for r in excused),
            "spared_language": sum(r["group"] == "plain_language" and hurt.get(r["lang"]) is False for r in excused),
            "hurt_language": sum(r["group"] == "plain_language" and hurt.get(r["lang"]) is True for r in excused),
            "unjudged_language": sum(r["group"] == "plain_language" and r["lang"] not in hurt for r in excused)}


def choose_ratio(rows: list[dict], rule, hurt: dict[str, bool]) -> tuple[dict, dict]:
    """``--reuse-rule``: only the damage ratio (``KL_RATIOS``) and version 6's agreement
    (``AGREEMENTS``) are chosen again, the rule's k, coverage, margins and probe kept; ranked as
    ``choose`` ranks, under the same cap, ties to the lower ratio and the stricter agreement."""
    from reference_engine.degradation.language_rule import dominant_script

    by_score = [r for r in rows if r["reason"] == "ood_score" and r["pooled"] is not None
                and dominant_script(r["text"])[1] >= MIN_SHARE]
    n_odd = sum(1 for r in rows if r["group"] == "odd")
    grid, best = {}, None
    for ratio, (agree_n, agree_r) in ((ratio, agree) for ratio in KL_RATIOS for agree in AGREEMENTS):
        if agree_r is not None and agree_r > ratio:
            continue  # the table must be within the ratio anyway
        arm = dataclasses.replace(rule, kl_ratio=ratio, agree_neighbours=agree_n, agree_ratio=agree_r)
        margins = [arm.margin_for(r["text"], {arm.block: r["pooled"]}) for r in by_score]
        excused = [r for r, m in zip(by_score, margins)
                   if m > 0 and r["coverage"] >= arm.min_coverage and r["score"] <= r["threshold"] + m]
        key = f"kl_ratio={ratio}" + (f",agree_neighbours={agree_n},agree_ratio={agree_r}" if agree_n else "")
        grid[key] = counts = _counts(excused, hurt)
        if counts["odd"] <= MAX_ODD_EXCUSED * n_odd:
            rank = (counts["spared_language"] - counts["hurt_language"], -ratio, -(agree_r or 0.0),
                    agree_n or rule.k + 1)
            if best is None or rank > best[0]:
                best = (rank, {"kl_ratio": ratio, "agree_neighbours": agree_n, "agree_ratio": agree_r, "key": key})
    degraded = {g: sum(1 for r in rows if r["reason"] is not None and r["group"] == g)
                for g in ("plain_language", "plain_en", "data_request", "odd")}
    return best[1], {"items": len(rows), "odd_items": n_odd, "degraded_without_the_rule": degraded,
                     "by_score_in_one_script": len(by_score), "grid": grid}


def reused_rule(path: Path):
    """The bank, probe and settings of a stored rule file of any version (``--reuse-rule``)."""
    from reference_engine.degradation.language_rule import LanguageProbe, LanguageRule

    with np.load(path, allow_pickle=False) as z:
        d = json.loads(str(z["meta"]))
        probe = None
        if "probe" in d:
            probe = LanguageProbe(z["probe_mu"].astype(np.float64), z["probe_sd"].astype(np.float64),
                                  z["probe_coef"].astype(np.float64), float(d["probe"]["bias"]),
                                  float(d["probe"]["threshold"]), float(d["probe"]["margin"]))
        return LanguageRule(int(d["block"]), z["bank"].astype(np.float32), z["kl"].astype(np.float32),
                            tuple(str(x) for x in z["lang"]), int(d["k"]), float(d["kl_ratio"]), float(d["min_share"]),
                            float(d["min_coverage"]), float(d["margin"]), dict(d.get("info", {})), probe), d


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="rule file (default: the packaged one for the embedded weights)")
    p.add_argument("--fit-more", action="store_true",
                   help="fit on FIT_MORE's six splits; writes results/language_rule_{fit,choice}_more_dev.json and "
                        "needs --out (a development comparison, never the packaged rule)")
    p.add_argument("--probe-reads", type=Path, default=None,
                   help="keep the read of the language probe's fit splits in this file (pickle) and reuse it when "
                        "it is there (the read takes about 15 minutes)")
    p.add_argument("--choose-reads", type=Path, default=None,
                   help="keep the read of the choose splits in this file (pickle) and reuse it when it is there "
                        "(the read takes about 15 minutes)")
    p.add_argument("--reuse-rule", type=Path, default=None,
                   help="keep this rule file's bank, probe, k, coverage and margins (any version) and choose only "
                        "the damage ratio against version 5's table (reads only the choose splits)")
    p.add_argument("--reuse-fit", action="store_true",
                   help=f"keep the fit rows {FIT_ROWS.relative_to(REPO)} holds; measure only the splits it lacks")
    a = p.parse_args(argv)
    if a.fit_more and a.out is None:
        print("error: --fit-more needs --out (it must not replace the packaged rule)", file=sys.stderr)
        return 2
    fit = FIT_MORE if a.fit_more else FIT
    rows_file = FIT_ROWS.with_name("language_rule_fit_more_dev.json") if a.fit_more else FIT_ROWS
    choice_file = CHOICE.with_name("language_rule_choice_more_dev.json") if a.fit_more else CHOICE
    sys.path.insert(0, str(REPO))
    from reference_engine.config import PruningConfig
    from reference_engine.degradation import language_rule
    from reference_engine.engine import weights_digest
    from reference_engine.model_loading import resolve_model
    from rsp_bench.records.environment import code_digest
    from rsp_bench.storage import atomic_write_json

    default = PruningConfig()
    from reference_engine import ood

    n_layers = _engine().weights.dims.n_layers
    if BLOCK not in ood.blocks_for(n_layers):
        print(f"error: block {BLOCK} is not one the score pools for {n_layers} layers ({ood.blocks_for(n_layers)})",
              file=sys.stderr)
        return 2
    config = {"mode": default.mode, "router": default.router, "sensitivity": default.sensitivity}
    stored: list[dict] = []
    reuse_from = rows_file if rows_file.exists() or not a.fit_more else FIT_ROWS  # FIT_MORE starts with FIT
    if a.reuse_fit and reuse_from.exists():
        old = json.loads(reuse_from.read_text())
        if old.get("config") != config or old.get("damage_tokens") != DAMAGE_TOKENS:
            print(f"error: {reuse_from.relative_to(REPO)} was measured at {old.get('config')}, "
                  f"{old.get('damage_tokens')} tokens; the default is {config}, {DAMAGE_TOKENS} tokens: "
                  "run without --reuse-fit", file=sys.stderr)
            return 2
        stored = old["rows"]
        # The default's damage moves with the engine's code (stop 55: the bank's rows were measured
        # before predictor version 4), and the config above does not name the predictor.
        if old.get("engine_code") != code_digest(("reference_engine",)):
            print(f"warning: {reuse_from.relative_to(REPO)} was measured with engine code {old.get('engine_code')}, "
                  f"not today's {code_digest(('reference_engine',))}; its damage may be stale (run without --reuse-fit)",
                  file=sys.stderr)

    def save(rows: list[dict]) -> None:
        atomic_write_json(rows_file, {
            "what": "per plain request of the language rule's fit splits: pruning's damage at the default",
            "command": "python scripts/fit_language_rule.py" + (" --fit-more" if a.fit_more else ""), "splits": sorted({r["split"] for r in rows}),
            "damage_tokens": DAMAGE_TOKENS, "config": config, "engine_code": code_digest(("reference_engine",)),
            "rows": rows})

    fit_rows = measure_fit_rows(fit, stored, save)
    table, evidence = damage_table(fit_rows, () if a.fit_more else TABLE_REPORTS)
    hurt = {L: e["hurt_more"] for L, e in evidence.items()}
    print(f"damage table: {len(table)} languages; not hurt more than English: "
          f"{sorted(L for L, h in hurt.items() if not h)}", file=sys.stderr)
    sha = weights_digest(resolve_model(None)[1])
    out = a.out or language_rule.rule_path(REPO / "reference_engine" / "data", sha)
    table_info = {"language_ratio": {"fitted_on": list(fit) + list(TABLE_REPORTS if not a.fit_more else ()),
                                     "rule": "each language's mean KL over English's, pooled over the fit splits' "
                                             "bank rows and the reports' per-language damage, English weighted by "
                                             "the language's items on each split",
                                     "evidence": evidence}}

    def read_choose() -> list[dict]:
        import pickle

        if a.choose_reads is not None and a.choose_reads.exists():
            rows = pickle.loads(a.choose_reads.read_bytes())
            if sorted({r["split"] for r in rows}) == sorted(CHOOSE):
                return rows
            print(f"warning: {a.choose_reads} holds other splits; reading again", file=sys.stderr)
        rows = [{"split": split, "id": x["id"], "group": x["group"], "kind": x["kind"], "lang": x.get("lang"),
                 "text": x["text"]} for split in CHOOSE for x in _items(split) if x["group"] != "payload_alone"]
        for r, s in zip(rows, read_prompts([r["text"] for r in rows])):
            r.update(s)
        if a.choose_reads is not None:
            tmp = a.choose_reads.with_name(a.choose_reads.name + ".tmp")
            tmp.write_bytes(pickle.dumps(rows))
            tmp.replace(a.choose_reads)
        return rows

    if a.reuse_rule is not None:
        kept, _ = reused_rule(a.reuse_rule)
        kept = dataclasses.replace(kept, language_ratio=table)
        chosen, summary = choose_ratio(read_choose(), kept, hurt)
        print(f"chosen on {', '.join(CHOOSE)}: {chosen['key']}: {summary['grid'][chosen['key']]}", file=sys.stderr)
        info = {**kept.info, **table_info, "command": "python scripts/fit_language_rule.py --reuse-rule FILE",
                "reused_from": a.reuse_rule.name, "not_hurt_more_in_fit": sorted(L for L, h in hurt.items() if not h),
                "chosen_on": list(CHOOSE), "reused_choice_chosen_on": kept.info.get("chosen_on"),
                "rule": "a plain request whose k nearest bank requests (cosine of the pooled direction) are mostly "
                        "one language other than English, whose measured damage (the table) is <= kl_ratio x "
                        "English's, and whose neighbours' mean KL is too unless agree_neighbours of them are the "
                        "language and the table has it <= agree_ratio, is judged against the threshold + margin "
                        "(the probe's where it reads a language); kl_ratio and the agreement chosen again on "
                        "chosen_on, k, coverage, margins and probe kept from the reused file's choice",
                "choice": f"k={kept.k},{chosen['key']},coverage={kept.min_coverage},margin={kept.margin}",
                "choice_counts": summary["grid"][chosen["key"]]}
        rule = dataclasses.replace(kept, kl_ratio=chosen["kl_ratio"], agree_neighbours=chosen["agree_neighbours"],
                                   agree_ratio=chosen["agree_ratio"], info=info)
        language_rule.save(out, sha, rule)
        atomic_write_json(choice_file, {"what": "the language rule's damage ratio and agreement (version 6) chosen "
                                                "again on the choose splits", "command": "python scripts/fit_language_rule.py "
                                        + " ".join(argv or sys.argv[1:]), "chosen": chosen, **summary})
        print(f"wrote {out} and {choice_file.relative_to(REPO)}", file=sys.stderr)
        return 0

    texts = {(split, x["id"]): x["text"] for split in fit for x in _items(split)}
    read = read_prompts([texts[(r["split"], r["id"])] for r in fit_rows])
    keep = [(r, s) for r, s in zip(fit_rows, read) if s["pooled"] is not None]  # a text rule took the rest
    en = [r["kl_mean"] for r, _ in keep if r["lang"] == "en"]
    bank = language_rule.LanguageRule(
        BLOCK, np.stack([s["pooled"] / max(np.linalg.norm(s["pooled"]), 1e-12) for _, s in keep]).astype(np.float32),
        np.array([r["kl_mean"] for r, _ in keep], np.float32), tuple(r["lang"] for r, _ in keep), 8, 1.5, MIN_SHARE,
        1.0, 0.0, {}, language_ratio=table)
    print(f"bank: {len(keep)} of {len(fit_rows)} fit requests ({len(en)} English, KL {np.mean(en):.4f})", file=sys.stderr)
    probe_rows = read_probe_fit(a.probe_reads)
    probe, odd_log_odds, probe_counts = fit_probe(probe_rows)
    print(f"language probe: {probe_counts['languages']} plain requests in other languages against "
          f"{probe_counts['odd']} odd inputs, each as the score finds them, on {', '.join(PROBE_FIT)}", file=sys.stderr)
    chosen, summary = choose(read_choose(), bank, hurt, probe, odd_log_odds)
    print(f"chosen on {', '.join(CHOOSE)}: {chosen['key']}: {summary['grid'][chosen['key']]}", file=sys.stderr)
    info = {"command": "python scripts/fit_language_rule.py", "fitted_on": list(fit), "chosen_on": list(CHOOSE),
            "measured_with": {"mode": default.mode, "router": default.router, "sensitivity": default.sensitivity,
                              "damage_tokens": DAMAGE_TOKENS},
            "english": {"prompts": len(en), "kl_mean": round(float(np.mean(en)), 4)},
            "not_hurt_more_in_fit": sorted(L for L, h in hurt.items() if not h), **table_info,
            "rule": "a plain request whose k nearest bank requests (cosine of the pooled direction) are mostly one "
                    "language other than English, whose measured damage (the table) is <= kl_ratio x English's, is "
                    "judged against the threshold + margin; chosen: most excused in languages not hurt more minus "
                    f"those hurt more, odd excused <= {MAX_ODD_EXCUSED:.0%}",
            "probe": {"fitted_on": list(PROBE_FIT), **probe_counts, "ridge": PROBE_RIDGE,
                      "rule": "log-odds of a plain request in another language against odd input, on the unit pooled "
                              "direction at the block; above the threshold (the chosen quantile of the fit's odd "
                              "inputs' log-odds) the margin is the probe's"},
            "choice": chosen["key"], "choice_counts": summary["grid"][chosen["key"]]}
    chosen_probe = (dataclasses.replace(probe, threshold=chosen["probe_threshold"], margin=chosen["probe_margin"])
                    if chosen["probe_odd_quantile"] is not None else None)
    rule = dataclasses.replace(bank, k=chosen["k"], kl_ratio=chosen["kl_ratio"], min_coverage=chosen["min_coverage"],
                               margin=chosen["margin"], info=info, probe=chosen_probe)
    language_rule.save(out, sha, rule)
    atomic_write_json(choice_file, {"what": "the language rule's choice on the choose splits (no agreement arm)",
                               "command": "python scripts/fit_language_rule.py " + " ".join(argv or sys.argv[1:]),
                               "chosen": chosen, **summary})
    print(f"wrote {out} and {choice_file.relative_to(REPO)}", file=sys.stderr)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
