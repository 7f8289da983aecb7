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
  rsp_prefill_once       module scope: each batch-1 prompt prefilled once for the module's
                         configurations (the quality suites use it; the same bits, no prefill time)
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

Layout (one concept per module): this module is the entry point and holds the
configure and collection hooks; the rest lives in rsp_bench.pytest_plugin (options: the
options and their parsing; state: the per-session state; fixtures: the fixtures; session:
the record, gate and summary at session end), whose hooks and fixtures are imported here,
into the namespace where pytest looks for them.
"""

from __future__ import annotations

import pytest

from rsp_bench.pytest_plugin.fixtures import (  # noqa: F401  (fixtures: pytest finds them here)
    _stderr_progress,
    rsp_adapter,
    rsp_adapter_for,
    rsp_config,
    rsp_configs,
    rsp_engine,
    rsp_options,
    rsp_peer,
    rsp_prefill_once,
    rsp_record,
    rsp_reference_outputs,
)
from rsp_bench.pytest_plugin.options import (  # noqa: F401  (re-exported)
    _MODE_NAME,
    DEFAULT_BASELINES,
    DEFAULT_RESULTS,
    DEFAULT_SENSITIVITIES,
    MARKERS,
    QUICK_SENSITIVITIES,
    REFERENCE_MODES,
    SUITE_MARKERS,
    RspOptions,
    _parse_options,
    parse_modes,
    parse_sensitivities,
    pytest_addoption,
)
from rsp_bench.pytest_plugin.session import (  # noqa: F401  (hooks: pytest finds them here)
    _HEADLINE,
    _ensure_model,
    _has_metrics,
    _headline_table,
    _merge_workers,
    _partial_reason,
    pytest_runtest_makereport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
from rsp_bench.pytest_plugin.state import _STATE, _SessionState, _state, get_options  # noqa: F401

__all__ = ["RspOptions", "MARKERS", "SUITE_MARKERS", "get_options", "parse_sensitivities", "parse_modes"]


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.stash[_STATE] = _SessionState(_parse_options(config))
    config.pluginmanager.register(_ModuleLast(), "rsp-bench-module-last")
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


class _ModuleLast:
    """Moves tests marked ``rsp_module_last`` after the other tests of their module, keeping
    every other order (``--rsp-reverse``, and ``-p`` plugins that shuffle or reverse): registered
    as its own plugin so its hook can run last."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if config.getoption("--rsp-reverse", default=False):
            items.reverse()
        last = [i for i in items if i.get_closest_marker("rsp_module_last") is not None]
        if not last:
            return
        moved = set(map(id, last))
        out = [i for i in items if id(i) not in moved]
        for item in last:  # after the last remaining item of its module, in their own order
            mod = getattr(item, "module", None)
            where = max((k for k, i in enumerate(out) if getattr(i, "module", None) is mod), default=len(out) - 1)
            out.insert(where + 1, item)
        items[:] = out


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
