"""Confidence intervals: percentile bootstrap (mean, paired difference, ratio) and Wilson score;
and the one-sided tests that go with them: permutation (a difference in means) and sign (how often
one side came out above).

Must NOT import torch directly, transformers, the reference engine, the other metric
modules (except the shared ``rsp_bench.metrics._checks``) or any rsp_bench module other
than rsp_bench.errors.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, Sequence

import numpy as np

from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics._checks import _alpha, _finite_array, _same_length

__all__ = ["bootstrap_mean_ci", "bootstrap_paired_diff_ci", "bootstrap_ratio_ci", "wilson_interval",
           "permutation_mean_greater_p"]


# Bounds memory: resample index matrices are drawn in chunks of at most this many entries.
_MAX_DRAWS_PER_CHUNK = 2_000_000


def _bootstrap_interval(
    values: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    alpha: float,
    n_resamples: int,
    seed: int,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` (applied row-wise to resamples)."""
    alpha = _alpha(alpha)
    if not isinstance(n_resamples, int) or isinstance(n_resamples, bool) or n_resamples < 1:
        raise HarnessInputError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    rng = np.random.default_rng(seed)
    n = values.size
    stats = np.empty(n_resamples)
    rows = max(1, _MAX_DRAWS_PER_CHUNK // n)
    for start in range(0, n_resamples, rows):
        count = min(rows, n_resamples - start)
        idx = rng.integers(0, n, size=(count, n))
        stats[start:start + count] = statistic(values[idx])
    lo, hi = np.percentile(stats, [100 * alpha / 2, 100 * (1 - alpha / 2)], method="linear")
    return float(lo), float(hi)


def _row_mean(a: np.ndarray) -> np.ndarray:
    return a.mean(axis=1)


def _row_median(a: np.ndarray) -> np.ndarray:
    return np.median(a, axis=1)


def bootstrap_mean_ci(
    values: Sequence[float], alpha: float = 0.05, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, lo, hi): the sample mean and its percentile-bootstrap interval.

    Resample independent units (one value per prompt or document, not per token of one
    prompt), or the interval will be too narrow.
    """
    arr = _finite_array(values, "values")
    lo, hi = _bootstrap_interval(arr, _row_mean, alpha, n_resamples, seed)
    return float(arr.mean()), lo, hi


def bootstrap_paired_diff_ci(
    candidate_values: Sequence[float],
    reference_values: Sequence[float],
    alpha: float = 0.05,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean_diff, lo, hi) of candidate minus reference, pairs resampled together by index."""
    cand = _finite_array(candidate_values, "candidate_values")
    ref = _finite_array(reference_values, "reference_values")
    _same_length(cand, ref, "candidate_values", "reference_values")
    diff = cand - ref
    lo, hi = _bootstrap_interval(diff, _row_mean, alpha, n_resamples, seed)
    return float(diff.mean()), lo, hi


def bootstrap_ratio_ci(
    numerators: Sequence[float],
    denominators: Sequence[float],
    alpha: float = 0.05,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(ratio, lo, hi): sum(numerators) / sum(denominators) and its cluster-bootstrap interval.

    For pooled per-token figures (top-1 agreement, mean KL, prefix agreement, bypass ratio)
    whose independent unit is the prompt: unit i contributes numerators[i] (e.g. matching
    tokens) over denominators[i] (its tokens), and whole units are resampled, so tokens of
    one prompt are never treated as independent draws. Every denominator must be > 0.
    """
    num = _finite_array(numerators, "numerators")
    den = _finite_array(denominators, "denominators")
    _same_length(num, den, "numerators", "denominators")
    if (den <= 0).any():
        bad = int(np.flatnonzero(den <= 0)[0])
        raise HarnessInputError(f"denominators[{bad}] is {den[bad]}; every unit needs a positive count")

    def ratio(rows: np.ndarray) -> np.ndarray:
        idx = rows.astype(np.int64)
        return num[idx].sum(axis=1) / den[idx].sum(axis=1)

    lo, hi = _bootstrap_interval(np.arange(num.size, dtype=np.float64), ratio, alpha, n_resamples, seed)
    return float(num.sum() / den.sum()), lo, hi


def wilson_interval(successes: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (sound near 0 and 1, unlike Wald)."""
    for name, value in (("successes", successes), ("n", n)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise HarnessInputError(f"{name} must be an integer, got {value!r}")
    if n <= 0:
        raise HarnessInputError(f"n must be positive, got {n}")
    if not 0 <= successes <= n:
        raise HarnessInputError(f"successes must be in [0, n={n}], got {successes}")
    z = statistics.NormalDist().inv_cdf(1 - _alpha(alpha) / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # Exact bounds at the edges; the formula leaves ~1e-17 of rounding there.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def permutation_mean_greater_p(candidate: Sequence[float], reference: Sequence[float], permutations: int = 20_000,
                               seed: int = 0) -> float:
    """One-sided permutation p-value that ``candidate``'s mean exceeds ``reference``'s: the share of
    random relabellings of the pooled values whose candidate-minus-reference mean difference is at
    least the observed one, add-one smoothed (never 0; with 1 candidate value among 5 it cannot go
    below 1/5). Exact in its assumptions for any sample sizes, so it suits 4 prompts against 49."""
    a = _finite_array(candidate, "candidate")
    b = _finite_array(reference, "reference")
    if isinstance(permutations, bool) or not isinstance(permutations, (int, np.integer)) or permutations < 1:
        raise HarnessInputError(f"permutations must be a positive integer, got {permutations!r}")
    pooled = np.concatenate([a, b])
    observed = a.mean() - b.mean()
    rng = np.random.default_rng(seed)
    # a random subset of len(a) positions per relabelling; drawn in chunks to bound memory
    diffs = []
    chunk = max(1, _MAX_DRAWS_PER_CHUNK // len(pooled))
    for start in range(0, permutations, chunk):
        k = min(chunk, permutations - start)
        pick = np.argsort(rng.random((k, len(pooled))), axis=1)[:, : len(a)]
        cand_means = pooled[pick].mean(1)
        diffs.append(cand_means - (pooled.sum() - cand_means * len(a)) / len(b))
    diffs = np.concatenate(diffs)
    return float((1 + np.sum(diffs >= observed - 1e-12)) / (permutations + 1))


def sign_test_greater_p(above: int, n: int) -> float:
    """One-sided sign test: P(at least ``above`` of ``n`` fair coin flips come up heads), the chance
    that one side beats the other in ``above`` or more of ``n`` paired comparisons if neither is
    better. With 4 comparisons it cannot go below 1/16."""
    for name, v in (("above", above), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise HarnessInputError(f"{name} must be a non-negative integer, got {v!r}")
    if above > n:
        raise HarnessInputError(f"above must be at most n, got {above} of {n}")
    return sum(math.comb(n, j) for j in range(above, n + 1)) / 2 ** n
