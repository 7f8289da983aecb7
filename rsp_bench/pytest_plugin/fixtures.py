"""The session fixtures of the rsp-bench pytest plugin (the names are a contract with the
suites; rsp_bench.plugin's docstring lists them): rsp_options, rsp_record, rsp_engine,
rsp_adapter_for, rsp_adapter, rsp_peer, rsp_configs, rsp_config, rsp_reference_outputs,
rsp_prefill_once.

Must NOT import rsp_bench.plugin or rsp_bench.pytest_plugin.session; only .options and
.state. Must NOT import torch, transformers, reference_engine or rsp_bench.quality at module
import (pytest loads the plugin for every run): anything heavy is imported inside the
function that needs it.
"""

from __future__ import annotations

import warnings

import sys
import time
from typing import TYPE_CHECKING, Any, Callable

import pytest

from rsp_bench.pytest_plugin.options import RspOptions
from rsp_bench.pytest_plugin.state import _state

# configuration ids rsp_configs left out (no unit-router predictor): their tests skip, saying why
_LEFT_OUT: set[str] = set()

if TYPE_CHECKING:
    from rsp_bench.engines import ConfigSpec, EngineAdapter
    from rsp_bench.records import RunRecordBuilder


@pytest.fixture(scope="session")
def rsp_options(pytestconfig: pytest.Config) -> RspOptions:
    return _state(pytestconfig).options


@pytest.fixture(scope="session")
def rsp_record(pytestconfig: pytest.Config) -> "RunRecordBuilder":
    state = _state(pytestconfig)
    if state.builder is None:
        from rsp_bench.records import RunRecordBuilder

        state.builder = RunRecordBuilder(quick=state.options.quick, created_utc=state.created_utc)
        state.builder.set_extra("subset_seed", state.options.subset_seed)
        state.builder.set_extra("engine_under_test", state.options.engine)
    return state.builder


@pytest.fixture(scope="session")
def rsp_engine(pytestconfig: pytest.Config, rsp_options: RspOptions, rsp_record: "RunRecordBuilder"):
    from reference_engine import Engine
    from rsp_bench import distributed

    if distributed.worker_id(pytestconfig) is not None:
        import torch

        torch.set_num_threads(distributed.threads_for_worker(pytestconfig, distributed.cpu_count()))
    t0 = time.monotonic()
    engine = Engine.load(rsp_options.model, progress=_stderr_progress)
    _state(pytestconfig).engine = engine
    rsp_record.set_model(engine.name, str(rsp_options.model or engine.folder), engine.weights_sha256)
    rsp_record.set_extra("model_load_s", round(time.monotonic() - t0, 3))
    # Which decode kernel produced the figures (RSP_DECODE_KERNEL; native sums in another order).
    rsp_record.set_extra("decode_kernel", engine.decode_kernel)
    # Which protective-degradation detector every lossy row of this run went through (a score
    # file, or the weaker fallback when none fits the weights).
    rsp_record.set_extra("degradation_detector", engine.detector_info())
    return engine


@pytest.fixture(scope="module")
def rsp_prefill_once(rsp_engine):
    """For a quality suite's module: the reference engine prefills each batch-1 prompt once for
    all the module's configurations and teacher-forced passes (``Engine.memoized_prefill``). The
    stored tensors are the same bits, so no figure moves; a timing taken inside leaves the prefill
    out, so the throughput suite does not use it."""
    memoized = getattr(rsp_engine, "memoized_prefill", None)
    if memoized is None:
        yield None
        return
    with memoized() as memo:
        yield memo


@pytest.fixture(scope="session")
def rsp_adapter_for(rsp_engine, rsp_options: RspOptions) -> Callable[[Any], "EngineAdapter"]:
    from rsp_bench.engines import get_engine

    built: dict[str, EngineAdapter] = {}

    def adapter_for(spec_or_name: "ConfigSpec | str") -> "EngineAdapter":
        name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.engine
        if name not in built:
            built[name] = get_engine(name, engine=rsp_engine, model=rsp_options.model,
                                     engine_url=rsp_options.engine_url, engine_model=rsp_options.engine_model)
        return built[name]

    return adapter_for


@pytest.fixture(scope="session")
def rsp_adapter(rsp_adapter_for, rsp_options: RspOptions) -> "EngineAdapter":
    return rsp_adapter_for(rsp_options.engine)


@pytest.fixture(scope="session")
def rsp_peer(rsp_adapter_for) -> "EngineAdapter":
    return rsp_adapter_for("hf-generate")


@pytest.fixture(scope="session")
def rsp_configs(rsp_options: RspOptions, rsp_adapter: "EngineAdapter") -> list["ConfigSpec"]:
    from rsp_bench.engines import plan_configs
    from rsp_bench.engines.configs import unit_router_rows
    from rsp_bench.errors import HarnessInputError

    supported = tuple(getattr(rsp_adapter, "modes", ()) or ())
    if supported:
        bad = [m for m in rsp_options.modes if m != "off" and m not in supported]
        if bad:  # an adapter that declared no modes at registration is checked here, at first use
            pytest.exit(f"--rsp-mode: engine {rsp_adapter.name!r} does not support mode {bad[0]!r} "
                        f"(it supports {', '.join(supported)})", returncode=pytest.ExitCode.USAGE_ERROR)
    specs = plan_configs(rsp_options.engine, rsp_options.modes, rsp_options.sensitivities)
    engine = getattr(rsp_adapter, "engine", None)
    unit_rows = unit_router_rows(specs)
    if unit_rows and engine is not None and not engine.unit_predictor_available():
        # training the unit router's predictor takes about half an hour of CPU: not inside a
        # suite; and the engine's own fallback (the block router) must not be recorded under a
        # unit row's id and budgets
        warnings.warn(f"{', '.join(s.config_id for s in unit_rows)}: no unit-router predictor for these weights, "
                      "rows left out; `rsp-bench calibrate --model ...` trains one")
        _LEFT_OUT.update(s.config_id for s in unit_rows)
        specs = [s for s in specs if s not in unit_rows]
    return specs


@pytest.fixture
def rsp_config(request: pytest.FixtureRequest, rsp_configs: list["ConfigSpec"]) -> "ConfigSpec":
    wanted = getattr(request, "param", None)
    if wanted is None:
        raise pytest.UsageError("rsp_config is parametrized by the rsp-bench plugin; do not request it indirectly")
    for spec in rsp_configs:
        if spec.config_id == wanted:
            return spec
    if wanted in _LEFT_OUT:
        pytest.skip(f"{wanted}: no unit-router predictor for these weights (`rsp-bench calibrate` trains one)")
    raise LookupError(f"configuration {wanted!r} is not in rsp_configs")


@pytest.fixture(scope="session")
def rsp_reference_outputs(pytestconfig: pytest.Config, rsp_adapter_for, rsp_engine, rsp_record):
    from rsp_bench import distributed
    from rsp_bench.engines import ConfigSpec, pruning_config
    from rsp_bench.quality import ReferenceOutputs, reference_cache_dir

    spec = ConfigSpec("reference/off", "reference", "off", None, {}, pruning_config("off"))
    # One on-disk copy of each reference set, computed once under a file lock: xdist workers share
    # it, and so do the sessions of one CI job (the reference suites, the llama.cpp ladder's, the
    # docs example's inner runs), which otherwise each recompute the same unpruned outputs. The
    # record says which sets were read from disk. Workers always share, the option aside.
    options = _state(pytestconfig).options
    use_disk = options.reference_cache or distributed.worker_id(pytestconfig) is not None
    disk = reference_cache_dir(rsp_engine.weights_sha256) if use_disk else None
    refs = ReferenceOutputs(rsp_adapter_for("reference"), spec, disk=disk)
    rsp_record.set_extra("reference_outputs", refs.sources)  # filled as the sets are asked for
    return refs


def _stderr_progress(message: str) -> None:
    print(f"[rsp-bench] {message}", file=sys.stderr, flush=True)

