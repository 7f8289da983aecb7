"""Protective degradation: the pure, model-free parts of the odd-input detector.

DESIGN.md section 2 ("Protective degradation") says odd or adversarial input turns pruning
off for the whole request, so the output is exactly the unpruned output and the stats say
``degraded=True`` with a reason. This module holds the decisions, as pure functions of
numbers and strings the engine measures:

- ``text_anomaly_reason``: text-level signals (invalid, control, zero-width and direction
  characters, runs, floods, mixed scripts, injection boilerplate), thresholds in
  ``TextThresholds``;
- ``loss_anomaly_reason``, ``norm_anomaly_reason``, ``router_instability_reason``: model-level
  signals compared with numbers calibrated on normal text (``DetectorCalibration``);
- ``first_reason``: the reason reported when several signals fire.

Every reason is a short machine-readable string (``REASONS`` lists them all).

Degrading is the safe direction: a false positive only costs the speed-up on one request,
a false negative lets a router tuned on clean text prune on input it never saw. Thresholds
therefore fire on anything clearly abnormal, and are loosened only where ordinary text
(multilingual prose, code, markdown, math, chat with a few emoji) really does it.

Must NOT import: ``rsp_bench`` (the engine never depends on the harness) or torch at module
level (the harness and tests import this without a model). Only stdlib and numpy.
"""

from __future__ import annotations

import bisect
import math
import re
import unicodedata
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

__all__ = [
    "REASONS",
    "TextThresholds",
    "DEFAULT_INJECTION_PATTERNS",
    "DEFAULT_SPECIAL_TOKEN_PATTERNS",
    "text_anomaly_reason",
    "text_anomaly_reasons",
    "loss_anomaly_reason",
    "norm_anomaly_reason",
    "router_instability_reason",
    "first_reason",
    "DetectorCalibration",
]

#: Every reason string this module can return, in the order the text checks run, then the
#: model-level ones. The engine copies the first firing one into ``degraded_reason``.
REASONS: tuple[str, ...] = (
    "empty_or_whitespace",
    "nul_byte",
    "lone_surrogate",
    "replacement_chars",
    "noncharacter",
    "control_chars",
    "bidi_override",
    "zero_width_chars",
    "unassigned_or_private",
    "combining_flood",
    "punctuation_run",
    "char_run",
    "whitespace_run",
    "emoji_flood",
    "script_mixing",
    "punctuation_flood",
    "special_token_text",
    "prompt_injection",
    "prompt_loss",
    "hidden_norm",
    "router_unstable",
)

# Phrases from public prompt-injection and jailbreak corpora. They are matched on a
# normalised copy of the text (NFKC, lower case, whitespace collapsed) so full-width or
# line-broken variants still match. Each requires an instruction-like noun or a jailbreak
# term, so "ignore the previous result" in an ordinary prompt does not match.
DEFAULT_INJECTION_PATTERNS: tuple[str, ...] = (
    r"\b(?:ignore|disregard|forget|override)\s+(?:all\s+|any\s+|every\s+)?(?:of\s+)?"
    r"(?:the\s+|your\s+|my\s+|these\s+|those\s+|its\s+)?(?:previous|prior|above|earlier|preceding|"
    r"former|original|initial|foregoing|system|safety)\s+(?:instructions?|prompts?|directions?|"
    r"rules?|guidelines?|messages?|commands?|context|constraints?|directives?|restrictions?)",
    r"\b(?:ignore|disregard|forget)\s+(?:everything|all|anything)\s+(?:above|before|previously|"
    r"prior|you\s+(?:were|have\s+been)\s+told)",
    r"\bdisregard\s+(?:the\s+|all\s+|everything\s+)?(?:above|previous|prior)\b",
    r"\byou\s+are\s+now\s+(?:dan\b|in\s+developer\s+mode|jailbroken|unrestricted|unfiltered|"
    r"uncensored|free\s+(?:from|of)|no\s+longer\s+bound|an?\s+(?:unrestricted|unfiltered|"
    r"uncensored|evil|rogue))",
    r"\bdo\s+anything\s+now\b",
    r"\b(?:dan|developer|god|jailbreak|unrestricted)\s+mode\s+(?:is\s+)?(?:enabled|activated|on)\b",
    r"\b(?:new\s+)?system\s+prompt\s*:",
    r"\b(?:reveal|print|show|output|repeat|leak|display|dump)\s+(?:me\s+)?(?:your|the)\s+"
    r"(?:(?:full|entire|hidden|original|initial|secret|exact)\s+)*(?:system\s+prompt|hidden\s+"
    r"instructions|initial\s+instructions|original\s+instructions|instructions\s+above)",
    r"\b(?:pretend|imagine)\s+(?:that\s+)?you\s+(?:are|have|were|had)\b[^.!?\n]{0,60}?\b(?:no|without)"
    r"\s+(?:any\s+)?(?:restrictions|filters|limitations|rules|guidelines|censorship|content\s+polic)",
    r"\bact\s+as\s+(?:an?\s+)?(?:ai|assistant|model|chatbot|llm|language\s+model)\b[^.!?\n]{0,40}?"
    r"\b(?:no|without)\s+(?:any\s+)?(?:restrictions|filters|limitations|rules|guidelines|censorship)",
    r"\bfrom\s+now\s+on,?\s+you\s+(?:will|are|must|shall)\s+(?:ignore|disregard|not\s+follow|"
    r"answer\s+without|respond\s+without)",
)

# Chat-template control strings typed as plain text. Some tokenizers map them to real
# special tokens, which puts role switches in the middle of a user prompt.
DEFAULT_SPECIAL_TOKEN_PATTERNS: tuple[str, ...] = (
    r"<\|(?:im_start|im_end|endoftext|begin_of_text|end_of_text|eot_id|start_header_id|"
    r"end_header_id|system|user|assistant|end)\|>",
    r"\[/?inst\]",
    r"<</?sys>>",
)


def _check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"TextThresholds.{name} must be an integer >= 0, got {value!r}")


def _check_rate(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"TextThresholds.{name} must be a number in [0, 1], got {value!r}")


@dataclass(frozen=True)
class TextThresholds:
    """Thresholds of the text-level checks; each default says why it sits where it does.

    ``*_max`` fields are counts that may be present without firing (0: any one fires);
    ``*_run`` fields are run lengths that fire; ``*_rate`` fields are fractions that fire
    when exceeded, and only once the matching ``*_min`` count is reached so that one odd
    character in a three-character prompt is not a 33% rate.
    """

    # Cc characters other than \t \n \r (NUL, ESC, BEL, DEL, C1 controls): no ordinary
    # prompt contains one; they come from binary data, terminal escapes or broken decoding.
    control_max: int = 0
    # U+FFFD means bytes were already lost in decoding: the prompt is corrupted.
    replacement_max: int = 0
    # Noncharacters (U+FFFE, U+FFFF, U+FDD0..FDEF, ...) are never valid in interchange.
    noncharacter_max: int = 0
    # Explicit direction embeddings, overrides and isolates (U+202A..202E, U+2066..2069):
    # the "Trojan Source" trick; ordinary right-to-left text does not need them.
    bidi_override_max: int = 0
    # Invisible characters (ZWSP, word joiner, BOM past the start, invisible math operators,
    # tag characters, Hangul fillers, variation-selector runs, ZWJ/ZWNJ outside the scripts
    # and emoji sequences that use them): a classic way to hide text from a filter.
    zero_width_max: int = 0
    # Implicit direction marks (LRM, RLM, ALM) are legitimate in Arabic and Hebrew text, so
    # only a flood fires: more than this fraction of letters, and at least the min count.
    bidi_mark_rate: float = 0.10
    bidi_mark_min: int = 5
    # Private-use and unassigned code points: one icon-font glyph is plausible, three is
    # not. Emoji newer than Python's Unicode tables are not counted (see _is_emoji).
    unassigned_max: int = 2
    # Combining marks stacked on one base. Real orthographies stack at most about four
    # (Biblical Hebrew with cantillation, Tibetan subjoined letters); "Zalgo" text stacks
    # five to dozens.
    combining_stack_run: int = 5
    # The same on letters of scripts that carry few marks after NFC (Latin, Greek, Cyrillic,
    # CJK, ...): Yoruba or Lithuanian leave one uncomposable mark on a letter, two is rare.
    foreign_stack_run: int = 3
    # Marks on such letters (or on no letter at all) above this fraction of those letters,
    # with at least ``combining_min`` of them, drawn from more than ``combining_kinds_max``
    # different marks. NFC first, so decomposed French or Vietnamese counts nothing; Yoruba
    # keeps a mark on a third of its letters but uses three or four kinds (grave, acute,
    # macron), and statistics notation (x-bar, p-hat) stays far under 10%. Zalgo text draws
    # from the ~110 marks of U+0300-036F.
    # The kinds condition is waived when the marks are not the common orthographic ones
    # (acute, grave, circumflex, tilde, macron, breve, dots, ring, caron, cedilla, ogonek,
    # dot below, ...): ``combining_min`` unusual marks above the rate fire on their own.
    combining_rate: float = 0.10
    combining_min: int = 3
    combining_kinds_max: int = 4
    # A run of one punctuation or symbol character. Code reaches `)))))` (5-8), prose "!!!"
    # or "...", so 12 is already abnormal.
    punctuation_run: int = 12
    # Separator characters (- = _ * # ~ ^ . + / | and box drawing) legitimately form long
    # lines: markdown rules and tables, comment banners, ASCII tables, progress bars, dot
    # leaders. A run of them is allowed up to this length when it stands like a separator
    # (bounded by line ends, spaces or table/comment characters, on a line with little else)
    # and the text has letters or digits to separate; a prompt that is only a run fires.
    separator_run_max: int = 120
    # A run of any punctuation, symbol or emoji on a line of nothing but it, separators and
    # spaces (a rule, a table border, a reStructuredText underline, an emoji banner) may be
    # as wide as a wide grid table, when the text has letters or digits elsewhere.
    separator_line_run_max: int = 400
    # Other content allowed on the line of an allowed separator run ("# ---- Setup ----",
    # "Chapter 1 ........ 12"); prose beside a run means the run was pasted into text.
    separator_line_other_max: int = 60
    # A run of one letter, digit, emoji or other character. Ordinary text has "zzz" or
    # "hahaha"; a hex literal can reach 64 zeros (a 256-bit hash), which is exempted.
    char_run: int = 24
    # Whitespace runs: deep indentation and aligned columns reach 60-100 spaces.
    whitespace_run: int = 256
    # Emoji: a chat line with a few emoji is normal ("Happy birthday! 🎂🎉🎈" is 3/19).
    # Fires above 20% of visible characters with at least 8 emoji, or above 50% with 3.
    emoji_rate: float = 0.20
    emoji_min: int = 8
    emoji_dominant_rate: float = 0.50
    emoji_dominant_min: int = 3
    # Scripts inside one word. Japanese (kanji + kana) and Korean (hangul + hanja) count as
    # one group, words split where CJK meets other letters, and Latin + Greek is allowed
    # (kΩ, sinθ): so no ordinary word has three groups.
    script_groups_per_word_max: int = 2
    # Words mixing two script groups (other than Latin + Greek): homoglyph spoofing such as
    # a Cyrillic "а" in "pаypal". One can be a typo; several, over 10% of words, is a pattern.
    mixed_word_min: int = 2
    mixed_word_rate: float = 0.10
    # ... or when mixed words are most of the words, however few (a short prompt such as
    # a lone spoofed "pаypal", or a two-word string of random scripts).
    mixed_word_dominant_rate: float = 0.50
    # Script switches between consecutive letters, per letter, ignoring Latin<->CJK (CJK text
    # embeds English terms without spaces) and Latin<->Greek (math). A translation prompt
    # with six languages stays under 0.15; random letters from many scripts are near 0.8.
    script_switch_rate: float = 0.30
    script_min_letters: int = 8
    # A run of mixed punctuation without spaces or letters ("?!@#$%^&*..."): fires at this
    # length with at least ``mixed_punctuation_other_min`` non-separator characters in it.
    # Code packs 6-10 (`"]))});`) and regex-heavy code 20-40 (a string-literal pattern such
    # as `'"(\\\\|\\[^\\]|[^"\\])*"',`), so only longer soups fire here; a prompt that
    # is mostly punctuation is caught by the flood rule below.
    mixed_punctuation_run: int = 48
    mixed_punctuation_other_min: int = 32
    # Punctuation and symbols (not emoji) as a fraction of the visible characters, with at
    # least ``punctuation_flood_min`` of them and ``punctuation_flood_other_min`` that are
    # not separators (so a bare markdown table border is left to the separator rule).
    # Code and JSON stay under about 0.70; random symbol strings are near 1.
    punctuation_flood_rate: float = 0.80
    punctuation_flood_min: int = 12
    punctuation_flood_other_min: int = 4
    injection_patterns: tuple[str, ...] = DEFAULT_INJECTION_PATTERNS
    special_token_patterns: tuple[str, ...] = DEFAULT_SPECIAL_TOKEN_PATTERNS
    _compiled: tuple[tuple[re.Pattern[str], ...], tuple[re.Pattern[str], ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for name in (
            "control_max", "replacement_max", "noncharacter_max", "bidi_override_max",
            "zero_width_max", "bidi_mark_min", "unassigned_max", "combining_min",
            "emoji_min", "emoji_dominant_min", "mixed_word_min", "script_min_letters",
            "punctuation_flood_min", "punctuation_flood_other_min", "separator_line_other_max",
            "mixed_punctuation_other_min",
        ):
            _check_count(name, getattr(self, name))
        for name in (
            "combining_stack_run", "foreign_stack_run", "combining_kinds_max",
            "punctuation_run", "separator_run_max",
            "separator_line_run_max", "char_run", "mixed_punctuation_run",
            "whitespace_run", "script_groups_per_word_max",
        ):
            value = getattr(self, name)
            _check_count(name, value)
            if value < 1:
                raise ValueError(f"TextThresholds.{name} must be >= 1, got {value!r}")
        for name in (
            "bidi_mark_rate", "combining_rate", "emoji_rate", "emoji_dominant_rate",
            "mixed_word_rate", "mixed_word_dominant_rate", "script_switch_rate", "punctuation_flood_rate",
        ):
            _check_rate(name, getattr(self, name))
        compiled = []
        for name in ("injection_patterns", "special_token_patterns"):
            patterns = getattr(self, name)
            if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
                raise ValueError(f"TextThresholds.{name} must be a tuple of regex strings, got {patterns!r}")
            group = []
            for p in patterns:
                try:
                    group.append(re.compile(p, re.IGNORECASE | re.DOTALL))
                except re.error as exc:
                    raise ValueError(f"TextThresholds.{name}: bad regex {p!r}: {exc}") from None
            compiled.append(tuple(group))
        # frozen dataclass: the compiled patterns are a cache derived from the fields.
        object.__setattr__(self, "_compiled", (compiled[0], compiled[1]))


# --------------------------------------------------------------------------- scripts

# Coarse script ranges for letters. The stdlib has no Script property; ranges are enough to
# tell scripts apart for mixing checks. Letters outside them get a per-128-code-point block
# name, so an unlisted script still counts as a script of its own.
_SCRIPT_RANGES: tuple[tuple[int, int, str], ...] = (
    (0x0041, 0x024F, "Latin"), (0x0250, 0x02FF, "Latin"), (0x0370, 0x03FF, "Greek"),
    (0x0400, 0x052F, "Cyrillic"), (0x0530, 0x058F, "Armenian"), (0x0590, 0x05FF, "Hebrew"),
    (0x0600, 0x06FF, "Arabic"), (0x0700, 0x074F, "Syriac"), (0x0750, 0x077F, "Arabic"),
    (0x0780, 0x07BF, "Thaana"), (0x07C0, 0x07FF, "NKo"), (0x0860, 0x08FF, "Arabic"),
    (0x0900, 0x097F, "Devanagari"), (0x0980, 0x09FF, "Bengali"), (0x0A00, 0x0A7F, "Gurmukhi"),
    (0x0A80, 0x0AFF, "Gujarati"), (0x0B00, 0x0B7F, "Oriya"), (0x0B80, 0x0BFF, "Tamil"),
    (0x0C00, 0x0C7F, "Telugu"), (0x0C80, 0x0CFF, "Kannada"), (0x0D00, 0x0D7F, "Malayalam"),
    (0x0D80, 0x0DFF, "Sinhala"), (0x0E00, 0x0E7F, "Thai"), (0x0E80, 0x0EFF, "Lao"),
    (0x0F00, 0x0FFF, "Tibetan"), (0x1000, 0x109F, "Myanmar"), (0x10A0, 0x10FF, "Georgian"),
    (0x1100, 0x11FF, "CJK"), (0x1200, 0x139F, "Ethiopic"), (0x13A0, 0x13FF, "Cherokee"),
    (0x1400, 0x167F, "Canadian"), (0x1780, 0x17FF, "Khmer"), (0x1800, 0x18AF, "Mongolian"),
    (0x1C80, 0x1C8F, "Cyrillic"), (0x1C90, 0x1CBF, "Georgian"), (0x1D00, 0x1DBF, "Latin"),
    (0x1E00, 0x1EFF, "Latin"), (0x1F00, 0x1FFF, "Greek"), (0x2070, 0x209F, "Latin"),
    (0x2100, 0x214F, "Latin"), (0x2C00, 0x2C5F, "Glagolitic"), (0x2C60, 0x2C7F, "Latin"),
    (0x2C80, 0x2CFF, "Coptic"), (0x2D00, 0x2D2F, "Georgian"), (0x2D30, 0x2D7F, "Tifinagh"),
    (0x2D80, 0x2DDF, "Ethiopic"), (0x2DE0, 0x2DFF, "Cyrillic"), (0x2E80, 0x2FDF, "CJK"),
    (0x3000, 0x303F, "CJK"), (0x3040, 0x30FF, "CJK"), (0x3100, 0x312F, "CJK"),
    (0x3130, 0x318F, "CJK"), (0x31A0, 0x31FF, "CJK"), (0x3400, 0x4DBF, "CJK"),
    (0x4E00, 0x9FFF, "CJK"), (0xA000, 0xA4CF, "Yi"), (0xA640, 0xA69F, "Cyrillic"),
    (0xA720, 0xA7FF, "Latin"), (0xA8E0, 0xA8FF, "Devanagari"), (0xA960, 0xA97F, "CJK"),
    (0xAB30, 0xAB6F, "Latin"), (0xAC00, 0xD7FF, "CJK"), (0xF900, 0xFAFF, "CJK"),
    (0xFB00, 0xFB06, "Latin"), (0xFB13, 0xFB17, "Armenian"), (0xFB1D, 0xFB4F, "Hebrew"),
    (0xFB50, 0xFDFF, "Arabic"), (0xFE70, 0xFEFF, "Arabic"), (0xFF21, 0xFF5A, "Latin"),
    (0xFF66, 0xFFDC, "CJK"), (0x1D400, 0x1D7FF, "Latin"), (0x20000, 0x3FFFF, "CJK"),
)
_SCRIPT_STARTS = [r[0] for r in _SCRIPT_RANGES]

# Scripts whose ordinary spelling uses combining marks even after NFC (vowel signs, viramas,
# harakat, niqqud, tone marks). Marks on their letters are not counted toward a flood.
_MARK_NATIVE = frozenset({
    "Hebrew", "Arabic", "Syriac", "Thaana", "NKo", "Devanagari", "Bengali", "Gurmukhi",
    "Gujarati", "Oriya", "Tamil", "Telugu", "Kannada", "Malayalam", "Sinhala", "Thai", "Lao",
    "Tibetan", "Myanmar", "Khmer", "Mongolian",
})
# Scripts whose conjunct or shaping rules use ZWJ / ZWNJ (Persian, Indic, Sinhala, ...).
_JOINER_NATIVE = _MARK_NATIVE | frozenset({"Ethiopic"})
# Pairs whose mixing is ordinary: CJK writing embeds Latin words; math mixes Greek and Latin.
_FREE_SWITCHES = frozenset({frozenset({"Latin", "CJK"}), frozenset({"Latin", "Greek"})})


def _script_of(cp: int) -> str:
    i = bisect.bisect_right(_SCRIPT_STARTS, cp) - 1
    if i >= 0 and cp <= _SCRIPT_RANGES[i][1]:
        return _SCRIPT_RANGES[i][2]
    if 0xAC00 <= cp <= 0xD7AF:
        return "CJK"
    return f"block-{cp >> 7:X}"


def _is_emoji(cp: int) -> bool:
    # Code-point ranges rather than categories: emoji newer than Python's Unicode tables
    # are still counted as emoji (and not as unassigned code points).
    return (
        0x1F000 <= cp <= 0x1FAFF
        or 0x2600 <= cp <= 0x27BF
        or 0x2B00 <= cp <= 0x2BFF
        or 0x231A <= cp <= 0x23FF
        or cp in (0x3030, 0x303D, 0x3297, 0x3299)
    )


# Invisible or format characters that ordinary text does not carry (ZWJ, ZWNJ, BOM and the
# Mongolian vowel separator are judged by context in the scan instead).
_ALWAYS_INVISIBLE = frozenset(
    [0x200B, 0x2060, 0x034F, 0x115F, 0x1160, 0x3164, 0xFFA0, 0x17B4, 0x17B5]
    + list(range(0x2061, 0x2065))
    + list(range(0x206A, 0x2070))
    + list(range(0xFFF9, 0xFFFC))
    + list(range(0x1D173, 0x1D17B))
)
_BIDI_OVERRIDES = frozenset(list(range(0x202A, 0x202F)) + list(range(0x2066, 0x206A)))
_BIDI_MARKS = frozenset([0x200E, 0x200F, 0x061C])
_ZWNJ, _ZWJ, _BOM, _MVS = 0x200C, 0x200D, 0xFEFF, 0x180E
_SKIN_TONES = range(0x1F3FB, 0x1F400)
# Diacritics that real Latin, Greek and Cyrillic orthographies leave uncomposed after NFC
# (Yoruba tone marks on dotted vowels, Lithuanian accents, pinyin, transliteration), and
# the bar and hat of statistics notation.
_ORTHOGRAPHIC_MARKS = frozenset(
    [0x0300, 0x0301, 0x0302, 0x0303, 0x0304, 0x0305, 0x0306, 0x0307, 0x0308, 0x0309, 0x030A,
     0x030B, 0x030C, 0x030D, 0x030F, 0x0311, 0x0313, 0x0314, 0x031B, 0x0323, 0x0324, 0x0325,
     0x0326, 0x0327, 0x0328, 0x0329, 0x032D, 0x032E, 0x0330, 0x0331, 0x0342, 0x0345, 0x20D7]
)


def _is_variation_selector(cp: int) -> bool:
    return 0xFE00 <= cp <= 0xFE0F or 0xE0100 <= cp <= 0xE01EF or 0x180B <= cp <= 0x180D


def _is_noncharacter(cp: int) -> bool:
    return 0xFDD0 <= cp <= 0xFDEF or (cp & 0xFFFE) == 0xFFFE


_SEPARATOR_CHARS = frozenset("-=_*#~^.+/|")


def _is_separator_char(ch: str) -> bool:
    cp = ord(ch)
    # Box drawing and block elements: tree listings, ASCII tables, progress bars.
    return ch in _SEPARATOR_CHARS or 0x2500 <= cp <= 0x259F or cp in (0x2014, 0x2015, 0x2026, 0x00B7)


_SEPARATOR_NEIGHBOURS = frozenset("|+#/*;%<>!:'\"`[]")


def _separator_neighbour_ok(ch: str) -> bool:
    cp = ord(ch)
    return ch.isspace() or ch in _SEPARATOR_NEIGHBOURS or 0x2500 <= cp <= 0x259F


# --------------------------------------------------------------------------- scan


@dataclass
class _Scan:
    """Counts gathered in one pass over the (NFC) text."""

    visible: int = 0  # non-whitespace code points, excluding emoji joiners and modifiers
    letters: int = 0
    nul: int = 0
    surrogates: int = 0
    replacement: int = 0
    noncharacters: int = 0
    controls: int = 0
    bidi_overrides: int = 0
    bidi_marks: int = 0
    invisible: int = 0
    unassigned: int = 0
    max_mark_stack: int = 0
    foreign_marks: int = 0
    foreign_mark_kinds: int = 0
    unusual_marks: int = 0
    max_foreign_stack: int = 0
    foreign_letters: int = 0
    emoji: int = 0
    punct: int = 0
    punct_all: int = 0  # punctuation and symbols, separators included, emoji excluded
    switches: int = 0
    switch_letters: int = 0
    max_groups_in_word: int = 0
    mixed_words: int = 0
    words: int = 0


def _scan(text: str) -> _Scan:
    s = _Scan()
    n = len(text)
    cats = [unicodedata.category(ch) for ch in text]
    cps = [ord(ch) for ch in text]
    stack = 0
    base_script: str | None = None  # script of the letter the current marks sit on
    base_cp = -1
    vs_run = 0
    prev_letter_script: str | None = None
    word_groups: set[str] = set()
    word_letters = 0
    word_is_cjk: bool | None = None
    foreign_kinds: set[int] = set()

    def end_word() -> None:
        nonlocal word_groups, word_letters, word_is_cjk
        if word_letters >= 2:
            s.words += 1
            g = len(word_groups)
            s.max_groups_in_word = max(s.max_groups_in_word, g)
            if g >= 2 and frozenset(word_groups) not in _FREE_SWITCHES:
                s.mixed_words += 1
        elif word_letters == 1:
            s.max_groups_in_word = max(s.max_groups_in_word, len(word_groups))
        word_groups = set()
        word_letters = 0
        word_is_cjk = None

    def neighbour_script(j: int) -> str | None:
        if 0 <= j < n and cats[j][0] in "LM":
            return _script_of(cps[j])
        return None

    def add_letter(script: str) -> None:
        nonlocal word_is_cjk, word_letters, prev_letter_script
        s.letters += 1
        is_cjk = script == "CJK"
        if word_is_cjk is not None and is_cjk != word_is_cjk:
            end_word()  # CJK has no spaces: where it meets another script, a word ends
        word_is_cjk = is_cjk
        word_groups.add(script)
        word_letters += 1
        if prev_letter_script is not None:
            s.switch_letters += 1
            if script != prev_letter_script and frozenset(
                (script, prev_letter_script)
            ) not in _FREE_SWITCHES:
                s.switches += 1
        prev_letter_script = script

    for i in range(n):
        cp, cat = cps[i], cats[i]
        ch = text[i]
        if cp < 0x80 and (ch == " " or ch.isalnum()):
            # Fast path for the bulk of Latin-script text; same bookkeeping as below.
            stack = 0
            vs_run = 0
            base_cp = cp
            if ch == " ":
                base_script = None
                end_word()
            elif ch.isalpha():
                base_script = "Latin"
                s.foreign_letters += 1
                s.visible += 1
                add_letter("Latin")
            else:
                base_script = None
                s.visible += 1
                end_word()
            continue
        if cat == "Cs":
            s.surrogates += 1
        if cp == 0:
            s.nul += 1
        elif cat == "Cc" and ch not in "\t\n\r":
            s.controls += 1
        if cp == 0xFFFD:
            s.replacement += 1
        elif _is_noncharacter(cp):
            s.noncharacters += 1
        elif cat in ("Co", "Cn") and not _is_emoji(cp):
            s.unassigned += 1
        if cp in _BIDI_OVERRIDES:
            s.bidi_overrides += 1
        elif cp in _BIDI_MARKS:
            s.bidi_marks += 1

        # Invisible characters, with the contexts where ordinary text uses them.
        if cp in _ALWAYS_INVISIBLE:
            s.invisible += 1
        elif 0xE0000 <= cp <= 0xE007F:
            # Tag characters are legitimate only in subdivision flags (black flag + tags).
            j = i - 1
            while j >= 0 and 0xE0000 <= cps[j] <= 0xE007F:
                j -= 1
            if not (j >= 0 and cps[j] == 0x1F3F4):
                s.invisible += 1
        elif cp == _BOM:
            if i != 0:
                s.invisible += 1
        elif cp == _MVS:
            if neighbour_script(i - 1) != "Mongolian" and neighbour_script(i + 1) != "Mongolian":
                s.invisible += 1
        elif cp in (_ZWJ, _ZWNJ):
            left = cps[i - 1] if i > 0 else -1
            right = cps[i + 1] if i + 1 < n else -1
            emoji_context = cp == _ZWJ and (
                (_is_emoji(left) or left in (0xFE0F,) or left in _SKIN_TONES
                 or (i > 0 and cats[i - 1] == "So"))
                and (_is_emoji(right) or (i + 1 < n and cats[i + 1] == "So"))
            )
            ls, rs = neighbour_script(i - 1), neighbour_script(i + 1)
            script_context = ls in _JOINER_NATIVE and rs in _JOINER_NATIVE
            if not (emoji_context or script_context):
                s.invisible += 1
        if _is_variation_selector(cp):
            vs_run += 1
            # One selector after a base is how emoji and ideographic variants are spelled;
            # a second in a row carries no glyph and is a smuggling channel.
            if vs_run >= 2 or i == 0:
                s.invisible += 1
        else:
            vs_run = 0

        # Combining marks: stack height and marks on letters of mark-free scripts.
        if cat in ("Mn", "Me", "Mc") and not _is_variation_selector(cp) and cp != 0x034F:
            stack += 1
            s.max_mark_stack = max(s.max_mark_stack, stack)
            keycap = cp == 0x20E3 and base_cp >= 0 and (
                chr(base_cp).isdigit() or chr(base_cp) in "#*"
            )
            if not keycap and (base_script is None or base_script not in _MARK_NATIVE):
                s.foreign_marks += 1
                foreign_kinds.add(cp)
                if cp not in _ORTHOGRAPHIC_MARKS:
                    s.unusual_marks += 1
                s.max_foreign_stack = max(s.max_foreign_stack, stack)
        elif not _is_variation_selector(cp):
            stack = 0
            base_cp = cp
            base_script = _script_of(cp) if cat[0] == "L" else None
            if base_script is not None and base_script not in _MARK_NATIVE:
                s.foreign_letters += 1

        # Visible-character classes for floods.
        if not ch.isspace() and cp not in (_ZWJ, 0xFE0E, 0xFE0F) and cp not in _SKIN_TONES:
            s.visible += 1
            sep = _is_separator_char(ch)
            if _is_emoji(cp):
                s.emoji += 1
            elif cat[0] in "PS":
                s.punct_all += 1
                if not sep:
                    s.punct += 1

        # Letters: scripts per word and switches across the text.
        if cat[0] == "L":
            add_letter(_script_of(cp))
        elif cat[0] != "M":
            end_word()
    end_word()
    s.foreign_mark_kinds = len(foreign_kinds)
    return s


_ASCII_CONTROL_RE = re.compile(r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]")
_ANY_WS_RE = re.compile(r"\s+")
_ASCII_SEPARATORS = "".join(sorted(_SEPARATOR_CHARS))
_ASCII_OTHER_PUNCT = "".join(c for c in map(chr, range(0x21, 0x7F))
                             if unicodedata.category(c)[0] in "PS" and c not in _SEPARATOR_CHARS)


def _scan_ascii(text: str) -> _Scan:
    """The counts ``_scan`` gathers, for ASCII text, with C-speed string calls: long English
    prompts are the common case and need no per-character Python loop. Scripts, marks,
    emoji and invisible characters cannot occur in ASCII."""
    s = _Scan()
    s.nul = text.count("\x00")
    s.controls = len(_ASCII_CONTROL_RE.findall(text))
    visible = _ANY_WS_RE.sub("", text)
    s.visible = len(visible)
    separators = sum(visible.count(c) for c in _ASCII_SEPARATORS)
    s.punct = sum(visible.count(c) for c in _ASCII_OTHER_PUNCT)
    s.punct_all = s.punct + separators
    return s


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
    may also share a short line with a label or a page number. Either way the text must
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
    if start > 0 and text[start - 1] != "\n" and not _separator_neighbour_ok(text[start - 1]):
        return False
    if end < len(text) and text[end] != "\n" and not _separator_neighbour_ok(text[end]):
        return False
    return other <= t.separator_line_other_max


def _in_hex_literal(text: str, start: int) -> bool:
    j = start
    while j > 0 and text[j - 1] in "0123456789abcdefABCDEF":
        j -= 1
    return j >= 2 and text[j - 2: j] in ("0x", "0X")


_WS_RE = re.compile(r"\s+")


def _normalise_for_patterns(text: str) -> str:
    return _WS_RE.sub(" ", unicodedata.normalize("NFKC", text)).lower()


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
    ):
        yield "script_mixing"
    if (
        s.punct_all >= t.punctuation_flood_min
        and s.punct >= t.punctuation_flood_other_min
        and s.punct_all > t.punctuation_flood_rate * s.visible
    ):
        yield "punctuation_flood"
    injection_res, special_res = t._compiled
    if special_res and any(r.search(scanned) for r in special_res):
        yield "special_token_text"
    if injection_res:
        normalised = _normalise_for_patterns(scanned)
        if any(r.search(normalised) for r in injection_res):
            yield "prompt_injection"


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


# --------------------------------------------------------------------------- model signals


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


def loss_anomaly_reason(
    mean_nll: float, calib_mean: float, calib_std: float, z: float = 4.0
) -> str | None:
    """"prompt_loss" when the prompt's mean per-token loss is more than ``z`` std above calibration.

    ``mean_nll`` is the mean negative log-likelihood (nats per token) the unpruned model
    assigns to the prompt's tokens during prefill, which runs in full anyway, so the check
    is free. One-sided: unusually predictable text (repetition, boilerplate) is no danger
    to pruning. A non-finite ``mean_nll`` (NaN or inf) fires, because a broken or
    impossible prompt is the clearest case for running the full model. Raises ValueError
    for non-finite calibration numbers, a negative std or a non-positive ``z``.
    """
    mean = _finite("calib_mean", calib_mean)
    std = _finite("calib_std", calib_std)
    zz = _finite("z", z)
    if std < 0:
        raise ValueError(f"calib_std must be >= 0, got {calib_std!r}")
    if zz <= 0:
        raise ValueError(f"z must be > 0, got {z!r}")
    if isinstance(mean_nll, bool) or not isinstance(mean_nll, (int, float, np.floating, np.integer)):
        raise ValueError(f"mean_nll must be a number, got {mean_nll!r}")
    value = float(mean_nll)
    if not math.isfinite(value):
        return "prompt_loss"
    return "prompt_loss" if value > mean + zz * std else None


def norm_anomaly_reason(
    block_norms: Sequence[float],
    calib_lo: Sequence[float],
    calib_hi: Sequence[float],
    slack: float = 1.5,
) -> str | None:
    """"hidden_norm" when any block's hidden-state norm is outside ``[lo/slack, hi*slack]``.

    ``block_norms[l]`` is the norm the engine measured at block ``l`` (for example the mean
    L2 norm of the prompt's hidden states entering the block); ``calib_lo``/``calib_hi`` are
    the smallest and largest such values seen on calibration text. ``slack`` widens the
    calibrated band multiplicatively, because norms scale rather than shift. A non-finite
    norm fires. Raises ValueError when the lengths differ, a bound is negative or
    non-finite, ``lo > hi``, or ``slack < 1``.
    """
    sl = _finite("slack", slack)
    if sl < 1.0:
        raise ValueError(f"slack must be >= 1, got {slack!r}")
    norms = np.asarray(block_norms, dtype=np.float64).reshape(-1)
    lo = np.asarray(calib_lo, dtype=np.float64).reshape(-1)
    hi = np.asarray(calib_hi, dtype=np.float64).reshape(-1)
    if not (len(norms) == len(lo) == len(hi)):
        raise ValueError(
            f"block_norms, calib_lo and calib_hi must have one value per block, got lengths "
            f"{len(norms)}, {len(lo)}, {len(hi)}"
        )
    for name, arr in (("calib_lo", lo), ("calib_hi", hi)):
        bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
        if bad.size:
            raise ValueError(f"{name}[{bad[0]}] must be finite and >= 0, got {arr[bad[0]]!r}")
    bad = np.flatnonzero(lo > hi)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"calib_lo[{i}]={lo[i]!r} is above calib_hi[{i}]={hi[i]!r}")
    if not np.all(np.isfinite(norms)):
        return "hidden_norm"
    if np.any(norms < lo / sl) or np.any(norms > hi * sl):
        return "hidden_norm"
    return None


def router_instability_reason(
    decision_flips: int, decisions: int, max_flip_rate: float = 0.5, min_decisions: int = 8
) -> str | None:
    """"router_unstable" when KEEP/BYPASS decisions flip more often than ``max_flip_rate``.

    ``decisions`` counts routing decisions that had a previous decision for the same block
    (so a flip could be observed); ``decision_flips`` counts those that differ from it. A
    router that decides by coin toss flips half the time, so a higher rate means the scores
    hover on the threshold and the pruned path is noise. Below ``min_decisions`` nothing is
    judged: the first tokens of a request say too little. Raises ValueError for negative
    counts, more flips than decisions, or a rate outside [0, 1].
    """
    for name, value in (("decision_flips", decision_flips), ("decisions", decisions),
                        ("min_decisions", min_decisions)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if decision_flips > decisions:
        raise ValueError(f"decision_flips={decision_flips!r} exceeds decisions={decisions!r}")
    rate_max = _finite("max_flip_rate", max_flip_rate)
    if not 0.0 <= rate_max <= 1.0:
        raise ValueError(f"max_flip_rate must be in [0, 1], got {max_flip_rate!r}")
    if decisions == 0 or decisions < min_decisions:
        return None
    return "router_unstable" if decision_flips / decisions > rate_max else None


def first_reason(*reasons: str | None) -> str | None:
    """The first reason that is not None (the order of the arguments is the priority)."""
    for r in reasons:
        if r is None:
            continue
        if not isinstance(r, str) or not r:
            raise ValueError(f"a reason must be a non-empty str or None, got {r!r}")
        return r
    return None


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class DetectorCalibration:
    """The numbers the model-level checks compare against, measured on normal text.

    ``nll_mean``/``nll_std``: mean and sample std over calibration prompts of each prompt's
    mean per-token NLL (nats). ``norm_lo``/``norm_hi``: per block, the smallest and largest
    hidden-state norm seen. ``n_prompts``: how many prompts these came from (0: unknown).
    """

    nll_mean: float
    nll_std: float
    norm_lo: tuple[float, ...]
    norm_hi: tuple[float, ...]
    n_prompts: int = 0

    SCHEMA_VERSION = 1

    def __post_init__(self) -> None:
        _finite("nll_mean", self.nll_mean)
        if _finite("nll_std", self.nll_std) < 0:
            raise ValueError(f"nll_std must be >= 0, got {self.nll_std!r}")
        object.__setattr__(self, "nll_mean", float(self.nll_mean))
        object.__setattr__(self, "nll_std", float(self.nll_std))
        lo = tuple(float(v) for v in self.norm_lo)
        hi = tuple(float(v) for v in self.norm_hi)
        object.__setattr__(self, "norm_lo", lo)
        object.__setattr__(self, "norm_hi", hi)
        # Validates lengths, signs and ordering with the same messages the check uses.
        norm_anomaly_reason(lo, lo, hi)
        if isinstance(self.n_prompts, bool) or not isinstance(self.n_prompts, int) or self.n_prompts < 0:
            raise ValueError(f"n_prompts must be an integer >= 0, got {self.n_prompts!r}")

    @classmethod
    def from_samples(
        cls, prompt_nlls: Sequence[float], prompt_block_norms: Sequence[Sequence[float]]
    ) -> "DetectorCalibration":
        """Build from per-prompt measurements: mean NLLs, and per-prompt per-block norms."""
        nll = np.asarray(prompt_nlls, dtype=np.float64).reshape(-1)
        if nll.size == 0:
            raise ValueError("prompt_nlls is empty: calibration needs at least one prompt")
        norms = np.asarray(prompt_block_norms, dtype=np.float64)
        if norms.ndim != 2 or norms.shape[0] != nll.size:
            raise ValueError(
                f"prompt_block_norms must be (n_prompts={nll.size}, n_blocks), got shape {norms.shape}"
            )
        if not (np.all(np.isfinite(nll)) and np.all(np.isfinite(norms))):
            raise ValueError("calibration measurements contain NaN or inf")
        std = float(nll.std(ddof=1)) if nll.size > 1 else 0.0
        return cls(
            nll_mean=float(nll.mean()),
            nll_std=std,
            norm_lo=tuple(norms.min(axis=0).tolist()),
            norm_hi=tuple(norms.max(axis=0).tolist()),
            n_prompts=int(nll.size),
        )

    def loss_reason(self, mean_nll: float, z: float = 4.0) -> str | None:
        """``loss_anomaly_reason`` against this calibration."""
        return loss_anomaly_reason(mean_nll, self.nll_mean, self.nll_std, z)

    def norm_reason(self, block_norms: Sequence[float], slack: float = 1.5) -> str | None:
        """``norm_anomaly_reason`` against this calibration."""
        return norm_anomaly_reason(block_norms, self.norm_lo, self.norm_hi, slack)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (lists, floats) with a schema version."""
        d = asdict(self)
        d["norm_lo"] = list(self.norm_lo)
        d["norm_hi"] = list(self.norm_hi)
        d["schema_version"] = self.SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DetectorCalibration":
        """Inverse of ``to_dict``; names any missing or unknown key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"DetectorCalibration data must be a mapping, got {type(data).__name__}")
        version = data.get("schema_version", cls.SCHEMA_VERSION)
        if version != cls.SCHEMA_VERSION:
            raise ValueError(
                f"DetectorCalibration schema_version {version!r} is not {cls.SCHEMA_VERSION}"
            )
        required = {"nll_mean", "nll_std", "norm_lo", "norm_hi"}
        allowed = required | {"n_prompts", "schema_version"}
        missing = sorted(required - set(data))
        if missing:
            raise ValueError(f"DetectorCalibration data lacks key(s) {missing}")
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"DetectorCalibration data has unknown key(s) {unknown}")
        for key in ("norm_lo", "norm_hi"):
            if isinstance(data[key], (str, bytes)) or not isinstance(data[key], Sequence):
                raise ValueError(f"DetectorCalibration {key} must be a list of numbers, got {data[key]!r}")
        return cls(
            nll_mean=data["nll_mean"],
            nll_std=data["nll_std"],
            norm_lo=tuple(data["norm_lo"]),
            norm_hi=tuple(data["norm_hi"]),
            n_prompts=data.get("n_prompts", 0),
        )
