"""Words whose shape says the text was transformed: ``spelled_out_words`` (a word written letter
by letter between dots or hyphens, "b.u.i.l.d", the classic way past a word filter) and
``tagged_words`` (every word carrying a bracketed tag, "Margit,(6) who(3) keeps(5)").

Both were chosen on the text of every reported split (12-03 through 12-07e) and the normal corpus
(22,988 items); the figures are in ``TextThresholds``' comments and ``pytest
tests/test_degradation_text.py -k "spelled or tagged"``.

Must NOT import: ``rsp_bench`` (the engine never depends on the harness), torch, or any other
module of this package. Only stdlib.
"""

from __future__ import annotations

import re

# Four or more single letters joined by one separator, standing alone as a word.
_SPELLED_RE = re.compile(r"(?<![\w.\-])((?:[^\W\d_]([.\-*·_])){3,}[^\W\d_])\2?(?![\w\-])")
# A word with one short bracketed tag attached: "word(3)", "word,[NN]", "word{7}."
_TAGGED_RE = re.compile(r"[^\W\d_]+[^\w\s]?[(\[{<][^\s()\[\]{}<>]{1,8}[)\]}>][^\w\s]?")


def spelled_out_words(text: str) -> list[str]:
    """The words written letter by letter in ``text`` (the letters joined), leaving out runs of
    five or fewer capitals (acronyms: "U.S.A.", "N.A.S.A.")."""
    if "." not in text and "-" not in text and "*" not in text and "·" not in text and "_" not in text:
        return []
    words = []
    for m in _SPELLED_RE.finditer(text):
        run, sep = m.group(1), m.group(2)
        pieces = run.split(sep)
        if any(len(p) != 1 for p in pieces):
            continue
        letters = "".join(pieces)
        if letters.isupper() and len(letters) <= 5:
            continue
        words.append(letters)
    return words


def spelled_out(text: str, min_distinct: int) -> bool:
    """Whether a word is spelled out letter by letter with at least ``min_distinct`` different
    letters (drum tabs "x-x-x-x" and Java's abbreviated packages "o.a.c.c" have fewer)."""
    return min_distinct > 0 and any(len(set(w.casefold())) >= min_distinct for w in spelled_out_words(text))


def tagged_words(text: str, min_words: int, share: float) -> bool:
    """Whether at least ``share`` of the text's (at least ``min_words``) whitespace-separated
    tokens are a word with a short bracketed tag attached."""
    tokens = text.split()
    if len(tokens) < min_words or min_words <= 0:
        return False
    return sum(1 for t in tokens if _TAGGED_RE.fullmatch(t)) >= share * len(tokens)
