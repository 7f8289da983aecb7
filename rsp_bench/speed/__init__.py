"""Measured speed: interleaved decode benchmarks, the bandwidth roofline of this machine, the
router's cost, measured against ideal speed-up, and the `rsp-bench project` / `bench` commands.

A package, one module per concept: ``interleaved`` (CallTiming, InterleavedBench), ``calls``
(adapters that time a generator), ``roofline`` (this machine's bandwidth ceiling), ``figures``
(run-record figures and projections), ``gpu`` (measured GPU decode), ``commands`` (the CLI).
Everything is re-exported here, so ``from rsp_bench import speed; speed.X`` keeps working.

What it measures and how (DESIGN.md sections 3 and 5):

- **Interleaved runner** (``InterleavedBench``): named callables, each generating one fixed
  prompt set at one batch size, run in rounds A B C, B C A, C A B ... (the order rotates each
  round so that no engine always runs first, or always right after the same neighbour, and slow
  drift of the machine cancels). Warm-up calls are run and thrown away. Every call returns a
  ``CallTiming``: time to first token and one time per decode step.
- **Where the times come from.** The reference engine times itself: TTFT = its
  ``prefill_time_s`` (prefill, protective-degradation checks and router setup: everything
  before the first token exists), and one decode step time per generated token after the first
  (``decode_step_times_s``: router plan + block compute + router update). ``model.generate`` is
  timed from outside with a streamer (``StepClock``): ``generate`` hands the streamer the prompt,
  then each new token as soon as it is sampled (on the host, so the device has finished it);
  TTFT = call start to the first generated token, a decode step = the gap between two tokens.
  The token ids are encoded once, outside the timed region, for both.
- **Decode rate.** One decode step yields one token for each sequence of the batch, so the
  time per output token a user sees (TPOT) is the step time, and the batch's throughput is batch
  / step time. ``speed_summary`` is applied twice: to step times (latency figures) and to step
  time / batch (``decode_tokens_per_s``: aggregate tokens/s; per-sequence at batch 1).
- **Speed-up** of B over A: ``metrics.interleaved_speedup`` of per-round pairs (A's call,
  B's call of the same round), each call summarised by its median decode step time, so the
  ratio is of neighbours, never of two runs.
- **Bandwidth roofline** (``roofline.bandwidth_roofline``): the machine's bandwidth from the
  fastest of three bandwidth-bound kernels timed alone: a STREAM-style read over a buffer larger
  than the last-level cache, and the model's own per-token matrix-vector products (4 per block:
  fused qkv, o, fused gate/up, down; plus the LM head) with numpy (OpenBLAS) and with torch
  (MKL). The ceiling is that bandwidth over the bytes per token; torch's own GEMV speed, which
  alone was the roofline before, is kept as ``torch_gemv_*``, named for what it is.
  Achieved bandwidth = weight bytes per decode step (``projection.bytes_per_token`` at the
  executed blocks, fp32) x decode steps per second, as gpt-fast prints it.
- **Router cost**, **ideal speed-up** (``projection.cpu_ideal_speedup`` from the engine's
  execution trace) and measured / ideal: see their functions.

Must NOT import the reference engine, transformers or pytest at module level: the runner works
with any callable, and the CLI's ``project --executed-blocks`` must not load a model. They are
imported inside the functions that need them.
"""

from __future__ import annotations

from rsp_bench.speed.calls import (adapter_call, engine_call, fixed_prompts, hf_generate_call,
                                   make_step_clock, prompts_for_batch, reference_math_call, weights_to)
from rsp_bench.speed.commands import (_main, configure_bench_parser, configure_project_parser,
                                      run_bench, run_project)
from rsp_bench.speed.figures import (HF_ID, OFF_ID, PROJECTION_CONTEXT, bench_figures, engine_bypass,
                                     ideal_speedup_from_trace, mean_executed_blocks, measured_over_ideal,
                                     metric_name, model_shape, projected_figures, router_cost_per_token)
from rsp_bench.speed.gpu import gpu_decode_report
from rsp_bench.speed.interleaved import CallTiming, InterleavedBench, rotated_order
from rsp_bench.speed.roofline import Roofline, bandwidth_roofline
from rsp_bench.projection import ModelShape

__all__ = [
    "CallTiming", "rotated_order", "InterleavedBench", "make_step_clock", "weights_to",
    "engine_call", "adapter_call", "hf_generate_call", "reference_math_call", "fixed_prompts", "prompts_for_batch",
    "Roofline", "bandwidth_roofline", "router_cost_per_token", "mean_executed_blocks",
    "engine_bypass", "model_shape", "ideal_speedup_from_trace", "measured_over_ideal",
    "metric_name", "bench_figures", "projected_figures", "gpu_decode_report",
    "configure_project_parser", "run_project", "configure_bench_parser", "run_bench",
    "PROJECTION_CONTEXT", "OFF_ID", "HF_ID",
]

