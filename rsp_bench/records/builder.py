"""Building a run record: run ids, configuration ids, a fresh record, and ``RunRecordBuilder``.

The pytest plugin fills one ``RunRecordBuilder`` per session; ``build()`` validates
through ``rsp_bench.records.schema`` and ``write()`` goes through ``rsp_bench.records.files``.

Must NOT import torch, transformers or reference_engine; of rsp_bench only
``rsp_bench.errors`` and the ``schema``, ``environment`` and ``files`` modules of
``rsp_bench.records`` (none of which may import this one).
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
import os
import secrets
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from rsp_bench.errors import RecordError
from rsp_bench.records.environment import _AUTO, git_commit, machine_info, versions
from rsp_bench.records.files import write_record
from rsp_bench.records.schema import SCHEMA, SCHEMA_VERSION, validate_record

__all__ = ["RunRecordBuilder", "new_record", "new_run_id", "parse_config_id"]


def _utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def new_run_id(now: _dt.datetime | None = None) -> str:
    """A run id: UTC timestamp (sortable) plus 6 random hex digits (two runs in one second)."""
    now = now or _utc_now()
    return now.astimezone(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def parse_config_id(config_id: str) -> tuple[str, str, float | None, dict[str, Any]]:
    """Split a configuration id into (engine, mode, sensitivity, params).

    ``"reference/lossy/s=0.50"`` -> ``("reference", "lossy", 0.5, {})``;
    ``"static-shortgpt/k=3"`` -> ``("static-shortgpt", "default", None, {"k": 3})``.
    The first segment is the engine, the first later segment without ``=`` is the mode
    ("default" when there is none), ``s=`` is the sensitivity and other ``key=value``
    segments become params (numbers parsed). Used only when the caller does not say.
    """
    if not isinstance(config_id, str) or not config_id.strip() or config_id != config_id.strip():
        raise RecordError(f"configuration id {config_id!r} is empty or has surrounding spaces")
    parts = config_id.split("/")
    if any(not p for p in parts):
        raise RecordError(f"configuration id {config_id!r} has an empty segment")
    engine, mode, sensitivity, params = parts[0], None, None, {}
    for part in parts[1:]:
        key, eq, raw = part.partition("=")
        if not eq:
            if mode is None:
                mode = part
            else:
                params.setdefault("variant", part)
            continue
        value: Any = raw
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                continue
        if key == "s":
            if not isinstance(value, (int, float)):
                raise RecordError(f"configuration id {config_id!r}: sensitivity {raw!r} is not a number")
            sensitivity = float(value)
        else:
            params[key] = value
    return engine, mode or "default", sensitivity, params


def new_record(
    *,
    model_name: str = "",
    model_path: str = "",
    weights_sha256: str = "",
    quick: bool = False,
    suites: Iterable[str] = (),
    machine: Mapping[str, Any] | None = None,
    versions_info: Mapping[str, Any] | None = None,
    commit: str | None = _AUTO,
    run_id: str | None = None,
    created_utc: str | None = None,
) -> dict[str, Any]:
    """A fresh, empty record (no configurations yet), with machine, versions and commit filled in.

    It is not valid until the model name is set (baselines are keyed on it); the
    builder's ``build()`` checks that.
    """
    now = _utc_now()
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id or new_run_id(now),
        "created_utc": created_utc or now.isoformat(timespec="seconds"),
        "wall_time_s": 0.0,
        "quick": bool(quick),
        "suites": list(suites),
        "model": {"name": model_name, "path": model_path, "weights_sha256": weights_sha256},
        "machine": dict(machine) if machine is not None else machine_info(),
        "versions": dict(versions_info) if versions_info is not None else versions(),
        "git_commit": git_commit() if commit is _AUTO else commit,
        "configurations": {},
        "extra": {},
    }


def _check_number(value: Any, what: str) -> float:
    # bool is an int subclass; True as a metric value is always a bug upstream.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise RecordError(f"{what} must be finite, got {value!r}")
    return float(value)


class RunRecordBuilder:
    """Collects one session's results into a run record; the pytest plugin owns one.

    Typical use::

        b = RunRecordBuilder(quick=True)
        b.set_model("SmolLM2-135M-Instruct", "/path/model.gguf", sha)
        b.add_suite("equivalence")
        b.add_metric("reference/lossy/s=0.50", "top1_agreement", 0.91, n=640,
                     ci=(0.89, 0.93), unit="fraction")
        path = b.write("results")

    ``wall_time_s`` is measured from construction to ``build()`` unless given.
    """

    def __init__(self, **record_fields: Any) -> None:
        """Accepts the keyword arguments of :func:`new_record`."""
        self._started = time.monotonic()
        self._record = new_record(**record_fields)

    @property
    def record(self) -> dict[str, Any]:
        """The record being built (live; use :meth:`build` for a validated copy)."""
        return self._record

    @property
    def run_id(self) -> str:
        return self._record["run_id"]

    def set_model(self, name: str, path: str = "", weights_sha256: str = "") -> None:
        """Name the model under test; ``name`` keys the baseline file."""
        if not isinstance(name, str) or not name.strip():
            raise RecordError(f"model name must be a non-empty string, got {name!r}")
        self._record["model"] = {"name": name, "path": str(path), "weights_sha256": str(weights_sha256)}

    def set_quick(self, quick: bool) -> None:
        self._record["quick"] = bool(quick)

    def add_suite(self, suite: str) -> None:
        """Note that a suite ran (kept in first-seen order, no duplicates)."""
        if not isinstance(suite, str) or not suite:
            raise RecordError(f"suite name must be a non-empty string, got {suite!r}")
        if suite not in self._record["suites"]:
            self._record["suites"].append(suite)

    def set_extra(self, key: str, value: Any) -> None:
        """Free-form additions (must be JSON-serializable); the schema ignores their content."""
        self._record["extra"][key] = value

    def add_configuration(
        self,
        config_id: str,
        *,
        engine: str | None = None,
        mode: str | None = None,
        sensitivity: float | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Declare (or fetch) a configuration; values not given are parsed from ``config_id``.

        Declaring an existing configuration again with a different engine, mode or
        sensitivity is an error: two suites disagreeing about what a config id means
        would silently mix their figures.
        """
        p_engine, p_mode, p_sens, p_params = parse_config_id(config_id)
        wanted = {
            "engine": engine if engine is not None else p_engine,
            "mode": mode if mode is not None else p_mode,
            "sensitivity": _check_sensitivity(sensitivity if sensitivity is not None else p_sens, repr(config_id)),
        }
        configs = self._record["configurations"]
        if config_id in configs:
            existing = configs[config_id]
            for key, value in wanted.items():
                given = {"engine": engine, "mode": mode, "sensitivity": sensitivity}[key]
                if given is not None and existing[key] != value:
                    raise RecordError(
                        f"configuration {config_id!r} already has {key}={existing[key]!r}, not {value!r}"
                    )
            if params:
                existing["params"].update(dict(params))
            return existing
        merged = dict(p_params)
        merged.update(dict(params or {}))
        config = {**wanted, "params": merged, "metrics": {}}
        configs[config_id] = config
        return config

    def add_metric(
        self,
        config_id: str,
        name: str,
        value: float,
        n: int,
        ci: Sequence[float] | None = None,
        unit: str = "",
        samples: Sequence[float] | None = None,
        *,
        engine: str | None = None,
        mode: str | None = None,
        sensitivity: float | None = None,
        params: Mapping[str, Any] | None = None,
        replace: bool = False,
    ) -> None:
        """Record one metric of one configuration.

        ``n`` is the sample size the value was computed from (prompts, tokens, pairs),
        ``ci`` a (lo, hi) confidence interval or None, ``samples`` raw repeated
        measurements (timings) that the gate's significance test uses. Adding the same
        metric twice raises unless ``replace`` is true.
        """
        if not isinstance(name, str) or not name:
            raise RecordError(f"metric name must be a non-empty string, got {name!r}")
        where = f"metric {name!r} of {config_id!r}"
        if not isinstance(unit, str):
            raise RecordError(f"{where}: unit must be a string, got {unit!r}")
        metric: dict[str, Any] = {
            "value": _check_number(value, f"{where}: value"),
            "n": _check_count(n, f"{where}: n"),
            "ci": _check_ci(ci, f"{where}: ci"),
            "unit": unit,
        }
        if samples is not None:
            metric["samples"] = [_check_number(s, f"{where}: samples[{i}]") for i, s in enumerate(samples)]
        config = self.add_configuration(
            config_id, engine=engine, mode=mode, sensitivity=sensitivity, params=params
        )
        if name in config["metrics"] and not replace:
            raise RecordError(f"{where} was already recorded ({config['metrics'][name]['value']!r})")
        config["metrics"][name] = metric

    def build(self, wall_time_s: float | None = None) -> dict[str, Any]:
        """A validated deep copy of the record, with the wall time filled in."""
        record = copy.deepcopy(self._record)
        record["wall_time_s"] = (
            round(time.monotonic() - self._started, 3) if wall_time_s is None else float(wall_time_s)
        )
        return validate_record(record, source=f"run record {record['run_id']}")

    def write(self, results_dir: str | os.PathLike[str], wall_time_s: float | None = None) -> Path:
        """Validate and write the record to ``<results_dir>/runs/<run_id>.json`` atomically."""
        return write_record(self.build(wall_time_s), results_dir)


def _check_count(n: Any, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise RecordError(f"{what} must be a positive integer (the sample size), got {n!r}")
    return n


def _check_ci(ci: Any, what: str) -> list[float] | None:
    if ci is None:
        return None
    if isinstance(ci, (str, bytes)) or not isinstance(ci, Sequence) or len(ci) != 2:
        raise RecordError(f"{what} must be [lo, hi] or null, got {ci!r}")
    lo = _check_number(ci[0], f"{what}[0]")
    hi = _check_number(ci[1], f"{what}[1]")
    if lo > hi:
        raise RecordError(f"{what} has lo > hi: {ci!r}")
    return [lo, hi]


def _check_sensitivity(value: Any, what: str) -> float | None:
    if value is None:
        return None
    number = _check_number(value, f"sensitivity of {what}")
    if not 0.0 <= number <= 1.0:
        raise RecordError(f"sensitivity of {what} must be in [0, 1], got {value!r}")
    return number
