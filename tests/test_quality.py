"""Tests of rsp_bench.quality with fake adapters (no model): the figures the runner reports for
known outputs, its input checks, the lenient short-answer reading, and the strict budget loader.

Must not load a model; the fakes return canned outputs and logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rsp_bench import metrics as m
from rsp_bench.datasets import SquadItem, StructuredDoc
from rsp_bench.engines import ConfigSpec, Output
from rsp_bench.errors import HarnessInputError
from rsp_bench.budgets import budget_for, check_budget, load_budgets
from rsp_bench.quality import MetricValue, equivalence_metrics, extraction_metrics, short_answer

REPO = Path(__file__).resolve().parents[1]
SPEC = ConfigSpec("fake/lossy/s=0.50", "fake", "lossy", 0.5)
V = 5


def _logits(tokens: list[int], confidence: float = 4.0) -> torch.Tensor:
    out = torch.zeros(len(tokens), V)
    out[torch.arange(len(tokens)), torch.tensor(tokens)] = confidence
    return out


class Fake:
    """Answers from a table; teacher forcing returns the logits it is told to."""

    name, modes, batch_size = "fake", ("off", "lossy"), 2

    def __init__(self, answers: dict[str, list[int] | str], tf: dict[tuple, torch.Tensor] | None = None,
                 bypassed: int = 0) -> None:
        self.answers, self.tf, self.bypassed = answers, tf or {}, bypassed
        self.calls: list[int] = []

    def generate(self, prompts, max_new_tokens, spec):
        self.calls.append(len(prompts))
        outs = []
        for p in prompts:
            a = self.answers[p]
            ids = a if isinstance(a, list) else [1, 2]
            outs.append(Output(a if isinstance(a, str) else p, ids, [0], {
                "layers_bypassed": self.bypassed, "total_tokens": len(ids), "blocks": 4}))
        return outs

    def teacher_forced_logits(self, prompt_ids, continuation_ids, spec):
        return self.tf[tuple(continuation_ids)], {}


def _reference(prompts: list[str], seqs: list[list[int]]) -> list[Output]:
    return [Output(p, s, [0], {}, logits=_logits(s)) for p, s in zip(prompts, seqs)]


def test_equivalence_metrics_on_known_outputs() -> None:
    prompts = ["a", "b", "c"]
    ref_seqs = [[1, 2, 3, 4], [2, 2], [3, 1, 1]]
    reference = _reference(prompts, ref_seqs)
    cand_logits = {(1, 2, 3, 4): _logits([1, 2, 0, 4]), (2, 2): _logits([2, 2]), (3, 1, 1): _logits([3, 1, 1])}
    fake = Fake({"a": [1, 2, 0, 0], "b": [2, 2], "c": [3, 1, 1]}, cand_logits, bypassed=2)
    values = equivalence_metrics(fake, SPEC, prompts, reference, 4)
    assert fake.calls == [2, 1]  # chunks of batch_size
    assert values["exact_match_rate"].value == pytest.approx(2 / 3) and values["exact_match_rate"].n == 3
    assert values["exact_match_rate"].ci == pytest.approx(m.wilson_interval(2, 3))
    assert values["prefix_agreement"].value == pytest.approx((2 + 2 + 3) / 9)
    assert values["top1_agreement"].value == pytest.approx(8 / 9) and values["top1_agreement"].n == 9
    lo, hi = values["top1_agreement"].ci
    assert lo <= 8 / 9 <= hi <= 1.0
    ref_l, cand_l = [r.logits for r in reference], [cand_logits[tuple(s)] for s in ref_seqs]
    kl = m.kl_summary(m.kl_per_token(ref_l, cand_l))
    assert values["kl_mean"].value == pytest.approx(kl["mean"]) and values["kl_mean"].unit == "nats"
    assert values["kl_p99"].value == pytest.approx(kl["p99"]) and values["kl_p99"].ci is None
    assert values["perplexity_ratio"].value > 1.0
    # 2 bypassed per prompt, 4 blocks, 4 + 2 + 3 tokens
    assert values["bypass_ratio"].value == pytest.approx(6 / (4 * 9))
    assert values["blocks_executed_per_token"].value == pytest.approx(4 * (1 - 6 / 36))


def test_equivalence_metrics_checks_its_inputs() -> None:
    fake = Fake({"a": [1]})
    no_logits = [Output("a", [1], [0], {})]
    with pytest.raises(HarnessInputError, match="no logits"):
        equivalence_metrics(fake, SPEC, ["a"], no_logits, 4)
    with pytest.raises(HarnessInputError, match="2 reference outputs for 1 prompts"):
        equivalence_metrics(fake, SPEC, ["a"], _reference(["a", "b"], [[1], [2]]), 4)


def test_short_answer_is_lenient() -> None:
    assert short_answer("\n  Answer: \"Rollo\"\nbecause...") == "Rollo"
    assert short_answer("**the Normans**") == "the Normans"
    assert short_answer("") == ""


def test_extraction_metrics_scores_and_deltas() -> None:
    items = [SquadItem("q1", "t", "ctx", "Who?", ["Rollo"]), SquadItem("q2", "t", "ctx", "When?", ["10th century"])]
    docs = [StructuredDoc("d1", "invoice", "text", {"total_amount": 120.5, "due_date": "2024-03-01"})]
    from rsp_bench.quality import extraction_prompts

    sq_prompts, js_prompts = extraction_prompts(items, docs)
    pruned = Fake({sq_prompts[0]: "Answer: Rollo", sq_prompts[1]: "the 9th century",
                   js_prompts[0]: 'Sure: {"total_amount": "$120.50", "due_date": "March 2, 2024"}'})
    reference = {"squad": [Output("Rollo", [1], [0], {}), Output("10th century", [1], [0], {})],
                 "json": [Output('{"total_amount": 120.5, "due_date": "2024-03-01"}', [1], [0], {})]}
    values = extraction_metrics(pruned, SPEC, items, docs, reference, (16, 64))
    assert values["squad_em"].value == 0.5 and values["squad_em"].n == 2
    f1_second = m.squad_f1("the 9th century", ["10th century"])
    assert values["squad_f1"].value == pytest.approx((1 + f1_second) / 2)
    assert values["squad_f1_delta"].value == pytest.approx((1 + f1_second) / 2 - 1)
    assert values["json_field_f1"].value == pytest.approx(0.5)  # amount right, date wrong
    assert values["json_field_f1_delta"].value == pytest.approx(-0.5)
    same = Fake({sq_prompts[0]: "Rollo", sq_prompts[1]: "10th century",
                 js_prompts[0]: reference["json"][0].text})
    values = extraction_metrics(same, SPEC, items, docs, reference, 16)
    assert values["squad_f1_delta"].value == 0.0 and values["json_field_f1_delta"].value == 0.0
    assert values["squad_f1_delta"].ci == (0.0, 0.0)
    with pytest.raises(HarnessInputError, match="'json'"):
        extraction_metrics(same, SPEC, items, docs, {"squad": reference["squad"]}, 16)
    with pytest.raises(HarnessInputError, match="got 0"):
        extraction_metrics(same, SPEC, items, docs, None, 0)


def test_extraction_metrics_scores_given_answers_without_generating() -> None:
    items = [SquadItem("q1", "t", "ctx", "Who?", ["Rollo"])]
    docs = [StructuredDoc("d1", "invoice", "text", {"total_amount": 120.5})]
    reference = {"squad": [Output("Rollo", [1], [0], {})], "json": [Output('{"total_amount": 1}', [1], [0], {})]}
    engine = Fake({})  # any generate call would raise KeyError
    values = extraction_metrics(engine, SPEC, items, docs, reference, 16, answers=reference)
    assert engine.calls == []
    assert values["squad_f1"].value == 1.0 and values["json_field_f1"].value == 0.0
    assert values["squad_f1_delta"].value == 0.0 == values["json_field_f1_delta"].value
    with pytest.raises(HarnessInputError, match="'json'"):
        extraction_metrics(engine, SPEC, items, docs, reference, 16, answers={"squad": reference["squad"]})


def test_reference_outputs_know_their_own_configuration() -> None:
    from rsp_bench.quality import ReferenceOutputs

    refs = ReferenceOutputs(Fake({}), ConfigSpec("reference/off", "reference", "off", None))
    assert refs.is_reference(ConfigSpec("reference/off", "reference", "off", None))
    assert not refs.is_reference(ConfigSpec("reference/lossy/s=0.50", "reference", "lossy", 0.5))
    assert not refs.is_reference(ConfigSpec("mine/off", "mine", "off", None))
    assert not refs.is_reference(ConfigSpec("reference/off", "reference", "off", None, {"batch_size": 4}))


def test_repository_budgets_load_and_apply() -> None:
    budgets = load_budgets(REPO / "suites" / "budgets.toml")
    off = budget_for(budgets, ConfigSpec("reference/off", "reference", "off", None))
    assert {b.describe().split(" (")[0] for b in off} >= {"exact_match_rate >= 1", "roofline_fraction >= 0.45"}
    # reference/off records no deltas (it is the anchor): no delta bound may sit in [off]
    assert not [b for b in off if b.metric.endswith("_delta")]
    assert budget_for(budgets, ConfigSpec("reference/lossless/s=0.50", "reference", "lossless", 0.5))
    assert budget_for(budgets, ConfigSpec("reference/lossy/s=0.50", "reference", "lossy", 0.5))
    # a sensitivity without its own table gets the bounds of every lossy row (the speed floor) only
    odd = budget_for(budgets, ConfigSpec("reference/lossy/s=0.37", "reference", "lossy", 0.37))
    assert [b.metric for b in odd] == ["speedup_over_ideal"]
    assert budget_for(budgets, ConfigSpec("x/weird", "x", "weird", None)) is None


def test_budget_checks_name_metric_and_bound(tmp_path) -> None:
    path = tmp_path / "b.toml"
    path.write_text('[lossy]\nkl_mean_max = 0.5\n[lossy."0.50"]\ntop1_agreement_min = 0.8\n')
    budgets = load_budgets(path)
    bounds = budget_for(budgets, ConfigSpec("r/lossy/s=0.50", "r", "lossy", 0.5))
    values = {"top1_agreement": MetricValue(0.75, 100, (0.7, 0.8), "fraction"),
              "kl_mean": MetricValue(0.1, 100, None, "nats")}
    [failure] = check_budget(values, bounds)
    assert "top1_agreement = 0.75" in failure and ">= 0.8" in failure and "[lossy.\"0.50\"]" in failure
    other = budget_for(budgets, ConfigSpec("r/lossy/s=1.00", "r", "lossy", 1.0))
    assert [b.metric for b in other] == ["kl_mean"]  # mode-wide bounds hold for every sensitivity


@pytest.mark.parametrize("text, named", [
    ("[lossy]\ntop1_agreemnt_min = 0.8\n", "'top1_agreemnt_min'"),
    ("[lossy]\ntop1_agreement = 0.8\n", "'top1_agreement'"),
    ("[lossy]\ntop1_agreement_min = \"high\"\n", "'high'"),
    ("[lossy.\"fast\"]\ntop1_agreement_min = 0.8\n", "'fast'"),
    ("[lossy.\"1.5\"]\ntop1_agreement_min = 0.8\n", "'1.5'"),
    ("lossy = 3\n", "'lossy'"),
    ("[lossy\n", "cannot read"),
])
def test_budget_loader_is_strict(tmp_path, text, named) -> None:
    path = tmp_path / "b.toml"
    path.write_text(text)
    with pytest.raises(HarnessInputError, match=named.replace("[", "\\[").replace(".", "\\.")):
        load_budgets(path)


def test_missing_budget_file_is_named(tmp_path) -> None:
    with pytest.raises(HarnessInputError, match="nope.toml"):
        load_budgets(tmp_path / "nope.toml")


def test_record_metrics_states_config_and_refuses_a_second_figure_of_a_name() -> None:
    from rsp_bench.quality import record_metrics
    from rsp_bench.records import RunRecordBuilder

    builder = RunRecordBuilder(model_name="tiny", commit=None, versions_info={"python": "3", "torch": None,
                               "transformers": None, "rsp_bench": "0"},
                               machine={"fingerprint": "f", "hostname": "h", "platform": "p", "cpu": "c",
                                        "cores": 1, "memory_gb": 1.0, "gpu": None})
    spec = ConfigSpec("static-shortgpt/k=3", "static-shortgpt", "static", None, {"k": 3, "blocks": [4, 5, 6]})
    # the throughput suite's figure on its own prompts (batch 4) has a name of its own: both are kept
    builder.add_metric(spec.config_id, "bypass_ratio_b4", 0.2, n=10, unit="fraction", mode="static")
    record_metrics(builder, spec, {"bypass_ratio": MetricValue(0.1, 5, None, "fraction"),
                                   "top1_agreement": MetricValue(0.7, 50, (0.6, 0.8), "fraction")})
    config = builder.build()["configurations"][spec.config_id]
    assert config["mode"] == "static" and config["params"]["blocks"] == [4, 5, 6]
    assert config["metrics"]["bypass_ratio"]["value"] == 0.1 and config["metrics"]["bypass_ratio_b4"]["value"] == 0.2
    assert config["metrics"]["top1_agreement"] == {"value": 0.7, "n": 50, "ci": [0.6, 0.8], "unit": "fraction"}
    for name in ("top1_agreement", "bypass_ratio"):  # whichever suite would come second
        with pytest.raises(HarnessInputError, match=name):
            record_metrics(builder, spec, {name: MetricValue(0.7, 50, None, "fraction")})


def test_runner_reuses_generation_logits_only_for_identical_outputs() -> None:
    prompts = ["a", "b"]
    reference = _reference(prompts, [[1, 2], [3, 4]])

    class WithLogits(Fake):
        def generate(self, prompts, max_new_tokens, spec):
            outs = super().generate(prompts, max_new_tokens, spec)
            for o in outs:
                o.logits = _logits(o.token_ids)
            return outs

        def teacher_forced_logits(self, prompt_ids, continuation_ids, spec):
            self.forced.append(tuple(continuation_ids))
            return _logits([0] * len(continuation_ids)), {}

    fake = WithLogits({"a": [1, 2], "b": [3, 0]})
    fake.forced = []
    values = equivalence_metrics(fake, SPEC, prompts, reference, 2)
    assert fake.forced == [(3, 4)]  # "a" matched: its own logits were used, no second decode
    assert values["top1_agreement"].value == pytest.approx(2 / 4)


def _baseline_unpruned() -> dict[str, float]:
    """The unpruned quick-set scores of the committed reference baseline (reference/off)."""
    import json

    [path] = sorted((REPO / "results" / "baselines").glob("SmolLM2-135M-Instruct__*__reference.json"))
    off = json.loads(path.read_text())["configurations"]["reference/off"]["metrics"]
    return {name: off[name]["value"] for name in ("squad_f1", "json_field_f1")}


def _planted(unpruned: dict[str, float], worst: bool) -> dict[str, MetricValue]:
    """Figures of planted outputs, scored by the real scorers: the worst (empty answers,
    broken JSON, logits that never agree) or, for the max side of a delta, perfect answers."""
    from rsp_bench import datasets as ds

    squad = ds.quick_subset(ds.load_squad(), 12)
    docs = ds.quick_subset(ds.load_structured(), 6)
    if worst:
        squad_f1 = sum(m.squad_f1("", it.answers) for it in squad) / len(squad)
        json_f1 = sum(m.doc_field_f1(m.parse_json_answer('{"total": 1,,'), d.fields) for d in docs) / len(docs)
    else:
        squad_f1 = sum(m.squad_f1(it.answers[0], it.answers) for it in squad) / len(squad)
        json_f1 = sum(m.doc_field_f1(dict(d.fields), d.fields) for d in docs) / len(docs)
    ref_tokens = [[1, 2, 3, 4]]
    cand_tokens = [[4, 3, 2, 1]] if worst else ref_tokens
    ref_logits, cand_logits = _logits(ref_tokens[0], 8.0), _logits(cand_tokens[0], 8.0)
    kl = float(m.kl_summary(m.kl_per_token(ref_logits, cand_logits))["mean"])
    f = lambda v, unit="fraction": MetricValue(v, 12, None, unit)  # noqa: E731
    return {
        "exact_match_rate": f(m.exact_match_rate(ref_tokens, cand_tokens)),
        "prefix_agreement": f(m.prefix_agreement(ref_tokens, cand_tokens)),
        "top1_agreement": f(m.top1_agreement(ref_logits, cand_logits)),
        "kl_mean": f(kl, "nats"), "kl_p99": f(kl, "nats"),
        "squad_f1": f(squad_f1), "squad_f1_delta": f(squad_f1 - unpruned["squad_f1"]),
        "json_field_f1": f(json_f1), "json_field_f1_delta": f(json_f1 - unpruned["json_field_f1"]),
        # a planted engine at half its speed: every interval wholly under every portable floor
        "roofline_fraction": MetricValue(0.2, 12, (0.1, 0.3), "fraction"),
        "speedup_vs_hf_generate": MetricValue(0.5, 12, (0.45, 0.55), "x"),
        "speedup_over_ideal": MetricValue(0.5, 12, (0.45, 0.55), "x"),
        "speedup_vs_off": MetricValue(0.5, 12, (0.45, 0.55), "x"),
    }


def test_every_repository_budget_fails_on_planted_worst_case_outputs() -> None:
    unpruned = _baseline_unpruned()
    worst, perfect = _planted(unpruned, worst=True), _planted(unpruned, worst=False)
    assert worst["squad_f1"].value == 0.0 and worst["json_field_f1"].value == 0.0
    assert worst["top1_agreement"].value == 0.0 and worst["kl_mean"].value > 1.0
    budgets = load_budgets(REPO / "suites" / "budgets.toml")
    checked = 0
    for mode, entry in budgets.items():
        for bounds in [entry["all"], *entry["by_sensitivity"].values(), *entry["by_variant"].values()]:
            for b in bounds.values():
                # min bounds must break on the worst output; max bounds on a delta (pruning
                # must not answer *better*) on perfect answers; other max bounds on the worst.
                planted = perfect if (b.kind == "max" and b.metric.endswith("_delta")) else worst
                failures = check_budget(planted, [b])
                assert failures and "cannot fail" not in failures[0], f"{b.describe()} does not fail: {failures}"
                checked += 1
    assert checked >= 36  # 20 for the reference's modes, 16 for the four llama-cpp rungs


def test_quant_budgets_are_named_by_rung_and_refuse_a_bad_name() -> None:
    from rsp_bench.engines import ConfigSpec

    budgets = load_budgets(REPO / "suites" / "budgets.toml")
    q8 = budget_for(budgets, ConfigSpec("llama-cpp/q8_0", "llama-cpp", "quant", None, {"quant": "q8_0"}))
    assert q8 and {b.metric for b in q8} >= {"top1_agreement", "kl_mean"}
    # a rung the file does not name (a deployment's own name, say) has no bounds of its own
    assert budget_for(budgets, ConfigSpec("llama-cpp/prod", "llama-cpp", "quant", None, {"quant": "q8_0"})) is None
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "b.toml"
        path.write_text('[quant."Q8 0"]\ntop1_agreement_min = 0.9\n')
        with pytest.raises(HarnessInputError, match="named by a configuration variant.*'Q8 0'"):
            load_budgets(path)


def test_a_budget_that_cannot_fail_on_the_set_is_refused() -> None:
    # The unpruned JSON F1 is 0.264: a delta bound of -0.45 passes any output at all.
    values = {"json_field_f1": MetricValue(0.0, 6, None, "fraction"),
              "json_field_f1_delta": MetricValue(-0.264, 6, None, "fraction"),
              "top1_agreement": MetricValue(0.9, 100, None, "fraction")}
    loose = [b for b in load_budgets_text("[lossy]\njson_field_f1_delta_min = -0.45\ntop1_agreement_min = 0.0\n")]
    failures = check_budget(values, loose)
    assert len(failures) == 2 and all("cannot fail on this set" in f for f in failures)
    assert "worst possible output scores -0.264" in failures[0]


def load_budgets_text(text: str) -> list:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "b.toml"
        path.write_text(text)
        return list(load_budgets(path)["lossy"]["all"].values())


def test_a_bound_the_row_should_record_but_lacks_fails() -> None:
    from rsp_bench.budgets import Budget

    bound = Budget("squad_f1_delta", "min", 0.0, "test")
    values = {"squad_f1": MetricValue(0.2, 12, None, "fraction")}
    assert check_budget(values, [bound]) == []  # not this suite's metric: skipped
    (failure,) = check_budget(values, [bound], measured=("squad_f1", "squad_f1_delta"))
    assert "was not applied" in failure and "squad_f1_delta" in failure


def test_a_speed_floor_fails_only_on_a_whole_interval_below_it() -> None:
    from rsp_bench.budgets import Budget

    floor = Budget("speedup_over_ideal", "min", 0.9, "test")
    straddles = {"speedup_over_ideal": MetricValue(0.88, 24, (0.85, 0.93), "x")}
    below = {"speedup_over_ideal": MetricValue(0.80, 24, (0.76, 0.84), "x")}
    assert check_budget(straddles, [floor]) == []
    (failure,) = check_budget(below, [floor])
    assert "whole interval" in failure
