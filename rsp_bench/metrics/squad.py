"""SQuAD answer scoring with the official v2.0 evaluation semantics: normalization, EM, F1.

Must NOT import torch, transformers, the reference engine, the other metric modules or any
rsp_bench module other than rsp_bench.errors.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Sequence

from rsp_bench.errors import HarnessInputError

__all__ = ["normalize_answer", "squad_em", "squad_f1"]


_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Official SQuAD normalization: lower-case, drop ASCII punctuation, drop a/an/the, fold spaces."""
    if not isinstance(s, str):
        raise HarnessInputError(f"normalize_answer expects a string, got {s!r:.200}")
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _squad_golds(prediction: str, gold_answers: Sequence[str]) -> list[str]:
    """Gold answers as the official script scores them (empty-normalized ones dropped)."""
    if not isinstance(prediction, str):
        raise HarnessInputError(f"prediction must be a string, got {prediction!r:.200}")
    # A bare string would silently be scored character by character.
    if isinstance(gold_answers, str) or not isinstance(gold_answers, Sequence):
        raise HarnessInputError(f"gold_answers must be a list of strings, got {gold_answers!r:.200}")
    for i, g in enumerate(gold_answers):
        if not isinstance(g, str):
            raise HarnessInputError(f"gold_answers[{i}] is {g!r}, not a string")
    golds = [g for g in gold_answers if normalize_answer(g)]
    # The official script's rule for unanswerable questions: the only gold is "".
    return golds or [""]


def _squad_f1_single(gold: str, prediction: str) -> float:
    gold_toks = normalize_answer(gold).split()
    pred_toks = normalize_answer(prediction).split()
    if not gold_toks or not pred_toks:
        return float(gold_toks == pred_toks)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_toks)
    recall = same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def squad_em(prediction: str, gold_answers: Sequence[str]) -> float:
    """1.0 if the normalized prediction equals any normalized gold answer, else 0.0."""
    golds = _squad_golds(prediction, gold_answers)
    pred = normalize_answer(prediction)
    return max(float(normalize_answer(g) == pred) for g in golds)


def squad_f1(prediction: str, gold_answers: Sequence[str]) -> float:
    """Token-overlap F1 of normalized strings, maximised over gold answers (0..1)."""
    return max(_squad_f1_single(g, prediction) for g in _squad_golds(prediction, gold_answers))
