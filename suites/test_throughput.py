"""Speed suite (marker ``throughput``): decode speed measured on this machine, and GPU figures
projected from the measured execution trace (DESIGN.md sections 3-5, issue 4).

Measured: for each batch size, pruning off, every pruned configuration of ``rsp_configs`` and
plain ``model.generate`` ("hf-generate/off") run interleaved in one process, in rotated rounds
(``rsp_bench.speed.InterleavedBench``). Each configuration's test times its own call with
pytest-benchmark (pedantic mode, so the figures land in pytest-benchmark's JSON too) while its
setup and teardown run the other configurations of the same round: whichever test drives a
round, every configuration is measured in it, and speed-ups are ratios of neighbours. The last
test per batch turns every measured call into run-record metrics (``speed.bench_figures``;
batch 1 keeps plain metric names, batch N gets a ``_bN`` suffix) and prices the execution trace
on the V100, A100, H100 and H200 profiles (``projected_*``).

Assertions are only ones a noisy machine cannot flake: projection physics, and that the record
holds the figures. No wall-clock threshold anywhere: speeds are benchmarks and ratios.

The GPU test (marker ``gpu``) measures on a CUDA device when there is one and records the
projection for that device beside it, with its error; without one it is skipped.

Must NOT import torch, transformers or reference_engine at module level: pytest collects this
file on every run of ``suites/``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rsp_bench import speed
from rsp_bench.profiles import PROFILES, get_profile
from rsp_bench.projection import bytes_per_token

pytestmark = pytest.mark.throughput

BATCHES = (1, 4, 8)
QUICK_BATCHES = (1, 4)
TOKENS = 48
QUICK_TOKENS = 16
# Speed-up pairs at batch 1: every round runs every configuration, and each configuration's
# test (plus the hf-generate test) drives an equal share of the rounds. 24 pairs a side is what
# it takes for the gate to catch a 15% slowdown of speedup_vs_off on this machine: measured by
# `python scripts/measure_gate_power.py <records>` on real sample sets (round-to-round noise
# about 12%: detection of a planted 15% slowdown 0.20 at 6 pairs, 0.81 at 16, 0.95 at 24, at
# alpha 0.01; results/gate_power.json). The batch-N figures are reported, not time-tested by
# the gate (a _bN suffix), so quick mode runs them with one round per test.
PAIRS_BATCH1 = 24
# model.generate decodes at a third of the engine's speed (15 against 45 tokens/s in the quick
# run's record), so its 16-token call was about 1.1 s of a 2.5 s batch-1 round. Its figure is a per-step median, so 8 tokens (7 steps)
# measure the same speed; the quick run's speedup_vs_hf_generate pairs stay 24. Full run: TOKENS.
QUICK_HF_TOKENS = 8
QUICK_ROUNDS_PER_TEST_BATCHED = 1
# Reported for every profile; the gated names are projected_{tokens_per_s,idle_fraction,
# freed_fraction}_<P>.
PROJECTED_KEYS = ("projected_tokens_per_s", "projected_idle_fraction", "projected_freed_fraction")
# Pruning off on a second decode kernel, in the same rounds (full run only): transformers' own torch kernels when
# the engine runs another (the native C step, by default), else the native one when it builds.
def other_kernel(engine) -> str | None:
    if engine.decode_kernel != "torch":
        return "torch"
    from reference_engine.decode_native import NativeKernelUnavailable, load_library

    try:
        load_library()
    except NativeKernelUnavailable:
        return None
    return "native"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "batch" in metafunc.fixturenames:
        quick = bool(metafunc.config.getoption("--rsp-quick", default=False))
        batches = QUICK_BATCHES if quick else BATCHES
        metafunc.parametrize("batch", batches, ids=[f"batch={b}" for b in batches])


class _Benches:
    """One InterleavedBench per batch size, built on first use, shared by the module's tests."""

    def __init__(self, engine, configs, adapter_for, tokens: int, quick: bool) -> None:
        self.engine = engine
        self.quick = quick
        self.specs = {s.config_id: s for s in configs}
        self.adapter_for = adapter_for
        self.tokens = tokens
        self.hf_tokens = min(tokens, QUICK_HF_TOKENS) if quick else tokens
        self.prompts = speed.fixed_prompts()
        self.by_batch: dict[int, speed.InterleavedBench] = {}
        self.other_kernel: str | None = None

    @property
    def _other_id(self) -> str:
        return f"{speed.OFF_ID}/kernel={self.other_kernel}"

    def rounds_per_test(self, batch: int) -> int:
        drivers = len(self.specs) + 1  # one test per configuration, plus hf-generate's
        if batch > 1:
            return QUICK_ROUNDS_PER_TEST_BATCHED if self.quick else -(-PAIRS_BATCH1 // (2 * drivers))
        return -(-PAIRS_BATCH1 // drivers)

    def get(self, batch: int) -> speed.InterleavedBench:
        if batch not in self.by_batch:
            prompts = speed.prompts_for_batch(self.prompts, batch)
            calls = {cid: speed.adapter_call(self.adapter_for(spec), spec, prompts, self.tokens)
                     for cid, spec in self.specs.items()}
            e = self.engine
            # model.generate on the same weights and the same prompt ids (chat template applied by
            # the engine's encoder), batched with left padding like the engine
            calls[speed.HF_ID] = speed.hf_generate_call(e.hf_model, [e.encode(p) for p in prompts],
                                                        self.hf_tokens, e.pad_id, e.eos_id)
            # The other kernel's row is a reported comparison (nothing gates it) that costs a
            # torch-speed decode in every batch-1 round, about 20 s of a quick run: full run only.
            if batch == 1 and speed.OFF_ID in self.specs and not self.quick:
                self.other_kernel = other_kernel(e)
            if batch == 1 and self.other_kernel is not None:
                # Its speedup_vs_off is the engine's kernel against the other one (not bit for bit
                # the same sums, so the equivalence suite checks whichever kernel the engine runs).
                from reference_engine import PruningConfig

                calls[self._other_id] = speed.engine_call(e, prompts, self.tokens,
                                                          PruningConfig(mode="off", log_level="NONE"),
                                                          self.other_kernel)
            bench = speed.InterleavedBench(calls)
            bench.warm_up()
            self.by_batch[batch] = bench
        return self.by_batch[batch]


@pytest.fixture(scope="module")
def benches(rsp_engine, rsp_configs, rsp_adapter_for, rsp_options) -> _Benches:
    tokens = rsp_options.max_new_tokens or (QUICK_TOKENS if rsp_options.quick else TOKENS)
    return _Benches(rsp_engine, rsp_configs, rsp_adapter_for, tokens, rsp_options.quick)


@pytest.fixture(scope="module")
def roofline(rsp_engine) -> speed.Roofline:
    return speed.bandwidth_roofline(rsp_engine)


def _drive(benchmark, benches: _Benches, name: str, batch: int):
    bench = benches.get(batch)
    setup, target, teardown = bench.pedantic_hooks(name)
    benchmark.group = f"throughput batch={batch}"
    tokens = benches.hf_tokens if name == speed.HF_ID else benches.tokens
    benchmark.extra_info.update(config_id=name, batch=batch, max_new_tokens=tokens,
                                interleaved_with=[n for n in bench.names if n != name])
    timing = benchmark.pedantic(target, setup=setup, teardown=teardown,
                                rounds=benches.rounds_per_test(batch))
    benchmark.extra_info["timing_method"] = timing.method
    return timing


def test_decode_speed(rsp_config, batch, benchmark, benches):
    """One configuration's calls, timed inside whole interleaved rounds."""
    timing = _drive(benchmark, benches, rsp_config.config_id, batch)
    assert timing.batch == batch and timing.new_tokens >= batch


def test_hf_generate_speed(batch, benchmark, benches):
    """model.generate on the same weights: the peer the engine's own loop is measured against."""
    timing = _drive(benchmark, benches, speed.HF_ID, batch)
    assert timing.batch == batch and timing.new_tokens >= batch


# The equivalence suite records these at batch 1 on its own prompts (the figures the baselines
# hold); this suite records its own only at other batches (``_b4``). Before, whichever suite ran
# first kept the name, so the reversed quick run recorded this suite's blocks_executed_per_token
# where the forward one had the equivalence suite's (issue 28); now a record holds the same
# figures in any order, and a run of this suite alone leaves them out.
COMPUTE_NAMES = ("bypass_ratio", "blocks_executed_per_token")


def _recorded(metric: str, batch: int) -> bool:
    return not (batch == 1 and metric in COMPUTE_NAMES)


def _add(rsp_record, config_id: str, name: str, fig: dict, spec) -> None:
    existing = rsp_record.record["configurations"].get(config_id, {}).get("metrics", {})
    if name in existing:
        # one figure per name and configuration (batch-1 compute figures are left out: _recorded)
        return
    rsp_record.add_metric(config_id, name, fig["value"], fig["n"], ci=fig["ci"], unit=fig["unit"],
                          samples=fig["samples"], engine=spec[0], mode=spec[1], sensitivity=spec[2])


@pytest.mark.rsp_module_last  # it records what the benchmark tests measured, in any order asked
def test_throughput_record(batch, benches, rsp_engine, rsp_record, roofline):
    """Every measured and projected figure of this batch size into the run record, then the
    checks a noisy machine cannot flake."""
    bench = benches.by_batch.get(batch)
    if bench is None or bench.rounds_done == 0:
        pytest.skip(f"no interleaved round ran at batch={batch} (pytest-benchmark skipped?)")
    bench.close_round()
    figs = speed.bench_figures(bench, rsp_engine, roofline if batch == 1 else None)
    ident = {cid: (s.engine, s.mode, s.sensitivity) for cid, s in benches.specs.items()}
    ident[speed.HF_ID] = ("hf-generate", "off", None)
    other = figs.pop(benches._other_id, None) if benches.other_kernel and batch == 1 else None
    if other is not None:
        # Filed under reference/off as extra metrics, not as a configuration of its own: a
        # configuration the committed baseline lacks would fail the CI gate.
        k = benches.other_kernel
        for metric, renamed in (("decode_tokens_per_s", f"decode_tokens_per_s_{k}_kernel"),
                                ("tpot_ms_p50", f"tpot_ms_p50_{k}_kernel"),
                                ("speedup_vs_off", f"speedup_{k}_kernel_vs_off")):
            _add(rsp_record, speed.OFF_ID, speed.metric_name(renamed, batch), other[metric],
                 ident[speed.OFF_ID])

    shape = speed.model_shape(rsp_engine)
    kind, rank = speed.engine_bypass(rsp_engine)
    projected: dict[str, dict[str, float]] = {}
    for name, metrics in figs.items():
        for metric, fig in metrics.items():
            if _recorded(metric, batch):
                _add(rsp_record, name, speed.metric_name(metric, batch), fig, ident[name])
        if name == speed.HF_ID:
            continue  # same weights, same work as reference/off: its projection is that one
        if ident[name][1] == "quant":
            # The profiles price the reference engine's fp16 trace; a quantized llama.cpp rung
            # reads other bytes through other kernels, which nothing here models: no projection
            # rather than a wrong one.
            continue
        trace = metrics.get("trace_blocks_per_step")
        pruned = trace is not None and ident[name][1] != "off"
        # priced from the trace alone (not the router's measured host time), so a projected
        # figure is a deterministic function of which blocks ran
        proj = speed.projected_figures(shape, trace["value"] if pruned else None, batch,
                                       bypass_kind=kind, bypass_rank=rank)
        projected[name] = proj
        n = trace["n"] if trace else metrics["tpot_ms_p50"]["n"]
        for key in PROJECTED_KEYS:
            for p in PROFILES:
                unit = "tokens/s, projected" if key.endswith("tokens_per_s") else "fraction, projected"
                _add(rsp_record, name, speed.metric_name(f"{key}_{p}", batch),
                     {"value": proj[f"{key}_{p}"], "n": n, "ci": None, "unit": unit,
                      "samples": None}, ident[name])
    rsp_record.set_extra(f"throughput_b{batch}", {
        "max_new_tokens": benches.tokens, "hf_generate_max_new_tokens": benches.hf_tokens, "rounds": bench.rounds_done, "calls": bench.names,
        "timing": {n: bench.samples(n)[0].method for n in bench.names},
        "roofline": roofline.to_dict(), "projection_context": speed.PROJECTION_CONTEXT,
        "bypass": [kind, rank],
    })

    # --- the record holds what was measured
    stored = rsp_record.record["configurations"]
    for name in figs:
        for metric in ("decode_tokens_per_s", "ttft_ms_p50", "tpot_ms_p50"):
            m = stored[name]["metrics"][speed.metric_name(metric, batch)]
            assert m["samples"] and len(m["samples"]) == bench.rounds_done
    for name in figs:
        if name not in (speed.OFF_ID, speed.HF_ID):
            ratios = stored[name]["metrics"][speed.metric_name("speedup_vs_off", batch)]["samples"]
            assert len(ratios) == bench.rounds_done and all(r > 0 for r in ratios)
    assert speed.metric_name("speedup_vs_hf_generate", batch) in stored[speed.OFF_ID]["metrics"]

    # --- projection physics, priced from the measured trace
    n_layers = shape.n_layers
    off = projected[speed.OFF_ID]
    for p in PROFILES:
        prof = get_profile(p)
        if batch == 1:  # batch-1 decode never beats bandwidth / bytes per token
            ceiling = prof.hbm_gbs * 1e9 / bytes_per_token(shape, 2)
            assert off[f"projected_tokens_per_s_{p}"] <= ceiling
        for name, proj in projected.items():
            trace = figs[name].get("trace_blocks_per_step")
            if trace is None or name == speed.OFF_ID or trace["value"] >= n_layers:
                continue
            skipped_share = 1 - trace["value"] / n_layers
            freed = proj[f"projected_freed_fraction_{p}"]
            # pruning lowers busy time, never by more than the share of blocks it skipped
            # (the LM head still runs, a bypassed block still writes its K/V)
            assert proj[f"projected_busy_ms_per_token_{p}"] < off[f"projected_busy_ms_per_token_{p}"]
            assert 0 < freed < skipped_share + 1e-9
    for proj in projected.values():
        tps = [proj[f"projected_tokens_per_s_{p}"] for p in ("V100", "A100", "H100")]
        assert tps == sorted(tps), f"projected V100 <= A100 <= H100 fails: {tps}"

    # --- portable speed budgets: ratios of this run, judged on any machine (suites/budgets.toml)
    if batch == 1:
        failures = _speed_budget_failures(stored, benches.specs)
        assert not failures, "over a portable speed budget:\n  " + "\n  ".join(failures)


# What each reference row always records at batch 1: a bound on one of these that the row
# lacks is a failure, not a skip (a budget that is never applied judges nothing).
_SPEED_MEASURED = {"off": ("roofline_fraction", "speedup_vs_hf_generate"), "lossy": ("speedup_over_ideal",),
                   "lossless": ("speedup_vs_off",)}


def _speed_budget_failures(stored: dict, specs: dict) -> list[str]:
    from rsp_bench.baselines import metric_scope
    from rsp_bench.budgets import budget_for, check_budget, load_budgets
    from rsp_bench.quality import MetricValue

    budgets = load_budgets(Path(__file__).with_name("budgets.toml"))
    failures = []
    for config_id, spec in specs.items():
        bounds = [b for b in budget_for(budgets, spec) or () if metric_scope(b.metric) == "machine"]
        if not bounds or config_id not in stored:
            continue
        values = {name: MetricValue(m["value"], m["n"], tuple(m["ci"]) if m.get("ci") else None, m["unit"])
                  for name, m in stored[config_id]["metrics"].items()}
        measured = _SPEED_MEASURED.get(spec.mode, ()) if spec.engine == "reference" else None
        failures += [f"{config_id}: {f}" for f in check_budget(values, bounds, measured=measured)]
    return failures


# --------------------------------------------------------------------------- measured GPU

# A Llama-shaped model of about 1.1 B parameters (the TinyLlama-1.1B shape), random weights:
# large enough for the decode to be bandwidth-bound on a data-centre GPU, unlike the 135M one.
LLAMA_1B = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
                rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=10000.0)
GPU_TOKENS = 64
GPU_ROUNDS = 5


def _cuda_or_skip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False")
    return torch


@pytest.mark.gpu
def test_gpu_decode_measured_beside_projection(rsp_engine, rsp_record):
    """On a CUDA device: model.generate and the engine's own decode math, fp16, batch 1, on the
    embedded model and a ~1.1 B Llama-shaped random model; kernel timeline idle time, NVML,
    CUDA events, and the projection for this device with its error, all into the record.

    The engine proper keeps its tensors on the CPU, so the engine's side runs its model
    functions (``reference_engine.model``) on the device through ``speed.reference_math_call``:
    exactly the eager kernels the projection prices. Pruned on the GPU: a fixed plan that skips
    the blocks the engine's calibration finds least harmful (identity bypass), to measure busy
    time freed against the projection's.
    """
    torch = _cuda_or_skip()
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    from reference_engine.model import weights_from_hf

    dev, dtype = "cuda", torch.float16
    prompt_ids = rsp_engine.encode(speed.fixed_prompts(1)[0])
    context = len(prompt_ids) + GPU_TOKENS // 2
    reports: dict[str, dict] = {}

    def measure(label: str, hf_model, weights, suffix: str, plan=None) -> None:
        shape = speed.ModelShape.from_hf_config(hf_model.config)
        vocab = hf_model.config.vocab_size  # the random model has its own, smaller vocabulary
        ids, pad = [[t % vocab for t in prompt_ids]], rsp_engine.pad_id % vocab
        hf_call = speed.hf_generate_call(hf_model, ids, GPU_TOKENS, pad, None, dev, fixed_length=True)
        reports[f"hf-generate/{label}"] = speed.gpu_decode_report(
            hf_call, shape, "fp16", context, GPU_ROUNDS)
        ref_call = speed.reference_math_call(weights, ids, GPU_TOKENS, pad, dev)
        reports[f"reference/{label}"] = speed.gpu_decode_report(
            ref_call, shape, "fp16", context, GPU_ROUNDS)
        if plan is not None:
            pruned_call = speed.reference_math_call(weights, ids, GPU_TOKENS, pad, dev, keep=plan)
            reports[f"reference-static/{label}"] = speed.gpu_decode_report(
                pruned_call, shape, "fp16", context, GPU_ROUNDS, executed_blocks=float(sum(plan)))
        for cid, key in ((speed.HF_ID, f"hf-generate/{label}"), (speed.OFF_ID, f"reference/{label}")):
            _record_gpu(rsp_record, cid, reports[key], suffix)

    # the embedded model, on the device in fp16
    small = copy.deepcopy(rsp_engine.hf_model).to(device=dev, dtype=dtype).eval()
    n = rsp_engine.dims.n_layers
    impact = list(rsp_engine.calibration().impact)
    skip = sorted(sorted(range(1, n - 1), key=lambda i: impact[i])[: n // 5])
    plan = [i not in skip for i in range(n)]
    measure("embedded", small, speed.weights_to(weights_from_hf(small), dev, dtype), "_gpu", plan)
    del small
    torch.cuda.empty_cache()

    # a larger Llama-shaped random model, built on the device
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev):
            big = LlamaForCausalLM(LlamaConfig(**LLAMA_1B)).eval()
    finally:
        torch.set_default_dtype(prev)
    measure("llama-1b-random", big, speed.weights_to(weights_from_hf(big), dev, dtype), "_gpu_llama1b")
    del big
    torch.cuda.empty_cache()

    off, pruned = reports["reference/embedded"], reports["reference-static/embedded"]
    rsp_record.set_extra("gpu_throughput", {k: _jsonable(v) for k, v in reports.items()})
    if "projected_tokens_per_s" in off:
        measured_speedup = pruned["measured_decode_tokens_per_s"] / off["measured_decode_tokens_per_s"]
        projected_speedup = pruned["projected_tokens_per_s"] / off["projected_tokens_per_s"]
        rsp_record.add_metric(speed.OFF_ID, "gpu_static_skip_speedup_measured", measured_speedup,
                              GPU_ROUNDS, unit="x", engine="reference", mode="off")
        rsp_record.add_metric(speed.OFF_ID, "gpu_static_skip_speedup_projected", projected_speedup,
                              1, unit="x, projected", engine="reference", mode="off")
    for key, r in reports.items():
        assert r["measured_decode_tokens_per_s"] > 0, key
        assert 0 <= r["measured_idle_fraction"] <= 1, key


def _jsonable(report: dict) -> dict:
    return {k: v for k, v in report.items() if isinstance(v, (int, float, str, list, dict, type(None)))}


def _record_gpu(rsp_record, config_id: str, r: dict, suffix: str) -> None:
    engine, mode = config_id.split("/")[:2]
    add = lambda name, value, n, unit: rsp_record.add_metric(  # noqa: E731
        config_id, name + suffix, value, n, unit=unit, engine=engine, mode=mode)
    add("measured_decode_tokens_per_s", r["measured_decode_tokens_per_s"], GPU_ROUNDS, "tokens/s")
    add("measured_idle_fraction", r["measured_idle_fraction"], 1, "fraction")
    add("measured_kernels_per_step", r["measured_kernels_per_step"], 1, "kernels")
    util = r["nvml"].get("mean_gpu_util_pct")
    if util is not None:
        add("nvml_gpu_util_pct", util, r["nvml"]["samples"], "%")
    if "projected_tokens_per_s" in r and math.isfinite(r["projection_error_tokens_per_s"]):
        add(f"projected_tokens_per_s_{r['profile']}", r["projected_tokens_per_s"], 1, "tokens/s, projected")
        add(f"projected_idle_fraction_{r['profile']}", r["projected_idle_fraction"], 1, "fraction, projected")
        add("projection_error_tokens_per_s", r["projection_error_tokens_per_s"], GPU_ROUNDS, "fraction")
