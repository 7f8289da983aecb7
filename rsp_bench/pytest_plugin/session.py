"""The session end of the rsp-bench pytest plugin: errored tests noted as they happen
(``pytest_runtest_makereport``), the workers' records merged in an xdist controller, the run
record written, promoted to the baseline or gated against it, with ``--rsp-ab-base`` an A/B of the
working tree against a git ref (``pytest_sessionfinish``), and
the terminal summary with the headline table (``pytest_terminal_summary``).

Must NOT import rsp_bench.plugin or rsp_bench.pytest_plugin.fixtures; only .state. Must NOT import torch, transformers, reference_engine or rsp_bench.quality at module
import (pytest loads the plugin for every run): anything heavy is imported inside the
function that needs it.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Callable

import pytest

from rsp_bench.pytest_plugin.state import _STATE, _SessionState

if TYPE_CHECKING:
    from rsp_bench.records import RunRecordBuilder


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
        if state.options.ci and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            # A CI session that recorded nothing judged nothing: every suite skipped or deselected.
            state.summary.append("rsp-bench gate FAILED (--rsp-ci): this session recorded no metric, so nothing "
                                 "was gated (were the suites deselected or all skipped?)")
            state.failed_gate = True
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return
    from rsp_bench.baselines import load_baseline, moved_table, update_baseline
    from rsp_bench.records import code_digest
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
    builder.set_extra("code_digest", code_digest())
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
            moved: list[list[str]] = []
            for written in update_baseline(record, options.baselines_dir, reason=options.reason, moved=moved):
                lines.append(f"baseline updated: {written}")
            if not options.reason:
                lines.append("warning: no --rsp-reason given: the baseline records no reason for this update")
            from tabulate import tabulate

            lines.append("what moved:\n" + (tabulate(moved, headers=["configuration", "metric", "old", "new", "change"],
                                                     disable_numparse=True) if moved else "nothing"))
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
    if options.ab_base:
        _ab_against(options.ab_base, options, lines, fail, path, session.config.rootpath)
    baseline = found.merged()
    if baseline is None:
        size = "" if record["quick"] else "full-run "  # a full run is judged only against a full run's baseline
        message = (f"no {size}baseline for model {record['model']['name']!r}, engine {options.engine!r} "
                   f"({found.quality_path.name} under {options.baselines_dir}); create one with --rsp-update-baseline")
        if options.ci:
            fail(message)
        else:
            lines.append(f"warning: {message}; nothing gated")
        return
    contended = record["extra"].get("contended")
    reason = (f"timings taken under contention: {contended} (run speed with one worker per host)" if contended
              else found.speed_problem())
    report = compare(baseline, record, speed_gated=reason is None, speed_reason=reason or "",
                     spread=found.spread(), drift=found.drift())
    lines.append(report.format_table())
    if not report.passed:
        state.failed_gate = True
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif options.ci and report.ci_problems():
        fail("in CI mode (--rsp-ci), although no figure regressed: " + "; ".join(report.ci_problems()))


def ab_command(ref: str, options: Any, record_path: Any, repo: Any = ".") -> list[str]:
    """The ``rsp-bench ab`` run behind ``--rsp-ab-base``: its defaults, the session's model, its
    record beside the session's (same stem, ``.ab.json``) and a pull-request comment (``.ab.md``)."""
    cmd = [sys.executable, "-m", "rsp_bench.cli", "ab", "--base", ref, "--repo", str(repo), "--quiet",
           "--out", str(record_path.with_suffix(".ab.json")), "--markdown", str(record_path.with_suffix(".ab.md"))]
    return cmd + (["--model", str(options.model)] if options.model else [])


def _ab_against(ref: str, options: Any, lines: list[str], fail: Callable[[str], None], record_path: Any,
                repo: Any = ".") -> None:
    import subprocess

    proc = subprocess.run(ab_command(ref, options, record_path, repo), capture_output=True, text=True)
    lines.append(f"A/B against {ref} (`rsp-bench ab --base {ref}`):\n" + proc.stdout.rstrip())
    if proc.returncode == 1:
        fail(f"A/B against {ref}: the working tree is decided slower or its quality regressed (table above)")
    elif proc.returncode != 0:
        fail(f"A/B against {ref} did not run (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")


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
