"""Tests of per-machine quality baselines (rsp_bench.baselines.QUALITY_PER_MACHINE): an engine
whose outputs depend on the CPU gets one quality baseline per machine, and every run, on a known
machine or a new one, is judged against the least favourable of the known machines, so a runner
is never red for being new or for running another instruction set under a known fingerprint, and
a real drop below every machine still fails.

Must not import torch, transformers or reference_engine.
"""

from __future__ import annotations

import copy

import pytest

from rsp_bench.baselines import QUALITY_PER_MACHINE, load_baseline, quality_baseline_path, update_baseline
from rsp_bench.errors import RecordError
from rsp_bench.gate import compare
from rsp_bench.records import RunRecordBuilder, validate_record

VERSIONS = {"python": "3.11", "torch": None, "transformers": None, "rsp_bench": "0.1"}
CONFIG = "llama-cpp/q4_1"


def _record(fingerprint: str, f1: float, top1: float = 0.95, engine: str = "llama-cpp") -> dict:
    machine = {"fingerprint": fingerprint, "hostname": "h", "platform": "p", "cpu": "c", "cores": 2,
               "memory_gb": 8.0, "gpu": None}
    b = RunRecordBuilder(model_name="tiny", machine=machine, commit=None, versions_info=VERSIONS, quick=True)
    b.add_metric(CONFIG, "json_field_f1", f1, n=6, unit="fraction")
    b.add_metric(CONFIG, "top1_agreement", top1, n=600, unit="fraction")
    b.set_extra("engine_under_test", engine)
    return b.build(wall_time_s=1.0)


def _verdict(report, metric: str) -> str:
    (row,) = [r for r in report.rows if r["config"] == CONFIG and r["metric"] == metric]
    return row["verdict"]


def test_llama_cpp_quality_is_per_machine_and_the_reference_engines_is_not(tmp_path) -> None:
    assert "llama-cpp" in QUALITY_PER_MACHINE
    intel = _record("aaaaaaaaaaaa", 0.25)
    assert quality_baseline_path(tmp_path, intel).name.endswith("__llama-cpp__aaaaaaaaaaaa.quality.json")
    ref = _record("aaaaaaaaaaaa", 0.25, engine="reference")
    assert quality_baseline_path(tmp_path, ref).name.endswith("__reference.json")


def test_a_full_run_is_judged_only_against_full_runs_per_machine(tmp_path) -> None:
    update_baseline(_record("aaaaaaaaaaaa", 0.25), tmp_path)  # quick
    full = {**_record("aaaaaaaaaaaa", 0.10), "quick": False}
    assert quality_baseline_path(tmp_path, full).name.endswith("__aaaaaaaaaaaa.full.quality.json")
    assert load_baseline(tmp_path, full).quality is None
    update_baseline(full, tmp_path)
    assert load_baseline(tmp_path, full).quality["configurations"][CONFIG]["metrics"]["json_field_f1"]["value"] == 0.10
    assert load_baseline(tmp_path, _record("aaaaaaaaaaaa", 0.25)).quality["configurations"][CONFIG]["metrics"][
        "json_field_f1"]["value"] == 0.25


def test_a_known_machine_is_judged_against_every_machines_figures(tmp_path) -> None:
    # Measured on 2026-12-03: one fingerprint (an AMD EPYC host) gave the AVX2 figures on one day
    # and, with AVX-512 on a later host of the same name, exactly the Intel machine's: so a
    # machine's own file is not the only numerics it may run, and both must pass there.
    update_baseline(_record("aaaaaaaaaaaa", 0.25), tmp_path)
    update_baseline(_record("bbbbbbbbbbbb", 0.15), tmp_path)
    for fp in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"):
        for f1 in (0.15, 0.25):
            run = _record(fp, f1)
            report = compare(load_baseline(tmp_path, run).merged(), run, speed_gated=False)
            assert report.passed and not report.ci_problems(), (fp, f1)
    # below every machine by more than the tolerance: a regression on a known machine too
    worse = _record("aaaaaaaaaaaa", 0.10)
    report = compare(load_baseline(tmp_path, worse).merged(), worse, speed_gated=False)
    assert _verdict(report, "json_field_f1") == "regressed"
    # a single machine's file: judged exactly as before (the range is its own value)
    only = tmp_path / "only"
    update_baseline(_record("aaaaaaaaaaaa", 0.25), only)
    drop = _record("aaaaaaaaaaaa", 0.15)
    assert _verdict(compare(load_baseline(only, drop).merged(), drop, speed_gated=False), "json_field_f1") == "regressed"


def test_a_new_machine_is_gated_against_the_least_favourable_known_one(tmp_path) -> None:
    update_baseline(_record("aaaaaaaaaaaa", 0.25, top1=0.96), tmp_path)
    update_baseline(_record("bbbbbbbbbbbb", 0.15, top1=0.98), tmp_path)
    new = _record("cccccccccccc", 0.16, top1=0.955)
    found = load_baseline(tmp_path, new)
    assert found.quality["extra"]["quality_machines"] == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
    report = compare(found.merged(), new, speed_gated=False)
    assert report.passed and not report.ci_problems()
    row = next(r for r in report.rows if r["metric"] == "json_field_f1")
    assert row["baseline"] == pytest.approx(0.15) and "least favourable" in row["note"]
    worse = _record("cccccccccccc", 0.10, top1=0.93)  # below every known machine by more than the tolerance
    report = compare(load_baseline(tmp_path, worse).merged(), worse, speed_gated=False)
    assert _verdict(report, "json_field_f1") == "regressed" and _verdict(report, "top1_agreement") == "regressed"


def test_a_range_in_a_record_is_validated() -> None:
    rec = _record("aaaaaaaaaaaa", 0.2)
    bad = copy.deepcopy(rec)
    bad["configurations"][CONFIG]["metrics"]["json_field_f1"]["range"] = [0.3, 0.1]
    with pytest.raises(RecordError, match=r"range.*min > max"):
        validate_record(bad)
    bad["configurations"][CONFIG]["metrics"]["json_field_f1"]["range"] = "wide"
    with pytest.raises(RecordError, match=r"range.*expected \[min, max\]"):
        validate_record(bad)


def test_a_per_machine_update_reports_what_moved_against_its_own_file(tmp_path) -> None:
    update_baseline(_record("aaaaaaaaaaaa", 0.25), tmp_path)
    update_baseline(_record("bbbbbbbbbbbb", 0.15), tmp_path)
    moved: list = []
    update_baseline(_record("bbbbbbbbbbbb", 0.16), tmp_path, moved=moved)
    [row] = [r for r in moved if r[1] == "json_field_f1"]
    assert float(row[2]) == pytest.approx(0.15) and float(row[3]) == pytest.approx(0.16)  # b's own, not a's
