"""Equivalence metrics: how closely the pruned (candidate) output follows the unpruned one.

Token sequences: exact-sequence match, first divergence, prefix agreement. Teacher-forced
logits: top-1 agreement, KL(unpruned || pruned) per token, per-token NLL, perplexity ratio.

Must NOT import transformers, the reference engine, the other metric modules (except the
shared ``rsp_bench.metrics._checks``) or any rsp_bench module other than rsp_bench.errors.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics._checks import _finite_array, _same_length

__all__ = [
    "exact_match_rate", "first_divergence", "prefix_agreement",
    "top1_matches", "top1_agreement", "kl_per_token", "kl_summary",
    "token_nll", "perplexity_ratio",
]


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
