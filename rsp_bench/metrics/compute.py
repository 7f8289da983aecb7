"""Compute figures: the bypass ratio and decoder blocks executed per decoded token.

Must NOT import torch, transformers, the reference engine, the other metric modules or any
rsp_bench module other than rsp_bench.errors.
"""

from __future__ import annotations

import numpy as np

from rsp_bench.errors import HarnessInputError

__all__ = ["bypass_ratio", "blocks_executed_per_token"]


def bypass_ratio(layers_bypassed: int, blocks: int, tokens: int) -> float:
    """Share of (block, decode token) steps skipped: layers_bypassed / (blocks x tokens); 0 for no tokens."""
    for name, value in (("layers_bypassed", layers_bypassed), ("blocks", blocks), ("tokens", tokens)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise HarnessInputError(f"{name} must be a non-negative integer, got {value!r}")
    if blocks == 0:
        raise HarnessInputError("blocks must be positive, got 0")
    if layers_bypassed > blocks * tokens:
        raise HarnessInputError(
            f"layers_bypassed={layers_bypassed} exceeds blocks x tokens = {blocks} x {tokens}"
        )
    if tokens == 0:
        return 0.0
    return layers_bypassed / (blocks * tokens)


def blocks_executed_per_token(layers_bypassed: int, blocks: int, tokens: int) -> float:
    """Decoder blocks executed per decoded token: blocks x (1 - bypass_ratio), same inputs."""
    return blocks * (1.0 - bypass_ratio(layers_bypassed, blocks, tokens))
