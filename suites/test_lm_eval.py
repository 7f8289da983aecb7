"""lm-eval suite: the offline tasks of fixtures/lm_eval_tasks run through lm-evaluation-harness
with the ``rsp`` model (rsp_bench/lm_eval_model.py) reusing the session's engine, for pruning
off and lossy s=0.5, and lm-eval's scores checked against the harness's own scorer on the same
outputs.

How the check works: lm-eval's logged generations are checked two ways. (1) Prompts and
plumbing: replayed through ``rsp_bench.quality.extraction_metrics``, they must give lm-eval's
figures (the task scorers call the same ``rsp_bench.metrics``, so this checks that lm-eval sent
the harness's prompts and aggregated the same per-document values, not the scoring itself).
(2) Scoring, independently: SQuAD EM and F1 are recomputed by an implementation of the official
SQuAD v1.1/2.0 evaluation rules written in this file (it shares no code with rsp_bench.metrics),
and must equal lm-eval's; for JSON, a strict reading (``json.loads`` of the first object, exact
field equality) must never score above the lenient field F1 lm-eval reports. With pruning off, lm-eval's generations must
also equal the harness's own generations of the same prompts (ReferenceAdapter, batch 1): the
model's chat template through lm-eval's ``--apply_chat_template`` reaches the same token ids as
``engine.encode(prompt, chat=True)``.

Sizes: quick 2 SQuAD questions + 1 document + the shortest passage per configuration and the 2
questions regenerated (about 250 decode steps and 10 prefills in all); full 32 + 16 + the first
4 passages. Measured on the shared 2-core machine at load 6-7: 4 + 2 + 1 took 5.6 min wall
(183 CPU s), 4 + 4 + a 150-token passage 18 min; an idle machine runs about 10x faster. lm-eval's figures and the pruning stats go to the run record as
``lm_eval_<task>_<metric>`` (reported, not gated).

Must NOT compute a figure itself (rsp_bench.metrics / rsp_bench.quality do) or load the engine
(the plugin's ``rsp_engine`` fixture hands it over).
"""

from __future__ import annotations

import collections
import json
import math
import re
import string
from pathlib import Path

import pytest

from rsp_bench import datasets as ds
from rsp_bench.engines import ConfigSpec, Output, format_config_id, pruning_config
from rsp_bench.quality import extraction_metrics, extraction_prompts

pytestmark = [pytest.mark.lm_eval, pytest.mark.reference_only]

TASKS_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "lm_eval_tasks"
QUICK = {"rsp_squad": 2, "rsp_structured": 1}
QUICK_REGENERATE = 2  # SQuAD questions generated again by the harness in quick mode
FULL = {"rsp_squad": 32, "rsp_structured": 16}
FULL_PASSAGES = 4
# The task YAMLs' limits and stop strings; the harness replays the same outputs.
SQUAD_NEW_TOKENS, JSON_NEW_TOKENS = 16, 64
SQUAD_STOP = "\n\n"
CONFIGS = (("off", None), ("lossy", 0.5))
TOLERANCE = 1e-12


@pytest.fixture(scope="module")
def sizes(rsp_options) -> dict[str, int]:
    return QUICK if rsp_options.quick else FULL


@pytest.fixture(scope="module")
def passages(rsp_options) -> list[int]:
    """Document indices of rsp_perplexity: quick takes the shortest passage (every token of a
    rolling log-likelihood is a decode step), full the first few."""
    if not rsp_options.quick:
        return list(range(FULL_PASSAGES))
    lines = (TASKS_DIR / "rsp_perplexity.jsonl").read_text(encoding="utf-8").splitlines()
    lengths = [len(json.loads(line)["text"]) for line in lines if line.strip()]
    return [min(range(len(lengths)), key=lambda i: (lengths[i], i))]


@pytest.fixture(scope="module")
def lm_eval_runs(rsp_engine, sizes, passages) -> dict[tuple[str, float | None], dict]:
    """One lm-eval evaluation per configuration (module-scoped: every test reads the same run)."""
    lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'rsp-bench[lm-eval]')")
    from lm_eval.tasks import TaskManager

    from rsp_bench.lm_eval_model import RSPLM

    # Only this folder's tasks: indexing lm-eval's built-in task tree costs ~12 CPU seconds.
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    runs = {}
    for mode, s in CONFIGS:
        lm = RSPLM(engine=rsp_engine, mode=mode, sensitivity=0.5 if s is None else s)
        samples = {task: list(range(n)) for task, n in sizes.items()}
        samples["rsp_perplexity"] = passages
        results = lm_eval.simple_evaluate(
            model=lm, tasks=list(samples), task_manager=manager,
            samples=samples,
            apply_chat_template=True, log_samples=True, bootstrap_iters=0, verbosity="WARNING")
        runs[(mode, s)] = {"results": results["results"], "samples": results["samples"],
                           "stats": lm.pruning_stats}
    return runs


def _official_normalize(s: str) -> str:
    """The official SQuAD evaluation script's normalize_answer, written out again here."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _official_scores(prediction: str, golds: list[str]) -> tuple[float, float]:
    """(EM, F1) of one prediction, max over gold answers, as the official script computes them."""
    def f1(gold: str) -> float:
        p, g = _official_normalize(prediction).split(), _official_normalize(gold).split()
        if not p or not g:  # SQuAD 2.0 rule: both empty scores 1, one empty scores 0
            return float(p == g)
        common = sum((collections.Counter(p) & collections.Counter(g)).values())
        if common == 0:
            return 0.0
        precision, recall = common / len(p), common / len(g)
        return 2 * precision * recall / (precision + recall)

    golds = [g for g in golds if _official_normalize(g)] or [""]  # v2.0: unanswerable means gold ""
    em = max(float(_official_normalize(prediction) == _official_normalize(g)) for g in golds)
    return em, max(f1(g) for g in golds)


def _strict_field_f1(text: str, gold: dict) -> float:
    """Field F1 with no leniency: the first {...} must parse as JSON and values must be equal."""
    start, end = text.find("{"), text.rfind("}")
    try:
        predicted = json.loads(text[start:end + 1]) if 0 <= start < end else None
    except json.JSONDecodeError:
        predicted = None
    if not isinstance(predicted, dict) or not gold:
        return 0.0
    hits = sum(1 for k, v in gold.items() if k in predicted and predicted[k] == v)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(predicted), hits / len(gold)
    return 2 * precision * recall / (precision + recall)


def _outputs(run: dict, task: str) -> list[tuple[dict, str]]:
    """(doc, the text lm-eval scored) per document, in document order."""
    rows = sorted(run["samples"][task], key=lambda s: s["doc_id"])
    return [(r["doc"], r["filtered_resps"][0]) for r in rows]


def _spec(mode: str, s: float | None) -> ConfigSpec:
    return ConfigSpec(format_config_id("reference", mode, s), "reference", mode, s, {"via": "lm-eval"},
                      pruning_config(mode, s))


@pytest.mark.parametrize("mode, s", CONFIGS, ids=[format_config_id("reference", m, s) for m, s in CONFIGS])
def test_lm_eval_scores_match_the_harness_scorer(mode, s, lm_eval_runs, sizes, passages, rsp_record) -> None:
    run = lm_eval_runs[(mode, s)]
    squad_items = ds.quick_subset(ds.load_squad(), sizes["rsp_squad"])
    docs = ds.quick_subset(ds.load_structured(), sizes["rsp_structured"])
    squad_out, json_out = _outputs(run, "rsp_squad"), _outputs(run, "rsp_structured")
    # Same documents, same order: the task files are the fixtures in the suites' seeded order.
    assert [d["id"] for d, _ in squad_out] == [it.id for it in squad_items]
    assert [d["id"] for d, _ in json_out] == [d.id for d in docs]
    squad_prompts, json_prompts = extraction_prompts(squad_items, docs)
    assert [d["prompt"] for d, _ in squad_out + json_out] == squad_prompts + json_prompts, (
        "lm-eval did not send the harness's prompts")
    answers = {"squad": [Output(text, [], [], {}) for _, text in squad_out],
               "json": [Output(text, [], [], {}) for _, text in json_out]}
    spec = _spec(mode, s)
    harness = extraction_metrics(None, spec, squad_items, docs, None, (SQUAD_NEW_TOKENS, JSON_NEW_TOKENS),
                                 answers=answers)
    pairs = [("rsp_squad", "squad_em"), ("rsp_squad", "squad_f1"), ("rsp_structured", "json_field_f1")]
    for task, metric in pairs:
        ours, theirs = harness[metric].value, run["results"][task][f"{metric},none"]
        assert abs(ours - theirs) <= TOLERANCE, (
            f"{spec.config_id} {task}: lm-eval {metric} = {theirs!r}, harness scorer on the same outputs = {ours!r}")
        rsp_record.add_metric(spec.config_id, f"lm_eval_{task}_{metric}", theirs, harness[metric].n,
                              ci=harness[metric].ci, unit="fraction", engine=spec.engine, mode=mode, sensitivity=s,
                              params=spec.params)
    # The scoring itself, checked by an implementation that shares no code with lm-eval's scorer.
    # The answer is first cut to its short form (quality.short_answer: the harness's reading of
    # a chat model's preamble, applied by both sides before any scoring).
    from rsp_bench.quality import short_answer

    official = [_official_scores(short_answer(text), doc["answers"]) for doc, text in squad_out]
    for i, metric in enumerate(("squad_em", "squad_f1")):
        mine = sum(o[i] for o in official) / len(official)
        theirs = run["results"]["rsp_squad"][f"{metric},none"]
        assert abs(mine - theirs) <= 1e-9, (
            f"{spec.config_id}: lm-eval {metric} = {theirs!r}, official SQuAD rules give {mine!r}")
    strict = sum(_strict_field_f1(text, json.loads(doc["fields_json"])) for doc, text in json_out) / len(json_out)
    lenient = run["results"]["rsp_structured"]["json_field_f1,none"]
    assert strict <= lenient + 1e-9, f"{spec.config_id}: strict JSON field F1 {strict} above lm-eval's {lenient}"
    ppl = run["results"]["rsp_perplexity"]["word_perplexity,none"]
    assert math.isfinite(ppl) and ppl > 1.0, f"{spec.config_id}: word perplexity {ppl!r}"
    rsp_record.add_metric(spec.config_id, "lm_eval_rsp_perplexity_word_perplexity", ppl, len(passages),
                          unit="perplexity", engine=spec.engine, mode=mode, sensitivity=s, params=spec.params)
    stats = run["stats"]
    if stats["decode_tokens"]:
        rsp_record.add_metric(spec.config_id, "lm_eval_bypass_ratio", stats["bypass_ratio"], stats["decode_tokens"],
                              unit="fraction", engine=spec.engine, mode=mode, sensitivity=s, params=spec.params)
    if mode == "off":
        assert stats["layers_bypassed"] == 0, f"pruning off bypassed {stats['layers_bypassed']} block-steps"


def test_lm_eval_generations_with_pruning_off_equal_the_harness_generations(lm_eval_runs, sizes, rsp_options,
                                                                           rsp_adapter_for) -> None:
    """SQuAD only (short answers keep this cheap; 2 questions in quick mode): the same prompts
    through the harness's own reference adapter, batch 1, give exactly lm-eval's texts once cut
    at the task's stop string."""
    n = QUICK_REGENERATE if rsp_options.quick else sizes["rsp_squad"]
    squad_items = ds.quick_subset(ds.load_squad(), n)
    prompts, _ = extraction_prompts(squad_items, [])
    spec, adapter = _spec("off", None), rsp_adapter_for("reference")
    ours = [adapter.generate([p], SQUAD_NEW_TOKENS, spec)[0] for p in prompts]  # batch 1, as lm-eval ran
    theirs = [text for _, text in _outputs(lm_eval_runs[("off", None)], "rsp_squad")][:n]
    for i, (o, t) in enumerate(zip(ours, theirs)):
        assert o.text.split(SQUAD_STOP)[0] == t, f"question {squad_items[i].id}: harness {o.text!r} vs lm-eval {t!r}"
