"""Leaderboard: tables and a quality-versus-speed plot rebuilt from run records.

One row per model x engine x configuration; for each such key the newest record that
has it wins (creation time, then run id), so a partial run updates only what it ran.
Every row names the run it came from (``record`` column), so every figure traces to a
record; figures a record lacks are shown as "—". Projected figures are labelled
"projected" in every header: they are modelled from datasheet profiles, not measured.

Outputs (all written atomically through ``rsp_bench.storage``, byte-for-byte identical
when rebuilt from the same records: no timestamps, no paths, fixed plot size, dpi,
style and PNG metadata): ``leaderboard.md`` (GitHub tables), ``leaderboard.html`` and
``quality_vs_speed.png``. Also holds the ``rsp-bench leaderboard`` CLI glue, and
re-exports the ``rsp-bench baseline`` glue that ``rsp_bench.baselines`` owns.

Must NOT import torch, transformers or reference_engine; matplotlib is imported only
when the plot is drawn, and never through pyplot (no global backend or figure state).
"""

from __future__ import annotations

import argparse
import html
import io
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from tabulate import tabulate

from rsp_bench.baselines import configure_baseline_parser, run_baseline
from rsp_bench.errors import HarnessInputError
from rsp_bench.records import latest_records, record_sort_key, validate_record
from rsp_bench.storage import atomic_write_bytes, atomic_write_text

__all__ = [
    "COLUMNS",
    "MISSING",
    "leaderboard_entries",
    "build_leaderboard",
    "render_markdown",
    "render_html",
    "render_plot_png",
    "write_leaderboard",
    "configure_leaderboard_parser",
    "run_leaderboard",
    "configure_baseline_parser",
    "run_baseline",
]

MISSING = "—"
# Profiles shown in the table; H200 figures stay in the records (the table is wide already).
TABLE_PROFILES = ("V100", "A100", "H100")


def _fixed(digits: int) -> Callable[[float], str]:
    return lambda v: f"{v:.{digits}f}"


def _signed(digits: int) -> Callable[[float], str]:
    return lambda v: f"{v:+.{digits}f}"


def _times(v: float) -> str:
    return f"{v:.2f}×"


def _thousands(v: float) -> str:
    return f"{v:,.0f}"


# (header, metric name, formatter): the one list the tables are made from.
COLUMNS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("exact match", "exact_match_rate", _fixed(3)),
    ("top-1 agreement", "top1_agreement", _fixed(3)),
    ("KL mean (nats)", "kl_mean", _fixed(4)),
    ("SQuAD F1 Δ", "squad_f1_delta", _signed(3)),
    ("JSON-field F1 Δ", "json_field_f1_delta", _signed(3)),
    ("bypass ratio", "bypass_ratio", _fixed(3)),
    ("measured CPU speed-up", "speedup_vs_off", _times),
    *((f"projected tok/s {p}", f"projected_tokens_per_s_{p}", _thousands) for p in TABLE_PROFILES),
    *((f"projected idle {p}", f"projected_idle_fraction_{p}", _fixed(3)) for p in TABLE_PROFILES),
    ("degradation FP rate", "degradation_false_positive_rate", _fixed(3)),
    ("degradation detection", "degradation_detection_rate", _fixed(3)),
)
KEY_HEADERS = ("model", "engine", "config")
RECORD_HEADER = "record"


def _as_records(records_dir_or_records: str | os.PathLike[str] | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(records_dir_or_records, (str, os.PathLike)):
        return latest_records(records_dir_or_records)
    records = [dict(r) for r in records_dir_or_records]
    for record in records:
        validate_record(record, source=f"run record {record.get('run_id')!r}")
    return records


def leaderboard_entries(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The winning (record, configuration) per model x engine x configuration, sorted by that key.

    Each entry: ``{"model", "engine", "config", "run_id", "quick", "metrics"}`` with the
    raw metric objects, for callers (the plot) that need numbers rather than text.
    """
    winners: dict[tuple[str, str, str], tuple[Any, Mapping[str, Any], Mapping[str, Any]]] = {}
    for record in records:
        order = record_sort_key(record)
        for config_id, config in record["configurations"].items():
            key = (record["model"]["name"], config["engine"], config_id)
            if key not in winners or order > winners[key][0]:
                winners[key] = (order, record, config)
    entries = []
    for key in sorted(winners):
        _, record, config = winners[key]
        entries.append({
            "model": key[0], "engine": key[1], "config": key[2],
            "run_id": record["run_id"], "quick": record["quick"], "metrics": config["metrics"],
        })
    return entries


def build_leaderboard(records: list[dict]) -> list[dict]:
    """Display rows (header -> text) of the leaderboard, in a deterministic order."""
    rows = []
    for entry in leaderboard_entries(records):
        row = {"model": entry["model"], "engine": entry["engine"], "config": entry["config"]}
        for header, metric, fmt in COLUMNS:
            found = entry["metrics"].get(metric)
            row[header] = fmt(found["value"]) if found is not None else MISSING
        # A quick run's quality figures come from a small fixed subset: say so beside them.
        row[RECORD_HEADER] = entry["run_id"] + (" (quick)" if entry["quick"] else "")
        rows.append(row)
    return rows


def _headers() -> list[str]:
    return [*KEY_HEADERS, *(c[0] for c in COLUMNS), RECORD_HEADER]


def _table(rows: Sequence[Mapping[str, str]], tablefmt: str) -> str:
    headers = _headers()
    body = [[row[h] for h in headers] for row in rows]
    # disable_numparse keeps our formatting ("0.910", "+0.000") instead of tabulate's.
    return tabulate(body, headers=headers, tablefmt=tablefmt, disable_numparse=True)


def _sources_line(records: Sequence[Mapping[str, Any]]) -> str:
    ids = sorted({r["run_id"] for r in records})
    return f"Built from {len(ids)} run record(s): {', '.join(ids) if ids else 'none'}."


_NOTE = (
    "Measured figures come from the run named in the record column, on that run's machine "
    "(speed-up: pruned vs pruning off, interleaved in one process). Columns marked projected are "
    "modelled from datasheet GPU profiles (rsp_bench.profiles), not measured. "
    f"{MISSING} means the record has no such figure. (quick) marks a run on the small CI subset."
)


def render_markdown(rows: Sequence[Mapping[str, str]], records: Sequence[Mapping[str, Any]], plot_name: str) -> str:
    """The ``leaderboard.md`` text."""
    return (
        "# rsp-bench leaderboard\n\n"
        f"{_NOTE}\n\n{_sources_line(records)}\n\n"
        f"{_table(rows, 'github')}\n\n"
        f"![top-1 agreement vs measured speed-up]({plot_name})\n"
    )


def render_html(rows: Sequence[Mapping[str, str]], records: Sequence[Mapping[str, Any]], plot_name: str) -> str:
    """The ``leaderboard.html`` text: tabulate's (escaped) HTML table in a minimal page."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<title>rsp-bench leaderboard</title>\n"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:90%}"
        "th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}"
        "th{background:#f3f3f3}td:nth-child(-n+3){text-align:left}</style>\n"
        "</head>\n<body>\n<h1>rsp-bench leaderboard</h1>\n"
        f"<p>{html.escape(_NOTE)}</p>\n<p>{html.escape(_sources_line(records))}</p>\n"
        f"{_table(rows, 'html')}\n"
        f"<p><img src=\"{html.escape(plot_name)}\" alt=\"top-1 agreement vs measured speed-up\"></p>\n"
        "</body>\n</html>\n"
    )


def render_plot_png(entries: Sequence[Mapping[str, Any]]) -> bytes:
    """Quality (top-1 agreement) against measured speed-up, one labelled point per configuration.

    Deterministic bytes: matplotlib's default style (not the user's matplotlibrc), fixed
    size and dpi, and no "Software" text chunk in the PNG.
    """
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points = [
        (e["metrics"]["speedup_vs_off"]["value"], e["metrics"]["top1_agreement"]["value"], e)
        for e in entries
        if "speedup_vs_off" in e["metrics"] and "top1_agreement" in e["metrics"]
    ]
    several_models = len({e["model"] for e in entries}) > 1
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(8, 5.5), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        if points:
            xs = [p[0] for p in points]
            ys = [p[1] for p in points]
            ax.scatter(xs, ys, s=28, color="tab:blue", zorder=3)
            for x, y, e in points:
                label = f"{e['model']}: {e['config']}" if several_models else e["config"]
                # "$" would switch matplotlib to mathtext and fail on an odd model name.
                label = label.replace("$", r"\$")
                ax.annotate(label, (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7)
            ax.axvline(1.0, color="grey", linestyle="--", linewidth=0.8, zorder=1)
            # Labels hang to the upper right of their point; leave room so none is cut off.
            ax.margins(x=0.25, y=0.1)
        else:
            ax.text(0.5, 0.5, "no configuration has both figures", ha="center", va="center",
                    transform=ax.transAxes)
        ax.set_xlabel("measured speed-up vs pruning off (×, CPU, interleaved)")
        ax.set_ylabel("teacher-forced top-1 agreement")
        ax.set_title("rsp-bench: quality vs speed")
        ax.grid(True, linewidth=0.4, alpha=0.5)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return buffer.getvalue()


def write_leaderboard(
    records_dir_or_records: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    out_dir: str | os.PathLike[str],
) -> dict[str, Path]:
    """Write ``leaderboard.md``, ``leaderboard.html`` and ``quality_vs_speed.png`` into ``out_dir``.

    ``records_dir_or_records`` is a results folder (its ``runs/`` are read) or the
    records themselves. Returns ``{"md": ..., "html": ..., "png": ...}``.
    """
    records = _as_records(records_dir_or_records)
    rows = build_leaderboard(records)
    out = Path(out_dir)
    plot_name = "quality_vs_speed.png"
    # The plot first: if drawing fails, no table points at a missing or stale picture.
    png = atomic_write_bytes(out / plot_name, render_plot_png(leaderboard_entries(records)))
    md = atomic_write_text(out / "leaderboard.md", render_markdown(rows, records, plot_name))
    page = atomic_write_text(out / "leaderboard.html", render_html(rows, records, plot_name))
    return {"md": md, "html": page, "png": png}


# --------------------------------------------------------------------------- CLI glue


def configure_leaderboard_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``rsp-bench leaderboard``."""
    p.add_argument("--results", metavar="DIR", default="results",
                   help="results folder whose runs/ hold the records (default: results)")
    p.add_argument("--out", metavar="DIR", help="where to write the tables and plot (default: the results folder)")


def run_leaderboard(args: argparse.Namespace) -> int:
    """Rebuild the leaderboard from the records and print the markdown table."""
    records = latest_records(args.results)
    if not records:
        raise HarnessInputError(
            f"{Path(args.results) / 'runs'}: no run records to build a leaderboard from (run `rsp-bench run` first)"
        )
    paths = write_leaderboard(records, args.out or args.results)
    print(_table(build_leaderboard(records), "github"))
    for path in paths.values():
        print(f"wrote {path}", file=sys.stderr)
    return 0
