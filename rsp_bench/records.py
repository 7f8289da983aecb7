"""Run records: the versioned JSON document every rsp-bench session writes (schema version 1).

A run record is the only thing the regression gate, the baselines and the leaderboard
read, so this module owns the schema: its constants, the builder the pytest plugin
fills, validation with errors that name the file and the bad field, and reading and
writing records under ``<results>/runs/``. Writing goes through ``rsp_bench.storage``.
The full field-by-field description is ``docs/run-record.md``; in short::

    {"schema": "rsp-bench/run-record", "schema_version": 1,
     "run_id": "20251130T214703Z-3fa9c1", "created_utc": "2025-11-30T21:47:03+00:00",
     "wall_time_s": 412.3, "quick": true, "suites": ["equivalence", "throughput"],
     "model": {"name": str, "path": str, "weights_sha256": str},
     "machine": {"fingerprint": str, "hostname": str, "platform": str, "cpu": str,
                 "cores": int, "memory_gb": float, "gpu": str | null},
     "versions": {"python": str, "torch": str | null, "transformers": str | null,
                  "rsp_bench": str},
     "git_commit": str | null,
     "configurations": {
        "reference/lossy/s=0.50": {
            "engine": "reference", "mode": "lossy", "sensitivity": 0.5, "params": {},
            "metrics": {"top1_agreement": {"value": 0.91, "n": 640,
                                           "ci": [0.89, 0.93], "unit": "fraction"},
                        "speedup_vs_off": {"value": 1.18, "n": 20, "ci": null,
                                           "unit": "x", "samples": [1.17, ...]}}}},
     "extra": {}}

Rules that are not obvious from the shape: every metric value is a finite number (NaN
is refused when it is added, not when the file is read back); unknown fields are refused
(additions go under ``extra`` or ``params``, or into a new schema version); ``run_id``
is also the file name, so it is restricted to ``[A-Za-z0-9._-]``.

Must NOT import torch, transformers or reference_engine: library versions are read from
package metadata, the GPU name from ``nvidia-smi`` (or passed in by the caller), so that
the gate and leaderboard work on a machine without torch.
"""

from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import re
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from rsp_bench.errors import RecordError
from rsp_bench.profiles import PROFILES as _hardware_profiles
from rsp_bench.storage import atomic_write_json

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "PROFILE_NAMES",
    "METRICS",
    "KNOWN_METRICS",
    "RUNS_SUBDIR",
    "RunRecordBuilder",
    "new_record",
    "new_run_id",
    "machine_info",
    "machine_fingerprint",
    "versions",
    "git_commit",
    "parse_config_id",
    "validate_record",
    "write_record",
    "load_record",
    "record_paths",
    "latest_records",
    "record_sort_key",
]

SCHEMA = "rsp-bench/run-record"
SCHEMA_VERSION = 1
RUNS_SUBDIR = "runs"

# GPU profiles that projected figures are reported for; rsp_bench.profiles owns them.
PROFILE_NAMES: tuple[str, ...] = tuple(_hardware_profiles)

# The metric vocabulary the suites write and the gate policy and leaderboard read.
# Engines may add metrics of their own: unknown names are accepted in records (the gate
# reports them as "info"), this table only documents the ones rsp-bench defines.
METRICS: dict[str, str] = {
    "exact_match_rate": "share of prompts whose greedy output equals the unpruned output (fraction)",
    "prefix_agreement": "share of tokens before the first divergence from the unpruned output (fraction)",
    "top1_agreement": "teacher-forced top-1 agreement with the unpruned model on its continuation (fraction)",
    "kl_mean": "mean per-token KL(unpruned || pruned) (nats)",
    "kl_p99": "99th percentile per-token KL(unpruned || pruned) (nats)",
    "perplexity_ratio": "pruned / unpruned perplexity on the unpruned continuation (ratio)",
    "squad_em": "SQuAD exact match, official normalization (fraction)",
    "squad_f1": "SQuAD token F1, official normalization (fraction)",
    "squad_f1_delta": "pruned minus unpruned SQuAD F1 (fraction points)",
    "json_field_f1": "field-level F1 of structured JSON extraction (fraction)",
    "json_field_f1_delta": "pruned minus unpruned JSON field F1 (fraction points)",
    "bypass_ratio": "share of decode-time block executions bypassed (fraction)",
    "blocks_executed_per_token": "decoder blocks executed per decoded token (blocks)",
    "speedup_vs_off": "decode speed-up over pruning off, measured interleaved in one process (x); samples are per-pair ratios",
    "decode_tokens_per_s": "decode throughput (tokens/s)",
    "ttft_ms_p50": "median time to first token (ms)",
    "tpot_ms_p50": "median time per output token (ms)",
    "degradation_false_positive_rate": "share of benign prompts on which protective degradation fired (fraction)",
    "degradation_detection_rate": "share of adversarial prompts on which protective degradation fired (fraction)",
}
for _profile in PROFILE_NAMES:
    METRICS[f"projected_tokens_per_s_{_profile}"] = f"projected decode tokens/s on a {_profile} (tokens/s, projected)"
    METRICS[f"projected_idle_fraction_{_profile}"] = f"projected GPU idle fraction on a {_profile} (fraction, projected)"
    METRICS[f"projected_freed_fraction_{_profile}"] = (
        f"projected share of GPU time freed by pruning on a {_profile} (fraction, projected)"
    )
del _profile
KNOWN_METRICS: frozenset[str] = frozenset(METRICS)

_TOP_FIELDS = (
    "schema", "schema_version", "run_id", "created_utc", "wall_time_s", "quick", "suites",
    "model", "machine", "versions", "git_commit", "configurations", "extra",
)
_MODEL_FIELDS = ("name", "path", "weights_sha256")
_MACHINE_FIELDS = ("fingerprint", "hostname", "platform", "cpu", "cores", "memory_gb", "gpu")
_VERSION_FIELDS = ("python", "torch", "transformers", "rsp_bench")
_CONFIG_FIELDS = ("engine", "mode", "sensitivity", "params", "metrics")
_METRIC_REQUIRED = ("value", "n", "ci", "unit")
_METRIC_OPTIONAL = ("samples",)
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# Sentinel for "detect it yourself" where None is a legitimate value (no GPU, no git).
_AUTO: Any = object()


# --------------------------------------------------------------------------- machine


def _cpu_model() -> str:
    # platform.processor() is empty or just "x86_64" on Linux; /proc/cpuinfo has the model.
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _usable_cores() -> int:
    # The cores this process may run on (a container or taskset limit), which is what a
    # benchmark actually gets, rather than the host's count.
    if hasattr(os, "sched_getaffinity"):
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except OSError:
            pass
    return max(1, os.cpu_count() or 1)


def _memory_gb() -> float:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0.0
    return round(total / 1e9, 1)


def _gpu_name() -> str | None:
    # nvidia-smi rather than torch.cuda: this module must not import torch, and the
    # fingerprint must be the same whether or not torch is installed.
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not names:
        return None
    if len(set(names)) == 1 and len(names) > 1:
        return f"{len(names)}x {names[0]}"
    return " + ".join(names)


def machine_fingerprint(cpu: str, cores: int, memory_gb: float, gpu: str | None) -> str:
    """Short stable hash identifying a *kind* of machine (12 hex characters).

    Hostname and OS patch level are left out on purpose: CI runners of one kind get
    fresh hostnames every job and must share one baseline. Memory is rounded to the
    nearest 4 GB because identical machines report slightly different totals (firmware
    and kernel reservations).
    """
    memory_bucket = max(4, 4 * round(float(memory_gb) / 4))
    key = f"cpu={cpu.strip()}|cores={int(cores)}|memory_gb~{memory_bucket}|gpu={(gpu or 'none').strip()}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


def machine_info(gpu: str | None = _AUTO) -> dict[str, Any]:
    """Describe this machine for the record's ``machine`` field.

    ``gpu`` overrides detection (the plugin may know the CUDA device it actually used);
    pass ``None`` to record a CPU-only run on a machine that has a GPU.
    """
    cpu = _cpu_model()
    cores = _usable_cores()
    memory_gb = _memory_gb()
    gpu_name = _gpu_name() if gpu is _AUTO else gpu
    return {
        "fingerprint": machine_fingerprint(cpu, cores, memory_gb, gpu_name),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": cores,
        "memory_gb": memory_gb,
        "gpu": gpu_name,
    }


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Library versions for the record, read from package metadata without importing them."""
    rsp = _dist_version("rsp-bench")
    if rsp is None:
        # Running from a checkout that is not pip-installed (the unit tests do).
        import rsp_bench

        rsp = getattr(rsp_bench, "__version__", None) or "0+unknown"
    return {
        "python": platform.python_version(),
        "torch": _dist_version("torch"),
        "transformers": _dist_version("transformers"),
        "rsp_bench": rsp,
    }


def git_commit(cwd: str | os.PathLike[str] | None = None) -> str | None:
    """The commit checked out in ``cwd`` (default: the current directory), or None.

    None when git is missing or ``cwd`` is not inside a repository; a record must still
    be writable from an sdist or a copied folder.
    """
    exe = shutil.which("git")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "rev-parse", "--verify", "HEAD"],
            cwd=os.fspath(cwd) if cwd is not None else None,
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if out.returncode != 0 or not re.fullmatch(r"[0-9a-f]{7,64}", commit):
        return None
    return commit


# --------------------------------------------------------------------------- building


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


# --------------------------------------------------------------------------- validation


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Validator:
    def __init__(self, source: str | None) -> None:
        self.prefix = f"{source}: " if source else ""

    def fail(self, field: str, problem: str) -> None:
        raise RecordError(f"{self.prefix}field {field}: {problem}")

    def mapping(self, obj: Any, field: str, required: Sequence[str], optional: Sequence[str] = ()) -> dict:
        if not isinstance(obj, dict):
            self.fail(field, f"expected an object, got {_short(obj)}")
        missing = [k for k in required if k not in obj]
        if missing:
            self.fail(field, f"missing {', '.join(missing)}")
        unknown = sorted(set(obj) - set(required) - set(optional))
        if unknown:
            self.fail(field, f"unknown field(s) {', '.join(map(repr, unknown))} (additions go under 'extra')")
        return obj

    def string(self, value: Any, field: str, *, nullable: bool = False, nonempty: bool = False) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, str):
            self.fail(field, f"expected a string{' or null' if nullable else ''}, got {_short(value)}")
        if nonempty and not value.strip():
            self.fail(field, "must not be empty")

    def number(self, value: Any, field: str, *, nullable: bool = False, minimum: float | None = None,
               maximum: float | None = None) -> None:
        if value is None and nullable:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(field, f"expected a finite number{' or null' if nullable else ''}, got {_short(value)}")
        if minimum is not None and value < minimum:
            self.fail(field, f"must be >= {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            self.fail(field, f"must be <= {maximum}, got {value!r}")

    def integer(self, value: Any, field: str, *, minimum: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(field, f"expected an integer, got {_short(value)}")
        if value < minimum:
            self.fail(field, f"must be >= {minimum}, got {value!r}")


def _parse_utc(text: str) -> _dt.datetime | None:
    try:
        # Python 3.10's fromisoformat does not accept a trailing "Z".
        parsed = _dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return None
    if parsed.utcoffset() != _dt.timedelta(0):
        return None
    return parsed


def validate_record(obj: Any, source: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Check ``obj`` against schema version 1; return it unchanged or raise RecordError.

    The error names ``source`` (a file, usually) and the bad field, e.g.
    ``results/runs/x.json: field configurations['reference/off'].metrics['kl_mean'].n: ...``.
    """
    v = _Validator(os.fspath(source) if source is not None else None)
    if not isinstance(obj, dict):
        v.fail("(top level)", f"expected a JSON object, got {_short(obj)}")
    # Check the schema tag first so that a wrong file type gets the helpful message
    # rather than a list of missing fields.
    if obj.get("schema") != SCHEMA:
        v.fail("schema", f"expected {SCHEMA!r}, got {_short(obj.get('schema'))} (not an rsp-bench run record?)")
    version = obj.get("schema_version")
    if version != SCHEMA_VERSION:
        if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
            v.fail("schema_version", f"{version} is newer than this rsp-bench understands ({SCHEMA_VERSION}); upgrade rsp-bench")
        v.fail("schema_version", f"expected {SCHEMA_VERSION}, got {_short(version)}")
    v.mapping(obj, "(top level)", _TOP_FIELDS)

    v.string(obj["run_id"], "run_id")
    if not _SAFE_ID.match(obj["run_id"]):
        v.fail("run_id", f"{obj['run_id']!r} must match [A-Za-z0-9][A-Za-z0-9._-]* (it is the file name)")
    v.string(obj["created_utc"], "created_utc")
    if _parse_utc(obj["created_utc"]) is None:
        v.fail("created_utc", f"{obj['created_utc']!r} is not an ISO 8601 UTC timestamp")
    v.number(obj["wall_time_s"], "wall_time_s", minimum=0.0)
    if not isinstance(obj["quick"], bool):
        v.fail("quick", f"expected true or false, got {_short(obj['quick'])}")
    if not isinstance(obj["suites"], list):
        v.fail("suites", f"expected a list of strings, got {_short(obj['suites'])}")
    for i, suite in enumerate(obj["suites"]):
        v.string(suite, f"suites[{i}]", nonempty=True)

    model = v.mapping(obj["model"], "model", _MODEL_FIELDS)
    v.string(model["name"], "model.name", nonempty=True)
    v.string(model["path"], "model.path")
    v.string(model["weights_sha256"], "model.weights_sha256")

    machine = v.mapping(obj["machine"], "machine", _MACHINE_FIELDS)
    v.string(machine["fingerprint"], "machine.fingerprint", nonempty=True)
    if not _SAFE_ID.match(machine["fingerprint"]):
        v.fail("machine.fingerprint", f"{machine['fingerprint']!r} must match [A-Za-z0-9][A-Za-z0-9._-]*")
    for key in ("hostname", "platform", "cpu"):
        v.string(machine[key], f"machine.{key}")
    v.integer(machine["cores"], "machine.cores", minimum=1)
    v.number(machine["memory_gb"], "machine.memory_gb", minimum=0.0)
    v.string(machine["gpu"], "machine.gpu", nullable=True)

    vers = v.mapping(obj["versions"], "versions", _VERSION_FIELDS)
    v.string(vers["python"], "versions.python", nonempty=True)
    v.string(vers["torch"], "versions.torch", nullable=True)
    v.string(vers["transformers"], "versions.transformers", nullable=True)
    v.string(vers["rsp_bench"], "versions.rsp_bench", nonempty=True)
    v.string(obj["git_commit"], "git_commit", nullable=True)

    configs = obj["configurations"]
    if not isinstance(configs, dict):
        v.fail("configurations", f"expected an object, got {_short(configs)}")
    for config_id, config in configs.items():
        where = f"configurations[{config_id!r}]"
        if not config_id.strip() or config_id != config_id.strip():
            v.fail(where, "configuration id is empty or has surrounding spaces")
        v.mapping(config, where, _CONFIG_FIELDS)
        v.string(config["engine"], f"{where}.engine", nonempty=True)
        v.string(config["mode"], f"{where}.mode", nonempty=True)
        v.number(config["sensitivity"], f"{where}.sensitivity", nullable=True, minimum=0.0, maximum=1.0)
        if not isinstance(config["params"], dict):
            v.fail(f"{where}.params", f"expected an object, got {_short(config['params'])}")
        metrics = config["metrics"]
        if not isinstance(metrics, dict):
            v.fail(f"{where}.metrics", f"expected an object, got {_short(metrics)}")
        for name, metric in metrics.items():
            mwhere = f"{where}.metrics[{name!r}]"
            if not name:
                v.fail(mwhere, "metric name is empty")
            v.mapping(metric, mwhere, _METRIC_REQUIRED, _METRIC_OPTIONAL)
            v.number(metric["value"], f"{mwhere}.value")
            v.integer(metric["n"], f"{mwhere}.n", minimum=1)
            ci = metric["ci"]
            if ci is not None:
                if not isinstance(ci, list) or len(ci) != 2:
                    v.fail(f"{mwhere}.ci", f"expected [lo, hi] or null, got {_short(ci)}")
                v.number(ci[0], f"{mwhere}.ci[0]")
                v.number(ci[1], f"{mwhere}.ci[1]")
                if ci[0] > ci[1]:
                    v.fail(f"{mwhere}.ci", f"lo > hi: {ci!r}")
            v.string(metric["unit"], f"{mwhere}.unit")
            if "samples" in metric:
                samples = metric["samples"]
                if not isinstance(samples, list):
                    v.fail(f"{mwhere}.samples", f"expected a list of numbers, got {_short(samples)}")
                for i, sample in enumerate(samples):
                    v.number(sample, f"{mwhere}.samples[{i}]")
    if not isinstance(obj["extra"], dict):
        v.fail("extra", f"expected an object, got {_short(obj['extra'])}")
    return obj


# --------------------------------------------------------------------------- files


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
