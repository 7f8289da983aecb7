"""The unit predictor's data and storage (reference_engine.unit_predictor)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reference_engine import unit_predictor as up

ROOT = Path(__file__).resolve().parents[1]


def _fixture_text() -> str:
    parts = []
    for f in (ROOT / "fixtures").rglob("*"):
        if f.is_file() and f.stat().st_size < 20_000_000:
            try:
                parts.append(f.read_text(errors="ignore"))
            except OSError:
                pass
    return "\n".join(parts)


def test_training_and_curve_prompts_are_not_in_the_fixtures() -> None:
    from rsp_bench import router_curve_measure as curve
    text = _fixture_text()
    assert len(text) > 1000  # the fixtures were read
    sets = {"train": up.TRAIN_PROMPTS, "tune": curve.TUNE_PROMPTS, "held-out": curve.HELD_OUT_PROMPTS}
    for name, prompts in sets.items():
        for p in prompts:
            assert p[:60] not in text, f"{name} prompt found in fixtures/: {p!r}"
    assert not set(up.TRAIN_PROMPTS) & set(curve.HELD_OUT_PROMPTS)
    assert not set(curve.TUNE_PROMPTS) & set(curve.HELD_OUT_PROMPTS)
    assert len(curve.HELD_OUT_PROMPTS) >= 16
    # the fresh held-out files (fixtures/router_curve/): none of them a training, tune or built-in
    # prompt, and no later file repeats an earlier one
    used = [q[:40].lower() for q in (*up.TRAIN_PROMPTS, *curve.TUNE_PROMPTS, *curve.HELD_OUT_PROMPTS)]
    for name, minimum in (("heldout_2026-12-03.jsonl", 16), ("heldout_2026-12-04.jsonl", 24),
                          ("heldout_2026-12-04b.jsonl", 24), ("heldout_2026-12-05.jsonl", 24),
                          ("heldout_2026-12-05b.jsonl", 24)):
        fresh = [json.loads(line)["text"] for line in
                 (ROOT / "fixtures" / "router_curve" / name).read_text(encoding="utf-8").splitlines() if line.strip()]
        assert len(fresh) >= minimum, name
        for q in fresh:
            assert not any(q[:40].lower() == u or u in q.lower() for u in used), f"{name}: prompt already used: {q!r}"
        used += [q[:40].lower() for q in fresh]


def test_packaged_training_text_is_frozen_and_no_curve_prompt() -> None:
    """The shallow ridges train on TRAIN_PROMPTS and the 116 frozen plain English requests, the deep
    ones on those and 120 more (they come from the degradation splits' plain_en groups, so they are
    in fixtures/, but never in a router-curve file, the curve's tune or built-in prompts, or twice)."""
    from rsp_bench import router_curve_measure as curve
    shallow = up.training_prompts()
    prompts = up.deep_training_prompts()
    assert shallow[: len(up.TRAIN_PROMPTS)] == up.TRAIN_PROMPTS and len(shallow) == len(up.TRAIN_PROMPTS) + 116
    assert prompts[: len(shallow)] == shallow and len(prompts) == len(shallow) + 120
    assert len(set(prompts)) == len(prompts)
    curve_text = "\n".join(f.read_text(encoding="utf-8") for f in (ROOT / "fixtures" / "router_curve").glob("*.jsonl"))
    for p in prompts:
        assert p[:60] not in curve_text and p not in curve.TUNE_PROMPTS and p not in curve.HELD_OUT_PROMPTS, p


def test_spearman_matches_known_values() -> None:
    assert up.spearman(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == pytest.approx(1.0)
    assert up.spearman(np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1])) == pytest.approx(-1.0)
    # ties take average ranks: ranks (0.5, 0.5, 2) vs (0, 1, 2) -> Pearson of the ranks
    assert up.spearman(np.array([1, 1, 2]), np.array([1, 2, 3])) == pytest.approx(np.sqrt(3) / 2)


def test_ridge_recovers_a_linear_target() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 8)).astype(np.float32)
    w = rng.normal(size=8)
    y = x @ w + 0.5
    wv, b = up.fit_ridge(x, y, 1e-6)
    assert np.allclose(wv, w, atol=1e-3) and b == pytest.approx(0.5, abs=1e-3)


def test_the_deep_ridges_score_from_their_scale_on_and_survive_a_round_trip(tmp_path) -> None:
    """Version 4: a request whose threshold scale starts at ``deep_from`` or above scores with the
    deep ridges, one below it with the shallow ones; a predictor without deep ridges uses its one
    ridge at every scale."""
    w, b = np.ones((4, 3), np.float32), np.zeros(4, np.float32)
    dw, db = 2 * w, np.full(4, -1.0, np.float32)
    p = up.UnitPredictor("ab" * 32, w, b, np.arange(4.0), np.linspace(0, 1, 4), {}, up.PREDICTOR_VERSION,
                         deep_weight=dw, deep_bias=db, deep_from=0.05)
    assert p.ridges_for(0.0499)[0] == "shallow" and p.ridges_for(0.0499)[1] is w
    assert p.ridges_for(0.05)[1] is dw and p.ridges_for(0.3)[2] is db
    assert p.ridges_for(0.05)[0] == "deep"
    q = up.load(up.save(p, tmp_path).parent.parent, "ab" * 32)
    assert q is not None and q.deep_from == 0.05 and np.array_equal(q.deep_weight, dw) and np.array_equal(q.deep_bias, db)
    plain = up.UnitPredictor("ab" * 32, w, b, np.arange(4.0), np.linspace(0, 1, 4), {})
    assert plain.ridges_for(10.0)[0] == "shallow" and plain.ridges_for(10.0)[1] is w


def test_the_packaged_predictor_holds_deep_ridges_that_differ_from_the_shallow_ones() -> None:
    from pathlib import Path

    import reference_engine

    folder = Path(reference_engine.__file__).resolve().parent / "data"
    files = list((folder / "unit_predictor").glob(f"*-v{up.PREDICTOR_VERSION}.npz"))
    assert files, f"no packaged version-{up.PREDICTOR_VERSION} unit predictor"
    for f in files:
        with np.load(f) as z:
            assert z["deep_weight"].shape == z["weight"].shape and float(z["deep_from"]) == up.DEEP_FROM
            assert not np.allclose(z["deep_weight"], z["weight"])


def test_save_load_round_trip_and_damage(tmp_path) -> None:
    p = up.UnitPredictor("ab" * 32, np.ones((4, 3), np.float32), np.zeros(4, np.float32), np.arange(4.0),
                         np.linspace(0, 1, 4), {"seed": up.SEED})
    path = up.save(p, tmp_path)
    q = up.load(tmp_path, "ab" * 32)
    assert q is not None and np.array_equal(q.weight, p.weight) and q.report == {"seed": up.SEED}
    assert up.load(tmp_path, "cd" * 32) is None  # another model's weights
    path.write_bytes(b"not an npz")
    assert up.load(tmp_path, "ab" * 32) is None  # damaged: retrained, never trusted
    assert not list(path.parent.glob("*.tmp"))
