"""The quality and speed budgets: suites/budgets.toml read and checked (``load_budgets``), the
bounds that apply to one configuration (``budget_for``), and a row's violations of them
(``check_budget``), including bounds that were never applied or could not fail on the set.

The suites judge each row they measure with these; ``rsp_bench.quality`` measures, this module
judges. Must NOT import torch, pytest, the reference engine or rsp_bench.quality at run time
(``MetricValue`` is an annotation here).
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

from rsp_bench.errors import HarnessInputError

if TYPE_CHECKING:
    from rsp_bench.engines import ConfigSpec
    from rsp_bench.quality import MetricValue

__all__ = ["Budget", "VARIANT_MODES", "load_budgets", "budget_for", "worst_possible", "check_budget"]


@dataclass(frozen=True)
class Budget:
    """One bound: ``metric`` must be >= ``bound`` (kind "min") or <= ``bound`` (kind "max")."""

    metric: str
    kind: str
    bound: float
    source: str

    def violated_by(self, value: float) -> bool:
        return value < self.bound if self.kind == "min" else value > self.bound

    def describe(self) -> str:
        return f"{self.metric} {'>=' if self.kind == 'min' else '<='} {self.bound:g} ({self.source})"


def _parse_bounds(table: Any, where: str, metric_names: frozenset[str]) -> dict[str, Budget]:
    bounds: dict[str, Budget] = {}
    for key, value in table.items():
        metric, _, kind = key.rpartition("_")
        if kind not in ("min", "max") or metric not in metric_names:
            raise HarnessInputError(
                f"{where}: unknown key {key!r} (expected <metric>_min or <metric>_max with a metric the "
                f"suites record, e.g. top1_agreement_min)")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise HarnessInputError(f"{where}.{key}: expected a finite number, got {value!r}")
        bounds[metric + "_" + kind] = Budget(metric, kind, float(value), f"{where}.{key}")
    return bounds


# Modes whose sub-tables are named by a configuration variant (the last part of the config id,
# e.g. the llama-cpp rung "q8_0" of llama-cpp/q8_0) instead of by a sensitivity.
VARIANT_MODES = ("quant",)
_VARIANT_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def load_budgets(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a budgets TOML file (suites/budgets.toml); unknown keys are errors.

    Layout: a table per mode (``[off]``, ``[lossless]``, ``[lossy]``; ``[lossy_block]`` for the
    block router's comparison rows, ``reference/lossy/s=0.50/router=block``). Bounds written in the
    mode table hold for every sensitivity; a sub-table named by a sensitivity
    (``[lossy."0.50"]``) adds or overrides bounds for that sensitivity only. The ``[quant]``
    mode (llama-cpp rungs) is named by variant instead: ``[quant."q8_0"]`` holds the bounds of
    ``llama-cpp/q8_0``. Keys are
    ``<metric>_min`` / ``<metric>_max`` for metrics the suites record.
    Returns ``{mode: {"all": {key: Budget}, "by_sensitivity": {float: {key: Budget}}}}``.
    """
    from rsp_bench.records import KNOWN_METRICS

    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HarnessInputError(f"budget file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise HarnessInputError(f"cannot read budget file {path}: {exc}") from None
    budgets: dict[str, Any] = {}
    for mode, table in data.items():
        if not isinstance(table, dict):
            raise HarnessInputError(f"{path}: top-level key {mode!r} must be a table of a mode, got {table!r}")
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        entry: dict[str, Any] = {"all": _parse_bounds(scalars, f"{path}: [{mode}]", KNOWN_METRICS),
                                 "by_sensitivity": {}}
        entry["by_variant"] = {}
        for key, sub in table.items():
            if not isinstance(sub, dict):
                continue
            where = f"{path}: [{mode}.\"{key}\"]"
            if mode in VARIANT_MODES:
                if not _VARIANT_NAME.match(key):
                    raise HarnessInputError(f"{where} must be named by a configuration variant such as a llama-cpp "
                                            f"rung (lower case, e.g. \"q8_0\"), got {key!r}")
                entry["by_variant"][key] = _parse_bounds(sub, where, KNOWN_METRICS)
                continue
            try:
                s = float(key)
            except ValueError:
                s = math.nan
            if not (0.0 <= s <= 1.0):
                raise HarnessInputError(f"{path}: [{mode}.{key!r}] must be named by a sensitivity in [0, 1]")
            entry["by_sensitivity"][s] = _parse_bounds(sub, where, KNOWN_METRICS)
        budgets[mode] = entry
    return budgets


def budget_for(budgets: Mapping[str, Any], spec: ConfigSpec) -> list[Budget] | None:
    """The bounds that apply to ``spec`` (its mode, then its sensitivity's overrides), or
    None when the file says nothing about that mode / sensitivity."""
    router = spec.params.get("router") if spec.params else None
    # a comparison row of another router has its own tables: [lossy_block], [lossy_block."0.50"]
    entry = budgets.get(spec.mode if router is None else f"{spec.mode}_{router}")
    if entry is None:
        return None
    bounds = dict(entry["all"])
    specific = None
    if spec.mode in VARIANT_MODES:
        # llama-cpp/q8_0 -> "q8_0": a quantized rung is judged by its own bounds, and a rung
        # the file does not name has none (its figures are recorded, and the gate still runs).
        variant = spec.config_id.rsplit("/", 1)[-1]
        specific = entry.get("by_variant", {}).get(variant)
        if specific is None:
            return None
        bounds.update(specific)
        return list(bounds.values()) or None
    if spec.sensitivity is not None:
        specific = next((b for s, b in entry["by_sensitivity"].items() if abs(s - spec.sensitivity) < 1e-9), None)
        if specific is not None:
            bounds.update(specific)
    if not bounds or (entry["by_sensitivity"] and specific is None and not entry["all"]):
        return None
    return list(bounds.values())


def worst_possible(metric: str, kind: str, values: Mapping[str, MetricValue]) -> float | None:
    """The value of ``metric`` that the worst output for a ``kind`` bound would score on this
    set: for a ``min`` bound the lowest value any output can reach, for ``max`` the highest.
    None where the metric is unbounded that way (KL, perplexity ratio) or unknown here.

    A delta (pruned minus unpruned) can only fall to minus the unpruned score, and rise to one
    minus it; the unpruned score is the pruned score minus the delta, both measured here.
    """
    if metric.endswith("_delta"):
        score, delta = values.get(metric[: -len("_delta")]), values.get(metric)
        if score is None or delta is None:
            return None
        unpruned = score.value - delta.value
        return -unpruned if kind == "min" else 1.0 - unpruned
    mv = values.get(metric)
    if mv is None or mv.unit != "fraction":
        return None
    return 0.0 if kind == "min" else 1.0


def check_budget(values: Mapping[str, MetricValue], bounds: Sequence[Budget],
                 measured: Collection[str] | None = None) -> list[str]:
    """Human-readable violations of ``bounds`` by ``values``.

    Each suite checks the metrics it measured: a bound on a metric absent from ``values`` is
    skipped, unless the caller names it in ``measured`` (the metrics this suite always records
    for this row), where an absent metric is a violation: a bound that is never applied judges
    nothing. A bound that no output could break on this set (a delta bound at or below minus
    the unpruned score, say) is itself a violation, for the same reason.

    A timing ratio (``rsp_bench.baselines.metric_scope`` "machine") with an interval breaks a
    ``min`` bound only when its whole 95% interval lies below it, and a ``max`` bound when the
    whole interval lies above: on a noisy machine a speed floor fails on a decided shortfall,
    not on a point estimate that noise pushed under it."""
    from rsp_bench.baselines import metric_scope

    failures = []
    for b in bounds:
        mv = values.get(b.metric)
        if mv is None:
            if measured is not None and b.metric in measured:
                failures.append(f"{b.describe()} was not applied: this row records no {b.metric} "
                                "(drop the bound, or record the metric)")
            continue
        worst = worst_possible(b.metric, b.kind, values)
        timing = metric_scope(b.metric) == "machine" and mv.ci is not None
        judged = (mv.ci[1] if b.kind == "min" else mv.ci[0]) if timing else mv.value
        if worst is not None and not b.violated_by(worst):
            failures.append(f"{b.describe()} cannot fail on this set: the worst possible output scores {worst:.4g} "
                            "(tighten the bound, or drop it and say why in the budget file)")
        elif b.violated_by(judged):
            ci = f" (95% CI {mv.ci[0]:.4g}..{mv.ci[1]:.4g}, n={mv.n})" if mv.ci else f" (n={mv.n})"
            whole = ", the whole interval beyond it" if timing else ""
            failures.append(f"{b.metric} = {mv.value:.4g}{ci} breaks {b.describe()}{whole}")
    return failures