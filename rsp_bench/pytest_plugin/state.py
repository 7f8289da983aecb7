"""The rsp-bench plugin's per-session state: ``_SessionState`` (the parsed options, the
record being built, the suites that ran, the summary lines), kept in ``config.stash`` under
``_STATE`` by the plugin's pytest_configure, and ``get_options`` for collection-time hooks.

Must NOT import rsp_bench.plugin, rsp_bench.pytest_plugin.fixtures or .session (they import
this one); only .options. Must NOT import torch, transformers, reference_engine or rsp_bench.quality at module
import (pytest loads the plugin for every run): anything heavy is imported inside the
function that needs it.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from rsp_bench.pytest_plugin.options import RspOptions

if TYPE_CHECKING:
    from rsp_bench.records import RunRecordBuilder


@dataclass
class _SessionState:
    options: RspOptions
    started: float = field(default_factory=time.monotonic)
    created_utc: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    builder: "RunRecordBuilder | None" = None
    suites: list[str] = field(default_factory=list)
    engine: Any = None
    summary: list[str] = field(default_factory=list)
    failed_gate: bool = False
    errored: list[str] = field(default_factory=list)
    distributed: Any = None  # rsp_bench.distributed.DistributedRun in an xdist controller


_STATE = pytest.StashKey[_SessionState]()


def _state(config: pytest.Config) -> _SessionState:
    return config.stash[_STATE]


def get_options(config: pytest.Config) -> RspOptions:
    """The parsed options, for collection-time hooks (a suite's pytest_generate_tests)."""
    return _state(config).options
