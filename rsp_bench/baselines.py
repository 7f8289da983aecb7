"""Baselines: the committed run records a new run is gated against.

One baseline file per model name and machine fingerprint
(``<baselines>/<model>__<fingerprint>.json``), so CI runners of one kind share a baseline
and a laptop never gates against a server's timings. A baseline *is* a run record
(schema version 1) with ``extra.baseline_written_utc``, ``extra.baseline_source_run_id``
and ``extra.baseline_written_by`` (the commit checked out and the host that promoted it)
added, so the gate, the leaderboard and ``load_record`` read it unchanged.

A baseline changes only when asked (``update_baseline``: ``rsp-bench baseline update`` or
``--rsp-update-baseline``), and always atomically through ``rsp_bench.storage``: a
process killed mid-update leaves the previous baseline whole.

Must NOT import torch, transformers or reference_engine.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import os
import re
import socket
from pathlib import Path
from typing import Any, Mapping

from rsp_bench.errors import HarnessInputError, RecordError
from rsp_bench.records import git_commit, latest_records, load_record, validate_record
from rsp_bench.storage import atomic_write_json

__all__ = [
    "DEFAULT_BASELINES_DIR",
    "baseline_path",
    "load_baseline",
    "update_baseline",
    "list_baselines",
    "configure_baseline_parser",
    "run_baseline",
]

DEFAULT_BASELINES_DIR = Path("results") / "baselines"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _sanitize(text: str, what: str) -> str:
    # Model names may be repo ids ("HuggingFaceTB/SmolLM2-135M-Instruct") or contain
    # spaces; a file name must not create folders or hide itself with a leading dot.
    cleaned = _UNSAFE.sub("-", text).strip("-.")
    if not cleaned:
        raise RecordError(f"{what} {text!r} has no characters usable in a file name")
    return cleaned


def baseline_path(baselines_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> Path:
    """Where the baseline for ``record``'s model and machine kind lives (may not exist yet).

    Two model names that sanitize to the same file name (``a/b`` and ``a-b``) would share
    a path; ``load_baseline`` detects that by checking the name stored inside.
    """
    try:
        model = record["model"]["name"]
        fingerprint = record["machine"]["fingerprint"]
    except (KeyError, TypeError):
        raise RecordError(
            f"run record {record.get('run_id') if isinstance(record, Mapping) else record!r} "
            "has no model.name or machine.fingerprint"
        ) from None
    name = f"{_sanitize(str(model), 'model name')}__{_sanitize(str(fingerprint), 'machine fingerprint')}.json"
    return Path(baselines_dir) / name


def load_baseline(baselines_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The baseline matching ``record``'s model and machine, or None when there is none yet.

    A missing baseline is normal (a new model or machine kind) and the caller warns; a
    present but malformed one raises RecordError naming the file.
    """
    path = baseline_path(baselines_dir, record)
    if not path.exists():
        return None
    baseline = load_record(path)
    for field in ("model", "machine"):
        key = "name" if field == "model" else "fingerprint"
        if baseline[field][key] != record[field][key]:
            raise RecordError(
                f"{path}: field {field}.{key} is {baseline[field][key]!r} but the run has "
                f"{record[field][key]!r} (two names map to one baseline file; rename the model)"
            )
    return baseline


def update_baseline(
    record_path_or_obj: str | os.PathLike[str] | Mapping[str, Any],
    baselines_dir: str | os.PathLike[str] = DEFAULT_BASELINES_DIR,
) -> Path:
    """Promote a run record to the baseline for its model and machine; return the path.

    The record is validated first, so a bad record never replaces a good baseline. The
    file says who wrote it: ``extra.baseline_written_utc``, ``extra.baseline_source_run_id``
    and ``extra.baseline_written_by`` (commit checked out here and hostname); the run's
    own ``git_commit`` and ``machine`` are kept as they were.
    """
    if isinstance(record_path_or_obj, Mapping):
        record = validate_record(copy.deepcopy(dict(record_path_or_obj)),
                                 source=f"run record {record_path_or_obj.get('run_id')!r}")
    else:
        record = load_record(record_path_or_obj)
    baseline = copy.deepcopy(record)
    baseline["extra"] = dict(baseline["extra"])
    baseline["extra"]["baseline_written_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    baseline["extra"]["baseline_source_run_id"] = record["run_id"]
    baseline["extra"]["baseline_written_by"] = {"git_commit": git_commit(), "hostname": socket.gethostname()}
    path = baseline_path(baselines_dir, baseline)
    return atomic_write_json(path, baseline)


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
    update = sub.add_parser("update", help="promote a run record to the baseline for its model and machine")
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
        path = update_baseline(source, baselines_dir)
        written = load_record(path)
        print(f"baseline written: {path} (run {written['run_id']}, model {written['model']['name']!r}, "
              f"machine {written['machine']['fingerprint']}, {len(written['configurations'])} configurations)")
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
                record["machine"]["fingerprint"],
                record["machine"]["cpu"] + (f" + {record['machine']['gpu']}" if record["machine"]["gpu"] else ""),
                record["run_id"] + (" (quick)" if record["quick"] else ""),
                (record["git_commit"] or "—")[:12],
                extra.get("baseline_written_utc", "—"),
                (writer.get("git_commit") or "—")[:12] if isinstance(writer, dict) else "—",
                len(record["configurations"]),
            ])
        headers = ["file", "model", "fingerprint", "machine", "run", "run commit", "written (UTC)",
                   "written at commit", "configs"]
        print(tabulate(rows, headers=headers, disable_numparse=True))
        return 0
    raise HarnessInputError(f"unknown baseline action {args.baseline_action!r} (expected update or show)")
