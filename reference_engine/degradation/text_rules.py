"""The text-level checks: ``text_anomaly_reason`` / ``text_anomaly_reasons`` judge a prompt's
scan (.scan) and its runs, floods and patterns against ``TextThresholds`` and yield reasons
in ``REASONS`` order.

Must NOT import: ``rsp_bench`` (the engine never depends on the harness), torch (the
harness and tests import this without a model), or modules of this package other than
.chars, .containers, .embedded_instructions, .scan, .thresholds, .word_shapes. Only stdlib.
"""

from __future__ import annotations

import math
import re
import unicodedata
from functools import lru_cache
from typing import Iterator

from .chars import _is_emoji, _is_separator_char, _separator_neighbour_ok
from .containers import prose_in_container
from .embedded_instructions import embedded_instruction, normalise_for_patterns
from .scan import _scan, _scan_ascii
from .thresholds import TextThresholds
from .word_shapes import spelled_out, tagged_words

_RUN_RE = re.compile(r"(.)\1{11,}", re.DOTALL)
_HEX_RUN_OK = frozenset("0fF")


def _run_reason(text: str, t: TextThresholds) -> str | None:
    """Runs of one character: punctuation, alphanumerics/emoji, whitespace."""
    shortest = min(t.punctuation_run, t.char_run, t.whitespace_run)
    run_re = _RUN_RE if shortest == 12 else re.compile(r"(.)\1{%d,}" % (shortest - 1), re.DOTALL)
    for m in run_re.finditer(text):
        ch = m.group(1)
        length = m.end() - m.start()
        if ch.isspace():
            if length >= t.whitespace_run:
                return "whitespace_run"
            continue
        cat = unicodedata.category(ch)
        if cat[0] in "PS" and not _is_emoji(ord(ch)):
            if length < t.punctuation_run:
                continue
            if _separator_allowed(text, m.start(), m.end(), t):
                continue
            if ch == "<" and _in_mrz_line(text, m.start()):
                continue
            return "punctuation_run"
        if length < t.char_run:
            continue
        if (cat[0] == "S" or _is_emoji(ord(ch))) and _separator_allowed(text, m.start(), m.end(), t):
            continue  # an emoji or symbol banner line
        if ch in _HEX_RUN_OK and length <= 64 and _in_hex_literal(text, m.start()):
            continue
        return "char_run"
    for m in _MIXED_PUNCT_RE.finditer(text):
        if m.end() - m.start() < t.mixed_punctuation_run:
            continue
        other = sum(
            1 for c in m.group()
            if unicodedata.category(c)[0] in "PS" and not _is_emoji(ord(c)) and not _is_separator_char(c)
        )
        if other >= t.mixed_punctuation_other_min:
            return "punctuation_run"
    return None


# Maximal stretches with no letter, digit, underscore or whitespace; lengths are checked
# against the thresholds above (the regex floor keeps the scan cheap).
_MIXED_PUNCT_RE = re.compile(r"[^\w\s]{24,}")


_CONTENT_RE = re.compile(r"[^\W_]")


def _separator_allowed(text: str, start: int, end: int, t: TextThresholds) -> bool:
    """Whether a run of one non-alphanumeric character stands like a separator.

    Any such character may fill a line of its own (a reStructuredText underline can use any
    punctuation; generated code has emoji banners): nothing but whitespace and separator
    characters besides the run on its line. Separator characters (``_is_separator_char``)
    may also share a short line with a label or a page number, touching spaces, table or
    comment characters or another separator, or anything in a delimited row
    (``separator_row_pipes_min``: tablature, a hexdump's text column). Either way the text must
    have letters or digits somewhere else, so a prompt that is only a run still fires.
    """
    if not (_CONTENT_RE.search(text, 0, start) or _CONTENT_RE.search(text, end)):
        return False
    run_char = text[start]
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line = text[line_start: len(text) if line_end < 0 else line_end]
    other = sum(1 for c in line if not (c == run_char or c.isspace() or _is_separator_char(c)))
    if other == 0:
        return end - start <= t.separator_line_run_max
    if not _is_separator_char(run_char) or end - start > t.separator_run_max:
        return False
    row = 0 < t.separator_row_pipes_min <= line.count("|")
    for i in (start - 1, end):
        if 0 <= i < len(text) and text[i] != "\n" and not (
                row or _is_separator_char(text[i]) or _separator_neighbour_ok(text[i])):
            return False
    return other <= t.separator_line_other_max


# A machine-readable zone line of a passport or ID card (ICAO 9303: 30, 36 or 44 characters of
# capitals, digits and the "<" filler): its filler runs are the format, not noise.
_MRZ_LINE_RE = re.compile(r"(?=[A-Z0-9< ]{30,44}$)(?:[A-Z0-9 ]*<)+[A-Z0-9< ]*")


def _in_mrz_line(text: str, start: int) -> bool:
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", start)
    line = text[line_start: len(text) if line_end < 0 else line_end].strip()
    return bool(_MRZ_LINE_RE.fullmatch(line)) and sum(c.isalnum() for c in line) >= 8


def _in_hex_literal(text: str, start: int) -> bool:
    j = start
    while j > 0 and text[j - 1] in "0123456789abcdefABCDEF":
        j -= 1
    return j >= 2 and text[j - 2: j] in ("0x", "0X")


# What follows a special token that opens a turn: a role's name. "<|im_start|>system" forges a
# turn; "<|im_end|>, which the tokenizer maps to 32001" names a token.
_ROLE_AFTER_RE = re.compile(r"\s*(?:system|user|assistant|model|tool|developer|ipython)\b", re.IGNORECASE)
_WORD_BEFORE_RE = re.compile(r"[^\W\d_]{2,}")
_SPECIAL_SHAPE_RE = re.compile(r"<\|[a-z_]+\|>|<[a-z_]+>|\[/?[A-Z_]+\]|<</?[A-Z]+>>", re.IGNORECASE)
# Tokens that open a turn or a header by themselves ("[INST]", "<|user|>", "<start_of_turn>"):
# used inline, they forge one; only quoting names them.
_OPENS_TURN_RE = re.compile(r"start|begin|\[inst|<<sys|system|user|assistant|message|channel|call|constrain|python",
                            re.IGNORECASE)


def special_token_patterns() -> tuple[str, ...]:
    """What ``special_token_named`` matches with, for the text rules' fingerprint."""
    return (_ROLE_AFTER_RE.pattern, _WORD_BEFORE_RE.pattern, _SPECIAL_SHAPE_RE.pattern, _OPENS_TURN_RE.pattern)


def special_token_named(text: str, start: int, end: int) -> bool:
    """True when the special token at ``text[start:end]`` is named, not used: inside a quoted
    string or inline code on its line (a JSON value, a config dump, a question quoting it), or
    inline in prose (a word before it on its line) when it closes a turn (an end-of-turn or
    end-of-text token), no role name follows it and no other token touches it. A token that opens
    a turn, opens a line, is followed by a role or sits in a run of tokens forges a turn (stop 57:
    data requests about generation configs and tokenizers degraded on a token named in a sentence or
    a JSON string; a pasted rendered template, turns opening lines, still fires)."""
    a = text.rfind("\n", 0, start) + 1
    before = text[a:start]
    if before.replace('\\"', "").count('"') % 2 == 1 or before.count("`") % 2 == 1:
        return True
    if (_OPENS_TURN_RE.search(text, start, end) or _ROLE_AFTER_RE.match(text, end)
            or not _WORD_BEFORE_RE.search(before)):
        return False
    return not (_SPECIAL_SHAPE_RE.match(text, end) or before.rstrip().endswith((">", "]")))


# A UTF-8 lead byte's character (Â-ô) followed by what its continuation bytes become when read as
# Windows-1252 (0x80-0xBF: the cp1252 punctuation and €, then Latin-1's NBSP-¿).
_MOJIBAKE_RE = re.compile(
    "[\u00c2-\u00f4][\u0080-\u00bf\u0152\u0153\u0160\u0161\u0178\u017d\u017e\u0192\u02c6\u02dc"
    "\u2013\u2014\u2018-\u201a\u201c-\u201e\u2020-\u2022\u2026\u2030\u2039\u203a\u20ac\u2122]{1,3}")


def _as_bytes(chars: str) -> bytes | None:
    """The bytes these characters stand for when UTF-8 was read as Windows-1252 (Latin-1 for the
    five codes cp1252 leaves undefined), or None."""
    out = bytearray()
    for c in chars:
        try:
            out += c.encode("cp1252")
        except UnicodeEncodeError:
            if ord(c) > 0xFF:
                return None
            out.append(ord(c))
    return bytes(out)


def mojibake_count(text: str) -> int:
    """Sequences of ``text`` that are one UTF-8 character read as Windows-1252 or Latin-1."""
    n = 0
    for m in _MOJIBAKE_RE.finditer(text):
        seg = m.group()
        for k in range(len(seg), 1, -1):  # the lead byte's whole sequence: 2-4 bytes
            b = _as_bytes(seg[:k])
            try:
                if b is not None and len(b.decode("utf-8")) == 1:
                    n += 1
                    break
            except UnicodeDecodeError:
                continue
    return n


def _iter_reasons(text: str, t: TextThresholds) -> Iterator[str]:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}: {text!r:.80}")
    if not isinstance(t, TextThresholds):
        raise TypeError(f"thresholds must be a TextThresholds, got {type(t).__name__}")
    if not text.strip():
        yield "empty_or_whitespace"
        return
    # NFC so that decomposed accents (French, Vietnamese typed on some keyboards) are not
    # mistaken for stacked marks; it never removes controls or invisible characters.
    if text.isascii():
        scanned, s = text, _scan_ascii(text)
    else:
        scanned = unicodedata.normalize("NFC", text)
        s = _scan(scanned)
    if s.nul:
        yield "nul_byte"
    if s.surrogates:
        yield "lone_surrogate"
    if s.replacement > t.replacement_max:
        yield "replacement_chars"
    if not text.isascii() and mojibake_count(scanned) >= t.mojibake_min:
        yield "mojibake"
    if s.noncharacters > t.noncharacter_max:
        yield "noncharacter"
    if s.controls > t.control_max:
        yield "control_chars"
    if s.bidi_overrides > t.bidi_override_max or (
        s.bidi_marks >= t.bidi_mark_min and s.bidi_marks > t.bidi_mark_rate * max(1, s.letters)
    ):
        yield "bidi_override"
    if s.invisible > t.zero_width_max:
        yield "zero_width_chars"
    if s.unassigned > t.unassigned_max:
        yield "unassigned_or_private"
    # Stacked "Zalgo" marks. The model-level score catches them too, but only where its file
    # exists for these weights, and a Zalgo prompt is thousands of tokens of prefill to score.
    if s.max_mark_stack >= t.combining_stack_run or s.max_foreign_stack >= t.foreign_stack_run or (
        s.foreign_marks >= t.combining_min
        and s.foreign_marks > t.combining_rate * max(1, s.foreign_letters)
        and (s.foreign_mark_kinds > t.combining_kinds_max or s.unusual_marks >= t.combining_min)
    ):
        yield "combining_flood"
    run = _run_reason(scanned, t)
    if run is not None:
        yield run
    if (s.emoji >= t.emoji_min and s.emoji > t.emoji_rate * s.visible) or (
        s.emoji >= t.emoji_dominant_min and s.emoji > t.emoji_dominant_rate * s.visible
    ):
        yield "emoji_flood"
    if s.max_groups_in_word > t.script_groups_per_word_max or (
        s.mixed_words >= t.mixed_word_min and s.mixed_words > t.mixed_word_rate * s.words
    ) or (
        s.mixed_words > t.mixed_word_dominant_rate * s.words
    ) or (
        s.letters >= t.script_min_letters
        and s.switches > t.script_switch_rate * max(1, s.switch_letters)
    ) or (
        s.script_words >= t.word_script_min_words
        and len(s.word_scripts) >= t.word_script_groups_min
        and s.word_switches > t.word_script_switch_rate * (s.script_words - 1)
    ):
        yield "script_mixing"
    if (
        s.punct_all >= t.punctuation_flood_min
        and s.punct >= t.punctuation_flood_other_min
        and s.punct_all > t.punctuation_flood_rate * s.visible
    ):
        yield "punctuation_flood"
    if repeated_share(scanned, t.repeat_ngram, t.repeat_min_words) >= t.repeat_share:
        yield "repeated_passage"
    if stacked_words(scanned, t.stacked_min_lines, t.stacked_repeat_share):
        yield "stacked_words"
    if growing_lines(scanned, t.growing_min_pairs, t.growing_share):
        yield "growing_lines"
    if not text.isascii() and even_letters(scanned, t.even_letters_min, t.even_letters_effective) is not None:
        yield "even_letters"
    if spelled_out(scanned, t.spelled_min_distinct):
        yield "spelled_out_word"
    if tagged_words(scanned, t.tagged_min_words, t.tagged_share):
        yield "tagged_words"
    if t.container_min_spans and prose_in_container(scanned, t.container_min_spans, t.container_min_words,
                                                    t.container_share):
        yield "prose_in_container"
    injection_res, special_res = t._compiled
    if special_res and any(not special_token_named(scanned, m.start(), m.end())
                           for r in special_res for m in r.finditer(scanned)):
        yield "special_token_text"
    if not (injection_res or t.embedded_min_families):
        return
    normalised = normalise_for_patterns(scanned)
    if injection_res and any(r.search(normalised) for r in injection_res):
        yield "prompt_injection"
    if t.embedded_min_families and embedded_instruction(scanned, t.embedded_min_families, normalised):
        yield "embedded_instruction"


# A word (letters of any script, inner apostrophes kept) or one character that breaks a run of
# words: anything but whitespace and plain punctuation and quotes (a digit, a symbol, a bracket).
_PASSAGE_TOKEN_RE = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*|[^\s,.;:!?'’()\-–—\"“”«»]")


def repeated_share(text: str, n: int, min_words: int, min_stretch: int | None = None) -> float:
    """The share of the text's words inside a run of ``n`` consecutive words (case folded) that
    occurs at least twice, counting only runs inside a *stretch* of at least ``min_stretch``
    words (default 2n) with nothing but spaces, plain punctuation and quotes between them; 0.0
    under ``min_words`` words. A log line's message or a CSV row's text sits between digits, so
    its stretch is short however often it repeats; a pasted paragraph or a looped phrase is one
    long stretch. Linear in the text's length."""
    min_stretch = 2 * n if min_stretch is None else min_stretch
    toks = [m.group().casefold() for m in _PASSAGE_TOKEN_RE.finditer(text)]
    is_word = [t[0].isalpha() or len(t) > 1 for t in toks]
    n_words = sum(is_word)
    if n_words < min_words:
        return 0.0
    stretches, start = [], None  # [start, end) of each maximal run of words
    for i, w in enumerate(is_word + [False]):
        if w and start is None:
            start = i
        elif not w and start is not None:
            stretches.append((start, i))
            start = None
    starts, seen = [], {}
    for a, b in stretches:
        if b - a < min_stretch:
            continue
        for i in range(a, b - n + 1):
            g = tuple(toks[i:i + n])
            seen[g] = seen.get(g, 0) + 1
            starts.append((i, g))
    covered = bytearray(len(toks))
    for i, g in starts:
        if seen[g] >= 2:
            covered[i:i + n] = b"\x01" * n
    return sum(covered) / n_words


_STACKED_LINE_RE = re.compile(r"[\"'“‘(«]?[^\W\d_]+(?:['’-][^\W\d_]+)*[.,;:!?\"'”’)»]*")
_NOT_WORD_RE = re.compile(r"[^\w'’-]")


def stacked_words(text: str, min_lines: int, repeat_share: float) -> bool:
    """Whether the text is running text set one word per line: at least ``min_lines`` non-empty
    lines, each a single word (with quotes and trailing punctuation), and at least
    ``repeat_share`` of the lines repeating an earlier line's word (casefolded)."""
    if text.count("\n") + 1 < min_lines:
        return False
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < min_lines or not all(_STACKED_LINE_RE.fullmatch(line) for line in lines):
        return False
    seen: set[str] = set()
    again = 0
    for line in lines:
        word = _NOT_WORD_RE.sub("", line).casefold()
        again += word in seen
        seen.add(word)
    return again >= repeat_share * len(lines)


_LETTER_RE = re.compile(r"[^\W\d_]")


def growing_lines(text: str, min_pairs: int, share: float) -> bool:
    """Whether the text is one line growing a word or a few at a time: at least ``min_pairs``
    pairs of neighbouring non-empty lines (and ``share`` of all pairs) where the next line is the
    previous one, letters included, then a space and more. Log lines and CSV rows share prefixes
    but do not contain the whole line before them; a path grows by a slash, not a space."""
    if text.count("\n") < min_pairs:
        return False
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= min_pairs:
        return False
    grows = sum(1 for a, b in zip(lines, lines[1:])
                if len(b) > len(a) and b.startswith(a) and b[len(a)].isspace() and _LETTER_RE.search(a))
    return grows >= min_pairs and grows >= share * (len(lines) - 1)


# Letters whose frequencies say nothing about a language: Latin (base64, hex, hashes and keys are
# Latin letters drawn evenly, and a request carrying them is a request) and the CJK ideographs
# (thousands of them: a short real text repeats few, so it looks as even as noise).
_EVEN_LETTERS_SKIP = frozenset({"LATIN", "CJK"})


@lru_cache(maxsize=8192)  # a text repeats its letters: name lookups are the cost
def _letter_group(ch: str) -> tuple[str, tuple[object, ...]]:
    """The script a letter belongs to (the first word of its Unicode name) and the letters it
    counts as. A Hangul syllable counts as its jamo and an Ethiopic syllable as its consonant
    and its vowel order: their blocks are products of a small alphabet, and a random syllable
    is a random pick from each factor."""
    o = ord(ch)
    if 0xAC00 <= o <= 0xD7A3:
        i = o - 0xAC00
        lead, vowel, tail = i // 588, (i % 588) // 28, i % 28
        return "HANGUL", (("L", lead), ("V", vowel)) + ((("T", tail),) if tail else ())
    if 0x1200 <= o <= 0x137F:
        return "ETHIOPIC", (("C", (o - 0x1200) // 8), ("V", o % 8))
    name = unicodedata.name(ch, "")
    return (name.split(" ", 1)[0] if name else ""), (ch.lower(),)


def even_letters(text: str, min_letters: int, min_effective: float) -> tuple[str, float] | None:
    """The first script whose letters in ``text`` look drawn evenly from its alphabet, with their
    effective number (the inverse of the chance that two letters picked at random are the same,
    estimated without bias), or None. Every written language leans on a few letters: real text
    in Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai, Georgian, Bengali or Tamil uses 10-30
    letters' worth, Korean about 25-35 jamo; a random jumble of a script's letters or syllables
    uses as many as the alphabet has (35-70). Only scripts with at least ``min_letters`` letters
    in the text are judged (a short text's estimate is noise), and Latin and CJK never are
    (``_EVEN_LETTERS_SKIP``)."""
    groups: dict[str, dict[object, int]] = {}
    for ch in text:
        if not ch.isalpha() or ch.isascii() or unicodedata.category(ch) == "Lm":
            continue
        script, parts = _letter_group(ch)
        if script in _EVEN_LETTERS_SKIP or not script:
            continue
        counts = groups.setdefault(script, {})
        for part in parts:
            counts[part] = counts.get(part, 0) + 1
    for script, counts in groups.items():
        n = sum(counts.values())
        if n < min_letters:
            continue
        same = sum(c * (c - 1) for c in counts.values()) / (n * (n - 1))
        effective = math.inf if same == 0 else 1.0 / same
        if effective >= min_effective:
            return script, effective
    return None


def text_anomaly_reason(text: str, thresholds: TextThresholds = TextThresholds()) -> str | None:
    """Return None for ordinary text, else the first text-level reason to degrade.

    Checks run in the order of ``REASONS``; the cheap, unambiguous ones (empty, NUL, lone
    surrogates, U+FFFD, controls) come first so the reason names the worst defect.
    Raises TypeError when ``text`` is not a str.
    """
    return next(_iter_reasons(text, thresholds), None)


def text_anomaly_reasons(text: str, thresholds: TextThresholds = TextThresholds()) -> tuple[str, ...]:
    """Every text-level reason that fires, in ``REASONS`` order (empty tuple: ordinary text)."""
    return tuple(_iter_reasons(text, thresholds))
