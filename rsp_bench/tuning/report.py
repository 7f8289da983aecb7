"""The human-readable outputs of ``rsp-bench tune``: tune.md (``table_markdown``), tune.png
(``render_plot_png``, deterministic bytes), and ``write_outputs``, which writes tune.csv,
recommends from the written file, then writes the other two.

Must NOT import pytest, torch, transformers, the engine, or rsp_bench.tuning.sweep;
tabulate and matplotlib only inside the functions that use them.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from rsp_bench.errors import HarnessInputError
from rsp_bench.tuning.recommendation import Recommendation, TuneRow
from rsp_bench.tuning.table import read_table, recommend_table, table_csv

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
