"""Unit tests of the reference engine on the seeded tiny model: equivalence with transformers,
router and threshold formula, knobs, logs, stats and every documented bad input."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch

from reference_engine import ConfigError, ModelLoadError, PromptError, PruningConfig
from reference_engine.router import (TAU_MAX, TAU_MIN, Router, RouterCalibration, density_factor,
                                     entropy_factor, gradient_factor, watermark_factor)

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):",
    "Question: Who was the Norse leader?",
    "Revenue was $2.45B, up 12.3%.",
]


def hf_greedy(engine, prompt: str, n: int) -> list[int]:
    ids = torch.tensor([engine.encode(prompt)])
    out = engine.hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                   do_sample=False, pad_token_id=engine.pad_id)
    gen = out[0, ids.shape[1]:].tolist()
    if engine.eos_id in gen:
        gen = gen[: gen.index(engine.eos_id) + 1]
    return gen


@pytest.mark.parametrize("prompt", PROMPTS)
def test_pruning_off_equals_transformers_generate(tiny_engine, prompt):
    [res] = tiny_engine.generate([prompt], max_new_tokens=24, mode="off", log_level="NONE")
    assert res.token_ids == hf_greedy(tiny_engine, prompt, 24)
    assert res.stats["layers_bypassed"] == 0


def test_batch_generation_matches_single(tiny_engine):
    cfg = PruningConfig(mode="off", log_level="NONE")
    batch = tiny_engine.generate(PROMPTS, max_new_tokens=16, config=cfg)
    singles = [tiny_engine.generate([p], max_new_tokens=16, config=cfg)[0] for p in PROMPTS]
    assert [b.token_ids for b in batch] == [s.token_ids for s in singles]


def test_stats_keys_and_consistency(tiny_engine):
    res = tiny_engine.generate(PROMPTS, max_new_tokens=16, sensitivity=1.0, log_level="NONE",
                               hardware_watermark=0.0)
    for r in res:
        s = r.stats
        for key in ("layers_bypassed", "total_tokens", "bypass_ratio", "degraded", "degraded_reason"):
            assert key in s
        assert 0 <= s["layers_bypassed"] <= s["blocks"] * s["total_tokens"]
        assert 0.0 <= s["bypass_ratio"] <= 1.0
        assert len(r.token_ids) == s["total_tokens"] <= 16


def test_sensitivity_zero_disables_pruning(tiny_engine):
    res = tiny_engine.generate(PROMPTS, max_new_tokens=16, sensitivity=0.0, log_level="NONE")
    off = tiny_engine.generate(PROMPTS, max_new_tokens=16, mode="off", log_level="NONE")
    assert all(r.stats["layers_bypassed"] == 0 for r in res)
    assert [r.token_ids for r in res] == [o.token_ids for o in off]


def test_bypass_ratio_rises_with_sensitivity(tiny_engine):
    ratios = []
    for s in (0.0, 0.25, 0.5, 0.75, 1.0):
        res = tiny_engine.generate(PROMPTS, max_new_tokens=24, sensitivity=s, log_level="NONE",
                                   hardware_watermark=0.0, tau0=0.1)
        ratios.append(float(np.mean([r.stats["bypass_ratio"] for r in res])))
    assert ratios[0] == 0.0
    assert ratios[-1] > 0.0, ratios
    assert all(a <= b for a, b in zip(ratios, ratios[1:])), ratios


def test_blacklist_is_never_bypassed(tiny_engine):
    log = io.StringIO()
    n = tiny_engine.dims.n_layers
    blacklist = tuple(range(0, n, 2))
    tiny_engine.generate(PROMPTS[:2], max_new_tokens=12, sensitivity=1.0, layer_blacklist=blacklist,
                         log_level="DETAILED", hardware_watermark=0.0, tau0=1.0, log_file=log)
    records = [json.loads(line) for line in log.getvalue().splitlines()]
    blocks = [r for r in records if r["event"] == "block"]
    assert blocks, "DETAILED logging produced no per-block records"
    assert all(r["decision"] != "BYPASS" for r in blocks if r["block"] in blacklist)
    assert any(r["decision"] == "BYPASS" for r in blocks), "tau0=1 at sensitivity 1 should bypass something"


def test_detailed_log_fields_and_summary(tiny_engine):
    log = io.StringIO()
    tiny_engine.generate(["hello there"], max_new_tokens=6, log_level="DETAILED", hardware_watermark=0.0,
                         log_file=log)
    records = [json.loads(line) for line in log.getvalue().splitlines()]
    block = next(r for r in records if r["event"] == "block")
    for key in ("token", "block", "score", "threshold", "f_density", "f_entropy", "f_gradient",
                "f_watermark", "decision"):
        assert key in block
    summary = [r for r in records if r["event"] == "request"]
    assert len(summary) == 1 and summary[0]["total_tokens"] <= 6


def test_summary_log_is_one_line_per_request(tiny_engine):
    log = io.StringIO()
    tiny_engine.generate(PROMPTS, max_new_tokens=4, log_level="SUMMARY", log_file=log)
    lines = log.getvalue().splitlines()
    assert len(lines) == len(PROMPTS)
    assert {json.loads(line)["request"] for line in lines} == set(range(len(PROMPTS)))
    log = io.StringIO()
    tiny_engine.generate(PROMPTS, max_new_tokens=4, log_level="NONE", log_file=log)
    assert log.getvalue() == ""


def test_teacher_forced_off_matches_generation_logits(tiny_engine):
    [res] = tiny_engine.generate(["def add(a, b):"], max_new_tokens=10, mode="off", log_level="NONE")
    tf = tiny_engine.teacher_forced(res.prompt_ids, res.token_ids, mode="off", log_level="NONE")
    assert tf.logits.shape == (len(res.token_ids), tiny_engine.dims.vocab)
    assert tf.logits.argmax(-1).tolist() == res.token_ids


def test_static_mode_bypasses_given_blocks(tiny_engine):
    [res] = tiny_engine.generate(["hello"], max_new_tokens=8, mode="static", static_bypass=(2, 3),
                                 log_level="NONE")
    steps = res.stats["executed_blocks_per_step"]
    assert steps and all(n == tiny_engine.dims.n_layers - 2 for n in steps)


# ---- threshold formula ----

def _router(sensitivity=0.5, tau0=0.05, batch=1, blacklist=frozenset()):
    L = 4
    cal = RouterCalibration(impact=np.array([0.01, 0.02, 0.2, 1.0]), rel_mean=np.ones(L),
                            grad_ref=np.full(L, 0.1), entropy_ref=1.0, density_ref=0.3)
    return Router(cal, batch, sensitivity, tau0, blacklist, np.ones(batch), 1.0, probe_interval=1000)


def test_threshold_formula_neutral_factors():
    r = _router(sensitivity=0.5, tau0=0.05)
    r.step = 1
    tau, f_ent, f_grad = r.thresholds()
    assert np.allclose(tau, 0.05) and np.allclose(f_ent, 1.0) and np.allclose(f_grad, 1.0)
    r2 = _router(sensitivity=1.0, tau0=0.05)
    assert np.allclose(r2.thresholds()[0], 0.10)  # scaled by sensitivity / 0.5


def test_threshold_is_clamped():
    assert np.allclose(_router(sensitivity=1.0, tau0=1.0).thresholds()[0], TAU_MAX)
    assert np.allclose(_router(sensitivity=0.01, tau0=0.01).thresholds()[0], TAU_MIN)


def test_router_plan_bypasses_low_score_blocks_and_respects_blacklist():
    r = _router(sensitivity=0.5, tau0=0.05)
    r.step = 1  # not a probe step
    keep, probe = r.plan(np.array([True]))
    assert not probe and keep == [False, False, True, True]
    r = _router(sensitivity=0.5, tau0=0.05, blacklist=frozenset({0}))
    r.step = 1
    assert r.plan(np.array([True]))[0] == [True, False, True, True]
    r = _router()
    r.step = 1
    assert r.plan(np.array([False]))[0] == [True] * 4  # a degraded row vetoes every bypass


def test_signal_factors_directions():
    assert density_factor(0.9, 0.3) < 1.0 < density_factor(0.0, 0.3)  # dense text lowers tau
    assert entropy_factor(np.array([0.1]), 1.0)[0] > 1.0  # confident task raises tau
    assert gradient_factor(np.array([0.5]), np.array([0.1]))[0] < 1.0  # sharp turn protected
    assert gradient_factor(np.array([0.05]), np.array([0.1]))[0] == 1.0
    assert watermark_factor(0.5) == 1.0 and watermark_factor(1.0) == pytest.approx(2.0)


# ---- bad input ----

@pytest.mark.parametrize("kwargs, needle", [
    ({"sensitivity": -0.1}, "-0.1"),
    ({"sensitivity": 1.5}, "1.5"),
    ({"sensitivity": math.nan}, "nan"),
    ({"sensitivity": "high"}, "high"),
    ({"log_level": "VERBOSE"}, "VERBOSE"),
    ({"mode": "fast"}, "fast"),
    ({"layer_blacklist": (0, 1.5)}, "1.5"),
    ({"layer_blacklist": (-1,)}, "-1"),
    ({"layer_blacklist": "0,29"}, "0,29"),
])
def test_invalid_config_names_the_value(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        PruningConfig(**kwargs)
    assert issubclass(ConfigError, ValueError)


def test_blacklist_out_of_range_for_model(tiny_engine):
    with pytest.raises(ConfigError, match="99"):
        tiny_engine.generate(["hi"], max_new_tokens=2, layer_blacklist=(0, 99))


def test_empty_prompt_list(tiny_engine):
    with pytest.raises(PromptError, match=r"\[\]"):
        tiny_engine.generate([], max_new_tokens=2)


def test_prompt_longer_than_context(tiny_engine):
    long = "fox " * 2000
    with pytest.raises(PromptError, match="context of 512"):
        tiny_engine.generate([long], max_new_tokens=2)


def test_missing_and_corrupt_model(tmp_path):
    from reference_engine import Engine

    with pytest.raises(ModelLoadError, match="does not exist"):
        Engine.load(tmp_path / "nope")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="bad.gguf"):
        Engine.load(bad)
    (tmp_path / "folder").mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        Engine.load(tmp_path / "folder")
