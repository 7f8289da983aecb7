"""rsp_bench.speed: interleaving, sample collection, ratio and router-cost math, figures, the
project CLI, and (on the tiny random model) the real adapters and the roofline loop.

Fake calls return fixed step times, so every figure here is checked exactly; nothing is a
wall-clock assertion.
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest

from rsp_bench import speed
from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics import blocks_executed_per_token
from rsp_bench.profiles import PROFILES
from rsp_bench.projection import ModelShape, bytes_per_token, cpu_ideal_speedup
from rsp_bench.speed import (
    CallTiming,
    InterleavedBench,
    bench_figures,
    metric_name,
    projected_figures,
    router_cost_per_token,
    rotated_order,
)

TINY_CFG = {"num_hidden_layers": 6, "hidden_size": 64, "intermediate_size": 192,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 400,
            "tie_word_embeddings": True}


def fake_call(step_s: float, log: list[str], name: str, batch: int = 1, steps: int = 4,
              executed: int | None = None, router_s: float = 0.0, bypassed: int = 0):
    """A call whose every step takes ``step_s``; it notes its name in ``log`` when run."""
    def call() -> CallTiming:
        log.append(name)
        stats = None
        counts = None
        if executed is not None:
            stats = {"executed_blocks_per_step": [executed] * steps, "router_time_s": router_s,
                     "decode_step_times_s": [step_s] * steps, "prefill_time_s": 0.05}
            counts = [(bypassed, steps + 1, 6)] * batch
        return CallTiming(ttft_s=0.05, step_times_s=[step_s] * steps, batch=batch,
                          new_tokens=batch * (steps + 1), stats=stats, bypass_counts=counts)
    return call


def fake_engine(use_linear: bool = False, rank: int = 0):
    cal = SimpleNamespace(use_linear=[use_linear] * 6, bypass_rank=rank)
    return SimpleNamespace(hf_model=SimpleNamespace(config=dict(TINY_CFG)), calibration=lambda: cal)


# ----------------------------------------------------------------------------- interleaving


def test_rotated_order_cycles_every_name_through_every_position():
    names = ["A", "B", "C"]
    assert [rotated_order(names, r) for r in range(4)] == [
        ["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"], ["A", "B", "C"]]
    with pytest.raises(HarnessInputError):
        rotated_order([], 0)


def test_run_interleaves_in_rotated_rounds_and_excludes_warmup():
    log: list[str] = []
    bench = InterleavedBench({n: fake_call(0.01, log, n) for n in "ABC"})
    bench.warm_up()
    bench.run(rounds=3)
    assert log == list("ABC") + list("ABC") + list("BCA") + list("CAB")
    assert [r for r, _ in bench.log[:3]] == [-1, -1, -1]
    for n in "ABC":
        assert len(bench.samples(n)) == 3  # warm-up calls are not samples
    assert bench.rounds_done == 3


def test_pedantic_hooks_run_whole_rotated_rounds_like_pytest_benchmark():
    log: list[str] = []
    bench = InterleavedBench({n: fake_call(0.01, log, n) for n in "ABC"})
    timed = []
    for name in "ABC":  # one "test" per name, 2 pedantic rounds each
        setup, target, teardown = bench.pedantic_hooks(name)
        for _ in range(2):
            setup()
            before = len(log)
            target()
            timed.append((name, log[before]))
            teardown()
    assert bench.rounds_done == 6
    assert all(name == ran for name, ran in timed)  # the timed call is the test's own
    rounds = [log[i:i + 3] for i in range(0, len(log), 3)]
    assert rounds == [rotated_order("ABC", r) for r in range(6)]
    assert all(len(bench.samples(n)) == 6 for n in "ABC")


def test_pedantic_round_left_open_is_closed_by_the_next_setup():
    log: list[str] = []
    bench = InterleavedBench({n: fake_call(0.01, log, n) for n in "AB"})
    setup, target, _ = bench.pedantic_hooks("A")
    target()  # --benchmark-disable: no setup, no teardown
    setup()  # the next round's setup finishes the open round first
    assert bench.rounds_done == 1 and log == ["A", "B", "B"]  # round 1 order: B A
    target()
    bench.close_round()
    assert bench.rounds_done == 2 and log == ["A", "B", "B", "A"]
    assert len(bench.samples("A")) == len(bench.samples("B")) == 2


def test_bad_calls_are_named():
    with pytest.raises(HarnessInputError, match="'x' is not callable"):
        InterleavedBench({"x": 3})
    bench = InterleavedBench({"x": lambda: 1.5})
    with pytest.raises(HarnessInputError, match="returned float"):
        bench.run(1)
    with pytest.raises(HarnessInputError, match="rounds"):
        bench.run(0)
    with pytest.raises(HarnessInputError, match="unknown call 'y'"):
        bench.samples("y")
    with pytest.raises(HarnessInputError, match="ttft_s"):
        CallTiming(ttft_s=float("nan"), step_times_s=[0.1], batch=1, new_tokens=2)
    with pytest.raises(HarnessInputError, match="step_times_s"):
        CallTiming(ttft_s=0.1, step_times_s=[0.0], batch=1, new_tokens=2)
    with pytest.raises(HarnessInputError, match="batch"):
        CallTiming(ttft_s=0.1, step_times_s=[0.1], batch=0, new_tokens=2)


# ----------------------------------------------------------------------------- ratio math


def test_summary_and_speedup_math():
    log: list[str] = []
    bench = InterleavedBench({"off": fake_call(0.020, log, "off", batch=4),
                              "pruned": fake_call(0.016, log, "pruned", batch=4)})
    bench.run(5)
    s = bench.summary("pruned")
    assert s["tpot_ms_p50"] == pytest.approx(16.0)  # per-request latency: the step
    assert s["decode_tokens_per_s"] == pytest.approx(4 / 0.016)  # batch tokens per second
    assert s["ttft_ms_p50"] == pytest.approx(50.0)
    assert s["calls"] == 5 and s["steps"] == 20 and s["tpot_ms"] == pytest.approx([16.0] * 5)
    sp = bench.speedup("off", "pruned")
    assert sp["ratio"] == pytest.approx(1.25) and sp["pairs"] == 5
    assert sp["ratios"] == pytest.approx([1.25] * 5)
    assert sp["lo"] == pytest.approx(1.25) and sp["hi"] == pytest.approx(1.25)
    assert bench.pair_ratios("pruned", "off") == pytest.approx([0.8] * 5)


def test_speedup_pairs_only_rounds_where_both_ran():
    log: list[str] = []
    bench = InterleavedBench({"a": fake_call(0.02, log, "a"), "b": fake_call(0.01, log, "b")})
    bench.run(2)
    del bench.by_round["b"][0]
    assert bench.paired_durations("a", "b") == ([0.02], [0.01])
    bench.by_round["b"].clear()
    with pytest.raises(HarnessInputError, match="nothing to pair"):
        bench.speedup("a", "b")


def test_call_without_decode_steps_is_an_error_naming_the_fix():
    bench = InterleavedBench({"a": lambda: CallTiming(0.1, [], 1, 1)})
    bench.run(1)
    with pytest.raises(HarnessInputError, match="max_new_tokens"):
        bench.summary("a")


# ----------------------------------------------------------------------------- router, trace


def test_router_cost_per_token_by_hand_and_pooled():
    s1 = {"router_time_s": 0.003, "decode_step_times_s": [0.01, 0.01, 0.01]}
    rc = router_cost_per_token(s1)
    assert rc["ms_per_token"] == pytest.approx(1.0)  # 3 ms over 3 steps
    assert rc["step_share"] == pytest.approx(0.1)  # 3 ms of 30 ms
    s2 = {"router_time_s": 0.001, "decode_step_times_s": [0.02]}
    rc = router_cost_per_token([s1, s2])
    assert rc["ms_per_token"] == pytest.approx(1.0)  # 4 ms / 4 steps
    assert rc["step_share"] == pytest.approx(0.004 / 0.05)
    with pytest.raises(HarnessInputError, match="router_time_s"):
        router_cost_per_token({"decode_step_times_s": [0.1]})
    with pytest.raises(HarnessInputError, match="no decode step"):
        router_cost_per_token({"router_time_s": 0.0, "decode_step_times_s": []})


def test_ideal_speedup_from_trace_uses_projection_and_engine_bypass():
    stats = [{"executed_blocks_per_step": [6, 4, 4, 2]}, {"executed_blocks_per_step": [4]}]
    assert speed.mean_executed_blocks(stats) == pytest.approx(4.0)
    shape = ModelShape.from_hf_config(TINY_CFG)
    assert speed.ideal_speedup_from_trace(fake_engine(), stats) == pytest.approx(
        cpu_ideal_speedup(shape, 4.0))
    assert speed.ideal_speedup_from_trace(fake_engine(True, 8), stats) == pytest.approx(
        cpu_ideal_speedup(shape, 4.0, 4, "linear", 8))
    assert speed.engine_bypass(fake_engine(True, 8)) == ("linear", 8)
    assert speed.measured_over_ideal(1.2, 1.5) == pytest.approx(0.8)
    with pytest.raises(HarnessInputError, match="ideal_speedup"):
        speed.measured_over_ideal(1.2, 0.0)
    with pytest.raises(HarnessInputError, match="executed_blocks_per_step"):
        speed.mean_executed_blocks({"router_time_s": 0})


def test_bench_figures_exact_on_fake_calls():
    log: list[str] = []
    bench = InterleavedBench({
        speed.OFF_ID: fake_call(0.020, log, "off", executed=6),
        "reference/lossy/s=0.50": fake_call(0.016, log, "p", executed=4, router_s=0.0008,
                                            bypassed=8),
        speed.HF_ID: fake_call(0.030, log, "hf"),
    })
    bench.run(4)
    roof = speed.Roofline(bytes_per_token=1.0, gemv_bytes=1.0, gemv_count=25,
                          seconds_per_token=0.001, tokens_per_s=1000.0, gbs=0.1, iterations=3,
                          threads=1, samples_s=[0.001] * 3)
    figs = bench_figures(bench, fake_engine(), roof)
    shape = ModelShape.from_hf_config(TINY_CFG)
    off, pruned, hf = figs[speed.OFF_ID], figs["reference/lossy/s=0.50"], figs[speed.HF_ID]
    assert pruned["speedup_vs_off"]["value"] == pytest.approx(1.25)
    assert pruned["speedup_vs_off"]["samples"] == pytest.approx([1.25] * 4)
    assert "speedup_vs_off" not in hf  # the inverse of off's speedup_vs_hf_generate, never gated twice
    assert off["speedup_vs_hf_generate"]["value"] == pytest.approx(1.5)
    assert pruned["trace_blocks_per_step"]["value"] == 4
    assert pruned["blocks_executed_per_token"]["value"] == pytest.approx(
        blocks_executed_per_token(32, 6, 20))
    assert pruned["router_ms_per_token"]["value"] == pytest.approx(0.2)
    assert "router_ms_per_token" not in off  # the router never ran
    ideal = cpu_ideal_speedup(shape, 4.0)
    assert pruned["ideal_speedup"]["value"] == pytest.approx(ideal)
    assert pruned["speedup_over_ideal"]["value"] == pytest.approx(1.25 / ideal)
    gbs = bytes_per_token(shape, 4, 4.0) / 0.016 / 1e9
    assert pruned["achieved_bandwidth_gbs"]["value"] == pytest.approx(gbs)
    assert pruned["roofline_fraction"]["value"] == pytest.approx(gbs / 0.1)
    assert hf["achieved_bandwidth_gbs"]["value"] == pytest.approx(bytes_per_token(shape, 4) / 0.03 / 1e9)
    assert off["roofline_tokens_per_s"]["value"] == 1000.0
    assert off["decode_tokens_per_s"]["samples"] == pytest.approx([50.0] * 4)


def test_projected_figures_follow_physics():
    shape = ModelShape.smollm2_135m()
    off = projected_figures(shape, None)
    pruned = projected_figures(shape, 20.0, bypass_kind="linear", bypass_rank=32)
    for p in PROFILES:
        assert off[f"projected_freed_fraction_{p}"] == 0.0
        assert pruned[f"projected_busy_ms_per_token_{p}"] < off[f"projected_busy_ms_per_token_{p}"]
        freed = pruned[f"projected_freed_fraction_{p}"]
        assert 0 < freed < 10 / 30  # never more than the share of blocks skipped
        assert 0 <= pruned[f"projected_idle_fraction_{p}"] < 1
    tps = [off[f"projected_tokens_per_s_{p}"] for p in ("V100", "A100", "H100")]
    assert tps == sorted(tps)
    assert metric_name("tpot_ms_p50", 1) == "tpot_ms_p50"
    assert metric_name("tpot_ms_p50", 8) == "tpot_ms_p50_b8"


# ----------------------------------------------------------------------------- project CLI


def _project(argv: list[str]) -> argparse.Namespace:
    return speed.configure_project_parser(argparse.ArgumentParser()).parse_args(argv)


def test_project_json_keys_without_a_model(capsys):
    rc = speed.run_project(_project(["--executed-blocks", "24", "--json", "--profiles", "V100,A100,H100"]))
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["V100", "A100", "H100"]
    for prof in out.values():
        assert prof["projected"] is True
        for side in ("off", "pruned"):
            assert {"tokens_per_s", "busy_ms_per_token", "idle_fraction", "freed_fraction"} <= set(prof[side])
        assert prof["off"]["freed_fraction"] == 0.0
        assert prof["pruned"]["busy_ms_per_token"] < prof["off"]["busy_ms_per_token"]
        assert prof["pruned"]["executed_blocks"] == pytest.approx(24)


def test_project_table_says_projected(capsys):
    assert speed.run_project(_project(["--executed-blocks", "28", "--batch", "4", "--dtype", "bf16",
                                       "--profiles", "H100"])) == 0
    out = capsys.readouterr().out
    assert "PROJECTED" in out and "projected tokens/s pruned" in out and "H100" in out


def test_project_reads_a_model_folder_config(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(TINY_CFG))
    assert speed.run_project(_project(["--model", str(tmp_path), "--executed-blocks", "3", "--json"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == set(PROFILES)
    assert out["A100"]["off"]["executed_blocks"] == 6


@pytest.mark.parametrize("argv, needle", [
    (["--executed-blocks", "31"], "--executed-blocks 31.0 is outside [0, 30]"),
    (["--executed-blocks", "3", "--profiles", "B200"], "'B200'"),
    (["--executed-blocks", "3", "--dtype", "fp8"], "'fp8'"),
    (["--executed-blocks", "3", "--dtype", "bf16", "--profiles", "V100"], "no BF16"),
    (["--executed-blocks", "3", "--model", "/nonexistent/m"], "/nonexistent/m"),
])
def test_project_bad_input_exits_2_naming_the_value(argv, needle, capsys):
    assert speed.run_project(_project(argv)) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_project_parser_rejects_bad_numbers():
    for argv in (["--batch", "0"], ["--sensitivity", "nan"], ["--sensitivity", "1.5"]):
        with pytest.raises(SystemExit):
            _project(argv)


# ----------------------------------------------------------------------------- tiny model


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from reference_engine import Engine
    from reference_engine.model_loading import make_tiny_model

    # One thread: on a shared, loaded CPU, two threads that spin-wait for each other make
    # every tiny op ~100x slower; these tests check machinery, not speed.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = make_tiny_model(tmp_path_factory.mktemp("speed") / "tiny")
    yield Engine.load(str(path), calibrate=False)  # pruning stays off: no calibration needed
    torch.set_num_threads(threads)


def test_real_adapters_interleave_on_the_tiny_model(tiny_engine):
    from reference_engine import PruningConfig

    e = tiny_engine
    prompts = speed.prompts_for_batch(["Hello there.", "12345 + 678 ="], 3)
    assert prompts[2] == "Hello there."
    calls = {
        speed.OFF_ID: speed.engine_call(e, prompts, 6, PruningConfig(mode="off", log_level="NONE")),
        speed.HF_ID: speed.hf_generate_call(e.hf_model, [e.encode(p) for p in prompts], 6,
                                            e.pad_id, e.eos_id, fixed_length=True),
        "math": speed.reference_math_call(e.weights, [e.encode(p) for p in prompts], 6, e.pad_id),
    }
    bench = InterleavedBench(calls)
    bench.warm_up()
    bench.run(2)
    off, hf, math_ = (bench.samples(n)[0] for n in (speed.OFF_ID, speed.HF_ID, "math"))
    # same weights, greedy: the three loops agree token for token up to the engine's EOS stop
    for a, b, c in zip(off.tokens, hf.tokens, math_.tokens):
        assert a == b[:len(a)] == c[:len(a)]
    assert len(hf.tokens[0]) == 6 and hf.steps == 5 and math_.steps == 5
    assert off.stats["executed_blocks_per_step"] == [6] * off.steps
    figs = bench_figures(bench, e, bypass=("identity", 0))
    assert figs[speed.OFF_ID]["trace_blocks_per_step"]["value"] == 6
    assert figs[speed.OFF_ID]["speedup_vs_hf_generate"]["n"] == 2
    assert figs[speed.OFF_ID]["speedup_vs_hf_generate"]["value"] > 0


def test_bandwidth_roofline_takes_the_fastest_kernel(tiny_engine):
    # A 16 MiB STREAM buffer keeps the test fast; the real one is larger than the L3 cache.
    roof = speed.bandwidth_roofline(tiny_engine, min_time_s=0.05, max_iterations=20,
                                    stream_bytes=16 << 20)
    d = tiny_engine.dims
    per_block = (d.q_dim + 2 * d.kv_dim) * d.hidden + d.hidden * d.q_dim + 3 * d.hidden * d.intermediate
    assert roof.gemv_count == 4 * d.n_layers + 1
    assert roof.gemv_bytes == 4 * (d.n_layers * per_block + d.vocab * d.hidden)
    assert set(roof.kernels) == {"model_gemv_torch", "model_gemv_numpy", "stream_read"}
    assert roof.kernels["stream_read"]["bytes"] == (16 << 20)
    best = max(roof.kernels.values(), key=lambda k: k["gbs"])
    assert roof.kernel == best["name"] and roof.gbs == pytest.approx(best["gbs"])
    # The old figure, torch's own GEMV, is kept under its name and can only be at or below the ceiling.
    assert roof.torch_gemv_gbs == pytest.approx(roof.kernels["model_gemv_torch"]["gbs"])
    assert roof.torch_gemv_gbs <= roof.gbs
    assert 5 <= roof.iterations <= 20
    assert roof.bytes_per_token == pytest.approx(
        bytes_per_token(speed.model_shape(tiny_engine), 4))
    assert roof.tokens_per_s == pytest.approx(roof.gbs * 1e9 / roof.bytes_per_token)
    assert "samples_s" not in roof.to_dict() and roof.to_dict()["kernel"] == roof.kernel


def test_gpu_decode_report_without_cuda_says_so():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the suite's gpu test measures it")
    with pytest.raises(HarnessInputError, match="needs a CUDA device"):
        speed.gpu_decode_report(lambda: None, ModelShape.smollm2_135m(), "fp16", 64)


def test_router_setup_time_is_not_counted_per_token():
    # The engine reports the once-per-request setup apart; router_time_s is per-token work only.
    s = {"router_time_s": 0.003, "router_setup_time_s": 0.010, "decode_step_times_s": [0.01] * 3}
    assert router_cost_per_token(s)["ms_per_token"] == pytest.approx(1.0)


def test_targets_without_setup_still_make_whole_rounds():
    log: list[str] = []
    bench = InterleavedBench({n: fake_call(0.01, log, n) for n in "AB"})
    for name in "AB":  # --benchmark-disable: each test calls its target once, nothing else
        bench.pedantic_hooks(name)[1]()
    bench.close_round()
    assert log == ["A", "B", "B", "A"] and bench.rounds_done == 2
    assert all(len(bench.samples(n)) == 2 for n in "AB")


def test_bench_kernel_options_parse_and_name_bad_values():
    parse = speed.configure_bench_parser(argparse.ArgumentParser()).parse_args
    args = parse([])
    assert args.kernel is None and args.compare_kernels is None  # the engine's own kernel by default
    args = parse(["--kernel", "numpy", "--compare-kernels", "none", "--lossless", "--llama-cpp"])
    assert args.kernel == "numpy" and args.compare_kernels == [] and args.lossless and args.llama_cpp
    assert parse(["--compare-kernels", "numpy,torch"]).compare_kernels == ["numpy", "torch"]
    with pytest.raises(argparse.ArgumentTypeError, match="'blas'"):
        speed.commands._kernel_list("blas")
    with pytest.raises(SystemExit):
        parse(["--kernel", "blas"])
