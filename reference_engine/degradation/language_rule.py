"""The language rule of protective degradation (issue 26): decide another language by what
pruning does to it, not by how unfamiliar it looks.

The model-level score (``reference_engine.ood``) reads an ordinary request in a language the model
knows less well as odd, as it reads shuffled words or a cipher as odd. Degrading is protection
only where pruning does more damage than on English. Measured per language (12-04c report, unit
router at 0.5), that damage runs *against* unfamiliarity: a language's mean prompt loss and
pruning's KL there have Spearman -0.66 over 46 languages, English included
(scripts/language_loss_damage.py). The languages the model barely reads (Swahili, Welsh, Estonian,
Basque: loss 5.6-6.1 nats) lose less than English does (KL 0.27-0.29 against 0.31), the ones it
reads well (German, French, Russian, Japanese) two to five times more. So the score, which fires
on unfamiliar text, degraded mostly languages pruning spares and left most of those it hurts.

Version 2 keys the damage on both: per script, the prompts' mean loss (the score's own per-token
loss, already computed) from the highest down. For each script the damage of pruning at the
default configuration was measured per plain request (teacher-forced top-1 and KL against pruning
off, on plain requests of fit splits) and kept per weights (``<weights>-script-damage-v2.json``,
beside the score): ``min_loss[script]`` is the lowest loss such that the plain requests at or
above it are, pooled, hurt no more than English's (0.0: the whole script). A *plain request*
(most of its letters in one script; its request words, ``request_words``, most of its content)
in a spared script at a loss at or above its cut is judged by the score against a higher
threshold, the margin; odd input that reads as words in such a script (shuffled words, a cipher,
sorted lines) is still caught above it. The margin and the coverage were chosen on development
splits that the table was not fitted on; the file names both.

Must NOT import ``rsp_bench``, torch or other modules of this package but ``chars``. Stdlib only.
"""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .chars import _script_of

VERSION = 2  # 2: a loss cut per spared script (version 1 spared whole scripts)


@dataclass(frozen=True)
class LanguageRule:
    """Which scripts pruning spares as it spares English, and how a plain request in one is judged."""

    min_loss: dict[str, float]  # spared script -> mean prompt loss (nats) from which its plain requests are spared
    min_share: float  # the dominant script's share of the prompt's letters
    min_coverage: float  # request words' share of the scored content tokens
    margin: float  # added to the score's threshold for such a request
    info: dict  # the evidence: per-script figures, English's, the splits

    @property
    def scripts(self) -> frozenset[str]:
        return frozenset(self.min_loss)

    def margin_for(self, text: str, mean_loss: float) -> float:
        """The margin this prompt gets: ``margin`` when its letters are mostly one spared script
        and the model's mean loss on it (nats per token, the score's own) reaches that script's
        cut, else 0 (the coverage is checked where the request words are known)."""
        script, share = dominant_script(text)
        cut = self.min_loss.get(script) if script is not None else None
        return self.margin if cut is not None and share >= self.min_share and mean_loss >= cut else 0.0


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
        return LanguageRule({str(k): float(v) for k, v in d["min_loss"].items()}, float(d["min_share"]),
                            float(d["min_coverage"]), float(d["margin"]), dict(d.get("info", {})))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
