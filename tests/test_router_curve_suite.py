"""Tests of the router curve as run-record figures (rsp_bench.router_curve): recorded, gated,
shown on the leaderboard, and the suite's quick-run skip. Small synthetic curves, no model: this
judges the recording, the gate and the tables, not a measurement (suites/test_router_curve.py
measures).

Must not import torch, transformers or reference_engine.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rsp_bench.gate import compare
from rsp_bench.leaderboard import build_leaderboard, render_markdown
from rsp_bench.records import RunRecordBuilder
from rsp_bench.router_curve import (
    CURVE_MODES,
    curve_from_record,
    curve_rows,
    curve_speed_rows,
    record_curve,
    record_curves,
)

REPO = Path(__file__).resolve().parents[1]
MACHINE = {"fingerprint": "f00dfeed0001", "hostname": "h", "platform": "p", "cpu": "c", "cores": 2,
           "memory_gb": 8.0, "gpu": None}
VERSIONS = {"python": "3.11", "torch": None, "transformers": None, "rsp_bench": "0.1"}
POINT = "reference/router-curve/target={}"


def _curve(lead: float = 0.05, kl: float = 0.20, bytes_: float = 1.0) -> dict:
    """The shape of router_curve_measure.measure_curve's result plus the suite's metadata: two
    targets, the router ``lead`` top-1 points above the best static removal of the same bytes."""
    chosen = {1: 0.05, 3: 0.12}
    rows, speed = [], []
    for (t, s), static in zip(chosen.items(), (0.85, 0.70)):
        router = {"sensitivity": s, "top1": static + lead, "kl": kl * t, "blocks_worth": bytes_ * t,
                  "router_ms_per_token": 0.1, "positions": 248, "degraded_prompts": 0}
        st = {"unit_bi": {"top1": static - 0.05, "kl": 0.3 * t}, "block_bi": {"top1": static, "kl": 0.25 * t}}
        rows.append({"target_blocks_worth": t, "router": router, "static": st, "best_static": "block_bi",
                     "random": {"top1": static - 0.2, "kl": 1.0, "top1_per_seed": [static - 0.21, static - 0.19]},
                     "router_minus_static_unit_bi_top1": lead + 0.05, "router_minus_best_static_top1": lead})
        speed.append({"sensitivity": s, "speedup": 1.0 + 0.02 * t, "speedup_lo": 0.98, "speedup_hi": 1.1 + 0.02 * t,
                      "ideal_speedup": 1.0 + 0.03 * t, "blocks_worth": 1.7 * t, "router_ms_per_token": 0.12,
                      "pairs": 8, "off_ms_per_token": 25.0, "pair_ratios": [1.0 + 0.02 * t + 0.001 * i for i in range(8)]})
    return {"tune_grid": [], "chosen_sensitivities": chosen, "held_out": rows, "speed": speed, "static_orders": {},
            "predictor_report": {}, "held_out_source": "built-in HELD_OUT_PROMPTS", "held_out_prompts": 8,
            "tune_prompts": 8, "tokens": 32, "kernel": "native", "threads": 2,
            "command": "pytest suites/test_router_curve.py --rsp-curve-prompts 8 --rsp-curve-targets 1,3"}


def _record(curve: dict, run_id: str = "20250101T000000Z-000001", created: str = "2025-01-01T00:00:00+00:00",
            with_off: bool = False) -> dict:
    b = RunRecordBuilder(model_name="tiny", machine=MACHINE, commit=None, versions_info=VERSIONS, run_id=run_id,
                         created_utc=created, quick=False)
    if with_off:
        b.add_metric("reference/off", "top1_agreement", 1.0, n=10, unit="fraction")
    record_curve(b, curve)
    return b.build(wall_time_s=1.0)


def _verdicts(report) -> dict[tuple[str, str], str]:
    return {(r["config"], r["metric"]): r["verdict"] for r in report.rows}


# --------------------------------------------------------------------------- gate


def test_gate_fails_a_curve_whose_top1_lead_over_static_regressed() -> None:
    baseline = _record(_curve(lead=0.05))
    report = compare(baseline, _record(_curve(lead=0.02)))  # three points of lead lost, tolerance two
    assert not report.passed
    v = _verdicts(report)
    assert v[(POINT.format(1), "top1_agreement_vs_static")] == "regressed"
    assert v[(POINT.format(3), "top1_agreement_vs_static")] == "regressed"
    assert v[(POINT.format(1), "top1_agreement")] == "regressed"  # the static side held: the router lost it


def test_gate_fails_a_curve_whose_kl_regressed() -> None:
    report = compare(_record(_curve(kl=0.20)), _record(_curve(kl=0.23)))  # +0.03 nats at target 1, +0.09 at 3
    assert not report.passed
    v = _verdicts(report)
    assert v[(POINT.format(1), "kl_mean")] == "regressed" and v[(POINT.format(3), "kl_mean")] == "regressed"
    assert v[(POINT.format(1), "kl_mean_vs_static")] == "regressed"  # static held: the router's KL rose
    assert v[(POINT.format(3), "kl_mean_vs_static")] == "regressed"
    assert v[(POINT.format(1), "top1_agreement_vs_static")] == "ok"


def test_gate_passes_an_unchanged_curve_and_one_within_tolerance_having_judged_it() -> None:
    baseline = _record(_curve())
    for now in (_curve(), _curve(lead=0.04, kl=0.205)):  # one point of lead, 0.005-0.015 nats: inside
        report = compare(baseline, _record(now))
        assert report.passed, report.format_table()
        v = _verdicts(report)
        for t in (1, 3):
            for metric in ("top1_agreement_vs_static", "kl_mean_vs_static", "top1_agreement", "kl_mean",
                           "blocks_skipped_per_token"):
                assert v[(POINT.format(t), metric)] == "ok", (t, metric)  # judged, not info
            assert v[(POINT.format(t), "static_top1_agreement")] == "info"  # the comparison row: reported


def test_gate_fails_a_curve_point_that_skips_a_quarter_fewer_bytes() -> None:
    report = compare(_record(_curve(bytes_=1.0)), _record(_curve(bytes_=0.7)))
    assert _verdicts(report)[(POINT.format(1), "blocks_skipped_per_token")] == "regressed"


# --------------------------------------------------------------------------- record and leaderboard


def test_a_recorded_curve_renders_as_the_command_s_file_does() -> None:
    curve = _curve()
    back = curve_from_record(_record(curve))
    assert curve_rows(back) == curve_rows(curve)
    assert curve_speed_rows(back) == curve_speed_rows(curve)
    # each speed-up sits beside the bytes its own timed run skipped, not the quality row's
    assert [r[1] for r in curve_speed_rows(back)] == ["1.70", "5.10"]
    assert [r[1] for r in curve_rows(back)] == ["1.00", "3.00"]
    record = _record(curve)
    speed = record["configurations"]["reference/router-curve-speed/target=3"]["metrics"]
    assert speed["speedup_vs_off"]["samples"] == curve["speed"][1]["pair_ratios"]
    assert speed["speedup_vs_off"]["ci"] == [0.98, pytest.approx(1.16)]
    assert record["extra"]["router_curve"]["chosen_sensitivities"] == {"1": 0.05, "3": 0.12}


def test_the_leaderboard_shows_the_newest_recorded_curve_outside_its_main_table() -> None:
    old = _record(_curve(lead=0.01), with_off=True)
    new = _record(_curve(lead=0.07), "20250201T000000Z-000002", "2025-02-01T00:00:00+00:00", with_off=True)
    rows = build_leaderboard([old, new])
    assert rows and not any(r["configuration"].split("/")[1] in CURVE_MODES for r in rows)
    [curve] = record_curves([old, new])
    assert curve["run_id"] == new["run_id"]
    md = render_markdown([old, new], curves=record_curves([old, new]))
    assert "+7.0 pts" in md and "+1.0 pts" not in md
    assert "Measured by `pytest suites/test_router_curve.py" in md and "From run record 20250201T000000Z-000002" in md
    assert "### Measured speed, at the bytes each timed run skipped" in md
    assert record_curves([{**new, "configurations": {}}]) == []  # a record without a curve has none


# --------------------------------------------------------------------------- the suite


def test_the_suite_is_skipped_under_quick_before_it_is_named_in_the_record() -> None:
    spec = importlib.util.spec_from_file_location("_router_curve_suite", REPO / "suites" / "test_router_curve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports pytest only: the measurement is imported in the fixture
    [skip] = [m for m in module.pytestmark if m.name == "skipif"]
    condition = skip.args[0]

    class Config:
        def __init__(self, quick: bool) -> None:
            self.quick = quick

        def getoption(self, name: str) -> bool:
            assert name == "--rsp-quick"
            return self.quick

    assert eval(condition, {"config": Config(True)}) is True
    assert eval(condition, {"config": Config(False)}) is False
    assert "full run only" in skip.kwargs["reason"]
    assert {m.name for m in module.pytestmark} >= {"router_curve", "reference_only"}


def test_curve_options_are_checked(tmp_path: Path) -> None:
    from rsp_bench.pytest_plugin.options import _parse_curve_options

    class Config:
        def __init__(self, **given) -> None:
            self.given = {"--rsp-curve-prompts": "8", "--rsp-curve-targets": "1,3,6", "--rsp-curve-held-out": None,
                          **given}
            self.invocation_params = type("P", (), {"dir": tmp_path})()

        def getoption(self, name: str):
            return self.given[name]

    assert _parse_curve_options(Config()) == (8, (1, 3, 6), None)
    assert _parse_curve_options(Config(**{"--rsp-curve-targets": "6,1,1"}))[1] == (1, 6)
    for bad in ({"--rsp-curve-prompts": "0"}, {"--rsp-curve-targets": "1,9"}, {"--rsp-curve-targets": "x"},
                {"--rsp-curve-held-out": "missing.jsonl"}):
        with pytest.raises(pytest.UsageError, match="--rsp-curve-"):
            _parse_curve_options(Config(**bad))
    (tmp_path / "p.jsonl").write_text('{"text": "hi"}\n')
    assert _parse_curve_options(Config(**{"--rsp-curve-held-out": "p.jsonl"}))[2] == tmp_path / "p.jsonl"
