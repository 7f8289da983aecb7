"""Adapters over the reference pruned engine: ``reference`` (any mode) and the static
baselines ``static-shortgpt`` / ``static-random``.

Both static adapters run through the reference engine's ``mode="static"``: the same bypass
maps as the router, so they differ from the dynamic engine only in *which* blocks are skipped.
That is the comparison the static rows exist for: what per-token routing buys at equal compute.

Must NOT import torch or reference_engine at module import (the plugin imports the registry
light); the engine object is handed in by the factory's caller.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any, Sequence

from rsp_bench.engines.base import ConfigSpec, Output, register_engine
from rsp_bench.engines.configs import format_config_id, pruning_config
from rsp_bench.errors import HarnessInputError

if TYPE_CHECKING:
    import torch
    from reference_engine import Engine, PruningConfig


def unit_budget_bracket(bytes_per_token: float, unit_bytes: Sequence[int], order: Sequence[int]) -> tuple[int, int, float]:
    """Equal-bytes matching for per-unit static removal, without rounding.

    ``order``: the units a static baseline removes, first to last (e.g. lowest Block Influence
    first); ``unit_bytes[u]``: weight bytes per token that removing unit u saves. Returns (k, k + 1,
    t): the router's ``bytes_per_token`` lies between the budgets of the first k and the first k+1
    units, at fraction t in [0, 1]; compare the router with (1 - t) * f(k) + t * f(k + 1), the
    static curve interpolated at its budget (rounding to the nearest budget hands it up to half a block).
    """
    if not (isinstance(bytes_per_token, (int, float)) and math.isfinite(bytes_per_token) and bytes_per_token >= 0):
        raise HarnessInputError(f"bytes_per_token must be a finite number >= 0, got {bytes_per_token!r}")
    if len(order) < 1:
        raise HarnessInputError("order must name at least one unit")
    for u in order:
        if isinstance(u, bool) or not isinstance(u, int) or not 0 <= u < len(unit_bytes):
            raise HarnessInputError(f"order holds {u!r}, not a unit index in [0, {len(unit_bytes)})")
    cum = [0.0]
    for u in order:
        if unit_bytes[u] <= 0:
            raise HarnessInputError(f"unit_bytes[{u}] must be > 0, got {unit_bytes[u]!r}")
        cum.append(cum[-1] + float(unit_bytes[u]))
    if bytes_per_token > cum[-1]:
        raise HarnessInputError(f"bytes_per_token={bytes_per_token!r} exceeds what removing every unit in order "
                                f"saves ({cum[-1]:.0f})")
    k = max(i for i in range(len(order)) if cum[i] <= bytes_per_token)
    return k, k + 1, (bytes_per_token - cum[k]) / (cum[k + 1] - cum[k])


def shortgpt_units(unit_influence: Sequence[float], blacklist: frozenset[int] | set[int]) -> list[int]:
    """Per-unit static removal order: units (2l attention, 2l+1 MLP of block l) by ascending Block
    Influence of their sublayer, blacklisted blocks' units excluded, ties to the lower index."""
    units = [u for u in range(len(unit_influence)) if u // 2 not in blacklist]
    return sorted(units, key=lambda u: (float(unit_influence[u]), u))


def random_units(n_units: int, blacklist: frozenset[int] | set[int], seed: int = 0) -> list[int]:
    """A seeded random per-unit removal order, blacklisted blocks' units excluded."""
    units = [u for u in range(n_units) if u // 2 not in blacklist]
    random.Random(seed).shuffle(units)
    return units


def _eligible(n_layers: int, k: int, blacklist: frozenset[int] | set[int]) -> list[int]:
    eligible = [i for i in range(n_layers) if i not in blacklist]
    if isinstance(k, bool) or not isinstance(k, int) or k < 0 or k > len(eligible):
        raise HarnessInputError(
            f"k must be an integer in [0, {len(eligible)}] (blocks not on the blacklist "
            f"{sorted(blacklist)} of a {n_layers}-block model), got {k!r}")
    return eligible


def shortgpt_blocks(block_influence: Sequence[float], k: int, blacklist: frozenset[int] | set[int]) -> tuple[int, ...]:
    """The k blocks with the lowest Block Influence (ShortGPT: 1 - cos(h_in, h_out)), blacklist
    excluded; ties go to the lower index so the choice is reproducible."""
    eligible = _eligible(len(block_influence), k, blacklist)
    ranked = sorted(eligible, key=lambda i: (float(block_influence[i]), i))
    return tuple(sorted(ranked[:k]))


def random_blocks(n_layers: int, k: int, blacklist: frozenset[int] | set[int], seed: int = 0) -> tuple[int, ...]:
    """k blocks drawn without replacement with a fixed seed, blacklist excluded."""
    eligible = _eligible(n_layers, k, blacklist)
    return tuple(sorted(random.Random(seed).sample(eligible, k)))




def _to_outputs(results: Sequence[Any]) -> list[Output]:
    return [Output(r.text, list(r.token_ids), list(r.prompt_ids), dict(r.stats)) for r in results]


class ReferenceAdapter:
    """The reference pruned engine, in whatever mode ``spec.pruning`` says."""

    name = "reference"
    modes = ("off", "lossy", "lossless", "static")
    # The router plans one set of blocks for a whole batch (a block is bypassed only if every
    # row agrees), so quality is measured per request.
    batch_size = 1
    LOGITS_MODES = ("off", "static")

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine

    def _config(self, spec: ConfigSpec) -> "PruningConfig":
        if spec.pruning is not None:
            return spec.pruning
        return pruning_config(spec.mode, spec.sensitivity)

    def generate(self, prompts: list[str], max_new_tokens: int, spec: ConfigSpec) -> list[Output]:
        config = self._config(spec)
        # Generation logits equal teacher-forced ones only at batch 1 (left padding changes the
        # arithmetic) and where no router runs: the router's density factor reads the prompt
        # text, which teacher_forced reconstructs from ids (template included), so lossy
        # decisions may differ between the two paths.
        want_logits = config.mode in self.LOGITS_MODES and len(prompts) == 1
        results = self.engine.generate(list(prompts), max_new_tokens=max_new_tokens, config=config,
                                       chat=True, return_logits=want_logits)
        outputs = _to_outputs(results)
        for out, res in zip(outputs, results):
            out.logits = res.logits if want_logits else None
        return outputs

    def teacher_forced_logits(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int],
                              spec: ConfigSpec) -> tuple["torch.Tensor", dict[str, Any]]:
        res = self.engine.teacher_forced(list(prompt_ids), list(continuation_ids), self._config(spec))
        return res.logits, dict(res.stats)


class StaticAdapter:
    """A static baseline: the same k blocks bypassed on every decode token (no router).

    ``kind`` "shortgpt" picks the k lowest Block Influence blocks of the engine's calibration,
    "random" draws k with ``seed``; the first and last blocks (the engine's default blacklist)
    are never chosen. Build a configuration with :meth:`spec_for`.
    """

    modes = ("static",)
    batch_size = 1

    def __init__(self, engine: "Engine", kind: str, seed: int = 0) -> None:
        if kind not in ("shortgpt", "random"):
            raise HarnessInputError(f"static baseline kind must be 'shortgpt' or 'random', got {kind!r}")
        self.engine = engine
        self.kind = kind
        self.seed = seed
        self.name = f"static-{kind}"
        self._reference = ReferenceAdapter(engine)

    @property
    def blacklist(self) -> frozenset[int]:
        return pruning_config("off").blacklist_for(self.engine.dims.n_layers)

    def blocks_for(self, k: int) -> tuple[int, ...]:
        n_layers = self.engine.dims.n_layers
        if self.kind == "shortgpt":
            return shortgpt_blocks(self.engine.calibration().block_influence, k, self.blacklist)
        return random_blocks(n_layers, k, self.blacklist, self.seed)

    def spec_for(self, k: int, matched_to: str | None = None) -> ConfigSpec:
        """Configuration ``static-<kind>/k=K`` with its blocks resolved and recorded in params."""
        blocks = self.blocks_for(k)
        params: dict[str, Any] = {"k": k, "blocks": list(blocks)}
        if self.kind == "random":
            params["seed"] = self.seed
        if matched_to is not None:
            params["matched_to"] = matched_to
        return ConfigSpec(format_config_id(self.name, k=k), self.name, "static", None, params,
                          pruning_config("static", static_bypass=blocks))

    def _spec(self, spec: ConfigSpec) -> ConfigSpec:
        if spec.pruning is not None and spec.pruning.mode == "static":
            return spec
        if "k" not in spec.params:
            raise HarnessInputError(f"configuration {spec.config_id!r} for {self.name!r} needs params['k'] "
                                    "(build it with StaticAdapter.spec_for)")
        return self.spec_for(int(spec.params["k"]), spec.params.get("matched_to"))

    def generate(self, prompts: list[str], max_new_tokens: int, spec: ConfigSpec) -> list[Output]:
        return self._reference.generate(prompts, max_new_tokens, self._spec(spec))

    def teacher_forced_logits(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int],
                              spec: ConfigSpec) -> tuple["torch.Tensor", dict[str, Any]]:
        return self._reference.teacher_forced_logits(prompt_ids, continuation_ids, self._spec(spec))


def need_engine(name: str, engine: Any) -> "Engine":
    """The loaded reference engine a factory was given, or a clear error."""
    if engine is None:
        raise HarnessInputError(f"engine {name!r} needs a loaded reference Engine (engine=...)")
    return engine


@register_engine("reference", modes=("off", "lossy", "lossless"))
def _reference_factory(engine: "Engine | None" = None, **_: Any) -> ReferenceAdapter:
    return ReferenceAdapter(need_engine("reference", engine))


@register_engine("static-shortgpt", modes=("static",))
def _shortgpt_factory(engine: "Engine | None" = None, **_: Any) -> StaticAdapter:
    return StaticAdapter(need_engine("static-shortgpt", engine), "shortgpt")


@register_engine("static-random", modes=("static",))
def _random_factory(engine: "Engine | None" = None, seed: int = 0, **_: Any) -> StaticAdapter:
    return StaticAdapter(need_engine("static-random", engine), "random", seed=seed)
