"""The model-level checks: ``loss_anomaly_reason`` (prompt loss), ``norm_anomaly_reason``
(hidden-state norms) and ``router_instability_reason`` (KEEP/BYPASS flips), pure functions
of numbers the engine measures, compared with calibrated ones.

Must NOT import: ``rsp_bench`` (the engine never depends on the harness), torch (the
harness and tests import this without a model), or any other module of this package.
Only stdlib and numpy.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


def loss_anomaly_reason(
    mean_nll: float, calib_mean: float, calib_std: float, z: float = 4.0
) -> str | None:
    """"prompt_loss" when the prompt's mean per-token loss is more than ``z`` std above calibration.

    ``mean_nll`` is the mean negative log-likelihood (nats per token) the unpruned model
    assigns to the prompt's tokens during prefill, which runs in full anyway, so the check
    is free. One-sided: unusually predictable text (repetition, boilerplate) is no danger
    to pruning. A non-finite ``mean_nll`` (NaN or inf) fires, because a broken or
    impossible prompt is the clearest case for running the full model. Raises ValueError
    for non-finite calibration numbers, a negative std or a non-positive ``z``.
    """
    mean = _finite("calib_mean", calib_mean)
    std = _finite("calib_std", calib_std)
    zz = _finite("z", z)
    if std < 0:
        raise ValueError(f"calib_std must be >= 0, got {calib_std!r}")
    if zz <= 0:
        raise ValueError(f"z must be > 0, got {z!r}")
    if isinstance(mean_nll, bool) or not isinstance(mean_nll, (int, float, np.floating, np.integer)):
        raise ValueError(f"mean_nll must be a number, got {mean_nll!r}")
    value = float(mean_nll)
    if not math.isfinite(value):
        return "prompt_loss"
    return "prompt_loss" if value > mean + zz * std else None


def norm_anomaly_reason(
    block_norms: Sequence[float],
    calib_lo: Sequence[float],
    calib_hi: Sequence[float],
    slack: float = 1.5,
) -> str | None:
    """"hidden_norm" when any block's hidden-state norm is outside ``[lo/slack, hi*slack]``.

    ``block_norms[l]`` is the norm the engine measured at block ``l`` (for example the mean
    L2 norm of the prompt's hidden states entering the block); ``calib_lo``/``calib_hi`` are
    the smallest and largest such values seen on calibration text. ``slack`` widens the
    calibrated band multiplicatively, because norms scale rather than shift. A non-finite
    norm fires. Raises ValueError when the lengths differ, a bound is negative or
    non-finite, ``lo > hi``, or ``slack < 1``.
    """
    sl = _finite("slack", slack)
    if sl < 1.0:
        raise ValueError(f"slack must be >= 1, got {slack!r}")
    norms = np.asarray(block_norms, dtype=np.float64).reshape(-1)
    lo = np.asarray(calib_lo, dtype=np.float64).reshape(-1)
    hi = np.asarray(calib_hi, dtype=np.float64).reshape(-1)
    if not (len(norms) == len(lo) == len(hi)):
        raise ValueError(
            f"block_norms, calib_lo and calib_hi must have one value per block, got lengths "
            f"{len(norms)}, {len(lo)}, {len(hi)}"
        )
    for name, arr in (("calib_lo", lo), ("calib_hi", hi)):
        bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
        if bad.size:
            raise ValueError(f"{name}[{bad[0]}] must be finite and >= 0, got {arr[bad[0]]!r}")
    bad = np.flatnonzero(lo > hi)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"calib_lo[{i}]={lo[i]!r} is above calib_hi[{i}]={hi[i]!r}")
    if not np.all(np.isfinite(norms)):
        return "hidden_norm"
    if np.any(norms < lo / sl) or np.any(norms > hi * sl):
        return "hidden_norm"
    return None


def router_instability_reason(
    decision_flips: int, decisions: int, max_flip_rate: float = 0.5, min_decisions: int = 8
) -> str | None:
    """"router_unstable" when KEEP/BYPASS decisions flip more often than ``max_flip_rate``.

    ``decisions`` counts routing decisions that had a previous decision for the same block
    (so a flip could be observed); ``decision_flips`` counts those that differ from it. A
    router that decides by coin toss flips half the time, so a higher rate means the scores
    hover on the threshold and the pruned path is noise. Below ``min_decisions`` nothing is
    judged: the first tokens of a request say too little. Raises ValueError for negative
    counts, more flips than decisions, or a rate outside [0, 1].
    """
    for name, value in (("decision_flips", decision_flips), ("decisions", decisions),
                        ("min_decisions", min_decisions)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if decision_flips > decisions:
        raise ValueError(f"decision_flips={decision_flips!r} exceeds decisions={decisions!r}")
    rate_max = _finite("max_flip_rate", max_flip_rate)
    if not 0.0 <= rate_max <= 1.0:
        raise ValueError(f"max_flip_rate must be in [0, 1], got {max_flip_rate!r}")
    if decisions == 0 or decisions < min_decisions:
        return None
    return "router_unstable" if decision_flips / decisions > rate_max else None
