"""The request rule's first half: which tokens of a prompt are a request written in words.

A developer asks about a payload all day ("decode this base64: ...", "sort these: ...", "what does
this regex match?"). The payload alone is machine-made text, and the out-of-distribution score
(``reference_engine.ood``) is right to call it odd; wrapped in a request it is an ordinary request.
The rule (issue 26): the score judges the whole prompt; when the whole looks odd, it judges the
prompt's *request words* alone, and a request that reads as ordinary language keeps pruning on.
A payload with no request around it has no request words and is judged as before.

Request words are found in the prompt's own text, then mapped to the tokens the model read
(``text_request_tokens``, from the tokenizer's character offsets): a *word* is a run of letters of
any script (inner apostrophes kept: "what's") that touches no digit ("md5", "base64" and "8th" are
no words); words joined only by spaces and punctuation form a *run*, and anything else (a digit, a
symbol, a line break, a "word" of over ``MAX_WORD_LETTERS`` letters such as a DNA sequence, or
phonetic symbols) ends it. A run is request words when its weight reaches ``MIN_RUN``: a word
weighs 1, a one-letter word 0 (a note name or a variable neither counts nor ends a run), and a
word of a script written without spaces (Chinese, Japanese, Thai, Lao, Khmer, Myanmar) half its
characters, about what it holds in words. So "decode this morse please:", "what does this
base64 string say?" ("What does this") and "请帮我算一下这些成绩的平均数" are requests; "dedupe:" and
"decode this base64 please:" ("decode this" and "please", cut apart by "base64") are not, and a
hash, a UUID or a base64 string (letters cut by digits) has none. Random letters or shuffled real
words do form runs: the score then judges them, and they read as odd.

The first version counted only whole-word *vocabulary pieces* (``request_tokens``, kept as the
fallback when the tokenizer gives no offsets): a word the tokenizer splits ("dig" + "ests"), a
digit-bearing word or a script it learned few merges for cut every run, and on the development
split (fixtures/degradation_heldout) 22 of the 24 data requests that still degraded had no
request words at all (German, Spanish, Chinese, Japanese requests, and short English ones such
as "decode this morse please:").

``MIN_RUN`` = 3 was chosen on the development split (``rsp_bench.adversarial.data_requests``,
the tuning classes of generated odd text, and their payloads alone) with the first version: 2 and
3 exonerated every development request and none of the odd classes, 4 left 11 of 78 requests
degraded.

Must NOT import: ``rsp_bench``, torch, or other modules of this package. Only stdlib and numpy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

MIN_RUN = 3

# A word: letters only (with the marks that spell Indic, Southeast Asian, Hebrew or Arabic words,
# which Python's \\w leaves out), not touching a digit or another letter ("md5", "8th" and
# "base64" are none).
_CH = ("(?:[^\\W\\d_]|[\u0300-\u036f\u0483-\u0489\u0591-\u05c7\u0610-\u061a\u064b-\u065f\u0670"
       "\u06d6-\u06ed\u0900-\u0dff\u0e00-\u0fff\u1000-\u109f\u1780-\u17ff\u1ab0-\u1aff\u1dc0-\u1dff])")
_WORD_RE = re.compile(f"(?<![^\\W_]){_CH}+(?:['\u2019]{_CH}+)*(?![^\\W_])")
# What may sit between two words of one run: spaces (not a line break) and sentence punctuation of
# any script. A line break ends a run: a payload often starts on the line after its request.
_JOIN_RE = re.compile("(?:[^\\S\\n]|[,.:;?!\"'()\\[\\]\u00ab\u00bb\u201e\u201c\u201d\u2018\u2019\u00bf\u00a1"
                      "\u3001\u3002\uff0c\uff1a\uff1b\uff1f\uff01\u300c\u300d\u300e\u300f\uff08\uff09\\-\u2013\u2014/])*")
# Scripts written without spaces between words: Thai, Lao, Myanmar, Khmer, kana, CJK ideographs.
_NO_SPACE_RE = re.compile("[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")
# Phonetic letters (IPA, modifier letters): a transcription is a payload, not words of a request.
_PHONETIC_RE = re.compile("[\u0250-\u02ff\u1d00-\u1dbf]")
# A spaced-script "word" longer than this is a payload (a DNA sequence, a run of base64 letters).
MAX_WORD_LETTERS = 20


def _weight(word: str) -> float | None:
    """What a word adds to its run: 1, half the characters of a word of an unspaced script, 0 for
    one letter (a note name, a variable, a list label: it neither counts nor ends the run); None
    for no word at all (too long, or phonetic), which ends the run."""
    if _PHONETIC_RE.search(word):
        return None
    unspaced = len(_NO_SPACE_RE.findall(word))
    if unspaced:
        return max(1.0, unspaced / 2)
    if len(word) > MAX_WORD_LETTERS:
        return None
    return 0.0 if len(word) == 1 else 1.0


def request_spans(text: str, min_run: float = MIN_RUN) -> list[tuple[int, int]]:
    """Character spans of the words of every run of weight >= ``min_run``, in text order."""
    spans: list[tuple[int, int]] = []
    run: list[tuple[int, int]] = []
    weight, end = 0.0, 0
    for m in _WORD_RE.finditer(text):
        w = _weight(m.group())
        if run and (w is None or not _JOIN_RE.fullmatch(text[end:m.start()])):
            if weight >= min_run:
                spans += run
            run, weight = [], 0.0
        end = m.end()
        if w is not None:
            run.append((m.start(), m.end()))
            weight += w
    if weight >= min_run:
        spans += run
    return spans


def text_request_tokens(text: str, offsets: Sequence[tuple[int, int]], min_run: float = MIN_RUN) -> list[int]:
    """Indices into ``offsets`` (one (start, end) character span per token of ``text``) of the
    tokens that overlap a request word."""
    spans = request_spans(text, min_run)
    out, j = [], 0
    for i, (s, e) in enumerate(offsets):
        while j < len(spans) and spans[j][1] <= s:
            j += 1
        if j < len(spans) and e > s and spans[j][0] < e:
            out.append(i)
    return out

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
