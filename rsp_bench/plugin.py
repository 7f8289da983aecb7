"""The rsp-bench pytest plugin (entry point ``pytest11: rsp_bench``): options, markers,
session fixtures, and the run record + regression gate at session end.

Suites under ``suites/`` use these session fixtures (the names are a contract):

  rsp_options            RspOptions: the parsed --rsp-* options (frozen)
  rsp_engine             the loaded reference ``Engine`` (once per session)
  rsp_adapter            the adapter under test (--rsp-engine, default "reference")
  rsp_peer               the plain Hugging Face generate adapter (the unpruned peer)
  rsp_adapter_for        callable: ConfigSpec or engine name -> adapter (built once each)
  rsp_configs            list of ConfigSpec: "reference/off", then one per mode x sensitivity
  rsp_config             one ConfigSpec; a test that takes it is parametrized over rsp_configs
  rsp_reference_outputs  cache of unpruned reference generations per prompt set, so every
                         configuration is compared against one reference run
  rsp_record             the session's RunRecordBuilder; suites call add_metric on it

At session end, if any metric was added, the record is written atomically to
``<results>/runs/`` (``results/local``, git-ignored, unless --rsp-results names another folder:
publishing to the committed ``results/`` is explicit). With --rsp-update-baseline it becomes
the baseline of the engine under test (rsp_bench.baselines: quality per weights and engine,
speed per machine); otherwise (unless --rsp-no-gate) it is compared with those baselines and a
regression fails the session. With --rsp-ci (scripts/test.sh passes it) a configuration with no
baseline, or a run that gated nothing, fails too. The terminal summary always shows the record
path and a headline table.

Engines with their own configurations (one per quantization rung, say) declare them at
registration: ``register_engine(name, modes=..., configurations=fn)`` (rsp_bench.engines.base);
``plan_configs`` then runs reference/off followed by ``fn(modes, sensitivities)``. Declared
modes let an unsupported --rsp-mode fail as a usage error before any test runs.

Suites marked ``reference_only`` (adversarial: the reference engine's protective degradation;
lm-eval: the reference's lm-eval wrapper) are skipped with a reason under another
--rsp-engine, so an engine's record never holds figures measured on someone else.

Suite configurations pin ``hardware_watermark=0.0`` (rsp_bench.engines.SUITE_WATERMARK): the
router otherwise raises its threshold when the machine is busy, and quality figures would
depend on who else was using the CPUs.

Must NOT import torch, transformers, reference_engine or rsp_bench.quality at module import
(pytest loads this plugin for every run, including the fast unit tests): everything heavy is
imported inside the fixtures that need it.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest

if TYPE_CHECKING:
    from rsp_bench.engines import ConfigSpec, EngineAdapter
    from rsp_bench.records import RunRecordBuilder

__all__ = ["RspOptions", "MARKERS", "SUITE_MARKERS", "get_options", "parse_sensitivities", "parse_modes"]

MARKERS = {
    "equivalence": "output equivalence of pruned vs unpruned generation (rsp-bench quality suite)",
    "extraction": "SQuAD and structured-extraction F1, pruned vs unpruned (rsp-bench quality suite)",
    "throughput": "decode speed and projected GPU figures (rsp-bench speed suite)",
    "adversarial": "odd and adversarial inputs, protective degradation (rsp-bench)",
    "lm_eval": "lm-evaluation-harness tasks through the engine adapter (rsp-bench)",
    "gpu": "needs a CUDA device; skipped without one",
    "reference_only": "exercises the reference engine itself; skipped under another --rsp-engine",
    "docs": "a documentation page's examples, run as written",
}
# Markers whose tests, when they run, name a suite in the run record.
SUITE_MARKERS = ("equivalence", "extraction", "throughput", "adversarial", "lm_eval")

DEFAULT_SENSITIVITIES = "0.25,0.5,1.0"
DEFAULT_RESULTS = "results/local"
DEFAULT_BASELINES = "results/baselines"
QUICK_SENSITIVITIES = "0.5"
# Modes a --rsp-mode may name for the reference engine; "static" needs a block list, which
# the static-shortgpt / static-random baselines supply.
REFERENCE_MODES = ("off", "lossy", "lossless")
_MODE_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclass(frozen=True)
class RspOptions:
    """The --rsp-* options, parsed and checked once in pytest_configure."""

    model: str | None
    sensitivities: tuple[float, ...]
    modes: tuple[str, ...]
    engine: str
    quick: bool
    results_dir: Path
    update_baseline: bool
    gate: bool
    max_new_tokens: int | None = None
    subset_seed: int = 0  # which seeded subset of the fixtures the suites draw; 0 = the baseline's
    baselines_dir: Path = Path("results") / "baselines"
    ci: bool = False
    engine_url: str | None = None
    engine_model: str | None = None


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


# --------------------------------------------------------------------------- options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rsp-bench", "rsp-bench: residual-stream pruning benchmark")
    group.addoption("--rsp-model", metavar="PATH", default=None,
                    help="model folder or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    group.addoption("--rsp-sensitivity", metavar="LIST", default=None,
                    help=f"comma-separated sensitivities in [0, 1] (default {DEFAULT_SENSITIVITIES}; "
                         f"{QUICK_SENSITIVITIES} with --rsp-quick)")
    group.addoption("--rsp-mode", metavar="LIST", default=None,
                    help="comma-separated pruning modes, e.g. lossy,lossless (default lossy); "
                         "reference/off always runs")
    group.addoption("--rsp-engine", metavar="NAME", default="reference",
                    help="engine adapter under test (registry name; default reference)")
    group.addoption("--rsp-quick", action="store_true", default=False,
                    help="small fixed subsets for CI")
    group.addoption("--rsp-results", metavar="DIR", default=DEFAULT_RESULTS,
                    help=f"where run records go (DIR/runs; default {DEFAULT_RESULTS}, git-ignored; "
                         "pass results to publish)")
    group.addoption("--rsp-baselines", metavar="DIR", default=DEFAULT_BASELINES,
                    help=f"baselines folder read by the gate and written by --rsp-update-baseline "
                         f"(default {DEFAULT_BASELINES})")
    group.addoption("--rsp-ci", action="store_true", default=False,
                    help="CI mode: a configuration with no baseline, or a run that gated nothing, fails")
    group.addoption("--rsp-engine-url", metavar="URL", default=None,
                    help="base URL of a served engine (for --rsp-engine openai), e.g. http://127.0.0.1:8000/v1")
    group.addoption("--rsp-engine-model", metavar="NAME", default=None,
                    help="model name to ask a served engine for (default: the first of its /v1/models)")
    group.addoption("--rsp-update-baseline", action="store_true", default=False,
                    help="promote this session's run record to the baseline (no gating)")
    group.addoption("--rsp-no-gate", action="store_true", default=False,
                    help="write the record but do not compare it with the baseline")
    group.addoption("--rsp-max-new-tokens", metavar="N", default=None,
                    help="override every suite's max_new_tokens")
    group.addoption("--rsp-subset-seed", metavar="N", default="0",
                    help="seed of the fixture subsets the suites draw (default 0, the baseline's); "
                         "another seed checks that figures reproduce on prompts nobody tuned to, "
                         "and is never gated")


def parse_sensitivities(text: str) -> tuple[float, ...]:
    """``"0.25,0.5,1.0"`` -> (0.25, 0.5, 1.0), order kept, duplicates dropped.

    Raises pytest.UsageError naming the bad value: these come from the command line.
    """
    values: list[float] = []
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise pytest.UsageError(f"--rsp-sensitivity: no value given in {text!r} (expected e.g. 0.25,0.5,1.0)")
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise pytest.UsageError(
                f"--rsp-sensitivity: {part!r} is not a number in [0, 1] (expected a list such as 0.25,0.5,1.0)")
        if value not in values:
            values.append(value)
    return tuple(values)


def parse_modes(text: str, engine: str) -> tuple[str, ...]:
    """``"lossy,lossless"`` -> ("lossy", "lossless"); the reference engine's are checked here,
    a third-party engine's against its adapter when it is built."""
    modes: list[str] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not _MODE_NAME.match(part):
            raise pytest.UsageError(f"--rsp-mode: {part!r} is not a mode name (expected e.g. lossy,lossless)")
        if engine == "reference" and part not in REFERENCE_MODES:
            hint = " (static baselines run as the static-shortgpt / static-random rows)" if part == "static" else ""
            raise pytest.UsageError(
                f"--rsp-mode: {part!r} is not a mode of the reference engine; use one of {', '.join(REFERENCE_MODES)}{hint}")
        if part not in modes:
            modes.append(part)
    return tuple(modes)


def _parse_options(config: pytest.Config) -> RspOptions:
    from rsp_bench.engines import available_engines, declared_modes  # light: no torch
    from rsp_bench.errors import HarnessInputError

    quick = bool(config.getoption("--rsp-quick"))
    raw_sens = config.getoption("--rsp-sensitivity")
    sensitivities = parse_sensitivities(raw_sens if raw_sens is not None else
                                        (QUICK_SENSITIVITIES if quick else DEFAULT_SENSITIVITIES))
    engine = str(config.getoption("--rsp-engine")).strip()
    if engine not in available_engines():
        raise pytest.UsageError(f"--rsp-engine: unknown engine {engine!r}; available: {', '.join(available_engines())}")
    try:
        supported = declared_modes(engine)
    except HarnessInputError as exc:
        raise pytest.UsageError(f"--rsp-engine: {exc}") from None
    raw_modes = config.getoption("--rsp-mode")
    if raw_modes is None:
        # The default is lossy, for an engine that has it; an engine that declared other modes
        # (llama-cpp: "off", one configuration per quantization rung) runs those.
        raw_modes = "lossy" if supported is None or "lossy" in supported else ",".join(supported)
    modes = parse_modes(raw_modes, engine)
    if supported is not None:
        bad = [m for m in modes if m not in supported]
        if bad:
            raise pytest.UsageError(f"--rsp-mode: engine {engine!r} does not support mode {bad[0]!r} "
                                    f"(it supports {', '.join(supported)})")
    raw_max = config.getoption("--rsp-max-new-tokens")
    max_new: int | None = None
    if raw_max is not None:
        try:
            max_new = int(raw_max)
        except ValueError:
            max_new = 0
        if max_new < 1:
            raise pytest.UsageError(f"--rsp-max-new-tokens: {raw_max!r} is not an integer >= 1")
    raw_seed = str(config.getoption("--rsp-subset-seed"))
    if not raw_seed.isdigit():
        raise pytest.UsageError(f"--rsp-subset-seed: {raw_seed!r} is not an integer >= 0")
    subset_seed = int(raw_seed)
    if subset_seed and config.getoption("--rsp-update-baseline"):
        raise pytest.UsageError(f"--rsp-update-baseline needs the baseline's prompts: drop --rsp-subset-seed {raw_seed}")
    folders = {}
    for flag in ("--rsp-results", "--rsp-baselines"):
        folder = Path(config.getoption(flag)).expanduser()
        if not folder.is_absolute():
            folder = Path(config.invocation_params.dir) / folder
        if folder.exists() and not folder.is_dir():
            raise pytest.UsageError(f"{flag}: {str(folder)!r} exists and is not a folder")
        folders[flag] = folder
    results = folders["--rsp-results"]
    model = config.getoption("--rsp-model")
    if model is not None and not Path(model).expanduser().exists():
        raise pytest.UsageError(f"--rsp-model: {model!r} does not exist (a model folder or .gguf file)")
    return RspOptions(model=model, sensitivities=sensitivities, modes=modes, engine=engine, quick=quick,
                      results_dir=results, update_baseline=bool(config.getoption("--rsp-update-baseline")),
                      gate=not config.getoption("--rsp-no-gate"), max_new_tokens=max_new,
                      subset_seed=subset_seed, baselines_dir=folders["--rsp-baselines"],
                      ci=bool(config.getoption("--rsp-ci")), engine_url=config.getoption("--rsp-engine-url"),
                      engine_model=config.getoption("--rsp-engine-model"))


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.stash[_STATE] = _SessionState(_parse_options(config))
    from rsp_bench import distributed

    if distributed.is_controller(config):
        run = distributed.DistributedRun()
        config.stash[_STATE].distributed = run
        config.pluginmanager.register(run, "rsp-bench-distributed")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    from rsp_bench import distributed

    if distributed.worker_id(config) is not None:
        distributed.assign_groups(items)  # before xdist reads the groups (it runs after us)


def _state(config: pytest.Config) -> _SessionState:
    return config.stash[_STATE]


def get_options(config: pytest.Config) -> RspOptions:
    """The parsed options, for collection-time hooks (a suite's pytest_generate_tests)."""
    return _state(config).options


# --------------------------------------------------------------------------- collection


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``rsp_config`` runs once per configuration (ids are the config ids)."""
    if "rsp_config" not in metafunc.fixturenames:
        return
    from rsp_bench.engines import plan_configs

    options = _state(metafunc.config).options
    ids = [s.config_id for s in plan_configs(options.engine, options.modes, options.sensitivities, with_pruning=False)]
    metafunc.parametrize("rsp_config", ids, indirect=True, ids=ids)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.config.stash.get(_STATE, None) is None:
        return
    if any(m.name == "gpu" for m in item.iter_markers()):
        import shutil

        # Cheap check without torch: a CUDA box has nvidia-smi; suites re-check with torch.
        if shutil.which("nvidia-smi") is None:
            pytest.skip("needs a CUDA device (marker gpu)")
    options = _state(item.config).options
    if options.engine != "reference" and any(m.name == "reference_only" for m in item.iter_markers()):
        pytest.skip(f"exercises the reference engine itself; --rsp-engine {options.engine} is measured by the "
                    "equivalence, extraction and throughput suites")
    suites = _state(item.config).suites
    for m in item.iter_markers():
        if m.name in SUITE_MARKERS and m.name not in suites:
            suites.append(m.name)


# --------------------------------------------------------------------------- fixtures


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
    return engine


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
    from rsp_bench.errors import HarnessInputError

    supported = tuple(getattr(rsp_adapter, "modes", ()) or ())
    if supported:
        bad = [m for m in rsp_options.modes if m != "off" and m not in supported]
        if bad:  # an adapter that declared no modes at registration is checked here, at first use
            pytest.exit(f"--rsp-mode: engine {rsp_adapter.name!r} does not support mode {bad[0]!r} "
                        f"(it supports {', '.join(supported)})", returncode=pytest.ExitCode.USAGE_ERROR)
    return plan_configs(rsp_options.engine, rsp_options.modes, rsp_options.sensitivities)


@pytest.fixture
def rsp_config(request: pytest.FixtureRequest, rsp_configs: list["ConfigSpec"]) -> "ConfigSpec":
    wanted = getattr(request, "param", None)
    if wanted is None:
        raise pytest.UsageError("rsp_config is parametrized by the rsp-bench plugin; do not request it indirectly")
    for spec in rsp_configs:
        if spec.config_id == wanted:
            return spec
    raise LookupError(f"configuration {wanted!r} is not in rsp_configs")


@pytest.fixture(scope="session")
def rsp_reference_outputs(pytestconfig: pytest.Config, rsp_adapter_for, rsp_engine):
    from rsp_bench import distributed
    from rsp_bench.engines import ConfigSpec, pruning_config
    from rsp_bench.quality import ReferenceOutputs, reference_cache_dir

    spec = ConfigSpec("reference/off", "reference", "off", None, {}, pruning_config("off"))
    # Workers share one on-disk copy of each reference set (computed once, under a file lock);
    # a single process keeps them in memory only.
    disk = reference_cache_dir(rsp_engine.weights_sha256) if distributed.worker_id(pytestconfig) else None
    return ReferenceOutputs(rsp_adapter_for("reference"), spec, disk=disk)


def _stderr_progress(message: str) -> None:
    print(f"[rsp-bench] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- session end


def _has_metrics(builder: "RunRecordBuilder | None") -> bool:
    return builder is not None and any(c["metrics"] for c in builder.record["configurations"].values())


def _ensure_model(state: _SessionState) -> None:
    """A suite that recorded metrics without loading the engine still needs a model name."""
    builder = state.builder
    if builder is None or builder.record["model"]["name"]:
        return
    from reference_engine.engine import weights_digest
    from reference_engine.model_loading import resolve_model

    name, folder = resolve_model(state.options.model)
    builder.set_model(name, str(state.options.model or folder), weights_digest(folder))


def _partial_reason(session: pytest.Session, exitstatus: int, state: _SessionState) -> str | None:
    """Why this run's record is not a complete measurement (None when it is): an interrupted
    or crashed session, or tests that errored before they could record their figures."""
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return f"session ended with {pytest.ExitCode(exitstatus).name}"
    if state.errored:
        return f"{len(state.errored)} test(s) errored: {', '.join(state.errored[:3])}"
    return None


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> None:
    # A failed setup or teardown is an error (a crashed adapter, a missing model), not a
    # failed quality check: the record it leaves is partial.
    state = item.config.stash.get(_STATE, None)
    if (state is not None and call.when in ("setup", "teardown") and call.excinfo is not None
            and not call.excinfo.errisinstance((pytest.skip.Exception, pytest.xfail.Exception))):
        state.errored.append(item.nodeid.split("::")[-1])


def _merge_workers(session: pytest.Session, state: _SessionState) -> str | None:
    """In an xdist controller: the workers' records folded into this session's builder; returns
    why the merged record is partial (a worker went down, or workers disagreed), or None."""
    from rsp_bench import distributed
    from rsp_bench.records import RunRecordBuilder

    run = state.distributed
    if not run.records and not run.crashed:
        return None
    builder = RunRecordBuilder(quick=state.options.quick, created_utc=state.created_utc)
    merged = distributed.merge_records(run.records, builder)
    workers = max(len(run.records) + len(run.crashed), 1)
    info = {"workers": workers, "hosts": merged["hosts"], "placement": merged["placement"]}
    builder.set_extra("distributed", info)
    if distributed.contended(workers, len(merged["hosts"])):
        builder.set_extra("contended", f"{workers} workers on {len(merged['hosts'])} host(s)")
    state.builder = builder
    state.suites.extend(s for s in builder.record["suites"] if s not in state.suites)
    problems = list(run.crashed) + [f"workers disagree: {c}" for c in merged["conflicts"]]
    return "; ".join(problems) or None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    from rsp_bench import distributed

    if distributed.worker_id(session.config) is not None:
        # A worker hands its record to the controller, which writes one record and gates once.
        if _has_metrics(state.builder):
            for suite in state.suites:
                state.builder.add_suite(suite)
            reason = _partial_reason(session, exitstatus, state)
            if reason:
                state.builder.set_extra("partial", reason)
            _ensure_model(state)
            session.config.workeroutput["rsp_record"] = state.builder.build(
                wall_time_s=round(time.monotonic() - state.started, 3))
        return
    worker_problem = _merge_workers(session, state) if state.distributed is not None else None
    if worker_problem:
        state.summary.append(f"ERROR: distributed run: {worker_problem}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if not _has_metrics(state.builder):
        return
    from rsp_bench.baselines import load_baseline, update_baseline
    from rsp_bench.errors import HarnessInputError
    from rsp_bench.gate import compare

    builder = state.builder
    assert builder is not None
    options = state.options
    lines = state.summary
    for suite in state.suites:
        builder.add_suite(suite)
    partial = _partial_reason(session, exitstatus, state)
    partial = "; ".join(p for p in (partial, worker_problem, builder.record["extra"].get("partial")) if p) or None
    if partial:
        builder.set_extra("partial", partial)
    comparators = sorted(cid for cid, c in builder.record["configurations"].items() if c["engine"] != options.engine)
    if options.engine != "reference" and comparators:
        # Rows of other engines in this engine's record are there only as what it is compared with.
        builder.set_extra("comparators", comparators)
    try:
        _ensure_model(state)
        record = builder.build(wall_time_s=round(time.monotonic() - state.started, 3))
        from rsp_bench.records import write_record

        path = write_record(record, options.results_dir)
    except (HarnessInputError, ValueError, OSError) as exc:
        lines.append(f"ERROR: run record not written: {exc}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return
    lines.append(f"run record: {path}" + (f" (PARTIAL: {partial})" if partial else ""))
    lines.append(_headline_table(record))

    def fail(message: str) -> None:
        lines.append(f"rsp-bench gate FAILED: {message}")
        state.failed_gate = True
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

    try:
        if options.update_baseline:
            if partial:
                fail(f"baseline not updated: the run is partial ({partial})")
                return
            for written in update_baseline(record, options.baselines_dir):
                lines.append(f"baseline updated: {written}")
            return
        if not options.gate:
            lines.append("gate: skipped (--rsp-no-gate)")
            return
        if options.subset_seed:
            lines.append(f"gate: skipped (--rsp-subset-seed {options.subset_seed}: other prompts than the baseline's)")
            return
        found = load_baseline(options.baselines_dir, record)
    except (HarnessInputError, OSError) as exc:
        lines.append(f"ERROR: baseline: {exc}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return
    baseline = found.merged()
    if baseline is None:
        message = (f"no baseline for model {record['model']['name']!r}, engine {options.engine!r} "
                   f"({found.quality_path.name} under {options.baselines_dir}); create one with --rsp-update-baseline")
        if options.ci:
            fail(message)
        else:
            lines.append(f"warning: {message}; nothing gated")
        return
    contended = record["extra"].get("contended")
    reason = (f"timings taken under contention: {contended}" if contended
              else "no speed baseline for this machine")
    report = compare(baseline, record, speed_gated=found.speed is not None and not contended, speed_reason=reason)
    lines.append(report.format_table())
    if contended:
        lines.append(f"speed: reported, not gated: measured with {contended} (run speed with one worker per host)")
    elif found.speed is None:
        lines.append(f"speed: reported, not gated: no speed baseline for machine {record['machine']['fingerprint']} "
                     f"({found.speed_path.name}); quality gated against {found.quality_path.name}")
    if not report.passed:
        state.failed_gate = True
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif options.ci and report.ci_problems():
        fail("in CI mode (--rsp-ci), although no figure regressed: " + "; ".join(report.ci_problems()))


# The figures that fit on one line per configuration; the record holds everything.
_HEADLINE = (("exact_match_rate", "exact"), ("top1_agreement", "top1"), ("kl_mean", "KL mean"),
             ("squad_f1_delta", "SQuAD F1 Δ"), ("json_field_f1_delta", "JSON F1 Δ"),
             ("bypass_ratio", "bypass"), ("blocks_executed_per_token", "blocks/tok"),
             ("speedup_vs_off", "speed-up"))


def _headline_table(record: dict[str, Any]) -> str:
    from tabulate import tabulate

    configs = record["configurations"]
    present = [(name, label) for name, label in _HEADLINE
               if any(name in c["metrics"] for c in configs.values())]
    rows = []
    for config_id in sorted(configs):
        metrics = configs[config_id]["metrics"]
        row = [config_id]
        for name, _ in present:
            m = metrics.get(name)
            row.append("—" if m is None else f"{m['value']:.4g}" + (
                f" [{m['ci'][0]:.3g}, {m['ci'][1]:.3g}]" if m.get("ci") and name != "bypass_ratio" else ""))
        rows.append(row)
    headers = ["configuration"] + [label for _, label in present]
    title = f"model {record['model']['name']} ({'quick' if record['quick'] else 'full'}), wall {record['wall_time_s']:.0f} s"
    return title + "\n" + tabulate(rows, headers=headers, disable_numparse=True)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None or not state.summary:
        return
    terminalreporter.section("rsp-bench", red=state.failed_gate, green=not state.failed_gate and exitstatus == 0)
    for line in state.summary:
        terminalreporter.write_line(line)
    if state.failed_gate:
        terminalreporter.write_line("rsp-bench: the gate failed (reason above): session FAILED", red=True, bold=True)
