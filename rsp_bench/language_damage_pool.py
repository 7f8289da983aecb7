"""Pruning's damage per language, pooled over several blind splits' reports (issue 26).

One split's report judges each language on its own 8 plain requests, so a language pruning hurts
1.6x as much as English is often "not shown hurt more" there (12-07c: Tagalog at 1.65x, p 0.06).
Every blind split measures that damage again, on new requests, whatever the detector did, so the
measurements pool: per language, its mean KL over English's (each split's English weighted by the
language's items there), and a one-sided sign test over the splits (was the language above its
split's English on more splits than chance gives?). ``rsp-bench language-damage`` prints that
table and, with ``--split``, how that split's degraded plain requests fall by the pooled verdicts,
beside the split's own (the report's headline stays the split's own verdict).

The language rule's damage table (``scripts/fit_language_rule.py``) pools the same way.

Must not import the engine or the harness's engines: it reads JSON reports only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Iterable, Mapping

from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics.intervals import sign_test_greater_p

HURT_ALPHA = 0.05  # the sign test's one-sided level
MIN_SPLITS = 5  # with fewer splits a sign test cannot reach HURT_ALPHA (4 of 4 gives p 0.0625)


def pool(splits: Iterable[Mapping[str, Mapping]]) -> dict[str, dict]:
    """Per language (English left out), from each split's per-language damage (``lang -> {"items",
    "kl_mean"}``, English as ``"en"``): the items and splits, the pooled ratio to English, the
    splits where it was above its English, the sign test's p (None under ``MIN_SPLITS``) and
    ``hurt_more`` (None where the test has too few splits to say)."""
    per: dict[str, list[tuple[int, float, float]]] = {}
    for damage in splits:
        if "en" not in damage:
            continue
        en = float(damage["en"]["kl_mean"])
        for lang, d in damage.items():
            if lang != "en" and d.get("items"):
                per.setdefault(lang, []).append((int(d["items"]), float(d["kl_mean"]), en))
    out = {}
    for lang, src in sorted(per.items()):
        above = sum(kl > en for _, kl, en in src)
        p = sign_test_greater_p(above, len(src)) if len(src) >= MIN_SPLITS else None
        out[lang] = {"items": sum(n for n, _, _ in src), "splits": len(src),
                     "ratio_to_en": round(sum(n * kl for n, kl, _ in src) / max(sum(n * en for n, _, en in src), 1e-12), 4),
                     "splits_above_en": above, "sign_p": None if p is None else round(p, 6),
                     "hurt_more": None if p is None else p < HURT_ALPHA}
    return out


def split_by_pooled_verdict(report: Mapping, pooled: Mapping[str, dict]) -> dict[str, dict]:
    """One split's plain requests in other languages, degraded / n, grouped by the pooled verdict on
    their language (``hurt more``, ``not hurt more``, ``undecided``) and by the split's own."""
    out: dict[str, dict] = {}
    for lang, d in report.get("languages_damage", {}).items():
        if lang == "en":
            continue
        v = pooled.get(lang, {}).get("hurt_more")
        key = {True: "pooled: hurt more", False: "pooled: not hurt more", None: "pooled: undecided"}[v]
        own = "split: hurt more" if d.get("hurts_more_than_en") else "split: not shown hurt more"
        for k in (key, f"{key} / {own}"):
            g = out.setdefault(k, {"degraded": 0, "n": 0, "languages": []})
            g["degraded"] += int(d.get("degraded", 0))
            g["n"] += int(d.get("items", 0))
            g["languages"].append(lang)
    return dict(sorted(out.items()))


def _read(path: Path) -> dict:
    try:
        rep = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise HarnessInputError(f"cannot read the report {path}: {e}") from None
    if not isinstance(rep, dict) or not isinstance(rep.get("languages_damage"), dict) or "en" not in rep["languages_damage"]:
        raise HarnessInputError(f"{path} is not an rsp-bench degradation report with per-language damage "
                                "(no languages_damage with English)")
    return rep


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reports", type=Path, nargs="+", required=True,
                   help="rsp-bench degradation reports (JSON) measured at one configuration and model")
    p.add_argument("--split", type=Path, default=None,
                   help="also show this report's degraded plain requests by the pooled verdicts (it joins the pool)")
    p.add_argument("--out", type=Path, default=None, help="write the table as JSON here (atomically)")


def run(a: argparse.Namespace) -> int:
    from tabulate import tabulate

    from rsp_bench.storage import atomic_write_json

    paths = list(dict.fromkeys([*a.reports, *([a.split] if a.split else [])]))
    reports = {p: _read(p) for p in paths}
    first = paths[0]
    for p, rep in reports.items():
        for field in ("model", "config"):
            if rep.get(field) != reports[first].get(field):
                raise HarnessInputError(f"{p} was measured with {field} {rep.get(field)!r}, {first} with "
                                        f"{reports[first].get(field)!r}: pool reports of one configuration")
    pooled = pool(rep["languages_damage"] for rep in reports.values())
    print(tabulate([[L, d["splits"], d["items"], f"{d['ratio_to_en']:.2f}", f"{d['splits_above_en']}/{d['splits']}",
                     "-" if d["sign_p"] is None else f"{d['sign_p']:.4f}",
                     {True: "hurt more", False: "not hurt more", None: "undecided"}[d["hurt_more"]]]
                    for L, d in sorted(pooled.items(), key=lambda x: x[1]["ratio_to_en"])],
                   headers=["language", "splits", "items", "KL / English", "above English", "sign p", "pooled"],
                   disable_numparse=True))
    out = {"reports": [str(p) for p in paths], "config": reports[first].get("config"),
           "model": reports[first].get("model"), "hurt_alpha": HURT_ALPHA, "languages": pooled}
    if a.split is not None:
        groups = split_by_pooled_verdict(reports[a.split], pooled)
        out["split"] = {"report": str(a.split), "groups": groups}
        print(f"\n{a.split}: plain requests in other languages, degraded / n")
        print(tabulate([[k, f"{g['degraded']} / {g['n']}", ", ".join(g["languages"])] for k, g in groups.items()],
                       headers=["verdict", "degraded", "languages"], disable_numparse=True))
    if a.out is not None:
        atomic_write_json(a.out, out)
        print(f"wrote {a.out}")
    return 0
