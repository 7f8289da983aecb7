"""Structured (JSON) extraction scoring: field value normalization and field precision/recall/F1.

Scoring is strict: the value conventions below decide when a predicted field equals its
gold; the lenient reading of a model's answer into an object is ``rsp_bench.metrics.json_answer``.

Must NOT import torch, transformers, the reference engine, or any rsp_bench module other
than rsp_bench.errors and ``rsp_bench.metrics.squad`` (for normalize_answer).
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable

from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics.squad import normalize_answer

__all__ = ["normalize_field_value", "FieldCounts", "field_prf", "prf", "doc_field_f1"]


#
# Value conventions (the generator in fixtures/structured/generate.py writes gold in them):
#   percentages  percent points: "12.3%" -> 12.3 (never 0.123)
#   money        plain currency units: "$2.45B" -> 2450000000.0, "$892M" -> 892000000.0,
#                "$1,234.50" -> 1234.5; K/M/B/T (and thousand/million/billion/trillion,
#                mn/bn/tn) multiply; the currency symbol or code is dropped
#   counts       plain numbers; a trailing unit word (months, kg, days, years) is dropped,
#                the unit lives in the key name (term_months, weight_kg)
#   dates        ISO "YYYY-MM-DD"; "March 5, 2026", "5 March 2026", "Mar. 5th, 2026" parse
#   other text   SQuAD normalize_answer
# Two numbers are equal when they agree after rounding half-up to the gold's number of
# decimals as JSON writes it (int 24 -> 0; 12.3 -> 1; 72.0 -> 1; 2450000000.0 -> 1).

_CURRENCY = r"(?:[$€£¥]|usd|eur|gbp|us\$)"
_NUMBER_RE = re.compile(
    rf"""^(?P<sign>[-+\u2212])?\s*{_CURRENCY}?\s*(?P<sign2>[-+\u2212])?\s*
    (?P<num>\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)\s*
    (?P<scale>%|percent|pct|thousand|million|billion|trillion|mn|bn|tn|k|m|b|t)?\s*
    (?:{_CURRENCY}|dollars|euros|pounds)?\s*
    (?:months?|kg|kgs|kilograms?|days?|years?)?\s*$""",
    re.IGNORECASE | re.VERBOSE,
)
_SCALE = {
    "k": 10**3, "thousand": 10**3,
    "m": 10**6, "mn": 10**6, "million": 10**6,
    "b": 10**9, "bn": 10**9, "billion": 10**9,
    "t": 10**12, "tn": 10**12, "trillion": 10**12,
}
_MONTHS = {
    name: i
    for i, names in enumerate(
        [("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"),
         ("may",), ("june", "jun"), ("july", "jul"), ("august", "aug"),
         ("september", "sep", "sept"), ("october", "oct"), ("november", "nov"),
         ("december", "dec")],
        start=1,
    )
    for name in names
}
_DATE_ISO = re.compile(r"^(\d{4})-(\d{1,2})-(\d{1,2})$")
_DATE_MDY = re.compile(r"^([a-z]+)\.?\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})$", re.IGNORECASE)
_DATE_DMY = re.compile(r"^(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?([a-z]+)\.?,?\s+(\d{4})$", re.IGNORECASE)


def _parse_number(s: str) -> float | None:
    m = _NUMBER_RE.match(s)
    if m is None:
        return None
    value = decimal.Decimal(m.group("num").replace(",", ""))
    scale = (m.group("scale") or "").lower()
    value *= _SCALE.get(scale, 1)  # "%" and "percent" keep percent points
    if (m.group("sign") or m.group("sign2") or "") in ("-", "\u2212"):
        value = -value
    return float(value)


def _parse_date(s: str) -> str | None:
    for pattern, order in ((_DATE_ISO, "ymd"), (_DATE_MDY, "mdy"), (_DATE_DMY, "dmy")):
        m = pattern.match(s)
        if m is None:
            continue
        parts = dict(zip(order, m.groups()))
        month = parts["m"]
        month_no = int(month) if month.isdigit() else _MONTHS.get(month.lower())
        if month_no is None:
            return None
        try:
            return datetime.date(int(parts["y"]), month_no, int(parts["d"])).isoformat()
        except ValueError:
            return None
    return None


def normalize_field_value(v: Any) -> float | str | bool | None:
    """Canonical form of a JSON field value under the conventions above.

    None -> None; bool -> bool; int/float -> float; a string that reads as a number ->
    float; a string that reads as a date -> ISO date string; any other string ->
    normalize_answer; lists/dicts -> normalize_answer of their JSON text (they never equal
    a scalar gold).
    """
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        s = " ".join(v.split())
        number = _parse_number(s)
        if number is not None:
            return number
        date = _parse_date(s)
        if date is not None:
            return date
        return normalize_answer(s)
    return normalize_answer(json.dumps(v, sort_keys=True, ensure_ascii=False, default=str))


def _gold_decimals(raw_gold: Any, normalized: float) -> int:
    """Decimals of the gold as JSON writes it: int 24 -> 0, float 72.0 -> 1, 12.35 -> 2.

    The float's shortest repr keeps one decimal for whole values (72.0), so a gold margin
    of 72.0% does not accept 71.6. A gold string ("$2.45B") uses its normalized value.
    """
    if isinstance(raw_gold, int):
        return 0
    exponent = decimal.Decimal(repr(normalized)).as_tuple().exponent
    return max(0, -int(exponent))


def _round_half_up(x: float, decimals: int) -> decimal.Decimal:
    # Enough precision for any finite double, so quantize never raises.
    with decimal.localcontext() as ctx:
        ctx.prec = 800
        return decimal.Decimal(repr(x)).quantize(
            decimal.Decimal(1).scaleb(-decimals), rounding=decimal.ROUND_HALF_UP
        )


def _field_values_equal(predicted: Any, gold: Any) -> bool:
    p, g = normalize_field_value(predicted), normalize_field_value(gold)
    if isinstance(g, float):
        if not isinstance(p, float) or not math.isfinite(p):
            return False
        d = _gold_decimals(gold, g)
        return _round_half_up(p, d) == _round_half_up(g, d)
    return p == g


def _normalize_key(key: Any) -> str:
    # Models write "Gross Margin Pct" or "gross-margin-pct" for gross_margin_pct.
    return re.sub(r"[\s\-]+", "_", str(key).strip().lower())


@dataclass(frozen=True)
class FieldCounts:
    """Field-level true positives, false positives and false negatives of one document."""

    tp: int
    fp: int
    fn: int


def field_prf(predicted: dict | None, gold: dict) -> FieldCounts:
    """Score one predicted JSON object against its gold fields.

    Keys match after lower-casing and turning spaces/hyphens into underscores. A predicted
    key in gold with an equal value is a tp. A wrong value counts one fp and one fn; a gold
    key not predicted counts fn; a predicted key not in gold counts fp. A null predicted
    value means "no answer": it counts as not predicted. ``predicted=None`` (nothing
    parsed) makes every gold key a fn.
    """
    if not isinstance(gold, dict) or not gold:
        raise HarnessInputError(f"gold must be a non-empty dict of fields, got {gold!r:.200}")
    gold_norm: dict[str, Any] = {}
    for key, value in gold.items():
        nk = _normalize_key(key)
        if nk in gold_norm:
            raise HarnessInputError(f"gold keys {key!r} and another both normalize to {nk!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise HarnessInputError(f"gold field {key!r} is {value}; gold numbers must be finite")
        if value is None:
            raise HarnessInputError(f"gold field {key!r} is null; every gold field needs a value")
        gold_norm[nk] = value
    if predicted is None:
        return FieldCounts(0, 0, len(gold_norm))
    if not isinstance(predicted, dict):
        raise HarnessInputError(f"predicted must be a dict or None, got {predicted!r:.200}")

    tp = fp = 0
    seen: set[str] = set()
    for key, value in predicted.items():
        if value is None:
            continue
        nk = _normalize_key(key)
        if nk not in gold_norm or nk in seen:  # extra key, or a duplicate after normalization
            fp += 1
            continue
        seen.add(nk)
        if _field_values_equal(value, gold_norm[nk]):
            tp += 1
        else:
            fp += 1
    return FieldCounts(tp=tp, fp=fp, fn=len(gold_norm) - tp)


def prf(counts: Iterable[FieldCounts]) -> dict[str, float]:
    """Micro-averaged precision, recall and F1 over documents (0 where a denominator is 0)."""
    tp = fp = fn = n = 0
    for c in counts:
        if not isinstance(c, FieldCounts) or min(c.tp, c.fp, c.fn) < 0:
            raise HarnessInputError(f"prf expects FieldCounts with non-negative counts, got {c!r}")
        tp, fp, fn, n = tp + c.tp, fp + c.fp, fn + c.fn, n + 1
    if n == 0 or tp + fp + fn == 0:
        raise HarnessInputError("prf got no fields to score (no documents, or all counts zero)")
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def doc_field_f1(predicted: dict | None, gold: dict) -> float:
    """Field F1 of one document: the per-document value a bootstrap resamples."""
    return prf([field_prf(predicted, gold)])["f1"]
