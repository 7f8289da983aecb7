"""The roofline of one operator on a GPU profile (``op_time_s``) and the host/GPU timeline of a
step (``simulate_step``: launch overheads, GPU idle time), applied to a model shape
(``project_decode``, ``project_pruning``). Every figure is a projection from datasheet numbers
and stated assumptions (``rsp_bench.profiles``), never a measurement.

Must NOT import transformers, torch or the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from rsp_bench.errors import HarnessInputError
from rsp_bench.profiles import HardwareProfile, get_profile, normalize_dtype
from rsp_bench.projection.work import ModelShape, Op, block_fractions, decode_step_ops


def op_time_s(op: Op, profile: HardwareProfile | str, dtype: str = "fp16") -> float:
    """GPU time of one execution of ``op``: the roofline, floored by the minimal kernel time.

    roofline = max(flops / (peak * compute_efficiency), bytes / (bandwidth *
    bandwidth_efficiency)); floor = kernels * min_kernel_us, because every kernel costs at
    least that however little it does. ``count`` is not applied here.
    """
    prof = get_profile(profile)
    peak = prof.peak_tflops(dtype) * 1e12 * prof.compute_efficiency
    bandwidth = prof.hbm_gbs * 1e9 * prof.bandwidth_efficiency
    roofline = max(op.flops / peak, op.bytes / bandwidth)
    return max(roofline, op.kernels * prof.min_kernel_us * 1e-6)


@dataclass(frozen=True)
class StepTimeline:
    """Projected timeline of one step: times in seconds."""

    span_s: float   # step start to the later of last kernel end and host work end
    busy_s: float   # sum of kernel durations (kernels of one stream never overlap)
    host_s: float   # host time: step overhead, launches, other host work
    kernels: float  # kernels launched (a mean, when ops have fractional counts)

    @property
    def idle_s(self) -> float:
        return self.span_s - self.busy_s

    @property
    def idle_fraction(self) -> float:
        return self.idle_s / self.span_s if self.span_s > 0 else 0.0


def simulate_step(ops: Sequence[Op], profile: HardwareProfile | str, dtype: str = "fp16",
                  kernel_launch_us: float | None = None,
                  host_step_overhead_us: float | None = None) -> StepTimeline:
    """Host/GPU timeline of one step that ends in a host synchronisation (sampling).

    The step starts with ``host_step_overhead_us`` of host work (the previous token's
    sync, Python), during which the GPU is idle. Then the host launches kernels one after
    another, each costing ``kernel_launch_us`` of host time; kernel i starts on the GPU at
    max(end of kernel i-1, end of its launch) and runs for its op's time divided evenly
    among the op's kernels. An op with count c < 1 costs c times its host and GPU time
    (the expected cost; see ``block_fractions``). busy = sum of kernel durations; the
    span runs to the last kernel end, and is at least the host time.
    """
    prof = get_profile(profile)
    launch = (prof.kernel_launch_us if kernel_launch_us is None else kernel_launch_us) * 1e-6
    overhead = (prof.host_step_overhead_us if host_step_overhead_us is None
                else host_step_overhead_us) * 1e-6
    if launch < 0 or overhead < 0:
        raise HarnessInputError(
            f"launch / host overheads must be >= 0, got {kernel_launch_us!r}, "
            f"{host_step_overhead_us!r}"
        )
    host = overhead
    gpu_free = 0.0
    busy = 0.0
    kernels = 0.0
    for op in ops:
        if op.count == 0:
            continue
        host += op.host_us * 1e-6 * op.count
        if op.kernels == 0:
            continue
        per_kernel = op_time_s(op, prof, dtype) / op.kernels * op.count
        for _ in range(op.kernels):
            host += launch * op.count
            start = max(gpu_free, host)
            gpu_free = start + per_kernel
            busy += per_kernel
        kernels += op.kernels * op.count
    return StepTimeline(span_s=max(host, gpu_free), busy_s=busy, host_s=host, kernels=kernels)


@dataclass(frozen=True)
class Projection:
    """Projected (not measured) decode figures for one profile and one configuration.

    ``busy_ms_per_token`` is GPU busy time per decode step, i.e. per token of each of the
    ``batch`` sequences; ``tokens_per_s`` counts all sequences together.
    """

    profile: str
    dtype: str
    batch: int
    context: int
    executed_blocks: float
    tokens_per_s: float
    busy_ms_per_token: float
    step_ms: float
    idle_fraction: float
    bytes_per_step: float
    flops_per_step: float
    kernels_per_step: float
    host_ms_per_step: float
    limited_by: str  # "host" when launches and host work outlast GPU busy time, else "gpu"

    def to_dict(self) -> dict:
        return asdict(self)


def project_decode(shape: ModelShape, profile: HardwareProfile | str, dtype: str = "fp16",
                   batch: int = 1, context: int = 512,
                   executed_blocks: float | Sequence[float] | None = None,
                   bypass_kind: str = "identity", bypass_rank: int = 0,
                   kernel_counts: Mapping[str, int] | None = None,
                   router_kernels_per_block: int = 0,
                   router_host_us_per_block: float = 0.0) -> Projection:
    """Projected decode figures of ``shape`` on ``profile`` (see ``simulate_step``)."""
    prof = get_profile(profile)
    kind = normalize_dtype(dtype)
    prof.peak_tflops(kind)  # bf16 on a card without BF16 fails here, naming the card
    ops = decode_step_ops(shape, batch, context, 2, executed_blocks, bypass_kind,
                          bypass_rank, kernel_counts, router_kernels_per_block,
                          router_host_us_per_block)
    tl = simulate_step(ops, prof, kind)
    return Projection(
        profile=prof.name,
        dtype=kind,
        batch=batch,
        context=context,
        executed_blocks=sum(block_fractions(shape, executed_blocks)),
        tokens_per_s=batch / tl.span_s,
        busy_ms_per_token=tl.busy_s * 1e3,
        step_ms=tl.span_s * 1e3,
        idle_fraction=tl.idle_fraction,
        bytes_per_step=sum(o.bytes * o.count for o in ops),
        flops_per_step=sum(o.flops * o.count for o in ops),
        kernels_per_step=tl.kernels,
        host_ms_per_step=tl.host_s * 1e3,
        limited_by="host" if tl.host_s >= tl.busy_s else "gpu",
    )


def project_pruning(shape: ModelShape, profile: HardwareProfile | str, dtype: str = "fp16",
                    batch: int = 1, context: int = 512,
                    executed_blocks_pruned: float | Sequence[float] | None = None,
                    bypass_kind: str = "identity", bypass_rank: int = 0,
                    kernel_counts: Mapping[str, int] | None = None,
                    router_kernels_per_block: int = 0,
                    router_host_us_per_block: float = 0.0) -> dict:
    """Projected decode with pruning off and on, and the GPU time pruning frees.

    Returns {"off": Projection, "pruned": Projection, "freed_fraction": float,
    "speedup": float}. freed_fraction = 1 - busy_pruned / busy_off: the share of the
    unpruned step's GPU busy time that the pruned step no longer uses (negative when the
    bypass and router cost more than the skipped blocks). speedup = pruned tokens/s over
    off tokens/s; in a launch-bound step it is much smaller than the busy time freed.
    The router cost applies to the pruned projection only.
    """
    off = project_decode(shape, profile, dtype, batch, context, None, "identity", 0,
                         kernel_counts)
    pruned = project_decode(shape, profile, dtype, batch, context, executed_blocks_pruned,
                            bypass_kind, bypass_rank, kernel_counts,
                            router_kernels_per_block, router_host_us_per_block)
    return {
        "off": off,
        "pruned": pruned,
        "freed_fraction": 1.0 - pruned.busy_ms_per_token / off.busy_ms_per_token,
        "speedup": pruned.tokens_per_s / off.tokens_per_s,
    }
