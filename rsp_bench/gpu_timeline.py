"""Measured GPU analysis: kernel timelines, GPU idle time, NVML sampling, CUDA-event timing,
and the error of a projection against a measurement.

One definition each:
- idle time (Holistic Trace Analysis): the span of the trace minus the union of the
  intervals in which the GPU runs a kernel, a memcpy or a memset (HTA counts memory
  kernels as non-idle too); the span defaults to first kernel start .. last kernel end;
- projection error: (projected - measured) / measured, signed, so +0.10 means the
  projection promised 10% more than was measured.

Must NOT import the engine or ``rsp_bench.projection`` (measurement stays independent of
the model it checks). torch and pynvml are imported lazily inside the functions that need
a device, so this module imports on a CPU-only machine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from rsp_bench.errors import HarnessInputError

Interval = tuple[float, float]

# Kineto activity types that occupy the GPU. Others that kineto also files under the CUDA
# device (gpu_user_annotation ranges from record_function) would cover the gaps between
# kernels and hide idle time.
_BUSY_ACTIVITIES = {"kernel", "gpu_memcpy", "gpu_memset", "concurrent kernel"}


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of intervals as sorted, disjoint (start, end) pairs.

    Touching intervals are merged; an interval with end < start is a HarnessInputError.
    """
    items = []
    for start, end in intervals:
        if end < start:
            raise HarnessInputError(f"interval ({start}, {end}) ends before it starts")
        items.append((float(start), float(end)))
    items.sort()
    merged: list[list[float]] = []
    for start, end in items:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


@dataclass(frozen=True)
class IdleReport:
    """Measured GPU idle time over a span, in microseconds."""

    span_us: float
    busy_us: float
    idle_us: float
    idle_fraction: float

    def to_dict(self) -> dict:
        return asdict(self)


def idle_time(kernel_intervals: Iterable[Interval],
              span: Interval | None = None) -> IdleReport:
    """GPU idle time: span minus the union of kernel intervals (HTA's definition).

    ``span`` (start_us, end_us) defaults to the first kernel start .. last kernel end;
    kernel time outside a given span is not counted. No kernels at all over a given span
    means fully idle; with no span and no kernels there is nothing to measure, which is a
    HarnessInputError.
    """
    merged = merge_intervals(kernel_intervals)
    if span is None:
        if not merged:
            raise HarnessInputError(
                "idle_time got no kernel intervals and no span: nothing to measure "
                "(did the profiler record CUDA activity?)"
            )
        span = (merged[0][0], max(e for _, e in merged))
    lo, hi = float(span[0]), float(span[1])
    if hi < lo:
        raise HarnessInputError(f"span ({lo}, {hi}) ends before it starts")
    busy = sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in merged)
    length = hi - lo
    idle = length - busy
    return IdleReport(span_us=length, busy_us=busy, idle_us=idle,
                      idle_fraction=idle / length if length > 0 else 0.0)


def _device_name(device_type: object) -> str:
    # DeviceType is a pybind enum (has .name); compare by name so torch need not be imported
    return str(getattr(device_type, "name", device_type)).rsplit(".", 1)[-1].upper()


def _is_busy_activity(activity_type: object) -> bool:
    if activity_type is None:  # older torch: no activity type, keep every device event
        return True
    return str(activity_type).strip().lower() in _BUSY_ACTIVITIES


def _from_function_events(events: Iterable[object]) -> list[Interval]:
    out = []
    for evt in events:
        if _device_name(getattr(evt, "device_type", None)) != "CUDA":
            continue
        if not _is_busy_activity(getattr(evt, "activity_type", None)):
            continue
        tr = evt.time_range
        out.append((float(tr.start), float(tr.end)))
    return out


def _from_kineto_events(events: Iterable[object]) -> list[Interval]:
    out = []
    for evt in events:
        if _device_name(evt.device_type()) != "CUDA":
            continue
        activity = evt.activity_type() if hasattr(evt, "activity_type") else None
        if not _is_busy_activity(activity):
            continue
        out.append((evt.start_ns() / 1000.0, evt.end_ns() / 1000.0))
    return out


def kernel_intervals_from_profiler(prof: object) -> list[Interval]:
    """(start_us, end_us) of every kernel, memcpy and memset a torch profiler recorded.

    Accepts a ``torch.profiler.profile`` (after it stopped) or a
    ``torch.autograd.profiler.profile``. Reads the parsed function events first
    (``prof.events()`` / ``.function_events``: events whose device type is CUDA, their
    ``time_range``), then falls back to the raw kineto results
    (``prof.profiler.kineto_results.events()``). Times are in microseconds on the
    profiler's own clock; only differences between them mean anything.
    """
    errors = []
    try:
        if callable(getattr(prof, "events", None)):
            events = prof.events()
        else:
            events = getattr(prof, "function_events")
        intervals = _from_function_events(events or [])
        if intervals:
            return intervals
        errors.append("parsed events held no CUDA kernel")
    except Exception as exc:  # noqa: BLE001 - any failure here means: try the raw results
        errors.append(f"parsed events unreadable ({type(exc).__name__}: {exc})")
    try:
        inner = getattr(prof, "profiler", None) or prof
        results = getattr(inner, "kineto_results", None)
        if results is None:
            raise AttributeError("no kineto_results")
        intervals = _from_kineto_events(results.events())
        if intervals:
            return intervals
        errors.append("kineto results held no CUDA kernel")
    except Exception as exc:  # noqa: BLE001
        errors.append(f"kineto results unreadable ({type(exc).__name__}: {exc})")
    raise HarnessInputError(
        f"no CUDA kernel intervals in profiler {type(prof).__name__}: {'; '.join(errors)}. "
        "Profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] on a CUDA "
        "device, and read it after the profiler has stopped."
    )


def profiler_idle_time(prof: object, span: Interval | None = None) -> IdleReport:
    """``idle_time`` of the kernels a torch profiler recorded."""
    return idle_time(kernel_intervals_from_profiler(prof), span)


class NvmlSampler:
    """Samples GPU utilisation, memory and temperature through NVML in a thread.

    Use as ``with NvmlSampler(device_index=0, interval_ms=20) as s: ...; s.summary()``.
    NVML's utilisation is the share of its own sample period (1/6 s to 1 s, by card) in
    which any kernel ran: coarse, and blind to how much of the GPU a kernel used. It is
    beside, not instead of, the kernel timeline. Needs the optional package nvidia-ml-py.
    """

    def __init__(self, device_index: int = 0, interval_ms: float = 20.0) -> None:
        if not interval_ms > 0:
            raise HarnessInputError(f"NvmlSampler interval_ms must be > 0, got {interval_ms!r}")
        if isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0:
            raise HarnessInputError(
                f"NvmlSampler device_index must be an integer >= 0, got {device_index!r}")
        self.device_index = device_index
        self.interval_s = interval_ms / 1000.0
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handle = None
        self.error: str | None = None

    def __enter__(self) -> "NvmlSampler":
        try:
            import pynvml  # noqa: PLC0415 - optional dependency, only needed here
        except ImportError as exc:
            raise HarnessInputError(
                "NvmlSampler needs the optional package nvidia-ml-py "
                "(pip install 'rsp-bench[nvidia]'); import pynvml failed: " + str(exc)
            ) from exc
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as exc:  # noqa: BLE001 - NVMLError types vary by version
            raise HarnessInputError(
                f"NVML could not open GPU {self.device_index}: {exc}"
            ) from exc
        self._nvml = pynvml
        self.samples = []
        self._stop.clear()
        self._sample()  # one sample even for a body shorter than the interval
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down is best effort
            pass

    def _sample(self) -> None:
        nv, h = self._nvml, self._handle
        try:
            util = nv.nvmlDeviceGetUtilizationRates(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            temp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        except Exception as exc:  # noqa: BLE001 - keep sampling; report the last error
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self.samples.append({
            "t_s": time.perf_counter(),
            "gpu_util_pct": float(util.gpu),
            "mem_util_pct": float(util.memory),
            "mem_used_mb": mem.used / 2**20,
            "temperature_c": float(temp),
        })

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def summary(self) -> dict:
        """Mean and max of each sampled figure, and the number of samples."""
        if not self.samples:
            return {"samples": 0, "error": self.error}
        out: dict = {"samples": len(self.samples)}
        for key in ("gpu_util_pct", "mem_util_pct", "mem_used_mb", "temperature_c"):
            values = [s[key] for s in self.samples]
            out[f"mean_{key}"] = sum(values) / len(values)
            out[f"max_{key}"] = max(values)
        if self.error:
            out["error"] = self.error
        return out


@dataclass
class EventTiming:
    """Filled in when the ``cuda_event_timer`` block ends: GPU elapsed milliseconds."""

    elapsed_ms: float | None = None


@contextmanager
def cuda_event_timer(stream: object | None = None) -> Iterator[EventTiming]:
    """Time a block on the GPU with CUDA events: ``with cuda_event_timer() as t: ...``,
    then ``t.elapsed_ms``. Records on the current (or given) stream and synchronises on
    the end event, so the figure is GPU time from the first to the last queued work."""
    import torch  # noqa: PLC0415 - lazy: the module must import without CUDA

    if not torch.cuda.is_available():
        raise HarnessInputError("cuda_event_timer needs a CUDA device; none is available")
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    timing = EventTiming()
    start.record(stream)
    yield timing
    end.record(stream)
    end.synchronize()
    timing.elapsed_ms = start.elapsed_time(end)


def projection_error(projected: float, measured: float) -> float:
    """(projected - measured) / measured: signed relative error of a projection."""
    if not measured > 0:
        raise HarnessInputError(
            f"projection_error needs a positive measured value, got {measured!r}"
        )
    return (float(projected) - float(measured)) / float(measured)
