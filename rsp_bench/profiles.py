"""Hardware profiles: the ONE place that holds GPU datasheet figures and timing assumptions.

Every number a projection uses about a machine lives here, with its source, so that a
reader can check it and a user can swap it (``dataclasses.replace(get_profile("H100"),
hbm_gbs=3072)``). ``rsp_bench.projection`` turns these figures into projected tokens/s;
this module computes nothing itself.

Must NOT import torch, transformers or the engine: it is plain data, importable anywhere.

Why these numbers and not others: projection tools disagree about the same card. For the
H100 SXM5, LLM-Viewer uses 3,072 GB/s of HBM bandwidth and GenZ 3,400 GB/s, while NVIDIA's
datasheet says 3,350 GB/s. We use the datasheet figure (dense tensor-core throughput, no
2:4 sparsity) for every profile and let the achievable fractions below carry the gap
between datasheet and practice, stated once as assumptions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rsp_bench.errors import HarnessInputError

# --- Assumptions shared by every profile (not datasheet figures; stated once, here) -----
#
# DEFAULT_BANDWIDTH_EFFICIENCY: share of datasheet HBM bandwidth a decode GEMV streams.
#   gpt-fast and vLLM report ~1.2-1.7 TB/s on an A100 (60-85% of 2,039 GB/s) for large
#   batch-1 matrix-vector products; 0.8 is the upper half of that range, so projections
#   lean optimistic rather than pessimistic on bandwidth.
DEFAULT_BANDWIDTH_EFFICIENCY = 0.8
# DEFAULT_COMPUTE_EFFICIENCY: share of dense tensor-core peak a large fp16/bf16 GEMM
#   reaches with cuBLAS (typically 70-80% on A100, 60-75% on H100 without FP8/TMA-tuned
#   kernels). It only matters for compute-bound work (prefill, large batch).
DEFAULT_COMPUTE_EFFICIENCY = 0.7
# DEFAULT_MIN_KERNEL_US: the shortest a kernel runs on the GPU however little it does
#   (block scheduling, memory latency, tail). Tiny elementwise kernels show up as about
#   1.5-3 us in Nsight / torch.profiler traces on Volta to Hopper; 2 us is the middle.
DEFAULT_MIN_KERNEL_US = 2.0
# DEFAULT_KERNEL_LAUNCH_US: host time to issue one kernel from eager PyTorch: Python
#   bytecode, pybind11, the ATen dispatcher and cudaLaunchKernel (about 1-3 us of it on
#   CUDA 12 drivers) add up to roughly 4-6 us per op on a modern server CPU. It is a
#   property of the host and the software path, not of the GPU, so it is the same for
#   every profile. With CUDA graphs the host cost per kernel nearly vanishes (about
#   1 us of device-side gap remains): model that with dataclasses.replace(...,
#   kernel_launch_us=1.0).
DEFAULT_KERNEL_LAUNCH_US = 5.0
# DEFAULT_HOST_STEP_OVERHEAD_US: host time per decode step outside kernel launches:
#   the device-to-host copy of the sampled token (a synchronisation), the Python loop,
#   stopping checks and stats. Tens of microseconds each; 100 us in all is an estimate
#   to calibrate against a measured trace, not a measurement.
DEFAULT_HOST_STEP_OVERHEAD_US = 100.0


@dataclass(frozen=True)
class HardwareProfile:
    """One GPU as the projection sees it: datasheet figures plus timing assumptions.

    Units: TFLOPS are dense tensor-core 10^12 FLOP/s, ``hbm_gbs`` is 10^9 bytes/s,
    ``memory_gb`` is the card's HBM capacity, times are microseconds.
    ``peak_tflops_bf16`` is None where the card has no BF16 tensor cores (V100).
    """

    name: str
    peak_tflops_fp16: float
    peak_tflops_bf16: float | None
    hbm_gbs: float
    memory_gb: float
    kernel_launch_us: float
    host_step_overhead_us: float
    source: str
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    min_kernel_us: float = DEFAULT_MIN_KERNEL_US

    def __post_init__(self) -> None:
        positive = {
            "peak_tflops_fp16": self.peak_tflops_fp16,
            "hbm_gbs": self.hbm_gbs,
            "memory_gb": self.memory_gb,
        }
        if self.peak_tflops_bf16 is not None:
            positive["peak_tflops_bf16"] = self.peak_tflops_bf16
        for field, value in positive.items():
            if not value > 0:
                raise HarnessInputError(
                    f"hardware profile {self.name!r}: {field} must be > 0, got {value!r}"
                )
        for field in ("kernel_launch_us", "host_step_overhead_us", "min_kernel_us"):
            value = getattr(self, field)
            if not value >= 0:
                raise HarnessInputError(
                    f"hardware profile {self.name!r}: {field} must be >= 0, got {value!r}"
                )
        for field in ("bandwidth_efficiency", "compute_efficiency"):
            value = getattr(self, field)
            if not 0 < value <= 1:
                raise HarnessInputError(
                    f"hardware profile {self.name!r}: {field} must be in (0, 1], got {value!r}"
                )

    def peak_tflops(self, dtype: str) -> float:
        """Dense tensor-core peak for ``dtype`` ("fp16" or "bf16"), in TFLOPS."""
        kind = normalize_dtype(dtype)
        if kind == "fp16":
            return self.peak_tflops_fp16
        if self.peak_tflops_bf16 is None:
            raise HarnessInputError(
                f"hardware profile {self.name!r} has no BF16 tensor cores: "
                f"dtype {dtype!r} cannot be projected on it; use dtype='fp16'"
            )
        return self.peak_tflops_bf16

    def with_overrides(self, **changes: float) -> "HardwareProfile":
        """A copy with some fields changed (e.g. kernel_launch_us=1.0 for CUDA graphs)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise HarnessInputError(
                f"hardware profile {self.name!r} has no field(s) {unknown}"
            )
        return dataclasses.replace(self, **changes)


_DTYPE_ALIASES = {
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
}


def normalize_dtype(dtype: str) -> str:
    """Map a GPU dtype name to "fp16" or "bf16"; anything else is a HarnessInputError."""
    kind = _DTYPE_ALIASES.get(str(dtype).strip().lower().removeprefix("torch."))
    if kind is None:
        raise HarnessInputError(
            f"unknown GPU dtype {dtype!r}: projections support 'fp16' and 'bf16'"
        )
    return kind


def _profile(name: str, tflops16: float, tflops_bf16: float | None, gbs: float,
             mem: float, source: str) -> HardwareProfile:
    return HardwareProfile(
        name=name,
        peak_tflops_fp16=tflops16,
        peak_tflops_bf16=tflops_bf16,
        hbm_gbs=gbs,
        memory_gb=mem,
        kernel_launch_us=DEFAULT_KERNEL_LAUNCH_US,
        host_step_overhead_us=DEFAULT_HOST_STEP_OVERHEAD_US,
        source=source,
    )


# Datasheet figures (DESIGN.md section 4). Dense tensor throughput: the datasheets' larger
# "with sparsity" numbers (2x) are deliberately not used.
PROFILES: dict[str, HardwareProfile] = {
    "V100": _profile(
        "V100", 125.0, None, 900.0, 32.0,
        "NVIDIA Tesla V100 GPU Accelerator datasheet (SXM2 32GB: 125 TFLOPS tensor, "
        "900 GB/s HBM2, no BF16), "
        "https://images.nvidia.com/content/technologies/volta/pdf/"
        "volta-v100-datasheet-update-us-1165301-r5.pdf",
    ),
    "A100": _profile(
        "A100", 312.0, 312.0, 2039.0, 80.0,
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB: 312 TFLOPS FP16/BF16 dense, "
        "2,039 GB/s HBM2e), https://www.nvidia.com/content/dam/en-zz/Solutions/"
        "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    ),
    # LLM-Viewer uses 3,072 GB/s and GenZ 3,400 GB/s for this card; we cite the datasheet.
    "H100": _profile(
        "H100", 989.0, 989.0, 3350.0, 80.0,
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5 80GB: 989 TFLOPS FP16/BF16 dense, "
        "3.35 TB/s HBM3), https://resources.nvidia.com/en-us-tensor-core/"
        "nvidia-tensor-core-gpu-datasheet",
    ),
    "H200": _profile(
        "H200", 989.0, 989.0, 4800.0, 141.0,
        "NVIDIA H200 Tensor Core GPU datasheet (SXM 141GB: 989 TFLOPS FP16/BF16 dense, "
        "4.8 TB/s HBM3e), https://www.nvidia.com/en-us/data-center/h200/",
    ),
}


def get_profile(name: str | HardwareProfile) -> HardwareProfile:
    """The profile called ``name`` (case-insensitive); a profile object passes through."""
    if isinstance(name, HardwareProfile):
        return name
    key = str(name).strip().upper()
    if key not in PROFILES:
        raise HarnessInputError(
            f"unknown hardware profile {name!r}; valid profiles: {', '.join(PROFILES)}"
        )
    return PROFILES[key]


def match_device_name(device_name: str) -> HardwareProfile | None:
    """The profile for a CUDA device name (``torch.cuda.get_device_name()``), or None.

    Only the SXM variants above are profiled: PCIe, NVL and 16/40 GB cards have other
    bandwidths, so they get None rather than a wrong profile.
    """
    upper = device_name.upper()
    if any(tag in upper for tag in ("PCIE", "NVL", "16GB", "40GB")):
        return None
    for key, profile in PROFILES.items():
        if key in upper:
            return profile
    return None
