"""What the sensitivity knob means for the unit router: a share of the weight bytes not read.

Sensitivity s in [0, 1] asks the unit router to leave about ``s * SHARE_AT_FULL`` of the weight
bytes a decode token reads with pruning off unread (0.5: a tenth, an ideal speed-up of 1/0.9 =
1.11x on a memory-bound machine). The router's internal scale is its threshold scale (tau ~ tau0 x
scale / 0.5, in nats per block's worth of bytes; router.UnitRouter without the static prior, the
default since predictor version 3); which units go on a token depends on the text, so no
internal value holds a share on every prompt: the scale is *calibrated*, per weights, on
free-running greedy generation of ``TUNE_PROMPTS`` at batch 1 (the detector suspended, watermark
pinned to 0), and maps s to the internal value whose mean share there is the target. That value
is where a request starts: the router's share controller (router.UnitRouter.steer) then moves each
request's threshold towards the target share, so other text lands near it too; the README gives
the measured spread on prompts that chose nothing (``rsp-bench sensitivity-scale``).

The block router (``router="block"``, the comparison row) keeps its own meaning (tau0 * sensitivity / 0.5).

The scale is per weights, like every calibration: packaged for the embedded model
(``data/unit_predictor/<sha16>-scale-v<N>.json``), else the user cache, else fitted on first use
(``fit``, a few minutes on 2 CPU cores). Written atomically.

Must not import the harness (``rsp_bench``) or the engine module (the engine imports this).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from .calibration import atomic_write

if TYPE_CHECKING:
    from .engine import Engine

SCALE_VERSION = 4  # 4: predictor v4 (deep ridges from its deep_from); 3: v3; 2: the static prior's candidate share
SHARE_AT_FULL = 0.20  # sensitivity 1.0 asks for a fifth of a decode token's weight bytes not read
FIT_TOKENS = 64
# Internal scales tried by ``fit``: the free router's threshold scales (0.03 skipped about 2 and
# 0.12 about 6 blocks' worth per token on the development prompts, results/unit_design_v3_dev.json).
FIT_GRID = (0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.12, 0.15, 0.2, 0.3)

# The choosing split of the unit router's design (DESIGN.md section 9): written for the router's
# curve, neither the predictor's training text (unit_predictor.TRAIN_PROMPTS) nor a held-out set.
TUNE_PROMPTS = (
    "Explain how a refrigerator keeps food cold.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give JSON with fields title and year for the film Casablanca.",
    "What is 45 plus 78? Show the steps.",
    "Write four lines of a poem about the sea.",
    "List three benefits of drinking water.",
    "Summarize: A local school planted 200 trees this spring as part of a city-wide plan.",
    "How does a compass find north?",
)


@dataclass(frozen=True)
class SensitivityScale:
    """Measured (internal scale, mean share of decode weight bytes not read) points, share
    non-decreasing in the scale; ``internal_for`` inverts them."""

    weights_sha256: str
    points: tuple[tuple[float, float], ...]
    share_at_full: float = SHARE_AT_FULL
    tokens: int = FIT_TOKENS
    prompts: int = len(TUNE_PROMPTS)
    kernel: str = ""
    seconds: float = 0.0
    version: int = SCALE_VERSION

    def __post_init__(self) -> None:
        pts = tuple((float(x), float(y)) for x, y in self.points)
        if len(pts) < 2 or any(not (math.isfinite(x) and math.isfinite(y) and x > 0 and 0 <= y < 1) for x, y in pts):
            raise ValueError(f"a sensitivity scale needs >= 2 points (scale > 0, share in [0, 1)), got {pts!r}")
        if any(b[0] <= a[0] or b[1] < a[1] for a, b in zip(pts, pts[1:])):
            raise ValueError(f"sensitivity scale points must rise in scale and not fall in share, got {pts!r}")
        object.__setattr__(self, "points", pts)

    def target_share(self, sensitivity: float) -> float:
        return float(sensitivity) * self.share_at_full

    def internal_for(self, sensitivity: float) -> float:
        """The router's threshold scale for a user sensitivity: 0 for 0; interpolated in log
        scale between the measured points that bracket the target share; below the first point,
        proportional to it; above the last, the last (the most the fit measured)."""
        target = self.target_share(sensitivity)
        if target <= 0.0:
            return 0.0
        (x0, y0) = self.points[0]
        if target <= y0:
            return x0 * target / y0 if y0 > 0 else x0
        for (xa, ya), (xb, yb) in zip(self.points, self.points[1:]):
            if ya <= target <= yb:
                if yb == ya:
                    return xa
                t = (target - ya) / (yb - ya)
                return math.exp(math.log(xa) + t * (math.log(xb) - math.log(xa)))
        return self.points[-1][0]

    @property
    def max_share(self) -> float:
        return self.points[-1][1]


def monotone(points: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Sorted by scale, each share raised to the largest before it (a larger threshold never
    skips less in expectation; a dip is sampling noise of a few prompts)."""
    out, best = [], 0.0
    for x, y in sorted(points):
        best = max(best, y)
        out.append((x, best))
    return tuple(out)


def scale_path(folder: Path, weights_sha256: str) -> Path:
    return folder / "unit_predictor" / f"{weights_sha256[:16]}-scale-v{SCALE_VERSION}.json"


def save(scale: SensitivityScale, folder: Path) -> Path:
    path = scale_path(folder, scale.weights_sha256)
    text = json.dumps(asdict(scale), indent=1) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path


def load(folder: Path, weights_sha256: str) -> SensitivityScale | None:
    """The stored scale for these weights, or None (missing, damaged, another version or weights)."""
    path = scale_path(folder, weights_sha256)
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        d["points"] = tuple(tuple(p) for p in d["points"])
        scale = SensitivityScale(**d)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # damaged: refitted, never trusted
    if scale.version != SCALE_VERSION or scale.weights_sha256 != weights_sha256:
        return None
    return scale


def decode_bytes_per_token(engine: "Engine") -> int:
    """Weight bytes one unpruned decode token reads: every block, the final norm, the LM head."""
    w = engine.weights
    return (w.bytes_per_block() * engine.dims.n_layers + w.lm_head.numel() * w.lm_head.element_size()
            + w.final_norm.numel() * w.final_norm.element_size())


def measure_share(engine: "Engine", internal: float, prompts: Sequence[str] = TUNE_PROMPTS,
                  tokens: int = FIT_TOKENS) -> float:
    """Mean share of decode weight bytes not read over ``prompts`` (free-running greedy, batch 1)
    with the unit router at threshold scale ``internal`` (the detector suspended)."""
    from .config import PruningConfig

    total = decode_bytes_per_token(engine)
    cfg = PruningConfig(mode="lossy", router="unit", hardware_watermark=0.0, log_level="NONE")
    shares = []
    with engine.degradation_suspended(), engine.raw_unit_scale():
        for p in prompts:
            res = engine.generate(p, max_new_tokens=tokens, config=cfg.override(sensitivity=internal))
            st = res[0].stats
            steps = max(st["total_tokens"] - 1, 1)  # the first token comes from prefill
            shares.append(st["bypassed_weight_bytes"] / (total * steps))
    return sum(shares) / len(shares)


def fit_grid(deep_from: float | None, grid: Sequence[float] = FIT_GRID) -> list[float]:
    """The scales ``fit`` measures: ``grid``, and where the predictor's deep ridges start inside
    it, both sides of that start. The share jumps there; measuring the left side too keeps every
    target below the jump interpolated within the shallow ridges' own points."""
    if deep_from is not None and min(grid) < deep_from <= max(grid):
        return sorted(set(grid) | {deep_from * (1 - 1e-6), deep_from})
    return sorted(grid)


def fit(engine: "Engine", grid: Sequence[float] = FIT_GRID, prompts: Sequence[str] = TUNE_PROMPTS,
        tokens: int = FIT_TOKENS, progress: Callable[[str], None] | None = None) -> SensitivityScale:
    """Measure the mean share at each threshold scale of ``grid`` and keep the monotone curve."""
    t0 = time.perf_counter()
    grid = fit_grid(engine.unit_predictor().deep_from, grid)
    pts = []
    for x in grid:
        y = measure_share(engine, x, prompts, tokens)
        pts.append((x, y))
        if progress:
            progress(f"sensitivity scale: threshold scale {x:g} -> {y:.3%} of decode weight bytes not read")
    return SensitivityScale(engine.weights_sha256, monotone(pts), tokens=tokens, prompts=len(prompts),
                            kernel=engine.decode_kernel, seconds=round(time.perf_counter() - t0, 1))
