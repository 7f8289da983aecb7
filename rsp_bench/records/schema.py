"""The run record schema (version 1): its constants, the metric vocabulary, and validation.

``validate_record`` checks a record against schema version 1 with errors that name the
file and the bad field; the shape is described in ``rsp_bench.records`` and, field by
field, in ``docs/run-record.md``.

Must NOT import torch, transformers or reference_engine, nor the other
``rsp_bench.records`` modules (they import this one); of rsp_bench only
``rsp_bench.errors`` and ``rsp_bench.profiles``.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
from typing import Any, Sequence

from rsp_bench.errors import RecordError
from rsp_bench.profiles import PROFILES as _hardware_profiles

__all__ = ["SCHEMA", "SCHEMA_VERSION", "PROFILE_NAMES", "METRICS", "KNOWN_METRICS", "RUNS_SUBDIR",
           "validate_record"]


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
    "speedup_vs_hf_generate": "decode speed-up of the engine over plain transformers generate on the same weights, interleaved in one process (x)",
    "speedup_over_ideal": "measured speed-up over pruning off divided by the ideal from the weight bytes not read (ratio)",
    "roofline_fraction": "decode bytes per second (weight bytes read per token x tokens/s) over this machine's measured STREAM-style read rate (fraction)",
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
_METRIC_OPTIONAL = ("samples", "range")  # range: [min, max] over machines (baselines only)
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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


def _ordered_pair(v: Any, pair: Any, where: str, names: tuple[str, str], alternative: str = "") -> None:
    lo, hi = names
    if not isinstance(pair, list) or len(pair) != 2:
        v.fail(where, f"expected [{lo}, {hi}]{alternative}, got {_short(pair)}")
    v.number(pair[0], f"{where}[0]")
    v.number(pair[1], f"{where}[1]")
    if pair[0] > pair[1]:
        v.fail(where, f"{lo} > {hi}: {pair!r}")


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
            if metric["ci"] is not None:
                _ordered_pair(v, metric["ci"], f"{mwhere}.ci", ("lo", "hi"), " or null")
            v.string(metric["unit"], f"{mwhere}.unit")
            if "samples" in metric:
                samples = metric["samples"]
                if not isinstance(samples, list):
                    v.fail(f"{mwhere}.samples", f"expected a list of numbers, got {_short(samples)}")
                for i, sample in enumerate(samples):
                    v.number(sample, f"{mwhere}.samples[{i}]")
            if "range" in metric:
                _ordered_pair(v, metric["range"], f"{mwhere}.range", ("min", "max"))
    if not isinstance(obj["extra"], dict):
        v.fail("extra", f"expected an object, got {_short(obj['extra'])}")
    return obj
