"""Speed figures from timings: latency percentiles, decode rate, achieved bandwidth, interleaved speed-up.

Must NOT import torch directly, transformers, the reference engine, ``rsp_bench.speed`` (which
calls these), the other metric modules (except ``rsp_bench.metrics._checks`` and the bootstrap
of ``rsp_bench.metrics.intervals``) or any rsp_bench module other than rsp_bench.errors.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics._checks import _finite_array, _same_length
from rsp_bench.metrics.intervals import _bootstrap_interval, _row_median

__all__ = ["percentile", "speed_summary", "achieved_bandwidth_gbs", "interleaved_speedup"]


def percentile(samples: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) with numpy's linear interpolation."""
    if not isinstance(q, (int, float)) or isinstance(q, bool) or not 0 <= q <= 100:
        raise HarnessInputError(f"q must be a number in [0, 100], got {q!r}")
    return float(np.percentile(_finite_array(samples, "samples"), q, method="linear"))


def speed_summary(ttft_s: Sequence[float], tpot_s: Sequence[float]) -> dict[str, float]:
    """Latency percentiles in ms and the decode rate.

    ttft_s: time to first token per request (s); tpot_s: time per output token after the
    first (s), one sample per token or per request. decode_tokens_per_s = 1 / median(tpot):
    the median resists the odd stalled step that a mean-based rate would absorb.
    """
    ttft = _finite_array(ttft_s, "ttft_s")
    tpot = _finite_array(tpot_s, "tpot_s")
    if (ttft < 0).any():
        raise HarnessInputError(f"ttft_s holds a negative time: {ttft.min()}")
    if (tpot <= 0).any():
        raise HarnessInputError(f"tpot_s must be positive times, got {tpot.min()}")
    tpot_p50 = float(np.percentile(tpot, 50, method="linear"))
    return {
        "ttft_ms_p50": 1000 * float(np.percentile(ttft, 50, method="linear")),
        "ttft_ms_p90": 1000 * float(np.percentile(ttft, 90, method="linear")),
        "tpot_ms_p50": 1000 * tpot_p50,
        "tpot_ms_p90": 1000 * float(np.percentile(tpot, 90, method="linear")),
        "decode_tokens_per_s": 1.0 / tpot_p50,
    }


def achieved_bandwidth_gbs(bytes_per_token: float, tokens_per_s: float) -> float:
    """Weight bytes read per token x tokens/s, in GB/s (1e9), as gpt-fast prints it."""
    for name, value in (("bytes_per_token", bytes_per_token), ("tokens_per_s", tokens_per_s)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise HarnessInputError(f"{name} must be a finite non-negative number, got {value!r}")
    return bytes_per_token * tokens_per_s / 1e9


def interleaved_speedup(
    base_samples: Sequence[float],
    candidate_samples: Sequence[float],
    alpha: float = 0.05,
    n_resamples: int = 2000,
    seed: int = 0,
) -> dict[str, float]:
    """Speed-up of the candidate from A B A B interleaved durations (lower is faster).

    Pair i is (base[i], candidate[i]), timed back to back so both see the same machine
    state. ratio = median_i(base_i / candidate_i), above 1 when the candidate is faster;
    lo/hi: percentile bootstrap over pairs. The median of per-pair ratios cancels drift
    (thermal, other tenants) that a ratio of two overall means would absorb.
    """
    base = _finite_array(base_samples, "base_samples")
    cand = _finite_array(candidate_samples, "candidate_samples")
    _same_length(base, cand, "base_samples", "candidate_samples")
    for name, arr in (("base_samples", base), ("candidate_samples", cand)):
        if (arr <= 0).any():
            raise HarnessInputError(f"{name} must be positive durations, got {arr.min()}")
    ratios = base / cand
    lo, hi = _bootstrap_interval(ratios, _row_median, alpha, n_resamples, seed)
    return {"ratio": float(np.median(ratios)), "lo": lo, "hi": hi}
