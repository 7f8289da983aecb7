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

Layout: this module is the command line (``configure_tune_parser``, ``run_tune``) and
re-exports every name of rsp_bench.tuning, where the parts live (recommendation: the knee
and the margin; table: tune.csv; report: tune.md, tune.png, write_outputs; sweep: the
settings and the measuring). Nothing in rsp_bench.tuning imports this module.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Callable

from rsp_bench.tuning.recommendation import (  # noqa: F401  (re-exported)
    DEFAULT_MARGIN,
    MAX_MARGIN,
    _BUDGET_SLACK,
    Recommendation,
    TuneRow,
    _check_budget,
    _check_curve,
    _check_margin,
    budget_cap_index,
    effective_speedup,
    find_knee,
    recommend,
    relative_quality,
    utility,
)
from rsp_bench.tuning.report import (  # noqa: F401  (re-exported)
    _ci,
    render_plot_png,
    table_markdown,
    write_outputs,
)
from rsp_bench.tuning.sweep import (  # noqa: F401  (re-exported)
    ANCHOR,
    FULL,
    METRICS,
    QUICK,
    TuneSettings,
    _interleaved,
    _log,
    _spec,
    _speed_figures,
    _sweep_extraction,
    _sweep_top1,
    _timing,
    run_sweep,
    sweep_sensitivities,
)
from rsp_bench.tuning.table import (  # noqa: F401  (re-exported)
    CSV_COLUMNS,
    _FROM_TABLE,
    _NEEDED,
    _fmt,
    read_table,
    recommend_from_table,
    recommend_table,
    table_csv,
)

__all__ = [
    "METRICS", "TuneSettings", "TuneRow", "Recommendation", "QUICK", "FULL", "sweep_sensitivities",
    "relative_quality", "utility", "budget_cap_index", "find_knee", "recommend", "recommend_from_table",
    "read_table", "recommend_table", "effective_speedup", "table_csv", "table_markdown", "render_plot_png",
    "write_outputs", "run_sweep",
    "configure_tune_parser", "run_tune",
]


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
