"""Run record files: writing, reading and listing records under ``<results>/runs/``.

Writing is atomic, through ``rsp_bench.storage``; every record read or written is validated.

Must NOT import torch, transformers or reference_engine; of rsp_bench only
``rsp_bench.errors``, ``rsp_bench.storage`` and ``rsp_bench.records.schema``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any, Mapping

from rsp_bench.errors import RecordError
from rsp_bench.records.schema import RUNS_SUBDIR, _parse_utc, validate_record
from rsp_bench.storage import atomic_write_json

__all__ = ["write_record", "load_record", "record_paths", "latest_records", "record_sort_key"]


def write_record(record: Mapping[str, Any], results_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Validate ``record`` and write it to ``<results_dir>/runs/<run_id>.json`` atomically.

    Refuses to overwrite an existing record unless asked: run ids are unique, so a clash
    means two writers think they own one run.
    """
    record = validate_record(dict(record), source=f"run record {record.get('run_id')!r}")
    path = Path(results_dir) / RUNS_SUBDIR / f"{record['run_id']}.json"
    if path.exists() and not overwrite:
        raise RecordError(f"{path}: a run record with run_id {record['run_id']!r} already exists")
    return atomic_write_json(path, record)


def load_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a run record (or a baseline, which is a run record)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordError(f"{path}: no such run record") from None
    except IsADirectoryError:
        raise RecordError(f"{path}: is a directory, not a run record file") from None
    except UnicodeDecodeError as exc:
        raise RecordError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise RecordError(f"{path}: cannot read run record ({exc.strerror})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    return validate_record(obj, source=path)


def record_sort_key(record: Mapping[str, Any]) -> tuple[_dt.datetime, str]:
    """Chronological order of records: creation time, then run id to break ties."""
    created = _parse_utc(str(record.get("created_utc", ""))) or _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)
    return created, str(record.get("run_id", ""))


def record_paths(results_dir: str | os.PathLike[str]) -> list[Path]:
    """Run record files under ``<results_dir>/runs/``, sorted by name (temp files excluded)."""
    runs = Path(results_dir) / RUNS_SUBDIR
    if not runs.is_dir():
        return []
    return sorted(p for p in runs.glob("*.json") if p.is_file() and not p.name.startswith("."))


def latest_records(results_dir: str | os.PathLike[str], limit: int | None = None) -> list[dict[str, Any]]:
    """All valid run records under ``<results_dir>/runs/``, newest first (at most ``limit``).

    A malformed record raises RecordError naming it rather than being skipped: a
    leaderboard silently missing a run is worse than a loud failure.
    """
    records = [load_record(p) for p in record_paths(results_dir)]
    records.sort(key=record_sort_key, reverse=True)
    return records if limit is None else records[:limit]
