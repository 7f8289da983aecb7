"""Every metric rsp-bench reports, defined once (DESIGN.md section 3).

Suites, the regression gate and the leaderboard never compute a figure by hand: they call
these functions, so a number in a run record means exactly what the docstring here says.

Groups, in file order:
  equivalence   exact-sequence match, prefix agreement, teacher-forced top-1 agreement,
                KL(unpruned || pruned) per token, perplexity ratio
  extraction    SQuAD EM / F1 (official v2.0 semantics), lenient JSON parsing and strict
                field-level precision / recall / F1
  intervals     percentile bootstrap (mean, paired difference), Wilson score interval
  speed         latency percentiles, decode rate, achieved bandwidth, interleaved speed-up
  compute       bypass ratio

Conventions: "reference" is always the unpruned side and "candidate" the pruned one; a
difference is candidate minus reference. Every bad input raises HarnessInputError naming
the bad value.

Must NOT import transformers, the reference engine, or any rsp_bench module other than
rsp_bench.errors: metrics are pure functions of plain data. torch serves only the
logits-based metrics.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import json
import math
import re
import statistics
import string
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from rsp_bench.errors import HarnessInputError

__all__ = [
    "exact_match_rate", "first_divergence", "prefix_agreement",
    "top1_matches", "top1_agreement", "kl_per_token", "kl_summary",
    "token_nll", "perplexity_ratio",
    "normalize_answer", "squad_em", "squad_f1",
    "parse_json_answer", "normalize_field_value", "FieldCounts", "field_prf", "prf",
    "doc_field_f1",
    "bootstrap_mean_ci", "bootstrap_paired_diff_ci", "bootstrap_ratio_ci", "wilson_interval",
    "percentile", "speed_summary", "achieved_bandwidth_gbs", "interleaved_speedup",
    "bypass_ratio", "blocks_executed_per_token",
]


# --------------------------------------------------------------------------------------
# Shared input checks
# --------------------------------------------------------------------------------------

def _finite_array(values: Any, name: str, *, allow_empty: bool = False) -> np.ndarray:
    """1-D float64 copy of ``values``; rejects NaN/inf because they poison every mean."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    if isinstance(values, (str, bytes)):
        raise HarnessInputError(f"{name} must be a sequence of numbers, got the string {values!r}")
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise HarnessInputError(f"{name} must be a sequence of numbers, got {values!r:.200}") from exc
    if arr.ndim != 1:
        raise HarnessInputError(f"{name} must be one-dimensional, got shape {tuple(arr.shape)}")
    if arr.size == 0 and not allow_empty:
        raise HarnessInputError(f"{name} is empty; the statistic is undefined without samples")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise HarnessInputError(f"{name}[{bad[0]}] is {arr[bad[0]]}; every value must be finite")
    return arr


def _same_length(a: Sequence[Any], b: Sequence[Any], name_a: str, name_b: str) -> None:
    if len(a) != len(b):
        raise HarnessInputError(
            f"{name_a} has {len(a)} items but {name_b} has {len(b)}; they are compared pair by pair"
        )


def _alpha(alpha: float) -> float:
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha < 1.0):
        raise HarnessInputError(f"alpha must be in (0, 1), got {alpha!r}")
    return float(alpha)


# --------------------------------------------------------------------------------------
# Equivalence: token sequences
# --------------------------------------------------------------------------------------

def _token_ids(seq: Any, name: str) -> tuple[int, ...]:
    if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__"):
        raise HarnessInputError(f"{name} must be a sequence of token ids, got {seq!r:.200}")
    try:
        return tuple(int(t) for t in seq)
    except (TypeError, ValueError) as exc:
        raise HarnessInputError(f"{name} holds a value that is not a token id: {seq!r:.200}") from exc


def _sequence_pairs(
    reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]]
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    _same_length(reference, candidate, "reference", "candidate")
    if len(reference) == 0:
        raise HarnessInputError("reference and candidate are empty; a rate over zero pairs is undefined")
    return [
        (_token_ids(r, f"reference[{i}]"), _token_ids(c, f"candidate[{i}]"))
        for i, (r, c) in enumerate(zip(reference, candidate))
    ]


def exact_match_rate(reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]]) -> float:
    """Share of pairs whose token sequences are identical (same ids, same length)."""
    pairs = _sequence_pairs(reference, candidate)
    return sum(r == c for r, c in pairs) / len(pairs)


def first_divergence(ref: Sequence[int], cand: Sequence[int]) -> int:
    """Index of the first position where the sequences differ.

    When one sequence is a prefix of the other this is the shorter length, so it always
    equals the length of the common prefix.
    """
    r, c = _token_ids(ref, "ref"), _token_ids(cand, "cand")
    for i, (a, b) in enumerate(zip(r, c)):
        if a != b:
            return i
    return min(len(r), len(c))


def prefix_agreement(reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]]) -> float:
    """Pooled share of reference tokens produced before the first divergence.

    sum_i min(first_divergence_i, len(ref_i)) / sum_i len(ref_i). Pooling (rather than a
    mean of per-pair shares) weights every reference token equally, so short answers do
    not dominate.
    """
    pairs = _sequence_pairs(reference, candidate)
    total = sum(len(r) for r, _ in pairs)
    if total == 0:
        raise HarnessInputError("every reference sequence is empty; prefix agreement is undefined")
    agreed = sum(min(first_divergence(r, c), len(r)) for r, c in pairs)
    return agreed / total


# --------------------------------------------------------------------------------------
# Equivalence: teacher-forced logits
# --------------------------------------------------------------------------------------

def _logit_list(logits: Any, name: str) -> list[torch.Tensor]:
    """A [tokens, vocab] tensor/array, or a list of them, as a list of checked tensors."""
    items = list(logits) if isinstance(logits, (list, tuple)) else [logits]
    if not items:
        raise HarnessInputError(f"{name} is an empty list; pass at least one [tokens, vocab] tensor")
    out = []
    for i, item in enumerate(items):
        label = f"{name}[{i}]" if isinstance(logits, (list, tuple)) else name
        try:
            t = torch.as_tensor(item)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise HarnessInputError(f"{label} is not a numeric [tokens, vocab] array: {item!r:.200}") from exc
        if t.dim() != 2 or t.shape[1] == 0:
            raise HarnessInputError(f"{label} must be shaped [tokens, vocab], got {tuple(t.shape)}")
        if not torch.is_floating_point(t):
            t = t.to(torch.float64)
        if torch.isnan(t).any() or torch.isposinf(t).any():
            raise HarnessInputError(f"{label} contains NaN or +inf")
        # A row of all -inf has no distribution; -inf elsewhere (masked tokens) is fine.
        dead = torch.isneginf(t).all(dim=1)
        if dead.any():
            raise HarnessInputError(f"{label} row {int(dead.nonzero()[0])} is all -inf")
        out.append(t)
    return out


def _logit_pairs(reference_logits: Any, candidate_logits: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    refs = _logit_list(reference_logits, "reference_logits")
    cands = _logit_list(candidate_logits, "candidate_logits")
    _same_length(refs, cands, "reference_logits", "candidate_logits")
    for i, (r, c) in enumerate(zip(refs, cands)):
        if r.shape != c.shape:
            raise HarnessInputError(
                f"reference_logits[{i}] has shape {tuple(r.shape)} but candidate_logits[{i}] "
                f"has {tuple(c.shape)}"
            )
    if sum(r.shape[0] for r in refs) == 0:
        raise HarnessInputError("the logits hold zero positions; agreement is undefined")
    return list(zip(refs, cands))


def top1_matches(reference_logits: Any, candidate_logits: Any) -> np.ndarray:
    """Per-position bool array: does the candidate's argmax equal the reference's?

    Lists of tensors are concatenated in order. Ties resolve to the lowest token id on both
    sides (torch.argmax), so identical logits always match.
    """
    parts = [
        (r.argmax(dim=1) == c.argmax(dim=1)).cpu().numpy()
        for r, c in _logit_pairs(reference_logits, candidate_logits)
    ]
    return np.concatenate(parts).astype(bool)


def top1_agreement(reference_logits: Any, candidate_logits: Any) -> float:
    """Pooled share of positions where the two argmax tokens agree."""
    return float(top1_matches(reference_logits, candidate_logits).mean())


def kl_per_token(reference_logits: Any, candidate_logits: Any) -> torch.Tensor:
    """KL(P_ref || P_cand) in nats at every position, float64, lists concatenated.

    P = softmax(logits) computed as log_softmax in float64 because the per-token KL of
    near-identical fp32 distributions is below fp32 resolution. Terms where P_ref is 0
    contribute 0 (the 0 log 0 convention); the result is clamped at 0 because rounding can
    leave a -1e-17 where the true value is 0.
    """
    out = []
    for r, c in _logit_pairs(reference_logits, candidate_logits):
        log_p = torch.log_softmax(r.to(torch.float64), dim=1)
        log_q = torch.log_softmax(c.to(torch.float64), dim=1)
        p = log_p.exp()
        terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))
        out.append(terms.sum(dim=1).clamp_min(0.0))
    return torch.cat(out)


def kl_summary(kl: Any) -> dict[str, float]:
    """Mean and 99th percentile (numpy, linear interpolation) of per-token KL values."""
    arr = _finite_array(kl, "kl")
    return {"mean": float(arr.mean()), "p99": float(np.percentile(arr, 99, method="linear"))}


def token_nll(logits: Any, target_ids: Any) -> torch.Tensor:
    """Per-position negative log-likelihood (nats, float64) of ``target_ids`` under ``logits``.

    ``logits[t]`` is the distribution that predicts ``target_ids[t]`` (already shifted by
    the caller). Accepts one [tokens, vocab] tensor with a [tokens] id vector, or lists of
    each (concatenated).
    """
    logit_list = _logit_list(logits, "logits")
    if isinstance(target_ids, (list, tuple)) and isinstance(logits, (list, tuple)):
        target_list = list(target_ids)
    else:
        target_list = [target_ids]
    _same_length(logit_list, target_list, "logits", "target_ids")
    out = []
    for i, (lg, tg) in enumerate(zip(logit_list, target_list)):
        ids = torch.as_tensor(tg)
        if ids.dim() != 1 or ids.shape[0] != lg.shape[0]:
            raise HarnessInputError(
                f"target_ids[{i}] must be a [tokens] vector matching logits shape {tuple(lg.shape)}, "
                f"got shape {tuple(ids.shape)}"
            )
        if ids.is_floating_point() or ids.dtype == torch.bool:
            raise HarnessInputError(f"target_ids[{i}] must hold integer token ids, got dtype {ids.dtype}")
        outside = (ids < 0) | (ids >= lg.shape[1])
        if outside.any():
            raise HarnessInputError(
                f"target_ids[{i}] holds id {int(ids[outside][0])} outside the vocabulary [0, {lg.shape[1]})"
            )
        log_p = torch.log_softmax(lg.to(torch.float64), dim=1)
        out.append(-log_p.gather(1, ids.long().unsqueeze(1)).squeeze(1))
    return torch.cat(out)


def perplexity_ratio(reference_nll: Any, candidate_nll: Any) -> float:
    """exp(mean candidate NLL) / exp(mean reference NLL), on the same target tokens.

    Computed as exp(mean_c - mean_r), which is the same number without overflow. Above 1
    means the candidate finds the reference continuation less likely.
    """
    ref = _finite_array(reference_nll, "reference_nll")
    cand = _finite_array(candidate_nll, "candidate_nll")
    _same_length(ref, cand, "reference_nll", "candidate_nll")
    return float(math.exp(cand.mean() - ref.mean()))


# --------------------------------------------------------------------------------------
# Extraction: SQuAD (official v2.0 evaluation semantics)
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# Extraction: structured (JSON) fields
# --------------------------------------------------------------------------------------
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


_FENCE = re.compile(r"```[A-Za-z0-9_+-]*")
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_NEXT_CLOSER = re.compile(r"\s*[}\]]")
_NEXT_COLON = re.compile(r"\s*:")
# A flat "key": value pair of an object cut short (a string left open at the line's end, a
# missing brace): small models often end their JSON this way, mid-object.
_LOOSE_PAIR = re.compile(r'"([^"\n]+)"\s*:\s*(?:"([^"\n]*)"?|([^,\n}]+))')


def _matching_brace(text: str, start: int) -> int | None:
    """Index of the '}' closing the '{' at ``start``, skipping braces inside quotes."""
    depth, quote, i = 0, None, start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _read_quoted(text: str, start: int) -> tuple[str, int]:
    """Decoded content of the quoted string at ``start`` and the index after it."""
    quote, i = text[start], start + 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    raw = text[start + 1:i]
    if quote == "'":
        raw = raw.replace("\\'", "'").replace('"', '\\"')
    try:
        content = json.loads(f'"{raw}"')
    except json.JSONDecodeError:
        content = raw
    return content, i + 1


def _to_strict_json(text: str) -> str:
    """Repair the usual model slips: single quotes, trailing commas, Python literals, bare keys."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch in "\"'":
            content, i = _read_quoted(text, i)
            out.append(json.dumps(content, ensure_ascii=False))
            continue
        if ch == "," and _NEXT_CLOSER.match(text, i + 1):
            i += 1
            continue
        if ch.isalpha() or ch == "_":
            j = i
            while j < len(text) and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            if _NEXT_COLON.match(text, j):
                out.append(json.dumps(word))
            else:
                out.append(_PY_LITERALS.get(word, word))
            i = j
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def parse_json_answer(text: str) -> dict | None:
    """First balanced {...} object in a model's answer that parses, leniently; else None.

    Tolerates ``` fences, prose around the object, single quotes, trailing commas,
    True/False/None and unquoted keys; when no object parses, the flat ``"key": value`` pairs
    of an object cut short (a string left open at a line end, no closing brace) are recovered.
    Scoring stays strict: this only recovers the object, for pruned and unpruned alike.
    """
    if not isinstance(text, str):
        raise HarnessInputError(f"parse_json_answer expects a string, got {text!r:.200}")
    text = _FENCE.sub(" ", text)
    for start in [i for i, ch in enumerate(text) if ch == "{"]:
        end = _matching_brace(text, start)
        if end is None:
            continue
        candidate = text[start:end + 1]
        for attempt in (candidate, _to_strict_json(candidate)):
            try:
                obj = json.loads(attempt)
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(obj, dict):
                return obj
    return _loose_pairs(text)


def _loose_pairs(text: str) -> dict | None:
    """The flat double-quoted ``"key": value`` pairs after the first ``{``, or None if there are none."""
    start = text.find("{")
    if start < 0:
        return None
    out: dict = {}
    for key, quoted, bare in _LOOSE_PAIR.findall(text, start):
        if bare:
            bare = bare.strip()
            try:
                out[key] = json.loads(bare)
            except json.JSONDecodeError:
                out[key] = bare
        else:
            out[key] = quoted
    return out or None


# --------------------------------------------------------------------------------------
# Confidence intervals
# --------------------------------------------------------------------------------------

# Bounds memory: resample index matrices are drawn in chunks of at most this many entries.
_MAX_DRAWS_PER_CHUNK = 2_000_000


def _bootstrap_interval(
    values: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    alpha: float,
    n_resamples: int,
    seed: int,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` (applied row-wise to resamples)."""
    alpha = _alpha(alpha)
    if not isinstance(n_resamples, int) or isinstance(n_resamples, bool) or n_resamples < 1:
        raise HarnessInputError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    rng = np.random.default_rng(seed)
    n = values.size
    stats = np.empty(n_resamples)
    rows = max(1, _MAX_DRAWS_PER_CHUNK // n)
    for start in range(0, n_resamples, rows):
        count = min(rows, n_resamples - start)
        idx = rng.integers(0, n, size=(count, n))
        stats[start:start + count] = statistic(values[idx])
    lo, hi = np.percentile(stats, [100 * alpha / 2, 100 * (1 - alpha / 2)], method="linear")
    return float(lo), float(hi)


def _row_mean(a: np.ndarray) -> np.ndarray:
    return a.mean(axis=1)


def _row_median(a: np.ndarray) -> np.ndarray:
    return np.median(a, axis=1)


def bootstrap_mean_ci(
    values: Sequence[float], alpha: float = 0.05, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, lo, hi): the sample mean and its percentile-bootstrap interval.

    Resample independent units (one value per prompt or document, not per token of one
    prompt), or the interval will be too narrow.
    """
    arr = _finite_array(values, "values")
    lo, hi = _bootstrap_interval(arr, _row_mean, alpha, n_resamples, seed)
    return float(arr.mean()), lo, hi


def bootstrap_paired_diff_ci(
    candidate_values: Sequence[float],
    reference_values: Sequence[float],
    alpha: float = 0.05,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean_diff, lo, hi) of candidate minus reference, pairs resampled together by index."""
    cand = _finite_array(candidate_values, "candidate_values")
    ref = _finite_array(reference_values, "reference_values")
    _same_length(cand, ref, "candidate_values", "reference_values")
    diff = cand - ref
    lo, hi = _bootstrap_interval(diff, _row_mean, alpha, n_resamples, seed)
    return float(diff.mean()), lo, hi


def bootstrap_ratio_ci(
    numerators: Sequence[float],
    denominators: Sequence[float],
    alpha: float = 0.05,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(ratio, lo, hi): sum(numerators) / sum(denominators) and its cluster-bootstrap interval.

    For pooled per-token figures (top-1 agreement, mean KL, prefix agreement, bypass ratio)
    whose independent unit is the prompt: unit i contributes numerators[i] (e.g. matching
    tokens) over denominators[i] (its tokens), and whole units are resampled, so tokens of
    one prompt are never treated as independent draws. Every denominator must be > 0.
    """
    num = _finite_array(numerators, "numerators")
    den = _finite_array(denominators, "denominators")
    _same_length(num, den, "numerators", "denominators")
    if (den <= 0).any():
        bad = int(np.flatnonzero(den <= 0)[0])
        raise HarnessInputError(f"denominators[{bad}] is {den[bad]}; every unit needs a positive count")

    def ratio(rows: np.ndarray) -> np.ndarray:
        idx = rows.astype(np.int64)
        return num[idx].sum(axis=1) / den[idx].sum(axis=1)

    lo, hi = _bootstrap_interval(np.arange(num.size, dtype=np.float64), ratio, alpha, n_resamples, seed)
    return float(num.sum() / den.sum()), lo, hi


def wilson_interval(successes: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (sound near 0 and 1, unlike Wald)."""
    for name, value in (("successes", successes), ("n", n)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise HarnessInputError(f"{name} must be an integer, got {value!r}")
    if n <= 0:
        raise HarnessInputError(f"n must be positive, got {n}")
    if not 0 <= successes <= n:
        raise HarnessInputError(f"successes must be in [0, n={n}], got {successes}")
    z = statistics.NormalDist().inv_cdf(1 - _alpha(alpha) / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # Exact bounds at the edges; the formula leaves ~1e-17 of rounding there.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


# --------------------------------------------------------------------------------------
# Speed
# --------------------------------------------------------------------------------------

def percentile(samples: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) with numpy's linear interpolation."""
    if not isinstance(q, (int, float)) or isinstance(q, bool) or not 0 <= q <= 100:
        raise HarnessInputError(f"q must be a number in [0, 100], got {q!r}")
    return float(np.percentile(_finite_array(samples, "samples"), q, method="linear"))


def speed_summary(ttft_s: Sequence[float], tpot_s: Sequence[float]) -> dict[str, float]:
    """Latency percentiles in ms and the decode rate.

    ttft_s: time to first token per request (s); tpot_s: time per output token after the
    first (s), one sample per token or per request. decode_tokens_per_s = 1 / median(tpot):
    the median resists the odd stalled step that a mean-based rate would absorb.
    """
    ttft = _finite_array(ttft_s, "ttft_s")
    tpot = _finite_array(tpot_s, "tpot_s")
    if (ttft < 0).any():
        raise HarnessInputError(f"ttft_s holds a negative time: {ttft.min()}")
    if (tpot <= 0).any():
        raise HarnessInputError(f"tpot_s must be positive times, got {tpot.min()}")
    tpot_p50 = float(np.percentile(tpot, 50, method="linear"))
    return {
        "ttft_ms_p50": 1000 * float(np.percentile(ttft, 50, method="linear")),
        "ttft_ms_p90": 1000 * float(np.percentile(ttft, 90, method="linear")),
        "tpot_ms_p50": 1000 * tpot_p50,
        "tpot_ms_p90": 1000 * float(np.percentile(tpot, 90, method="linear")),
        "decode_tokens_per_s": 1.0 / tpot_p50,
    }


def achieved_bandwidth_gbs(bytes_per_token: float, tokens_per_s: float) -> float:
    """Weight bytes read per token x tokens/s, in GB/s (1e9), as gpt-fast prints it."""
    for name, value in (("bytes_per_token", bytes_per_token), ("tokens_per_s", tokens_per_s)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise HarnessInputError(f"{name} must be a finite non-negative number, got {value!r}")
    return bytes_per_token * tokens_per_s / 1e9


def interleaved_speedup(
    base_samples: Sequence[float],
    candidate_samples: Sequence[float],
    alpha: float = 0.05,
    n_resamples: int = 2000,
    seed: int = 0,
) -> dict[str, float]:
    """Speed-up of the candidate from A B A B interleaved durations (lower is faster).

    Pair i is (base[i], candidate[i]), timed back to back so both see the same machine
    state. ratio = median_i(base_i / candidate_i), above 1 when the candidate is faster;
    lo/hi: percentile bootstrap over pairs. The median of per-pair ratios cancels drift
    (thermal, other tenants) that a ratio of two overall means would absorb.
    """
    base = _finite_array(base_samples, "base_samples")
    cand = _finite_array(candidate_samples, "candidate_samples")
    _same_length(base, cand, "base_samples", "candidate_samples")
    for name, arr in (("base_samples", base), ("candidate_samples", cand)):
        if (arr <= 0).any():
            raise HarnessInputError(f"{name} must be positive durations, got {arr.min()}")
    ratios = base / cand
    lo, hi = _bootstrap_interval(ratios, _row_median, alpha, n_resamples, seed)
    return {"ratio": float(np.median(ratios)), "lo": lo, "hi": hi}


# --------------------------------------------------------------------------------------
# Compute
# --------------------------------------------------------------------------------------

def bypass_ratio(layers_bypassed: int, blocks: int, tokens: int) -> float:
    """Share of (block, decode token) steps skipped: layers_bypassed / (blocks x tokens); 0 for no tokens."""
    for name, value in (("layers_bypassed", layers_bypassed), ("blocks", blocks), ("tokens", tokens)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise HarnessInputError(f"{name} must be a non-negative integer, got {value!r}")
    if blocks == 0:
        raise HarnessInputError("blocks must be positive, got 0")
    if layers_bypassed > blocks * tokens:
        raise HarnessInputError(
            f"layers_bypassed={layers_bypassed} exceeds blocks x tokens = {blocks} x {tokens}"
        )
    if tokens == 0:
        return 0.0
    return layers_bypassed / (blocks * tokens)


def blocks_executed_per_token(layers_bypassed: int, blocks: int, tokens: int) -> float:
    """Decoder blocks executed per decoded token: blocks x (1 - bypass_ratio), same inputs."""
    return blocks * (1.0 - bypass_ratio(layers_bypassed, blocks, tokens))
