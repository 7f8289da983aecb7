"""The adapter protocol and the engine registry: what an engine implements to be put through
the suites, and how it is found by name.

An adapter turns "run these prompts under this configuration" into outputs with stats, and
"score this given continuation" into teacher-forced logits. Everything the quality and speed
suites measure goes through these two calls, so any engine that implements them gets the same
figures. A user's engine plugs in without edits here, lm-evaluation-harness style: decorate a
factory with ``@register_engine("my-engine")`` in an imported module, or declare it in the entry
point group ``rsp_bench.engines`` of its own package (docs/custom-engine.md).

Must NOT import torch, transformers, reference_engine or any adapter module: the pytest plugin
imports this to validate ``--rsp-engine`` and must stay light for runs that never touch a model.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

from rsp_bench.errors import HarnessInputError

if TYPE_CHECKING:  # names only, for type hints
    import torch

ENTRY_POINT_GROUP = "rsp_bench.engines"

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class ConfigSpec:
    """One configuration the suites run: which adapter, how, and under which record id.

    ``pruning`` is the ``reference_engine.PruningConfig`` the reference-family adapters
    execute (None where an adapter needs none, e.g. hf-generate). ``params`` go to the run
    record as they are (``k``, ``blocks``, ``matched_to``, ...).
    """

    config_id: str
    engine: str
    mode: str
    sensitivity: float | None
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    pruning: Any = field(default=None, hash=False, compare=False)


@dataclass
class Output:
    """One generation: ``token_ids`` are the new tokens only (EOS included when emitted).

    ``stats`` should hold ``layers_bypassed``, ``total_tokens`` and ``blocks`` (the decoder
    blocks of the model) for the compute metrics; an engine without them gets no
    bypass_ratio / blocks_executed_per_token rows. ``logits`` ([T, V]) is optional: an adapter
    sets it only when it is exactly what ``teacher_forced_logits(prompt_ids, token_ids, spec)``
    would return, so the runner can skip that second decode when the output equals the
    reference (and the reference run gets its own logits for free).
    """

    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    stats: dict[str, Any]
    logits: Any = None


@runtime_checkable
class EngineAdapter(Protocol):
    """What an engine implements to be benchmarked.

    ``name``: the registry name (first segment of its configuration ids).
    ``modes``: the modes it accepts in ``spec.mode`` (``"off"`` means unpruned).
    ``batch_size``: prompts per ``generate`` call the runner may use (1 = per request,
    which is what quality figures are measured at).
    """

    name: str
    modes: tuple[str, ...]
    batch_size: int

    def generate(self, prompts: list[str], max_new_tokens: int, spec: ConfigSpec) -> list[Output]:
        """Greedy generation for each prompt, chat template applied, under ``spec``."""
        ...

    def teacher_forced_logits(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int],
                              spec: ConfigSpec) -> tuple["torch.Tensor", dict[str, Any]]:
        """Logits [len(continuation), V]: row t predicts continuation[t], feeding the given
        continuation instead of the engine's own choices (pruning applied as in generate)."""
        ...


# --------------------------------------------------------------------------- registry

_REGISTRY: dict[str, Callable[..., EngineAdapter]] = {}


def register_engine(name: str, *, modes: Sequence[str] | None = None,
                    configurations: Callable[[Sequence[str], Sequence[float]], list[ConfigSpec]] | None = None,
                    ) -> Callable[[Callable[..., EngineAdapter]], Callable[..., EngineAdapter]]:
    """Decorator registering an adapter factory under ``name``.

    The factory is called as ``factory(engine=<loaded reference Engine>, model=<path or None>)``
    and must accept (and may ignore) further keyword arguments.

    Two optional declarations are read before any model loads (option checking and test
    collection happen first), so they live on the factory, not on the adapter it builds:

    ``modes``: the modes the engine accepts (``"off"`` is implied). A ``--rsp-mode`` outside
    them is a usage error before any test runs.
    ``configurations(modes, sensitivities)``: the engine's own configurations, replacing the
    mode x sensitivity plan (e.g. one per quantization rung). ``reference/off``, the anchor
    every row is compared with, is always run first and must not be among them.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise HarnessInputError(f"engine name must match [a-z0-9][a-z0-9._-]* (it starts config ids), got {name!r}")

    def decorate(factory: Callable[..., EngineAdapter]) -> Callable[..., EngineAdapter]:
        known = _REGISTRY.get(name)
        # The same factory of the same module registering again is a re-import (pytest's
        # in-process runs, importlib.reload), not a clash between two engines.
        same = known is not None and (known.__module__, known.__qualname__) == (factory.__module__, factory.__qualname__)
        if known is not None and known is not factory and not same:
            raise HarnessInputError(f"engine name {name!r} is already registered (by {known!r})")
        if modes is not None:
            factory.modes = tuple(modes)  # type: ignore[attr-defined]
        if configurations is not None:
            factory.configurations = configurations  # type: ignore[attr-defined]
        _REGISTRY[name] = factory
        return factory

    return decorate


def engine_factory(name: str) -> Callable[..., EngineAdapter]:
    """The factory registered as ``name``; an entry point is loaded on first use."""
    if name not in _REGISTRY:
        ep = _entry_points().get(name)
        if ep is None:
            raise HarnessInputError(
                f"unknown engine {name!r}; available: {', '.join(available_engines())} "
                f"(register one with @register_engine or the {ENTRY_POINT_GROUP!r} entry point group)")
        try:
            _REGISTRY[name] = ep.load()
        except Exception as exc:  # a broken third-party package should say which one
            raise HarnessInputError(f"engine {name!r}: cannot load entry point {ep.value!r}: {exc}") from exc
    return _REGISTRY[name]


def declared_modes(name: str) -> tuple[str, ...] | None:
    """The modes ``name`` declared at registration (``"off"`` included), or None if it declared none."""
    modes = getattr(engine_factory(name), "modes", None)
    if modes is None:
        return None
    return tuple(dict.fromkeys(("off", *modes)))


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_engines() -> list[str]:
    """Registered names plus those declared in the ``rsp_bench.engines`` entry point group
    (listed without importing them)."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


def get_engine(name: str, **kwargs: Any) -> EngineAdapter:
    """Build the adapter registered as ``name``; entry points are loaded on first use."""
    adapter = engine_factory(name)(**kwargs)
    for attr in ("name", "generate", "teacher_forced_logits"):
        if not hasattr(adapter, attr):
            raise HarnessInputError(f"engine {name!r}: its factory returned {adapter!r}, which has no {attr!r}")
    return adapter
