"""The one-pass count of a prompt's characters the text checks judge (``_Scan``): ``_scan``
over NFC text, and ``_scan_ascii``, the same counts for ASCII text at C speed.

Must NOT import: ``rsp_bench`` (the engine never depends on the harness), torch (the
harness and tests import this without a model), or modules of this package other than
.chars. Only stdlib.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

from .chars import (
    _ALWAYS_INVISIBLE,
    _BIDI_MARKS,
    _BIDI_OVERRIDES,
    _BOM,
    _FREE_SWITCHES,
    _JOINER_NATIVE,
    _MARK_NATIVE,
    _MVS,
    _ORTHOGRAPHIC_MARKS,
    _SEPARATOR_CHARS,
    _SKIN_TONES,
    _ZWJ,
    _ZWNJ,
    _is_emoji,
    _is_noncharacter,
    _is_separator_char,
    _is_variation_selector,
    _script_of,
)

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
    # Across words: words of one script (2+ letters), the scripts they use, and how often a word's
    # script differs from the previous such word's when only spaces stand between them.
    script_words: int = 0
    word_scripts: set = field(default_factory=set)
    word_switches: int = 0


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
    prev_word_script: str | None = None
    plain_gap = True  # only spaces since the previous word (no punctuation, digit, symbol, line break)

    def end_word() -> None:
        nonlocal word_groups, word_letters, word_is_cjk, prev_word_script, plain_gap
        if word_letters >= 2:
            s.words += 1
            g = len(word_groups)
            s.max_groups_in_word = max(s.max_groups_in_word, g)
            if g >= 2 and frozenset(word_groups) not in _FREE_SWITCHES:
                s.mixed_words += 1
            if g == 1:
                (script,) = word_groups
                if (prev_word_script is not None and plain_gap and script != prev_word_script
                        and frozenset((script, prev_word_script)) not in _FREE_SWITCHES):
                    s.word_switches += 1
                s.script_words += 1
                s.word_scripts.add(script)
                prev_word_script = script
                plain_gap = True
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
                plain_gap = False
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
            if ch != " " and ch != "\t":
                plain_gap = False
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
