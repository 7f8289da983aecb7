"""Unit tests of rsp_bench.metrics against hand-computed values.

Every expected number below is worked out by hand in a comment, so a change of definition
fails here rather than shifting figures in run records. The SQuAD scorers are also checked
against a copy of the official evaluation functions on generated strings.

Must NOT import transformers or the engine.
"""

from __future__ import annotations

import collections
import math
import re
import string

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics import (
    FieldCounts,
    achieved_bandwidth_gbs,
    bootstrap_mean_ci,
    bootstrap_paired_diff_ci,
    bypass_ratio,
    doc_field_f1,
    exact_match_rate,
    field_prf,
    first_divergence,
    interleaved_speedup,
    kl_per_token,
    kl_summary,
    normalize_answer,
    normalize_field_value,
    parse_json_answer,
    percentile,
    perplexity_ratio,
    prefix_agreement,
    prf,
    speed_summary,
    squad_em,
    squad_f1,
    token_nll,
    top1_agreement,
    top1_matches,
    wilson_interval,
)

# ---------------------------------------------------------------------------------------
# Token sequences
# ---------------------------------------------------------------------------------------

REF = [[1, 2, 3], [4, 5], [6]]
CAND = [[1, 2, 3], [4, 6], [6, 7]]


def test_exact_match_rate_counts_identical_pairs_only():
    # Pair 0 identical; pair 1 differs at index 1; pair 2 is longer -> 1 of 3.
    assert exact_match_rate(REF, CAND) == pytest.approx(1 / 3)
    assert exact_match_rate(REF, REF) == 1.0


@pytest.mark.parametrize(
    "ref, cand, expected",
    [([1, 2], [1, 2], 2), ([1, 2, 3], [1, 2], 2), ([1], [1, 9, 9], 1), ([], [1], 0), ([5], [6], 0),
     ([1, 2, 3], [1, 7, 3], 1)],
)
def test_first_divergence(ref, cand, expected):
    assert first_divergence(ref, cand) == expected


def test_prefix_agreement_is_pooled_over_reference_tokens():
    # Common prefixes 3, 1, 1 (capped at len(ref)=1) over 3 + 2 + 1 reference tokens.
    assert prefix_agreement(REF, CAND) == pytest.approx(5 / 6)
    # A candidate that runs on past a fully matched reference still scores 1.
    assert prefix_agreement([[1, 2]], [[1, 2, 3, 4]]) == 1.0


def test_sequence_metrics_accept_tensors():
    ref = [torch.tensor([1, 2, 3])]
    assert exact_match_rate(ref, [torch.tensor([1, 2, 3])]) == 1.0
    assert prefix_agreement(ref, [torch.tensor([1, 2, 4])]) == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: exact_match_rate([[1]], [[1], [2]]), "1 items but candidate has 2"),
        (lambda: exact_match_rate([], []), "empty"),
        (lambda: prefix_agreement([[]], [[1]]), "every reference sequence is empty"),
        (lambda: exact_match_rate(["abc"], [[1]]), "reference\\[0\\]"),
        (lambda: exact_match_rate([[1]], [5]), "candidate\\[0\\]"),
    ],
)
def test_sequence_metrics_reject_bad_input(call, match):
    with pytest.raises(HarnessInputError, match=match):
        call()


# ---------------------------------------------------------------------------------------
# Teacher-forced logits
# ---------------------------------------------------------------------------------------

def _logits_of(probs: list[list[float]]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log()


def test_top1_agreement_hand_case():
    ref = torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 2.0], [1.0, 0.0, 0.0]])
    cand = torch.tensor([[3.0, 0.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    # argmax ref 0,2,0 vs cand 0,0,2
    assert top1_matches(ref, cand).tolist() == [True, False, False]
    assert top1_agreement(ref, cand) == pytest.approx(1 / 3)


def test_top1_pools_lists_by_position_not_by_item():
    a = torch.tensor([[1.0, 0.0]])
    b = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    b_flipped = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    # Item 0: 1 of 1 agree; item 1: 2 of 3 -> pooled 3/4 (a mean of item rates would be 5/6).
    assert top1_agreement([a, b], [a, b_flipped]) == pytest.approx(3 / 4)


def test_kl_per_token_hand_case_and_direction():
    p = _logits_of([[0.5, 0.5], [0.5, 0.5]])
    q = _logits_of([[0.75, 0.25], [0.5, 0.5]])
    kl = kl_per_token(p, q)
    # KL(P||Q) = .5 ln(.5/.75) + .5 ln(.5/.25) = .5 ln(4/3); identical rows give 0.
    assert kl.dtype == torch.float64
    assert kl.tolist() == pytest.approx([0.5 * math.log(4 / 3), 0.0], abs=1e-15)
    # KL(Q||P) = .75 ln 1.5 + .25 ln .5: a different number, so the direction is pinned.
    assert kl_per_token(q, p)[0].item() == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5))


def test_kl_handles_masked_tokens():
    certain = torch.tensor([[0.0, -math.inf]])  # P = (1, 0)
    even = torch.tensor([[0.0, 0.0]])           # Q = (.5, .5)
    assert kl_per_token(certain, even).item() == pytest.approx(math.log(2))  # 1 * ln(1/.5)
    assert math.isinf(kl_per_token(even, certain).item())                   # Q puts 0 where P has mass


def test_kl_summary_mean_and_linear_p99():
    # p99 of [1,2,3,4]: position 0.99 * 3 = 2.97 -> 3 + 0.97 * (4 - 3) = 3.97.
    assert kl_summary([1.0, 2.0, 3.0, 4.0]) == pytest.approx({"mean": 2.5, "p99": 3.97})
    kl = torch.tensor([0.5 * math.log(4 / 3), 0.0], dtype=torch.float64)
    assert kl_summary(kl)["mean"] == pytest.approx(0.25 * math.log(4 / 3))


def test_token_nll_and_perplexity_ratio():
    logits = _logits_of([[0.5, 0.5], [0.75, 0.25]])
    nll = token_nll(logits, torch.tensor([1, 0]))
    assert nll.tolist() == pytest.approx([math.log(2), math.log(4 / 3)])
    assert token_nll([logits, logits[:1]], [[1, 0], [0]]).tolist() == pytest.approx(
        [math.log(2), math.log(4 / 3), math.log(2)]
    )
    # exp(mean 2) / exp(mean 1) = e; equal means give exactly 1.
    assert perplexity_ratio([1.0, 1.0], [2.0, 2.0]) == pytest.approx(math.e)
    assert perplexity_ratio([1.0, 3.0], [2.0, 2.0]) == 1.0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: top1_agreement(torch.zeros(2, 3), torch.zeros(2, 4)), "shape"),
        (lambda: top1_agreement(torch.zeros(3), torch.zeros(3)), r"\[tokens, vocab\]"),
        (lambda: kl_per_token(torch.tensor([[0.0, math.nan]]), torch.zeros(1, 2)), "NaN"),
        (lambda: kl_per_token(torch.tensor([[-math.inf, -math.inf]]), torch.zeros(1, 2)), "all -inf"),
        (lambda: top1_agreement([torch.zeros(1, 2)], []), "empty list"),
        (lambda: top1_agreement(torch.zeros(0, 2), torch.zeros(0, 2)), "zero positions"),
        (lambda: token_nll(torch.zeros(2, 3), torch.tensor([0, 3])), "id 3 outside"),
        (lambda: token_nll(torch.zeros(2, 3), torch.tensor([0])), "target_ids"),
        (lambda: kl_summary([]), "empty"),
        (lambda: kl_summary([0.1, math.nan]), r"kl\[1\] is nan"),
        (lambda: perplexity_ratio([1.0], [1.0, 2.0]), "1 items"),
    ],
)
def test_logit_metrics_reject_bad_input(call, match):
    with pytest.raises(HarnessInputError, match=match):
        call()


# ---------------------------------------------------------------------------------------
# SQuAD: hand cases, then agreement with the official script
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "prediction, golds, em, f1",
    [
        ("The France", ["France"], 1.0, 1.0),
        ("U.S.A.", ["USA"], 1.0, 1.0),
        # pred "cat sat" vs gold "cat sat on mat": P = 2/2, R = 2/4 -> F1 = 2/3.
        ("the cat sat", ["a cat sat on the mat"], 0.0, 2 / 3),
        ("Denver Broncos", ["Broncos", "Denver Broncos"], 1.0, 1.0),  # max over golds
        ("Broncos Broncos", ["Broncos"], 0.0, 2 / 3),                 # Counter overlap is 1: P=1/2, R=1
        ("", ["", "the"], 1.0, 1.0),        # every gold normalizes empty -> gold is ""
        ("x", [], 0.0, 0.0),                # no gold -> "" -> a non-empty prediction scores 0
        ("", ["Paris"], 0.0, 0.0),
        ("an apple", ["apple"], 1.0, 1.0),
    ],
)
def test_squad_hand_cases(prediction, golds, em, f1):
    assert squad_em(prediction, golds) == em
    assert squad_f1(prediction, golds) == pytest.approx(f1)


def test_squad_rejects_bare_string_gold():
    with pytest.raises(HarnessInputError, match="gold_answers must be a list"):
        squad_f1("France", "France")
    with pytest.raises(HarnessInputError, match="prediction must be a string"):
        squad_em(None, ["France"])


# Reproduced from the official SQuAD 2.0 evaluation script, evaluate-v2.0.py
# (https://rajpurkar.github.io/SQuAD-explorer/, "Evaluation Script v2.0"): normalize_answer,
# get_tokens, compute_exact, compute_f1, and the gold-answer rule of get_raw_scores.
def _official_normalize_answer(s):
    def remove_articles(text):
        regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
        return re.sub(regex, " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def _official_get_tokens(s):
    if not s:
        return []
    return _official_normalize_answer(s).split()


def _official_compute_exact(a_gold, a_pred):
    return int(_official_normalize_answer(a_gold) == _official_normalize_answer(a_pred))


def _official_compute_f1(a_gold, a_pred):
    gold_toks = _official_get_tokens(a_gold)
    pred_toks = _official_get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        # If either is no-answer, then F1 is 1 if they agree, 0 otherwise
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def _official_scores(gold_texts, a_pred):
    # get_raw_scores: drop golds that normalize empty; an unanswerable question's gold is ''.
    gold_answers = [a for a in gold_texts if _official_normalize_answer(a)]
    if not gold_answers:
        gold_answers = [""]
    exact = max(_official_compute_exact(a, a_pred) for a in gold_answers)
    f1 = max(_official_compute_f1(a, a_pred) for a in gold_answers)
    return exact, f1


# Pieces that exercise every step: articles in all cases and glued to punctuation, ASCII
# punctuation, non-ASCII punctuation (kept by the official script), unicode white space,
# letters whose lower-casing changes length (İ), CJK, digits.
_PIECES = st.sampled_from([
    "a", "an", "the", "The", "AN", "A", "thé", "another", " ", "  ", "\t", "\n", "\u00a0", "\u3000",
    "\u2003", ".", ",", "'", "-", "!", "?", "(", ")", "$", "%", "'s", "an.", "the-", "«", "»", "—",
    "théâtre", "İstanbul", "ß", "Ω", "日本", "français", "1", "42", "cat", "Cat", "dog", "x",
])
_TEXT = st.one_of(
    st.text(max_size=25),
    st.lists(st.one_of(_PIECES, st.text(max_size=3)), max_size=12).map("".join),
)


@settings(max_examples=250, deadline=None)
@given(prediction=_TEXT, golds=st.lists(_TEXT, max_size=4))
def test_squad_matches_official_script(prediction, golds):
    exact, f1 = _official_scores(golds, prediction)
    assert normalize_answer(prediction) == _official_normalize_answer(prediction)
    assert abs(squad_em(prediction, golds) - exact) <= 1e-9
    assert abs(squad_f1(prediction, golds) - f1) <= 1e-9


# ---------------------------------------------------------------------------------------
# Structured extraction
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"a": 1, "b": "x"}', {"a": 1, "b": "x"}),
        ('Sure! ```json\n{"a": 1}\n```', {"a": 1}),
        ("{'a': 'it''s', 'b': 2,}", None),            # broken quoting does not parse
        ("{'a': 'x', 'b': [1, 2,],}", {"a": "x", "b": [1, 2]}),
        ("{'ok': True, 'bad': False, 'none': None}", {"ok": True, "bad": False, "none": None}),
        ("{revenue: 12.3}", {"revenue": 12.3}),
        ('Here: {"outer": {"inner": 1}} and {"second": 2}', {"outer": {"inner": 1}}),
        ('{"note": "a } inside", "n": 1}', {"note": "a } inside", "n": 1}),
        ('Use {curly} then {"a": 5}', {"a": 5}),   # the first balanced object fails, the next parses
        ('{"a": 1', {"a": 1}),                      # unbalanced: the pairs are recovered
        ('{\n  "g": "7.0%",\n  "m": 5.9,\n  "r": "12.9%\n}', {"g": "7.0%", "m": 5.9, "r": "12.9%"}),  # string left open
        ("{'a': 1", None),                          # single-quoted keys are not guessed at
        ("no json here", None),
        ('{"vendor": "O\'Brien Ltd."}', {"vendor": "O'Brien Ltd."}),
    ],
)
def test_parse_json_answer(text, expected):
    assert parse_json_answer(text) == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        ("12.3%", 12.3), ("-3.2 %", -3.2), ("$2.45B", 2_450_000_000.0), ("892M", 892_000_000.0),
        ("$892 million", 892_000_000.0), ("1,234", 1234.0), ("USD 12,480.50", 12480.5),
        ("€12.5K", 12500.0), ("24 months", 24.0), ("1,250.5 kg", 1250.5), (7, 7.0), (2.5, 2.5),
        ("March 5, 2026", "2026-03-05"), ("5 March 2026", "2026-03-05"), ("Mar. 5th, 2026", "2026-03-05"),
        ("2026-03-05", "2026-03-05"), ("February 30, 2026", "february 30 2026"),
        ("The Acme Corp.", "acme corp"), (None, None), (True, True), ("1,23", "123"),
    ],
)
def test_normalize_field_value(value, expected):
    assert normalize_field_value(value) == expected


GOLD = {"revenue_growth_qoq": 12.3, "vendor": "Acme Corp.", "due_date": "2026-03-05"}


def test_field_prf_counts():
    # growth and vendor right (key spelled differently), due_date missing, one extra key.
    pred = {"revenue growth QoQ": "12.3%", "Vendor": "acme corp", "tax": 5}
    assert field_prf(pred, GOLD) == FieldCounts(tp=2, fp=1, fn=1)
    # A wrong value is one fp and one fn.
    assert field_prf({**pred, "due_date": "March 6, 2026"}, GOLD) == FieldCounts(tp=2, fp=2, fn=1)
    assert field_prf({**pred, "due_date": "March 5, 2026"}, GOLD) == FieldCounts(tp=3, fp=1, fn=0)
    # Nothing parsed, or a null value: not predicted, so only fn.
    assert field_prf(None, GOLD) == FieldCounts(0, 0, 3)
    assert field_prf({"vendor": None}, GOLD) == FieldCounts(0, 0, 3)


@pytest.mark.parametrize(
    "pred, gold, equal",
    [
        (12.34, 12.3, True),    # rounds to the gold's 1 decimal
        (12.36, 12.3, False),
        (12.25, 12.3, True),    # half-up
        (71.6, 72.0, False),    # 72.0 keeps one decimal
        (72, 72.0, True),
        ("24 months", 24, True),
        (24.4, 24, True),       # an int gold has 0 decimals
        ("$2.45B", 2_450_000_000.0, True),
        ("2.45", 2_450_000_000.0, False),
        ("12.3", "12.3%", True),
        ("12.3", "twelve", False),
        (math.nan, 1.0, False),
    ],
)
def test_field_number_equality(pred, gold, equal):
    counts = field_prf({"k": pred}, {"k": gold})
    assert (counts.tp == 1) is equal


def test_prf_is_micro_averaged_and_doc_f1():
    # tp 2, fp 1, fn 4: P = 2/3, R = 2/6, F1 = 2 (2/3)(1/3) / (2/3 + 1/3) = 4/9.
    result = prf([FieldCounts(2, 1, 1), FieldCounts(0, 0, 3)])
    assert result == pytest.approx({"precision": 2 / 3, "recall": 1 / 3, "f1": 4 / 9})
    assert prf([FieldCounts(0, 2, 1)]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    # doc: tp 2, fp 1, fn 1 -> P = R = 2/3 -> F1 = 2/3.
    assert doc_field_f1({"revenue_growth_qoq": 12.3, "vendor": "Acme Corp", "x": 1}, GOLD) == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: field_prf({}, {}), "non-empty dict"),
        (lambda: field_prf([1], {"a": 1}), "dict or None"),
        (lambda: field_prf({}, {"a": math.inf}), "'a' is inf"),
        (lambda: prf([]), "no fields"),
        (lambda: prf([FieldCounts(-1, 0, 0)]), "non-negative"),
        (lambda: parse_json_answer(None), "expects a string"),
    ],
)
def test_extraction_rejects_bad_input(call, match):
    with pytest.raises(HarnessInputError, match=match):
        call()


# ---------------------------------------------------------------------------------------
# Confidence intervals
# ---------------------------------------------------------------------------------------

def test_bootstrap_mean_ci_is_deterministic_and_sane():
    values = [0.0, 1.0] * 50
    mean, lo, hi = bootstrap_mean_ci(values)
    assert mean == 0.5
    # Normal approximation: 0.5 +- 1.96 * sqrt(.25 / 100) = 0.5 +- 0.098.
    assert 0.38 < lo < 0.45 and 0.55 < hi < 0.62
    spread = np.linspace(0.0, 1.0, 37).tolist()
    assert bootstrap_mean_ci(spread) == bootstrap_mean_ci(spread)
    assert bootstrap_mean_ci(spread, seed=1) != bootstrap_mean_ci(spread)
    assert bootstrap_mean_ci([3.0, 3.0, 3.0]) == (3.0, 3.0, 3.0)


def test_bootstrap_paired_diff_uses_the_pairing():
    rng = np.random.default_rng(7)
    reference = rng.normal(0, 10, size=60)          # large spread between items
    candidate = reference + 0.5 + rng.normal(0, 0.1, size=60)
    diff, lo, hi = bootstrap_paired_diff_ci(candidate, reference)
    # Paired, the item spread cancels: a narrow interval around +0.5 that excludes 0.
    assert diff == pytest.approx(np.mean(candidate - reference))
    assert 0.4 < lo < diff < hi < 0.6
    # Identical sides give exactly zero, as the pruning-off gate requires.
    assert bootstrap_paired_diff_ci([0.2, 0.9, 1.0], [0.2, 0.9, 1.0]) == (0.0, 0.0, 0.0)


def test_wilson_interval_against_published_values():
    # 5/10 at 95%: centre .5, half-width 1.96 sqrt(.025 + .0096) / 1.384 = 0.2634.
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    # 0/10: (0, 0.2775) with an exact 0 lower bound.
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(10, 10)[1] == 1.0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: bootstrap_mean_ci([]), "empty"),
        (lambda: bootstrap_mean_ci([1.0, math.inf]), r"values\[1\] is inf"),
        (lambda: bootstrap_mean_ci([1.0], alpha=1.5), "alpha"),
        (lambda: bootstrap_mean_ci([1.0], n_resamples=0), "n_resamples"),
        (lambda: bootstrap_paired_diff_ci([1.0], [1.0, 2.0]), "1 items"),
        (lambda: wilson_interval(1, 0), "n must be positive"),
        (lambda: wilson_interval(11, 10), "successes"),
        (lambda: wilson_interval(1.5, 10), "integer"),
    ],
)
def test_intervals_reject_bad_input(call, match):
    with pytest.raises(HarnessInputError, match=match):
        call()


# ---------------------------------------------------------------------------------------
# Speed and compute
# ---------------------------------------------------------------------------------------

def test_percentile_linear():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)  # position 2.7


def test_speed_summary_hand_case():
    summary = speed_summary([0.1, 0.2, 0.3], [0.02, 0.04])
    # ttft p90: position 1.8 -> 0.2 + 0.8 * 0.1 = 0.28 s; tpot p90: 0.02 + 0.9 * 0.02 = 0.038 s.
    assert summary == pytest.approx({
        "ttft_ms_p50": 200.0, "ttft_ms_p90": 280.0, "tpot_ms_p50": 30.0, "tpot_ms_p90": 38.0,
        "decode_tokens_per_s": 1 / 0.03,
    })


def test_achieved_bandwidth():
    # 538 MB per token at 26 tokens/s = 13.988 GB/s.
    assert achieved_bandwidth_gbs(538e6, 26.0) == pytest.approx(13.988)


def test_interleaved_speedup_is_median_of_pair_ratios():
    # Ratios 2, 2, 0.5 -> median 2 (the ratio of means, 60 / 75 = 0.8, is not what we report).
    result = interleaved_speedup([10.0, 20.0, 30.0], [5.0, 10.0, 60.0])
    assert result["ratio"] == 2.0
    assert result["lo"] <= result["ratio"] <= result["hi"]
    assert interleaved_speedup([2.0] * 4, [1.0] * 4) == {"ratio": 2.0, "lo": 2.0, "hi": 2.0}


def test_bypass_ratio():
    assert bypass_ratio(30, 30, 10) == pytest.approx(0.1)
    assert bypass_ratio(0, 30, 0) == 0.0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: percentile([1.0], 101), "q must be"),
        (lambda: speed_summary([], [0.1]), "ttft_s is empty"),
        (lambda: speed_summary([0.1], [0.0]), "tpot_s must be positive"),
        (lambda: achieved_bandwidth_gbs(-1.0, 2.0), "bytes_per_token"),
        (lambda: interleaved_speedup([1.0, 2.0], [1.0]), "2 items"),
        (lambda: interleaved_speedup([1.0], [0.0]), "candidate_samples must be positive"),
        (lambda: bypass_ratio(31, 30, 1), "exceeds"),
        (lambda: bypass_ratio(0, 0, 1), "blocks must be positive"),
        (lambda: bypass_ratio(-1, 30, 1), "layers_bypassed"),
    ],
)
def test_speed_and_compute_reject_bad_input(call, match):
    with pytest.raises(HarnessInputError, match=match):
        call()


def test_permutation_mean_greater_p_tells_a_real_difference_from_noise() -> None:
    from rsp_bench.metrics import permutation_mean_greater_p as perm_p

    rng = np.random.default_rng(0)
    ref = rng.gamma(2.0, 0.16, 40)  # like English's per-prompt KLs, mean about 0.33
    assert perm_p(ref[:8] * 2.5, ref) < 0.05  # two and a half times the reference, 8 values
    assert perm_p(rng.gamma(2.0, 0.16, 8), ref) > 0.05  # the same distribution
    assert perm_p([0.9], [0.01] * 4) == pytest.approx(0.2, abs=0.02)  # 1 value of 5: never below 1/5
    assert perm_p([0.9], [0.01] * 4, permutations=300_000) == pytest.approx(0.2, abs=0.01)  # in chunks
    for bad, match in (([], "candidate"), ([float("nan")], "candidate"), ("abc", "candidate")):
        with pytest.raises(HarnessInputError, match=match):
            perm_p(bad, ref)
    with pytest.raises(HarnessInputError, match="permutations"):
        perm_p([1.0], ref, permutations=0)
