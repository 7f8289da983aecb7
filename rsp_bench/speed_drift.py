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
* the gate allows what a new session's median may differ from the baseline's own session's at 99%,
  given only that sigma and its degrees of freedom: ``t(dof, 0.995) * sqrt(2) * sigma`` on the log
  scale (a prediction bound: two sessions' medians differ with variance 2 sigma^2, and a sigma read
  from few sessions is itself uncertain, hence Student's t). With 4 dof that is 6.5 sigma, with 2 dof
  14 sigma: few sessions know little. Stop 62 first allowed a flat 3 sigma; its third fresh-clone CI
  read the reference over transformers 18.1% down against an allowance of 17.6% (4 dof).

The run being judged never counts (its ``run_id`` is left out), nor partial or contended runs.

**A machine kind with no two sessions yet borrows** (stop 63). Its first speed baseline is three
back-to-back runs, which show no between-session drift; judged with the policy's 10% alone, its next
CI session would go red on the same host drift that failed stop 61 on another kind. So a figure with
no drift of its own on this machine kind takes the widest allowance any other machine kind with
runs in two sessions shows for it (same weights, run size and engine under test), and says which
kind it was read from. A kind's own drift, once published, replaces the borrowed one. With no kind
showing any, the drift is unknown and the gate says so; the baseline's own spread and the policy's
tolerance then decide, as before.

Must NOT import torch, transformers, reference_engine or rsp_bench.gate (the gate uses this).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

__all__ = ["SESSION_GAP_S", "DRIFT_LEVEL", "Drift", "t_995", "sessions", "session_drift"]

# A session of this project is one machine for up to three hours, its runs minutes apart; two
# sessions are hours apart. An hour splits them without splitting a baseline's three runs.
SESSION_GAP_S = 3600.0
# Two-sided 99%: an unchanged run's session lands outside about 1 time in 100.
DRIFT_LEVEL = 0.99
# Student's t at 0.995 by degrees of freedom (tables; the gate may not import scipy); between two
# rows the smaller dof's (larger) value, past the last the normal's.
_T_995 = ((1, 63.657), (2, 9.925), (3, 5.841), (4, 4.604), (5, 4.032), (6, 3.707), (7, 3.499), (8, 3.355),
          (9, 3.250), (10, 3.169), (12, 3.055), (15, 2.947), (20, 2.845), (30, 2.750), (60, 2.660))
_Z_995 = 2.576


def t_995(dof: int) -> float:
    """Student's t quantile at 0.995 for ``dof`` >= 1 degrees of freedom (conservatively rounded down in dof)."""
    value = _T_995[0][1]
    for d, t in _T_995:
        if dof >= d:
            value = t
    return value if dof <= _T_995[-1][0] else _Z_995


@dataclass
class Drift:
    """Per (configuration, metric): the session-to-session standard deviation on a log scale
    (``sigma``) and its degrees of freedom; ``basis`` says what it was read from."""

    sigma: dict[tuple[str, str], float] = field(default_factory=dict)
    dof: dict[tuple[str, str], int] = field(default_factory=dict)
    basis: str = "no published runs"
    # (configuration, metric) -> the machine kind (fingerprint) whose drift this kind borrowed
    borrowed: dict[tuple[str, str], str] = field(default_factory=dict)

    def bound(self, config: str, metric: str) -> float:
        """The prediction bound on the log scale (0 when unknown)."""
        sigma = self.sigma.get((config, metric))
        return 0.0 if sigma is None else t_995(self.dof[(config, metric)]) * math.sqrt(2.0) * sigma

    def allowance(self, config: str, metric: str, direction: str) -> float:
        """The relative change in the worse direction that the drift alone explains at DRIFT_LEVEL
        (0 when unknown): the prediction bound of the module's docstring."""
        bound = self.bound(config, metric)
        return (1.0 - math.exp(-bound)) if direction == "higher" else (math.exp(bound) - 1.0)

    def describe(self, config: str, metric: str) -> str:
        """"N dof", and the machine kind it was borrowed from where it was."""
        kind = self.borrowed.get((config, metric))
        dof = f"{self.dof[(config, metric)]} dof"
        return dof if kind is None else f"{dof}, borrowed from machine kind {kind}"


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


def _comparable(record: Mapping[str, Any], like: Mapping[str, Any], any_machine: bool = False) -> bool:
    extra = record.get("extra", {})
    return ((any_machine or record["machine"]["fingerprint"] == like["machine"]["fingerprint"])
            and record["model"].get("weights_sha256") == like["model"].get("weights_sha256")
            and bool(record["quick"]) == bool(like["quick"])
            and _engine(record) == _engine(like)
            and record["run_id"] != like["run_id"]
            and not extra.get("partial") and not extra.get("contended")
            and bool(extra.get("code_digest")))


def session_drift(records: Iterable[Mapping[str, Any]], like: Mapping[str, Any], metrics: Iterable[str]) -> Drift:
    """The drift of ``metrics`` (names) for runs like ``like`` (same machine kind, weights, size
    and engine under test), from ``records`` (published run records; ``like`` itself is skipped).
    A figure with no drift on this machine kind borrows the widest another kind shows (the module's
    docstring)."""
    wanted = set(metrics)
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        if _comparable(record, like, any_machine=True):
            by_kind.setdefault(str(record["machine"]["fingerprint"]), []).append(record)
    own_kind = str(like["machine"]["fingerprint"])
    drift = _kind_drift(by_kind.pop(own_kind, []), wanted)
    lent: dict[tuple[str, str], tuple[float, float, int, str]] = {}
    for kind, kind_records in sorted(by_kind.items()):
        other = _kind_drift(kind_records, wanted)
        for key, sigma in other.sigma.items():
            bound = other.bound(*key)
            if key not in drift.sigma and (key not in lent or bound > lent[key][0]):
                lent[key] = (bound, sigma, other.dof[key], kind)
    for key, (_, sigma, dof, kind) in lent.items():
        drift.sigma[key], drift.dof[key], drift.borrowed[key] = sigma, dof, kind
    if lent:
        kinds = sorted({kind for *_, kind in lent.values()})
        drift.basis += (f"; {len(lent)} figure(s) with none here borrow the widest drift of another machine kind "
                        f"({', '.join(kinds)})")
    return drift


def _kind_drift(records: Iterable[Mapping[str, Any]], wanted: set[str]) -> Drift:
    """The drift of ``wanted`` metrics among ``records`` of one machine kind (already filtered)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
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
