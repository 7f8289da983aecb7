"""``rsp-bench degradation``: protective degradation judged on a split that chose nothing.

Reads a prompt file in the schema of ``fixtures/degradation_heldout/prompts.jsonl`` (one JSON
object a line: ``id``, ``group``, ``kind``, ``lang``, ``pair``, ``text``), runs every prompt
through the reference engine at its default configuration and reports, with n and a Wilson
interval each:

- the degraded share per group, per kind and per language; the targets (issue 26): requests
  that carry data (``data_request``), plain English requests (``plain_en``) and plain requests
  in languages pruning does not measurably hurt more than English (below) at most 5% degraded,
  and again for the languages *shown* to be hurt no more (within ``EQUIV_KL_RATIO`` of English's
  KL), odd input (``odd``) at least 95%; ``payload_alone`` has no target and is
  read against its pair (what the request around a payload changes);
- that a degraded prompt's output equals pruning off's, token for token;
- what each error costs: for every degraded ordinary prompt and every missed odd one, what
  pruning at the default sensitivity does to it (teacher-forced KL and top-1 against pruning
  off on pruning off's own greedy continuation, the detector suspended), so a reader sees
  whether a false alarm protected anything and whether a miss hurt;
- the same damage for every plain request, per language against English: degrading a language
  is the protection working only where pruning measurably hurts it more than English (its top-1
  interval below English's, or its mean per-item KL above English's in a permutation test);
- the check's cost: what it adds to TTFT, the engine's own timing of its check call with the
  detector running minus suspended (then the call computes only the prompt's own logits), in
  interleaved pairs, over the median decode step, short and long prompts, over ``--cost-reps``
  pairs (``--cost-only`` measures just this).

Every figure is measured; KL is over the full vocabulary (nats), not a truncated estimate. Must NOT import ``reference_engine`` at module level (the CLI's
help stays light); the engine arrives in ``run``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from rsp_bench.datasets import read_jsonl
from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics.intervals import permutation_mean_greater_p, wilson_interval
from rsp_bench.storage import atomic_write_json

FIELDS = ("id", "group", "kind", "lang", "pair", "text")
ORDINARY = ("data_request", "plain_language", "plain_en")  # must not degrade
ODD = ("odd",)  # must degrade
GROUPS = (*ORDINARY, "payload_alone", *ODD)
MAX_FALSE_ALARMS = 0.05
MIN_DETECTION = 0.95
BATCH = 8
SHORT_PROMPT = "What is the capital of France?"


@dataclass(frozen=True)
class Item:
    id: str
    group: str
    kind: str
    lang: str
    pair: str | None
    text: str


def load_items(path: Path) -> list[Item]:
    """The prompt file, every line checked: a bad line is an error naming the file, the line and
    the field."""
    rows = read_jsonl(Path(path), {"id": str, "group": str, "kind": str, "lang": str, "text": str})
    for row in rows:
        where = f"{path}: prompt {row['id']!r}"
        if row["group"] not in GROUPS:
            raise HarnessInputError(f"{where}: group {row['group']!r} is not one of {', '.join(GROUPS)}")
        if not isinstance(row.get("pair"), (str, type(None))):
            raise HarnessInputError(f"{where}: field 'pair' must be a string or null, got {row.get('pair')!r:.100}")
        if not row["text"].strip():
            raise HarnessInputError(f"{where}: the text is only whitespace")
    if not rows:
        raise HarnessInputError(f"{path}: no prompts in it")
    return [Item(**{f: row.get(f) for f in FIELDS}) for row in rows]


def rate(hits: int, n: int) -> dict:
    lo, hi = wilson_interval(hits, n)
    return {"n": n, "degraded": hits, "rate": round(hits / n, 4), "ci95": [round(lo, 4), round(hi, 4)]}


def verdicts(engine: Any, items: Sequence[Item], progress: Callable[[int, int], None]) -> list[dict]:
    """Each prompt through the engine (one new token, the default configuration), in batches of
    similar token length (a degraded row does not change another row's verdict)."""
    n_tok = [len(engine.encode(it.text)) for it in items]
    order = sorted(range(len(items)), key=lambda i: n_tok[i])
    out: list[dict] = [{}] * len(items)
    for start in range(0, len(order), BATCH):
        idx = order[start:start + BATCH]
        for i, res in zip(idx, engine.generate([items[i].text for i in idx], max_new_tokens=1)):
            out[i] = {"degraded": bool(res.stats["degraded"]), "reason": res.stats["degraded_reason"],
                      "prompt_tokens": n_tok[i]}
        progress(min(start + BATCH, len(order)), len(order))
    return out


def summarise(items: Sequence[Item], v: Sequence[dict]) -> dict:
    by_group: dict[str, list[bool]] = {}
    by_kind: dict[str, list[bool]] = {}
    by_lang: dict[str, list[bool]] = {}
    reasons: dict[str, dict[str, int]] = {}
    for it, r in zip(items, v):
        by_group.setdefault(it.group, []).append(r["degraded"])
        by_kind.setdefault(f"{it.group}/{it.kind}", []).append(r["degraded"])
        if it.group in ("plain_language", "plain_en"):
            by_lang.setdefault(it.lang, []).append(r["degraded"])
        if r["degraded"]:
            g = reasons.setdefault(it.group, {})
            g[r["reason"]] = g.get(r["reason"], 0) + 1
    ordinary = [r["degraded"] for it, r in zip(items, v) if it.group in ORDINARY]
    out = {"groups": {g: rate(sum(f), len(f)) for g, f in by_group.items()},
           "kinds": {k: rate(sum(f), len(f)) for k, f in sorted(by_kind.items())},
           "languages": {k: rate(sum(f), len(f)) for k, f in sorted(by_lang.items())},
           "reasons": reasons}
    if ordinary:
        out["groups"]["ordinary (all three)"] = rate(sum(ordinary), len(ordinary))
    ids = {it.id: i for i, it in enumerate(items)}
    pairs = [(v[i]["degraded"], v[ids[it.pair]]["degraded"]) for i, it in enumerate(items)
             if it.group == "data_request" and it.pair in ids]
    if pairs:
        out["pairs"] = {"n": len(pairs),
                        "request_kept_payload_degraded": sum(not a and b for a, b in pairs),
                        "both_kept": sum(not a and not b for a, b in pairs),
                        "both_degraded": sum(a and b for a, b in pairs),
                        "request_degraded_payload_kept": sum(a and not b for a, b in pairs)}
    return out


def targets(summary: dict, languages: dict | None = None, items: Sequence[Item] = (),
            v: Sequence[dict] = ()) -> list[dict]:
    """Each target of issue 26 with its measured rate and whether it is met. Given the damage per
    language (``language_damage``) and the verdicts, plain requests in other languages are judged
    as the issue asks: only those in languages pruning does not measurably hurt more than English
    must keep pruning (``plain_language (not hurt more)``); without it, all of them."""
    rows = []
    spared = shown = None
    if languages:
        spared = [r["degraded"] for it, r in zip(items, v) if it.group == "plain_language"
                  and it.lang in languages and not languages[it.lang].get("hurts_more_than_en")]
        shown = [r["degraded"] for it, r in zip(items, v) if it.group == "plain_language"
                 and it.lang in languages and languages[it.lang].get("no_more_than_en")]
    for g in ORDINARY:
        if g == "plain_language" and spared is not None:
            for label, flags in (("not hurt more", spared), (f"shown within {EQUIV_KL_RATIO}x English", shown)):
                r = rate(sum(flags), len(flags)) if flags else {"rate": 0.0, "n": 0, "ci95": [0.0, 1.0]}
                # no language in the group: nothing was judged, so neither met nor missed (None)
                rows.append({"group": f"plain_language ({label})", "target": f"<= {MAX_FALSE_ALARMS:.0%} degraded",
                             "rate": r["rate"], "n": r["n"], "ci95": r["ci95"],
                             "met": None if r["n"] == 0 else r["rate"] <= MAX_FALSE_ALARMS})
            continue
        if g in summary["groups"]:
            r = summary["groups"][g]
            rows.append({"group": g, "target": f"<= {MAX_FALSE_ALARMS:.0%} degraded", "rate": r["rate"],
                         "n": r["n"], "ci95": r["ci95"], "met": r["rate"] <= MAX_FALSE_ALARMS})
    if "odd" in summary["groups"]:
        r = summary["groups"]["odd"]
        rows.append({"group": "odd", "target": f">= {MIN_DETECTION:.0%} degraded", "rate": r["rate"], "n": r["n"],
                     "ci95": r["ci95"], "met": r["rate"] >= MIN_DETECTION})
    return rows


def equals_off(engine: Any, text: str, max_new: int) -> bool:
    """Does a degraded prompt's output equal pruning off's, token for token (each alone)?"""
    (pruned,) = engine.generate([text], max_new_tokens=max_new)
    (off,) = engine.generate([text], max_new_tokens=max_new, mode="off")
    return pruned.token_ids == off.token_ids


def damage(engine: Any, text: str, n_tokens: int) -> dict:
    """What pruning at the default configuration does to one prompt with the detector suspended:
    full-vocabulary KL(off || pruned) and top-1 agreement, teacher-forced on pruning off's own
    greedy continuation, and the share of blocks it bypassed."""
    from rsp_bench.metrics.equivalence import kl_per_token, top1_matches

    (off,) = engine.generate([text], max_new_tokens=n_tokens, mode="off")
    cont = off.token_ids or [engine.eos_id]
    ref = engine.teacher_forced(off.prompt_ids, cont, mode="off")
    with engine.degradation_suspended():
        cand = engine.teacher_forced(off.prompt_ids, cont)
    kl = kl_per_token(ref.logits, cand.logits)
    top1 = top1_matches(ref.logits, cand.logits)
    return {"tokens": len(cont), "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "top1": float(top1.mean()), "top1_hits": int(top1.sum()), "bypass_ratio": float(cand.stats["bypass_ratio"])}


def _pooled(rows: Sequence[dict]) -> dict:
    tokens = sum(r["tokens"] for r in rows)
    hits = sum(r["top1_hits"] for r in rows)
    lo, hi = wilson_interval(hits, tokens)
    return {"items": len(rows), "tokens": tokens,
            "kl_mean": round(sum(r["kl_mean"] * r["tokens"] for r in rows) / tokens, 6),
            "top1": round(hits / tokens, 4), "top1_ci95": [round(lo, 4), round(hi, 4)],
            "bypass_ratio": round(sum(r["bypass_ratio"] * r["tokens"] for r in rows) / tokens, 4)}


KL_ALPHA = 0.05  # one-sided level of the per-language KL test (metrics.permutation_mean_greater_p)
# "No more than English", shown rather than assumed: a language's mean per-item KL below this
# multiple of English's in the same one-sided test (English's values scaled by it). 1.25 is the
# language rule's own "English-like" ratio; fixed on 2026-12-05 before 12-05f was measured. A
# language neither shown hurt more nor shown within it is undecided: with 4 items a language most
# are (on 12-05b at the current default, 15 of the 18 not shown hurt more had a mean KL 1.2-2.1x
# English's), so "not hurt more" alone counts as false alarms requests that pruning may well hurt.
EQUIV_KL_RATIO = 1.25


def language_damage(items: Sequence[Item], v: Sequence[dict], dmg: dict[str, dict]) -> dict:
    """Pruning's damage per language against English's (plain requests). A language "hurts more"
    where its top-1 interval lies wholly below English's (Wilson, pooled tokens) or its mean
    per-item KL is above English's at ``KL_ALPHA`` (a one-sided permutation test); otherwise degrading it
    protected nothing measurable. With 4 items a language only a large difference shows: a
    language's verdict is only as strong as its n. ``no_more_than_en`` is the converse shown: not
    hurt more, and its mean per-item KL below ``EQUIV_KL_RATIO`` times English's at ``KL_ALPHA``."""
    plain = [(it, r) for it, r in zip(items, v) if it.group in ("plain_language", "plain_en") and it.id in dmg]
    english = [dmg[it.id] for it, _ in plain if it.lang == "en"]
    if not english:
        return {}
    en = _pooled(english)
    en_kl = [d["kl_mean"] for d in english]
    out = {"en": {**en, "degraded": sum(r["degraded"] for it, r in plain if it.lang == "en")}}
    langs = sorted({it.lang for it, _ in plain} - {"en"})
    for lang in langs:
        rows = [dmg[it.id] for it, _ in plain if it.lang == lang]
        p = _pooled(rows)
        # per prompt, not per token: a prompt's tokens share its context, so they are not independent
        lang_kl = [d["kl_mean"] for d in rows]
        kl_p = permutation_mean_greater_p(lang_kl, en_kl, seed=26)
        within_p = permutation_mean_greater_p([EQUIV_KL_RATIO * x for x in en_kl], lang_kl, seed=26)
        worse = p["top1_ci95"][1] < en["top1_ci95"][0] or kl_p < KL_ALPHA
        out[lang] = {**p, "kl_p_more_than_en": round(kl_p, 5),
                     "kl_ratio_to_en": round(statistics.fmean(lang_kl) / max(statistics.fmean(en_kl), 1e-12), 4),
                     "kl_p_within_ratio": round(within_p, 5),
                     "degraded": sum(r["degraded"] for it, r in plain if it.lang == lang),
                     "hurts_more_than_en": bool(worse),
                     "no_more_than_en": bool(not worse and within_p < KL_ALPHA)}
    return out


def check_cost(engine: Any, text: str, reps: int) -> dict:
    """What the check adds to TTFT, in decode steps. The same request runs with the detector
    running and suspended, interleaved (A B, B A, ...), so load hits both alike. Suspended, the
    engine still calls the check to compute the prompt's last-position logits (the check's loss
    and entropy rows share that pass with them when it runs), so the engine's own timing of that
    call (``degradation_check_s``, inside prefill) with the detector minus without it is the check
    alone: its text rules, its extra rows through the output matrix, its features. Each pair's
    difference is over the median decode step of the request that ran the check. (Differences of
    whole TTFTs were tried first: a 1,069-token prefill's own jitter, hundreds of ms, swamped them.)"""
    added, steps, ratios, calls, heads = [], [], [], [], []
    res = None
    for i in range(reps):
        pair = {}
        for suspended in ((False, True) if i % 2 == 0 else (True, False)):
            if suspended:
                with engine.degradation_suspended():
                    (r,) = engine.generate([text], max_new_tokens=6)
            else:
                (r,) = engine.generate([text], max_new_tokens=6)
                res = r
            pair[suspended] = r.stats
        step = statistics.median(pair[False]["decode_step_times_s"][1:] or pair[False]["decode_step_times_s"])
        diff = pair[False]["degradation_check_s"] - pair[True]["degradation_check_s"]
        added.append(diff)
        steps.append(step)
        ratios.append(diff / step)
        calls.append(pair[False]["degradation_check_s"])
        heads.append(pair[True]["degradation_check_s"])
    return {"prompt_tokens": res.stats["prompt_tokens"], "reps": reps, "degraded": bool(res.stats["degraded"]),
            "method": "interleaved pairs: the engine's check call with the detector minus without it (the prompt's "
                      "own head pass), over the median decode step",
            "added_s_median": round(statistics.median(added), 6),
            "check_call_s_median": round(statistics.median(calls), 6),
            "head_only_s_median": round(statistics.median(heads), 6),
            "decode_step_s_median": round(statistics.median(steps), 6),
            "check_over_step_median": round(statistics.median(ratios), 4),
            "check_over_step_range": [round(min(ratios), 4), round(max(ratios), 4)]}


def _progress(label: str, quiet: bool) -> Callable[[int, int], None]:
    t0 = time.monotonic()

    def show(done: int, total: int) -> None:
        if quiet:
            return
        if sys.stderr.isatty() or done == total or done % max(total // 10, 1) < BATCH:
            print(f"\r[degradation] {label}: {done}/{total} ({time.monotonic() - t0:.0f} s)", end="",
                  file=sys.stderr, flush=True)
            if done == total:
                print(file=sys.stderr)
    return show


# The split the README reports (measured once); the earlier ones are development splits, and the
# next detector change needs a new held-out split, written and committed before it is measured.
REPORTED_SPLIT = Path("fixtures/degradation_heldout_2026-12-07g/prompts.jsonl")


def default_out(prompts: Path, cost_only: bool) -> Path:
    """results/<the prompt file's folder>.json (results/degradation_check_cost.json with --cost-only),
    so that a report on another file never overwrites the README's."""
    return Path("results/degradation_check_cost.json") if cost_only else Path("results") / f"{prompts.parent.name}.json"


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=Path, default=REPORTED_SPLIT,
                   help=f"prompt file (default: the split the README reports, {REPORTED_SPLIT}, measured once; "
                        "the earlier ones are development splits, and the next design needs a new held-out split)")
    p.add_argument("--model", default=None, help="model folder or name (default: the embedded model)")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON report, written atomically (default: results/<the prompt file's folder>.json; "
                        "with --cost-only, results/degradation_check_cost.json)")
    p.add_argument("--cost-only", action="store_true",
                   help="measure only the check's cost (short prompt, and the file's longest ordinary prompt)")
    p.add_argument("--damage-tokens", type=int, default=16,
                   help="continuation tokens teacher-forced per damage measurement (default 16)")
    p.add_argument("--equal-tokens", type=int, default=4,
                   help="tokens generated per degraded prompt to compare with pruning off (default 4)")
    p.add_argument("--cost-reps", type=int, default=15, help="requests timed per cost figure (default 15)")
    p.add_argument("--limit", type=int, default=None, help="first N prompts only (a smoke run; reports say so)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")


def _check_args(a: argparse.Namespace) -> None:
    for name in ("damage_tokens", "equal_tokens", "cost_reps"):
        if getattr(a, name) < 1:
            raise HarnessInputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.limit is not None and a.limit < 1:
        raise HarnessInputError(f"--limit must be >= 1, got {a.limit}")
    if a.threads is not None and a.threads < 1:
        raise HarnessInputError(f"--threads must be >= 1, got {a.threads}")


def _command() -> str | None:
    return "rsp-bench degradation " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["degradation"] else None


def run(a: argparse.Namespace) -> int:
    _check_args(a)
    quiet = bool(getattr(a, "quiet", False))
    cost_only = bool(getattr(a, "cost_only", False))
    out = a.out or default_out(a.prompts, cost_only)
    items = load_items(a.prompts)
    if a.limit is not None:
        items = items[:a.limit]
    import torch

    from reference_engine import Engine

    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.monotonic()
    engine = Engine.load(a.model)
    # the file's longest ordinary prompt times the long case; a file with none times the short one only
    long_text = max((it.text for it in items if it.group in ORDINARY), key=len, default=None)

    def costs() -> dict:
        cost = {"short": check_cost(engine, SHORT_PROMPT, a.cost_reps)}
        if long_text is not None:
            cost["long"] = check_cost(engine, long_text, a.cost_reps)
        return cost

    if cost_only:
        from rsp_bench.records import machine_info

        cost = costs()
        report = {"model": engine.name, "detector": engine.detector_info(), "check_cost": cost,
                  "machine": machine_info(), "wall_s": round(time.monotonic() - t0, 1), "command": _command()}
        atomic_write_json(out, report)
        _print_cost(report)
        print(f"report: {out}")
        return 0
    v = verdicts(engine, items, _progress("verdicts", quiet))
    summary = summarise(items, v)

    degraded = [(it, r) for it, r in zip(items, v) if r["degraded"]]
    show = _progress("degraded equals off", quiet)
    unequal = []
    for k, (it, _) in enumerate(degraded, 1):
        if not equals_off(engine, it.text, a.equal_tokens):
            unequal.append(it.id)
        show(k, len(degraded))

    # Damage: every error (degraded ordinary, missed odd) and every plain request (per language).
    wanted = [(it, r) for it, r in zip(items, v)
              if (it.group in ORDINARY and r["degraded"]) or (it.group in ODD and not r["degraded"])
              or it.group in ("plain_language", "plain_en")]
    show = _progress("damage of pruning", quiet)
    dmg: dict[str, dict] = {}
    for k, (it, _) in enumerate(wanted, 1):
        dmg[it.id] = damage(engine, it.text, a.damage_tokens)
        show(k, len(wanted))
    errors = [{"id": it.id, "group": it.group, "kind": it.kind, "lang": it.lang, "reason": r["reason"],
               "error": "false alarm" if it.group in ORDINARY else "miss", **dmg[it.id]}
              for it, r in zip(items, v) if it.id in dmg
              and ((it.group in ORDINARY and r["degraded"]) or (it.group in ODD and not r["degraded"]))]
    languages = language_damage(items, v, dmg)
    cost = costs()

    from rsp_bench.records import machine_info

    report = {
        "prompts": str(a.prompts), "items": len(items), "limited": a.limit is not None,
        "model": engine.name, "detector": engine.detector_info(),
        "config": {"mode": engine.default_config.mode, "sensitivity": engine.default_config.sensitivity,
                   "router": engine.default_config.router},
        "targets": targets(summary, languages, items, v), **summary,
        "degraded_equals_off": {"n": len(degraded), "unequal": unequal, "tokens": a.equal_tokens},
        "errors": errors, "languages_damage": languages,
        "check_cost": cost, "machine": machine_info(), "wall_s": round(time.monotonic() - t0, 1),
        "command": _command(),
    }
    atomic_write_json(out, report)
    print_report(report)
    print(f"report: {out}")
    return 1 if unequal else 0


def print_report(rep: dict) -> None:
    from tabulate import tabulate

    ci = lambda r: f"{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}"  # noqa: E731
    print(tabulate([[g, r["n"], r["degraded"], f"{r['rate']:.3f}", ci(r)] for g, r in rep["groups"].items()],
                   headers=["group", "n", "degraded", "rate", "95% CI"], disable_numparse=True))
    print()
    verdict = {True: "met", False: "NOT MET", None: "n/a (none in the group)"}
    print(tabulate([[t["group"], t["target"], f"{t['rate']:.3f} (n={t['n']})", verdict[t["met"]]]
                    for t in rep["targets"]], headers=["group", "target", "measured", ""], disable_numparse=True))
    if "pairs" in rep:
        p = rep["pairs"]
        print(f"\npairs (request, payload alone), n={p['n']}: request kept & payload degraded "
              f"{p['request_kept_payload_degraded']}, both kept {p['both_kept']}, both degraded "
              f"{p['both_degraded']}, request degraded & payload kept {p['request_degraded_payload_kept']}")
    eq = rep["degraded_equals_off"]
    print(f"degraded output equals pruning off: {eq['n'] - len(eq['unequal'])}/{eq['n']}")
    if rep["errors"]:
        print()
        print(tabulate([[e["error"], e["id"], e["reason"] or "-", f"{e['kl_mean']:.4f}", f"{e['top1']:.3f}",
                         f"{e['bypass_ratio']:.3f}"] for e in rep["errors"]],
                       headers=["error", "prompt", "reason", "KL mean", "top-1", "bypass"], disable_numparse=True))
    ld = rep["languages_damage"]
    if ld:
        more = [k for k, d in ld.items() if d.get("hurts_more_than_en")]
        within = [k for k, d in ld.items() if d.get("no_more_than_en")]
        print(f"\npruning's damage per language: English top-1 {ld['en']['top1']:.3f}, KL {ld['en']['kl_mean']:.4f} "
              f"({ld['en']['items']} items); hurts more than English: {', '.join(more) or 'none'}; shown within "
              f"{EQUIV_KL_RATIO}x English's KL: {', '.join(within) or 'none'}; the rest undecided")
    _print_cost(rep)


def _print_cost(rep: dict) -> None:
    for k, c in rep["check_cost"].items():
        print(f"check cost, {k} prompt ({c['prompt_tokens']} tokens): {c['check_over_step_median']:.3f} of a decode "
              f"step (median of {c['reps']} interleaved pairs; +{c['added_s_median'] * 1e3:.2f} ms to TTFT against "
              f"a {c['decode_step_s_median'] * 1e3:.2f} ms step)")
