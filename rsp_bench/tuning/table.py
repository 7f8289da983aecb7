"""tune.csv, the table one sweep leaves: written (``table_csv``, floats with repr so they
read back as the same numbers) and read back (``read_table``, checked, errors naming the
line), and the recommendation recomputed from it (``recommend_from_table``).

Must NOT import pytest, torch, transformers, the engine, or rsp_bench.tuning.report /
.sweep: the standard library, rsp_bench.errors and .recommendation alone.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from rsp_bench.errors import HarnessInputError
from rsp_bench.tuning.recommendation import (
    DEFAULT_MARGIN,
    Recommendation,
    TuneRow,
    _check_curve,
    budget_cap_index,
    effective_speedup,
    recommend,
    relative_quality,
    utility,
)

CSV_COLUMNS = ("sensitivity", "metric", "quality", "quality_lo", "quality_hi", "quality_n",
               "speedup", "speedup_lo", "speedup_hi", "speedup_pairs", "decode_tokens_per_s",
               "bypass_ratio", "budget", "relative_quality", "utility", "within_budget")
# Columns the recommendation is computed from; the rest are for the reader.
_NEEDED = ("sensitivity", "metric", "quality", "speedup", "speedup_lo", "speedup_hi", "budget")



def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back as the same float
    return str(value)


def table_csv(rows: Sequence[TuneRow]) -> str:
    """tune.csv: one line per sensitivity, CSV_COLUMNS in order."""
    rec_inputs = ([r.sensitivity for r in rows], [r.quality for r in rows], [r.speedup for r in rows])
    _check_curve(*rec_inputs)
    q_rel = relative_quality(rec_inputs[1])
    u = utility(rec_inputs[1], effective_speedup(rec_inputs[2], [r.speedup_lo for r in rows],
                                                 [r.speedup_hi for r in rows]))
    budget = rows[0].budget
    cap = budget_cap_index(rec_inputs[1], budget)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for i, r in enumerate(rows):
        writer.writerow([_fmt(v) for v in (
            float(r.sensitivity), r.metric, float(r.quality), float(r.quality_lo), float(r.quality_hi), int(r.quality_n),
            float(r.speedup), float(r.speedup_lo), float(r.speedup_hi), int(r.speedup_pairs),
            float(r.decode_tokens_per_s), float(r.bypass_ratio), None if budget is None else float(budget),
            q_rel[i], u[i], i <= cap)])
    return buffer.getvalue()


def read_table(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The columns the recommendation needs from a tune.csv, checked; errors name the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HarnessInputError(f"tuning table {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessInputError(f"cannot read tuning table {path}: {exc}") from None
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in _NEEDED if c not in (reader.fieldnames or [])]
    if missing:
        raise HarnessInputError(f"{path} is not a tune.csv: no column(s) {', '.join(missing)} "
                                f"(header: {reader.fieldnames!r})")
    sens, quality, speed, lo, hi, metrics, budgets = [], [], [], [], [], set(), set()
    for lineno, row in enumerate(reader, start=2):
        try:
            sens.append(float(row["sensitivity"]))
            quality.append(float(row["quality"]))
            speed.append(float(row["speedup"]))
            lo.append(float(row["speedup_lo"]))
            hi.append(float(row["speedup_hi"]))
        except (TypeError, ValueError):
            raise HarnessInputError(
                f"{path}:{lineno}: sensitivity, quality, speedup, speedup_lo and speedup_hi must be numbers, got "
                f"{[row.get(c) for c in ('sensitivity', 'quality', 'speedup', 'speedup_lo', 'speedup_hi')]!r}") from None
        metrics.add(row["metric"])
        budgets.add(row["budget"] or "")
    if len(metrics) > 1 or len(budgets) > 1:
        raise HarnessInputError(f"{path} mixes metrics {sorted(metrics)} or budgets {sorted(budgets)}: one sweep per table")
    raw_budget = budgets.pop() if budgets else ""
    try:
        budget = float(raw_budget) if raw_budget else None
    except ValueError:
        raise HarnessInputError(f"{path}: budget must be a number or empty, got {raw_budget!r}") from None
    _check_curve(sens, quality, speed)
    effective_speedup(speed, lo, hi)  # checks the bounds
    return {"sensitivity": sens, "quality": quality, "speedup": speed, "speedup_lo": lo, "speedup_hi": hi,
            "metric": metrics.pop() if metrics else "", "budget": budget}


def recommend_table(table: Mapping[str, Any], margin: float, budget: float | None) -> Recommendation:
    """``recommend`` on what ``read_table`` returned."""
    return recommend(table["sensitivity"], table["quality"], table["speedup"], margin, budget,
                     table["speedup_lo"], table["speedup_hi"])


_FROM_TABLE: Any = object()


def recommend_from_table(path: str | os.PathLike[str], margin: float = DEFAULT_MARGIN,
                         budget: float | None = _FROM_TABLE) -> float:
    """The recommended sensitivity, recomputed from a saved tune.csv.

    ``budget`` defaults to the one the sweep used (its ``budget`` column); pass a number, or
    None for no budget, to ask what another budget would have given on the same curve.
    """
    table = read_table(path)
    chosen = table["budget"] if budget is _FROM_TABLE else budget
    return recommend_table(table, margin, chosen).sensitivity
