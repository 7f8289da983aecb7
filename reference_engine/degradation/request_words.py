"""The request rule's first half: which tokens of a prompt are a request written in words.

A developer asks about a payload all day ("decode this base64: ...", "sort these: ...", "what does
this regex match?"). The payload alone is machine-made text, and the out-of-distribution score
(``reference_engine.ood``) is right to call it odd; wrapped in a request it is an ordinary request.
The rule (issue 26): the score judges the whole prompt; when the whole looks odd, it judges the
prompt's *request words* alone, and a request that reads as ordinary language keeps pruning on.
A payload with no request around it has no request words and is judged as before.

Request words come from the model's own vocabulary, not from a list of prompts or verbs: a
*word token* is one vocabulary piece that is a whole word of at least two letters (any script):
it starts a word (a leading space, the start of the content, a line, or after punctuation) and the
next piece does not continue it. The tokenizer learned such pieces from the text the model was
trained on, so "Check", " this", " for", " me" are word tokens, and a base64 string, a hash, a
UUID, keyboard mash or invented words fall apart into fragments that are not. Request words are
the word tokens in runs of at least ``MIN_RUN`` (only punctuation between them; a blank line
ends a run): a stray vocabulary word inside random text is not a request.

``MIN_RUN`` = 3 was chosen on the development split (``rsp_bench.adversarial.data_requests``,
the tuning classes of generated odd text, and their payloads alone): 2 and 3 exonerated every
development request and none of the odd classes, 4 left 11 of 78 requests degraded.

Must NOT import: ``rsp_bench``, torch, or other modules of this package. Only stdlib and numpy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

MIN_RUN = 3

#: Piece classes (one int8 per vocabulary id). SPACED / GLUED: anything else, starting with
#: whitespace or not (a glued piece continues the word before it).
GLUED, SPACED, WORD_LEAD, LETTERS, PUNCT, BREAK = 0, 1, 2, 3, 4, 5

_LETTERS = re.compile(r"^[^\W\d_]{2,}$")
_PUNCT = re.compile(r"^[\s,.:;?!'\"()\-]*$")


def piece_class(piece: str) -> int:
    """The class of one decoded vocabulary piece."""
    if "\n\n" in piece:
        return BREAK
    if piece.startswith(" ") and _LETTERS.match(piece[1:]):
        return WORD_LEAD
    if _LETTERS.match(piece):
        return LETTERS
    if _PUNCT.match(piece):
        return PUNCT
    return SPACED if piece[:1].isspace() else GLUED


@dataclass(frozen=True)
class Pieces:
    """Per vocabulary id: its ``piece_class`` and its length in characters."""

    classes: np.ndarray  # [V] int8
    chars: np.ndarray  # [V] int32


def pieces(decode: Callable[[list[int]], str], vocab: int) -> Pieces:
    """The vocabulary's pieces, decoded once per tokenizer (about a second for 49k ids)."""
    text = [decode([i]) for i in range(vocab)]
    return Pieces(np.array([piece_class(t) for t in text], dtype=np.int8), np.array([len(t) for t in text], np.int32))


_ENDS_WORD = (SPACED, WORD_LEAD, PUNCT, BREAK)  # what may follow a whole word


def request_tokens(ids: Sequence[int], lo: int, hi: int, classes: np.ndarray, min_run: int = MIN_RUN) -> list[int]:
    """Indices into ``ids`` (within the content ``[lo, hi)``) of the request words."""
    c = classes[np.asarray(ids[lo:hi], dtype=np.int64)].tolist()
    n = len(c)
    runs: list[list[int]] = []
    cur: list[int] = []
    for i in range(n):
        starts = c[i] == WORD_LEAD or (c[i] == LETTERS and (i == 0 or c[i - 1] in (PUNCT, BREAK)))
        if starts and (i + 1 == n or c[i + 1] in _ENDS_WORD):
            cur.append(lo + i)
        elif c[i] != PUNCT:  # punctuation joins the words of a run; anything else ends it
            if cur:
                runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [i for run in runs if len(run) >= min_run for i in run]
