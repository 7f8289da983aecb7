"""Figures for run records and tables from an interleaved bench: per-call latency and throughput,
speed-ups against pruning off and ``model.generate``, blocks per token, router cost, ideal
speed-up from bytes not read and measured / ideal, achieved bandwidth and its roofline fraction,
and the projected GPU figures of the same execution trace.

Must NOT import the reference engine, transformers or pytest (engines are duck-typed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics import achieved_bandwidth_gbs, blocks_executed_per_token
from rsp_bench.profiles import PROFILES, get_profile
from rsp_bench.projection import ModelShape, bytes_per_token, cpu_ideal_speedup, project_decode
from rsp_bench.speed.interleaved import InterleavedBench
from rsp_bench.speed.roofline import Roofline

# Config ids the speed figures are filed under (rsp_bench.records.parse_config_id reads them).
OFF_ID = "reference/off"
HF_ID = "hf-generate/off"

# Context length (cached positions) projections are priced at. Fixed rather than taken from
# the measured run, so a projected figure depends on the execution trace alone and a quick run
# and a full run project the same machine the same way (the gate compares them).
PROJECTION_CONTEXT = 512


def model_shape(engine: Any) -> ModelShape:
    """The projection's ModelShape of an engine's model (from its Hugging Face config)."""
    cfg = getattr(getattr(engine, "hf_model", None), "config", None)
    if cfg is None:
        raise HarnessInputError(f"{type(engine).__name__} has no hf_model.config to read a shape from")
    return ModelShape.from_hf_config(cfg)


def engine_bypass(engine: Any) -> tuple[str, int]:
    """(bypass_kind, bypass_rank) to price the engine's bypassed blocks with.

    The engine uses a rank-r linear map on blocks where calibration found it better than the
    identity, the identity elsewhere; a projection takes one kind, so the majority's is used
    (on the embedded model the linear map wins on almost every block).
    """
    cal_fn = getattr(engine, "calibration", None)
    if cal_fn is None:
        return "identity", 0
    cal = cal_fn()
    use = list(getattr(cal, "use_linear", []))
    rank = int(getattr(cal, "bypass_rank", 0) or 0)
    if rank >= 1 and use and sum(use) * 2 >= len(use):
        return "linear", rank
    return "identity", 0


def _stats_list(stats: Mapping | Sequence[Mapping]) -> list[Mapping]:
    items = [stats] if isinstance(stats, Mapping) else list(stats)
    if not items:
        raise HarnessInputError("no engine stats given")
    for i, s in enumerate(items):
        if not isinstance(s, Mapping):
            raise HarnessInputError(f"stats[{i}] is {type(s).__name__}, not an engine stats dict")
    return items


def _need(s: Mapping, key: str) -> Any:
    if key not in s:
        raise HarnessInputError(f"engine stats lack {key!r}; keys present: {sorted(s)}")
    return s[key]


def mean_executed_blocks(stats: Mapping | Sequence[Mapping]) -> float:
    """Blocks executed per decode step, pooled over every step of the given stats."""
    trace = [int(x) for s in _stats_list(stats) for x in _need(s, "executed_blocks_per_step")]
    if not trace:
        raise HarnessInputError("the execution trace is empty (no decode step ran)")
    return sum(trace) / len(trace)


def router_cost_per_token(stats: Mapping | Sequence[Mapping]) -> dict[str, float]:
    """The router's cost per decode step (= per token of each sequence), pooled over calls.

    ms_per_token = 1000 x router time / decode steps; step_share = router time / the sum of the
    step times (which contain the router's plan and update). The reference engine's
    ``router_time_s`` is the per-token plan and update only; its once-per-request setup
    (degradation checks, router construction) is reported apart as ``router_setup_time_s``.
    """
    items = _stats_list(stats)
    router = sum(float(_need(s, "router_time_s")) for s in items)
    steps = sum(len(_need(s, "decode_step_times_s")) for s in items)
    decode = sum(float(t) for s in items for t in s["decode_step_times_s"])
    if steps == 0 or decode <= 0:
        raise HarnessInputError("no decode step in the stats: the router cost per token is undefined")
    return {"ms_per_token": 1000.0 * router / steps, "step_share": router / decode,
            "steps": float(steps)}


def ideal_speedup_from_trace(engine: Any, stats: Mapping | Sequence[Mapping]) -> float:
    """The speed-up a purely bandwidth-bound decode would get from the weight bytes the
    bypassed blocks did not read: ``projection.cpu_ideal_speedup`` at the trace's mean
    executed blocks, fp32, with the engine's bypass kind."""
    kind, rank = engine_bypass(engine)
    return cpu_ideal_speedup(model_shape(engine), mean_executed_blocks(stats), 4, kind, rank)


def measured_over_ideal(measured_speedup: float, ideal_speedup: float) -> float:
    """measured / ideal speed-up: 1 when pruning saves exactly the time its skipped bytes
    imply, below 1 when router and bypass overheads eat into it."""
    for name, v in (("measured_speedup", measured_speedup), ("ideal_speedup", ideal_speedup)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise HarnessInputError(f"{name} must be a positive finite number, got {v!r}")
    return measured_speedup / ideal_speedup



def metric_name(base: str, batch: int) -> str:
    """Batch 1 keeps the metric's plain name (the gated headline); other batches get _b<N>."""
    return base if batch == 1 else f"{base}_b{batch}"


def _m(value: float, n: int, unit: str, ci: Sequence[float] | None = None,
       samples: Sequence[float] | None = None) -> dict[str, Any]:
    return {"value": float(value), "n": int(n), "ci": list(ci) if ci is not None else None,
            "unit": unit, "samples": [float(s) for s in samples] if samples is not None else None}


def bench_figures(bench: InterleavedBench, engine: Any = None, roofline: Roofline | None = None,
                  base: str = OFF_ID, hf: str | None = HF_ID,
                  bypass: tuple[str, int] | None = None) -> dict[str, dict[str, dict]]:
    """Every measured figure of one interleaved bench, by call name then metric name (plain
    names; the caller adds the batch suffix). Each figure: value, n, ci, unit, samples.

    Speed-ups are against ``base``; names whose calls carry engine stats also get blocks per
    token, router cost (when the router ran) and, beside their speed-up, the ideal speed-up and
    measured / ideal; with an engine, achieved bandwidth, and with a ``roofline`` its fraction.
    ``bypass``: (kind, rank) to price bypassed blocks with; default ``engine_bypass(engine)``.
    """
    out: dict[str, dict[str, dict]] = {}
    shape = model_shape(engine) if engine is not None else None
    if bypass is not None:
        kind, rank = bypass
    else:
        kind, rank = engine_bypass(engine) if engine is not None else ("identity", 0)
    for name in bench.names:
        s = bench.summary(name)
        calls = bench.samples(name)
        figs: dict[str, dict] = {
            "ttft_ms_p50": _m(s["ttft_ms_p50"], s["calls"], "ms", samples=s["ttft_ms"]),
            "ttft_ms_p90": _m(s["ttft_ms_p90"], s["calls"], "ms"),
            "tpot_ms_p50": _m(s["tpot_ms_p50"], s["steps"], "ms", samples=s["tpot_ms"]),
            "tpot_ms_p90": _m(s["tpot_ms_p90"], s["steps"], "ms"),
            "decode_tokens_per_s": _m(s["decode_tokens_per_s"], s["steps"], "tokens/s",
                                      samples=s["tokens_per_s"]),
        }
        # model.generate gets no speedup_vs_off: it is the inverse of the engine's own
        # speedup_vs_hf_generate, and gated as "higher is better" it would flag a faster engine.
        if name not in (base, hf) and base in bench.by_round:
            sp = bench.speedup(base, name)
            figs["speedup_vs_off"] = _m(sp["ratio"], sp["pairs"], "x", (sp["lo"], sp["hi"]),
                                        sp["ratios"])
        if hf is not None and name == base and hf in bench.by_round:
            sp = bench.speedup(hf, base)  # engine off over model.generate
            figs["speedup_vs_hf_generate"] = _m(sp["ratio"], sp["pairs"], "x",
                                                (sp["lo"], sp["hi"]), sp["ratios"])
        stats = [c.stats for c in calls
                 if c.stats is not None and "executed_blocks_per_step" in c.stats]
        counts = [rc for c in calls for rc in (c.bypass_counts or [])]
        if counts and all(c.bypass_counts for c in calls):
            figs["blocks_executed_per_token"] = _m(
                blocks_executed_per_token(sum(b for b, _, _ in counts), counts[0][2],
                                          sum(t for _, t, _ in counts)),
                sum(t for _, t, _ in counts), "blocks")
        # Blocks a decode step ran: the execution trace when there is one, else the engine's
        # bypass counts, else (model.generate, an engine without stats) all of them.
        if stats:
            blocks = mean_executed_blocks(stats)
        elif "blocks_executed_per_token" in figs:
            blocks = figs["blocks_executed_per_token"]["value"]
        else:
            blocks = shape.n_layers if shape else None
        if stats:
            # The trace counts decode steps only (the first token comes from the full prefill):
            # that is what a decode step costs, so the projection and ideal speed-up use it.
            figs["trace_blocks_per_step"] = _m(blocks, sum(len(x["executed_blocks_per_step"])
                                                           for x in stats), "blocks")
            if any(float(x.get("router_time_s", 0.0)) > 0 for x in stats):
                rc = router_cost_per_token(stats)
                figs["router_ms_per_token"] = _m(rc["ms_per_token"], int(rc["steps"]), "ms")
                figs["router_step_share"] = _m(rc["step_share"], int(rc["steps"]), "fraction")
            # Pruning's ideal speed-up, so not for another pruning-off call (e.g. the same engine on
            # another decode kernel): its speed-up is the kernel's, with nothing skipped to price.
            pruning_off = all(x.get("mode") == "off" for x in stats)
            if shape is not None and name != base and "speedup_vs_off" in figs and not pruning_off:
                ideal = cpu_ideal_speedup(shape, blocks, 4, kind, rank)
                figs["ideal_speedup"] = _m(ideal, len(stats), "x")
                sp_off = figs["speedup_vs_off"]
                # the interval of the measured ratio, scaled: the portable budget judges it whole
                figs["speedup_over_ideal"] = _m(
                    measured_over_ideal(sp_off["value"], ideal), sp_off["n"], "x",
                    (measured_over_ideal(sp_off["ci"][0], ideal), measured_over_ideal(sp_off["ci"][1], ideal))
                    if sp_off.get("ci") else None)
        # An engine that stores its weights in another format (a llama.cpp quantized rung) says
        # how many weight bytes a decode step reads; the fp32 shape would overstate its bandwidth
        # by up to 7x.
        own_bytes = {c.stats.get("weight_bytes_per_token") for c in calls if c.stats}
        if shape is not None and blocks is not None:
            steps_per_s = 1.0 / (s["tpot_ms_p50"] / 1000.0)
            if len(own_bytes) == 1 and None not in own_bytes:
                bpt = float(own_bytes.pop())
            else:
                bpt = bytes_per_token(shape, 4, blocks, kind, rank)
            gbs = achieved_bandwidth_gbs(bpt, steps_per_s)
            figs["achieved_bandwidth_gbs"] = _m(gbs, s["steps"], "GB/s")
            if roofline is not None:
                figs["roofline_fraction"] = _m(gbs / roofline.gbs, s["steps"], "fraction")
        out[name] = figs
    if roofline is not None and base in out:
        out[base]["roofline_tokens_per_s"] = _m(roofline.tokens_per_s, roofline.iterations,
                                                "tokens/s", samples=[1.0 / t for t in roofline.samples_s])
        out[base]["roofline_gbs"] = _m(roofline.gbs, roofline.iterations, "GB/s")
        if roofline.torch_gemv_gbs is not None:
            # The old roofline: torch's own GEMV speed, not the machine's. Kept under its own name
            # (matched by the baselines' "roofline_*" pattern) so records before and after compare.
            out[base]["roofline_torch_gemv_gbs"] = _m(roofline.torch_gemv_gbs, roofline.iterations, "GB/s")
    return out


def projected_figures(shape: ModelShape, executed_blocks: float | None, batch: int = 1,
                      context: int = PROJECTION_CONTEXT, dtype: str = "fp16",
                      bypass_kind: str = "identity", bypass_rank: int = 0,
                      router_host_us_per_step: float = 0.0,
                      profiles: Sequence[str] = tuple(PROFILES)) -> dict[str, dict[str, float]]:
    """Projected tokens/s, idle fraction and GPU time freed, per profile, of a decode that ran
    ``executed_blocks`` blocks per token (None: all, the unpruned engine).

    ``router_host_us_per_step``: the router's measured host time per decode step, spread over
    the blocks, so the pruned projection pays for the router as the measured run did.
    Keys: ``projected_tokens_per_s_<P>``, ``projected_idle_fraction_<P>``,
    ``projected_freed_fraction_<P>`` (freed = 1 - busy / unpruned busy; 0 when unpruned).
    """
    out: dict[str, float] = {}
    for p in profiles:
        prof = get_profile(p)
        off = project_decode(shape, prof, dtype, batch, context)
        if executed_blocks is None:
            proj, freed = off, 0.0
        else:
            proj = project_decode(shape, prof, dtype, batch, context, executed_blocks, bypass_kind,
                                  bypass_rank,
                                  router_host_us_per_block=router_host_us_per_step / shape.n_layers)
            freed = 1.0 - proj.busy_ms_per_token / off.busy_ms_per_token
        out[f"projected_tokens_per_s_{prof.name}"] = proj.tokens_per_s
        out[f"projected_idle_fraction_{prof.name}"] = proj.idle_fraction
        out[f"projected_freed_fraction_{prof.name}"] = freed
        out[f"projected_busy_ms_per_token_{prof.name}"] = proj.busy_ms_per_token
    return out
