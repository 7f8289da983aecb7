"""Unit tests of the model-level out-of-distribution score (reference_engine/ood.py): the fit's
threshold, shrinkage of short prompts, storage, and the engine's wiring of it on the tiny model.
Whether the score separates real odd input from normal input is the adversarial suite's
question (suites/test_adversarial.py), on the embedded model."""

from __future__ import annotations

import math

from pathlib import Path

import numpy as np
import pytest

from reference_engine import ood
from reference_engine.degradation import text_rules_fingerprint
from reference_engine.config import PruningConfig

L, D = 8, 16


def _stats(rng: np.random.Generator, odd: bool, n: int = 40) -> ood.PromptStats:
    m = min(n, ood.SCORED_POSITIONS)
    if odd:  # never easy, always unsure, in another direction
        nll, ent = rng.uniform(4, 9, m), rng.uniform(3, 5, m)
        centre = np.r_[np.zeros(D - 1), 1.0]
    else:
        nll = np.where(rng.random(m) < 0.5, rng.uniform(0, 0.4, m), rng.uniform(1, 8, m))
        ent = np.where(nll < 0.5, rng.uniform(0, 0.4, m), rng.uniform(1, 4, m))
        centre = np.r_[1.0, np.zeros(D - 1)]
    pooled = {b: centre + 0.3 * rng.standard_normal(D) for b in ood.blocks_for(L)}
    return ood.PromptStats(nll, ent, 1.5 if odd else 4.0, 0.0, n, pooled, np.full(L, 1.0), np.full(L, 10.0))


@pytest.fixture(scope="module")
def fitted() -> tuple[ood.OODDetector, list[ood.PromptStats], list[ood.PromptStats]]:
    rng = np.random.default_rng(0)
    calib = [_stats(rng, False) for _ in range(60)]
    odd = [_stats(rng, True) for _ in range(20)]
    held = [_stats(rng, False) for _ in range(50)]
    return ood.fit(calib, odd, held, L, target_far=0.04), held, [_stats(rng, True) for _ in range(20)]


def test_threshold_meets_the_target_false_alarm_rate_on_held_out(fitted) -> None:
    det, held, odd = fitted
    fired = sum(det.reason(s) is not None for s in held)
    assert fired <= math.floor(0.04 * len(held)) and det.info["heldout_false_alarms"] == fired
    assert all(det.reason(s) == "ood_score" for s in odd)


def test_short_prompts_are_pulled_towards_normal(fitted) -> None:
    det, _, _ = fitted
    rng = np.random.default_rng(1)
    long_odd, short_odd = _stats(rng, True, n=48), _stats(rng, True, n=2)
    assert det.score(short_odd) < det.score(long_odd)
    empty = ood.PromptStats(np.zeros(0), np.zeros(0), 4.0, 0.0, 1, long_odd.pooled, long_odd.norm_lo, long_odd.norm_hi)
    assert np.all(np.isfinite(det.features(empty)))


def test_norms_outside_the_band_and_non_finite_losses_score_infinite(fitted) -> None:
    det, held, _ = fitted
    s = held[0]
    big = ood.PromptStats(s.nll, s.entropy, 4.0, 0.0, s.n_tokens, s.pooled, s.norm_lo, s.norm_hi * 10)
    assert det.score(big) == math.inf and det.reason(big) == "hidden_norm"
    nan = ood.PromptStats(s.nll * np.nan, s.entropy, 4.0, 0.0, s.n_tokens, s.pooled, s.norm_lo, s.norm_hi)
    assert det.score(nan) == math.inf


def test_fit_refuses_too_little_data_and_a_bad_target() -> None:
    rng = np.random.default_rng(2)
    few = [_stats(rng, False) for _ in range(4)]
    with pytest.raises(ValueError, match="need >= 16 calibration"):
        ood.fit(few, few, few, L)
    many = [_stats(rng, False) for _ in range(20)]
    with pytest.raises(ValueError, match="target_far must be in"):
        ood.fit(many, many, many, L, target_far=0.7)


def test_save_load_round_trip_and_refusals(fitted, tmp_path) -> None:
    det, held, _ = fitted
    path = ood.detector_path(tmp_path, "ab" * 32)
    ood.save(det, path, "ab" * 32)
    back = ood.load(path, "ab" * 32)
    assert back is not None and back.threshold == det.threshold
    assert [back.reason(s) for s in held] == [det.reason(s) for s in held]
    assert ood.load(path, "cd" * 32) is None  # other weights
    path.write_bytes(b"not an npz")
    assert ood.load(path, "ab" * 32) is None  # damaged: refitted, never trusted
    assert not list(tmp_path.rglob("*.tmp"))


def test_content_span_skips_the_template() -> None:
    assert ood.content_span([1, 2, 9, 9, 9, 3], [1, 2], [3]) == (2, 5)
    assert ood.content_span([7, 9, 9], [1, 2], [3]) == (1, 3)  # no template: after the first token
    assert ood.content_span([1, 2, 3], [1, 2], [3]) == (2, 3)  # never empty


def test_engine_degrades_on_the_score_and_equals_off(tiny_engine, monkeypatch) -> None:
    rng = np.random.default_rng(3)
    n_layers = tiny_engine.dims.n_layers
    calib = [_stats(rng, False) for _ in range(30)]
    det = ood.fit(calib, [_stats(rng, True) for _ in range(10)], calib[:10], L)
    # A detector for the tiny model's shape whose threshold fires on everything / nothing:
    # under test is the wiring (the reason, pruning off, exact output), not the calibration.
    hidden = tiny_engine.dims.hidden
    det.n_layers = n_layers
    det.bank = {b: np.eye(hidden)[:4] for b in ood.blocks_for(n_layers)}
    det.prior, det.mu, det.sd = np.zeros(len(det.names)), np.zeros(len(det.names)), np.ones(len(det.names))
    det.weights = np.zeros(len(det.names) + 1)
    det.norm_lo, det.norm_hi = np.zeros(n_layers), np.full(n_layers, np.inf)
    monkeypatch.setattr(tiny_engine, "_ood", det, raising=False)
    monkeypatch.setattr(tiny_engine, "_detector", {**ood.describe(None, Path()), "detector": "ood_score/test"},
                        raising=False)
    lossy = PruningConfig(mode="lossy", sensitivity=1.0, hardware_watermark=0.0)
    prompt = "The quick brown fox jumps over the lazy dog."
    det.threshold = -1.0
    (res,) = tiny_engine.generate([prompt], max_new_tokens=6, config=lossy)
    (off,) = tiny_engine.generate([prompt], max_new_tokens=6, config=lossy.override(mode="off"))
    assert res.stats["degraded"] and res.stats["degraded_reason"] == "ood_score"
    assert res.stats["detector"] == "ood_score/test"
    assert res.token_ids == off.token_ids and res.stats["layers_bypassed"] == 0
    assert res.stats["degradation_check_s"] > 0 and off.stats["degradation_check_s"] == 0.0
    with tiny_engine.degradation_suspended():  # what rsp-bench degradation measures errors with
        (free,) = tiny_engine.generate([prompt], max_new_tokens=6, config=lossy)
    assert not free.stats["degraded"] and not tiny_engine._degradation_suspended
    det.threshold = 1.0
    (res,) = tiny_engine.generate([prompt], max_new_tokens=6, config=lossy)
    assert res.stats["degraded_reason"] != "ood_score"


def test_byte_piece_ids_are_lone_non_ascii_bytes(tiny_engine) -> None:
    ids = ood.byte_piece_ids(tiny_engine.tokenizer.decode, tiny_engine.dims.vocab)
    assert ids and all(tiny_engine.tokenizer.decode([i]) == "\ufffd" for i in ids)
    assert not any(tiny_engine.tokenizer.decode([i]).isascii() for i in ids)


def test_without_a_score_the_fallback_is_named_in_stats_and_warned_once(tiny_engine, caplog) -> None:
    # The tiny model has no fitted score: the weaker fallback runs, and says so.
    import logging

    from reference_engine import Engine

    engine = Engine.load(tiny_engine.folder)  # a fresh instance: nothing looked up yet
    ood._warned.discard(engine.weights_sha256)
    lossy = PruningConfig(mode="lossy", sensitivity=0.5, hardware_watermark=0.0)
    with caplog.at_level(logging.WARNING, logger="reference_engine"):
        (res,) = engine.generate(["Name three rivers."], max_new_tokens=2, config=lossy)
        engine.generate(["And three lakes."], max_new_tokens=2, config=lossy)
    assert res.stats["detector"] == ood.FALLBACK
    assert engine.detector_info() == {"detector": ood.FALLBACK, "version": None, "file": None, "sha256": None,
                                      "packaged": False, "language_rule": None, "instruction_probe": None,
                                      "text_rules": text_rules_fingerprint()}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and ood.FALLBACK in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    (off,) = engine.generate(["Name three rivers."], max_new_tokens=2, config=lossy.override(mode="off"))
    assert off.stats["detector"] is None  # pruning off runs no check


def test_a_stored_score_is_named_with_its_file_and_digest(tiny_engine, tmp_path) -> None:
    import hashlib

    rng = np.random.default_rng(4)
    calib = [_stats(rng, False) for _ in range(30)]
    det = ood.fit(calib, [_stats(rng, True) for _ in range(10)], calib[:10], L)
    path = ood.detector_path(tmp_path, "ab" * 32)
    ood.save(det, path, "ab" * 32)
    info = ood.describe(path, tmp_path)
    assert info["detector"] == f"ood_score/v{ood.OOD_VERSION}" and info["file"] == path.name
    assert info["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and info["packaged"] is True
    assert ood.describe(path, tmp_path / "elsewhere")["packaged"] is False
