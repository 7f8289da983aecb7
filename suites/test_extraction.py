"""Extraction suite: SQuAD questions (official EM / F1) and structured JSON extraction
(field-level F1) through the unpruned model and every configuration; the figure that matters
is the pruned-minus-unpruned F1 difference, with a paired bootstrap interval.

Sizes: quick (--rsp-quick) 12 SQuAD questions + 6 documents; full 200 + 120. Answers are
at most 24 new tokens for SQuAD and 64 for JSON (--rsp-max-new-tokens overrides both).
Assertions: pruning off (and lossless) gives an F1 difference of exactly 0; each pruned
configuration stays within suites/budgets.toml.

The reference engine's own ``reference/off`` row is scored on the unpruned reference run
itself (that run is this configuration), so its deltas are 0 by definition and are recorded,
not asserted; that pruning off reproduces itself and equals ``transformers`` generate is the
equivalence suite's check. Any other engine's off row is generated and compared for real.

Must NOT compute a figure itself (rsp_bench.quality / rsp_bench.metrics do) or import the
reference engine (the plugin's fixtures hand it over).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from rsp_bench import datasets as ds
from rsp_bench.budgets import budget_for, check_budget, load_budgets
from rsp_bench.quality import extraction_metrics, extraction_prompts, record_metrics

pytestmark = [pytest.mark.extraction, pytest.mark.usefixtures("rsp_prefill_once")]

BUDGETS = Path(__file__).with_name("budgets.toml")
QUICK_SQUAD, QUICK_DOCS = 12, 6  # JSON answers are 4x longer: see test_equivalence's sizes note
FULL_SQUAD, FULL_DOCS = 200, 120
# A chat model opens with a preamble ("The answer to your question is:"): 16 tokens cut most
# answers off before they began.
SQUAD_NEW_TOKENS, JSON_NEW_TOKENS = 24, 64


@pytest.fixture(scope="module")
def budgets() -> dict:
    return load_budgets(BUDGETS)


@pytest.fixture(scope="module")
def max_new(rsp_options) -> tuple[int, int]:
    if rsp_options.max_new_tokens:
        return rsp_options.max_new_tokens, rsp_options.max_new_tokens
    return SQUAD_NEW_TOKENS, JSON_NEW_TOKENS


@pytest.fixture(scope="module")
def items(rsp_options) -> tuple[list, list]:
    n_squad, n_docs = (QUICK_SQUAD, QUICK_DOCS) if rsp_options.quick else (FULL_SQUAD, FULL_DOCS)
    # Seeded shuffles: the subset spans articles and document kinds, not the head of a file.
    seed = rsp_options.subset_seed
    return ds.quick_subset(ds.load_squad(), n_squad, seed=seed), ds.quick_subset(ds.load_structured(), n_docs, seed=seed)


@pytest.fixture(scope="module")
def reference_answers(rsp_reference_outputs, items, max_new) -> dict:
    squad_prompts, json_prompts = extraction_prompts(*items)
    return {"squad": rsp_reference_outputs.get("extraction-squad", squad_prompts, max_new[0]),
            "json": rsp_reference_outputs.get("extraction-json", json_prompts, max_new[1])}


def test_extraction(rsp_config, rsp_adapter_for, rsp_record, rsp_reference_outputs, items, reference_answers,
                    max_new, budgets) -> None:
    squad_items, docs = items
    is_reference_run = rsp_reference_outputs.is_reference(rsp_config)
    # The reference run is the unpruned model every delta is taken against: it records its
    # absolute scores (the anchor) and no deltas, which would be 0 by definition.
    values = extraction_metrics(rsp_adapter_for(rsp_config), rsp_config, squad_items, docs,
                                None if is_reference_run else reference_answers, max_new,
                                answers=reference_answers if is_reference_run else None)
    record_metrics(rsp_record, rsp_config, values)
    if rsp_config.mode in ("off", "lossless") and not is_reference_run:
        for name in ("squad_f1_delta", "json_field_f1_delta"):
            assert values[name].value == 0.0, (
                f"{rsp_config.config_id}: {name} = {values[name].value:+.4f}; "
                f"{'pruning off' if rsp_config.mode == 'off' else 'lossless mode'} must answer exactly as unpruned")
    bounds = budget_for(budgets, rsp_config)
    if bounds is None:
        warnings.warn(f"{rsp_config.config_id}: no budget in {BUDGETS.name}; figures recorded, not judged")
        return
    # What this suite always records for a reference row: a bound on it that the row lacks fails.
    measured = None
    if rsp_config.engine == "reference":
        measured = ("squad_f1", "json_field_f1") + (() if is_reference_run else ("squad_f1_delta", "json_field_f1_delta"))
    failures = check_budget(values, bounds, measured=measured)
    assert not failures, f"{rsp_config.config_id} is over its quality budget:\n  " + "\n  ".join(failures)
