"""Measured GPU decode with the projection for the same device beside it.

Must NOT import the reference engine or pytest; torch and the NVML helpers are imported on call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics import speed_summary
from rsp_bench.profiles import normalize_dtype
from rsp_bench.projection import ModelShape, project_decode
from rsp_bench.speed.interleaved import CallTiming

def gpu_decode_report(call: Callable[[], CallTiming], shape: ModelShape, dtype: str,
                      context: int, rounds: int = 5, executed_blocks: float | None = None,
                      bypass_kind: str = "identity", bypass_rank: int = 0,
                      device_index: int = 0) -> dict[str, Any]:
    """Measure a CUDA decode call and put the projection for this device beside it.

    One warm-up call, then ``rounds`` calls timed by their own step clock and by CUDA events
    (whole call), under NVML sampling (when nvidia-ml-py is installed; else the reason is
    reported), then one call under ``torch.profiler`` for the kernel timeline: idle time over
    the kernels' span (HTA definition, ``gpu_timeline.profiler_idle_time``) and kernels per
    decode step. The projection (``profiles.match_device_name``) is priced at ``context``;
    its error = (projected - measured) / measured. Every figure is measured unless its key
    says projected.
    """
    import torch

    from rsp_bench.gpu_timeline import (NvmlSampler, cuda_event_timer, profiler_idle_time,
                                        kernel_intervals_from_profiler, projection_error)
    from rsp_bench.profiles import match_device_name

    if not torch.cuda.is_available():
        raise HarnessInputError("gpu_decode_report needs a CUDA device; none is available")
    name = torch.cuda.get_device_name(device_index)
    call()  # warm-up: cuBLAS handles, allocator, kernels' first launch
    timings: list[CallTiming] = []
    event_ms: list[float] = []
    sampler: NvmlSampler | None = NvmlSampler(device_index=device_index, interval_ms=20)
    nvml_error = None
    try:
        sampler.__enter__()
    except HarnessInputError as exc:  # nvidia-ml-py missing or NVML unusable: say so, don't fake
        sampler, nvml_error = None, str(exc)
    try:
        for _ in range(rounds):
            with cuda_event_timer() as ev:
                timings.append(call())
            event_ms.append(ev.elapsed_ms)
    finally:
        if sampler is not None:
            sampler.__exit__(None, None, None)
    nvml = sampler.summary() if sampler is not None else {"samples": 0, "error": nvml_error}
    steps = [t for c in timings for t in c.step_times_s]
    batch = timings[0].batch
    summary = speed_summary([c.ttft_s for c in timings], [t / batch for t in steps])
    measured_tps = summary["decode_tokens_per_s"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        profiled = call()
    idle = profiler_idle_time(prof)
    n_kernels = len(kernel_intervals_from_profiler(prof))
    report: dict[str, Any] = {
        "device": name,
        "dtype": normalize_dtype(dtype),
        "batch": batch,
        "context": context,
        "method": timings[0].method,
        "measured_decode_tokens_per_s": measured_tps,
        "measured_tpot_ms_p50": summary["tpot_ms_p50"] * batch,
        "measured_ttft_ms_p50": summary["ttft_ms_p50"],
        "measured_call_ms_cuda_events": event_ms,
        "measured_idle_fraction": idle.idle_fraction,
        "measured_idle": idle.to_dict(),
        # kernels per forward pass, the prefill counted as one pass
        "measured_kernels_per_step": n_kernels / (profiled.steps + 1),
        "nvml": nvml,
    }
    profile = match_device_name(name)
    if profile is None:
        report["projection"] = None
        report["projection_note"] = f"no hardware profile matches {name!r}: no projection error"
        return report
    proj = project_decode(shape, profile, dtype, batch, context, executed_blocks, bypass_kind,
                          bypass_rank)
    report.update(
        profile=profile.name,
        projected_tokens_per_s=proj.tokens_per_s,
        projected_idle_fraction=proj.idle_fraction,
        projected_kernels_per_step=proj.kernels_per_step,
        projected_busy_ms_per_token=proj.busy_ms_per_token,
        projection_error_tokens_per_s=projection_error(proj.tokens_per_s, measured_tps),
    )
    return report
