"""Projections over several GPU profiles for printing and for JSON (``rsp-bench project``):
every column that is a projection says so in its header.

Must NOT import transformers, torch or the engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rsp_bench.errors import HarnessInputError
from rsp_bench.profiles import HardwareProfile, get_profile
from rsp_bench.projection.timeline import Projection, project_pruning
from rsp_bench.projection.work import ModelShape


def _profiles(profiles: Iterable[HardwareProfile | str] | str) -> list[HardwareProfile]:
    if isinstance(profiles, str):
        profiles = [p for p in profiles.split(",") if p.strip()]
    out = [get_profile(p) for p in profiles]
    if not out:
        raise HarnessInputError("no hardware profile named: give at least one (e.g. 'A100')")
    return out


def projection_table(shape: ModelShape, profiles: Iterable[HardwareProfile | str] | str,
                     dtype: str = "fp16", batch: int = 1, context: int = 512,
                     executed_blocks_pruned: float | Sequence[float] | None = None,
                     bypass_kind: str = "identity", bypass_rank: int = 0,
                     **kw: object) -> list[dict]:
    """One row per profile for printing (e.g. ``tabulate(rows, headers="keys")``); every
    figure's header says projected."""
    rows = []
    for prof in _profiles(profiles):
        r = project_pruning(shape, prof, dtype, batch, context, executed_blocks_pruned,
                            bypass_kind, bypass_rank, **kw)
        off, pruned = r["off"], r["pruned"]
        rows.append({
            "profile": prof.name,
            "dtype": off.dtype,
            "batch": batch,
            "context": context,
            "blocks/token pruned": round(pruned.executed_blocks, 3),
            "projected tokens/s off": round(off.tokens_per_s, 1),
            "projected tokens/s pruned": round(pruned.tokens_per_s, 1),
            "projected busy ms/token off": round(off.busy_ms_per_token, 4),
            "projected busy ms/token pruned": round(pruned.busy_ms_per_token, 4),
            "projected idle off": round(off.idle_fraction, 3),
            "projected idle pruned": round(pruned.idle_fraction, 3),
            "projected GPU time freed": round(r["freed_fraction"], 3),
            "projected speed-up": round(r["speedup"], 3),
            "limited by (off)": off.limited_by,
        })
    return rows


def projection_json(shape: ModelShape, profiles: Iterable[HardwareProfile | str] | str,
                    dtype: str = "fp16", batch: int = 1, context: int = 512,
                    executed_blocks_pruned: float | Sequence[float] | None = None,
                    bypass_kind: str = "identity", bypass_rank: int = 0,
                    **kw: object) -> dict:
    """What ``rsp-bench project --json`` prints: one entry per profile name, each marked
    ``"projected": true``, with tokens_per_s, busy_ms_per_token, idle_fraction and
    freed_fraction for "off" (freed 0 by definition) and "pruned"."""
    out: dict[str, dict] = {}
    for prof in _profiles(profiles):
        r = project_pruning(shape, prof, dtype, batch, context, executed_blocks_pruned,
                            bypass_kind, bypass_rank, **kw)

        def figures(p: Projection, freed: float) -> dict:
            return {"tokens_per_s": p.tokens_per_s, "busy_ms_per_token": p.busy_ms_per_token,
                    "idle_fraction": p.idle_fraction, "freed_fraction": freed,
                    "executed_blocks": p.executed_blocks, "limited_by": p.limited_by}

        out[prof.name] = {
            "projected": True,
            "dtype": r["off"].dtype,
            "batch": batch,
            "context": context,
            "off": figures(r["off"], 0.0),
            "pruned": figures(r["pruned"], r["freed_fraction"]),
            "source": prof.source,
        }
    return out
