"""Lenient reading of a model's answer into a JSON object (``parse_json_answer``).

Only recovers the object; scoring it stays strict (``rsp_bench.metrics.fields``).

Must NOT import torch, transformers, the reference engine, the other metric modules or any
rsp_bench module other than rsp_bench.errors.
"""

from __future__ import annotations

import json
import re

from rsp_bench.errors import HarnessInputError

__all__ = ["parse_json_answer"]


_FENCE = re.compile(r"```[A-Za-z0-9_+-]*")
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_NEXT_CLOSER = re.compile(r"\s*[}\]]")
_NEXT_COLON = re.compile(r"\s*:")
# A flat "key": value pair of an object cut short (a string left open at the line's end, a
# missing brace): small models often end their JSON this way, mid-object.
_LOOSE_PAIR = re.compile(r'"([^"\n]+)"\s*:\s*(?:"([^"\n]*)"?|([^,\n}]+))')


def _matching_brace(text: str, start: int) -> int | None:
    """Index of the '}' closing the '{' at ``start``, skipping braces inside quotes."""
    depth, quote, i = 0, None, start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _read_quoted(text: str, start: int) -> tuple[str, int]:
    """Decoded content of the quoted string at ``start`` and the index after it."""
    quote, i = text[start], start + 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    raw = text[start + 1:i]
    if quote == "'":
        raw = raw.replace("\\'", "'").replace('"', '\\"')
    try:
        content = json.loads(f'"{raw}"')
    except json.JSONDecodeError:
        content = raw
    return content, i + 1


def _to_strict_json(text: str) -> str:
    """Repair the usual model slips: single quotes, trailing commas, Python literals, bare keys."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch in "\"'":
            content, i = _read_quoted(text, i)
            out.append(json.dumps(content, ensure_ascii=False))
            continue
        if ch == "," and _NEXT_CLOSER.match(text, i + 1):
            i += 1
            continue
        if ch.isalpha() or ch == "_":
            j = i
            while j < len(text) and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            if _NEXT_COLON.match(text, j):
                out.append(json.dumps(word))
            else:
                out.append(_PY_LITERALS.get(word, word))
            i = j
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def parse_json_answer(text: str) -> dict | None:
    """First balanced {...} object in a model's answer that parses, leniently; else None.

    Tolerates ``` fences, prose around the object, single quotes, trailing commas,
    True/False/None and unquoted keys; when no object parses, the flat ``"key": value`` pairs
    of an object cut short (a string left open at a line end, no closing brace) are recovered.
    Scoring stays strict: this only recovers the object, for pruned and unpruned alike.
    """
    if not isinstance(text, str):
        raise HarnessInputError(f"parse_json_answer expects a string, got {text!r:.200}")
    text = _FENCE.sub(" ", text)
    for start in [i for i, ch in enumerate(text) if ch == "{"]:
        end = _matching_brace(text, start)
        if end is None:
            continue
        candidate = text[start:end + 1]
        for attempt in (candidate, _to_strict_json(candidate)):
            try:
                obj = json.loads(attempt)
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(obj, dict):
                return obj
    return _loose_pairs(text)


def _loose_pairs(text: str) -> dict | None:
    """The flat double-quoted ``"key": value`` pairs after the first ``{``, or None if there are none."""
    start = text.find("{")
    if start < 0:
        return None
    out: dict = {}
    for key, quoted, bare in _LOOSE_PAIR.findall(text, start):
        if bare:
            bare = bare.strip()
            try:
                out[key] = json.loads(bare)
            except json.JSONDecodeError:
                out[key] = bare
        else:
            out[key] = quoted
    return out or None
