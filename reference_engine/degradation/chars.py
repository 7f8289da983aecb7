"""Character classes for the text checks: coarse Unicode script ranges, emoji, invisible and
direction characters, orthographic marks, separator characters.

Must NOT import: ``rsp_bench`` (the engine never depends on the harness), torch (the
harness and tests import this without a model), or any other module of this package.
Only stdlib.
"""

from __future__ import annotations

import bisect

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
