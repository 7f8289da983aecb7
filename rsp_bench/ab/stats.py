"""The A/B statistics: the interval of the head/base speed ratio of paired rounds, and the
decision against a horizon (inside, slower, faster, undecided).

Why a (trimmed) t-interval on log ratios, not a bootstrap:
- the quantity is multiplicative (a kernel 10% slower is a ratio 0.9 whichever side is the
  numerator), so the natural scale is log(head / base), where a ratio and its inverse are
  symmetric and the per-round noise of a shared machine is closer to normal than on the ratio;
- rounds are paired (head and base run back to back, in alternating order), so one log ratio per
  round is one independent unit, and a t-interval of their centre is exact under normality at the
  small n a CI run affords (6-40 pairs), where the percentile bootstrap is known to undercover
  (too narrow below ~20 units);
- it is deterministic (no resampling seed) and costs microseconds, so the sequential rule can
  re-evaluate it after every round.
Why trimmed (Tukey-McLaughlin / Yuen, 20% by default): on a machine shared with other jobs, a
burst of someone else's load now and then lands on one side of a pair and not the other (measured
here: one A/A round of 11 at batch 4 read 0.58 while the rest sat within +-13%). One such pair
triples the plain standard error and leaves the run undecided; the 20%-trimmed mean ignores it,
and its interval (trimmed mean +- t[h-1] * s_w / ((1 - 2g) sqrt(n)), s_w the winsorized sd, h the
pairs kept) keeps its coverage under normal noise (about 95% as efficient as the mean there).
``trim=0`` gives the plain t-interval. The interval is back-transformed: exp(centre +- half), an
interval for the typical (trimmed geometric-mean) ratio.

Decision against a horizon h (default 0.05): with the interval [lo, hi] of the speed ratio
(> 1 means the head is faster),
  inside     1 - h <= lo and hi <= 1 + h   (no change as large as h either way)
  slower     hi < 1 - h                    (the head is slower by more than h, decided)
  faster     lo > 1 + h
  undecided  anything else (keep sampling, or the budget ran out).
Because "slower" needs the whole interval beyond 1 - h, an unchanged head (true ratio 1) would
need a 5% error of its interval's far end to be called slower: the sequential peeking that
inflates a plain "different from 1" test barely touches this rule (measured: results/ab_power.json).

Must NOT import torch, numpy, the reference engine or any rsp_bench module other than
rsp_bench.errors: pure functions of plain floats, so the decision logic is testable on known
inputs in microseconds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from rsp_bench.errors import HarnessInputError

__all__ = ["RatioInterval", "t_quantile", "log_ratio_interval", "decide", "overall", "DECISIONS"]

DECISIONS = ("inside", "slower", "faster", "undecided")


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta (Lentz; Numerical Recipes 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(ln)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (bisection on its CDF;
    scipy is not a dependency). Accurate to ~1e-10: t_quantile(0.975, 5) = 2.5706."""
    if not (isinstance(p, float) or isinstance(p, int)) or not 0.0 < p < 1.0:
        raise HarnessInputError(f"p must be a probability in (0, 1), got {p!r}")
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise HarnessInputError(f"df must be an integer >= 1, got {df!r}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:  # t(0.9995, 1) is ~637: doubling gets there in 10 steps
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class RatioInterval:
    """The geometric-mean ratio of n paired rounds and its two-sided interval."""

    n: int
    ratio: float
    lo: float
    hi: float
    confidence: float
    log_sd: float  # winsorized sd of the per-round log ratios (the plain sd at trim 0; 0 when n < 2)

    def to_json(self) -> dict[str, Any]:
        """As JSON allows: an unbounded end (one round, nothing decided) is null, not inf."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def _ratios(values: Sequence[float], name: str) -> list[float]:
    if isinstance(values, (str, bytes)):
        raise HarnessInputError(f"{name} must be a sequence of ratios, got {values!r:.80}")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise HarnessInputError(f"{name}[{i}] is {v!r}; every ratio must be a finite number > 0")
        out.append(float(v))
    return out


def log_ratio_interval(ratios: Sequence[float], confidence: float = 0.95, trim: float = 0.2) -> RatioInterval:
    """Trimmed t-interval of the centre of the log ratios, back-transformed (module docstring).

    ``trim``: the share cut from each end (0 <= trim < 0.5; floor(trim * n) values each side).
    With one pair the interval is (0, inf): nothing can be decided from one round."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.0 < confidence < 1.0:
        raise HarnessInputError(f"confidence must be a number in (0, 1), got {confidence!r}")
    if isinstance(trim, bool) or not isinstance(trim, (int, float)) or not 0.0 <= trim < 0.5:
        raise HarnessInputError(f"trim must be a number in [0, 0.5), got {trim!r}")
    r = _ratios(ratios, "ratios")
    if not r:
        raise HarnessInputError("ratios is empty: an interval needs at least one paired round")
    logs = sorted(math.log(x) for x in r)
    n = len(logs)
    if n < 2:
        return RatioInterval(n, math.exp(logs[0]), 0.0, math.inf, float(confidence), 0.0)
    k = int(trim * n)
    kept = logs[k:n - k]
    centre = sum(kept) / len(kept)
    winsorized = [logs[k]] * k + kept + [logs[n - k - 1]] * k
    w_mean = sum(winsorized) / n
    s_w = math.sqrt(sum((x - w_mean) ** 2 for x in winsorized) / (n - 1))
    h = n - 2 * k
    if h < 2:
        return RatioInterval(n, math.exp(centre), 0.0, math.inf, float(confidence), s_w)
    g = k / n  # the share actually trimmed (floor), so that trim=0 is exactly the plain t-interval
    half = t_quantile(0.5 + confidence / 2.0, h - 1) * s_w / ((1.0 - 2.0 * g) * math.sqrt(n))
    return RatioInterval(n, math.exp(centre), math.exp(centre - half), math.exp(centre + half), float(confidence), s_w)


def decide(interval: RatioInterval, horizon: float = 0.05) -> str:
    """inside / slower / faster / undecided for a *speed* ratio (> 1 = head faster)."""
    if isinstance(horizon, bool) or not isinstance(horizon, (int, float)) or not 0.0 < horizon < 1.0:
        raise HarnessInputError(f"horizon must be a number in (0, 1), got {horizon!r}")
    low, high = 1.0 - horizon, 1.0 + horizon
    if interval.hi < low:
        return "slower"
    if interval.lo > high:
        return "faster"
    if low <= interval.lo and interval.hi <= high:
        return "inside"
    return "undecided"


def overall(decisions: Sequence[str]) -> str:
    """One verdict over the gated metrics: slower if any is slower, else undecided if any is
    undecided, else faster if any is faster, else inside."""
    for d in decisions:
        if d not in DECISIONS:
            raise HarnessInputError(f"unknown decision {d!r}; expected one of {', '.join(DECISIONS)}")
    if not decisions:
        raise HarnessInputError("no gated metric to decide on")
    for verdict in ("slower", "undecided", "faster"):
        if verdict in decisions:
            return verdict
    return "inside"
