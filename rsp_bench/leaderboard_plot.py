"""The leaderboard's picture: top-1 agreement against measured speed-up, one panel per section,
drawn from plain data (``Panel``) so that it knows nothing of records or sections, with the
labels of near points placed apart (``place_labels``, pure geometry).

Deterministic bytes: matplotlib's default style (not the user's matplotlibrc), fixed size and
dpi, fixed ticks, and no "Software" text chunk in the PNG.

Must NOT import rsp_bench.leaderboard (which imports this), torch, transformers or
reference_engine; matplotlib is imported only when a plot is drawn, and never through pyplot
(no global backend or figure state).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Point", "Panel", "place_labels", "render_panels_png"]


@dataclass(frozen=True)
class Point:
    speedup: float
    top1: float
    label: str
    exact: bool
    stale: bool  # its record ran older engine code than the board's newest record


@dataclass(frozen=True)
class Panel:
    title: str
    points: Sequence[Point]
    front: Sequence[tuple[float, float]]  # the Pareto front's points, sorted by speed-up



# Fixed ticks (a locator's choice could change with the matplotlib version): the dense set
# when the speed-ups span less than 3x, else the sparse one.
_TICKS = (0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0)
_DENSE_TICKS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0)


# Where a point's label may go, in points from the point, tried in order: up-right first, then
# alternately below and above, further each time, so that labels of near-equal points (1.00x at
# top-1 1.000 for off, f32 and lossless) stack instead of printing on top of each other.
_LABEL_OFFSETS = ((4.0, 4.0), *((4.0, dy) for k in range(1, 9) for dy in (4.0 - 10.0 * k, 4.0 + 10.0 * k)))
_LABEL_FONT = 7.0
_MARKER_BOX = 14.0  # points: the area around a marker that a label must not cover


def _overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def place_labels(anchors: Sequence[tuple[float, float]], widths: Sequence[float],
                 height: float = _LABEL_FONT * 1.3,
                 bounds: tuple[float, float, float, float] | None = None) -> list[tuple[float, float]]:
    """An offset (points) for each label: the first of ``_LABEL_OFFSETS`` whose box covers no
    label placed before it and no other point's marker and stays inside ``bounds`` (x, y,
    width, height: the axes) where given; anchors in points, display space. Labels are placed
    from the top of the plot down, so the result is deterministic."""
    markers = [(x - _MARKER_BOX / 2, y - _MARKER_BOX / 2, _MARKER_BOX, _MARKER_BOX) for x, y in anchors]
    placed: list[tuple[float, float, float, float]] = []
    out: list[tuple[float, float]] = [(0.0, 0.0)] * len(anchors)
    for i in sorted(range(len(anchors)), key=lambda i: (-anchors[i][1], anchors[i][0], i)):
        x, y = anchors[i]
        choice = _LABEL_OFFSETS[-1]
        for dx, dy in _LABEL_OFFSETS:
            box = (x + dx, y + dy, widths[i], height)
            if bounds is not None and not (bounds[0] <= box[0] and box[0] + box[2] <= bounds[0] + bounds[2]
                                           and bounds[1] <= box[1] and box[1] + box[3] <= bounds[1] + bounds[3]):
                continue
            if not any(_overlaps(box, b) for b in placed) and not any(
                    _overlaps(box, m) for j, m in enumerate(markers) if j != i):
                choice = (dx, dy)
                break
        placed.append((x + choice[0], y + choice[1], widths[i], height))
        out[i] = choice
    return out


def render_panels_png(panels: Sequence[Panel], anchor: str) -> bytes:
    """Top-1 agreement against measured speed-up vs ``anchor`` (log x), one panel each: exact
    configurations as green stars, stale rows hollow and grey, the Pareto front as a step line,
    labels placed apart. No panel: one saying there is nothing to draw."""
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties
    from matplotlib.ticker import FixedLocator, NullLocator

    shown: Sequence[Panel | None] = list(panels) or [None]
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(9, 5.5 * len(shown)), dpi=100)
        FigureCanvasAgg(fig)
        labelled = []
        for i, panel in enumerate(shown):
            ax = fig.add_subplot(len(shown), 1, i + 1)
            ax.set_xlabel(f"measured speed-up vs {anchor} (×, log scale, CPU, interleaved)")
            ax.set_ylabel("teacher-forced top-1 agreement")
            ax.grid(True, linewidth=0.4, alpha=0.5)
            if panel is None:
                ax.text(0.5, 0.5, "no configuration has both figures", ha="center", va="center",
                        transform=ax.transAxes)
                ax.set_title("rsp-bench: quality vs speed")
                continue
            points = list(panel.points)
            ax.set_title(panel.title.replace("$", r"\$"), fontsize=9)
            ax.set_xscale("log")
            styles = ((lambda p: not p.stale and not p.exact, dict(marker="o", s=30, color="tab:blue", label="lossy / other")),
                      (lambda p: not p.stale and p.exact,
                       dict(marker="*", s=110, color="tab:green", label=f"exact (output = {anchor})")),
                      (lambda p: p.stale, dict(marker="o", s=30, facecolors="none", edgecolors="grey",
                                               label="stale record (older engine code)")))
            for belongs, style in styles:
                chosen = [p for p in points if belongs(p)]
                if chosen:
                    ax.scatter([p.speedup for p in chosen], [p.top1 for p in chosen], zorder=3, **style)
            if len(panel.front) > 1:
                ax.step([f[0] for f in panel.front], [f[1] for f in panel.front], where="post", color="tab:orange",
                        linewidth=1.0, zorder=2, label="Pareto front")
            ax.axvline(1.0, color="grey", linestyle="--", linewidth=0.8, zorder=1)
            xs = [p.speedup for p in points]
            lo, hi = min(xs + [1.0]) / 1.3, max(xs + [1.0]) * 1.6  # room for the labels
            ax.set_xlim(lo, hi)
            ticks = [t for t in (_DENSE_TICKS if hi / lo < 3 else _TICKS) if lo <= t <= hi]
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([f"{t:g}×" for t in ticks])
            ax.margins(y=0.1)
            ax.autoscale_view()
            ax.set_ylim(*ax.get_ylim())  # fixed now: labels are placed in display space below
            ax.legend(loc="lower left", fontsize=7)
            labelled.append((ax, points))
        fig.tight_layout()
        to_points = 72.0 / fig.dpi
        renderer, font = fig.canvas.get_renderer(), FontProperties(size=_LABEL_FONT)
        for ax, points in labelled:
            # "$" would switch matplotlib to mathtext and fail on an odd configuration name.
            names = [p.label.replace("$", r"\$") + (" (stale)" if p.stale else "") for p in points]
            anchors = [tuple(v * to_points for v in ax.transData.transform((p.speedup, p.top1))) for p in points]
            widths = [renderer.get_text_width_height_descent(n, font, ismath=False)[0] * to_points for n in names]
            box = ax.get_window_extent(renderer)
            offsets = place_labels(anchors, widths, bounds=(box.x0 * to_points, box.y0 * to_points,
                                                            box.width * to_points, box.height * to_points))
            for p, name, off in zip(points, names, offsets):
                leader = dict(arrowstyle="-", linewidth=0.4, color="grey") if off != _LABEL_OFFSETS[0] else None
                ax.annotate(name, (p.speedup, p.top1), xytext=off, textcoords="offset points", fontsize=_LABEL_FONT,
                            color="grey" if p.stale else "black", arrowprops=leader)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return buffer.getvalue()
