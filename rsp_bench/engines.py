"""Engine adapters: the small protocol an engine implements to be put through the suites.

An adapter turns "run these prompts under this configuration" into outputs with stats, and
"score this given continuation" into teacher-forced logits. Everything the quality and speed
suites measure goes through these two calls, so any engine that implements them (the
reference pruned engine, plain Hugging Face ``generate``, a user's own engine) gets the same
figures. Built-in adapters:

  reference        the reference pruned engine (``reference_engine.Engine``), any mode
  hf-generate      plain ``transformers`` ``model.generate(do_sample=False)`` on the same
                   weights: the unpruned peer; teacher forcing is one forward pass
  static-shortgpt  the k blocks with the lowest ShortGPT Block Influence (1 - cos(in, out),
                   from the engine's calibration) bypassed on every decode token
  static-random    k blocks drawn with a fixed seed, bypassed on every decode token

Both static adapters run through the reference engine's ``mode="static"``: the same bypass
maps as the router, so they differ from the dynamic engine only in *which* blocks are skipped.
That is the comparison the static rows exist for: what per-token routing buys at equal compute.

A user's engine plugs in without edits here, lm-evaluation-harness style: decorate a factory
with ``@register_engine("my-engine")`` in an imported module, or declare it in the entry point
group ``rsp_bench.engines`` of its own package (docs/custom-engine.md).

Must NOT import torch, transformers or reference_engine at module import: the pytest plugin
imports this module to validate ``--rsp-engine`` and must stay light for runs that never touch
a model. Adapters import them when they are built.
"""

from __future__ import annotations

import importlib.metadata
import math
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

from rsp_bench.errors import HarnessInputError

if TYPE_CHECKING:  # names only, for type hints
    import torch
    from reference_engine import Engine, PruningConfig

__all__ = [
    "ENTRY_POINT_GROUP", "SUITE_WATERMARK", "ConfigSpec", "Output", "EngineAdapter",
    "register_engine", "get_engine", "available_engines", "format_config_id",
    "plan_configs", "pruning_config", "matched_k", "shortgpt_blocks", "random_blocks",
    "ReferenceAdapter", "HFGenerateAdapter", "StaticAdapter",
]

ENTRY_POINT_GROUP = "rsp_bench.engines"

# Every suite configuration pins the hardware watermark to 0.0 (an idle machine). Left free,
# the router samples the machine's load per request and raises its threshold on a busy box,
# so quality figures would depend on who else is using the CPUs; pinned, they are
# deterministic and comparable with a baseline taken on another day.
SUITE_WATERMARK = 0.0

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


def register_engine(name: str) -> Callable[[Callable[..., EngineAdapter]], Callable[..., EngineAdapter]]:
    """Decorator registering an adapter factory under ``name``.

    The factory is called as ``factory(engine=<loaded reference Engine>, model=<path or None>)``
    and must accept (and may ignore) further keyword arguments.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise HarnessInputError(f"engine name must match [a-z0-9][a-z0-9._-]* (it starts config ids), got {name!r}")

    def decorate(factory: Callable[..., EngineAdapter]) -> Callable[..., EngineAdapter]:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise HarnessInputError(f"engine name {name!r} is already registered (by {_REGISTRY[name]!r})")
        _REGISTRY[name] = factory
        return factory

    return decorate


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_engines() -> list[str]:
    """Registered names plus those declared in the ``rsp_bench.engines`` entry point group
    (listed without importing them)."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


def get_engine(name: str, **kwargs: Any) -> EngineAdapter:
    """Build the adapter registered as ``name``; entry points are loaded on first use."""
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
    adapter = _REGISTRY[name](**kwargs)
    for attr in ("name", "generate", "teacher_forced_logits"):
        if not hasattr(adapter, attr):
            raise HarnessInputError(f"engine {name!r}: its factory returned {adapter!r}, which has no {attr!r}")
    return adapter


# --------------------------------------------------------------------------- configurations


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
    """``reference/off`` first, then ``<engine>/off`` for a non-reference engine, then one
    configuration per mode x sensitivity. ``with_pruning=False`` skips building the
    PruningConfig (collection needs only the ids and must not import torch)."""
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
        pruning = pruning_config(mode, s) if with_pruning and eng == "reference" else None
        if with_pruning and eng != "reference":
            # A user's engine may still read the reference knobs; give them when they are valid.
            try:
                pruning = pruning_config(mode, s)
            except ValueError:
                pruning = None
        specs.append(ConfigSpec(format_config_id(eng, mode, s), eng, mode, s, {}, pruning))
    return specs


def matched_k(bypass_ratio: float, n_layers: int) -> int:
    """Blocks a static baseline removes to match a dynamic run's executed-block budget:
    round(mean blocks bypassed per decoded token) = round(bypass_ratio x blocks), halves up."""
    if not (isinstance(bypass_ratio, (int, float)) and math.isfinite(bypass_ratio) and 0 <= bypass_ratio <= 1):
        raise HarnessInputError(f"bypass_ratio must be a number in [0, 1], got {bypass_ratio!r}")
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise HarnessInputError(f"n_layers must be a positive integer, got {n_layers!r}")
    return int(math.floor(bypass_ratio * n_layers + 0.5))


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
    import random

    eligible = _eligible(n_layers, k, blacklist)
    return tuple(sorted(random.Random(seed).sample(eligible, k)))


# --------------------------------------------------------------------------- adapters


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


class HFGenerateAdapter:
    """Plain ``transformers`` greedy ``generate`` on the engine's weights: the unpruned peer.

    It shares the reference engine's tokenizer and chat template (``engine.encode``) so both
    see identical prompt ids; any difference in output is then the decode loop's.
    """

    name = "hf-generate"
    modes = ("off",)
    batch_size = 1

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        self.model = engine.hf_model

    def _check(self, spec: ConfigSpec) -> None:
        if spec.mode != "off":
            raise HarnessInputError(f"engine 'hf-generate' only runs mode 'off' (unpruned), got {spec.mode!r} "
                                    f"in configuration {spec.config_id!r}")

    def generate(self, prompts: list[str], max_new_tokens: int, spec: ConfigSpec) -> list[Output]:
        import torch
        from transformers import GenerationConfig

        self._check(spec)
        # A fresh GenerationConfig so the checkpoint's own defaults (sampling, repetition
        # penalty, extra stop ids) cannot make the peer differ from plain greedy decoding.
        gen_cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                   eos_token_id=self.engine.eos_id, pad_token_id=self.engine.pad_id)
        n_layers = self.engine.dims.n_layers
        outputs = []
        for prompt in prompts:
            ids = self.engine.encode(prompt, chat=True)
            t0 = time.perf_counter()
            with torch.no_grad():
                seq = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                          generation_config=gen_cfg)
            new = seq[0, len(ids):].tolist()
            stats = {"layers_bypassed": 0, "total_tokens": len(new), "bypass_ratio": 0.0, "blocks": n_layers,
                     "degraded": False, "degraded_reason": None, "mode": "off", "sensitivity": None,
                     "prompt_tokens": len(ids), "decode_time_s": time.perf_counter() - t0, "batch_size": 1}
            outputs.append(Output(self.engine.decode(new), new, list(ids), stats))
        return outputs

    def teacher_forced_logits(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int],
                              spec: ConfigSpec) -> tuple["torch.Tensor", dict[str, Any]]:
        import torch

        self._check(spec)
        if len(continuation_ids) == 0 or len(prompt_ids) == 0:
            raise HarnessInputError("teacher forcing needs a non-empty prompt and continuation")
        ids = torch.tensor([list(prompt_ids) + list(continuation_ids)[:-1]])
        with torch.no_grad():
            logits = self.model(ids).logits[0].float()
        p, t = len(prompt_ids), len(continuation_ids)
        # Position p-1 (the last prompt token) predicts continuation[0], and so on.
        stats = {"layers_bypassed": 0, "total_tokens": t, "bypass_ratio": 0.0,
                 "blocks": self.engine.dims.n_layers, "mode": "off"}
        return logits[p - 1:p - 1 + t].clone(), stats


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


def _need_engine(name: str, engine: Any) -> "Engine":
    if engine is None:
        raise HarnessInputError(f"engine {name!r} needs a loaded reference Engine (engine=...)")
    return engine


@register_engine("reference")
def _reference_factory(engine: "Engine | None" = None, **_: Any) -> ReferenceAdapter:
    return ReferenceAdapter(_need_engine("reference", engine))


@register_engine("hf-generate")
def _hf_factory(engine: "Engine | None" = None, **_: Any) -> HFGenerateAdapter:
    return HFGenerateAdapter(_need_engine("hf-generate", engine))


@register_engine("static-shortgpt")
def _shortgpt_factory(engine: "Engine | None" = None, **_: Any) -> StaticAdapter:
    return StaticAdapter(_need_engine("static-shortgpt", engine), "shortgpt")


@register_engine("static-random")
def _random_factory(engine: "Engine | None" = None, seed: int = 0, **_: Any) -> StaticAdapter:
    return StaticAdapter(_need_engine("static-random", engine), "random", seed=seed)
