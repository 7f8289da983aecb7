"""Random and machine-made text: odd input that no character rule describes.

Every other class in this package plants a character-level anomaly (a control character, a
run, a flood) in ordinary prose, and the engine's text rules were written beside them. These
classes are whole prompts of random or machine-generated content, the kinds a user actually
pastes (a base64 blob, a hash list, keyboard mash) where every character is ordinary and only
the model can tell that nothing in it reads like language. Protective degradation should fire
on them (DESIGN.md section 2): a router calibrated on prose has no reason to be right there.

Each class is a plain function ``make(seed) -> str`` (deterministic, so scripts and the
suite draw the same texts) and a hypothesis strategy over the seed. ``TUNING`` and ``HELD_OUT``
split the classes: thresholds may be chosen looking at the first, never at the second, and the
adversarial suite reports detection on each separately (DESIGN.md section 9).

Must NOT import torch or the engine (``reference_engine``), nor other ``rsp_bench.adversarial``
modules (the registry imports this one).
"""

from __future__ import annotations

import base64
import random
import string
import uuid
from typing import Callable

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

__all__ = ["MAKERS", "TUNING", "HELD_OUT", "make", "strategy"]

_WORDS = ("time person year way day thing man world life hand part child eye woman place work week case "
          "point government company number group problem fact be have do say get make go know take see "
          "come think look want give use find tell ask seem feel try leave call good new first last long "
          "great little own other old right big high different small large next early young important few "
          "public bad same able to of in for on with at by from up about into over after beneath under "
          "river window yellow engine quietly seven marble honest orbit velvet ladder").split()


def _length(rng: random.Random, lo: int = 40, hi: int = 400) -> int:
    return rng.randint(lo, hi)


def base64_blob(rng: random.Random) -> str:
    """Base64 of random bytes, sometimes wrapped at 76 columns like a MIME part."""
    raw = base64.b64encode(rng.randbytes(_length(rng, 30, 300))).decode()
    if rng.random() < 0.5:
        raw = "\n".join(raw[i:i + 76] for i in range(0, len(raw), 76))
    return raw


def hex_string(rng: random.Random) -> str:
    """Random hexadecimal digits, as one run or as space-separated byte pairs."""
    data = rng.randbytes(_length(rng, 20, 160))
    return data.hex() if rng.random() < 0.5 else " ".join(f"{b:02x}" for b in data)


def password_list(rng: random.Random) -> str:
    """Random alphanumeric tokens of 8-24 characters separated by spaces or newlines."""
    alphabet = string.ascii_letters + string.digits
    sep = rng.choice((" ", "\n"))
    return sep.join("".join(rng.choice(alphabet) for _ in range(rng.randint(8, 24)))
                    for _ in range(rng.randint(4, 20)))


def pseudo_words(rng: random.Random) -> str:
    """Random lowercase letter groups of 2-10 letters separated by spaces: no word is real."""
    return " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 10)))
                    for _ in range(rng.randint(10, 60)))


def keyboard_mash(rng: random.Random) -> str:
    """Runs typed by hammering the home row and its neighbours."""
    rows = ("asdfghjkl;", "qwertyuiop", "zxcvbnm,.", "jkjkjfjdks")
    out = []
    for _ in range(rng.randint(4, 25)):
        row = rng.choice(rows)
        out.append("".join(rng.choice(row) for _ in range(rng.randint(3, 14))))
    return " ".join(out)


def word_salad(rng: random.Random) -> str:
    """Common English words in random order: real words, no sentence."""
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(15, 80)))


def mojibake(rng: random.Random) -> str:
    """Ordinary multilingual text encoded as UTF-8 and decoded as cp1252 or latin-1."""
    base = rng.choice(("Grüße aus Köln, wir öffnen um neun Uhr.", "Ça coûte très cher à Paris, n'est-ce pas?",
                       "Привет, как дела? Всё хорошо.", "東京は今日晴れです。", "¿Dónde está la estación?",
                       "Ελληνικά γράμματα και λέξεις", "naïve café résumé façade"))
    text = " ".join(base for _ in range(rng.randint(2, 6)))
    return text.encode("utf-8").decode(rng.choice(("cp1252", "latin-1")), errors="ignore")


def random_ascii(rng: random.Random) -> str:
    """Random printable ASCII: letters, digits and punctuation in no order."""
    alphabet = string.ascii_letters + string.digits + string.punctuation + "  "
    return "".join(rng.choice(alphabet) for _ in range(_length(rng, 40, 400)))


def random_unicode(rng: random.Random) -> str:
    """Random letters drawn from many scripts at once (Latin, Greek, Cyrillic, Arabic, Hebrew,
    Devanagari, Thai, Han, Hangul), with occasional spaces."""
    blocks = ((0x41, 0x7A), (0x391, 0x3C9), (0x410, 0x44F), (0x627, 0x64A), (0x5D0, 0x5EA),
              (0x905, 0x939), (0xE01, 0xE2E), (0x4E00, 0x9FA5), (0xAC00, 0xD7A3))
    out = []
    for _ in range(_length(rng, 30, 250)):
        lo, hi = rng.choice(blocks)
        out.append(" " if rng.random() < 0.12 else chr(rng.randint(lo, hi)))
    return "".join(out)


def hash_list(rng: random.Random) -> str:
    """One identifier per line: UUIDs, SHA-256 or MD5-looking hex digests."""
    kind = rng.choice(("uuid", "sha256", "md5"))
    n = rng.randint(3, 15)
    if kind == "uuid":
        lines = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(n)]
    else:
        width = 64 if kind == "sha256" else 32
        lines = [rng.randbytes(width // 2).hex() for _ in range(n)]
    return "\n".join(lines)


def binary_digits(rng: random.Random) -> str:
    """Random bytes written as 8-digit binary groups."""
    return " ".join(f"{b:08b}" for b in rng.randbytes(rng.randint(8, 60)))


def letter_shuffle(rng: random.Random) -> str:
    """English sentences with all their letters shuffled across the text (spaces kept)."""
    text = "The committee met on Tuesday to review the budget and decided to postpone the vote until " \
           "the auditors had finished their report on the spending of the previous year."
    letters = [c for c in text if c.isalpha()]
    rng.shuffle(letters)
    it = iter(letters)
    return "".join(next(it) if c.isalpha() else c for c in text)


def percent_encoded(rng: random.Random) -> str:
    """Random bytes percent-encoded as in a mangled URL query."""
    return "".join(f"%{b:02X}" if rng.random() < 0.7 else rng.choice(string.ascii_letters)
                   for b in rng.randbytes(_length(rng, 20, 150)))


def random_han(rng: random.Random) -> str:
    """Random CJK ideographs with no grammar, in lines of 10-30."""
    chars = [chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(_length(rng, 30, 200))]
    return "".join(c + ("\n" if rng.random() < 0.05 else "") for c in chars)


def digit_stream(rng: random.Random) -> str:
    """A long run of random decimal digits, sometimes grouped in fives."""
    digits = "".join(rng.choice(string.digits) for _ in range(_length(rng, 40, 300)))
    return " ".join(digits[i:i + 5] for i in range(0, len(digits), 5)) if rng.random() < 0.5 else digits


def reversed_text(rng: random.Random) -> str:
    """Ordinary English prose written backwards character by character."""
    text = rng.choice(("Please summarise the following paragraph about the history of the printing press "
                       "in Europe and its effect on literacy.",
                       "The weather tomorrow will be cloudy in the morning with light rain expected in the "
                       "afternoon and clearing skies by evening.",
                       "To install the package, download the archive, unpack it and run the setup script "
                       "from the top-level folder."))
    return text[::-1]


MAKERS: dict[str, Callable[[random.Random], str]] = {fn.__name__: fn for fn in (
    base64_blob, hex_string, password_list, pseudo_words, keyboard_mash, word_salad, mojibake,
    random_ascii, random_unicode, hash_list, binary_digits, letter_shuffle, percent_encoded, random_han,
    digit_stream, reversed_text,
)}
# Split fixed before any threshold was chosen: the held-out classes were never looked at while
# tuning (DESIGN.md section 9).
TUNING: tuple[str, ...] = ("base64_blob", "hex_string", "password_list", "pseudo_words", "keyboard_mash",
                           "word_salad", "mojibake", "random_ascii")
HELD_OUT: tuple[str, ...] = ("random_unicode", "hash_list", "binary_digits", "letter_shuffle",
                             "percent_encoded", "random_han", "digit_stream", "reversed_text")


def make(name: str, seed: int) -> str:
    """The text of class ``name`` for ``seed`` (deterministic)."""
    if name not in MAKERS:
        raise KeyError(f"unknown machine-text class {name!r}; known: {', '.join(MAKERS)}")
    return MAKERS[name](random.Random(f"{name}:{seed}"))


def strategy(name: str) -> SearchStrategy[str]:
    """Hypothesis strategy drawing class ``name`` over a seed."""
    if name not in MAKERS:
        raise KeyError(f"unknown machine-text class {name!r}; known: {', '.join(MAKERS)}")
    return st.integers(0, 2**31 - 1).map(lambda seed: make(name, seed))
