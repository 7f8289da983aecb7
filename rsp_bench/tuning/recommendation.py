"""The recommendation of ``rsp-bench tune`` (the method: rsp_bench.tune's docstring): a
curve's rows (``TuneRow``), relative quality, effective speed-up, the budget cap, the knee
and the margin, giving a ``Recommendation``.

Must NOT import pytest, torch, transformers, the engine, or the other rsp_bench.tuning
modules: the standard library alone (and rsp_bench.errors), so ``--from-table`` and the
tests of the recommendation run without a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from rsp_bench.errors import HarnessInputError

DEFAULT_MARGIN = 0.05
MAX_MARGIN = 0.5
# Quality read back from a table must not fail a budget by float noise (1 - 0.95 > 0.05).
_BUDGET_SLACK = 1e-9



# --------------------------------------------------------------------------- the curve


@dataclass
class TuneRow:
    """One sensitivity of the sweep (one line of tune.csv)."""

    sensitivity: float
    metric: str
    quality: float
    quality_lo: float
    quality_hi: float
    quality_n: int
    speedup: float
    speedup_lo: float
    speedup_hi: float
    speedup_pairs: int
    decode_tokens_per_s: float
    bypass_ratio: float
    budget: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Recommendation:
    """The outcome of ``recommend``: indices refer to the rows it was given."""

    sensitivity: float
    knee: float
    knee_index: int
    cap_index: int
    margin: float
    budget: float | None
    relative_quality: tuple[float, ...]
    effective_speedup: tuple[float, ...]
    utility: tuple[float, ...]

    def explain(self) -> str:
        cap = "" if self.budget is None else f" within the quality budget (drop <= {self.budget:g})"
        if self.knee == 0.0:
            return (f"knee at sensitivity 0{cap}: quality falls faster than speed rises from the first step, "
                    "so pruning does not pay here; recommended 0 (pruning off)")
        return (f"knee at sensitivity {self.knee:g}{cap} (relative quality {self.relative_quality[self.knee_index]:.4f}"
                f" + speed-up {self.effective_speedup[self.knee_index]:.4f} is the largest); minus the margin "
                f"{self.margin:g}: recommended {self.sensitivity:g}")


def _check_curve(sensitivities: Sequence[float], quality: Sequence[float], speedup: Sequence[float]) -> None:
    n = len(sensitivities)
    if n < 2 or len(quality) != n or len(speedup) != n:
        raise HarnessInputError(
            f"a tuning curve needs >= 2 points with one quality and one speed-up each; got "
            f"{n} sensitivities, {len(quality)} qualities, {len(speedup)} speed-ups")
    for name, values in (("sensitivity", sensitivities), ("quality", quality), ("speed-up", speedup)):
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise HarnessInputError(f"{name} of point {i} must be a finite number, got {v!r}")
    if sensitivities[0] != 0.0:
        raise HarnessInputError(f"the curve must start at sensitivity 0 (pruning off, the reference), got {sensitivities[0]!r}")
    for i in range(1, n):
        if not sensitivities[i] > sensitivities[i - 1]:
            raise HarnessInputError(f"sensitivities must increase strictly, got {sensitivities[i - 1]!r} then {sensitivities[i]!r}")
    if sensitivities[-1] > 1.0:
        raise HarnessInputError(f"sensitivity must be <= 1, got {sensitivities[-1]!r}")
    if quality[0] <= 0:
        raise HarnessInputError(
            f"quality at sensitivity 0 is {quality[0]!r}: relative quality is undefined; choose a metric the "
            "unpruned model scores above 0 on (e.g. --metric top1_agreement)")
    bad = [v for v in speedup if v <= 0]
    if bad:
        raise HarnessInputError(f"speed-ups must be positive ratios, got {bad[0]!r}")


def relative_quality(quality: Sequence[float]) -> list[float]:
    """Q(s) = quality(s) / quality(0)."""
    return [q / quality[0] for q in quality]


def effective_speedup(speedup: Sequence[float], lo: Sequence[float] | None = None,
                      hi: Sequence[float] | None = None) -> list[float]:
    """V as the knee uses it: 1 where the speed-up's CI [lo, hi] contains 1, else the speed-up
    (no CI given: the speed-ups as they are)."""
    if lo is None or hi is None:
        return [float(v) for v in speedup]
    if len(lo) != len(speedup) or len(hi) != len(speedup):
        raise HarnessInputError(f"{len(speedup)} speed-ups but {len(lo)} lower and {len(hi)} upper CI bounds")
    for i, (v, a, b) in enumerate(zip(speedup, lo, hi)):
        if not (math.isfinite(a) and math.isfinite(b) and a <= b):
            raise HarnessInputError(f"speed-up CI of point {i} must be finite with lo <= hi, got [{a!r}, {b!r}]")
    return [1.0 if a <= 1.0 <= b else float(v) for v, a, b in zip(speedup, lo, hi)]


def utility(quality: Sequence[float], speedup: Sequence[float]) -> list[float]:
    """U(s) = Q(s) + V(s) for the V given (pass ``effective_speedup``): what the knee maximises."""
    return [q + v for q, v in zip(relative_quality(quality), speedup)]


def budget_cap_index(quality: Sequence[float], budget: float | None) -> int:
    """Index of the last point of the prefix whose quality drop stays within ``budget``."""
    if budget is None:
        return len(quality) - 1
    _check_budget(budget)
    for i, q in enumerate(quality):
        if quality[0] - q > budget + _BUDGET_SLACK:
            return i - 1  # i >= 1: point 0 drops nothing
    return len(quality) - 1


def find_knee(sensitivities: Sequence[float], quality: Sequence[float], speedup: Sequence[float]) -> int:
    """Index of the knee: the smallest sensitivity maximising Q + V, V as given (module docstring)."""
    _check_curve(sensitivities, quality, speedup)
    u = utility(quality, speedup)
    return max(range(len(u)), key=lambda i: (u[i], -i))


def _check_margin(margin: float) -> float:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) \
            or not 0.0 <= margin <= MAX_MARGIN:
        raise HarnessInputError(f"margin must be a number in [0, {MAX_MARGIN}] (0.05..0.1 is sensible), got {margin!r}")
    return float(margin)


def _check_budget(budget: float) -> float:
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) \
            or not 0.0 <= budget < 1.0:
        raise HarnessInputError(f"budget (the quality drop allowed) must be a number in [0, 1), got {budget!r}")
    return float(budget)


def recommend(sensitivities: Sequence[float], quality: Sequence[float], speedup: Sequence[float],
              margin: float = DEFAULT_MARGIN, budget: float | None = None,
              speedup_lo: Sequence[float] | None = None, speedup_hi: Sequence[float] | None = None) -> Recommendation:
    """Knee of the curve (within the budget), minus the margin (module docstring). With the
    speed-ups' CI bounds, a speed-up indistinguishable from 1 counts as 1."""
    margin = _check_margin(margin)
    _check_curve(sensitivities, quality, speedup)
    v = effective_speedup(speedup, speedup_lo, speedup_hi)
    cap = budget_cap_index(quality, budget)
    k = find_knee(sensitivities[:cap + 1], quality[:cap + 1], v[:cap + 1])
    value = round(max(0.0, sensitivities[k] - margin), 4)
    return Recommendation(sensitivity=value, knee=float(sensitivities[k]), knee_index=k, cap_index=cap,
                          margin=margin, budget=budget, relative_quality=tuple(relative_quality(quality)),
                          effective_speedup=tuple(v), utility=tuple(utility(quality, v)))


# --------------------------------------------------------------------------- the table
