"""Equivalence suite: the same prompts through the unpruned model and every configuration,
compared token by token (exact match, prefix agreement) and by teacher-forced distributions
(top-1 agreement, KL, perplexity ratio), plus the static baselines at the dynamic run's
executed budget (interpolated between whole blocks, not rounded) and the plain Hugging Face peer.

Sizes: quick (--rsp-quick) 8 prompts x 24 new tokens; full 48 prompts x 64 new tokens
(--rsp-max-new-tokens overrides the token count). Every figure goes to the run record;
assertions: pruning off and lossless reproduce the unpruned output exactly, the HF peer
equals reference/off at batch 1, each pruned configuration stays within suites/budgets.toml.

Must NOT compute a figure itself (rsp_bench.quality / rsp_bench.metrics do) or import the
reference engine (the plugin's fixtures hand it over).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest

from rsp_bench import datasets as ds
from rsp_bench.engines import ConfigSpec, format_config_id
from rsp_bench.plugin import get_options
from rsp_bench.budgets import budget_for, check_budget, load_budgets
from rsp_bench.quality import equivalence_metrics, interpolated_metrics, record_metrics

pytestmark = [pytest.mark.equivalence, pytest.mark.usefixtures("rsp_prefill_once")]

BUDGETS = Path(__file__).with_name("budgets.toml")
# Quick sizes keep `pytest suites --rsp-quick` under 10 minutes on a 2-core CPU whose
# decode is DRAM-bound (about 11 tokens/s on a slow day): six configurations run here.
QUICK_PROMPTS, QUICK_NEW_TOKENS = 8, 24
FULL_PROMPTS, FULL_NEW_TOKENS = 48, 64
STATIC_KINDS = ("shortgpt", "random")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # One static row per kind and per lossy row of this session: the reference engine's lossy
    # rows are the default (unit) router and the block router beside it (plan_configs).
    if "static_case" in metafunc.fixturenames:
        options = get_options(metafunc.config)
        sens = options.sensitivities if "lossy" in options.modes else ()
        routers = (None, "block") if options.engine == "reference" else (None,)
        cases = [(kind, s, r) for s in sens for r in routers for kind in STATIC_KINDS]
        metafunc.parametrize("static_case", cases,
                             ids=[f"{k}-matched-s={s:.2f}" + (f"-{r}" if r else "") for k, s, r in cases])


@pytest.fixture(scope="module")
def budgets() -> dict:
    return load_budgets(BUDGETS)


@pytest.fixture(scope="module")
def eq_max_new(rsp_options) -> int:
    return rsp_options.max_new_tokens or (QUICK_NEW_TOKENS if rsp_options.quick else FULL_NEW_TOKENS)


@pytest.fixture(scope="module")
def eq_prompts(rsp_options) -> list[str]:
    n = QUICK_PROMPTS if rsp_options.quick else FULL_PROMPTS
    return [p.text for p in ds.quick_subset(ds.load_prompts(), n, seed=rsp_options.subset_seed)]


@pytest.fixture(scope="module")
def eq_reference(rsp_reference_outputs, eq_prompts, eq_max_new):
    return rsp_reference_outputs.get("equivalence", eq_prompts, eq_max_new, with_logits=True)


class Measurer:
    """Measures a configuration once (recording its figures) and reuses the result, so a
    static row can ask for the lossy run it is matched to without running it twice."""

    def __init__(self, adapter_for, record, prompts, reference, max_new_tokens) -> None:
        self.adapter_for, self.record = adapter_for, record
        self.prompts, self.reference, self.max_new_tokens = prompts, reference, max_new_tokens
        self.done: dict[str, dict] = {}

    def __call__(self, spec: ConfigSpec, adapter=None) -> dict:
        if spec.config_id not in self.done:
            values = equivalence_metrics(adapter or self.adapter_for(spec), spec, self.prompts,
                                         self.reference, self.max_new_tokens)
            record_metrics(self.record, spec, values)
            self.done[spec.config_id] = values
        return self.done[spec.config_id]


@pytest.fixture(scope="module")
def measure(rsp_adapter_for, rsp_record, eq_prompts, eq_reference, eq_max_new) -> Measurer:
    return Measurer(rsp_adapter_for, rsp_record, eq_prompts, eq_reference, eq_max_new)


def test_equivalence(rsp_config, measure, budgets) -> None:
    values = measure(rsp_config)
    if rsp_config.mode == "off":
        assert values["exact_match_rate"].value == 1.0, f"{rsp_config.config_id}: pruning off changed the output"
        assert values["top1_agreement"].value == 1.0, f"{rsp_config.config_id}: pruning off changed the logits"
    if rsp_config.mode == "lossless":
        assert values["exact_match_rate"].value == 1.0, f"{rsp_config.config_id}: lossless output differs from unpruned"
    bounds = budget_for(budgets, rsp_config)
    if bounds is None:
        warnings.warn(f"{rsp_config.config_id}: no budget in {BUDGETS.name}; figures recorded, not judged")
        return
    measured = EQUIVALENCE_RECORDED if rsp_config.engine == "reference" else None
    failures = check_budget(values, bounds, measured=measured)
    assert not failures, f"{rsp_config.config_id} is over its quality budget:\n  " + "\n  ".join(failures)


# What this suite always records for a reference row: a bound on one of these that the row
# lacks fails instead of being skipped.
EQUIVALENCE_RECORDED = ("exact_match_rate", "prefix_agreement", "top1_agreement", "kl_mean", "kl_p99",
                        "perplexity_ratio")


def test_hf_peer_matches_reference_off(rsp_peer, measure) -> None:
    """Plain transformers greedy generate on the same weights, batch 1: the engine with
    pruning off must produce exactly its tokens (the reference run is reference/off)."""
    spec = ConfigSpec("hf-generate/off", "hf-generate", "off", None, {"batch_size": 1})
    values = measure(spec, rsp_peer)
    assert values["exact_match_rate"].value == 1.0, (
        f"hf-generate/off and reference/off disagree on {1 - values['exact_match_rate'].value:.0%} of prompts")


def test_static_baseline_at_matched_budget(static_case, rsp_options, rsp_configs, rsp_engine,
                                           rsp_adapter_for, rsp_record, measure) -> None:
    """ShortGPT and random static removal at the lossy run's executed budget, matched on weight
    bytes without rounding (every block holds the same bytes, so the bypass ratio is the byte
    budget here). Static removal is measured at the two whole-block budgets k and k + 1 whose
    measured bypass ratios bracket the lossy run's (0 blocks is reference/off) and recorded at the
    lossy ratio itself, interpolated linearly in measured ratio, as ``static-<kind>/k=<b>`` with
    b = k + t; the whole-block rows are recorded too."""
    kind, s, router = static_case
    lossy_id = format_config_id(rsp_options.engine, "lossy", s, **({"router": router} if router else {}))
    lossy = next((c for c in rsp_configs if c.config_id == lossy_id), None)
    if lossy is None:
        pytest.skip(f"{lossy_id} is not run in this session (rsp_configs left it out)")
    lossy_values = measure(lossy)
    if "bypass_ratio" not in lossy_values:
        pytest.skip(f"{lossy_id} reports no bypass statistics; no budget to match")
    r = lossy_values["bypass_ratio"].value
    if r == 0:
        pytest.skip(f"{lossy_id} bypassed nothing: a static row would be reference/off")
    adapter = rsp_adapter_for(f"static-{kind}")
    off = next(c for c in rsp_configs if c.config_id == format_config_id("reference", "off"))

    def at(k: int) -> dict:
        if k == 0:
            return measure(off)
        values = measure(adapter.spec_for(k, matched_to=lossy_id), adapter)
        assert values["bypass_ratio"].value > 0, f"static-{kind}/k={k} bypassed nothing: static mode ignored its blocks"
        return values

    # The first decoded token comes from prefill, so k blocks bypassed per step measure slightly
    # under k / L as a ratio: bracket by the measured ratios, not by k.
    k = int(math.floor(r * rsp_engine.dims.n_layers))
    low, high = at(k), at(k + 1)
    while high["bypass_ratio"].value < r:
        k += 1
        low, high = high, at(k + 1)
    r0, r1 = low.get("bypass_ratio"), high["bypass_ratio"].value
    r0 = r0.value if r0 is not None else 0.0
    t = min(max((r - r0) / (r1 - r0), 0.0), 1.0)
    spec = ConfigSpec(format_config_id(adapter.name, k=f"{k + t:.2f}"), adapter.name, "static", None,
                      {"k_interpolated": k + t, "between": [k, k + 1], "t": t, "matched_to": lossy_id})
    if spec.config_id in rsp_record.record["configurations"]:
        pytest.skip(f"{spec.config_id} already recorded for another sensitivity at the same budget")
    record_metrics(rsp_record, spec, interpolated_metrics(low, high, t))
