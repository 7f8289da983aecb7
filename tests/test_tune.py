"""Unit tests of ``rsp-bench tune`` (rsp_bench/tune.py): the knee and the margin on hand-made
curves, the budget cap, the knee's defining property on random curves, the table round trip
(``recommend_from_table`` reproduces the sweep's recommendation), clear errors, the CLI's
``--from-table``, and one small sweep on the tiny model.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsp_bench.errors import HarnessInputError
from rsp_bench.tune import (QUICK, TuneRow, TuneSettings, budget_cap_index, find_knee, read_table, recommend,
                            recommend_from_table, run_sweep, sweep_sensitivities, table_csv, write_outputs)

S6 = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]


def _rows(quality, speedup, metric="top1_agreement", budget=None, sens=S6) -> list[TuneRow]:
    return [TuneRow(sensitivity=s, metric=metric, quality=q, quality_lo=q - 0.01, quality_hi=min(1.0, q + 0.01),
                    quality_n=100, speedup=v, speedup_lo=v - 0.02, speedup_hi=v + 0.02, speedup_pairs=3,
                    decode_tokens_per_s=25.0 * v, bypass_ratio=min(1.0, s / 2), budget=budget)
            for s, q, v in zip(sens, quality, speedup)]


def test_sweep_sensitivities_span_zero_to_one() -> None:
    assert sweep_sensitivities(6) == S6
    assert sweep_sensitivities(3) == [0.0, 0.5, 1.0]
    with pytest.raises(HarnessInputError, match="--steps must be an integer >= 3"):
        sweep_sensitivities(2)


def test_flat_quality_and_rising_speed_puts_the_knee_at_the_end() -> None:
    rec = recommend(S6, [1.0] * 6, [1.0, 1.05, 1.1, 1.15, 1.2, 1.25], margin=0.05)
    assert rec.knee == 1.0 and rec.sensitivity == 0.95


def test_knee_is_where_quality_starts_falling_faster_than_speed_rises() -> None:
    quality = [1.0, 1.0, 0.99, 0.93, 0.80, 0.50]
    speed = [1.0, 1.05, 1.10, 1.14, 1.16, 1.17]
    # U = 2.00, 2.05, 2.09, 2.07, 1.96, 1.67: the step 0.4 -> 0.6 loses 0.06 quality for 0.04 speed.
    rec = recommend(S6, quality, speed, margin=0.05)
    assert rec.knee == 0.4 and rec.knee_index == 2
    assert rec.sensitivity == 0.35
    assert recommend(S6, quality, speed, margin=0.1).sensitivity == 0.3
    assert recommend(S6, quality, speed, margin=0.0).sensitivity == 0.4


def test_knee_at_zero_recommends_pruning_off() -> None:
    rec = recommend(S6, [1.0, 0.9, 0.8, 0.7, 0.6, 0.5], [1.0, 0.98, 1.01, 1.02, 1.03, 1.05], margin=0.05)
    assert rec.knee == 0.0 and rec.sensitivity == 0.0
    assert "pruning off" in rec.explain()


def test_relative_quality_for_a_metric_below_one() -> None:
    # SQuAD F1 0.5 unpruned: losing 0.05 absolute is 10% relative, more than the 5% speed gained.
    rec = recommend([0.0, 0.5, 1.0], [0.5, 0.45, 0.45], [1.0, 1.05, 1.06], margin=0.05)
    assert rec.knee == 0.0
    rec = recommend([0.0, 0.5, 1.0], [0.5, 0.49, 0.45], [1.0, 1.05, 1.06], margin=0.05)
    assert rec.knee == 0.5 and rec.relative_quality[1] == pytest.approx(0.98)


def test_budget_caps_the_sweep_at_the_first_violation() -> None:
    quality = [1.0, 1.0, 0.99, 0.93, 0.80, 0.50]
    speed = [1.0, 1.05, 1.10, 1.14, 1.16, 1.17]
    assert budget_cap_index(quality, 0.005) == 1
    rec = recommend(S6, quality, speed, margin=0.05, budget=0.005)
    assert rec.knee == 0.2 and rec.sensitivity == 0.15
    # A noisy recovery after the first violation does not reopen the sweep.
    assert budget_cap_index([1.0, 0.97, 0.90, 0.99], 0.05) == 1
    # Float noise must not fail a point exactly on the budget (1 - 0.95 > 0.05 in binary).
    assert budget_cap_index([1.0, 0.95], 0.05) == 1


def test_a_speed_up_within_noise_counts_as_none() -> None:
    quality, speed = [1.0, 1.0, 0.97], [1.0, 1.01, 1.2]
    assert recommend([0.0, 0.5, 1.0], quality, speed, margin=0.05).knee == 1.0  # 2.17 beats 2.01
    # With CIs: 1.01 [0.95, 1.08] is indistinguishable from off; 1.2 [1.1, 1.3] is not.
    rec = recommend([0.0, 0.5, 1.0], quality, speed, margin=0.05, speedup_lo=[1.0, 0.95, 1.1],
                    speedup_hi=[1.0, 1.08, 1.3])
    assert rec.effective_speedup == (1.0, 1.0, 1.2) and rec.knee == 1.0
    rec = recommend([0.0, 0.5, 1.0], [1.0, 1.0, 0.7], speed, margin=0.05, speedup_lo=[1.0, 0.95, 1.1],
                    speedup_hi=[1.0, 1.08, 1.3])
    assert rec.knee == 0.0 and rec.sensitivity == 0.0  # 0.5 only ties with off: the smaller wins


def test_ties_go_to_the_smaller_sensitivity() -> None:
    assert find_knee([0.0, 0.5, 1.0], [1.0, 1.0, 1.0], [1.0, 1.25, 1.25]) == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.05, 1.0), st.floats(0.5, 3.0)), min_size=2, max_size=12))
def test_knee_property_on_random_curves(points) -> None:
    sens = [i / (len(points) - 1) for i in range(len(points))]
    quality = [q for q, _ in points]
    speed = [1.0] + [v for _, v in points[1:]]
    k = find_knee(sens, quality, speed)
    q = [x / quality[0] for x in quality]
    for j in range(len(sens)):
        if j > k:  # after the knee, quality lost is at least the speed gained
            assert q[k] - q[j] >= speed[j] - speed[k] - 1e-12
        if j < k:  # before it, the way to the knee gains more speed than it loses quality
            assert q[j] + speed[j] < q[k] + speed[k]


def test_table_round_trip_reproduces_the_recommendation(tmp_path) -> None:
    rows = _rows([1.0, 0.999, 0.987, 0.92, 0.80, 0.50], [1.0, 1.031, 1.0777, 1.14, 1.16, 1.17], budget=0.1)
    rec, paths = write_outputs(rows, tmp_path / "tune", 0.05, {"model": "synthetic", "setting": "test"})
    assert set(paths) == {"csv", "md", "png"} and all(Path(p).is_file() for p in paths.values())
    assert recommend_from_table(paths["csv"], 0.05) == rec.sensitivity == 0.35
    assert recommend_from_table(paths["csv"], 0.1) == 0.3
    assert recommend_from_table(paths["csv"], 0.05, budget=0.005) == 0.15
    table = read_table(paths["csv"])
    assert table["quality"] == [r.quality for r in rows] and table["speedup"] == [r.speedup for r in rows]
    assert table["budget"] == 0.1 and table["metric"] == "top1_agreement"
    md = Path(paths["md"]).read_text()
    assert "Recommended sensitivity: 0.35" in md and "recommend_from_table" in md
    png = Path(paths["png"]).read_bytes()
    assert png.startswith(b"\x89PNG")
    write_outputs(rows, tmp_path / "again", 0.05, {"model": "synthetic", "setting": "test"})
    assert (tmp_path / "again" / "tune.png").read_bytes() == png, "the plot must be byte-reproducible"


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.replace("sensitivity,", "sens,", 1), "no column"),
    (lambda t: t.replace("\n0.2,", "\nabc,", 1), r":3: sensitivity, quality, speedup, speedup_lo and speedup_hi must be"),
    (lambda t: t.replace("\n0.0,", "\n0.1,", 1), "must start at sensitivity 0"),
    (lambda t: t.replace("\n0.4,top1_agreement", "\n0.4,squad_f1", 1), "mixes metrics"),
])
def test_bad_tables_are_named(tmp_path, edit, match) -> None:
    path = tmp_path / "tune.csv"
    path.write_text(edit(table_csv(_rows([1.0, 0.99, 0.98, 0.97, 0.96, 0.95], [1.0, 1.01, 1.02, 1.03, 1.04, 1.05]))))
    with pytest.raises(HarnessInputError, match=match):
        recommend_from_table(path, 0.05)


def test_bad_arguments_are_named(tmp_path) -> None:
    with pytest.raises(HarnessInputError, match="does not exist"):
        recommend_from_table(tmp_path / "missing.csv", 0.05)
    with pytest.raises(HarnessInputError, match="margin must be a number in"):
        recommend(S6, [1.0] * 6, [1.0] * 6, margin=0.7)
    with pytest.raises(HarnessInputError, match="budget .* must be a number in"):
        recommend(S6, [1.0] * 6, [1.0] * 6, budget=1.5)
    with pytest.raises(HarnessInputError, match="quality at sensitivity 0 is 0.0"):
        recommend([0.0, 1.0], [0.0, 0.0], [1.0, 1.1])
    with pytest.raises(HarnessInputError, match="increase strictly"):
        recommend([0.0, 0.5, 0.5], [1.0] * 3, [1.0] * 3)


def test_cli_from_table(tmp_path, capsys) -> None:
    from rsp_bench.cli import main

    path = tmp_path / "tune.csv"
    path.write_text(table_csv(_rows([1.0, 1.0, 0.99, 0.93, 0.80, 0.50], [1.0, 1.05, 1.10, 1.14, 1.16, 1.17])))
    assert main(["tune", "--from-table", str(path), "--margin", "0.1"]) == 0
    assert "recommended sensitivity: 0.3" in capsys.readouterr().out
    assert main(["tune", "--from-table", str(path), "--margin", "0.9"]) == 2
    assert "margin must be a number in [0, 0.5]" in capsys.readouterr().err


def test_small_sweep_on_the_tiny_model(tiny_engine, tmp_path) -> None:
    tiny = TuneSettings(steps=3, items={"top1_agreement": 3}, max_new_tokens={"top1_agreement": 6}, name="test")
    rows = run_sweep(tiny_engine, "top1_agreement", tiny, budget=0.2, progress=lambda _: None)
    assert [r.sensitivity for r in rows] == [0.0, 0.5, 1.0]
    assert rows[0].quality == 1.0  # s = 0 is pruning off
    # Its speed-up is measured against the pruning-off anchor like every row (an A/A ratio), not a constant.
    assert rows[0].speedup_pairs == rows[1].speedup_pairs >= 1
    assert 0 < rows[0].speedup_lo <= rows[0].speedup <= rows[0].speedup_hi
    for r in rows:
        assert 0.0 <= r.quality_lo <= r.quality <= r.quality_hi <= 1.0
        assert r.speedup > 0 and math.isfinite(r.decode_tokens_per_s) and r.speedup_pairs == 3
    rec, paths = write_outputs(rows, tmp_path, 0.05, {"model": "tiny", "setting": "test"})
    assert recommend_from_table(paths["csv"], 0.05) == rec.sensitivity
    assert QUICK.steps == 6


def test_extraction_sweep_on_the_tiny_model_and_a_zero_baseline(tiny_engine, tmp_path) -> None:
    # JSON documents: the SQuAD passages do not fit the tiny model's 512-token context.
    tiny = TuneSettings(steps=3, items={"json_field_f1": 2}, max_new_tokens={"json_field_f1": 3}, name="test")
    rows = run_sweep(tiny_engine, "json_field_f1", tiny, progress=lambda _: None)
    assert [r.metric for r in rows] == ["json_field_f1"] * 3 and all(r.quality_n == 2 for r in rows)
    if rows[0].quality == 0.0:  # a random model answers nothing right: the curve has no scale
        with pytest.raises(HarnessInputError, match="quality at sensitivity 0 is 0.0"):
            write_outputs(rows, tmp_path, 0.05, {})

