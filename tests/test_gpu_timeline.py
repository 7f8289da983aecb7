"""GPU timeline analysis: interval union, idle time, profiler parsing, NVML sampling.

Synthetic cases run everywhere; the measured-timeline test needs a CUDA device and is
skipped without one.
"""

import sys
import time
from types import SimpleNamespace

import pytest
import torch

from rsp_bench.errors import HarnessInputError
from rsp_bench.gpu_timeline import (
    NvmlSampler,
    cuda_event_timer,
    idle_time,
    kernel_intervals_from_profiler,
    merge_intervals,
    profiler_idle_time,
    projection_error,
)


def test_merge_overlapping_nested_disjoint_and_touching():
    assert merge_intervals([(5, 15), (0, 10)]) == [(0, 15)]  # overlapping, unsorted
    assert merge_intervals([(0, 30), (5, 10), (12, 20)]) == [(0, 30)]  # nested
    assert merge_intervals([(20, 30), (0, 10)]) == [(0, 10), (20, 30)]  # disjoint
    assert merge_intervals([(0, 10), (10, 12)]) == [(0, 12)]  # touching
    assert merge_intervals([]) == []
    with pytest.raises(HarnessInputError, match=r"\(5, 1\)"):
        merge_intervals([(5, 1)])


def test_idle_time_by_hand():
    kernels = [(0, 10), (5, 15), (20, 30), (22, 25)]  # union: [0,15] + [20,30] = 25 us
    r = idle_time(kernels)
    assert (r.span_us, r.busy_us, r.idle_us) == (30, 25, 5)
    assert r.idle_fraction == pytest.approx(5 / 30)

    r = idle_time(kernels, span=(-10, 40))  # a longer step: 25 busy out of 50
    assert (r.span_us, r.busy_us, r.idle_us, r.idle_fraction) == (50, 25, 25, 0.5)

    r = idle_time(kernels, span=(10, 25))  # kernel time outside the span is not counted
    assert (r.busy_us, r.idle_us) == (10, 5)

    assert idle_time([], span=(0, 8)).idle_fraction == 1.0
    with pytest.raises(HarnessInputError, match="no kernel"):
        idle_time([])


def _fe(device, start, end, activity="kernel"):
    return SimpleNamespace(device_type=SimpleNamespace(name=device), activity_type=activity,
                           time_range=SimpleNamespace(start=start, end=end))


def test_intervals_from_parsed_profiler_events():
    events = [_fe("CPU", 0, 100), _fe("CUDA", 10, 20), _fe("CUDA", 30, 35, "gpu_memcpy"),
              _fe("CUDA", 0, 100, "gpu_user_annotation")]  # an annotation is not GPU work
    prof = SimpleNamespace(events=lambda: events)
    assert kernel_intervals_from_profiler(prof) == [(10, 20), (30, 35)]
    assert profiler_idle_time(prof).idle_us == 10


def test_intervals_fall_back_to_kineto_results():
    class KinetoEvent:
        def __init__(self, device, s, e):
            self.d, self.s, self.e = device, s, e

        def device_type(self):
            return SimpleNamespace(name=self.d)

        def activity_type(self):
            return "kernel"

        def start_ns(self):
            return self.s

        def end_ns(self):
            return self.e

    def broken():
        raise RuntimeError("profiler not stopped")

    results = SimpleNamespace(events=lambda: [KinetoEvent("CUDA", 1000, 3000),
                                              KinetoEvent("CPU", 0, 9000)])
    prof = SimpleNamespace(events=broken, profiler=SimpleNamespace(kineto_results=results))
    assert kernel_intervals_from_profiler(prof) == [(1.0, 3.0)]


def test_profiler_without_cuda_events_is_a_clear_error():
    prof = SimpleNamespace(events=lambda: [_fe("CPU", 0, 1)])
    with pytest.raises(HarnessInputError, match="ProfilerActivity.CUDA"):
        kernel_intervals_from_profiler(prof)


class _FakeNvml:
    NVML_TEMPERATURE_GPU = 0

    def __init__(self):
        self.util = iter(range(0, 10_000, 10))

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=min(next(self.util), 100), memory=5)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=512 * 2**20)

    def nvmlDeviceGetTemperature(self, h, kind):
        return 40


def test_nvml_sampler_with_a_fake_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    with NvmlSampler(interval_ms=1) as s:
        time.sleep(0.02)
    summary = s.summary()
    assert summary["samples"] >= 2
    assert summary["max_mem_used_mb"] == 512
    assert 0 <= summary["mean_gpu_util_pct"] <= summary["max_gpu_util_pct"] <= 100


def test_nvml_sampler_without_nvidia_ml_py_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(HarnessInputError, match="nvidia-ml-py"):
        with NvmlSampler():
            pass


def test_projection_error():
    assert projection_error(110, 100) == pytest.approx(0.10)
    assert projection_error(85, 100) == pytest.approx(-0.15)
    with pytest.raises(HarnessInputError, match="0"):
        projection_error(1, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error path")
def test_cuda_event_timer_without_cuda_is_a_clear_error():
    with pytest.raises(HarnessInputError, match="CUDA"):
        with cuda_event_timer():
            pass


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: measured GPU timeline needs one")
def test_measured_timeline_of_a_few_matmuls():
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    for _ in range(3):  # warm up cuBLAS outside the trace
        a @ a
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with cuda_event_timer() as t:
            for _ in range(8):
                b = a @ a
                b.sum()
        torch.cuda.synchronize()
    intervals = kernel_intervals_from_profiler(prof)
    assert len(intervals) >= 8
    report = idle_time(intervals)
    assert 0 <= report.idle_fraction <= 1
    assert report.busy_us > 0
    assert t.elapsed_ms > 0
