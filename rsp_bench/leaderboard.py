"""Leaderboard: the board that ranks engines and configurations, rebuilt from run records.

One section per model x machine x prompt set (quick or full), because a ratio measured on one
machine, or a quality figure on one prompt set, says nothing next to another's. In a section,
one row per engine and configuration (the reference in each mode, the static baselines,
hf-generate, each llama-cpp rung, ...), the newest record that has it winning. Every row is
compared with one anchor, ``reference/off`` *of the run the row came from*: quality figures are
measured against its outputs, and the speed-up is the interleaved ratio to it (A B A B in one
process; for hf-generate the inverse of reference/off's measured ratio over it, marked
"derived"). Rows are ranked by that speed-up; "exact" marks a configuration whose greedy output
equalled reference/off on every prompt (exact match 1.000, F1 deltas 0); "Pareto" marks one no
other row beats on both measured speed-up and top-1 agreement.

Under the table: a Pareto plot of top-1 agreement against measured speed-up (log x, exact
configurations marked), and a short "what changed" list between the newest record of the
section and the one before it. Projected GPU figures (modelled from datasheet profiles, not
measured) go in their own table, as do the protective-degradation rates. Records drawn on other
prompt subsets (``--rsp-subset-seed``) are left out and counted. When the results folder holds
``router_curve*.json`` files (`rsp-bench router-curve`, one per held-out prompt set), or its
records hold the full run's router-curve suite, the unit router's curves against static and
random removal at equal bytes close the board (``rsp_bench.router_curve``; those configurations
have no row in the main table).

Outputs (written atomically through ``rsp_bench.storage``, byte for byte identical when rebuilt
from the same records: no timestamps, no paths, fixed plot size, dpi, style and PNG metadata):
``leaderboard.md``, ``leaderboard.html`` and ``quality_vs_speed.png`` (drawn by
``rsp_bench.leaderboard_plot``). Also holds the ``rsp-bench leaderboard`` CLI glue. Rows whose
record ran other engine code than the board's newest record are marked stale.

Must NOT import torch, transformers or reference_engine, nor matplotlib (the plot module
imports it when it draws).
"""

from __future__ import annotations

import argparse
import html
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from tabulate import tabulate

from rsp_bench.errors import HarnessInputError
from rsp_bench.leaderboard_plot import Panel, Point, render_panels_png
from rsp_bench.profiles import PROFILES
from rsp_bench.records import latest_records, record_sort_key, validate_record
from rsp_bench.router_curve import CURVE_MODES, record_curves
from rsp_bench.router_curve import curve_note, curve_rows, curve_speed_note, curve_speed_rows, curve_title, load_curves
from rsp_bench.router_curve import HEADERS as CURVE_HEADERS
from rsp_bench.router_curve import SPEED_HEADERS as CURVE_SPEED_HEADERS
from rsp_bench.storage import atomic_write_bytes, atomic_write_text

__all__ = [
    "ANCHOR", "COLUMNS", "PROJECTED_COLUMNS", "DEGRADATION_COLUMNS", "MISSING", "Entry", "Section",
    "sections", "leaderboard_entries", "build_leaderboard", "pareto_front", "what_changed",
    "render_markdown", "render_html", "render_plot_png", "write_leaderboard",
    "configure_leaderboard_parser", "run_leaderboard",
]

MISSING = "—"
ANCHOR = "reference/off"
PLOT_NAME = "quality_vs_speed.png"
MAX_CHANGES = 12  # lines of the "what changed" list per section; the rest are counted


def _fixed(digits: int) -> Callable[[float], str]:
    return lambda v: f"{v:.{digits}f}"


def _signed(digits: int) -> Callable[[float], str]:
    return lambda v: f"{v:+.{digits}f}"


def _thousands(v: float) -> str:
    return f"{v:,.0f}"


# (header, metric, formatter, show CI): the quality columns of the main table.
COLUMNS: tuple[tuple[str, str, Callable[[float], str], bool], ...] = (
    ("exact match", "exact_match_rate", _fixed(3), False),
    ("top-1 agreement", "top1_agreement", _fixed(3), False),
    ("KL mean (nats)", "kl_mean", _fixed(4), False),
    ("SQuAD F1 Δ", "squad_f1_delta", _signed(3), True),
    ("JSON-field F1 Δ", "json_field_f1_delta", _signed(3), True),
)
# A configuration with none of these has no row in the main table (only side figures).
_MAIN_METRICS = (*(c[1] for c in COLUMNS), "speedup_vs_off", "decode_tokens_per_s")
SPEEDUP_HEADER = f"measured speed-up vs {ANCHOR}"
TOKS_HEADER = "decode tok/s (measured)"
MAIN_HEADERS = ("rank", "engine", "configuration", "exact", *(c[0] for c in COLUMNS), SPEEDUP_HEADER,
                TOKS_HEADER, "Pareto", "record")
PROJECTED_COLUMNS: tuple[tuple[str, str, Callable[[float], str], bool], ...] = (
    *((f"projected tok/s {p}", f"projected_tokens_per_s_{p}", _thousands, False) for p in PROFILES),
    *((f"projected idle {p}", f"projected_idle_fraction_{p}", _fixed(3), False) for p in PROFILES),
)
DEGRADATION_COLUMNS: tuple[tuple[str, str, Callable[[float], str], bool], ...] = (
    ("false-positive rate (benign prompts)", "degradation_false_positive_rate", _fixed(3), False),
    ("detection rate (adversarial prompts)", "degradation_detection_rate", _fixed(3), False),
    ("false alarms, held-out normal corpus", "degradation_false_positive_rate_heldout_normal", _fixed(3), False),
    ("false alarms, user prompts", "degradation_false_positive_rate_user_prompts", _fixed(3), False),
    ("detection, tuning machine-text classes", "degradation_detection_rate_tuning_classes", _fixed(3), False),
    ("detection, held-out machine-text classes", "degradation_detection_rate_heldout_classes", _fixed(3), False),
)


@dataclass
class Entry:
    """One row: the configuration as the newest record of its section holds it.

    ``speedup``: (value, ci or None, how) with how "measured" (interleaved with the anchor),
    "anchor" (reference/off itself) or "derived" (hf-generate: 1 / reference/off's measured
    ratio over it); None when the run timed nothing.
    """

    config: str
    engine: str
    mode: str
    run_id: str
    partial: bool
    metrics: Mapping[str, Any]
    speedup: tuple[float, tuple[float, float] | None, str] | None
    exact: bool | None
    stale: bool = False  # its record ran other engine code than the board's newest record

    def value(self, metric: str) -> float | None:
        m = self.metrics.get(metric)
        return None if m is None else float(m["value"])


@dataclass
class Section:
    """A model on one machine on one prompt set: the rows that may share a ratio column."""

    model: str
    machine: Mapping[str, Any]
    quick: bool
    records: list[dict[str, Any]]  # newest first
    entries: list[Entry] = field(default_factory=list)

    @property
    def title(self) -> str:
        m = self.machine
        gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
        return (f"{self.model} on machine {m['fingerprint']} ({m['cpu']}, {m['cores']} cores{gpu}), "
                f"{'quick' if self.quick else 'full'} prompt set")


# --------------------------------------------------------------------------- rows


def _as_records(records_dir_or_records: str | os.PathLike[str] | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(records_dir_or_records, (str, os.PathLike)):
        return latest_records(records_dir_or_records)
    records = [dict(r) for r in records_dir_or_records]
    for record in records:
        validate_record(record, source=f"run record {record.get('run_id')!r}")
    return records


def _subset_seed(record: Mapping[str, Any]) -> int:
    seed = record.get("extra", {}).get("subset_seed", 0)
    return seed if isinstance(seed, int) else -1


def _speedup(config_id: str, config: Mapping[str, Any], record: Mapping[str, Any]):
    metrics = config["metrics"]
    m = metrics.get("speedup_vs_off")
    if m is not None:
        return float(m["value"]), (tuple(m["ci"]) if m.get("ci") else None), "measured"
    anchor = record["configurations"].get(ANCHOR, {}).get("metrics", {})
    if config_id == ANCHOR and "decode_tokens_per_s" in metrics:
        return 1.0, None, "anchor"
    over_hf = anchor.get("speedup_vs_hf_generate")
    if config["engine"] == "hf-generate" and over_hf is not None and over_hf["value"] > 0:
        ci = over_hf.get("ci")
        inv_ci = (1.0 / ci[1], 1.0 / ci[0]) if ci and ci[0] > 0 and ci[1] > 0 else None
        return 1.0 / float(over_hf["value"]), inv_ci, "derived"
    return None


def _engine_code(record: Mapping[str, Any]) -> tuple[str | None, str | None]:
    return record.get("extra", {}).get("code_digest"), record.get("git_commit")


def _same_engine_code(a: tuple[str | None, str | None], b: tuple[str | None, str | None]) -> bool:
    """Two records ran the same engine code: the same code digest where both carry one, else
    (older records carry none) the same commit, which is stricter than it needs to be; where
    they carry neither in common there is nothing to tell them apart by, and they count as same."""
    if a[0] and b[0]:
        return a[0] == b[0]
    if a[1] and b[1]:
        return a[1] == b[1]
    return True


def _exact(metrics: Mapping[str, Any]) -> bool | None:
    if "exact_match_rate" not in metrics:
        return None
    if metrics["exact_match_rate"]["value"] != 1.0:
        return False
    return all(metrics[d]["value"] == 0.0 for d in ("squad_f1_delta", "json_field_f1_delta") if d in metrics)


def _rank_key(e: Entry) -> tuple:
    sp = e.speedup[0] if e.speedup else None
    top1 = e.value("top1_agreement")
    return (sp is None, -(sp or 0.0), top1 is None, -(top1 or 0.0), e.config)


def sections(records: Iterable[Mapping[str, Any]]) -> tuple[list[Section], int]:
    """The board's sections, sorted, each with its ranked rows; and how many records were left
    out because they were drawn on another prompt subset (``--rsp-subset-seed``)."""
    grouped: dict[tuple[str, str, bool], list[dict[str, Any]]] = {}
    machines: dict[tuple[str, str, bool], Mapping[str, Any]] = {}
    left_out = 0
    records = list(records)
    kept = [r for r in records if _subset_seed(r) == 0]
    newest = _engine_code(max(kept, key=record_sort_key)) if kept else (None, None)
    for record in records:
        if _subset_seed(record) != 0:
            left_out += 1
            continue
        key = (record["model"]["name"], record["machine"]["fingerprint"], bool(record["quick"]))
        grouped.setdefault(key, []).append(dict(record))
    out = []
    for key in sorted(grouped, key=lambda k: (k[0], k[1], not k[2])):
        recs = sorted(grouped[key], key=record_sort_key, reverse=True)
        machines[key] = recs[0]["machine"]
        section = Section(key[0], machines[key], key[2], recs)
        # Newest first: the first record holding a configuration's main figures wins; one that
        # holds only side figures (say, degradation rates) wins only where no record has more.
        chosen: dict[str, tuple[int, dict[str, Any]]] = {}
        for rank, record in enumerate(recs):
            for config_id, config in record["configurations"].items():
                if not config["metrics"] or config["mode"] in CURVE_MODES:
                    continue  # the router curve's points have their own tables (record_curves)
                main = any(k in config["metrics"] for k in _MAIN_METRICS)
                held = chosen.get(config_id)
                if held is None or (main and not any(k in held[1]["metrics"] for k in _MAIN_METRICS)):
                    chosen[config_id] = (rank, config)
        seen: set[str] = set()
        for rank, record in enumerate(recs):
            for config_id, config in record["configurations"].items():
                if config_id in seen or chosen.get(config_id, (None,))[0] != rank:
                    continue
                seen.add(config_id)
                section.entries.append(Entry(
                    config_id, config["engine"], config["mode"], record["run_id"],
                    bool(record.get("extra", {}).get("partial")), config["metrics"],
                    _speedup(config_id, config, record), _exact(config["metrics"]),
                    not _same_engine_code(_engine_code(record), newest)))
        section.entries.sort(key=_rank_key)
        if section.entries:  # a record of the router curve alone has nothing for the main table
            out.append(section)
    return out, left_out


def leaderboard_entries(records: Iterable[Mapping[str, Any]]) -> list[Entry]:
    """Every row of every section, in board order."""
    return [e for s in sections(records)[0] for e in s.entries]


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates (>= on both axes, > on one), both
    axes higher-is-better; ties are all kept."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i):
            front.append(i)
    return front


def _plotted(section: Section) -> list[tuple[float, float, Entry]]:
    return [(e.speedup[0], e.value("top1_agreement"), e) for e in section.entries
            if e.speedup is not None and e.speedup[0] > 0 and e.value("top1_agreement") is not None]


def _cell(m: Mapping[str, Any] | None, fmt: Callable[[float], str], with_ci: bool) -> str:
    if m is None:
        return MISSING
    text = fmt(m["value"])
    if with_ci and m.get("ci"):
        text += f" [{fmt(m['ci'][0])}, {fmt(m['ci'][1])}]"
    return text


def _speed_cell(sp: tuple[float, tuple[float, float] | None, str] | None) -> str:
    if sp is None:
        return MISSING
    value, ci, how = sp
    text = f"{value:.2f}×"
    if ci:
        text += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    return text + {"measured": "", "anchor": " (anchor)", "derived": " (derived)"}[how]


def _record_cell(e: Entry, quick: bool) -> str:
    return e.run_id + (" (partial)" if e.partial else "") + (" (stale)" if e.stale else "")


def build_leaderboard(records: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Display rows (header -> text) of every section's main table, in board order, each with
    a ``section`` key naming its section."""
    rows = []
    for section in sections(records)[0]:
        rows.extend(_main_rows(section))
    return rows


def _main_rows(section: Section) -> list[dict[str, str]]:
    plotted = _plotted(section)
    front = {id(plotted[i][2]) for i in pareto_front([(x, y) for x, y, _ in plotted])}
    rows, rank = [], 0
    for e in section.entries:
        if not any(m in e.metrics for m in _MAIN_METRICS):
            continue  # only side figures (load test, degradation): their own tables hold them
        row = {"section": section.title}
        if e.speedup is not None:
            rank += 1
        row["rank"] = str(rank) if e.speedup is not None else MISSING
        row["engine"], row["configuration"] = e.engine, e.config
        row["exact"] = {True: "yes", False: "no", None: MISSING}[e.exact]
        for header, metric, fmt, with_ci in COLUMNS:
            row[header] = _cell(e.metrics.get(metric), fmt, with_ci)
        row[SPEEDUP_HEADER] = _speed_cell(e.speedup)
        row[TOKS_HEADER] = _cell(e.metrics.get("decode_tokens_per_s"), _fixed(1), False)
        row["Pareto"] = "★" if id(e) in front else ""
        row["record"] = _record_cell(e, section.quick)
        rows.append(row)
    return rows


def _side_rows(section: Section, columns) -> list[list[str]]:
    rows = []
    for e in sorted(section.entries, key=lambda e: e.config):
        if not any(metric in e.metrics for _, metric, _, _ in columns):
            continue
        rows.append([e.config, *(_cell(e.metrics.get(m), fmt, ci) for _, m, fmt, ci in columns), e.run_id])
    return rows


# --------------------------------------------------------------------------- what changed


_CHANGE_METRICS = (*((h, m, f) for h, m, f, _ in COLUMNS), ("speed-up", "speedup_vs_off", lambda v: f"{v:.2f}×"),
                   ("decode tok/s", "decode_tokens_per_s", _fixed(1)))


def what_changed(section: Section) -> list[str]:
    """Differences between the newest record of ``section`` and the one before it, as short
    lines (figures compared as the board prints them); empty when there is no previous record."""
    if len(section.records) < 2:
        return []
    new, old = section.records[0], section.records[1]
    lines = [f"{new['run_id']} against {old['run_id']}:"]
    changes: list[str] = []
    new_c, old_c = new["configurations"], old["configurations"]
    added = sorted(set(new_c) - set(old_c))
    missing = sorted(set(old_c) - set(new_c))
    if added:
        changes.append(f"new configurations: {', '.join(added)}")
    if missing:
        changes.append(f"not in the newest run (older figures kept): {', '.join(missing)}")
    for config_id in sorted(set(new_c) & set(old_c)):
        a, b = old_c[config_id]["metrics"], new_c[config_id]["metrics"]
        for label, metric, fmt in _CHANGE_METRICS:
            if metric in a and metric in b and fmt(a[metric]["value"]) != fmt(b[metric]["value"]):
                changes.append(f"{config_id}: {label} {fmt(a[metric]['value'])} → {fmt(b[metric]['value'])}")
    if not changes:
        return lines + ["no figure the board shows changed"]
    extra = len(changes) - MAX_CHANGES
    shown = changes[:MAX_CHANGES] + ([f"… and {extra} more (the records hold them all)"] if extra > 0 else [])
    return lines + shown


# --------------------------------------------------------------------------- text


_NOTE = (
    f"Each section is one model on one machine on one prompt set; ratios are never taken across "
    f"sections. Every row is compared with {ANCHOR} of the run named in its record column: quality "
    f"figures against its greedy outputs and teacher-forced distributions, the speed-up as the "
    f"ratio of decode speed measured interleaved with it in one process (A B A B, batch 1, CPU), "
    f"95% CI in brackets. (derived): hf-generate's speed-up is 1 / {ANCHOR}'s measured speed-up over "
    f"it. exact: greedy output identical to {ANCHOR} on every prompt (exact match 1.000, F1 deltas "
    f"0). Pareto ★: no other row has both a higher speed-up and a higher top-1 agreement. Rows are "
    f"ranked by measured speed-up; read the quality columns beside it. {MISSING}: the record has no "
    f"such figure. Projected GPU columns are modelled from datasheet profiles (rsp_bench.profiles), "
    f"not measured."
)


def _sources_line(records: Sequence[Mapping[str, Any]], left_out: int) -> str:
    kept = [r for r in records if _subset_seed(r) == 0]
    ids = sorted({r["run_id"] for r in kept})
    text = f"Built from {len(ids)} run record(s): {', '.join(ids) if ids else 'none'}."
    if kept:
        newest = max(kept, key=record_sort_key)
        stale = sorted({r["run_id"] for r in kept if not _same_engine_code(_engine_code(r), _engine_code(newest))})
        if stale:
            text += (f" Stale: {len(stale)} of them ran other engine code than the newest record, "
                     f"{newest['run_id']} (another code digest, or another commit where a record carries "
                     "none); their rows describe an older engine, are marked (stale) and are drawn hollow "
                     "and grey in the plot.")
    if left_out:
        text += (f" Left out: {left_out} record(s) drawn on other prompt subsets (--rsp-subset-seed), "
                 "which are never mixed with these.")
    return text


def _table(headers: Sequence[str], body: Sequence[Sequence[str]], tablefmt: str) -> str:
    # disable_numparse keeps our formatting ("0.910", "+0.000") instead of tabulate's.
    return tabulate(body, headers=list(headers), tablefmt=tablefmt, disable_numparse=True)


def _main_table(section: Section, tablefmt: str) -> str:
    return _table(MAIN_HEADERS, [[r[h] for h in MAIN_HEADERS] for r in _main_rows(section)], tablefmt)


def _side_tables(section: Section):
    for title, columns in (("Projected on datasheet GPU profiles (projected, not measured; batch 1, fp16)",
                            PROJECTED_COLUMNS),
                           ("Protective degradation (adversarial suite)", DEGRADATION_COLUMNS)):
        rows = _side_rows(section, columns)
        if rows:
            yield title, ["configuration", *(c[0] for c in columns), "record"], rows


def render_markdown(records: Sequence[Mapping[str, Any]], plot_name: str = PLOT_NAME,
                    curves: Sequence[Mapping[str, Any]] = ()) -> str:
    """The ``leaderboard.md`` text (``curves``: router_curve*.json files, shown last)."""
    secs, left_out = sections(records)
    parts = ["# rsp-bench leaderboard\n", _NOTE + "\n", _sources_line(records, left_out) + "\n"]
    for section in secs:
        parts.append(f"## {section.title}\n")
        parts.append(_main_table(section, "github") + "\n")
        changed = what_changed(section)
        if changed:
            parts.append("What changed, " + changed[0] + "\n\n" + "\n".join(f"- {c}" for c in changed[1:]) + "\n")
        for title, headers, rows in _side_tables(section):
            parts.append(f"### {title}\n\n" + _table(headers, rows, "github") + "\n")
    parts.append(f"![top-1 agreement vs measured speed-up, Pareto front]({plot_name})\n")
    for curve in curves:
        parts.append(f"## {curve_title(curve)}\n\n" + _table(CURVE_HEADERS, curve_rows(curve), "github") + "\n\n"
                     + curve_note(curve) + "\n")
        speed = curve_speed_rows(curve)
        if speed:
            parts.append("### Measured speed, at the bytes each timed run skipped\n\n"
                         + _table(CURVE_SPEED_HEADERS, speed, "github") + "\n\n" + curve_speed_note(curve) + "\n")
    return "\n".join(parts)


def render_html(records: Sequence[Mapping[str, Any]], plot_name: str = PLOT_NAME,
                curves: Sequence[Mapping[str, Any]] = ()) -> str:
    """The ``leaderboard.html`` text: tabulate's (escaped) HTML tables in a minimal page."""
    secs, left_out = sections(records)
    body = [f"<p>{html.escape(_NOTE)}</p>", f"<p>{html.escape(_sources_line(records, left_out))}</p>"]
    for section in secs:
        body.append(f"<h2>{html.escape(section.title)}</h2>")
        body.append(_main_table(section, "html"))
        changed = what_changed(section)
        if changed:
            items = "".join(f"<li>{html.escape(c)}</li>" for c in changed[1:])
            body.append(f"<p>What changed, {html.escape(changed[0])}</p><ul>{items}</ul>")
        for title, headers, rows in _side_tables(section):
            body.append(f"<h3>{html.escape(title)}</h3>")
            body.append(_table(headers, rows, "html"))
    body.append(f"<p><img src=\"{html.escape(plot_name)}\" alt=\"top-1 agreement vs measured speed-up\"></p>")
    for curve in curves:
        body.append(f"<h2>{html.escape(curve_title(curve))}</h2>")
        body.append(_table(CURVE_HEADERS, curve_rows(curve), "html"))
        body.append(f"<p>{html.escape(curve_note(curve))}</p>")
        speed = curve_speed_rows(curve)
        if speed:
            body.append("<h3>Measured speed, at the bytes each timed run skipped</h3>")
            body.append(_table(CURVE_SPEED_HEADERS, speed, "html"))
            body.append(f"<p>{html.escape(curve_speed_note(curve))}</p>")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<title>rsp-bench leaderboard</title>\n"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:90%}"
        "th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}"
        "th{background:#f3f3f3}td:nth-child(-n+3){text-align:left}</style>\n"
        "</head>\n<body>\n<h1>rsp-bench leaderboard</h1>\n" + "\n".join(body) + "\n</body>\n</html>\n"
    )


# --------------------------------------------------------------------------- plot


def render_plot_png(records: Sequence[Mapping[str, Any]]) -> bytes:
    """The board's plot (``rsp_bench.leaderboard_plot``): one panel per section that has a row
    with both a measured speed-up and a top-1 agreement."""
    panels = []
    for section in sections(records)[0]:
        plotted = _plotted(section)
        if not plotted:
            continue
        front = sorted((plotted[j][0], plotted[j][1]) for j in pareto_front([(x, y) for x, y, _ in plotted]))
        panels.append(Panel(section.title, [Point(x, y, e.config, bool(e.exact), e.stale) for x, y, e in plotted],
                            front))
    return render_panels_png(panels, ANCHOR)


def write_leaderboard(
    records_dir_or_records: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    out_dir: str | os.PathLike[str],
    curves: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Path]:
    """Write ``leaderboard.md``, ``leaderboard.html`` and ``quality_vs_speed.png`` into ``out_dir``.

    ``records_dir_or_records`` is a results folder (its ``runs/`` are read, and its
    ``router_curve*.json`` unless ``curves`` is given) or the records themselves; unless
    ``curves`` is given, the records' own router curves follow the files'.
    Returns ``{"md": ..., "html": ..., "png": ...}``.
    """
    records = _as_records(records_dir_or_records)
    if curves is None:
        curves = load_curves(records_dir_or_records) if isinstance(records_dir_or_records, (str, os.PathLike)) else []
        curves = [*curves, *record_curves(records)]
    out = Path(out_dir)
    # The plot first: if drawing fails, no table points at a missing or stale picture.
    png = atomic_write_bytes(out / PLOT_NAME, render_plot_png(records))
    md = atomic_write_text(out / "leaderboard.md", render_markdown(records, PLOT_NAME, curves))
    page = atomic_write_text(out / "leaderboard.html", render_html(records, PLOT_NAME, curves))
    return {"md": md, "html": page, "png": png}


# --------------------------------------------------------------------------- CLI glue


def configure_leaderboard_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``rsp-bench leaderboard``."""
    p.add_argument("--results", metavar="DIR", default="results",
                   help="results folder whose runs/ hold the records (default: results)")
    p.add_argument("--out", metavar="DIR", help="where to write the tables and plot (default: the results folder)")


def run_leaderboard(args: argparse.Namespace) -> int:
    """Rebuild the leaderboard from the records and print the markdown."""
    records = latest_records(args.results)
    if not records:
        raise HarnessInputError(
            f"{Path(args.results) / 'runs'}: no run records to build a leaderboard from (run `rsp-bench run` first)"
        )
    curves = [*load_curves(args.results), *record_curves(records)]
    paths = write_leaderboard(records, args.out or args.results, curves)
    print(render_markdown(records, PLOT_NAME, curves), end="")
    for path in paths.values():
        print(f"wrote {path}", file=sys.stderr)
    return 0
