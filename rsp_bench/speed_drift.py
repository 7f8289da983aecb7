"""Between-session drift of speed figures on one kind of machine, read from the published runs.

Runs made back to back on one machine agree within a few percent, and a stored speed baseline
keeps that spread (``rsp_bench.baselines``). The same engine code on the same kind of machine in
another session (a fresh CI runner, another host's load) moves more: in ``results/runs``, on the
2-core AMD runner, a ratio of two engines with different bottlenecks (llama.cpp's Q4_1 over the
reference engine, the reference over transformers) moved 16-23% between two sessions of one
code version, while a ratio inside one engine (pruned over unpruned) moved under 4%. CI runs on
a fresh runner every time, so a gate that knows only the back-to-back spread goes red on the
runner (it did: stop 61's submission, a llama.cpp speed ratio past 10% with no code change).

This module measures that drift per (configuration, metric), from the published run records
of the machine kind, engine under test and run size a baseline serves:

* records are grouped by engine code (``extra.code_digest``), and each group into **sessions**
  (runs less than ``SESSION_GAP_S`` apart);
* for every group with two or more sessions, each session's median of the figure, on a log
  scale, is compared with its group's mean: the pooled standard deviation of those deviations
  (degrees of freedom: sessions minus one, summed over groups) is the drift ``sigma``;
* the gate allows ``DRIFT_SIGMAS`` sigmas: a change of a "higher is better" figure by a factor
  below ``exp(-3 sigma)`` (above ``exp(3 sigma)`` for "lower") can still regress.

The run being judged never counts (its ``run_id`` is left out), nor partial or contended runs.
With no group of two sessions the drift is unknown and the gate says so; the baseline's own
spread and the policy's tolerance then decide, as before.

Must NOT import torch, transformers, reference_engine or rsp_bench.gate (the gate uses this).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

__all__ = ["SESSION_GAP_S", "DRIFT_SIGMAS", "Drift", "sessions", "session_drift"]

# A session of this project is one machine for up to three hours, its runs minutes apart; two
# sessions are hours apart. An hour splits them without splitting a baseline's three runs.
SESSION_GAP_S = 3600.0
# Three sigmas: an unchanged run lands outside in about 3 of 1,000 sessions (normal on a log scale).
DRIFT_SIGMAS = 3.0


@dataclass
class Drift:
    """Per (configuration, metric): the session-to-session standard deviation on a log scale
    (``sigma``) and its degrees of freedom; ``basis`` says what it was read from."""

    sigma: dict[tuple[str, str], float] = field(default_factory=dict)
    dof: dict[tuple[str, str], int] = field(default_factory=dict)
    basis: str = "no published runs"

    def allowance(self, config: str, metric: str, direction: str) -> float:
        """The relative change in the worse direction that the drift alone explains (0 when unknown)."""
        sigma = self.sigma.get((config, metric))
        if sigma is None:
            return 0.0
        return (1.0 - math.exp(-DRIFT_SIGMAS * sigma)) if direction == "higher" else (math.exp(DRIFT_SIGMAS * sigma) - 1.0)


def _time(record: Mapping[str, Any]) -> _dt.datetime:
    return _dt.datetime.fromisoformat(str(record["created_utc"]).replace("Z", "+00:00"))


def sessions(records: Iterable[Mapping[str, Any]], gap_s: float = SESSION_GAP_S) -> list[list[Mapping[str, Any]]]:
    """Records in time order, cut wherever two consecutive ones are more than ``gap_s`` apart."""
    ordered = sorted(records, key=_time)
    out: list[list[Mapping[str, Any]]] = []
    for record in ordered:
        if out and (_time(record) - _time(out[-1][-1])).total_seconds() <= gap_s:
            out[-1].append(record)
        else:
            out.append([record])
    return out


def _engine(record: Mapping[str, Any]) -> str:
    return str(record.get("extra", {}).get("engine_under_test") or "reference")


def _comparable(record: Mapping[str, Any], like: Mapping[str, Any]) -> bool:
    extra = record.get("extra", {})
    return (record["machine"]["fingerprint"] == like["machine"]["fingerprint"]
            and record["model"].get("weights_sha256") == like["model"].get("weights_sha256")
            and bool(record["quick"]) == bool(like["quick"])
            and _engine(record) == _engine(like)
            and record["run_id"] != like["run_id"]
            and not extra.get("partial") and not extra.get("contended")
            and bool(extra.get("code_digest")))


def session_drift(records: Iterable[Mapping[str, Any]], like: Mapping[str, Any], metrics: Iterable[str]) -> Drift:
    """The drift of ``metrics`` (names) for runs like ``like`` (same machine kind, weights, size
    and engine under test), from ``records`` (published run records; ``like`` itself is skipped)."""
    wanted = set(metrics)
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        if _comparable(record, like):
            groups.setdefault(str(record["extra"]["code_digest"]), []).append(record)
    squares: dict[tuple[str, str], float] = {}
    dof: dict[tuple[str, str], int] = {}
    used_groups = used_sessions = 0
    for group in groups.values():
        cut = sessions(group)
        if len(cut) < 2:
            continue
        used_groups += 1
        used_sessions += len(cut)
        keys = {(cid, m) for s in cut for r in s for cid, conf in r["configurations"].items()
                for m in conf["metrics"] if m in wanted}
        for key in keys:
            medians = []
            for s in cut:
                values = [float(r["configurations"][key[0]]["metrics"][key[1]]["value"]) for r in s
                          if key[1] in r["configurations"].get(key[0], {}).get("metrics", {})]
                values = [v for v in values if v > 0 and math.isfinite(v)]
                if values:
                    medians.append(math.log(statistics.median(values)))
            if len(medians) < 2:
                continue
            mean = statistics.fmean(medians)
            squares[key] = squares.get(key, 0.0) + sum((x - mean) ** 2 for x in medians)
            dof[key] = dof.get(key, 0) + len(medians) - 1
    sigma = {key: math.sqrt(squares[key] / dof[key]) for key in squares}
    basis = (f"{used_sessions} sessions of {used_groups} engine code version(s) on this machine kind"
             if used_groups else "no engine code version with runs in two sessions on this machine kind")
    return Drift(sigma=sigma, dof=dof, basis=basis)
