"""The unit router's quality/speed curve as a leaderboard table.

``rsp-bench router-curve`` (rsp_bench/router_curve_measure.py) writes ``results/router_curve.json``: on prompts nobody tuned
to, per sensitivity, the router's teacher-forced top-1 agreement and KL at the weight bytes it
actually skipped, static removal (several rankings) and random removal interpolated at the same
bytes, and interleaved speed-ups against the ideal from the bytes not read. This module reads
that file and turns it into one table (headers and rows); the leaderboard renders it.

Must NOT import torch, transformers or reference_engine (the leaderboard imports it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from rsp_bench.errors import HarnessInputError

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
    return (f"Unit router vs static and random removal at equal weight bytes ({curve.get('model', '?')}, "
            f"{curve.get('held_out_prompts', '?')} {prompts} x {curve.get('tokens', '?')} tokens, "
            f"{curve.get('kernel', '?')} kernel, {curve.get('threads', '?')} thread(s))")


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
            f"{rp['router_ms_per_token']:.2f}",
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
