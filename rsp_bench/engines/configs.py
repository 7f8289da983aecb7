"""Suite configurations: their ids (``reference/lossy/s=0.50``), the reference engine's
``PruningConfig`` the suites run, and the plan of configurations for one engine.

Must NOT import torch or reference_engine at module import (``pruning_config`` imports the
engine when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from rsp_bench.engines.base import ConfigSpec, available_engines, engine_factory
from rsp_bench.errors import HarnessInputError

if TYPE_CHECKING:
    from reference_engine import PruningConfig

# Every suite configuration pins the hardware watermark to 0.0 (an idle machine). Left free,
# the router samples the machine's load per request and raises its threshold on a busy box,
# so quality figures would depend on who else is using the CPUs; pinned, they are
# deterministic and comparable with a baseline taken on another day.
SUITE_WATERMARK = 0.0




def format_config_id(engine: str, mode: str | None = None, sensitivity: float | None = None,
                     **params: Any) -> str:
    """``reference/off``, ``reference/lossy/s=0.50``, ``static-shortgpt/k=3`` (the record's ids)."""
    parts = [engine]
    if mode is not None:
        parts.append(mode)
    if sensitivity is not None:
        parts.append(f"s={sensitivity:.2f}")
    parts.extend(f"{k}={v}" for k, v in params.items())
    return "/".join(parts)


def pruning_config(mode: str, sensitivity: float | None = None, **fields: Any) -> "PruningConfig":
    """The reference engine configuration the suites run: watermark pinned, logging off."""
    from reference_engine import PruningConfig

    kwargs: dict[str, Any] = {"mode": mode, "hardware_watermark": SUITE_WATERMARK, "log_level": "NONE"}
    if sensitivity is not None:
        kwargs["sensitivity"] = sensitivity
    kwargs.update(fields)
    return PruningConfig(**kwargs)


def plan_configs(engine: str, modes: Sequence[str], sensitivities: Sequence[float], *,
                 with_pruning: bool = True) -> list[ConfigSpec]:
    """``reference/off`` first (the anchor every row is compared with), then ``<engine>/off``
    for a non-reference engine, then one configuration per mode x sensitivity, or the engine's
    own ``configurations`` where it registered them (``register_engine(configurations=...)``).
    ``with_pruning=False`` skips building the PruningConfig (collection needs only the ids and
    must not import torch)."""
    anchor = ConfigSpec(format_config_id("reference", "off"), "reference", "off", None, {},
                        pruning_config("off") if with_pruning else None)
    own = None
    if engine != "reference" and engine in available_engines():
        own = getattr(engine_factory(engine), "configurations", None)
    if own is not None:
        specs = list(own(tuple(modes), tuple(sensitivities)))
        ids = [s.config_id for s in specs]
        if anchor.config_id in ids or len(set(ids)) != len(ids):
            raise HarnessInputError(f"engine {engine!r}: its configurations must be distinct and must not "
                                    f"include {anchor.config_id!r} (always run first), got {ids}")
        return [anchor, *specs]
    planned: list[tuple[str, str, float | None]] = [("reference", "off", None)]
    if engine != "reference":
        planned.append((engine, "off", None))
    for mode in modes:
        if mode == "off":
            continue  # always present above
        for s in sensitivities:
            planned.append((engine, mode, float(s)))
    specs = []
    for eng, mode, s in planned:
        if eng == "reference" and mode == "lossy":
            # the default (unit) router, then the block router at the same sensitivity: a
            # comparison row with its own budgets ([lossy_block] in budgets.toml)
            specs.append(ConfigSpec(format_config_id(eng, mode, s), eng, mode, s, {},
                                    pruning_config(mode, s) if with_pruning else None))
            specs.append(ConfigSpec(format_config_id(eng, mode, s, router="block"), eng, mode, s,
                                    {"router": "block"},
                                    pruning_config(mode, s, router="block") if with_pruning else None))
            continue
        pruning = pruning_config(mode, s) if with_pruning and eng == "reference" else None
        if with_pruning and eng != "reference":
            # A user's engine may still read the reference knobs; give them when they are valid.
            try:
                pruning = pruning_config(mode, s)
            except ValueError:
                pruning = None
        specs.append(ConfigSpec(format_config_id(eng, mode, s), eng, mode, s, {}, pruning))
    return specs


def unit_router_rows(specs: Sequence[ConfigSpec]) -> list[ConfigSpec]:
    """The rows that run the reference engine's unit router (its default lossy rows and any
    ``router=unit`` row): they need the unit predictor of the weights."""
    from reference_engine.config import DEFAULT_ROUTER

    return [s for s in specs if s.engine == "reference" and s.mode == "lossy"
            and (s.params or {}).get("router", DEFAULT_ROUTER) == "unit"]
