"""The knobs of the reference engine, validated once, overridable per request.

Must not import torch or the harness: a configuration is plain data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from .errors import ConfigError

LOG_LEVELS = ("NONE", "SUMMARY", "DETAILED")
MODES = ("off", "lossy", "lossless", "static")
ROUTERS = ("block", "unit")
DEFAULT_ROUTER = "unit"
FIRST_AND_LAST = "first_and_last"


@dataclass(frozen=True)
class PruningConfig:
    """How one request is pruned.

    sensitivity: 0..1; 0 disables pruning outright. For the unit router (the default) it asks for
        about sensitivity x 20% of a decode token's weight bytes not read, through a scale
        calibrated per weights (sensitivity_scale.py); for the block router it scales the
        threshold by sensitivity / 0.5.
    layer_blacklist: block indices never bypassed; the default protects the first and last block
        (bypassing them wrecks the output: DESIGN.md section 5).
    log_level: NONE, SUMMARY (one JSON line per request) or DETAILED (one per token and block).
    mode: "off" (full model), "lossy" (router bypasses blocks), "lossless" (pruned drafts,
        full verification: output equals "off") or "static" (the blocks in ``static_bypass`` are
        bypassed on every decode token, no router: the baseline a dynamic router must beat).
    static_bypass: block indices bypassed in "static" mode (same bypass maps as the router uses).
    hardware_watermark: None samples the machine's load per request; a float in [0, 1] pins it,
        which makes quality figures independent of what else the machine is doing.
    probe_interval: every this many decode tokens all blocks run, refreshing the router's scores.
    tau0: the base threshold in nats before the four signal factors. 0.05 was chosen from a
        measured sweep on the embedded model (teacher-forced top-1 agreement 0.98 at sensitivity
        0.5, 0.77 at 1.0); see the README's quality table for the current figures.
    router: which lossy router decides: "block" (router.Router: whole blocks, EMA scores of
        earlier tokens, probe steps) or "unit" (router.UnitRouter: attention and MLP apart, scores
        predicted from this token's own unit inputs inside the decode step; unit_predictor.py).
        It is the default because it is the one that pays: at 0.5 it decodes measurably faster
        than pruning off, where the block router does not, and (predictor version 3, every unit a
        candidate) it beats static removal of the same bytes on top-1 and KL (README,
        docs/unit-router.md). Where the weights have no unit predictor (packaged or cached),
        a "unit" request runs the block router, says so once in a WARNING and in its stats
        (``router``, ``router_fallback``); ``rsp-bench calibrate`` trains one.
    static_attn_bypass / static_mlp_bypass: in "static" mode, blocks whose attention / MLP alone
        is bypassed on every decode token (per-unit static removal, the baseline at equal bytes).
    """

    sensitivity: float = 0.5
    layer_blacklist: tuple[int, ...] | str = FIRST_AND_LAST
    log_level: str = "SUMMARY"
    mode: str = "lossy"
    hardware_watermark: float | None = None
    probe_interval: int = 8
    tau0: float = 0.05
    static_bypass: tuple[int, ...] = ()
    router: str = DEFAULT_ROUTER
    static_attn_bypass: tuple[int, ...] = ()
    static_mlp_bypass: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        s = self.sensitivity
        if isinstance(s, bool) or not isinstance(s, (int, float)) or math.isnan(s) or not 0.0 <= s <= 1.0:
            raise ConfigError(f"sensitivity must be a number in [0, 1], got {s!r}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.layer_blacklist != FIRST_AND_LAST:
            if isinstance(self.layer_blacklist, (str, bytes)) or not hasattr(self.layer_blacklist, "__iter__"):
                raise ConfigError(f"layer_blacklist must be a sequence of block indices, got {self.layer_blacklist!r}")
            for i in self.layer_blacklist:
                if isinstance(i, bool) or not isinstance(i, int):
                    raise ConfigError(f"layer_blacklist entries must be integers, got {i!r}")
                if i < 0:
                    raise ConfigError(f"layer_blacklist index must be >= 0, got {i!r}")
            object.__setattr__(self, "layer_blacklist", tuple(sorted(set(self.layer_blacklist))))
        w = self.hardware_watermark
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float)) or math.isnan(w) or not 0.0 <= w <= 1.0):
            raise ConfigError(f"hardware_watermark must be None or a number in [0, 1], got {w!r}")
        if isinstance(self.probe_interval, bool) or not isinstance(self.probe_interval, int) or self.probe_interval < 1:
            raise ConfigError(f"probe_interval must be an integer >= 1, got {self.probe_interval!r}")
        if not isinstance(self.tau0, (int, float)) or not 0.0 < self.tau0 <= 1.0:
            raise ConfigError(f"tau0 must be a number in (0, 1], got {self.tau0!r}")

        if self.router not in ROUTERS:
            raise ConfigError(f"router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        for name in ("static_bypass", "static_attn_bypass", "static_mlp_bypass"):
            for i in getattr(self, name):
                if isinstance(i, bool) or not isinstance(i, int) or i < 0:
                    raise ConfigError(f"{name} entries must be integers >= 0, got {i!r}")
            object.__setattr__(self, name, tuple(sorted(set(getattr(self, name)))))

    def blacklist_for(self, n_layers: int) -> frozenset[int]:
        """The blacklist resolved for a model with ``n_layers`` blocks (range checked here)."""
        if self.layer_blacklist == FIRST_AND_LAST:
            return frozenset({0, n_layers - 1})
        for i in self.layer_blacklist:
            if i >= n_layers:
                raise ConfigError(f"layer_blacklist index {i} is out of range for a model with {n_layers} blocks (0..{n_layers - 1})")
        for name in ("static_bypass", "static_attn_bypass", "static_mlp_bypass"):
            for i in getattr(self, name):
                if i >= n_layers:
                    raise ConfigError(f"{name} index {i} is out of range for a model with {n_layers} blocks")
        return frozenset(self.layer_blacklist)

    @property
    def prunes(self) -> bool:
        return self.mode != "off" and self.sensitivity > 0.0

    def override(self, **changes: Any) -> "PruningConfig":
        """A copy with some fields replaced (validated again); unknown names are an error."""
        unknown = set(changes) - set(self.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown PruningConfig field(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes)


def parse_blacklist(text: str) -> tuple[int, ...]:
    """Parse a CLI blacklist such as ``"0,29"`` (empty string: no blacklist)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(int(part))
        except ValueError:
            raise ConfigError(f"layer_blacklist entries must be integers, got {part!r}") from None
    return tuple(out)
