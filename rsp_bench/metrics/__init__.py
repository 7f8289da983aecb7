"""Every metric rsp-bench reports, defined once (DESIGN.md section 3).

Suites, the regression gate and the leaderboard never compute a figure by hand: they call
these functions, so a number in a run record means exactly what the docstring there says.
This package only re-exports them; each concept lives in one submodule:

  equivalence   exact-sequence match, prefix agreement, teacher-forced top-1 agreement,
                KL(unpruned || pruned) per token, perplexity ratio
  squad         SQuAD EM / F1 (official v2.0 semantics)
  fields        strict field-level precision / recall / F1 of JSON extraction
  json_answer   lenient JSON parsing of a model's answer
  intervals     percentile bootstrap (mean, paired difference, ratio), Wilson score interval,
                one-sided permutation test of a mean difference
  timing        latency percentiles, decode rate, achieved bandwidth, interleaved speed-up
  compute       bypass ratio, blocks executed per token
  _checks       input checks the submodules share

Conventions: "reference" is always the unpruned side and "candidate" the pruned one; a
difference is candidate minus reference. Every bad input raises HarnessInputError naming
the bad value.

Must NOT import transformers, the reference engine, or any rsp_bench module other than
rsp_bench.errors and its own submodules: metrics are pure functions of plain data. torch
serves only the logits-based metrics.
"""

from __future__ import annotations

from rsp_bench.metrics.compute import blocks_executed_per_token, bypass_ratio
from rsp_bench.metrics.equivalence import (
    exact_match_rate,
    first_divergence,
    kl_per_token,
    kl_summary,
    perplexity_ratio,
    prefix_agreement,
    token_nll,
    top1_agreement,
    top1_matches,
)
from rsp_bench.metrics.fields import FieldCounts, doc_field_f1, field_prf, normalize_field_value, prf
from rsp_bench.metrics.intervals import (
    bootstrap_mean_ci,
    bootstrap_paired_diff_ci,
    bootstrap_ratio_ci,
    permutation_mean_greater_p,
    wilson_interval,
)
from rsp_bench.metrics.json_answer import parse_json_answer
from rsp_bench.metrics.squad import normalize_answer, squad_em, squad_f1
from rsp_bench.metrics.timing import achieved_bandwidth_gbs, interleaved_speedup, percentile, speed_summary

__all__ = [
    "exact_match_rate", "first_divergence", "prefix_agreement",
    "top1_matches", "top1_agreement", "kl_per_token", "kl_summary",
    "token_nll", "perplexity_ratio",
    "normalize_answer", "squad_em", "squad_f1",
    "parse_json_answer", "normalize_field_value", "FieldCounts", "field_prf", "prf",
    "doc_field_f1",
    "bootstrap_mean_ci", "bootstrap_paired_diff_ci", "bootstrap_ratio_ci", "wilson_interval",
    "permutation_mean_greater_p",
    "percentile", "speed_summary", "achieved_bandwidth_gbs", "interleaved_speedup",
    "bypass_ratio", "blocks_executed_per_token",
]
