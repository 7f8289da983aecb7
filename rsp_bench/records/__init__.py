"""Run records: the versioned JSON document every rsp-bench session writes (schema version 1).

A run record is the only thing the regression gate, the baselines and the leaderboard
read, so this package owns the schema. It only re-exports; each concept has one module:

  schema        the constants, the metric vocabulary, and validation with errors that
                name the file and the bad field
  environment   the machine description and fingerprint, library versions, git commit
  builder       run and configuration ids, a fresh record, the builder the pytest plugin fills
  files         reading, writing (through ``rsp_bench.storage``) and listing records
                under ``<results>/runs/``

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

Must NOT import torch, transformers or reference_engine (not even through its modules):
library versions are read from package metadata, the GPU name from ``nvidia-smi`` (or
passed in by the caller), so that the gate and leaderboard work on a machine without torch.
"""

from __future__ import annotations

from rsp_bench.records.builder import RunRecordBuilder, new_record, new_run_id, parse_config_id
from rsp_bench.records.environment import code_digest, git_commit, machine_fingerprint, machine_info, versions
from rsp_bench.records.files import latest_records, load_record, record_paths, record_sort_key, write_record
from rsp_bench.records.schema import (
    KNOWN_METRICS,
    METRICS,
    PROFILE_NAMES,
    RUNS_SUBDIR,
    SCHEMA,
    SCHEMA_VERSION,
    _parse_utc,  # noqa: F401  (not public; tests check baseline timestamps with it)
    validate_record,
)

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
    "git_commit", "code_digest",
    "parse_config_id",
    "validate_record",
    "write_record",
    "load_record",
    "record_paths",
    "latest_records",
    "record_sort_key",
]
