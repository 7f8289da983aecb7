"""Tests of rsp_bench.gate: policy loading, Mann-Whitney U, planted regressions, noise, CLI glue.

Must not import torch, transformers or reference_engine.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

import pytest

from rsp_bench.baselines import load_baseline, update_baseline
from rsp_bench.errors import PolicyError, RecordError
from rsp_bench.gate import (
    compare,
    configure_gate_parser,
    load_policy,
    mann_whitney_u,
    min_attainable_p,
    run_gate,
)
from rsp_bench.records import KNOWN_METRICS, RunRecordBuilder, write_record

MACHINE = {"fingerprint": "f00dfeed0001", "hostname": "h", "platform": "p", "cpu": "c", "cores": 2,
           "memory_gb": 8.0, "gpu": None}
VERSIONS = {"python": "3.11", "torch": None, "transformers": None, "rsp_bench": "0.1"}
LOSSY = "reference/lossy/s=0.50"


def _record(top1: float = 0.90, speedups: list[float] | None = None, extra_metrics: dict | None = None,
            configs: tuple[str, ...] = (LOSSY,), quick: bool = False) -> dict:
    b = RunRecordBuilder(model_name="tiny", machine=MACHINE, commit=None, versions_info=VERSIONS, quick=quick)
    for config in configs:
        b.add_metric(config, "top1_agreement", top1, n=600, unit="fraction")
        if speedups is not None:
            b.add_metric(config, "speedup_vs_off", statistics.median(speedups), n=len(speedups), unit="x",
                         samples=speedups)
        for name, value in (extra_metrics or {}).items():
            b.add_metric(config, name, value, n=50)
    return b.build(wall_time_s=1.0)


def _noisy(rng: random.Random, center: float, noise: float = 0.05, n: int = 20) -> list[float]:
    return [center * (1.0 + rng.gauss(0.0, noise)) for _ in range(n)]


def _verdict(report, metric: str, config: str = LOSSY) -> str:
    (row,) = [r for r in report.rows if r["config"] == config and r["metric"] == metric]
    return row["verdict"]


# --------------------------------------------------------------------------- Mann-Whitney U


def test_mann_whitney_matches_a_hand_computed_case() -> None:
    # x = 1,2,3 vs y = 4,5,6: U_x = 0, mean 4.5, variance 3*3*7/12 = 5.25,
    # z = (4.5 - 0.5) / sqrt(5.25) = 1.7457, two-sided p = 0.080856.
    u, p = mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert u == 0.0
    assert p == pytest.approx(0.0808556, abs=1e-6)


def test_mann_whitney_ties_and_identical_samples() -> None:
    assert mann_whitney_u([1.0] * 5, [1.0] * 7) == (17.5, 1.0)
    u, p = mann_whitney_u([1, 1, 2, 2], [2, 2, 3, 3])
    assert u == 2.0 and 0.0 < p < 1.0


def test_mann_whitney_agrees_with_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    for _ in range(30):
        x = [round(rng.gauss(1.0, 0.1), 2) for _ in range(rng.randint(1, 30))]
        y = [round(rng.gauss(1.05, 0.1), 2) for _ in range(rng.randint(1, 30))]
        ref = stats.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic", use_continuity=True)
        u, p = mann_whitney_u(x, y)
        assert u == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-12)


def test_min_attainable_p_decides_when_the_test_can_say_anything() -> None:
    assert min_attainable_p(5, 5) > 0.01 > min_attainable_p(6, 6)


# --------------------------------------------------------------------------- policy


def test_default_policy_has_a_rule_for_every_known_metric() -> None:
    policy = load_policy()
    assert policy.alpha == 0.01
    unruled = sorted(m for m in KNOWN_METRICS if policy.rule_for(m) is None)
    assert not unruled
    top1 = policy.rule_for("top1_agreement")
    assert (top1.direction, top1.kind, top1.tolerance, top1.significance) == ("higher", "abs", 0.02, False)
    speed = policy.rule_for("speedup_vs_off")
    assert (speed.direction, speed.kind, speed.tolerance, speed.significance) == ("higher", "rel", 0.10, True)
    assert policy.rule_for("projected_tokens_per_s_H100").pattern == "projected_tokens_per_s_*"
    assert policy.rule_for("my_engine_metric") is None


def test_user_policy_is_layered_over_the_default(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[gate]\nalpha = 0.05\n[metrics]\ntop1_agreement = { direction = "higher", abs = 0.1 }\n'
                    '"my_*" = { direction = "lower", rel = 0.5 }\n', encoding="utf-8")
    policy = load_policy(path)
    assert policy.alpha == 0.05
    assert policy.rule_for("top1_agreement").tolerance == 0.1
    assert policy.rule_for("kl_mean").tolerance == 0.02  # inherited
    assert policy.rule_for("my_metric").direction == "lower"
    path.write_text('[gate]\ninherit_default = false\n[metrics]\nkl_mean = { direction = "none" }\n', encoding="utf-8")
    alone = load_policy(path)
    assert alone.rule_for("top1_agreement") is None and alone.alpha == 0.01


@pytest.mark.parametrize(
    "text, message",
    [
        ('[metrics]\ntop1_agreement = { direction = "up", abs = 0.02 }', "direction 'up' must be one of"),
        ('[metrics]\ntop1_agreement = { direction = "higher" }', "needs a tolerance"),
        ('[metrics]\ntop1_agreement = { direction = "higher", abs = 0.1, rel = 0.1 }', "not abs and rel"),
        ('[metrics]\ntop1_agreement = { direction = "higher", abs = -0.1 }', "abs tolerance -0.1"),
        ('[metrics]\ntop1_agreement = { direction = "higher", abs = 0.1, tol = 1 }', "unknown key(s) 'tol'"),
        ('[metrics]\ntop1_agreement = { direction = "higher", rel = 0.1, significance = "yes" }', "significance 'yes'"),
        ('[metrics]\ntop1_agreement = 0.02', "must be a table"),
        ("[gate]\nalpha = 1.5", "gate.alpha 1.5"),
        ("[gate]\nbeta = 1", "unknown key(s) 'beta'"),
        ("[gates]\nalpha = 0.1", "unknown table(s) 'gates'"),
        ("[metrics\n", "not valid TOML"),
    ],
)
def test_bad_policies_name_the_bad_key_or_value(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="no such policy file"):
        load_policy(tmp_path / "absent.toml")


# --------------------------------------------------------------------------- planted regressions


def test_top1_drop_beyond_tolerance_fails_and_within_passes() -> None:
    base = _record(top1=0.90)
    dropped = compare(base, _record(top1=0.85))
    assert not dropped.passed and _verdict(dropped, "top1_agreement") == "regressed"
    assert "REGRESSED" in dropped.format_table()
    assert dropped.passed is False and len(dropped.regressions) == 1
    within = compare(base, _record(top1=0.89))
    assert within.passed and _verdict(within, "top1_agreement") == "ok"
    exactly = compare(base, _record(top1=0.88))  # a drop equal to the tolerance is allowed
    assert exactly.passed
    better = compare(base, _record(top1=0.95))
    assert better.passed and _verdict(better, "top1_agreement") == "improved"


def test_clearly_slower_speedup_samples_fail() -> None:
    rng = random.Random(1)
    base = _record(speedups=_noisy(rng, 1.5))
    slower = compare(base, _record(speedups=_noisy(rng, 1.5 * 0.7)))
    assert not slower.passed and _verdict(slower, "speedup_vs_off") == "regressed"
    (row,) = [r for r in slower.rows if r["metric"] == "speedup_vs_off"]
    assert row["p_value"] < 1e-4 and row["change"] < -0.2


def test_unchanged_reruns_pass_at_least_19_of_20_seeds() -> None:
    passes = 0
    for seed in range(20):
        rng = random.Random(1000 + seed)
        base = _record(speedups=_noisy(rng, 1.5))
        rerun = _record(speedups=_noisy(rng, 1.5))
        passes += compare(base, rerun).passed
    assert passes >= 19


def test_change_beyond_tolerance_that_noise_explains_is_not_a_regression() -> None:
    # Very noisy samples: the medians differ by ~12% but the sets overlap heavily.
    base_samples = [1.0, 2.0, 1.2, 1.9, 1.1, 1.8, 1.3, 1.7, 1.5, 1.4, 1.6, 1.5]
    now_samples = [v * 0.88 for v in base_samples[::-1]]
    base = _record(speedups=base_samples)
    now = _record(speedups=now_samples)
    report = compare(base, now)
    (row,) = [r for r in report.rows if r["metric"] == "speedup_vs_off"]
    assert row["change"] < -0.10 and row["p_value"] >= 0.01
    assert row["verdict"] == "ok" and "not significant" in row["note"] and report.passed


def test_timing_without_samples_uses_tolerance_alone() -> None:
    base = _record(extra_metrics={"speedup_vs_hf_generate": 1.5})
    report = compare(base, _record(extra_metrics={"speedup_vs_hf_generate": 1.0}))
    assert _verdict(report, "speedup_vs_hf_generate") == "regressed"
    assert any("tolerance alone" in r["note"] for r in report.rows)


def test_absolute_timings_are_reported_not_gated() -> None:
    # Two runs at different times are not comparable on a shared machine (DESIGN.md section 6).
    base = _record(extra_metrics={"decode_tokens_per_s": 25.0})
    report = compare(base, _record(extra_metrics={"decode_tokens_per_s": 15.0}))
    assert _verdict(report, "decode_tokens_per_s") == "info" and report.passed


def test_the_roofline_fraction_is_reported_against_a_baseline_and_floored_by_the_suite() -> None:
    # Stop 50's CI: the STREAM-style read, timed alone, read 6.5% faster than in the baseline runs
    # and moved every fraction with decode unchanged. Its floor is suites/budgets.toml's
    # (tests/test_quality.py checks the floor is there).
    base = _record(extra_metrics={"roofline_fraction": 0.45})
    report = compare(base, _record(extra_metrics={"roofline_fraction": 0.30}))
    assert _verdict(report, "roofline_fraction") == "info" and report.passed


def test_lower_is_better_metrics() -> None:
    base = _record(extra_metrics={"kl_mean": 0.10})
    assert _verdict(compare(base, _record(extra_metrics={"kl_mean": 0.15})), "kl_mean") == "regressed"
    assert _verdict(compare(base, _record(extra_metrics={"kl_mean": 0.05})), "kl_mean") == "improved"


def test_info_new_and_missing_never_fail() -> None:
    base = _record(extra_metrics={"blocks_executed_per_token": 0.2, "kl_p99": 1.0}, configs=(LOSSY, "reference/off"))
    run = _record(extra_metrics={"blocks_executed_per_token": 0.9, "my_engine_metric": 3.0}, configs=(LOSSY, "hf-generate/off"))
    report = compare(base, run)
    assert report.passed
    assert _verdict(report, "blocks_executed_per_token") == "info"
    assert _verdict(report, "my_engine_metric") == "new"
    assert _verdict(report, "kl_p99") == "missing"
    assert _verdict(report, "(all)", config="reference/off") == "missing"
    assert _verdict(report, "(all)", config="hf-generate/off") == "new"
    assert report.counts()["regressed"] == 0


def test_mismatched_records_are_warned_about() -> None:
    base = _record()
    run = _record(quick=True)
    run["machine"] = {**run["machine"], "fingerprint": "0123456789ab"}
    report = compare(base, run)
    text = report.format_table()
    assert "machine.fingerprint differs" in text and "quick" in text


def test_rows_are_in_a_deterministic_order_and_the_table_is_readable() -> None:
    rng = random.Random(3)
    base = _record(speedups=_noisy(rng, 1.5), configs=("z/off", "a/off"))
    report = compare(base, _record(top1=0.5, speedups=_noisy(rng, 1.5), configs=("a/off", "z/off")))
    assert [(r["config"], r["metric"]) for r in report.rows] == [
        ("a/off", "speedup_vs_off"), ("a/off", "top1_agreement"),
        ("z/off", "speedup_vs_off"), ("z/off", "top1_agreement"),
    ]
    table = report.format_table()
    for header in ("config", "metric", "baseline", "now", "change", "verdict"):
        assert header in table
    assert "-40.0%" not in table and "-0.4" in table
    assert table.splitlines()[-1].startswith("rsp-bench gate FAILED: 2 regressed, 2 ok")


def test_compare_rejects_malformed_records() -> None:
    bad = _record()
    del bad["model"]
    with pytest.raises(RecordError, match="baseline: field"):
        compare(bad, _record())


# --------------------------------------------------------------------------- CLI glue


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure_gate_parser(parser)
    return parser.parse_args(argv)


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_record(_record(top1=0.9), tmp_path / "a")
    bad = write_record(_record(top1=0.8), tmp_path / "b")
    good = write_record(_record(top1=0.9), tmp_path / "c")
    assert run_gate(_args(["--baseline", str(base), "--run", str(bad)])) == 1
    assert "REGRESSED" in capsys.readouterr().out
    assert run_gate(_args(["--baseline", str(base), "--run", str(good)])) == 0
    assert "PASSED" in capsys.readouterr().out
    broken = tmp_path / "broken.json"
    broken.write_text("[]", encoding="utf-8")
    with pytest.raises(RecordError, match="broken.json"):
        run_gate(_args(["--baseline", str(broken), "--run", str(good)]))


def test_cli_defaults_find_the_newest_run_and_its_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    write_record(_record(top1=0.8), results)
    baselines = ["--baselines", str(results / "baselines")]
    assert run_gate(_args(["--results", str(results), *baselines])) == 0
    assert "no full-run baseline" in capsys.readouterr().err  # _record() is a full run
    assert run_gate(_args(["--results", str(results), *baselines, "--ci"])) == 1
    assert "FAILED (--ci): no full-run baseline" in capsys.readouterr().err
    update_baseline(_record(top1=0.9), results / "baselines")
    assert run_gate(_args(["--results", str(results), *baselines])) == 1
    with pytest.raises(RecordError, match="no run records"):
        run_gate(_args(["--results", str(tmp_path / "empty")]))


def test_on_another_machine_quality_is_gated_and_speed_is_reported(tmp_path: Path) -> None:
    baselines = tmp_path / "baselines"
    update_baseline(_record(top1=0.9, speedups=[1.2] * 8), baselines)
    run = _record(top1=0.9, speedups=[0.5] * 8)  # far slower: a different machine
    run["machine"] = {**run["machine"], "fingerprint": "0123456789ab"}
    found = load_baseline(baselines, run)
    assert found.quality is not None and found.speed is None
    report = compare(found.merged(), run, speed_gated=found.speed is not None)
    verdicts = {r["metric"]: r["verdict"] for r in report.rows}
    assert verdicts == {"top1_agreement": "ok", "speedup_vs_off": "info"}
    assert report.passed and "speed reported, not gated" in report.summary()
    # A planted quality regression still fails there.
    worse = _record(top1=0.5)
    worse["machine"] = run["machine"]
    assert not compare(found.merged(), worse, speed_gated=False).passed


def test_ci_problems_name_configurations_without_a_baseline_and_empty_comparisons() -> None:
    base = _record(top1=0.9)
    run = _record(top1=0.9, configs=(LOSSY, "reference/lossy/s=1.00"))
    report = compare(base, run)
    assert report.passed and report.ci_problems() == ["1 configuration(s) have no baseline: reference/lossy/s=1.00"]
    disjoint = compare(base, _record(configs=("other/off",)))
    assert "no metric was gated" in disjoint.ci_problems()
    assert compare(base, _record(top1=0.9)).ci_problems() == []


def test_ci_mode_fails_a_quality_figure_that_improved_but_not_a_faster_run() -> None:
    # A swapped quantization that happens to score better is still a changed engine: CI wants
    # its new baseline in the same change. A faster run is the machine's business.
    base = _record(top1=0.90, speedups=[1.0] * 8)
    better = compare(base, _record(top1=0.95, speedups=[1.0] * 8))
    assert better.passed and _verdict(better, "top1_agreement") == "improved"
    [problem] = better.ci_problems()
    assert "1 quality figure(s) improved" in problem and f"{LOSSY} top1_agreement" in problem
    faster = compare(base, _record(top1=0.90, speedups=[1.5] * 8))
    assert _verdict(faster, "speedup_vs_off") == "improved" and faster.ci_problems() == []


# --------------------------------------------------------------------------- issue 24: every check can fail

REPO = Path(__file__).resolve().parents[1]


def _speed_only(record: dict, config: str = "served-reference-load/off") -> dict:
    record["configurations"][config] = {"engine": "served-reference", "mode": "off", "sensitivity": None,
                                        "params": {}, "metrics": {
                                            "load_tokens_per_s": {"value": 40.0, "n": 12, "ci": None, "unit": "tokens/s"}}}
    return record


def test_a_never_seen_machine_passes_ci_with_speed_reported_not_gated(tmp_path: Path) -> None:
    baselines = tmp_path / "baselines"
    update_baseline(_speed_only(_record(top1=0.9, speedups=[1.2] * 8)), baselines)
    run = _speed_only(_record(top1=0.9, speedups=[1.1] * 8))
    run["machine"] = {**run["machine"], "fingerprint": "0123456789ab"}
    found = load_baseline(baselines, run)
    report = compare(found.merged(), run, speed_gated=found.speed_problem() is None,
                     speed_reason=found.speed_problem() or "")
    assert report.passed and report.ci_problems() == []
    assert _verdict(report, "load_tokens_per_s", "served-reference-load/off") == "info"
    assert "not gated" in report.speed_line() and "rsp-bench ab" in report.speed_line()


def test_the_committed_baseline_run_relabelled_as_a_new_machine_passes_rsp_bench_gate_ci(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    # the run the committed reference baseline was made from, whichever it is today
    baseline = REPO / "results" / "baselines" / "SmolLM2-135M-Instruct__a672150fb4f9__reference.json"
    run_id = json.loads(baseline.read_text(encoding="utf-8"))["run_id"]
    source = REPO / "results" / "runs" / f"{run_id}.json"
    record = json.loads(source.read_text(encoding="utf-8"))
    record["machine"] = {**record["machine"], "fingerprint": "000000000000"}
    relabelled = tmp_path / "run.json"
    relabelled.write_text(json.dumps(record), encoding="utf-8")
    code = run_gate(_args(["--run", str(relabelled), "--baselines", str(REPO / "results" / "baselines"), "--ci"]))
    out = capsys.readouterr()
    assert code == 0, out.out[-2000:] + out.err
    assert "speed: reported, not gated" in out.out


def test_holm_controls_the_family_and_keeps_a_clear_signal() -> None:
    from rsp_bench.gate import holm_reject

    assert holm_reject([0.001, 0.02, 0.04], 0.05) == [True, True, True]   # 0.05/3, 0.05/2, 0.05/1
    assert holm_reject([0.02, 0.001, 0.04], 0.05) == [True, True, True]
    assert holm_reject([0.03, 0.001, 0.04], 0.05) == [False, True, False]  # 0.03 > 0.05/2 stops it
    assert holm_reject([0.004, 0.004, 0.004, 0.004, 0.004, 0.004], 0.01) == [False] * 6
    # A real shift of one metric among many unchanged ones is still caught.
    rng = random.Random(11)
    base = _record(speedups=_noisy(rng, 1.5), extra_metrics={})
    run = _record(speedups=_noisy(rng, 1.1))
    assert _verdict(compare(base, run), "speedup_vs_off") == "regressed"


def test_unchanged_timing_reruns_with_seven_metrics_fail_under_one_in_twenty() -> None:
    # Seven timing tests a comparison (as in a quick CI run), 200 unchanged reruns.
    names = [f"speedup_vs_off_{i}" for i in range(7)]
    policy_rules = load_policy()
    failures = 0
    rng = random.Random(5)
    for _ in range(200):
        b = RunRecordBuilder(model_name="tiny", machine=MACHINE, commit=None, versions_info=VERSIONS, quick=False)
        r = RunRecordBuilder(model_name="tiny", machine=MACHINE, commit=None, versions_info=VERSIONS, quick=False)
        for name in names:
            for builder in (b, r):
                xs = _noisy(rng, 1.5, noise=0.15, n=24)
                builder.add_metric(f"c/{name}", "speedup_vs_off", statistics.median(xs), n=24, unit="x", samples=xs)
        failures += not compare(b.build(1.0), r.build(1.0), policy_rules).passed
    assert failures / 200 < 0.05


def test_a_fraction_at_its_floor_is_reported_not_gated() -> None:
    base = _record(extra_metrics={"squad_em": 0.0})
    for key in ("squad_em",):
        base["configurations"][LOSSY]["metrics"][key]["unit"] = "fraction"
    run = _record(extra_metrics={"squad_em": 0.0})
    run["configurations"][LOSSY]["metrics"]["squad_em"]["unit"] = "fraction"
    (row,) = [r for r in compare(base, run).rows if r["metric"] == "squad_em"]
    assert row["verdict"] == "info" and "floor" in row["note"]


def test_flips_tolerate_one_prompt_and_fail_two() -> None:
    def rec(value: float, n: int) -> dict:
        b = RunRecordBuilder(model_name="tiny", machine=MACHINE, commit=None, versions_info=VERSIONS, quick=True)
        b.add_metric(LOSSY, "exact_match_rate", value, n=n, unit="fraction")
        return b.build(wall_time_s=1.0)

    assert _verdict(compare(rec(0.5, 8), rec(0.375, 8)), "exact_match_rate") == "ok"       # one of 8 flipped
    assert _verdict(compare(rec(0.5, 8), rec(0.25, 8)), "exact_match_rate") == "regressed"  # two of 8
    assert _verdict(compare(rec(0.5, 40), rec(0.45, 40)), "exact_match_rate") == "regressed"  # two of 40
    row = next(r for r in compare(rec(0.5, 8), rec(0.5, 8)).rows if r["metric"] == "exact_match_rate")
    assert row["tolerance"] == "↑ ±1/8"


def test_pruning_that_stops_fails_on_the_bypass_ratio() -> None:
    base = _record(extra_metrics={"bypass_ratio": 0.022})
    base["configurations"][LOSSY]["metrics"]["bypass_ratio"]["unit"] = "fraction"
    stopped = _record(extra_metrics={"bypass_ratio": 0.0})
    assert _verdict(compare(base, stopped), "bypass_ratio") == "regressed"
    assert _verdict(compare(base, _record(extra_metrics={"bypass_ratio": 0.021})), "bypass_ratio") == "ok"


def test_ci_fails_what_the_run_lost_and_quality_nothing_judged() -> None:
    base = _record(top1=0.9, extra_metrics={"kl_mean": 0.1}, configs=(LOSSY, "reference/off"))
    lost_config = compare(base, _record(top1=0.9, extra_metrics={"kl_mean": 0.1}))
    assert any("not in this run" in p and "reference/off" in p for p in lost_config.ci_problems())
    lost_metric = compare(base, _record(top1=0.9, configs=(LOSSY, "reference/off")))
    assert any("kl_mean" in p for p in lost_metric.ci_problems())
    unjudged = compare(_record(top1=0.9), _record(top1=0.9, extra_metrics={"kl_mean": 0.1}))
    assert any("no baseline value" in p for p in unjudged.ci_problems())
    # a quick run against a full baseline holds a subset: losing rows is expected there
    assert not [p for p in compare(base, _record(top1=0.9, quick=True)).ci_problems() if "not in this run" in p]


def test_rsp_bench_gate_honours_contended_timings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baselines = tmp_path / "baselines"
    for _ in range(3):
        update_baseline(_record(top1=0.9, speedups=[1.5] * 12), baselines)
    slow = _record(top1=0.9, speedups=[0.7] * 12)
    path = write_record(slow, tmp_path / "results")
    assert run_gate(_args(["--run", str(path), "--baselines", str(baselines)])) == 1
    capsys.readouterr()
    slow["extra"]["contended"] = "2 workers on 1 host(s)"
    path = write_record(slow, tmp_path / "results2")
    assert run_gate(_args(["--run", str(path), "--baselines", str(baselines)])) == 0
    assert "contention" in capsys.readouterr().out


def test_a_speed_baseline_gates_from_three_runs_of_the_same_code_and_a_stale_one_not(tmp_path: Path) -> None:
    baselines = tmp_path / "baselines"

    def run(code: str, center: float) -> dict:
        r = _record(top1=0.9, speedups=[center] * 12)
        r["extra"]["code_digest"] = code
        return r

    for i in range(2):
        update_baseline(run("aaaa", 1.5), baselines)
        found = load_baseline(baselines, run("aaaa", 1.5))
        assert found.speed_runs == i + 1 and "3 are needed" in found.speed_problem()
    update_baseline(run("aaaa", 1.6), baselines)
    found = load_baseline(baselines, run("aaaa", 1.5))
    assert found.speed_runs == 3 and found.speed_problem() is None
    assert found.spread()[(LOSSY, "speedup_vs_off")] == pytest.approx(0.1 / 1.5, rel=1e-3)
    stale = load_baseline(baselines, run("bbbb", 1.5))
    assert "stale" in stale.speed_problem() and "aaaa" in stale.speed_problem()
    # the next update on other code starts the speed baseline over
    update_baseline(run("bbbb", 1.5), baselines)
    assert load_baseline(baselines, run("bbbb", 1.5)).speed_runs == 1


def test_a_baseline_update_is_reviewable(tmp_path: Path) -> None:
    import json

    from rsp_bench.baselines import samples_path

    baselines = tmp_path / "baselines"
    update_baseline(_record(top1=0.123456789, speedups=[1.2345678] * 8), baselines, reason="first")
    moved: list[list[str]] = []
    quality, speed = update_baseline(_record(top1=0.9, speedups=[1.2345678] * 8), baselines,
                                     reason="kernel v2", moved=moved)
    assert [row[:2] for row in moved if row[1] == "top1_agreement"] == [[LOSSY, "top1_agreement"]]
    written = json.loads(quality.read_text())
    assert written["extra"]["baseline_reason"] == "kernel v2"
    assert written["configurations"][LOSSY]["metrics"]["top1_agreement"]["value"] == 0.9
    sp = json.loads(speed.read_text())
    assert "samples" not in sp["configurations"][LOSSY]["metrics"]["speedup_vs_off"]
    assert json.loads(samples_path(speed).read_text())[LOSSY]["speedup_vs_off"] == [1.23457] * 16  # two runs pooled
    found = load_baseline(baselines, _record())
    assert found.speed["configurations"][LOSSY]["metrics"]["speedup_vs_off"]["samples"]
    with pytest.raises(Exception, match="reason"):
        update_baseline(_record(), baselines, reason="  ")


def test_gate_markdown_is_a_pull_request_comment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_record(_record(top1=0.9), tmp_path / "a")
    run = write_record(_record(top1=0.5), tmp_path / "b")
    assert run_gate(_args(["--baseline", str(base), "--run", str(run), "--markdown"])) == 1
    out = capsys.readouterr().out
    assert out.startswith("### rsp-bench gate **FAILED**") and "| REGRESSED" in out.replace("|  ", "| ")
