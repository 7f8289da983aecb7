"""The unit router's quality/speed curve: as run-record figures, and as a leaderboard table.

``rsp-bench router-curve`` (rsp_bench/router_curve_measure.py) writes ``results/router_curve.json``: on prompts nobody tuned
to, per sensitivity, the router's teacher-forced top-1 agreement and KL at the weight bytes it
actually skipped, static removal (several rankings) and random removal interpolated at the same
bytes, and interleaved speed-ups against the ideal from the bytes not read. This module reads
that file and turns it into one table (headers and rows); the leaderboard renders it.

The full run's suite (suites/test_router_curve.py) measures the same curve, smaller, and
records it (``record_curve``): per target budget one configuration
``reference/router-curve/target=<t>`` with the router's ``top1_agreement`` and ``kl_mean``, the
best static removal's at the same bytes (``static_top1_agreement``, ``static_kl_mean``), the
router's lead over it (``top1_agreement_vs_static``, ``kl_mean_vs_static``: router minus static),
the random removal's top-1 and the bytes (``blocks_skipped_per_token``); per timed sensitivity one
``reference/router-curve-speed/target=<t>`` with ``speedup_vs_off`` (per-pair samples), the ideal
speed-up and the bytes that timed run skipped, so a speed-up is never paired with another run's
bytes. The gate judges these like any figure (rsp_bench/gate_policy.toml); ``curve_from_record``
turns a record back into the curve the tables render, and the leaderboard keeps these
configurations out of its main table.

Must NOT import torch, transformers or reference_engine (the leaderboard imports it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from rsp_bench.errors import HarnessInputError
from rsp_bench.records import record_sort_key

CURVE_FILE = "router_curve.json"
STATIC_NAMES = {"block_bi": "ShortGPT blocks", "unit_bi": "ShortGPT units", "unit_bi_per_byte": "BI per byte",
                "unit_impact_per_byte": "impact per byte"}
HEADERS = ("sensitivity", "blocks' worth skipped / token", "router top-1", "router KL", "best static (same bytes)",
           "router − best static", "random top-1", "router ms / token")
# Speed has its own rows: the timed runs generate freely, and at one sensitivity free-running
# generation skips other bytes than the teacher-forced quality runs (about twice as many on the
# embedded model), so a speed-up beside the quality row of its sensitivity would pair it with
# bytes it was not measured at.
SPEED_HEADERS = ("sensitivity", "blocks' worth skipped / token (timed run)", "measured speed-up", "ideal speed-up",
                 "router ms / token", "pairs")


def load_curves(folder: str | Path) -> list[dict[str, Any]]:
    """Every ``router_curve*.json`` in ``folder`` (``router_curve.json`` first, then by name: one
    file per held-out prompt set, so a development set and a fresh one sit side by side, each
    titled with its source); a damaged file is an error."""
    paths = sorted(Path(folder).glob("router_curve*.json"), key=lambda q: (q.name != CURVE_FILE, q.name))
    return [c for c in (load_curve(folder, q.name) for q in paths) if c is not None]


def load_curve(folder: str | Path, name: str = CURVE_FILE) -> dict[str, Any] | None:
    """``folder/name``, or None when there is none; a damaged file is an error."""
    path = Path(folder) / name
    if not path.is_file():
        return None
    try:
        curve = json.loads(path.read_text())
        if not isinstance(curve.get("held_out"), list):
            raise ValueError("no held_out list")
    except (OSError, ValueError, AttributeError) as exc:
        raise HarnessInputError(f"{path}: not a router curve from scripts/measure_router_curve.py ({exc})") from exc
    return curve


def curve_title(curve: Mapping[str, Any]) -> str:
    source = curve.get("held_out_source")
    prompts = f"held-out prompts of {Path(source).name}" if source else "development prompts (built-in)"
    rep = curve.get("predictor_report") or {}
    # which predictor ran: older curves are of older predictors, and the board shows them all
    predictor = (f", predictor of {rep['prompts']} prompts, {rep.get('labels', 'sequence')} labels"
                 if rep.get("prompts") else "")
    return (f"Unit router vs static and random removal at equal weight bytes ({curve.get('model', '?')}, "
            f"{curve.get('held_out_prompts', '?')} {prompts} x {curve.get('tokens', '?')} tokens, "
            f"{curve.get('kernel', '?')} kernel, {curve.get('threads', '?')} thread(s){predictor})")


def curve_rows(curve: Mapping[str, Any]) -> list[list[str]]:
    """Quality, one row per measured sensitivity, shallow to deep (teacher-forced runs)."""
    rows = []
    for r in sorted(curve["held_out"], key=lambda r: r["router"]["blocks_worth"]):
        rp = r["router"]
        best = r["best_static"]
        rows.append([
            f"{rp['sensitivity']:.3f}", f"{rp['blocks_worth']:.2f}", f"{rp['top1']:.3f}", f"{rp['kl']:.3f}",
            f"{r['static'][best]['top1']:.3f} ({STATIC_NAMES.get(best, best)})",
            f"{100 * r['router_minus_best_static_top1']:+.1f} pts", f"{r['random']['top1']:.3f}",
            "—" if rp.get("router_ms_per_token") is None else f"{rp['router_ms_per_token']:.2f}",
        ])
    return rows


def curve_speed_rows(curve: Mapping[str, Any]) -> list[list[str]]:
    """Speed, one row per timed sensitivity, each with the bytes its own timed generation skipped."""
    def opt(p: Mapping[str, Any], key: str, fmt: str) -> str:
        return "—" if p.get(key) is None else format(p[key], fmt)

    rows = []
    for p in sorted(curve.get("speed", []), key=lambda p: p.get("blocks_worth") or 0.0):
        rows.append([
            f"{p['sensitivity']:.3f}", opt(p, "blocks_worth", ".2f"),
            f"{p['speedup']:.2f}× [{p['speedup_lo']:.2f}, {p['speedup_hi']:.2f}]", f"{p['ideal_speedup']:.2f}×",
            opt(p, "router_ms_per_token", ".2f"), opt(p, "pairs", "d"),
        ])
    return rows


def curve_note(curve: Mapping[str, Any]) -> str:
    # Runs before 2026-12-03 name no source: they used the script's built-in prompts, which have
    # since been used to compare router designs.
    source = curve.get("held_out_source") or "the script's built-in HELD_OUT_PROMPTS (a development set now)"
    held = f"Held-out prompts: {source}. "
    return (f"Measured by `{curve.get('command', 'scripts/measure_router_curve.py')}`. {held}Static and random rows "
            "are interpolated between whole-unit budgets at the router's measured bytes. "
            f"{curve.get('load_note', '')}").strip()


def curve_speed_note(curve: Mapping[str, Any]) -> str:
    return ("Speed-ups are interleaved ratios to pruning off in free-running generation; each sits beside the "
            "weight bytes that generation skipped, which at one sensitivity are not the teacher-forced rows' "
            "bytes above (free-running skips more), so read speed against bytes, not against the quality row of "
            "the same sensitivity. Ideal: the speed-up if time fell with the bytes not read.")


# --------------------------------------------------------------------------- run records

CURVE_MODE = "router-curve"  # one configuration per target budget: quality at equal bytes
SPEED_MODE = "router-curve-speed"  # one per timed sensitivity: speed-up at that run's own bytes
CURVE_MODES = (CURVE_MODE, SPEED_MODE)
EXTRA_KEY = "router_curve"  # record["extra"][EXTRA_KEY]: what the curve was measured on
_META = ("held_out_source", "held_out_prompts", "tune_prompts", "tokens", "kernel", "threads", "command",
         "chosen_sensitivities")


# what a quality point needs to be shown (a baseline cut to quality figures lacks the timings)
_CURVE_METRICS = ("top1_agreement", "kl_mean", "blocks_skipped_per_token", "static_top1_agreement", "static_kl_mean",
                  "top1_agreement_vs_static", "random_top1_agreement")


def point_id(mode: str, target: int | None, raw_sensitivity: float) -> str:
    """``reference/router-curve/target=3``; a point measured at no target (a grid point above the
    chosen ones) is named by its raw sensitivity, ``.../raw=0.500``."""
    return f"reference/{mode}/" + (f"target={target}" if target is not None else f"raw={raw_sensitivity:.3f}")


def record_curve(builder: Any, curve: Mapping[str, Any]) -> list[str]:
    """Record ``curve`` (``router_curve_measure.measure_curve``'s dict plus the command's
    metadata keys) in the run record ``builder`` (a RunRecordBuilder); returns the ids added."""
    chosen = {int(t): float(s) for t, s in curve.get("chosen_sensitivities", {}).items()}
    builder.set_extra(EXTRA_KEY, {k: ({str(t): s for t, s in chosen.items()} if k == "chosen_sensitivities"
                                      else curve[k]) for k in _META if k in curve})
    added = []
    for r in curve["held_out"]:
        rp, best = r["router"], r["best_static"]
        st = r["static"][best]
        cid = point_id(CURVE_MODE, r["target_blocks_worth"], rp["sensitivity"])
        params = {"target_blocks_worth": r["target_blocks_worth"], "raw_sensitivity": rp["sensitivity"],
                  "best_static": best, "static": {k: {"top1": v["top1"], "kl": v["kl"]} for k, v in r["static"].items()},
                  "random_top1_per_seed": r["random"].get("top1_per_seed", []),
                  "degraded_prompts": rp.get("degraded_prompts", 0)}
        n = int(rp["positions"])
        for name, value, unit in (
                ("top1_agreement", rp["top1"], "fraction"), ("kl_mean", rp["kl"], "nats"),
                ("blocks_skipped_per_token", rp["blocks_worth"], "blocks"),
                ("static_top1_agreement", st["top1"], "fraction"), ("static_kl_mean", st["kl"], "nats"),
                ("top1_agreement_vs_static", r["router_minus_best_static_top1"], "fraction points"),
                ("kl_mean_vs_static", rp["kl"] - st["kl"], "nats"),
                ("random_top1_agreement", r["random"]["top1"], "fraction"),
                ("router_ms_per_token", rp["router_ms_per_token"], "ms")):
            builder.add_metric(cid, name, float(value), n=n, unit=unit, engine="reference", mode=CURVE_MODE,
                               params=params)
        added.append(cid)
    for p in curve.get("speed", []):
        target = next((t for t, s in sorted(chosen.items()) if s == p["sensitivity"]), None)
        cid = point_id(SPEED_MODE, target, p["sensitivity"])
        params = {"target_blocks_worth": target, "raw_sensitivity": p["sensitivity"],
                  "off_ms_per_token": p.get("off_ms_per_token")}
        n = int(p["pairs"])
        kw = dict(n=n, engine="reference", mode=SPEED_MODE, params=params)
        builder.add_metric(cid, "speedup_vs_off", float(p["speedup"]), ci=(p["speedup_lo"], p["speedup_hi"]),
                           unit="x", samples=p.get("pair_ratios"), **kw)
        builder.add_metric(cid, "ideal_speedup", float(p["ideal_speedup"]), unit="x", **kw)
        builder.add_metric(cid, "blocks_skipped_per_token", float(p["blocks_worth"]), unit="blocks", **kw)
        builder.add_metric(cid, "router_ms_per_token", float(p["router_ms_per_token"]), unit="ms", **kw)
        added.append(cid)
    return added


def curve_from_record(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The curve (the command's JSON shape, as far as the tables read it) that ``record_curve``
    wrote into ``record``, or None when the record holds none."""
    configs = record["configurations"]
    rows, speed = [], []
    for cid in sorted(configs):
        c = configs[cid]
        m = {k: v["value"] for k, v in c["metrics"].items()}
        params = c["params"]
        if c["mode"] == CURVE_MODE and all(k in m for k in _CURVE_METRICS):
            best = params.get("best_static", "static")
            static = dict(params.get("static") or {})
            static[best] = {"top1": m["static_top1_agreement"], "kl": m["static_kl_mean"]}
            rows.append({"target_blocks_worth": params.get("target_blocks_worth"),
                         "router": {"sensitivity": params["raw_sensitivity"], "top1": m["top1_agreement"],
                                    "kl": m["kl_mean"], "blocks_worth": m["blocks_skipped_per_token"],
                                    "router_ms_per_token": m.get("router_ms_per_token"),
                                    "positions": c["metrics"]["top1_agreement"]["n"]},
                         "static": static, "best_static": best,
                         "router_minus_best_static_top1": m["top1_agreement_vs_static"],
                         "random": {"top1": m["random_top1_agreement"]}})
        elif c["mode"] == SPEED_MODE and "speedup_vs_off" in m and "ideal_speedup" in m:
            sp = c["metrics"]["speedup_vs_off"]
            lo, hi = sp["ci"] if sp.get("ci") else (sp["value"], sp["value"])
            speed.append({"sensitivity": params["raw_sensitivity"], "speedup": sp["value"], "speedup_lo": lo,
                          "speedup_hi": hi, "ideal_speedup": m["ideal_speedup"],
                          "blocks_worth": m.get("blocks_skipped_per_token"),
                          "router_ms_per_token": m.get("router_ms_per_token"), "pairs": sp["n"]})
    if not rows:
        return None
    meta = dict(record.get("extra", {}).get(EXTRA_KEY) or {})
    machine = record.get("machine", {}).get("fingerprint", "?")
    return {**meta, "model": record["model"]["name"], "held_out": rows, "speed": speed,
            "command": meta.get("command", "pytest suites/test_router_curve.py"),
            "load_note": f"From run record {record['run_id']} (machine {machine}).", "run_id": record["run_id"]}


def record_curves(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The curve of the newest record per model, machine and held-out prompt set (source, count
    and tokens) among ``records``, in a fixed order (the board is byte for byte reproducible)."""
    newest: dict[tuple, tuple[Any, dict[str, Any]]] = {}
    for record in records:
        curve = curve_from_record(record)
        if curve is None:
            continue
        key = (record["model"]["name"], record["machine"]["fingerprint"], str(curve.get("held_out_source")),
               str(curve.get("held_out_prompts")), str(curve.get("tokens")))
        if key not in newest or record_sort_key(record) > newest[key][0]:
            newest[key] = (record_sort_key(record), curve)
    return [newest[k][1] for k in sorted(newest)]
