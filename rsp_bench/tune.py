"""``rsp-bench tune``: sweep the sensitivity, measure quality and speed at each step, and
recommend the sensitivity to run in production.

    rsp-bench tune [--model PATH] [--metric top1_agreement|squad_f1|json_field_f1] [--budget X]
                   [--margin M] [--steps N] [--quick | --full] [--out DIR]
                   [--items N] [--max-new-tokens N] [--threads N]
    rsp-bench tune --from-table results/tune/tune.csv [--margin M] [--budget X]   # no model

What one sweep measures (sensitivities evenly spaced over [0, 1], 0 included):
  quality   ``--metric`` at each sensitivity on a fixed subset, with its 95% bootstrap CI:
            top1_agreement (default): teacher-forced top-1 agreement with the unpruned model on
            its own greedy continuation of the equivalence prompts (pooled over tokens, CI by a
            cluster bootstrap over prompts); squad_f1: SQuAD F1 of the answers; json_field_f1:
            mean per-document field F1. All through rsp_bench.quality / rsp_bench.metrics.
  speed     decode speed-up over pruning off, measured on the *same requests*, interleaved in
            one process: round i of an rsp_bench.speed.InterleavedBench runs item i under every
            sensitivity in rotated order, each call timed by the engine's own step times
            (``decode_step_times_s``); speed-up = median over rounds of off's median step time
            / the configuration's (metrics.interleaved_speedup, bootstrap CI over rounds), plus
            decode tokens/s and the bypass ratio of those calls. For top1_agreement the timed
            steps are the teacher-forced decode steps (same decode_step, router and bypass as
            generation; no sampling), for the extraction metrics the generation itself.
Sensitivity 0 *is* pruning off (``PruningConfig``: 0 disables pruning), so the s=0 row is the
reference: its speed-up is 1 by definition and its top-1 agreement is 1. Every configuration
pins the hardware watermark to 0 (rsp_bench.engines.pruning_config), so the curve does not
depend on who else is using the machine while it is measured.

The recommendation (``recommend``; the same function reads a saved table, so
``recommend_from_table(tune.csv, margin)`` reproduces it exactly):
  Q(s) = quality(s) / quality(0)      relative quality (1 at pruning off)
  V(s) = speed-up(s)                  relative speed (1 at pruning off), except that a speed-up
      whose 95% CI contains 1 counts as exactly 1: timing noise must not move the knee (nor
      make a weekly recommendation flip), while the quality figures are deterministic (fixed
      subset, watermark pinned) and are used as measured
  budget cap: with ``--budget X``, the sweep is cut before the first sensitivity whose quality
      dropped by more than X (absolute: quality(0) - quality(s) > X; top-1 agreement >= 1 - X).
      A later sensitivity that happens to recover is not considered: the curve is noisy and a
      budget is a promise about every setting up to the chosen one.
  knee: the smallest s* of the (capped) sweep that maximises U(s) = Q(s) + V(s). Then every
      earlier point gains more speed than it loses quality on the way to s* (U rises to it),
      and from s* to any later point the quality lost is at least the speed gained:
      Q(s*) - Q(s) >= V(s) - V(s*). In words, s* is the point after which quality falls
      faster than speed rises. The global maximum is used rather than the first local one so
      that one noisy step does not stop the search.
  recommended sensitivity = max(0, s* - margin), rounded to 4 decimals: the safety margin
      (default 0.05; 0.05..0.1 is the sensible range) keeps production off the knee itself,
      where the next step's quality loss begins.
When the knee is s=0, pruning does not pay on this model and machine (no measurable speed-up
is worth its quality loss): the recommendation is 0 (off), and tune says so.

Files written to ``--out`` (default results/tune), each atomically (rsp_bench.storage):
  tune.csv  one row per sensitivity: the measured figures and the derived Q, U and budget flag
            (floats written with repr, so reading them back gives the same numbers)
  tune.md   the same table for humans, the settings, knee and recommendation
  tune.png  quality and speed-up against sensitivity with their CIs, knee and recommendation
            (matplotlib Agg, default style, no Software/date metadata: deterministic bytes)

Default (quick) cost, in decode steps of the model at batch 1: 8 equivalence prompts x 16
tokens generated once unpruned (128 steps), then teacher-forced under 6 sensitivities (768
steps): about 900 steps plus 56 prefills and the model load, on one torch thread (``--threads``).
On the embedded model that is about a minute on an idle 2-core machine (DESIGN.md: ~35 ms per
step). Measured on this shared machine: the default took 3.2 min wall (99 CPU s) at load 4-5;
24 tokens per prompt (1,350 steps, two threads) took 17 min at load 7-8, hence 16.
``--full``: 11 sensitivities, 48 prompts x 64 tokens (about 37,000 steps: a dedicated runner).

Must NOT import pytest; torch, transformers and the engine are imported only by a sweep (not
by ``recommend`` / ``recommend_from_table``, which need the standard library alone), so
``--from-table`` and the tests of the recommendation run without a model.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rsp_bench.errors import HarnessInputError

__all__ = [
    "METRICS", "TuneSettings", "TuneRow", "Recommendation", "QUICK", "FULL", "sweep_sensitivities",
    "relative_quality", "utility", "budget_cap_index", "find_knee", "recommend", "recommend_from_table",
    "read_table", "recommend_table", "effective_speedup", "table_csv", "table_markdown", "render_plot_png",
    "write_outputs", "run_sweep",
    "configure_tune_parser", "run_tune",
]

METRICS = ("top1_agreement", "squad_f1", "json_field_f1")
CSV_COLUMNS = ("sensitivity", "metric", "quality", "quality_lo", "quality_hi", "quality_n",
               "speedup", "speedup_lo", "speedup_hi", "speedup_pairs", "decode_tokens_per_s",
               "bypass_ratio", "budget", "relative_quality", "utility", "within_budget")
# Columns the recommendation is computed from; the rest are for the reader.
_NEEDED = ("sensitivity", "metric", "quality", "speedup", "speedup_lo", "speedup_hi", "budget")
DEFAULT_MARGIN = 0.05
MAX_MARGIN = 0.5
# Quality read back from a table must not fail a budget by float noise (1 - 0.95 > 0.05).
_BUDGET_SLACK = 1e-9


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class TuneSettings:
    """How big one sweep is: sensitivities, and per quality metric the items (prompts,
    questions, documents: also the interleaved speed rounds) and new tokens per item."""

    steps: int
    items: Mapping[str, int]
    max_new_tokens: Mapping[str, int]
    name: str


QUICK = TuneSettings(steps=6, items={"top1_agreement": 8, "squad_f1": 12, "json_field_f1": 6},
                     max_new_tokens={"top1_agreement": 16, "squad_f1": 16, "json_field_f1": 64}, name="quick")
FULL = TuneSettings(steps=11, items={"top1_agreement": 48, "squad_f1": 100, "json_field_f1": 60},
                    max_new_tokens={"top1_agreement": 64, "squad_f1": 16, "json_field_f1": 64}, name="full")


def sweep_sensitivities(steps: int) -> list[float]:
    """``steps`` evenly spaced sensitivities from 0 to 1 inclusive, rounded to 4 decimals."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 3:
        raise HarnessInputError(f"--steps must be an integer >= 3 (0, something between, 1), got {steps!r}")
    return [round(i / (steps - 1), 4) for i in range(steps)]


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


def _ci(lo: float, hi: float) -> str:
    return f"[{lo:.3f}, {hi:.3f}]"


def table_markdown(rows: Sequence[TuneRow], rec: Recommendation, meta: Mapping[str, Any]) -> str:
    """tune.md: settings, the curve and the recommendation, for a person or a CI summary."""
    from tabulate import tabulate

    body = []
    for i, r in enumerate(rows):
        mark = " ← knee" if i == rec.knee_index else ""
        body.append([f"{r.sensitivity:g}{mark}", f"{r.quality:.4f} {_ci(r.quality_lo, r.quality_hi)}",
                     f"{rec.relative_quality[i]:.4f}", f"{r.speedup:.3f} {_ci(r.speedup_lo, r.speedup_hi)}",
                     f"{r.decode_tokens_per_s:.1f}", f"{r.bypass_ratio:.3f}", f"{rec.utility[i]:.4f}",
                     "yes" if i <= rec.cap_index else "no"])
    headers = ["sensitivity", f"{rows[0].metric} [95% CI]", "Q (rel.)", "speed-up [95% CI]", "decode tok/s",
               "bypass", "U = Q + V", "within budget"]
    lines = [
        f"# rsp-bench tune: {meta.get('model', '?')}",
        "",
        f"**Recommended sensitivity: {rec.sensitivity:g}** ({rec.explain()}).",
        "",
        f"Metric `{rows[0].metric}` on {rows[0].quality_n} {meta.get('unit', 'items')}; speed-up measured "
        f"interleaved against pruning off ({meta.get('speed', '')}); budget: "
        f"{'none' if rec.budget is None else f'quality drop <= {rec.budget:g}'}; margin {rec.margin:g}; "
        f"setting {meta.get('setting', '?')}; wall time {meta.get('wall_s', 0.0):.0f} s; machine: {meta.get('machine', '?')}.",
        "",
        tabulate(body, headers=headers, tablefmt="github", disable_numparse=True),
        "",
        "Knee: the smallest sensitivity maximising U = Q + V (Q: quality relative to pruning off, V: speed-up, "
        "counted as 1 where its 95% CI contains 1); after it, quality falls faster than speed rises. Recommendation: knee minus the margin, within the budget "
        "(rsp_bench/tune.py). Reproduce it from the table:",
        "",
        "    python -c \"from rsp_bench.tune import recommend_from_table as r; "
        f"print(r('tune.csv', {rec.margin!r}))\"",
        "",
    ]
    return "\n".join(lines)


def render_plot_png(rows: Sequence[TuneRow], rec: Recommendation, title: str) -> bytes:
    """Quality and speed-up against sensitivity, with CIs, knee and recommendation (PNG bytes).

    Deterministic bytes: matplotlib's default style, fixed size and dpi, no Software chunk.
    """
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    xs = [r.sensitivity for r in rows]
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(7.5, 6.5), dpi=100)
        FigureCanvasAgg(fig)
        axq, axv = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2, sharex=None)
        q = [r.quality for r in rows]
        axq.errorbar(xs, q, yerr=[[max(0.0, a - r.quality_lo) for a, r in zip(q, rows)],
                                  [max(0.0, r.quality_hi - a) for a, r in zip(q, rows)]],
                     marker="o", color="tab:blue", capsize=3)
        if rec.budget is not None:
            axq.axhline(rows[0].quality - rec.budget, color="tab:red", linestyle=":", linewidth=1,
                        label=f"budget: drop <= {rec.budget:g}")
        v = [r.speedup for r in rows]
        axv.errorbar(xs, v, yerr=[[max(0.0, a - r.speedup_lo) for a, r in zip(v, rows)],
                                  [max(0.0, r.speedup_hi - a) for a, r in zip(v, rows)]],
                     marker="s", color="tab:green", capsize=3)
        axv.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
        for ax in (axq, axv):
            ax.axvline(rec.knee, color="tab:orange", linestyle="--", linewidth=1, label=f"knee {rec.knee:g}")
            ax.axvline(rec.sensitivity, color="black", linewidth=1.2, label=f"recommended {rec.sensitivity:g}")
            ax.set_xlim(-0.03, 1.03)
            ax.grid(True, linewidth=0.4, alpha=0.5)
        axq.set_ylabel(f"{rows[0].metric} (95% CI)")
        axv.set_ylabel("decode speed-up vs off (×, interleaved)")
        axv.set_xlabel("sensitivity")
        axq.legend(fontsize=8, loc="lower left")
        axq.set_title(title.replace("$", r"\$"), fontsize=10)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return buffer.getvalue()


def write_outputs(rows: Sequence[TuneRow], out_dir: str | os.PathLike[str], margin: float,
                  meta: Mapping[str, Any]) -> tuple[Recommendation, dict[str, Path]]:
    """Write tune.csv, then recommend *from the written file* (so the printed recommendation is
    the table's by construction), then tune.md and tune.png."""
    from rsp_bench.storage import atomic_write_bytes, atomic_write_text

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise HarnessInputError(f"--out {str(out)!r} exists and is not a folder")
    csv_path = atomic_write_text(out / "tune.csv", table_csv(rows))
    table = read_table(csv_path)
    rec = recommend_table(table, margin, table["budget"])
    md_path = atomic_write_text(out / "tune.md", table_markdown(rows, rec, meta))
    title = f"{meta.get('model', '')}: {rows[0].metric} and speed-up vs sensitivity ({meta.get('setting', '')})"
    png_path = atomic_write_bytes(out / "tune.png", render_plot_png(rows, rec, title))
    return rec, {"csv": csv_path, "md": md_path, "png": png_path}


# --------------------------------------------------------------------------- measuring


def _log(message: str) -> None:
    print(f"[tune] {message}", file=sys.stderr, flush=True)


def _spec(s: float) -> Any:
    from rsp_bench.engines import ConfigSpec, format_config_id, pruning_config

    if s == 0.0:  # sensitivity 0 disables pruning: it is the "off" configuration
        return ConfigSpec("reference/off", "reference", "off", None, {}, pruning_config("off"))
    return ConfigSpec(format_config_id("reference", "lossy", s), "reference", "lossy", s, {},
                      pruning_config("lossy", s))


def _timing(stats: Mapping[str, Any], tokens: int, what: str) -> Any:
    """A CallTiming from the engine's own stats of one request (rsp_bench.speed's convention:
    ttft = prefill_time_s, one step time per decode step)."""
    from rsp_bench.speed import CallTiming

    missing = [k for k in ("prefill_time_s", "decode_step_times_s") if k not in stats]
    if missing:
        raise HarnessInputError(f"engine stats lack {missing}: tune times the engine by its own stats")
    counts = None
    if all(k in stats for k in ("layers_bypassed", "total_tokens", "blocks")):
        counts = [(int(stats["layers_bypassed"]), int(stats["total_tokens"]), int(stats["blocks"]))]
    return CallTiming(ttft_s=float(stats["prefill_time_s"]), step_times_s=[float(t) for t in stats["decode_step_times_s"]],
                      batch=1, new_tokens=tokens, method=f"engine stats ({what})", bypass_counts=counts)


# The speed anchor: pruning off, run in every round beside the sensitivities, so that every row,
# s=0 included, is a measured ratio (s=0 against the anchor is an A/A ratio: the noise floor).
ANCHOR = "anchor-off"


def _interleaved(sensitivities: Sequence[float], n: int, run_one: Callable[[float | None, int], Any],
                 progress: Callable[[str], None]) -> Any:
    """One InterleavedBench whose round i runs item i under every sensitivity and the anchor,
    in rotated order; ``run_one(s, i)`` does the work (``s`` None: the anchor, whose outputs
    are not kept), keeps what quality needs and returns the CallTiming."""
    from rsp_bench.speed import InterleavedBench

    def make(s: float | None) -> Callable[[], Any]:
        counter = iter(range(n))  # each configuration runs exactly once per round
        return lambda: run_one(s, next(counter))

    configs = {ANCHOR: make(None)}
    configs.update({f"s={s:.4f}": make(s) for s in sensitivities})
    bench = InterleavedBench(configs)
    for i in range(n):
        bench.run_round()
        progress(f"item {i + 1}/{n} done under all {len(sensitivities)} sensitivities")
    return bench


def _speed_figures(bench: Any, sensitivities: Sequence[float]) -> dict[float, dict[str, Any]]:
    """Speed-up of each sensitivity over the pruning-off anchor (pairs: the rounds), tokens/s
    and bypass ratio."""
    from rsp_bench import metrics as m

    out: dict[float, dict[str, Any]] = {}
    for s in sensitivities:
        name = f"s={s:.4f}"
        counts = [c for t in bench.samples(name) for c in (t.bypass_counts or [])]
        ratio = m.bypass_ratio(sum(c[0] for c in counts), counts[0][2], sum(c[1] for c in counts)) if counts else 0.0
        sp = bench.speedup(ANCHOR, name)
        out[s] = {"speedup": sp["ratio"], "lo": sp["lo"], "hi": sp["hi"], "pairs": int(sp["pairs"]),
                  "tokens_per_s": bench.summary(name)["decode_tokens_per_s"], "bypass_ratio": ratio}
    return out


def _sweep_top1(engine: Any, sensitivities: Sequence[float], n: int, max_new: int,
                progress: Callable[[str], None]) -> tuple[dict[float, tuple[float, float, float, int]], Any]:
    """Teacher-forced top-1 agreement, and the speed of the same teacher-forced decode steps."""
    from rsp_bench import datasets as ds
    from rsp_bench import metrics as m
    from rsp_bench.engines import ReferenceAdapter
    from rsp_bench.quality import ReferenceOutputs

    adapter = ReferenceAdapter(engine)
    prompts = [p.text for p in ds.quick_subset(ds.load_prompts(), n)]
    progress(f"reference: {len(prompts)} prompts x {max_new} tokens generated unpruned")
    reference = ReferenceOutputs(adapter, _spec(0.0)).get("tune", prompts, max_new)
    lengths = [len(r.token_ids) for r in reference]
    if min(lengths) < 1:
        raise HarnessInputError("an unpruned reference continuation is empty; use other prompts")
    logits: dict[float, list[Any]] = {s: [None] * n for s in sensitivities}
    specs = {s: _spec(s) for s in sensitivities}

    def run_one(s: float | None, i: int) -> Any:
        ref = reference[i]
        got, stats = adapter.teacher_forced_logits(ref.prompt_ids, ref.token_ids, specs[0.0 if s is None else s])
        if s is not None:
            logits[s][i] = got
        return _timing(stats, len(ref.token_ids), "teacher-forced decode steps")

    progress(f"teacher forcing the reference under {len(sensitivities)} sensitivities, interleaved")
    bench = _interleaved(sensitivities, n, run_one, progress)
    ref_logits = logits[0.0]  # sensitivity 0 is pruning off: these are the reference logits
    quality = {}
    for s in sensitivities:
        matches = [float(m.top1_matches(r, c).sum()) for r, c in zip(ref_logits, logits[s])]
        _, lo, hi = m.bootstrap_ratio_ci(matches, lengths)
        quality[s] = (m.top1_agreement(ref_logits, logits[s]), lo, hi, sum(lengths))
    return quality, bench


def _sweep_extraction(engine: Any, metric: str, sensitivities: Sequence[float], n: int, max_new: int,
                      progress: Callable[[str], None]) -> tuple[dict[float, tuple[float, float, float, int]], Any]:
    """SQuAD F1 or JSON field F1 (rsp_bench.quality.extraction_metrics), and the speed of the
    same generations."""
    from rsp_bench import datasets as ds
    from rsp_bench.engines import ReferenceAdapter
    from rsp_bench.quality import extraction_metrics, extraction_prompts

    adapter = ReferenceAdapter(engine)
    squad = ds.quick_subset(ds.load_squad(), n) if metric == "squad_f1" else []
    docs = ds.quick_subset(ds.load_structured(), n) if metric == "json_field_f1" else []
    squad_prompts, json_prompts = extraction_prompts(squad, docs)
    prompts = squad_prompts or json_prompts
    outputs: dict[float, dict[str, Any]] = {s: {} for s in sensitivities}
    specs = {s: _spec(s) for s in sensitivities}

    def run_one(s: float | None, i: int) -> Any:
        [out] = adapter.generate([prompts[i]], max_new, specs[0.0 if s is None else s])
        if s is not None:
            outputs[s][prompts[i]] = out
        return _timing(out.stats, len(out.token_ids), "generation")

    progress(f"{metric}: {n} items x {max_new} tokens under {len(sensitivities)} sensitivities, interleaved")
    bench = _interleaved(sensitivities, len(prompts), run_one, progress)
    quality = {}
    for s in sensitivities:
        answers = {"squad": [outputs[s][p] for p in squad_prompts], "json": [outputs[s][p] for p in json_prompts]}
        mv = extraction_metrics(None, specs[s], squad, docs, None, max_new, answers=answers)[metric]
        lo, hi = mv.ci if mv.ci is not None else (mv.value, mv.value)
        quality[s] = (mv.value, lo, hi, mv.n)
    return quality, bench


def run_sweep(engine: Any, metric: str, settings: TuneSettings, budget: float | None = None,
              steps: int | None = None, items: int | None = None, max_new_tokens: int | None = None,
              progress: Callable[[str], None] = _log) -> list[TuneRow]:
    """Measure quality and speed at each sensitivity of the sweep; return the curve.

    Round i of one interleaved bench runs item i (a prompt, question or document) under every
    sensitivity in rotated order (rsp_bench.speed.InterleavedBench); each call's output feeds
    the quality figure and its engine-timed decode steps the speed figure, so both come from
    the same requests and the speed-up pairs are neighbours in time.
    """
    if metric not in METRICS:
        raise HarnessInputError(f"--metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if budget is not None:
        _check_budget(budget)
    sens = sweep_sensitivities(settings.steps if steps is None else steps)
    n = settings.items[metric] if items is None else items
    max_new = settings.max_new_tokens[metric] if max_new_tokens is None else max_new_tokens
    # Two items at least, so that there are speed-up pairs to bootstrap; two tokens at least,
    # so that every call has a decode step to time.
    for name, v in (("--items", n), ("--max-new-tokens", max_new)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            raise HarnessInputError(f"{name} must be an integer >= 2, got {v!r}")
    if metric == "top1_agreement":
        quality, bench = _sweep_top1(engine, sens, n, max_new, progress)
    else:
        quality, bench = _sweep_extraction(engine, metric, sens, n, max_new, progress)
    speed = _speed_figures(bench, sens)
    return [TuneRow(sensitivity=s, metric=metric, quality=quality[s][0], quality_lo=quality[s][1],
                    quality_hi=quality[s][2], quality_n=quality[s][3], speedup=speed[s]["speedup"],
                    speedup_lo=speed[s]["lo"], speedup_hi=speed[s]["hi"], speedup_pairs=speed[s]["pairs"],
                    decode_tokens_per_s=speed[s]["tokens_per_s"], bypass_ratio=speed[s]["bypass_ratio"],
                    budget=budget) for s in sens]


# --------------------------------------------------------------------------- CLI


def _unit_float(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{name} must be finite, got {text!r}")
        return value
    return parse


def _int_arg(name: str, minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be >= {minimum}, got {value}")
        return value
    return parse


def configure_tune_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="local Llama-family folder or .gguf (default: the embedded model)")
    p.add_argument("--metric", default="top1_agreement", choices=METRICS,
                   help="quality measured at each sensitivity (default top1_agreement)")
    p.add_argument("--budget", type=_unit_float("--budget"), default=None,
                   help="quality drop allowed, absolute (e.g. 0.1: top-1 agreement >= 0.9); default: none")
    p.add_argument("--margin", type=_unit_float("--margin"), default=DEFAULT_MARGIN,
                   help=f"safety margin subtracted from the knee (default {DEFAULT_MARGIN}; 0.05..0.1 is sensible)")
    p.add_argument("--steps", type=_int_arg("--steps", 3), default=None,
                   help=f"sensitivities from 0 to 1 (default {QUICK.steps} quick, {FULL.steps} full)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="full", action="store_false", help="small fixed subset (the default)")
    size.add_argument("--full", dest="full", action="store_true", help="larger subset, more steps and rounds")
    p.set_defaults(full=False)
    p.add_argument("--items", type=_int_arg("--items", 2), default=None,
                   help="prompts / questions / documents per sensitivity, also the speed rounds "
                        "(default: per metric and setting)")
    p.add_argument("--max-new-tokens", type=_int_arg("--max-new-tokens", 2), default=None,
                   help="new tokens per item (default: per metric)")
    p.add_argument("--threads", type=_int_arg("--threads", 0), default=1,
                   help="torch threads (default 1; 0 keeps torch's default). Batch-1 decode is bound by "
                        "memory bandwidth, so a second thread gains little on two cores and costs a lot "
                        "when the cores are shared; speed-ups are ratios measured at the same setting")
    p.add_argument("--out", default=os.path.join("results", "tune"), help="folder for tune.csv, tune.md, tune.png")
    p.add_argument("--from-table", default=None, metavar="CSV",
                   help="recompute the recommendation from a saved tune.csv (no model, no measuring)")


def run_tune(args: argparse.Namespace) -> int:
    margin = _check_margin(args.margin)
    if args.budget is not None:
        _check_budget(args.budget)
    if args.from_table:
        table = read_table(args.from_table)
        budget = args.budget if args.budget is not None else table["budget"]
        rec = recommend_table(table, margin, budget)
        print(rec.explain())
        print(f"recommended sensitivity: {rec.sensitivity:g}")
        return 0
    settings = FULL if args.full else QUICK
    t0 = time.monotonic()
    import torch

    from reference_engine import Engine

    if args.threads:
        torch.set_num_threads(args.threads)

    from rsp_bench.records import machine_info

    engine = Engine.load(args.model, progress=_log)
    _log(f"model {engine.name} loaded in {time.monotonic() - t0:.1f} s")
    rows = run_sweep(engine, args.metric, settings, args.budget, args.steps, args.items, args.max_new_tokens)
    wall = time.monotonic() - t0
    machine = machine_info()
    meta = {"model": engine.name, "setting": settings.name, "wall_s": wall,
            "unit": {"top1_agreement": "teacher-forced tokens", "squad_f1": "questions",
                     "json_field_f1": "documents"}[args.metric],
            "speed": f"engine-timed decode steps of the same requests, {rows[-1].speedup_pairs} interleaved "
                     "rounds (one item each), batch 1",
            "machine": f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores"}
    rec, paths = write_outputs(rows, args.out, margin, meta)
    from tabulate import tabulate

    print(tabulate([[f"{r.sensitivity:g}", f"{r.quality:.4f} {_ci(r.quality_lo, r.quality_hi)}",
                     f"{r.speedup:.3f} {_ci(r.speedup_lo, r.speedup_hi)}", f"{r.bypass_ratio:.3f}",
                     f"{rec.utility[i]:.4f}"] for i, r in enumerate(rows)],
                   headers=["sensitivity", args.metric, "speed-up", "bypass", "U = Q + V"], disable_numparse=True))
    print(rec.explain())
    if rec.knee > 0 and rec.effective_speedup[rec.knee_index] <= 1.0:
        print("warning: the knee comes from a quality figure above pruning off's, not from a measured "
              "speed-up: on a small subset that is chance; measure with --full or more --items")
    print(f"recommended sensitivity: {rec.sensitivity:g}")
    print(f"table: {paths['csv']}, {paths['md']}; plot: {paths['png']}; wall time {wall:.0f} s")
    return 0
