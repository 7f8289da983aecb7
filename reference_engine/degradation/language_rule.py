"""The language rule of protective degradation (issue 26): decide another language by what
pruning does to it, not by how unfamiliar it looks.

The model-level score (``reference_engine.ood``) reads an ordinary request in a language the model
knows less well as odd, as it reads shuffled words or a cipher as odd. Degrading is protection
only where pruning does more damage than on English. So for each script the damage of pruning at
the default configuration was measured (teacher-forced top-1 and KL against pruning off, on plain
requests of the development splits, pooled over the languages written in it) and kept per weights
(``<weights>-script-damage.json``, beside the score). A prompt that is a *plain request* (most of
its letters in one script; its request words, ``request_words``, most of its content) in a script
whose damage is no more than English's is judged by the score against a higher threshold, the
margin; odd input that reads as words in such a script (shuffled words, a cipher, sorted lines)
is still caught above it. The margin and the coverage were chosen on development splits that the
table was not fitted on; the file names both.

Must NOT import ``rsp_bench``, torch or other modules of this package but ``chars``. Stdlib only.
"""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .chars import _script_of

VERSION = 1


@dataclass(frozen=True)
class LanguageRule:
    """Which scripts pruning spares as it spares English, and how a plain request in one is judged."""

    scripts: frozenset[str]  # scripts whose measured damage is no more than English's
    min_share: float  # the dominant script's share of the prompt's letters
    min_coverage: float  # request words' share of the scored content tokens
    margin: float  # added to the score's threshold for such a request
    info: dict  # the evidence: per-script figures, English's, the splits

    def margin_for(self, text: str) -> float:
        """The margin this prompt gets: ``margin`` when its letters are mostly one spared script,
        else 0 (the coverage is checked where the request words are known)."""
        script, share = dominant_script(text)
        return self.margin if script in self.scripts and share >= self.min_share else 0.0


def dominant_script(text: str) -> tuple[str | None, float]:
    """The script most of the letters are in, and its share of them (None, 0.0 without letters)."""
    counts = Counter(_script_of(ord(ch)) for ch in text if unicodedata.category(ch)[0] == "L")
    total = sum(counts.values())
    if not total:
        return None, 0.0
    script, n = counts.most_common(1)[0]
    return script, n / total


def rule_path(folder: Path, weights_sha256: str) -> Path:
    return folder / "calibration" / f"{weights_sha256[:16]}-script-damage-v{VERSION}.json"


def load(path: Path, weights_sha256: str) -> LanguageRule | None:
    """The stored rule, or None when missing, damaged, of another version or other weights (then
    no prompt gets a margin: the score alone decides, as before the rule)."""
    try:
        d = json.loads(path.read_text())
        if d.get("version") != VERSION or d.get("weights_sha256") != weights_sha256:
            return None
        return LanguageRule(frozenset(d["scripts"]), float(d["min_share"]), float(d["min_coverage"]),
                            float(d["margin"]), dict(d.get("info", {})))
    except (OSError, ValueError, KeyError, TypeError):
        return None
