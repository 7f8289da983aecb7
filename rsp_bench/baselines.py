"""Baselines: the committed run records a new run is gated against.

Two kinds, because quality and speed travel differently:

* a **quality baseline** per model weights and engine under test,
  ``<baselines>/<model>__<weights sha256[:12]>__<engine>.json``: greedy figures are
  deterministic (watermark pinned, float summation order measured not to flip them:
  ``scripts/measure_float_order.py``), so they are gated on any machine. Except for the
  engines of ``QUALITY_PER_MACHINE``, whose outputs depend on the CPU's instruction set: their
  quality baseline is per machine fingerprint (``...__<engine>__<fingerprint>.quality.json``),
  and the gate judges each figure against the least favourable of every machine that has one,
  the run's own included (``extra.quality_machines`` says which): a new machine is still gated,
  never red for being new, and a known fingerprint running another instruction set (measured:
  an AMD EPYC host without and then with AVX-512) is not red either;
* a **speed baseline** per model, engine and machine fingerprint,
  ``<baselines>/<model>__<weights>__<engine>__<fingerprint>.speed.json``: timings are
  only comparable on one kind of machine and one version of the engine's code. Each update
  on the same machine and code adds its run (the last ``SPEED_RUNS_KEPT``); the baseline
  gates only once it holds ``SPEED_RUNS_NEEDED`` runs, so the gate knows the between-run
  spread and never takes one lucky run for the machine's speed. A baseline made by other
  engine code (``extra.code_digest``) is stale: reported, not gated, and replaced by the
  next update. What back-to-back runs cannot show, the drift between sessions, the gate reads
  from the published runs beside the baselines folder (:meth:`Baselines.drift`). Where none can gate, speed is reported, not gated, and the suites' portable
  speed budgets and ``rsp-bench ab`` judge it.

**One pair per run size.** A quick run (``--rsp-quick``) and a full run draw different prompt
sets, so their quality figures are different measurements: a full run's baselines carry
``.full`` before their suffix (``<...>__<engine>.full.json``, ``...__<fingerprint>.full.speed.json``,
``...__<fingerprint>.full.quality.json``), and each run is gated against its own size only. A
full run with no full baseline is reported "no baseline", never judged against quick figures
(until stop 46 it was: a full run's SQuAD F1 over 206 documents against the quick subset's, with
a warning). Files from before: a full-run record stored under the quick name still serves full
runs, and quick runs too (as a superset, as the gate always allowed, with its warning); the
per-machine quality files go by their names only.

Baselines are written for review: values rounded to what they resolve (6 significant
digits), raw timing samples in a sidecar ``*.samples.json`` (read back by ``load_baseline``)
so a pull request's diff shows figures, the reason of the update (``--reason`` /
``--rsp-reason``) in ``extra.baseline_reason``, and a table of what moved printed on update.

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
import json
import statistics
import datetime as _dt
import fnmatch
from glob import escape as glob_escape
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from rsp_bench.errors import HarnessInputError, RecordError
from rsp_bench.records import git_commit, latest_records, load_record, validate_record
from rsp_bench.speed_drift import Drift, session_drift
from rsp_bench.storage import atomic_write_json

__all__ = [
    "DEFAULT_BASELINES_DIR",
    "MACHINE_METRICS",
    "QUALITY_PER_MACHINE",
    "Baselines",
    "metric_scope",
    "engine_under_test",
    "quality_baseline_path",
    "speed_baseline_path",
    "split_by_scope",
    "load_baseline",
    "update_baseline",
    "moved_table",
    "list_baselines",
    "configure_baseline_parser",
    "run_baseline",
]

DEFAULT_BASELINES_DIR = Path("results") / "baselines"
SPEED_RUNS_NEEDED = 3
SPEED_RUNS_KEPT = 5
SIGNIFICANT_DIGITS = 6

# Metrics read off a clock (or derived from one): comparable only on the same kind of
# machine. Everything else (quality, bypass accounting, trace-derived projections) is a
# deterministic function of weights, prompts and configuration.
MACHINE_METRICS = (
    "speedup_*", "decode_tokens_per_s*", "ttft_ms*", "tpot_ms*", "router_ms_per_token*",
    "router_step_share*", "achieved_bandwidth_gbs*", "roofline_*", "speedup_over_ideal*",
    "lossless_speedup*", "*_measured", "gpu_*", "degradation_check_ms*", "load_*",
)

# Engines whose greedy outputs depend on the machine: llama.cpp picks its quantized dot products
# by instruction set, and the same commit's quick Q4_1 / Q4_K_M rows measured 0.094 and 0.074
# apart in JSON field F1 (Q4_1 prefix agreement 0.055) between the Intel Xeon runner the baseline
# came from (3f7e7e4dce82) and an AMD EPYC one without AVX-512 (9b1b199de617), 2026-12-03, while
# its F32 row and every reference-engine row matched exactly.
QUALITY_PER_MACHINE = ("llama-cpp",)

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


def _fingerprint(record: Mapping[str, Any]) -> str:
    try:
        return _sanitize(str(record["machine"]["fingerprint"]), "machine fingerprint")
    except (KeyError, TypeError):
        raise RecordError(f"run record {record.get('run_id')!r} has no machine.fingerprint") from None


def _size_tag(record: Mapping[str, Any]) -> str:
    """"" for a quick run's baselines, ".full" for a full run's (records without the field are quick,
    the only size the first baselines were made from)."""
    return "" if record.get("quick", True) else ".full"


def quality_per_machine(record: Mapping[str, Any]) -> bool:
    """Is ``record``'s engine one whose quality is baselined per machine?"""
    return engine_under_test(record) in QUALITY_PER_MACHINE


def quality_baseline_path(baselines_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> Path:
    """Where the quality baseline for ``record``'s weights and engine (and machine, for the
    engines of ``QUALITY_PER_MACHINE``) lives (may not exist)."""
    tag = _size_tag(record)
    if quality_per_machine(record):
        return Path(baselines_dir) / f"{_stem(record)}__{_fingerprint(record)}{tag}.quality.json"
    return Path(baselines_dir) / f"{_stem(record)}{tag}.json"


def least_favourable(records: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One quality baseline from several machines' (same weights, engine and prompt sets): each
    metric keeps its first value and gains ``range`` [min, max] over the machines that hold it,
    so the gate can judge against the least favourable bound in the metric's direction."""
    base = copy.deepcopy(dict(records[0]))
    configs = base["configurations"]
    for other in records[1:]:  # the union of configurations and metrics, first value kept
        for cid, conf in other["configurations"].items():
            target = configs.setdefault(cid, {**copy.deepcopy(conf), "metrics": {}})
            for metric, entry in conf["metrics"].items():
                target["metrics"].setdefault(metric, copy.deepcopy(entry))
    for cid, conf in configs.items():
        for metric, entry in conf["metrics"].items():
            values = [float(r["configurations"][cid]["metrics"][metric]["value"]) for r in records
                      if metric in r["configurations"].get(cid, {}).get("metrics", {})]
            entry["range"] = [min(values), max(values)]
    base["extra"] = {**dict(base["extra"]), "quality_machines": [str(r["machine"]["fingerprint"]) for r in records]}
    return base


def speed_baseline_path(baselines_dir: str | os.PathLike[str], record: Mapping[str, Any]) -> Path:
    """Where the speed baseline for ``record``'s weights, engine and machine lives (may not exist)."""
    try:
        fingerprint = record["machine"]["fingerprint"]
    except (KeyError, TypeError):
        raise RecordError(f"run record {record.get('run_id')!r} has no machine.fingerprint") from None
    return (Path(baselines_dir)
            / f"{_stem(record)}__{_sanitize(str(fingerprint), 'machine fingerprint')}{_size_tag(record)}.speed.json")


def _legacy_full(path: Path, record: Mapping[str, Any]) -> Path:
    """For a full run whose own-size file is missing: the quick-named file, when it holds a
    full run's record (baselines written before run sizes had files of their own)."""
    if record.get("quick", True) or path.exists():
        return path
    legacy = path.with_name(path.name.replace(".full.", ".", 1))
    if legacy.exists():
        try:
            if not load_record(legacy)["quick"]:
                return legacy
        except RecordError:
            return legacy  # malformed: let the caller's load name it
    return path


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
    run_code: str | None = None  # the judged run's engine code digest
    run: Mapping[str, Any] | None = None  # the judged run (its drift is read from the published runs)

    @property
    def speed_runs(self) -> int:
        """How many runs the speed baseline was made from (0 when there is none)."""
        if self.speed is None:
            return 0
        return len(self.speed["extra"].get("speed_runs") or []) or 1

    def speed_problem(self) -> str | None:
        """Why the speed baseline cannot judge this run (None when it can)."""
        if self.speed is None:
            return f"no speed baseline for this machine ({self.speed_path.name})"
        made_by = self.speed["extra"].get("code_digest")
        if self.run_code and made_by != self.run_code:
            return (f"the speed baseline for this machine is stale: made by engine code {made_by or 'unknown'} "
                    f"(commit {(self.speed.get('git_commit') or '?')[:12]}), this run is code {self.run_code}")
        if self.speed_runs < SPEED_RUNS_NEEDED:
            return (f"the speed baseline for this machine holds {self.speed_runs} run(s); {SPEED_RUNS_NEEDED} are "
                    "needed to know its between-run spread")
        return None

    def spread(self) -> dict[tuple[str, str], float]:
        """Between-run relative spread ((max - min) / median of the runs' values) per
        (configuration, metric) of the speed baseline: the gate never calls a change smaller
        than this a regression."""
        if self.speed is None:
            return {}
        table = self.speed["extra"].get("speed_spread") or {}
        return {(c, m): float(v) for c, metrics in table.items() for m, v in metrics.items()}

    def drift(self) -> Drift:
        """Between-session drift of this run's timing figures on its machine kind, read from the
        published run records beside the baselines folder (``<baselines>/../runs``; the judged
        run left out): ``rsp_bench.speed_drift``. The gate never calls a change inside it a
        regression."""
        if self.run is None:
            return Drift()
        results = self.speed_path.parent.parent
        published = latest_records(results) if (results / "runs").is_dir() else []
        timing = {m for conf in self.run["configurations"].values() for m in conf["metrics"]
                  if metric_scope(m) == "machine"}
        return session_drift(published, self.run, timing)

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
    qpath = _legacy_full(quality_baseline_path(baselines_dir, record), record)
    spath = _legacy_full(speed_baseline_path(baselines_dir, record), record)
    quality = speed = None
    if quality_per_machine(record):
        # Judged against every machine's figures, its own included: one fingerprint was measured
        # giving two sets (an AMD EPYC host without, then with AVX-512: llama.cpp's quantized
        # kernels follow the instruction set, which fingerprints made before 2026-12-06 did not
        # name), and a machine's own file is not the only numerics a new runner may run.
        full = bool(_size_tag(record))  # each machine's file of this run's size only
        others = sorted(p for p in Path(baselines_dir).glob(f"{glob_escape(_stem(record))}__*.quality.json")
                        if p.name.endswith(".full.quality.json") == full)
        if others:
            loaded = [load_record(p) for p in others]
            for p, q in zip(others, loaded):
                _check_same(p, q, record, (("model", "name"), ("model", "weights_sha256")))
            quality = least_favourable(loaded)
    elif qpath.exists():
        quality = _with_samples(qpath, load_record(qpath))
        _check_same(qpath, quality, record, (("model", "name"), ("model", "weights_sha256")))
    if spath.exists():
        speed = _with_samples(spath, load_record(spath))
        _check_same(spath, speed, record, (("model", "name"), ("model", "weights_sha256"), ("machine", "fingerprint")))
    extra = record.get("extra") if isinstance(record, Mapping) else None
    run_code = extra.get("code_digest") if isinstance(extra, Mapping) else None
    return Baselines(quality, speed, qpath, spath, run_code=run_code,
                     run=record if isinstance(record, Mapping) and "configurations" in record else None)


def samples_path(path: Path) -> Path:
    """The sidecar that holds a baseline's raw samples: ``X.json`` -> ``X.samples.json``."""
    return path.with_name(path.name[: -len(".json")] + ".samples.json")


def _with_samples(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    side = samples_path(path)
    if not side.exists():
        return record
    try:
        table = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"{side}: cannot read the baseline's samples ({exc})") from None
    if not isinstance(table, dict):
        raise RecordError(f"{side}: expected {{configuration: {{metric: [samples]}}}}, got {type(table).__name__}")
    for cid, metrics in table.items():
        conf = record["configurations"].get(cid)
        if conf is None or not isinstance(metrics, dict):
            continue
        for metric, values in metrics.items():
            if metric in conf["metrics"] and isinstance(values, list):
                conf["metrics"][metric]["samples"] = [float(v) for v in values]
    return record


def _round(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def _for_review(half: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The half as written (values rounded, no samples) and its samples sidecar's table."""
    samples: dict[str, dict[str, list[float]]] = {}
    for cid, conf in half["configurations"].items():
        for metric, m in conf["metrics"].items():
            m["value"] = _round(m["value"])
            if m.get("ci"):
                m["ci"] = [_round(v) for v in m["ci"]]
            if m.get("samples"):
                samples.setdefault(cid, {})[metric] = [_round(v) for v in m.pop("samples")]
            else:
                m.pop("samples", None)
    return half, samples


def moved_table(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[list[str]]:
    """What an update changes: [configuration, metric, old, new, change] for every figure
    that moved, appeared or went (an unchanged figure is left out)."""
    rows = []
    old_configs = old["configurations"] if old else {}
    new_configs = new["configurations"]
    for cid in sorted(set(old_configs) | set(new_configs)):
        a = old_configs.get(cid, {}).get("metrics", {})
        b = new_configs.get(cid, {}).get("metrics", {})
        for metric in sorted(set(a) | set(b)):
            va = a[metric]["value"] if metric in a else None
            vb = b[metric]["value"] if metric in b else None
            if va is not None and vb is not None and _round(va) == _round(vb):
                continue
            change = "new" if va is None else "gone" if vb is None else (
                f"{(vb - va) / abs(va) * 100:+.1f}%" if va else f"{vb - va:+.4g}")
            rows.append([cid, metric, "—" if va is None else f"{va:.4g}", "—" if vb is None else f"{vb:.4g}", change])
    return rows


def _merge_speed(previous: dict[str, Any] | None, half: dict[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
    """This run's speed half folded into the previous speed baseline of the same machine and
    code (the last SPEED_RUNS_KEPT runs): each figure the median of the runs' values, samples
    pooled, and the between-run spread kept per figure."""
    code = record["extra"].get("code_digest")
    runs: list[dict[str, Any]] = []
    pooled: dict[tuple[str, str], list[float]] = {}
    if previous is not None and previous["extra"].get("code_digest") == code:
        runs = list(previous["extra"].get("speed_runs") or [])
        for cid, conf in previous["configurations"].items():
            for metric, m in conf["metrics"].items():
                if m.get("samples"):
                    pooled[(cid, metric)] = list(m["samples"])
    this_run = {"run_id": record["run_id"], "git_commit": record.get("git_commit"),
                "values": {cid: {m: _round(v["value"]) for m, v in conf["metrics"].items()}
                           for cid, conf in half["configurations"].items()}}
    runs = (runs + [this_run])[-SPEED_RUNS_KEPT:]
    spread: dict[str, dict[str, float]] = {}
    for cid, conf in half["configurations"].items():
        for metric, m in conf["metrics"].items():
            values = [r["values"][cid][metric] for r in runs if metric in r["values"].get(cid, {})]
            middle = statistics.median(values)
            m["value"] = middle
            if len(values) > 1 and middle:
                spread.setdefault(cid, {})[metric] = _round((max(values) - min(values)) / abs(middle))
            if m.get("samples"):
                per_run = len(m["samples"])
                # pooled samples of the runs kept (each run's own count), newest last
                m["samples"] = (pooled.get((cid, metric), []) + list(m["samples"]))[-per_run * SPEED_RUNS_KEPT:]
    half["extra"] = {**dict(half["extra"]), "speed_runs": runs, "speed_spread": spread}
    return half


def update_baseline(
    record_path_or_obj: str | os.PathLike[str] | Mapping[str, Any],
    baselines_dir: str | os.PathLike[str] = DEFAULT_BASELINES_DIR,
    *,
    reason: str | None = None,
    moved: list[list[str]] | None = None,
) -> list[Path]:
    """Promote a run record to the baselines of its weights and engine (quality) and of its
    machine (speed, when it holds timing metrics); return the paths written.

    The record is validated first, so a bad record never replaces a good baseline. Each file
    says who wrote it and why: ``extra.baseline_written_utc``, ``extra.baseline_source_run_id``,
    ``extra.baseline_written_by`` (commit checked out here and hostname) and
    ``extra.baseline_reason``. The speed half joins the previous speed baseline's runs when
    that one was made on this machine by the same engine code. ``moved``, when given, is
    filled with :func:`moved_table` rows (old baseline against new). Only the files of this
    record's engine are touched.
    """
    if isinstance(record_path_or_obj, Mapping):
        record = validate_record(copy.deepcopy(dict(record_path_or_obj)),
                                 source=f"run record {record_path_or_obj.get('run_id')!r}")
    else:
        record = load_record(record_path_or_obj)
    if record["extra"].get("partial"):
        raise RecordError(f"run record {record['run_id']!r} is partial ({record['extra']['partial']}); "
                          "a baseline must come from a complete run")
    if reason is not None and not reason.strip():
        raise HarnessInputError("--reason: give a non-empty reason for the baseline update")
    stamp = {
        "baseline_written_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "baseline_source_run_id": record["run_id"],
        "baseline_written_by": {"git_commit": git_commit(), "hostname": socket.gethostname()},
        "baseline_reason": (reason or "").strip() or None,
    }
    previous = load_baseline(baselines_dir, record)
    qpath = quality_baseline_path(baselines_dir, record)
    # what moved is this file's own change: for a per-machine engine the gate's baseline merges
    # every machine's figures, but the file written here is this machine's alone
    old_quality = load_record(qpath) if quality_per_machine(record) and qpath.exists() else (
        None if quality_per_machine(record) else previous.quality)
    quality, speed = split_by_scope(record)
    written = []
    for half, old, path in ((quality, old_quality, qpath),
                            (speed, previous.speed, speed_baseline_path(baselines_dir, record))):
        if half is None:
            continue
        if path.name.endswith(".speed.json"):
            half = _merge_speed(old, half, record)
        half["extra"] = {**dict(half["extra"]), **stamp}
        if moved is not None:
            moved.extend(moved_table(old, half))
        half, samples = _for_review(half)
        written.append(atomic_write_json(path, half))
        side = samples_path(path)
        if samples:
            atomic_write_json(side, samples)
        elif side.exists():
            side.unlink()
    return written


def list_baselines(baselines_dir: str | os.PathLike[str] = DEFAULT_BASELINES_DIR) -> list[tuple[Path, dict[str, Any]]]:
    """Every baseline under ``baselines_dir`` with its parsed record, sorted by file name."""
    directory = Path(baselines_dir)
    if not directory.is_dir():
        return []
    paths = sorted(p for p in directory.glob("*.json") if p.is_file() and not p.name.startswith(".")
                   and not p.name.endswith(".samples.json"))
    return [(p, load_record(p)) for p in paths]


# --------------------------------------------------------------------------- CLI glue


def configure_baseline_parser(p: argparse.ArgumentParser) -> None:
    """Sub-commands of ``rsp-bench baseline``: ``update [RECORD]`` and ``show``."""
    sub = p.add_subparsers(dest="baseline_action", metavar="{update,show}", required=True)
    update = sub.add_parser("update", help="promote a run record to the baselines of its weights and engine (quality) and machine (speed)")
    update.add_argument("record", nargs="?", metavar="RECORD",
                        help="run record file (default: the newest under --results)")
    update.add_argument("--reason", metavar="TEXT", required=True,
                        help="why the baseline changes (kept in the baseline, shown in review)")
    show = sub.add_parser("show", help="list the baselines and who wrote them")
    for q in (update, show):
        q.add_argument("--results", metavar="DIR", default="results", help="results folder (default: results)")
        q.add_argument("--baselines", metavar="DIR", help="baselines folder (default: <results>/baselines)")


def run_baseline(args: argparse.Namespace) -> int:
    """Run ``rsp-bench baseline update|show``; returns the exit code."""
    from tabulate import tabulate  # only the CLI needs it

    baselines_dir = Path(args.baselines) if args.baselines else Path(args.results) / "baselines"
    if args.baseline_action == "update":
        from .cli_checks import check_writable

        # found now, before the record is read, not as a bare [Errno 17] from the first write
        check_writable("--baselines" if args.baselines else "--results", str(baselines_dir), folder=True)
        if args.record:
            source: str | Mapping[str, Any] = args.record
        else:
            newest = latest_records(args.results, limit=1)
            if not newest:
                raise RecordError(f"{Path(args.results) / 'runs'}: no run records to promote (pass RECORD)")
            source = newest[0]
        moved: list[list[str]] = []
        for path in update_baseline(source, baselines_dir, reason=args.reason, moved=moved):
            written = load_record(path)
            runs = len(written["extra"].get("speed_runs") or [])
            print(f"baseline written: {path} (run {written['run_id']}, model {written['model']['name']!r}, "
                  f"engine {engine_under_test(written)!r}, {len(written['configurations'])} configurations"
                  + (f", speed from {runs} run(s)" if runs else "") + ")")
        print(tabulate(moved, headers=["configuration", "metric", "old", "new", "change"], disable_numparse=True)
              if moved else "nothing moved")
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
                record["machine"]["fingerprint"] if path.name.endswith((".speed.json", ".quality.json"))
                else "any (quality)",
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
