"""Token-level strategies: random token ids, and special token ids in odd places.

Must NOT import torch or the engine (``reference_engine``), nor the other
``rsp_bench.adversarial`` modules.
"""

from __future__ import annotations

from typing import Any, Sequence

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

__all__ = ["random_token_ids", "special_tokens_in_odd_places"]


def _check_vocab(vocab_size: Any) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")


def _check_lengths(min_len: Any, max_len: Any) -> None:
    ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (min_len, max_len))
    if not ok or not 0 <= min_len <= max_len:
        raise ValueError(f"need 0 <= min_len <= max_len (ints), got {min_len!r}, {max_len!r}")


def random_token_ids(vocab_size: int, min_len: int = 1, max_len: int = 64) -> SearchStrategy[list[int]]:
    """Lists of ``min_len``..``max_len`` token ids drawn uniformly-ish from ``[0, vocab_size)``
    (hypothesis also favours the edges 0 and vocab_size - 1)."""
    _check_vocab(vocab_size)
    _check_lengths(min_len, max_len)
    return st.lists(st.integers(0, vocab_size - 1), min_size=min_len, max_size=max_len)


@st.composite
def _specials(draw: Any, specials: tuple[int, ...], vocab_size: int, min_len: int, max_len: int) -> list[int]:
    special_set = set(specials)
    ids = draw(st.lists(
        st.integers(0, vocab_size - 1).filter(lambda i: i not in special_set),
        min_size=min_len, max_size=max_len,
    ))
    for sid in draw(st.lists(st.sampled_from(specials), min_size=1, max_size=6)):
        where = draw(st.sampled_from(("start", "end", "middle", "repeat")))
        if where == "start":
            ids.insert(0, sid)
        elif where == "end":
            ids.append(sid)
        elif where == "repeat":
            pos = draw(st.integers(0, len(ids)))
            ids[pos:pos] = [sid] * draw(st.integers(2, 8))
        else:
            ids.insert(draw(st.integers(0, len(ids))), sid)
    return ids


def special_tokens_in_odd_places(
    special_ids: Sequence[int], vocab_size: int, min_len: int = 1, max_len: int = 64
) -> SearchStrategy[list[int]]:
    """Ordinary token ids with 1-6 special ids (BOS, EOS, chat-role markers, padding) inserted
    at the start, end, middle, or as a repeated run. Ordinary ids never equal a special id."""
    _check_vocab(vocab_size)
    _check_lengths(min_len, max_len)
    specials = tuple(special_ids)
    if not specials:
        raise ValueError("special_ids is empty: give at least one special token id")
    for sid in specials:
        if isinstance(sid, bool) or not isinstance(sid, int) or not 0 <= sid < vocab_size:
            raise ValueError(f"special id {sid!r} is not an int in [0, {vocab_size})")
    if len(set(specials)) >= vocab_size:
        raise ValueError(f"special_ids cover the whole vocabulary of {vocab_size}: no ordinary ids left")
    return _specials(specials, vocab_size, min_len, max_len)
