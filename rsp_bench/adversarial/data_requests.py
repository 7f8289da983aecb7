"""Requests that carry data: the development split for protective degradation's request rule.

A developer asks about a payload all day: "decode this base64", "sort these numbers", "what does
this regex match". The payload alone is machine-made text, the kind protective degradation is for;
wrapped in a request it is an ordinary request, and degrading it costs that request all of
pruning's speed (issue 26). ``make(seed)`` draws one request and its payload alone, from seeded
templates (a verb phrase before, after or around a payload of one of ``KINDS``).

This is the *development* split: the request rule's design and its one parameter were chosen
looking at it. It reports nothing. The figures come from ``fixtures/degradation_heldout`` (written
by someone who did not see the rule, committed before its first measurement).

Must NOT import torch or the engine (``reference_engine``), nor other ``rsp_bench.adversarial``
modules.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import random
import string
import uuid
from typing import Callable

__all__ = ["KINDS", "make", "draw"]

_WORDS = ("the meeting moved to thursday afternoon because the room was booked", "please send the invoice by "
          "friday", "hello from the build server", "user settings saved", "deploy finished without errors",
          "my cat likes the window", "order shipped to warehouse four")


def _b64(r: random.Random) -> str:
    return base64.b64encode(r.choice(_WORDS).encode()).decode()


def _uuids(r: random.Random) -> str:
    return "\n".join(str(uuid.UUID(int=r.getrandbits(128), version=4)) for _ in range(r.randint(2, 6)))


def _numbers(r: random.Random) -> str:
    return ", ".join(str(r.randint(-500, 5000)) for _ in range(r.randint(5, 20)))


def _hashes(r: random.Random) -> str:
    return "\n".join(hashlib.sha1(str(r.random()).encode()).hexdigest() for _ in range(r.randint(2, 5)))


def _ipv6(r: random.Random) -> str:
    return str(ipaddress.IPv6Address(r.getrandbits(128)))


def _ipv4s(r: random.Random) -> str:
    return " ".join(str(ipaddress.IPv4Address(r.getrandbits(32))) for _ in range(r.randint(2, 6)))


def _octets(r: random.Random) -> str:
    return " ".join(format(b, "08b") for b in r.choice(("Hi", "OK", "cat", "yes!")).encode())


_MORSE = {"a": ".-", "b": "-...", "c": "-.-.", "d": "-..", "e": ".", "f": "..-.", "g": "--.", "h": "....", "i": "..",
          "l": ".-..", "m": "--", "n": "-.", "o": "---", "p": ".--.", "r": ".-.", "s": "...", "t": "-", "u": "..-",
          "w": ".--", "y": "-.--"}


def _morse(r: random.Random) -> str:
    word = r.choice(("sos help", "hello world", "stop", "nice try", "pull up"))
    return " / ".join(" ".join(_MORSE[c] for c in w) for w in word.split())


def _regex(r: random.Random) -> str:
    return r.choice((r"^\d{3}-\d{2}-\d{4}$", r"(?i)\b[a-f0-9]{8}(?:-[a-f0-9]{4}){3}-[a-f0-9]{12}\b",
                     r"^(?=.*[A-Z])(?=.*\d).{8,}$", r"\s+$", r"[^@\s]+@[^@\s]+\.\w{2,}", r"^#?([a-f0-9]{6}|[a-f0-9]{3})$"))


def _hex(r: random.Random) -> str:
    return " ".join(f"{r.getrandbits(8):02x}" for _ in range(r.randint(8, 32)))


def _token(r: random.Random) -> str:
    return "".join(r.choice(string.ascii_letters + string.digits) for _ in range(r.randint(20, 40)))


def _chess(r: random.Random) -> str:
    return r.choice(("1. e4 e5 2. Nf3 Nc6 3. Bb5 a6", "1. d4 Nf6 2. c4 e6 3. Nc3 Bb4", "1. e4 c5 2. Nf3 d6 3. d4 cxd4"))


def _coords(r: random.Random) -> str:
    return "; ".join(f"{r.uniform(-90, 90):.5f}, {r.uniform(-180, 180):.5f}" for _ in range(r.randint(1, 4)))


KINDS: dict[str, Callable[[random.Random], str]] = {
    "base64": _b64, "uuids": _uuids, "numbers": _numbers, "hashes": _hashes, "ipv6": _ipv6, "ipv4": _ipv4s,
    "binary_octets": _octets, "morse": _morse, "regex": _regex, "hex_bytes": _hex, "api_token": _token,
    "chess": _chess, "coordinates": _coords,
}

_ASKS = ("Can you decode this?", "Please sort these.", "Is this valid?", "What does this mean?",
         "Remove the duplicates, please.", "Explain what this is.", "Which of these looks wrong?",
         "Convert this to something readable.", "What format is this?", "Check this for me:")


def make(seed: int) -> tuple[str, str, str]:
    """(kind, request, payload alone) for one seed; deterministic."""
    r = random.Random(seed)
    kind = sorted(KINDS)[seed % len(KINDS)]
    payload = KINDS[kind](r)
    ask = r.choice(_ASKS)
    shape = r.randrange(4)
    if shape == 0:
        request = f"{ask} {payload}"
    elif shape == 1:
        request = f"{ask}\n\n{payload}"
    elif shape == 2:
        request = f"{payload}\n\n{ask}"
    else:
        request = f"I got this from a log file: {payload}\n{ask} Thanks!"
    return kind, request, payload


def draw(n: int, start: int = 0) -> list[tuple[str, str, str]]:
    return [make(s) for s in range(start, start + n)]
