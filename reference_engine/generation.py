"""What a generation call takes and returns: a prompt row (text, ids, a degradation verdict),
a generation result, and the check that rows fit the context.

Why a module of its own: the engine (engine.py) and lossless mode (speculative.py) both build
and return these. With them here, speculative.py needs nothing from engine.py at run time
(it names ``Engine`` in annotations only), and engine.py imports speculative.py one way.

Must not import engine.py, speculative.py or the harness (``rsp_bench``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .errors import PromptError

__all__ = ["GenerationResult", "PromptRow", "check_rows_fit"]


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    stats: dict[str, Any]
    logits: torch.Tensor | None = None  # [T, V], only from teacher_forced


@dataclass
class PromptRow:
    """One prompt of a call: its text, its ids, and why it was degraded (None if it was not)."""

    prompt: str
    ids: list[int]
    degraded_reason: str | None = None


def check_rows_fit(rows: "list[PromptRow]", max_new: int, max_positions: int) -> None:
    """Raise PromptError naming the first prompt that is empty or leaves no room for max_new tokens."""
    for i, r in enumerate(rows):
        if not r.ids:
            raise PromptError(f"prompt {i} encodes to no tokens: {r.prompt!r}")
        if len(r.ids) + max_new > max_positions:
            raise PromptError(
                f"prompt {i} is {len(r.ids)} tokens; with max_new_tokens={max_new} it exceeds the "
                f"model's context of {max_positions} tokens")
