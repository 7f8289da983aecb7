"""The unit router's sensitivity scale (reference_engine.sensitivity_scale): inversion, storage,
and the engine taking it (the unit router's threshold scale is the scale's, not the raw knob)."""

from __future__ import annotations

import json
import math

import pytest

from reference_engine import sensitivity_scale as ss

SHA = "ab" * 32
POINTS = ((0.01, 0.01), (0.05, 0.05), (0.1, 0.10), (0.2, 0.20), (0.4, 0.33))


def scale(points=POINTS) -> ss.SensitivityScale:
    return ss.SensitivityScale(SHA, points)


def test_zero_sensitivity_means_no_pruning_and_the_scale_rises_with_the_knob() -> None:
    sc = scale()
    assert sc.internal_for(0.0) == 0.0
    values = [sc.internal_for(s / 20) for s in range(1, 21)]
    assert all(b >= a for a, b in zip(values, values[1:]))
    assert values[-1] <= POINTS[-1][0]


def test_a_measured_point_maps_back_to_its_own_scale() -> None:
    sc = scale()
    # sensitivity 0.5 asks for 10% (SHARE_AT_FULL 0.2), measured exactly at scale 0.1
    assert sc.target_share(0.5) == pytest.approx(0.10)
    assert sc.internal_for(0.5) == pytest.approx(0.1)
    assert sc.internal_for(1.0) == pytest.approx(0.2)
    # between two points: log-linear in scale, linear in share
    mid = sc.internal_for(0.75)  # 15%: halfway between 10% at 0.1 and 20% at 0.2
    assert mid == pytest.approx(math.sqrt(0.1 * 0.2))


def test_below_the_first_point_proportional_and_above_the_last_capped() -> None:
    sc = ss.SensitivityScale(SHA, ((0.02, 0.04), (0.1, 0.08)))
    assert sc.internal_for(0.1) == pytest.approx(0.02 * 0.02 / 0.04)  # target 2%, first point 4%
    assert sc.internal_for(1.0) == 0.1  # 20% asked, 8% is the most measured
    assert sc.max_share == 0.08


@pytest.mark.parametrize("points", [
    ((0.1, 0.1),),  # one point
    ((0.1, 0.1), (0.05, 0.2)),  # scale not rising
    ((0.1, 0.2), (0.2, 0.1)),  # share falling
    ((0.0, 0.0), (0.1, 0.1)),  # a scale of 0
    ((0.1, float("nan")), (0.2, 0.3)),
])
def test_bad_points_are_refused(points) -> None:
    with pytest.raises(ValueError, match="sensitivity scale"):
        ss.SensitivityScale(SHA, points)


def test_monotone_raises_dips_to_the_best_before() -> None:
    assert ss.monotone([(0.2, 0.1), (0.1, 0.12), (0.4, 0.3)]) == ((0.1, 0.12), (0.2, 0.12), (0.4, 0.3))


def test_save_load_round_trip_and_damaged_or_foreign_files_are_not_trusted(tmp_path) -> None:
    sc = scale()
    path = ss.save(sc, tmp_path)
    assert path == ss.scale_path(tmp_path, SHA) and not list(path.parent.glob("*.tmp*"))
    assert ss.load(tmp_path, SHA) == sc
    assert ss.load(tmp_path, "cd" * 32) is None  # other weights: no file under that name
    d = json.loads(path.read_text())
    path.write_text(json.dumps({**d, "version": 99}))
    assert ss.load(tmp_path, SHA) is None
    path.write_text(json.dumps({**d, "points": [[0.1, 0.5], [0.05, 0.6]]}))
    assert ss.load(tmp_path, SHA) is None
    path.write_text("{not json")
    assert ss.load(tmp_path, SHA) is None


def test_the_packaged_scale_of_the_embedded_model_loads() -> None:
    from pathlib import Path

    import reference_engine

    data = Path(reference_engine.__file__).parent / "data"
    [path] = (data / "unit_predictor").glob("*-scale-v*.json")
    sha = json.loads(path.read_text())["weights_sha256"]
    sc = ss.load(data, sha)
    assert sc is not None and sc.prompts == len(ss.TUNE_PROMPTS)
    # the scale reaches the share sensitivity 1.0 asks for, so the knob's whole range is usable
    assert sc.max_share >= sc.target_share(1.0)
