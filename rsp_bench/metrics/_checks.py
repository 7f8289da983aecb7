"""Input checks shared by the metric modules of ``rsp_bench.metrics``.

Every metric rejects bad input with a HarnessInputError naming the bad value; these are
the checks more than one metric module needs (finite 1-D arrays, equal lengths, alpha).

Must NOT import any other ``rsp_bench.metrics`` module (they all import this one), nor
transformers, the reference engine, or any rsp_bench module other than rsp_bench.errors.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from rsp_bench.errors import HarnessInputError


def _finite_array(values: Any, name: str, *, allow_empty: bool = False) -> np.ndarray:
    """1-D float64 copy of ``values``; rejects NaN/inf because they poison every mean."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    if isinstance(values, (str, bytes)):
        raise HarnessInputError(f"{name} must be a sequence of numbers, got the string {values!r}")
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise HarnessInputError(f"{name} must be a sequence of numbers, got {values!r:.200}") from exc
    if arr.ndim != 1:
        raise HarnessInputError(f"{name} must be one-dimensional, got shape {tuple(arr.shape)}")
    if arr.size == 0 and not allow_empty:
        raise HarnessInputError(f"{name} is empty; the statistic is undefined without samples")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise HarnessInputError(f"{name}[{bad[0]}] is {arr[bad[0]]}; every value must be finite")
    return arr


def _same_length(a: Sequence[Any], b: Sequence[Any], name_a: str, name_b: str) -> None:
    if len(a) != len(b):
        raise HarnessInputError(
            f"{name_a} has {len(a)} items but {name_b} has {len(b)}; they are compared pair by pair"
        )


def _alpha(alpha: float) -> float:
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha < 1.0):
        raise HarnessInputError(f"alpha must be in (0, 1), got {alpha!r}")
    return float(alpha)
