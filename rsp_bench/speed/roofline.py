"""The measured batch-1 decode ceiling of this machine (its bandwidth roofline).

Batch-1 decode reads every weight once per token, so its ceiling is the machine's memory
bandwidth divided by the bytes per token. The bandwidth is taken from the fastest of several
bandwidth-bound kernels, each timed alone, so the ceiling is the machine's and not one
library's:

- ``stream_read``: a STREAM-style read over a buffer several times larger than the last-level
  cache (a matrix-vector product of the buffer, viewed as a wide matrix, with a vector: every
  byte is read once, the arithmetic is negligible, and BLAS GEMV is the fastest read kernel
  available to Python here);
- ``model_gemv_numpy``: the model's own 121 per-token matrix-vector products with numpy
  (OpenBLAS) over zero-copy views of the same fp32 weights;
- ``model_gemv_torch``: the same products with ``torch.mv`` (MKL). This was the only kernel
  before, and the roofline it gave was torch's own GEMV speed, not the machine's: it is kept,
  under that name (``torch_gemv_*``), for comparison.

Must NOT import the reference engine, transformers or pytest (the engine is duck-typed).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rsp_bench.errors import HarnessInputError
from rsp_bench.projection import ModelShape, bytes_per_token

# Several times the largest last-level cache of the machines this runs on (300 MiB L3 here), so
# the read comes from DRAM and not from a cache left warm by the previous iteration.
STREAM_BYTES = 1 << 30
STREAM_ROW = 4096  # row length of the wide-matrix view: long rows, few output writes


@dataclass
class KernelTiming:
    """One bandwidth-bound kernel timed alone: its bytes per iteration and median time."""

    name: str
    bytes: float
    seconds: float  # median iteration
    iterations: int
    samples_s: list[float] = field(default_factory=list)

    @property
    def gbs(self) -> float:
        return self.bytes / self.seconds / 1e9

    def to_dict(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "seconds": self.seconds,
                "iterations": self.iterations, "gbs": self.gbs}


@dataclass
class Roofline:
    """The measured batch-1 decode ceiling of this machine for one model (fp32 weights).

    ``gbs`` is the ceiling bandwidth (the fastest kernel, named by ``kernel``); ``tokens_per_s``
    = gbs / bytes_per_token. The per-token GEMV fields describe the model's own products as the
    fastest GEMV path streamed them. ``torch_gemv_gbs`` / ``torch_gemv_tokens_per_s``: the old
    roofline, torch's own GEMV speed, kept for comparison (None when not measured).
    """

    bytes_per_token: float        # projection.bytes_per_token, unpruned, fp32
    gemv_bytes: float             # bytes of the matrices the per-token GEMV loop streams
    gemv_count: int               # matrix-vector products per token
    seconds_per_token: float      # the ceiling's time per token: bytes_per_token / bandwidth
    tokens_per_s: float           # the ceiling: 1 / seconds_per_token
    gbs: float                    # the ceiling bandwidth, 1e9 bytes/s
    iterations: int               # iterations of the kernel that set the ceiling
    threads: int
    samples_s: list[float] = field(default_factory=list)  # that kernel's iteration times
    kernel: str = "model_gemv_torch"
    kernels: dict[str, dict] = field(default_factory=dict)  # every kernel timed: KernelTiming.to_dict
    torch_gemv_gbs: float | None = None
    torch_gemv_tokens_per_s: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("samples_s")
        return d


def _time_kernel(name: str, nbytes: float, fn: Callable[[], Any], min_time_s: float,
                 max_iterations: int, warmup: int) -> KernelTiming:
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < max_iterations and (len(samples) < 5 or time.perf_counter() - start < min_time_s):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return KernelTiming(name, nbytes, float(statistics.median(samples)), len(samples), samples)


def model_matrices(engine: Any) -> list:
    """The model's per-token matrices, in decode order: per block fused qkv, o, fused gate/up,
    down; then the LM head."""
    w = getattr(engine, "weights", engine)
    blocks = getattr(w, "blocks", None)
    if not blocks:
        raise HarnessInputError(f"{type(engine).__name__} has no weights.blocks to time")
    return [m.contiguous() for b in blocks for m in (b.wqkv, b.wo, b.w_gate_up, b.w_down)] + [w.lm_head.contiguous()]


def bandwidth_roofline(engine: Any, min_time_s: float = 1.0, max_iterations: int = 200,
                       warmup: int = 3, stream_bytes: int | None = STREAM_BYTES) -> Roofline:
    """Measure this machine's decode ceiling for ``engine``'s model (module docstring).

    Each kernel iterates until ``min_time_s`` has passed (at least 5 times) or
    ``max_iterations``; its median iteration is reported. ``stream_bytes``: size of the
    STREAM-style buffer (None: leave the STREAM read out, for a fast unit test). The kernels run
    one after another, not interleaved: each is a property of the machine, not a comparison.
    """
    import numpy as np
    import torch

    mats = model_matrices(engine)
    gemv_bytes = float(sum(m.numel() * m.element_size() for m in mats))
    timings: list[KernelTiming] = []
    with torch.inference_mode():
        xs = [torch.randn(m.shape[1], dtype=m.dtype, device=m.device) for m in mats]
        outs = [torch.empty(m.shape[0], dtype=m.dtype, device=m.device) for m in mats]
        jobs = list(zip(mats, xs, outs))

        def torch_gemv() -> None:
            for m, x, o in jobs:
                torch.mv(m, x, out=o)

        timings.append(_time_kernel("model_gemv_torch", gemv_bytes, torch_gemv, min_time_s,
                                    max_iterations, warmup))
        if all(m.device.type == "cpu" and m.dtype == torch.float32 for m in mats):
            np_jobs = [(m.numpy(), x.numpy(), o.numpy()) for m, x, o in jobs]  # zero-copy views

            def numpy_gemv() -> None:
                for m, x, o in np_jobs:
                    np.matmul(m, x, out=o)

            timings.append(_time_kernel("model_gemv_numpy", gemv_bytes, numpy_gemv, min_time_s,
                                        max_iterations, warmup))
        if stream_bytes:
            rows = max(1, int(stream_bytes) // (4 * STREAM_ROW))
            # Any values will do for a read (DRAM does not compress); filling with a constant
            # still writes every page, and takes 0.14 s where random floats took 3.8 s.
            buf = np.full((rows, STREAM_ROW), 1.0, dtype=np.float32)
            vec = np.ones(STREAM_ROW, dtype=np.float32)
            out = np.empty(rows, dtype=np.float32)
            timings.append(_time_kernel("stream_read", float(buf.nbytes),
                                        lambda: np.matmul(buf, vec, out=out),
                                        min_time_s, max_iterations, min(warmup, 1)))
            del buf
    best = max(timings, key=lambda k: k.gbs)
    cfg = getattr(getattr(engine, "hf_model", None), "config", None)
    bpt = bytes_per_token(ModelShape.from_hf_config(cfg), mats[0].element_size()) if cfg is not None else gemv_bytes
    per_token = bpt / (best.gbs * 1e9)
    torch_k = timings[0]
    return Roofline(bytes_per_token=bpt, gemv_bytes=gemv_bytes, gemv_count=len(mats),
                    seconds_per_token=per_token, tokens_per_s=1.0 / per_token, gbs=best.gbs,
                    iterations=best.iterations, threads=torch.get_num_threads(),
                    samples_s=[s * bpt / best.bytes for s in best.samples_s], kernel=best.name,
                    kernels={k.name: k.to_dict() for k in timings},
                    torch_gemv_gbs=torch_k.gbs, torch_gemv_tokens_per_s=1.0 / torch_k.seconds)
