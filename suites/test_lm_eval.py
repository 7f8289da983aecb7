"""lm-eval suite: the offline tasks of fixtures/lm_eval_tasks run through lm-evaluation-harness
with the ``rsp`` model (rsp_bench/lm_eval_model.py) reusing the session's engine, for pruning
off and lossy s=0.5, and lm-eval's scores checked against the harness's own scorer on the same
outputs.

How the check works: lm-eval's logged generations are replayed through ``rsp_bench.quality
.extraction_metrics`` (an adapter that answers each prompt with lm-eval's output for it), so the
harness builds its prompts from ``rsp_bench.datasets`` and scores with ``rsp_bench.metrics``
exactly as the extraction suite does. A prompt lm-eval sent that the harness would not send
fails the lookup; a score that differs fails the comparison (means of the same per-document
values: equal up to the summation order, 1e-12). With pruning off, lm-eval's generations must
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

import json
import math
from pathlib import Path

import pytest

from rsp_bench import datasets as ds
from rsp_bench.engines import ConfigSpec, Output, format_config_id, pruning_config
from rsp_bench.quality import extraction_metrics, extraction_prompts

pytestmark = pytest.mark.lm_eval

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
