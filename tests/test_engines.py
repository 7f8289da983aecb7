"""Tests of rsp_bench.engines (registry, configurations, static block choice, adapters) and of
the quality runner's plumbing, on the seeded tiny model (tests/conftest.py).

Must not load the embedded model: everything here runs on the tiny one in seconds.
"""

from __future__ import annotations

import importlib.metadata
import textwrap

import pytest

from rsp_bench import engines as eng
from rsp_bench.engines.configs import unit_router_rows
from rsp_bench.engines import (ConfigSpec, available_engines, format_config_id, get_engine,
                               plan_configs, random_blocks, register_engine, shortgpt_blocks)
from rsp_bench.errors import HarnessInputError

PROMPTS = ["Hello there, how are you?", "def add(a, b):", "Revenue was $2.45B, up 12.3%."]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The tiny model's matrices are so small that a second thread only adds contention on a
    # shared 2-core machine (10x slower measured); restore the setting for other modules.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------- registry


def test_builtin_engines_are_registered() -> None:
    assert {"reference", "hf-generate", "static-shortgpt", "static-random"} <= set(available_engines())


def test_unknown_engine_names_the_value() -> None:
    with pytest.raises(HarnessInputError, match="'no-such-engine'"):
        get_engine("no-such-engine")


def test_register_engine_decorator_and_duplicates(monkeypatch) -> None:
    monkeypatch.setattr(eng.base, "_REGISTRY", dict(eng.base._REGISTRY))

    class Echo:
        name, modes, batch_size = "echo", ("off",), 1

        def __init__(self, **kw):
            self.kw = kw

        def generate(self, prompts, max_new_tokens, spec):
            return [eng.Output(p, [1], [2], {}) for p in prompts]

        def teacher_forced_logits(self, prompt_ids, continuation_ids, spec):
            raise NotImplementedError

    register_engine("echo")(Echo)
    assert "echo" in available_engines()
    adapter = get_engine("echo", engine=None, model="m")
    assert adapter.kw == {"engine": None, "model": "m"}
    assert isinstance(adapter, eng.EngineAdapter)
    register_engine("echo")(Echo)  # the same factory again is harmless
    with pytest.raises(HarnessInputError, match="already registered"):
        register_engine("echo")(lambda **kw: Echo())
    with pytest.raises(HarnessInputError, match="'Bad Name'"):
        register_engine("Bad Name")


def test_entry_point_engine_is_loaded_on_first_use(monkeypatch, tmp_path) -> None:
    (tmp_path / "my_rsp_engine.py").write_text(textwrap.dedent("""
        class Adapter:
            name, modes, batch_size = "third-party", ("off",), 1
            def generate(self, prompts, max_new_tokens, spec): return []
            def teacher_forced_logits(self, prompt_ids, continuation_ids, spec): return None, {}
        def factory(**kw):
            return Adapter()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(eng.base, "_REGISTRY", dict(eng.base._REGISTRY))
    ep = importlib.metadata.EntryPoint("third-party", "my_rsp_engine:factory", eng.ENTRY_POINT_GROUP)
    broken = importlib.metadata.EntryPoint("broken", "no_such_module_xyz:factory", eng.ENTRY_POINT_GROUP)
    monkeypatch.setattr(eng.base, "_entry_points", lambda: {"third-party": ep, "broken": broken})
    assert "third-party" in available_engines()
    assert get_engine("third-party").name == "third-party"
    with pytest.raises(HarnessInputError, match="'broken'"):
        get_engine("broken")


# --------------------------------------------------------------------------- configurations


def test_plan_configs_ids_and_watermark() -> None:
    specs = plan_configs("reference", ["lossy", "lossless"], [0.25, 0.5])
    assert [s.config_id for s in specs] == ["reference/off", "reference/lossy/s=0.25",
                                            "reference/lossy/s=0.25/router=block", "reference/lossy/s=0.50",
                                            "reference/lossy/s=0.50/router=block",
                                            "reference/lossless/s=0.25", "reference/lossless/s=0.50"]
    assert all(s.pruning.hardware_watermark == eng.SUITE_WATERMARK == 0.0 for s in specs)
    assert specs[0].pruning.mode == "off" and specs[3].pruning.sensitivity == 0.5
    # the default (unit) router's rows and the block router's comparison rows beside them
    assert [s.pruning.router for s in specs[1:5]] == ["unit", "block", "unit", "block"]
    assert specs[2].params == {"router": "block"} and specs[1].params == {}
    assert [s.config_id for s in unit_router_rows(specs)] == ["reference/lossy/s=0.25", "reference/lossy/s=0.50"]
    third = plan_configs("mine", ["lossy"], [1.0], with_pruning=False)
    assert [s.config_id for s in third] == ["reference/off", "mine/off", "mine/lossy/s=1.00"]
    assert all(s.pruning is None for s in third)
    assert format_config_id("static-shortgpt", k=3) == "static-shortgpt/k=3"


def test_static_figures_are_interpolated_at_the_dynamic_budget_not_rounded() -> None:
    from rsp_bench.quality import MetricValue, interpolated_metrics

    low = {"top1_agreement": MetricValue(0.9, 100, (0.85, 0.95), "ratio"), "kl": MetricValue(0.1, 100, None, "nats"),
           "only_low": MetricValue(1.0, 5, None, "ratio")}
    high = {"top1_agreement": MetricValue(0.7, 80, (0.6, 0.8), "ratio"), "kl": MetricValue(0.5, 80, None, "nats")}
    got = interpolated_metrics(low, high, 0.25)  # 1.25 blocks: a quarter of the way from k=1 to k=2
    assert set(got) == {"top1_agreement", "kl"}
    assert got["top1_agreement"].value == pytest.approx(0.85) and got["kl"].value == pytest.approx(0.2)
    assert got["top1_agreement"].n == 80 and got["top1_agreement"].ci is None
    assert interpolated_metrics(low, high, 0.0)["kl"].value == pytest.approx(0.1)
    with pytest.raises(HarnessInputError, match="1.5"):
        interpolated_metrics(low, high, 1.5)


def test_shortgpt_picks_lowest_influence_never_blacklisted() -> None:
    bi = [0.0, 0.5, 0.1, 0.3, 0.2, 0.0]  # blocks 0 and 5 are the most redundant but blacklisted
    assert shortgpt_blocks(bi, 2, frozenset({0, 5})) == (2, 4)
    assert shortgpt_blocks(bi, 4, frozenset({0, 5})) == (1, 2, 3, 4)
    with pytest.raises(HarnessInputError, match="got 5"):
        shortgpt_blocks(bi, 5, frozenset({0, 5}))


def test_random_blocks_seeded_and_exclude_blacklist() -> None:
    picks = {random_blocks(30, 6, frozenset({0, 29}), seed=s) for s in range(20)}
    assert all(0 not in p and 29 not in p and len(p) == 6 for p in picks)
    assert len(picks) > 1  # the seed matters
    assert random_blocks(30, 6, frozenset({0, 29}), seed=3) == random_blocks(30, 6, frozenset({0, 29}), seed=3)


# --------------------------------------------------------------------------- adapters (tiny model)


@pytest.fixture(scope="module")
def off_spec() -> ConfigSpec:
    return plan_configs("reference", [], [])[0]


def test_static_adapters_exclude_blacklist_and_bypass(tiny_engine, off_spec) -> None:
    n = tiny_engine.dims.n_layers
    for name in ("static-shortgpt", "static-random"):
        adapter = get_engine(name, engine=tiny_engine)
        spec = adapter.spec_for(2, matched_to="reference/lossy/s=0.50")
        assert spec.config_id == f"{name}/k=2"
        assert spec.params["matched_to"] == "reference/lossy/s=0.50"
        blocks = spec.params["blocks"]
        assert len(blocks) == 2 and 0 not in blocks and n - 1 not in blocks
        assert spec.pruning.mode == "static" and spec.pruning.static_bypass == tuple(blocks)
        [out] = adapter.generate(PROMPTS[:1], 6, spec)
        assert out.stats["layers_bypassed"] > 0
        logits, _ = adapter.teacher_forced_logits(out.prompt_ids, out.token_ids, spec)
        assert tuple(logits.shape) == (len(out.token_ids), tiny_engine.dims.vocab)
    bi = tiny_engine.calibration().block_influence
    expected = tuple(sorted(sorted(range(1, n - 1), key=lambda i: (bi[i], i))[:2]))
    assert get_engine("static-shortgpt", engine=tiny_engine).blocks_for(2) == expected
    with pytest.raises(HarnessInputError, match=f"\\[0, {n - 2}\\]"):
        get_engine("static-random", engine=tiny_engine).blocks_for(n)


def test_hf_peer_equals_reference_off(tiny_engine, off_spec) -> None:
    import torch

    ref = get_engine("reference", engine=tiny_engine)
    hf = get_engine("hf-generate", engine=tiny_engine)
    hf_spec = ConfigSpec("hf-generate/off", "hf-generate", "off", None)
    for prompt in PROMPTS:  # batch 1, as the suite compares them
        [a] = ref.generate([prompt], 12, off_spec)
        [b] = hf.generate([prompt], 12, hf_spec)
        assert a.prompt_ids == b.prompt_ids
        assert a.token_ids == b.token_ids, prompt
        la, _ = ref.teacher_forced_logits(a.prompt_ids, a.token_ids, off_spec)
        lb, _ = hf.teacher_forced_logits(a.prompt_ids, a.token_ids, hf_spec)
        assert torch.equal(la.argmax(-1), lb.argmax(-1))
        assert torch.allclose(la, lb, atol=1e-3, rtol=1e-4)
    with pytest.raises(HarnessInputError, match="'lossy'"):
        hf.generate(PROMPTS[:1], 4, plan_configs("reference", ["lossy"], [0.5])[1])


def test_quality_runner_off_is_exact_and_reference_cache(tiny_engine, off_spec) -> None:
    from rsp_bench.quality import ReferenceOutputs, equivalence_metrics

    ref = get_engine("reference", engine=tiny_engine)
    cache = ReferenceOutputs(ref, off_spec)
    outs = cache.get("t", PROMPTS, 8, with_logits=True)
    assert cache.get("t", PROMPTS, 8) is outs  # cached: one reference run per prompt set
    with pytest.raises(HarnessInputError, match="'t'"):
        cache.get("t", PROMPTS[:2], 8)
    values = equivalence_metrics(ref, off_spec, PROMPTS, outs, 8)
    assert values["exact_match_rate"].value == 1.0 and values["exact_match_rate"].n == len(PROMPTS)
    assert values["top1_agreement"].value == 1.0 and values["kl_mean"].value == 0.0
    assert values["perplexity_ratio"].value == 1.0
    assert values["bypass_ratio"].value == 0.0
    assert values["blocks_executed_per_token"].value == tiny_engine.dims.n_layers
    lo, hi = values["exact_match_rate"].ci
    assert lo < 1.0 and hi == pytest.approx(1.0)  # Wilson interval on 3 prompts is wide
    lossy = plan_configs("reference", ["lossy"], [1.0])[1]
    pruned = equivalence_metrics(ref, lossy, PROMPTS, outs, 8)
    assert 0.0 < pruned["bypass_ratio"].value < 1.0
    assert pruned["blocks_executed_per_token"].value < tiny_engine.dims.n_layers


def test_generation_logits_are_the_teacher_forced_ones(tiny_engine, off_spec) -> None:
    """The reference adapter hands back generation logits only where they equal teacher forcing
    bit for bit (no router), which lets the runner skip a second decode."""
    import torch

    ref = get_engine("reference", engine=tiny_engine)
    static = get_engine("static-shortgpt", engine=tiny_engine).spec_for(2)
    for spec in (off_spec, static):
        outs = [ref.generate([p], 8, spec)[0] for p in PROMPTS[:2]]
        assert all(o.logits is None for o in ref.generate(PROMPTS[:2], 8, spec))  # batched: padding
        for out in outs:
            assert out.logits is not None and out.logits.shape[0] == len(out.token_ids)
            forced, _ = ref.teacher_forced_logits(out.prompt_ids, out.token_ids, spec)
            assert torch.equal(out.logits, forced)
    lossy = plan_configs("reference", ["lossy"], [0.5])[1]
    assert all(o.logits is None for o in ref.generate(PROMPTS[:1], 4, lossy))
