"""Baselines: the committed run records a new run is gated against.

Two kinds, because quality and speed travel differently:

* a **quality baseline** per model weights and engine under test,
  ``<baselines>/<model>__<weights sha256[:12]>__<engine>.json``: greedy figures are
  deterministic (watermark pinned, float summation order measured not to flip them:
  ``scripts/measure_float_order.py``), so they are gated on any machine;
* a **speed baseline** per model, engine and machine fingerprint,
  ``<baselines>/<model>__<weights>__<engine>__<fingerprint>.speed.json``: timings are
  only comparable on one kind of machine. Where none exists for this machine, speed is
  reported, not gated.

Which metrics are machine-bound is decided here, once (``MACHINE_METRICS``). The engine under
test is ``extra.engine_under_test`` of the record (``--rsp-engine``; "reference" when absent),
so baselining ``--rsp-engine skip-odd`` writes skip-odd's files and leaves the reference
engine's byte for byte as they were.

A baseline *is* a run record (schema version 1, configurations cut to one scope's metrics)
with ``extra.baseline_written_utc``, ``extra.baseline_source_run_id`` and
``extra.baseline_written_by`` added, so the gate, the leaderboard and ``load_record`` read it
unchanged. A baseline changes only when asked (``rsp-bench baseline update`` or
``--rsp-update-baseline``), always atomically through ``rsp_bench.storage``.

Must NOT import torch, transformers, reference_engine or rsp_bench.gate (the gate imports this).
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import fnmatch
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from rsp_bench.errors import HarnessInputError, RecordError
from rsp_bench.records import git_commit, latest_records, load_record, validate_record
from rsp_bench.storage import atomic_write_json

__all__ = [
    "DEFAULT_BASELINES_DIR",
    "MACHINE_METRICS",
    "Baselines",
    "metric_scope",
    "engine_under_test",
    "quality_baseline_path",
    "speed_baseline_path",
    "split_by_scope",
    "load_baseline",
    "update_baseline",
    "list_baselines",
    "configure_baseline_parser",
    "run_baseline",
]

DEFAULT_BASELINES_DIR = Path("results") / "baselines"

# Metrics read off a clock (or derived from one): comparable only on the same kind of
# machine. Everything else (quality, bypass accounting, trace-derived projections) is a
# deterministic function of weights, prompts and configuration.
MACHINE_METRICS = (
    "speedup_*", "decode_tokens_per_s*", "ttft_ms*", "tpot_ms*", "router_ms_per_token*",
    "router_step_share*", "achieved_bandwidth_gbs*", "roofline_*", "speedup_over_ideal*",
    "lossless_speedup*", "*_measured", "gpu_*", "degradation_check_ms*", "load_*",
)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _sanitize(text: str, what: str) -> str:
    # Model names may be repo ids ("HuggingFaceTB/SmolLM2-135M-Instruct") or contain
    # spaces; a file name must not create folders or hide itself with a leading dot.
    cleaned = _UNSAFE.sub("-", text).strip("-.")
    if not cleaned:
        raise RecordError(f"{what} {text!r} has no characters usable in a file name")
    return cleaned


def metric_scope(name: str) -> str:
    """``"machine"`` for a timing metric (baselined per machine), ``"model"`` otherwise."""
    return "machine" if any(fnmatch.fnmatchcase(name, g) for g in MACHINE_METRICS) else "model"


def engine_under_test(record: Mapping[str, Any]) -> str:
    """The engine a record was made for (``--rsp-engine``); records from before the field
    existed were all made for the reference engine."""
    extra = record.get("extra") if isinstance(record, Mapping) else None
    name = extra.get("engine_under_test") if isinstance(extra, Mapping) else None
    return str(name) if name else "reference"


def _stem(record: Mapping[str, Any]) -> str:
    try:
        model = record["model"]["name"]
        weights = str(record["model"].get("weights_sha256") or "")
    except (KeyError, TypeError, AttributeError):
        raise RecordError(
            f"run record {record.get('run_id') if isinstance(record, Mapping) else record!r} has no model.name"
        ) from None
    digest = weights[:12] if weights else "unknown-weights"
    return (f"{_sanitize(str(model), 'model name')}__{_sanitize(digest, 'weights digest')}__"
            f"{_sanitize(engine_under_test(record), 'engine name')}")


def quality_baseline_path(baselines_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> Path:
    """Where the quality baseline for ``record``'s weights and engine lives (may not exist)."""
    return Path(baselines_dir) / f"{_stem(record)}.json"


def speed_baseline_path(baselines_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> Path:
    """Where the speed baseline for ``record``'s weights, engine and machine lives (may not exist)."""
    try:
        fingerprint = record["machine"]["fingerprint"]
    except (KeyError, TypeError):
        raise RecordError(f"run record {record.get('run_id')!r} has no machine.fingerprint") from None
    return Path(baselines_dir) / f"{_stem(record)}__{_sanitize(str(fingerprint), 'machine fingerprint')}.speed.json"


def split_by_scope(record: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The record cut in two: model-scope metrics, and machine-scope metrics (None when the
    record holds none). Configurations left with no metric are dropped from that half."""
    halves = []
    for scope in ("model", "machine"):
        half = copy.deepcopy(dict(record))
        configs = {}
        for cid, conf in record["configurations"].items():
            metrics = {m: v for m, v in conf["metrics"].items() if metric_scope(m) == scope}
            if metrics:
                configs[cid] = {**copy.deepcopy(conf), "metrics": copy.deepcopy(metrics)}
        half["configurations"] = configs
        halves.append(half)
    quality, speed = halves
    return quality, (speed if speed["configurations"] else None)


@dataclass
class Baselines:
    """What a run is gated against: its quality baseline and, on a known machine, its speed
    baseline (either may be None), and where each was looked for."""

    quality: dict[str, Any] | None
    speed: dict[str, Any] | None
    quality_path: Path
    speed_path: Path

    def merged(self) -> dict[str, Any] | None:
        """One record holding both halves (the gate compares metric by metric)."""
        if self.quality is None and self.speed is None:
            return None
        base = copy.deepcopy(self.quality if self.quality is not None else self.speed)
        if self.quality is not None and self.speed is not None:
            for cid, conf in self.speed["configurations"].items():
                target = base["configurations"].setdefault(cid, {**copy.deepcopy(conf), "metrics": {}})
                target["metrics"].update(copy.deepcopy(conf["metrics"]))
            base["machine"] = copy.deepcopy(self.speed["machine"])
        return base


def _check_same(path: Path, baseline: Mapping[str, Any], record: Mapping[str, Any], fields: tuple[tuple[str, str], ...]) -> None:
    for field, key in fields:
        if str(baseline[field].get(key) or "") != str(record[field].get(key) or ""):
            raise RecordError(
                f"{path}: field {field}.{key} is {baseline[field].get(key)!r} but the run has "
                f"{record[field].get(key)!r} (two names map to one baseline file; rename the model)")
    if engine_under_test(baseline) != engine_under_test(record):
        raise RecordError(f"{path}: made for engine {engine_under_test(baseline)!r}, the run is for "
                          f"{engine_under_test(record)!r}")


def load_baseline(baselines_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> Baselines:
    """The baselines matching ``record`` (each half None when there is none yet).

    A missing baseline is normal (a new model, engine or machine kind) and the caller decides
    whether that warns or fails; a present but malformed one raises RecordError naming the file.
    """
    qpath, spath = quality_baseline_path(baselines_dir, record), speed_baseline_path(baselines_dir, record)
    quality = speed = None
    if qpath.exists():
        quality = load_record(qpath)
        _check_same(qpath, quality, record, (("model", "name"), ("model", "weights_sha256")))
    if spath.exists():
        speed = load_record(spath)
        _check_same(spath, speed, record, (("model", "name"), ("model", "weights_sha256"), ("machine", "fingerprint")))
    return Baselines(quality, speed, qpath, spath)


def update_baseline(
    record_path_or_obj: str | os.PathLike[str] | Mapping[str, Any],
    baselines_dir: str | os.PathLike[str] = DEFAULT_BASELINES_DIR,
) -> list[Path]:
    """Promote a run record to the baselines of its weights and engine (quality) and of its
    machine (speed, when it holds timing metrics); return the paths written.

    The record is validated first, so a bad record never replaces a good baseline. Each file
    says who wrote it: ``extra.baseline_written_utc``, ``extra.baseline_source_run_id`` and
    ``extra.baseline_written_by`` (commit checked out here and hostname). Only the files of
    this record's engine are touched.
    """
    if isinstance(record_path_or_obj, Mapping):
        record = validate_record(copy.deepcopy(dict(record_path_or_obj)),
                                 source=f"run record {record_path_or_obj.get('run_id')!r}")
    else:
        record = load_record(record_path_or_obj)
    if record["extra"].get("partial"):
        raise RecordError(f"run record {record['run_id']!r} is partial ({record['extra']['partial']}); "
                          "a baseline must come from a complete run")
    stamp = {
        "baseline_written_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "baseline_source_run_id": record["run_id"],
        "baseline_written_by": {"git_commit": git_commit(), "hostname": socket.gethostname()},
    }
    quality, speed = split_by_scope(record)
    written = []
    for half, path in ((quality, quality_baseline_path(baselines_dir, record)),
                       (speed, speed_baseline_path(baselines_dir, record))):
        if half is None:
            continue
        half["extra"] = {**dict(half["extra"]), **stamp}
        written.append(atomic_write_json(path, half))
    return written


def list_baselines(baselines_dir: str | os.PathLike[str] = DEFAULT_BASELINES_DIR) -> list[tuple[Path, dict[str, Any]]]:
    """Every baseline under ``baselines_dir`` with its parsed record, sorted by file name."""
    directory = Path(baselines_dir)
    if not directory.is_dir():
        return []
    paths = sorted(p for p in directory.glob("*.json") if p.is_file() and not p.name.startswith("."))
    return [(p, load_record(p)) for p in paths]


# --------------------------------------------------------------------------- CLI glue


def configure_baseline_parser(p: argparse.ArgumentParser) -> None:
    """Sub-commands of ``rsp-bench baseline``: ``update [RECORD]`` and ``show``."""
    sub = p.add_subparsers(dest="baseline_action", metavar="{update,show}", required=True)
    update = sub.add_parser("update", help="promote a run record to the baselines of its weights and engine (quality) and machine (speed)")
    update.add_argument("record", nargs="?", metavar="RECORD",
                        help="run record file (default: the newest under --results)")
    show = sub.add_parser("show", help="list the baselines and who wrote them")
    for q in (update, show):
        q.add_argument("--results", metavar="DIR", default="results", help="results folder (default: results)")
        q.add_argument("--baselines", metavar="DIR", help="baselines folder (default: <results>/baselines)")


def run_baseline(args: argparse.Namespace) -> int:
    """Run ``rsp-bench baseline update|show``; returns the exit code."""
    from tabulate import tabulate  # only the CLI needs it

    baselines_dir = Path(args.baselines) if args.baselines else Path(args.results) / "baselines"
    if args.baseline_action == "update":
        if args.record:
            source: str | Mapping[str, Any] = args.record
        else:
            newest = latest_records(args.results, limit=1)
            if not newest:
                raise RecordError(f"{Path(args.results) / 'runs'}: no run records to promote (pass RECORD)")
            source = newest[0]
        for path in update_baseline(source, baselines_dir):
            written = load_record(path)
            print(f"baseline written: {path} (run {written['run_id']}, model {written['model']['name']!r}, "
                  f"engine {engine_under_test(written)!r}, {len(written['configurations'])} configurations)")
        return 0
    if args.baseline_action == "show":
        entries = list_baselines(baselines_dir)
        if not entries:
            print(f"no baselines under {baselines_dir}")
            return 0
        rows = []
        for path, record in entries:
            extra = record["extra"]
            writer = extra.get("baseline_written_by") or {}
            rows.append([
                path.name,
                record["model"]["name"],
                engine_under_test(record),
                record["machine"]["fingerprint"] if path.name.endswith(".speed.json") else "any (quality)",
                record["machine"]["cpu"] + (f" + {record['machine']['gpu']}" if record["machine"]["gpu"] else ""),
                record["run_id"] + (" (quick)" if record["quick"] else ""),
                (record["git_commit"] or "—")[:12],
                extra.get("baseline_written_utc", "—"),
                (writer.get("git_commit") or "—")[:12] if isinstance(writer, dict) else "—",
                len(record["configurations"]),
            ])
        headers = ["file", "model", "engine", "machine fingerprint", "machine", "run", "run commit", "written (UTC)",
                   "written at commit", "configs"]
        print(tabulate(rows, headers=headers, disable_numparse=True))
        return 0
    raise HarnessInputError(f"unknown baseline action {args.baseline_action!r} (expected update or show)")
