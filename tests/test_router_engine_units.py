"""The unit router wired into the engine, on the tiny model (its predictor trained on the fly).

Sensitivity 0 bypasses nothing; bypass rises with sensitivity; a blacklisted block's units never
go; DETAILED logs show each unit's score, threshold and decision; the counted bytes are the
decided units' bytes; per-unit static removal counts its bytes; the router time is recorded.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def unit_engine(tiny_engine):
    from reference_engine import unit_predictor as up

    # a few short prompts keep the tiny model's training fast; the engine caches the result
    pred = up.train(tiny_engine.weights, tiny_engine.encode, tiny_engine.eos_id, tiny_engine.weights_sha256,
                    prompts=up.TRAIN_PROMPTS[:6], continuation_tokens=10, deep_prompts=up.TRAIN_PROMPTS[:8])
    tiny_engine._unit_predictor = pred
    # these tests read the router's own threshold scale; the user scale is tested on its own below
    with tiny_engine.raw_unit_scale():
        yield tiny_engine


def test_the_user_sensitivity_goes_through_the_weights_scale(unit_engine):
    from reference_engine.sensitivity_scale import SensitivityScale

    sc = SensitivityScale(unit_engine.weights_sha256, ((0.05, 0.02), (0.5, 0.1), (2.0, 0.3)))
    before = getattr(unit_engine, "_sensitivity_scale", None)
    unit_engine._sensitivity_scale = sc
    unit_engine._raw_unit_scale = False
    try:
        for s in (0.25, 0.5, 1.0):
            assert _gen(unit_engine, sensitivity=s).stats["unit_threshold_scale"] == pytest.approx(sc.internal_for(s))
        assert _gen(unit_engine, sensitivity=0.0).stats["bypassed_weight_bytes"] == 0
        # the block router keeps its own meaning: no unit scale in its stats
        assert _gen(unit_engine, router="block").stats["unit_threshold_scale"] is None
    finally:
        unit_engine._sensitivity_scale = before
        unit_engine._raw_unit_scale = True


def test_a_user_scale_request_steers_to_the_share_asked_and_a_raw_one_does_not(unit_engine, monkeypatch):
    """The router of a user-scale request carries the controller's target (the share the
    sensitivity asks for, in bytes of a decode token); curves' raw-scale requests carry none."""
    from reference_engine.sensitivity_scale import SensitivityScale, decode_bytes_per_token

    made = []
    make = type(unit_engine)._make_unit_router
    monkeypatch.setattr(type(unit_engine), "_make_unit_router",
                        lambda self, *a, **k: made.append(make(self, *a, **k)) or made[-1])
    raw = _gen(unit_engine, sensitivity=0.5)  # the fixture's raw scale
    unit_engine._sensitivity_scale = SensitivityScale(unit_engine.weights_sha256, ((0.05, 0.02), (0.5, 0.1), (2.0, 0.3)))
    unit_engine._raw_unit_scale = False
    try:
        user = _gen(unit_engine, sensitivity=0.5)
    finally:
        unit_engine._sensitivity_scale = None
        unit_engine._raw_unit_scale = True
    assert made[0].target_bytes == 0.0 and not made[0].ctl.any()
    assert made[1].target_bytes == pytest.approx(0.1 * decode_bytes_per_token(unit_engine))
    assert raw.stats["unit_share_steer"] is None and user.stats["unit_share_steer"] == float(made[1].ctl[0])


def test_a_request_from_the_deep_scale_on_is_scored_by_the_deep_ridges(unit_engine, monkeypatch):
    """Predictor version 4: the router built for a request whose threshold scale starts at the
    predictor's deep_from or above carries the deep ridges, one below it the shallow ones, and the
    request's stats say which; the block router reports none."""
    pred = unit_engine.unit_predictor()
    assert pred.deep_weight is not None and not np.allclose(pred.deep_weight, pred.weight)
    made = []
    make = type(unit_engine)._make_unit_router
    monkeypatch.setattr(type(unit_engine), "_make_unit_router",
                        lambda self, *a, **k: made.append(make(self, *a, **k)) or made[-1])
    below = _gen(unit_engine, sensitivity=pred.deep_from * 0.9)
    above = _gen(unit_engine, sensitivity=pred.deep_from)
    assert below.stats["unit_ridges"] == "shallow" and above.stats["unit_ridges"] == "deep"
    assert np.array_equal(made[0].gate.weight.numpy(), pred.weight)
    assert np.array_equal(made[1].gate.weight.numpy(), pred.deep_weight)
    assert _gen(unit_engine, router="block").stats["unit_ridges"] is None


def test_the_share_controller_moves_the_threshold_by_the_bytes_missed(tiny_engine):
    """steer: an integral step of CTL_GAIN x (target - saved) / target on the log threshold of rows
    that are live, clamped to +-CTL_MAX; plan applies it as a factor exp(ctl) before the clamp."""
    from reference_engine import router as rm
    from reference_engine.router import RouterCalibration, UnitRouter

    L, D = tiny_engine.dims.n_layers, tiny_engine.dims.hidden
    cal = RouterCalibration(impact=np.full(L, 0.01), rel_mean=np.full(L, 0.1), grad_ref=np.full(L, 1.0),
                            entropy_ref=2.5, density_ref=0.3)
    ub, bb = tiny_engine.unit_bytes()
    r = UnitRouter(cal, torch.zeros(2 * L, D), torch.zeros(2 * L), ub, bb, 2, 0.5, 0.02, frozenset(),
                   np.ones(2), 1.0, target_bytes=1000.0)
    tau0, _, _ = r.thresholds()
    r.plan(np.ones(2, bool))
    r.steer(0)  # nothing saved: both rows raise their threshold
    assert r.ctl == pytest.approx([rm.CTL_GAIN, rm.CTL_GAIN])
    tau1, _, _ = r.thresholds()
    assert tau1 == pytest.approx(tau0 * np.exp(rm.CTL_GAIN))
    r.steer(3000, done=[False, True])  # twice the target too much: row 0 lowers, the done row 1 stays
    assert r.ctl == pytest.approx([rm.CTL_GAIN - 2 * rm.CTL_GAIN, rm.CTL_GAIN])
    for _ in range(100):
        r.steer(0)
    assert r.ctl == pytest.approx([rm.CTL_MAX, rm.CTL_MAX])
    r.plan(np.array([True, False]))  # row 1 degraded: it vetoes the step and is not steered
    before = r.ctl.copy()
    r.steer(0)
    assert r.ctl[1] == before[1]


def _gen(engine, **kw):
    kw.setdefault("log_level", "NONE")
    kw.setdefault("hardware_watermark", 0.0)
    kw.setdefault("router", "unit")
    [r] = engine.generate([PROMPT], max_new_tokens=12, mode="lossy", **kw)
    return r


def test_unit_predictor_reports_rank_correlations(unit_engine):
    rep = unit_engine.unit_predictor().report
    for key in ("spearman_predicted_vs_kl_pooled", "spearman_proxy_vs_kl_pooled"):
        assert -1.0 <= rep[key] <= 1.0
    assert rep["positions_held_out"] > 0 and rep["positions_fit"] > rep["positions_held_out"]


def test_sensitivity_spans_from_nothing_upward(unit_engine):
    blacklist = (0, unit_engine.dims.n_layers - 1)
    got = []
    for s in (0.0, 0.25, 0.5, 1.0):
        r = _gen(unit_engine, sensitivity=s, layer_blacklist=blacklist)
        got.append(r.stats["bypassed_weight_bytes"])
    assert got[0] == 0
    assert got == sorted(got) and got[-1] > 0, got


def test_detailed_log_shows_units_and_bytes_add_up(unit_engine):
    buf = io.StringIO()
    L = unit_engine.dims.n_layers
    r = _gen(unit_engine, sensitivity=1.0, log_level="DETAILED", log_file=buf, layer_blacklist=(1,))
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    units = [x for x in lines if x["event"] == "unit"]
    assert len(units) == 2 * L * (r.stats["total_tokens"] - 1)
    assert {x["unit"] for x in units} == {"attention", "mlp"}
    assert all(x["decision"] == "KEEP_BLACKLIST" for x in units if x["block"] == 1)
    for x in units:
        if x["decision"] == "BYPASS":
            assert x["score"] < x["threshold"]
        elif x["decision"] == "KEEP":
            assert x["score"] >= x["threshold"]
    assert sum(x["bytes_saved"] for x in units) == r.stats["bypassed_weight_bytes"] > 0
    assert r.stats["units_bypassed"] == sum(x["decision"] == "BYPASS" for x in units)
    assert r.stats["router_time_s"] > 0 and r.stats["router"] == "unit"


def test_unit_maps_are_chosen_and_their_bytes_counted(unit_engine):
    from reference_engine.unit_predictor import unit_bytes

    pred = unit_engine.unit_predictor()
    maps = pred.bypass_maps()
    assert len(maps) == 2 * unit_engine.dims.n_layers
    assert [m is not None for m in maps] == list(pred.map_use)
    assert len(pred.report["kl_map_mean"]) == len(maps)
    plain, _ = unit_bytes(unit_engine.weights)
    net, _ = unit_engine.unit_bytes()
    for u, m in enumerate(maps):
        expected = plain[u] - (0 if m is None else 4 * (m.down.numel() + m.up.numel()))
        assert net[u] == expected > 0


def test_static_unit_removal_counts_its_bytes(unit_engine):
    ub, bb = unit_engine.unit_bytes()
    [r] = unit_engine.generate([PROMPT], max_new_tokens=6, mode="static", static_attn_bypass=(2, 3),
                               static_mlp_bypass=(3,), log_level="NONE")
    steps = r.stats["total_tokens"] - 1
    assert r.stats["bypassed_weight_bytes"] == steps * int(ub[4] + ub[6] + ub[7])
    assert r.stats["units_bypassed"] == 3 * steps
    # as for blocks, the ratio is over every output token (the first comes from prefill)
    assert np.isclose(r.stats["bypass_ratio"],
                      steps * (ub[4] + ub[6] + ub[7]) / (bb * unit_engine.dims.n_layers * r.stats["total_tokens"]))


def test_bad_router_name_is_named(unit_engine):
    from reference_engine.errors import ConfigError

    with pytest.raises(ConfigError, match="'tree'"):
        _gen(unit_engine, router="tree")


def test_calibrate_command_reports_the_predictor(unit_engine, capsys):
    import argparse

    from rsp_bench.calibrate_cli import calibrate_unit_predictor

    calibrate_unit_predictor(unit_engine, argparse.Namespace(quiet=True, force=False))
    out = capsys.readouterr().out
    assert f"{2 * unit_engine.dims.n_layers} units" in out and "Spearman" in out and "trained in" in out


def test_sequence_labels_train_a_predictor_of_the_same_form(tiny_engine):
    """``labels="sequence"`` (version 2's: each unit bypassed on every decode token) trains a
    predictor of the same shape whose report says which labels it learnt; a wrong label kind is
    refused."""
    from reference_engine import unit_predictor as up

    args = (tiny_engine.weights, tiny_engine.encode, tiny_engine.eos_id, tiny_engine.weights_sha256)
    pred = up.train(*args, prompts=up.TRAIN_PROMPTS[:4], continuation_tokens=6, labels="sequence", deep_prompts=())
    L = tiny_engine.dims.n_layers
    assert pred.weight.shape == (2 * L, tiny_engine.dims.hidden) and pred.report["labels"] == "sequence"
    assert np.isfinite(pred.weight).all() and (pred.impact >= 0).all()
    with pytest.raises(ValueError, match="labels"):
        up.train(*args, prompts=up.TRAIN_PROMPTS[:4], continuation_tokens=6, labels="tokens", deep_prompts=())
