"""The between-session drift of speed figures (rsp_bench.speed_drift) and how the gate uses it:
a change inside the drift the same code showed between sessions on this machine kind is not a
regression, a bigger one still is, and the gate's summary names what regressed."""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import pytest

from rsp_bench.baselines import load_baseline, update_baseline
from rsp_bench.gate import compare, configure_gate_parser, run_gate
from rsp_bench.records import RunRecordBuilder, write_record
from rsp_bench.speed_drift import Drift, session_drift, sessions, t_995

MACHINE = {"fingerprint": "f00dfeed0002", "hostname": "h", "platform": "p", "cpu": "c", "cores": 2,
           "memory_gb": 8.0, "gpu": None}
VERSIONS = {"python": "3.11", "torch": None, "transformers": None, "rsp_bench": "0.1"}
CROSS = "llama-cpp/q4_1"


def _run(speedup: float, *, at: str, code: str = "aaaa", machine: dict | None = None, quick: bool = True,
         engine: str = "llama-cpp") -> dict:
    b = RunRecordBuilder(model_name="tiny", machine=machine or MACHINE, commit=None, versions_info=VERSIONS,
                         quick=quick, created_utc=at)
    samples = [speedup * (1 + 0.001 * (i % 3 - 1)) for i in range(12)]
    b.add_metric(CROSS, "speedup_vs_off", statistics.median(samples), n=12, unit="x", samples=samples)
    b.add_metric(CROSS, "top1_agreement", 0.97, n=600, unit="fraction")
    record = b.build(wall_time_s=1.0)
    record["extra"]["code_digest"] = code
    record["extra"]["engine_under_test"] = engine
    return record


def _day(hour: int, minute: int = 0) -> str:
    return f"2026-12-06T{hour:02d}:{minute:02d}:00+00:00"


def test_student_t_is_conservative_between_table_rows() -> None:
    assert t_995(1) == pytest.approx(63.657) and t_995(4) == pytest.approx(4.604)
    assert t_995(11) == pytest.approx(3.169)  # the smaller dof's value: a wider bound
    assert t_995(1000) == pytest.approx(2.576)


def test_sessions_are_cut_at_an_hours_gap() -> None:
    runs = [_run(1.0, at=_day(h, m)) for h, m in ((9, 0), (9, 5), (9, 50), (11, 0), (14, 0), (14, 2))]
    assert [len(s) for s in sessions(runs)] == [3, 1, 2]


def test_drift_pools_session_medians_of_each_code_version_on_a_log_scale() -> None:
    like = _run(2.0, at=_day(23))
    runs = [
        # code aaaa: two sessions, medians 2.0 and 1.6
        _run(2.0, at=_day(1)), _run(2.1, at=_day(1, 5)), _run(1.9, at=_day(1, 10)),
        _run(1.6, at=_day(5)), _run(1.6, at=_day(5, 5)),
        # code bbbb: one session only, so it says nothing about sessions
        _run(5.0, at=_day(7), code="bbbb"), _run(0.5, at=_day(7, 5), code="bbbb"),
        # not like the judged run: another machine kind, a full run, another engine, a partial run
        _run(9.0, at=_day(9), machine={**MACHINE, "fingerprint": "0ther0ther00"}),
        _run(9.0, at=_day(12), quick=False), _run(9.0, at=_day(13), engine="reference"),
        {**_run(9.0, at=_day(15)), "extra": {"code_digest": "aaaa", "engine_under_test": "llama-cpp",
                                             "partial": "interrupted"}},
        like,  # the run being judged never widens its own tolerance
    ]
    drift = session_drift(runs, like, ["speedup_vs_off", "top1_agreement"])
    expected = math.sqrt(2 * (math.log(2.0 / 1.6) / 2) ** 2 / 1)
    assert drift.sigma[(CROSS, "speedup_vs_off")] == pytest.approx(expected)
    assert drift.dof[(CROSS, "speedup_vs_off")] == 1
    assert "2 sessions of 1 engine code version" in drift.basis
    bound = 63.657 * math.sqrt(2) * expected  # Student's t at 0.995 with 1 dof: one session pair knows little
    assert drift.allowance(CROSS, "speedup_vs_off", "higher") == pytest.approx(1 - math.exp(-bound))
    assert drift.allowance(CROSS, "speedup_vs_off", "lower") == pytest.approx(math.exp(bound) - 1)
    assert drift.allowance(CROSS, "kl_mean", "higher") == 0.0
    lonely = session_drift(runs[:3], like, ["speedup_vs_off"])
    assert not lonely.sigma and "no engine code version with runs in two sessions" in lonely.basis


def _baseline(tmp_path: Path) -> Path:
    baselines = tmp_path / "results" / "baselines"
    for minute in (0, 5, 10):
        update_baseline(_run(2.0, at=_day(20, minute)), baselines)
    return baselines


def test_the_gate_allows_the_drift_and_still_fails_past_it(tmp_path: Path) -> None:
    baselines = _baseline(tmp_path)
    sigma = 0.02  # 3 dof: t 5.841 * sqrt(2) * 0.02 = 0.165, a drop to exp(-0.165) = 0.848 is the runner
    drift = Drift(sigma={(CROSS, "speedup_vs_off"): sigma}, dof={(CROSS, "speedup_vs_off"): 3}, basis="test")
    base = load_baseline(baselines, _run(2.0, at=_day(22))).merged()
    drop = _run(2.0 * 0.87, at=_day(22))  # -13%: past the policy's 10%, inside the drift
    assert [r["verdict"] for r in compare(base, drop).rows if r["metric"] == "speedup_vs_off"] == ["regressed"]
    row, = [r for r in compare(base, drop, drift=drift).rows if r["metric"] == "speedup_vs_off"]
    assert row["verdict"] == "ok" and "between-session drift" in row["tolerance"] and "3 dof" in row["tolerance"]
    halved = _run(1.0, at=_day(22))  # an engine half as fast is never the runner
    report = compare(base, halved, drift=drift)
    assert [r["verdict"] for r in report.rows if r["metric"] == "speedup_vs_off"] == ["regressed"]
    # the summary, the last line a CI log shows, names what regressed and by how much
    assert f"regressed: {CROSS} speedup_vs_off -50.0%" in report.summary()
    # a timing figure that is not gated (speed not judged) takes no drift either
    assert compare(base, halved, drift=drift, speed_gated=False, speed_reason="x").passed


def test_the_gate_reads_the_drift_from_the_published_runs_beside_the_baselines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baselines = _baseline(tmp_path)
    results = baselines.parent
    for at, value in ((_day(1), 2.0), (_day(1, 5), 2.0), (_day(6), 1.6), (_day(6, 5), 1.6)):
        write_record(_run(value, at=at), results)
    judged = _run(2.0 * 0.85, at=_day(22))
    found = load_baseline(baselines, judged)
    assert found.drift().dof[(CROSS, "speedup_vs_off")] == 1
    path = write_record(judged, tmp_path / "elsewhere")
    parser = argparse.ArgumentParser()
    configure_gate_parser(parser)
    assert run_gate(parser.parse_args(["--run", str(path), "--baselines", str(baselines)])) == 0
    out = capsys.readouterr().out
    assert "between-session drift from 2 sessions of 1 engine code version" in out
    # with no published runs beside them, the same drop regresses
    lone = tmp_path / "lone" / "baselines"
    for minute in (0, 5, 10):
        update_baseline(_run(2.0, at=_day(20, minute)), lone)
    assert run_gate(parser.parse_args(["--run", str(path), "--baselines", str(lone)])) == 1


OTHER = {**MACHINE, "fingerprint": "0ther0ther00"}
THIRD = {**MACHINE, "fingerprint": "th1rdth1rd00"}


def test_a_machine_kind_with_no_two_sessions_borrows_the_widest_drift_of_another_kind() -> None:
    like = _run(2.0, at=_day(23))
    other = [_run(2.0, at=_day(1), machine=OTHER), _run(1.6, at=_day(5), machine=OTHER)]  # moved 20%
    third = [_run(2.0, at=_day(1), machine=THIRD), _run(1.9, at=_day(5), machine=THIRD)]  # moved 5%
    own_session = [_run(2.0, at=_day(20, m)) for m in (0, 5, 10)]  # three back-to-back runs: no drift of its own
    drift = session_drift([*other, *third, *own_session, like], like, ["speedup_vs_off"])
    key = (CROSS, "speedup_vs_off")
    assert drift.borrowed[key] == "0ther0ther00"  # the wider of the two
    assert drift.sigma[key] == pytest.approx(math.sqrt(2 * (math.log(2.0 / 1.6) / 2) ** 2))
    assert "borrowed from machine kind 0ther0ther00" in drift.describe(*key)
    assert "1 figure(s) with none here borrow the widest drift of another machine kind (0ther0ther00)" in drift.basis
    # once this kind has two sessions of its own, its own drift replaces the borrowed one
    own_later = [_run(1.95, at=_day(22, m)) for m in (0, 5)]
    mine = session_drift([*other, *third, *own_session, *own_later, like], like, ["speedup_vs_off"])
    assert key not in mine.borrowed and mine.sigma[key] == pytest.approx(
        math.sqrt(2 * (math.log(2.0 / 1.95) / 2) ** 2))
    # a kind's drift is never lent across run sizes or engines under test
    assert not session_drift([_run(2.0, at=_day(1), machine=OTHER, quick=False),
                              _run(1.6, at=_day(5), machine=OTHER, quick=False), like], like, ["speedup_vs_off"]).sigma
    assert not session_drift([_run(2.0, at=_day(1), machine=OTHER, engine="reference"),
                              _run(1.6, at=_day(5), machine=OTHER, engine="reference"), like], like,
                             ["speedup_vs_off"]).sigma


def test_the_gate_on_a_new_machine_kind_allows_borrowed_drift_and_says_so(tmp_path: Path) -> None:
    baselines = _baseline(tmp_path)
    results = baselines.parent
    # four sessions of the other kind (3 dof): a bound of about 31%
    for at, value in ((_day(1), 2.0), (_day(4), 1.8), (_day(7), 1.9), (_day(10), 1.85)):
        write_record(_run(value, at=at, machine=OTHER), results)
    judged = _run(2.0 * 0.87, at=_day(22))  # -13%: past the policy's 10%, inside the other kind's drift
    found = load_baseline(baselines, judged)
    row, = [r for r in compare(found.merged(), judged, drift=found.drift()).rows if r["metric"] == "speedup_vs_off"]
    assert row["verdict"] == "ok" and "borrowed from machine kind 0ther0ther00" in row["tolerance"]
    halved = _run(1.0, at=_day(22))  # an engine half as fast is still no drift
    assert not compare(found.merged(), halved, drift=load_baseline(baselines, halved).drift()).passed
