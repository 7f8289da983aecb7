"""A bounded memo of batch-1 prompt prefills, for measurement runs that send one prompt through
many configurations.

Prefill is never pruned, so a prompt's KV cache, its residual streams and its first token's
logits are the same in every mode (off, lossy, static) and in teacher forcing. The harness's
quality suites run each prompt through about ten configurations at batch 1; with the memo on
(``Engine.memoized_prefill``) the engine prefills it once and copies the stored tensors into each
later request's cache. The copies are the same bits, so no figure moves; timings do (a hit has
almost no prefill time), which is why the memo is off unless a caller turns it on for a block of
quality work, and the throughput suite never does.

Must not import the engine or the harness; only torch and ``model``'s cache type.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from .model import KVCache


@dataclass
class PrefillEntry:
    """What a batch-1 prefill of ``length`` positions left behind."""

    k: list[torch.Tensor]  # per layer [1, KV, length, hd]
    v: list[torch.Tensor]
    hidden: list[torch.Tensor]  # per block input and the final stream, [1, length, D] each
    logits: torch.Tensor  # [1, V], the prompt's last position
    length: int

    @property
    def nbytes(self) -> int:
        tensors = [*self.k, *self.v, *self.hidden, self.logits]
        return sum(t.numel() * t.element_size() for t in tensors)

    def restore(self, cache: KVCache) -> None:
        """Write the stored keys and values into the first ``length`` positions of ``cache``."""
        for dst, src in zip(cache.k, self.k):
            dst[:, :, :self.length].copy_(src)
        for dst, src in zip(cache.v, self.v):
            dst[:, :, :self.length].copy_(src)
        cache.length = self.length


class PrefillMemo:
    """Least-recently-used prefills up to ``max_bytes``; keys are whatever the engine says makes
    two prefills equal (prompt ids, decode kernel)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, PrefillEntry] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple) -> PrefillEntry | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: tuple, cache: KVCache, hidden: list[torch.Tensor], logits: torch.Tensor) -> None:
        """Keep a copy of a finished batch-1 prefill (``cache.length`` positions)."""
        n = cache.length
        entry = PrefillEntry([t[:, :, :n].clone() for t in cache.k], [t[:, :, :n].clone() for t in cache.v],
                             [h.clone() for h in hidden], logits.clone(), n)
        if entry.nbytes > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        self._entries[key] = entry
        self.bytes += entry.nbytes
        while self.bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= dropped.nbytes

    def __len__(self) -> int:
        return len(self._entries)
