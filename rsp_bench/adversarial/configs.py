"""Pruning configuration strategies: valid configurations, per-request overrides, invalid ones.

Must NOT import torch or the engine (``reference_engine``), nor the other
``rsp_bench.adversarial`` modules.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

__all__ = ["valid_pruning_configs", "pruning_overrides", "invalid_pruning_configs", "LOG_LEVELS", "MODES",
           "CONFIG_FIELDS"]


LOG_LEVELS: tuple[str, ...] = ("NONE", "SUMMARY", "DETAILED")
MODES: tuple[str, ...] = ("off", "lossy")
CONFIG_FIELDS: tuple[str, ...] = ("sensitivity", "layer_blacklist", "log_level", "mode")

# The edges and their neighbours: 0 disables pruning, 1 is the most aggressive, and the
# smallest positive floats probe "is 0 special-cased, or compared with tolerance?".
_SENSITIVITY_EDGES = (0.0, 1.0, 0.5, 5e-324, 2.2250738585072014e-308, 1e-12, 1e-6,
                      math.nextafter(1.0, 0.0), math.nextafter(0.0, 1.0))


def _sensitivities() -> SearchStrategy[float]:
    return st.one_of(st.sampled_from(_SENSITIVITY_EDGES), st.floats(0.0, 1.0, allow_nan=False))


def _blacklists(n_layers: int | None) -> SearchStrategy[tuple[int, ...]]:
    # Unknown depth: 0 and 1 are valid for every model with two or more blocks.
    top = 1 if n_layers is None else n_layers - 1
    return st.lists(st.integers(0, top), unique=True, max_size=min(top + 1, 8)).map(tuple)


def _check_layers(n_layers: Any, allow_none: bool) -> None:
    if n_layers is None and allow_none:
        return
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 2:
        raise ValueError(f"n_layers must be an int >= 2, got {n_layers!r}")


def valid_pruning_configs(
    n_layers: int | None = None, modes: Sequence[str] = MODES
) -> SearchStrategy[dict[str, Any]]:
    """Dicts with keys ``sensitivity`` (edges 0.0, 1.0, tiny values, floats in [0, 1]),
    ``layer_blacklist`` (tuple of distinct ints in range), ``log_level`` (NONE, SUMMARY,
    DETAILED) and ``mode`` (``modes``, default off and lossy).

    ``n_layers=None`` keeps blacklist indices to 0 and 1, valid for any model with at least
    two blocks; pass the model's block count to cover the whole range.
    """
    _check_layers(n_layers, allow_none=True)
    return st.fixed_dictionaries({
        "sensitivity": _sensitivities(),
        "layer_blacklist": _blacklists(n_layers),
        "log_level": st.sampled_from(LOG_LEVELS),
        "mode": st.sampled_from(tuple(modes)),
    })


def pruning_overrides(
    n_layers: int | None = None, modes: Sequence[str] = MODES
) -> SearchStrategy[dict[str, Any]]:
    """Per-request overrides: any subset (possibly empty) of a valid configuration's keys."""
    _check_layers(n_layers, allow_none=True)
    return st.fixed_dictionaries({}, optional={
        "sensitivity": _sensitivities(),
        "layer_blacklist": _blacklists(n_layers),
        "log_level": st.sampled_from(LOG_LEVELS),
        "mode": st.sampled_from(tuple(modes)),
    })


def _bad_values(n_layers: int) -> dict[str, SearchStrategy[Any]]:
    # Only values no reasonable reading accepts: no None (may mean "default"), no bools,
    # no lower-case level names (an engine may accept them), no "lossless" (a planned mode).
    return {
        "sensitivity": st.one_of(
            st.floats(max_value=-1e-12, allow_nan=False, allow_infinity=False),
            st.floats(min_value=math.nextafter(1.0, 2.0), allow_nan=False, allow_infinity=False),
            st.sampled_from((math.nan, math.inf, -math.inf, -1.0, 1.5, "0.5", "high")),
        ),
        "layer_blacklist": st.one_of(
            st.integers(n_layers, n_layers + 1000).map(lambda i: (i,)),
            st.integers(-1000, -1).map(lambda i: (0, i)),
            st.sampled_from(((1.5,), ("a",), (0, "1"), (0.0,), (math.nan,))),
        ),
        "log_level": st.sampled_from(("VERBOSE", "DEBUG", "", "ALL", "INFO", 2)),
        "mode": st.sampled_from(("turbo", "", "aggressive", "lossy ", "pruned", 1)),
    }


@st.composite
def _invalid(draw: Any, n_layers: int, modes: tuple[str, ...]) -> tuple[dict[str, Any], str]:
    config = draw(valid_pruning_configs(n_layers, modes))
    field = draw(st.sampled_from(CONFIG_FIELDS))
    config[field] = draw(_bad_values(n_layers)[field])
    return config, field


def invalid_pruning_configs(
    n_layers: int, modes: Sequence[str] = MODES
) -> SearchStrategy[tuple[dict[str, Any], str]]:
    """``(config, bad_field)``: a valid configuration with exactly one field made invalid.

    Bad values: sensitivity below 0, above 1, NaN, +-inf or a string; a blacklist index
    equal to or above ``n_layers``, negative (no Python-style -1), or not an int (1.5, "a",
    0.0, NaN); an unknown log level or mode (strings and ints). The engine must raise its
    documented configuration error naming ``bad_field``, never run.
    """
    _check_layers(n_layers, allow_none=False)
    return _invalid(n_layers, tuple(modes))
