"""Roofline projection against hand-computed cases and against physics.

Hand-computed figures use the datasheet numbers and the default efficiencies of
rsp_bench.profiles (bandwidth 0.8, compute 0.7, min kernel 2 us, launch 5 us).
"""

from types import SimpleNamespace

import pytest

from rsp_bench.errors import HarnessInputError
from rsp_bench.profiles import PROFILES, get_profile, match_device_name
from rsp_bench.projection import (
    ModelShape,
    bytes_per_token,
    cpu_ideal_speedup,
    decode_step_ops,
    elementwise_op,
    linear_op,
    op_time_s,
    project_decode,
    project_pruning,
    projection_json,
    projection_table,
    simulate_step,
)

SMOL = ModelShape.smollm2_135m()
LLAMA7B = ModelShape.llama_7b()


def test_batch1_gemv_is_bandwidth_bound_on_a100():
    op = linear_op("gemv", 4096, 4096, batch=1, dtype_bytes=2)
    weight_and_activations = (4096 * 4096 + 4096 + 4096) * 2  # 33,570,816 bytes
    memory_s = weight_and_activations / (2039e9 * 0.8)  # 20.58 us
    compute_s = 2 * 4096 * 4096 / (312e12 * 0.7)  # 0.15 us
    assert op.bytes == weight_and_activations
    assert memory_s > 100 * compute_s
    assert op_time_s(op, "A100", "fp16") == pytest.approx(memory_s, rel=1e-12)
    assert op_time_s(op, "A100", "fp16") == pytest.approx(20.58e-6, rel=1e-3)


def test_prefill_gemm_is_compute_bound_on_a100():
    op = linear_op("prefill", 4096, 4096, batch=2048, dtype_bytes=2)
    compute_s = 2 * 2048 * 4096 * 4096 / (312e12 * 0.7)  # 314.6 us
    memory_s = (4096 * 4096 + 2048 * 8192) * 2 / (2039e9 * 0.8)  # 41.1 us
    assert compute_s > 5 * memory_s
    assert op_time_s(op, "A100", "bf16") == pytest.approx(compute_s, rel=1e-12)
    assert op_time_s(op, "A100", "bf16") == pytest.approx(314.6e-6, rel=1e-3)


def test_tiny_kernels_are_launch_bound_and_leave_the_gpu_idle():
    ops = [elementwise_op(f"tiny{i}", 576, 576, 576, 2) for i in range(100)]
    assert all(op_time_s(o, "H100") == pytest.approx(2e-6) for o in ops)  # the floor
    tl = simulate_step(ops, "H100", "fp16", host_step_overhead_us=0.0)
    # kernel i is launched at (i+1)*5 us and runs 2 us: the GPU always waits for the host
    assert tl.host_s == pytest.approx(500e-6)
    assert tl.span_s == pytest.approx(502e-6)
    assert tl.busy_s == pytest.approx(200e-6)
    assert tl.idle_fraction == pytest.approx(302 / 502)
    assert tl.idle_fraction > 0


def test_host_step_overhead_delays_the_first_kernel():
    op = linear_op("gemv", 4096, 4096, batch=1, dtype_bytes=2)
    tl = simulate_step([op], "A100", "fp16", kernel_launch_us=5.0, host_step_overhead_us=100.0)
    assert tl.span_s == pytest.approx(105e-6 + op_time_s(op, "A100"))
    assert tl.busy_s == pytest.approx(op_time_s(op, "A100"))


@pytest.mark.parametrize("shape", [SMOL, LLAMA7B], ids=["smollm2", "llama7b"])
@pytest.mark.parametrize("name", list(PROFILES))
def test_batch1_decode_never_beats_bandwidth_over_bytes_per_token(shape, name):
    prof = get_profile(name)
    p = project_decode(shape, prof, "fp16", batch=1, context=512)
    ceiling = prof.hbm_gbs * 1e9 / bytes_per_token(shape, 2)
    assert p.tokens_per_s <= ceiling * prof.bandwidth_efficiency
    assert p.bytes_per_step > bytes_per_token(shape, 2)  # KV cache and activations on top
    assert 0 <= p.idle_fraction < 1


@pytest.mark.parametrize("shape", [SMOL, LLAMA7B], ids=["smollm2", "llama7b"])
def test_newer_gpus_project_faster(shape):
    tps = {n: project_decode(shape, n, "fp16", 1, 512).tokens_per_s for n in PROFILES}
    assert tps["H200"] > tps["H100"] > tps["A100"] > tps["V100"]


def test_small_model_batch1_is_host_bound_and_large_model_gpu_bound():
    assert project_decode(SMOL, "H100").limited_by == "host"
    assert project_decode(LLAMA7B, "A100").limited_by == "gpu"


def _busy_s(ops, profile="A100"):
    return sum(o.count * op_time_s(o, profile) for o in ops)


def test_pruning_lowers_busy_time_by_exactly_the_skipped_work():
    full = decode_step_ops(SMOL, 1, 512, 2)
    all_bypassed = decode_step_ops(SMOL, 1, 512, 2, executed_blocks=0)
    executed_block_s = _busy_s([o for o in full if o.block == 0])
    bypassed_block_s = _busy_s([o for o in all_bypassed if o.block == 0])
    assert 0 < bypassed_block_s < executed_block_s

    r = project_pruning(SMOL, "A100", "fp16", 1, 512, executed_blocks_pruned=24)
    off_busy = r["off"].busy_ms_per_token / 1e3
    pruned_busy = r["pruned"].busy_ms_per_token / 1e3
    assert off_busy == pytest.approx(_busy_s(full))
    assert pruned_busy == pytest.approx(off_busy - 6 * (executed_block_s - bypassed_block_s))
    assert r["freed_fraction"] == pytest.approx(1 - pruned_busy / off_busy)
    assert r["freed_fraction"] > 0 and r["speedup"] > 1


def test_per_block_trace_prices_exactly_the_blocks_that_ran():
    shares = [1.0] * 30
    shares[10] = shares[11] = 0.0
    mean = project_decode(SMOL, "H100", executed_blocks=28)
    traced = project_decode(SMOL, "H100", executed_blocks=shares)
    assert traced.executed_blocks == 28
    assert traced.busy_ms_per_token == pytest.approx(mean.busy_ms_per_token)
    assert traced.kernels_per_step == pytest.approx(mean.kernels_per_step)


def test_fractional_executed_blocks_interpolate_busy_time():
    b = {e: project_decode(SMOL, "H100", executed_blocks=e).busy_ms_per_token
         for e in (27, 27.5, 28)}
    assert b[27.5] == pytest.approx((b[27] + b[28]) / 2)


def test_linear_bypass_costs_more_than_identity():
    ident = project_pruning(SMOL, "A100", executed_blocks_pruned=24)
    linear = project_pruning(SMOL, "A100", executed_blocks_pruned=24, bypass_kind="linear",
                             bypass_rank=64)
    assert linear["freed_fraction"] < ident["freed_fraction"]


def test_router_cost_is_charged_to_the_pruned_step_only():
    plain = project_pruning(SMOL, "H100", executed_blocks_pruned=24)
    routed = project_pruning(SMOL, "H100", executed_blocks_pruned=24,
                             router_kernels_per_block=2, router_host_us_per_block=3.0)
    assert routed["off"] == plain["off"]
    assert routed["pruned"].tokens_per_s < plain["pruned"].tokens_per_s
    assert routed["freed_fraction"] < plain["freed_fraction"]


def test_bf16_on_v100_is_refused_naming_the_profile():
    with pytest.raises(HarnessInputError, match="V100"):
        project_decode(SMOL, "V100", "bf16")
    assert project_decode(SMOL, "A100", "bf16").tokens_per_s > 0


def test_unknown_profile_and_dtype_are_refused():
    with pytest.raises(HarnessInputError, match=r"'B200'.*V100, A100, H100, H200"):
        get_profile("B200")
    with pytest.raises(HarnessInputError, match="fp8"):
        project_decode(SMOL, "H100", "fp8")
    assert get_profile("h100") is PROFILES["H100"]


def test_bad_step_inputs_are_refused_naming_the_value():
    with pytest.raises(HarnessInputError, match="31"):
        project_decode(SMOL, "A100", executed_blocks=31)
    with pytest.raises(HarnessInputError, match="bypass_rank"):
        project_decode(SMOL, "A100", executed_blocks=20, bypass_kind="linear")
    with pytest.raises(HarnessInputError, match="'skip'"):
        project_decode(SMOL, "A100", executed_blocks=20, bypass_kind="skip")
    with pytest.raises(HarnessInputError, match="batch"):
        project_decode(SMOL, "A100", batch=0)


def test_bypass_rank_above_the_hidden_size_is_refused_naming_both():
    for call in (lambda r: project_pruning(SMOL, "H100", executed_blocks_pruned=10, bypass_kind="linear",
                                           bypass_rank=r),
                 lambda r: bytes_per_token(SMOL, 2, 10, "linear", r),
                 lambda r: SMOL.bypassed_block_weights("linear", r)):
        with pytest.raises(HarnessInputError, match=r"bypass rank 577 exceeds the model's hidden size 576"):
            call(577)
        call(576)  # full rank is the largest a map of the stream can have


def test_cli_refuses_a_bypass_rank_above_the_hidden_size(capsys):
    """It printed a negative 'projected GPU time freed' (-0.477) and exited 0."""
    from rsp_bench import cli

    code = cli.main(["project", "--executed-blocks", "10", "--bypass-rank", "100000", "--profiles", "H100"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "bypass rank 100000" in err and "hidden size 576" in err


@pytest.mark.parametrize("shape", [SMOL, LLAMA7B], ids=["smollm2", "llama7b"])
def test_no_valid_bypass_frees_negative_gpu_time(shape):
    n = shape.n_layers
    for profile in PROFILES:
        for batch in (1, 64):
            for executed in (0, n / 2, n - 0.01, n):
                for rank in (0, 1, shape.hidden // 2, shape.hidden):
                    kind = "linear" if rank else "identity"
                    freed = project_pruning(shape, profile, batch=batch, executed_blocks_pruned=executed,
                                            bypass_kind=kind, bypass_rank=rank)["freed_fraction"]
                    assert freed >= 0, (profile, batch, executed, rank, freed)


def test_device_names_match_sxm_profiles_only():
    assert match_device_name("NVIDIA H200").name == "H200"
    assert match_device_name("NVIDIA A100-SXM4-80GB").name == "A100"
    assert match_device_name("NVIDIA H100 PCIe") is None
    assert match_device_name("NVIDIA GeForce RTX 4090") is None


def test_bytes_per_token_matches_design_figures():
    assert SMOL.attention_weights() == 884_736
    assert SMOL.mlp_weights() == 2_654_208
    assert SMOL.block_weights() == 884_736 + 2_654_208 + 2 * 576  # two norm vectors
    # DESIGN.md section 5: about 538 MB of fp32 weights per decoded token
    assert bytes_per_token(SMOL, 4) == pytest.approx(538e6, rel=1e-3)
    assert bytes_per_token(SMOL, 2) == bytes_per_token(SMOL, 4) / 2


def test_cpu_ideal_speedup_by_hand():
    rest = 576 + 576 + 49152 * 576  # embedding row, final norm, LM head
    bypassed = 576 + 2 * 192 * 576  # input norm and K/V projections still read
    expected = (30 * 3_540_096 + rest) / (24 * 3_540_096 + 6 * bypassed + rest)
    assert cpu_ideal_speedup(SMOL, 24) == pytest.approx(expected, rel=1e-12)
    assert cpu_ideal_speedup(SMOL, 30) == 1.0


def test_shape_from_hf_config():
    cfg = {"num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536,
           "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
           "tie_word_embeddings": True}
    assert ModelShape.from_hf_config(cfg) == SMOL
    assert ModelShape.from_hf_config(SimpleNamespace(**cfg, head_dim=None)) == SMOL
    del cfg["hidden_size"]
    with pytest.raises(HarnessInputError, match="hidden_size"):
        ModelShape.from_hf_config(cfg)


def test_json_and_table_label_every_figure_projected():
    out = projection_json(SMOL, "V100,A100,H100", executed_blocks_pruned=24)
    assert list(out) == ["V100", "A100", "H100"]
    for entry in out.values():
        assert entry["projected"] is True
        for mode in ("off", "pruned"):
            assert {"tokens_per_s", "busy_ms_per_token", "idle_fraction",
                    "freed_fraction"} <= set(entry[mode])
        assert entry["off"]["freed_fraction"] == 0.0
        assert entry["pruned"]["freed_fraction"] > 0
    rows = projection_table(SMOL, ["A100"], executed_blocks_pruned=24)
    figures = [k for k in rows[0] if k not in ("profile", "dtype", "batch", "context",
                                               "blocks/token pruned", "limited by (off)")]
    assert figures and all(k.startswith("projected") for k in figures)
