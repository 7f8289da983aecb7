"""The registry of named text classes: ``AdversarialClass`` and ``STRATEGIES``.

Each class records whether a protective detector should turn pruning off for it
(``expect_degrade``, DESIGN.md section 2).

Must NOT import torch or the engine (``reference_engine``); of ``rsp_bench.adversarial``
only ``prose`` and ``anomalies`` (which must not import this one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from hypothesis.strategies import SearchStrategy

from rsp_bench.adversarial.anomalies import (
    bidi_override,
    char_run,
    combining_flood,
    control_chars,
    emoji_flood,
    empty_or_whitespace,
    invalid_bytes_lenient,
    lone_surrogates,
    lone_surrogates_lenient,
    mixed_script_flood,
    prompt_injection,
    punctuation_run,
    replacement_chars,
    zero_width,
)
from rsp_bench.adversarial.prose import multilingual_normal_text, normal_text

__all__ = ["AdversarialClass", "STRATEGIES"]


@dataclass(frozen=True)
class AdversarialClass:
    """A named input class: its strategy factory, whether a detector should degrade on it,
    and what it contains."""

    name: str
    strategy_fn: Callable[[], SearchStrategy[str]]
    expect_degrade: bool
    description: str

    def strategy(self) -> SearchStrategy[str]:
        """The class's strategy (calls ``strategy_fn``)."""
        return self.strategy_fn()


def _register(*classes: AdversarialClass) -> dict[str, AdversarialClass]:
    out: dict[str, AdversarialClass] = {}
    for c in classes:
        if c.name in out:
            raise ValueError(f"duplicate adversarial class name {c.name!r}")
        out[c.name] = c
    return out


def _doc(fn: Callable[..., Any]) -> str:
    return " ".join((fn.__doc__ or "").split("\n\n")[0].split())


#: Every named text class. ``near_context_limit`` is not here: it needs a token budget.
STRATEGIES: dict[str, AdversarialClass] = _register(*[
    AdversarialClass(fn.__name__ if name is None else name, fn, expect, _doc(fn))
    for name, fn, expect in (
        (None, control_chars, True),
        (None, zero_width, True),
        (None, combining_flood, True),
        (None, replacement_chars, True),
        (None, bidi_override, True),
        (None, lone_surrogates, True),
        (None, lone_surrogates_lenient, True),
        (None, invalid_bytes_lenient, True),
        (None, punctuation_run, True),
        (None, char_run, True),
        (None, mixed_script_flood, True),
        (None, emoji_flood, True),
        (None, prompt_injection, True),
        (None, empty_or_whitespace, True),
        (None, normal_text, False),
        (None, multilingual_normal_text, False),
    )
])
