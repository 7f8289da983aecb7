"""Prose carried in code or markup with no request around it: ``prose_in_container``.

A request that carries data is a request ("which of these rows have no body?" above a SQL dump);
the same payload alone, with no request around it, may degrade. This module finds the one payload
the model-level score cannot: running prose (low loss, ordinary language) poured into the string
literals and text nodes of a container (SQL ``VALUES``, XML CDATA, Graphviz labels, a Python list,
JSON records), with nothing outside the container that a person wrote to the model.

How it reads a prompt: the bodies of string literals (``"..."``, ``'...'``, backticks), CDATA
sections and text nodes between tags are the container's *contents*; a body is prose when it holds
a run of at least six words (a script written without spaces counts half its characters). Each
line, with its literals blanked, is *syntax* when it carries code or markup (brackets, ``=``,
``;``, ``|``, a ``key:`` or list marker, a comment marker, or a blanked literal) and no run of three
plain words of which at least two are not all capitals (``INSERT INTO notes`` is syntax; "which
rows fail" is not); any other line with a word on it is a *request line*. The prompt fires when it
has no request line, at least ``min_spans`` prose bodies holding ``min_words`` words together, and
those words are at least ``share`` of all its words.

Chosen on the text of every reported split (12-03 through 12-07e) and the normal corpus (22,988
items): 142 odd items fire (prose in XML, SQL, TOML, CSS, Python, JSON, SVG, Graphviz; planted
directives in HTML and tool results), and 21 payloads without their request, and no data request,
plain request in any language or normal item (``pytest tests/test_degradation_text.py -k
container``). Comments are read as request lines when they hold three plain words, so prose in
comments and unquoted values (``key = prose``, ``\\item prose``, table cells) are never judged: a
plain request set out as a list looks the same.

Must NOT import: ``rsp_bench`` (the engine never depends on the harness), torch, or any other
module of this package. Only stdlib.
"""

from __future__ import annotations

import re

_WORD = r"[^\W\d_]+(?:['’\-][^\W\d_]+)*"
_PROSE_RUN = re.compile(_WORD + r"(?:[,;]?\s+" + _WORD + r"){5,}")
# Scripts written without spaces between words: half a word a character, as the request rule counts.
_NO_SPACE_RUN = re.compile(r"[\u0e00-\u0e7f\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]{6,}")
_CDATA = re.compile(r"<!\[CDATA\[(.*?)\]\]>", re.S)
_LITERALS = (
    # An opening quote is never one escaped by a backslash: then a literal that finds no end fails
    # once for its whole line, not once per escaped quote after it.
    re.compile(r'(?<!\\)"((?:[^"\\\n]|\\.)*)"'),
    re.compile(r"(?<!\\)'((?:[^'\\\n]|\\.|'')*)'"),
    re.compile(r">([^<>]*)<"),
    re.compile(r"`([^`\n]*)`"),
)
_SYNTAX = re.compile(r"[<>{}\[\]=;|]|^\s*[\w.\-]+\s*:\s|^\s*[-*+]\s|^\s*\d+[.)]\s|^\s*(?:#|//|--|%|;)")
_THREE_WORDS = re.compile(r"(?<![\w\-./@#$])" + _WORD + r"(?:,? " + _WORD + r"){2,}(?![\w\-/@(])")
_BLANK = "\x00"


def _prose_words(body: str) -> int:
    return (sum(len(m.group().split()) for m in _PROSE_RUN.finditer(body))
            + sum(len(m.group()) // 2 for m in _NO_SPACE_RUN.finditer(body)))


def _plain_words(line: str) -> bool:
    """Whether the line holds three plain words in a row, at least two of them not all capitals."""
    for m in _THREE_WORDS.finditer(line):
        words = m.group().replace(",", " ").split()
        if sum(1 for w in words if not w.isupper()) >= 2:
            return True
    return False


def container_parts(text: str) -> tuple[list[int], list[str]]:
    """(the word count of each prose body in the text's literals and text nodes, the request lines
    outside them), as the module docstring defines both."""
    spans: list[int] = []

    def blank(m: re.Match[str]) -> str:
        n = _prose_words(m.group(1))
        if n >= 6:
            spans.append(n)
        whole = m.group(0)
        return whole[0] + _BLANK * (len(whole) - 2) + whole[-1]

    # CDATA first, and only up to the last "]]>": an opening with no end after it would make the
    # lazy match scan to the end of the text once per opening.
    end = text.rfind("]]>") + 3
    masked = _CDATA.sub(blank, text[:end]) + text[end:] if end > 2 else text
    for literal in _LITERALS:
        masked = literal.sub(blank, masked)
    requests = []
    for line in masked.splitlines():
        plain = line.replace(_BLANK, " ")
        if not re.search(r"[^\W\d_]{2,}", plain):
            continue
        if (_SYNTAX.search(line) or _BLANK in line) and not _plain_words(plain):
            continue
        requests.append(plain)
    return spans, requests


def prose_in_container(text: str, min_spans: int, min_words: int, share: float) -> bool:
    """Whether the text is prose in a container with no request around it (module docstring)."""
    if '"' not in text and "'" not in text and "<" not in text and "`" not in text:
        return False  # no literal, no text node: the common case, decided without a regex
    spans, requests = container_parts(text)
    if len(spans) < min_spans or sum(spans) < min_words or requests:
        return False
    words = len(re.findall(_WORD, text)) + sum(len(m.group()) // 2 for m in _NO_SPACE_RUN.finditer(text))
    return sum(spans) >= share * words
