"""The repeat harness: ``rsp-bench ab --repeat N --power-out FILE --power-name NAME`` runs N
real, independent A/B runs (fresh worker processes each time, the same base and head) and writes
what they decided to one JSON file (results/ab_power.json): counts of slower / inside / faster /
undecided with Wilson intervals, every run's ratios and intervals, the exact command, and the
planted change as a diff (``git diff base head``), so the README's false-alarm rate and power
come from the harness, not from a script or a simulation.

Must NOT import torch or reference_engine; it only repeats ``runner`` and summarises reports.
"""

from __future__ import annotations

import datetime as _dt
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

from rsp_bench.ab.report import ABReport
from rsp_bench.errors import HarnessInputError
from rsp_bench.storage import atomic_write_json


def run_summary(report: ABReport) -> dict[str, Any]:
    """What one run contributes to a power file: its verdict and each metric's interval."""
    return {"verdict": report.speed_verdict, "stopped": report.stopped,
            "rounds": report.settings.get("rounds_run"), "exit_code": report.exit_code(),
            "wall_s": round(report.timing.get("total_s", 0.0), 1),
            "speed_s": round(report.timing.get("speed_s", 0.0), 1),
            "metrics": {k: {"decision": m["decision"], "gated": m["gated"],
                            **{x: m["interval"][x] for x in ("n", "ratio", "lo", "hi")}}
                        for k, m in report.speed.items()},
            "flipped": [f["id"] for f in report.quality.get("flipped", [])] if report.quality else None}


def summarise(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    from rsp_bench.metrics import wilson_interval

    n = len(runs)
    if n == 0:
        raise HarnessInputError("no runs to summarise")
    out: dict[str, Any] = {"n": n}
    for verdict in ("slower", "inside", "faster", "undecided"):
        k = sum(r["verdict"] == verdict for r in runs)
        lo, hi = wilson_interval(k, n)
        out[verdict] = {"count": k, "rate": k / n, "wilson95": [lo, hi]}
    walls = sorted(r["wall_s"] for r in runs)
    out["median_wall_s"] = walls[n // 2] if n % 2 else 0.5 * (walls[n // 2 - 1] + walls[n // 2])
    return out


def update_power_file(path: str | Path, name: str, entry: dict[str, Any]) -> Path:
    """Replace experiment ``name`` in the power file (others kept), atomically."""
    path = Path(path)
    data: dict[str, Any] = {"schema": "rsp-bench-ab-power/1", "experiments": {}}
    if path.exists():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise HarnessInputError(f"--power-out {str(path)!r} exists but is not a power file: {exc}") from None
        data.setdefault("experiments", {})
    data["experiments"][name] = entry
    return atomic_write_json(path, data)


def power_entry(runs: list[dict[str, Any]], reports: list[ABReport], argv: Sequence[str] | None, diff: str | None,
                note: str | None) -> dict[str, Any]:
    first = reports[0]
    from rsp_bench.records.environment import git_commit

    return {"harness_commit": git_commit(Path(__file__).resolve().parent),
            "command": "rsp-bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
            "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "base": {k: first.base.get(k) for k in ("ref", "commit", "label", "url")},
            "head": {k: first.head.get(k) for k in ("ref", "commit", "label", "url")},
            "machine": first.machine, "note": note,
            "settings": {k: first.settings.get(k) for k in ("horizon", "confidence", "budget_s", "min_rounds", "batches",
                                                            "speed_tokens", "threads", "gate_ttft", "mode")},
            "planted_diff": diff, "summary": summarise(runs),
            "quality_first_run": {k: first.quality.get(k) for k in ("exact_match_rate", "top1_agreement", "kl_mean",
                                                                     "failures")} if first.quality else None,
            "flipped_first_run": [{k: f[k] for k in ("id", "index", "first_divergence", "base_text", "head_text")}
                                  for f in first.quality.get("flipped", [])] if first.quality else None,
            "runs": runs}
