"""Adversarial suite: protective degradation (DESIGN.md section 2) fires where it should and
nowhere else, and a degraded request's output is exactly the pruning-off output.

Checked on the real engine (``rsp_engine``: the embedded SmolLM2-135M-Instruct unless
``--rsp-model``); sizes and the hypothesis profile in ``adversarial_common``:

- every adversarial class reaches the engine, and random batches of them (1-4 rows) never crash:
  each row keeps the invariants of ``adversarial_common.check_result``, a text-level detector
  verdict always reaches the stats, and a degraded row's output tokens equal the pruning-off
  output of the same batch exactly (a degraded row vetoes bypass for its whole batch, so the
  reference is the same batch run with ``mode="off"``, never the row alone: padding may move the
  last bit of a logit); degraded teacher-forced logits equal pruning off's.

Rates, recorded in the run record under ``reference/lossy/s=0.50`` with n and a Wilson CI:

- ``degradation_false_positive_rate``: share of a fixed corpus of normal prompts (every
  equivalence prompt, a quick subset of SQuAD prompts and of structured documents) on which
  the engine degrades; must be <= 5%;
- ``degradation_detection_rate``: share of generated examples of every adversarial class
  (``STRATEGIES`` with ``expect_degrade``) on which the engine degrades; >= 95% per class.
  The text-level detector runs on every example without the model; only the examples it
  lets through go through the engine (whose prompt-loss and hidden-norm checks may still
  catch them). This equals the engine's own verdict on every example because the engine
  degrades whenever the text check fires, which the batch property asserts on real runs.
  Text that is not valid Unicode (lone surrogates) counts as detected only if one engine
  run on it degrades or raises ``PromptError``; a crash makes the whole group misses.
- ``degradation_false_positive_rate_heldout_normal`` / ``_user_prompts`` and
  ``degradation_detection_rate_tuning_classes`` / ``_heldout_classes``: the whole detector
  (rules and the model-level score of ``reference_engine/ood.py``) through the engine on inputs
  the score was never fitted on: the held-out part of ``fixtures/normal_corpus`` (206 items,
  whose false-alarm rate the threshold was chosen for: the threshold split), its user prompts (a
  development split since the request rule was compared on them), and fresh draws of the
  machine-made text classes (``rsp_bench.adversarial.machine_text``), tuning and held-out classes
  reported apart. These are regression checks, not held-out figures: the README's false-alarm
  and detection figures come from a dated split under ``fixtures/degradation_heldout_*`` that
  chose nothing, reported once by ``rsp-bench degradation``. False alarms <= 5% each, tuning
  detection >= 95%, held-out detection within 5 points of it.

The normal corpus is 57 + 12 + 12 prompts with ``--rsp-quick``, 57 + 48 + 48 without.
Invalid configurations, token-level input and the context limit are suites/test_robustness.py's.

Must NOT import torch, transformers or ``reference_engine.engine`` at module import (the
engine arrives through the plugin's ``rsp_engine`` fixture; collection stays light). It
imports only the engine's light modules: configuration, errors and the pure detector.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Sequence

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from adversarial_common import (CONFIG_ID, LOSSY, MAX_NEW, SENSITIVITY, SIZE, TAGGED_TEXT, ExtraReport, cap_tokens,
                                check_logits, check_result, draw, encodable, generate, hypothesis_settings, usable_vocab)
from reference_engine.degradation import text_anomaly_reason
from reference_engine.errors import PromptError
from rsp_bench import datasets as ds
from rsp_bench.adversarial import STRATEGIES
from rsp_bench.metrics import wilson_interval

# reference_only: it exercises the reference engine's own protective degradation, whatever
# --rsp-engine is under test (another engine's run would only repeat the reference's figures).
pytestmark = [pytest.mark.adversarial, pytest.mark.reference_only]

RATE_BATCH = 8
MAX_FALSE_POSITIVE_RATE = 0.05
MIN_DETECTION_RATE = 0.95
QUICK_CORPUS, FULL_CORPUS = 12, 48  # SQuAD prompts and structured documents each

DEGRADE_CLASSES = sorted(n for n, c in STRATEGIES.items() if c.expect_degrade)
NORMAL_CLASSES = sorted(n for n, c in STRATEGIES.items() if not c.expect_degrade)

REPORT = ExtraReport("adversarial")


def _n_tokens(engine: Any, text: str) -> int:
    return len(engine.encode(text)) if encodable(text) else len(text)


def _run_sorted(engine: Any, prompts: Sequence[str], max_new: int = 1) -> list[Any]:
    """Results in input order, run in batches of similar token length. Sorted by tokens, not
    characters: a hex dump has three times the tokens of prose of its length, and sorting by
    characters padded the whole-detector test's batches to 1.6x its tokens (measured 76.8k
    padded tokens against 47.1k sorted by tokens)."""
    order = sorted(range(len(prompts)), key=lambda i: _n_tokens(engine, prompts[i]))
    out: list[Any] = [None] * len(prompts)
    for start in range(0, len(order), RATE_BATCH):
        idx = order[start:start + RATE_BATCH]
        for i, res in zip(idx, generate(engine, [prompts[i] for i in idx], max_new)):
            out[i] = res
    return out


def _record_rate(rsp_record: Any, name: str, hits: int, n: int) -> tuple[float, tuple[float, float]]:
    rate = hits / n
    ci = wilson_interval(hits, n)
    rsp_record.add_metric(CONFIG_ID, name, rate, n=n, ci=ci, unit="fraction",
                          engine="reference", mode="lossy", sensitivity=SENSITIVITY)
    return rate, ci


# --------------------------------------------------------------------------- rates


def _normal_corpus(quick: bool) -> list[tuple[str, str]]:
    """(source, prompt) for every fixture prompt plus SQuAD and structured subsets."""
    n = QUICK_CORPUS if quick else FULL_CORPUS
    corpus = [(f"prompts/{p.id}", p.text) for p in ds.load_prompts()]
    corpus += [(f"squad/{q.id}", ds.squad_prompt(q)) for q in ds.quick_subset(ds.load_squad(), n)]
    corpus += [(f"structured/{d.id}", ds.structured_prompt(d)) for d in ds.quick_subset(ds.load_structured(), n)]
    return corpus


def test_false_positive_rate_on_normal_prompts(rsp_engine: Any, rsp_options: Any, rsp_record: Any) -> None:
    corpus = _normal_corpus(rsp_options.quick)
    results = _run_sorted(rsp_engine, [text for _, text in corpus])
    fired = {src: res.stats["degraded_reason"] for (src, _), res in zip(corpus, results) if res.stats["degraded"]}
    rate, ci = _record_rate(rsp_record, "degradation_false_positive_rate", len(fired), len(corpus))
    REPORT.count(rsp_record, "false_positive_corpus", len(corpus))
    # The generated normal classes are text-level only: their word-salad prose is not what a
    # user writes, and the prompt-loss check rightly finds it improbable (see the report).
    text_fp = {}
    for name in NORMAL_CLASSES:
        texts = draw(STRATEGIES[name].strategy(), SIZE.rate_per_class)
        text_fp[name] = {"n": len(texts), "fired": sum(text_anomaly_reason(t) is not None for t in texts)}
    REPORT.count(rsp_record, "normal_class_text_level", sum(v["n"] for v in text_fp.values()))
    REPORT.set(rsp_record, "false_positive", {"n": len(corpus), "fired": fired,
                                           "reasons": dict(Counter(fired.values())), "text_level": text_fp})
    assert rate <= MAX_FALSE_POSITIVE_RATE, (
        f"degradation fired on {len(fired)}/{len(corpus)} normal prompts ({rate:.1%}, CI {ci[0]:.3f}-{ci[1]:.3f}): {fired}")
    for name, v in text_fp.items():
        assert v["fired"] <= MAX_FALSE_POSITIVE_RATE * v["n"], f"text detector fired on {v['fired']}/{v['n']} of {name}"


def _unencodable_verdict(engine: Any, text: str) -> str:
    """How the engine treats text that is not valid Unicode: "degraded", "rejected"
    (``PromptError``, the documented clear error) or the name of the exception it raised."""
    try:
        (res,) = engine.generate([text], max_new_tokens=1, config=LOSSY)
    except PromptError:
        return "rejected"
    except Exception as exc:  # reported, and counted as a miss: the engine broke on it
        return type(exc).__name__
    return "degraded" if res.stats["degraded"] else "not_degraded"


def test_detection_rate_on_adversarial_classes(rsp_engine: Any, rsp_record: Any) -> None:
    per_class: dict[str, dict[str, Any]] = {}
    misses: list[tuple[str, str]] = []
    unencodable: list[tuple[str, str]] = []
    for name in DEGRADE_CLASSES:
        texts = draw(STRATEGIES[name].strategy(), SIZE.rate_per_class)
        per_class[name] = {"n": len(texts), "text_level": 0, "model_level": 0, "unencodable": 0}
        n_misses = 0
        for t in texts:
            if not encodable(t):
                unencodable.append((name, t))
            elif text_anomaly_reason(t) is not None:
                per_class[name]["text_level"] += 1
            elif n_misses < SIZE.misses_per_class:
                misses.append((name, t))
                n_misses += 1
            else:
                # A class left to the model score (no rule fires on it) would put every example
                # through a prefill; past the cap an example is neither run nor counted.
                per_class[name]["n"] -= 1
    # What the text check lets through goes through the engine: its prompt-loss and hidden-
    # norm checks are part of the detector.
    if misses:
        for (name, _), res in zip(misses, _run_sorted(rsp_engine, [t for _, t in misses])):
            per_class[name]["model_level"] += int(res.stats["degraded"])
    # Text that is not valid Unicode never reaches the detector if the tokenizer chokes on it:
    # one engine run decides for all of them (its handling does not depend on where the
    # surrogate sits). Rejecting with PromptError counts as protected: nothing is pruned.
    verdict = _unencodable_verdict(rsp_engine, unencodable[0][1]) if unencodable else None
    if verdict in ("degraded", "rejected"):
        for name, _ in unencodable:
            per_class[name]["unencodable"] += 1
    detected = sum(v["text_level"] + v["model_level"] + v["unencodable"] for v in per_class.values())
    total = sum(v["n"] for v in per_class.values())
    rate, ci = _record_rate(rsp_record, "degradation_detection_rate", detected, total)
    for v in per_class.values():
        v["rate"] = round((v["text_level"] + v["model_level"] + v["unencodable"]) / v["n"], 4)
    REPORT.count(rsp_record, "detection_rate", total)
    REPORT.set(rsp_record, "detection", {"n": total, "engine_runs": len(misses), "per_class": per_class,
                                      "unencodable": len(unencodable), "unencodable_verdict": verdict})
    low = {name: v for name, v in per_class.items() if v["rate"] < MIN_DETECTION_RATE}
    assert rate >= MIN_DETECTION_RATE, (
        f"degradation fired on {detected}/{total} adversarial examples ({rate:.1%}, CI {ci[0]:.3f}-{ci[1]:.3f}); "
        f"engine on text that is not valid Unicode: {verdict}")
    assert not low, f"classes under {MIN_DETECTION_RATE:.0%} detection (engine on invalid Unicode: {verdict}): {low}"


# --------------------------------------------------------------------------- the model-level score

OOD_PER_CLASS = {True: 3, False: 12}  # fresh draws per machine-text class, quick / full
OOD_SEED0 = 2000  # the fit used seeds 0-15, scripts/calibrate_ood.py's evaluation 1000+
MAX_HELD_OUT_GAP = 0.05


def _normal_part(name: str) -> list[str]:
    path = ds.fixtures_dir() / "normal_corpus" / f"{name}.jsonl"
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# The quick run keeps every held-out normal item up to this many characters (109 of 206, 11.4k
# tokens) and a fixed-seed eighth of the longer ones (12 of 97, 4.65k of their 39.5k tokens):
# 121 items, where 5% is 6 false alarms, so the budget can still fail. Prefill tokens are this
# test's time (33.4k in all with a quarter of the long items, 29.2k with an eighth); the full run
# keeps all 206.
QUICK_LONG_CHARS, QUICK_LONG_SHARE, QUICK_LONG_SEED = 500, 8, 28


def _heldout_items(quick: bool) -> list[str]:
    import random

    held = _normal_part("heldout")
    if not quick:
        return held
    long_idx = [i for i, t in enumerate(held) if len(t) > QUICK_LONG_CHARS]
    keep_long = set(random.Random(QUICK_LONG_SEED).sample(long_idx, len(long_idx) // QUICK_LONG_SHARE))
    return [t for i, t in enumerate(held) if len(t) <= QUICK_LONG_CHARS or i in keep_long]


def _user_prompts() -> list[str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("user_prompts", ds.fixtures_dir() / "normal_corpus" / "user_prompts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [text for _, text in mod.PROMPTS]


def test_whole_detector_on_inputs_the_score_never_saw(rsp_engine: Any, rsp_options: Any, rsp_record: Any) -> None:
    """Text rules plus the model-level score (reference_engine/ood.py), through the engine, on
    inputs none of it was fitted to: the held-out normal corpus, the user prompts, and fresh
    draws of the machine-text classes, split into the classes the score was fitted against
    (TUNING) and classes it never saw (HELD_OUT). Each rate is recorded with n and its Wilson
    interval, and gated."""
    from rsp_bench.adversarial import machine_text as mt

    held = _heldout_items(bool(rsp_options.quick))
    user = _user_prompts()
    k = OOD_PER_CLASS[bool(rsp_options.quick)]
    odd = [(name, mt.make(name, OOD_SEED0 + i)) for name in mt.MAKERS for i in range(k)]
    texts = held + user + [t for _, t in odd]
    results = _run_sorted(rsp_engine, texts)
    fired = [bool(r.stats["degraded"]) for r in results]
    f_held, f_user, f_odd = fired[:len(held)], fired[len(held):len(held) + len(user)], fired[len(held) + len(user):]
    per_class: dict[str, int] = Counter()
    for (name, _), f in zip(odd, f_odd):
        per_class[name] += int(f)
    tune = sum(per_class[n] for n in mt.TUNING), k * len(mt.TUNING)
    out = sum(per_class[n] for n in mt.HELD_OUT), k * len(mt.HELD_OUT)
    fp_held, _ = _record_rate(rsp_record, "degradation_false_positive_rate_heldout_normal", sum(f_held), len(held))
    fp_user, _ = _record_rate(rsp_record, "degradation_false_positive_rate_user_prompts", sum(f_user), len(user))
    det_tune, _ = _record_rate(rsp_record, "degradation_detection_rate_tuning_classes", *tune)
    det_out, ci_out = _record_rate(rsp_record, "degradation_detection_rate_heldout_classes", *out)
    reasons = Counter(r.stats["degraded_reason"] for r, f in zip(results, fired) if f)
    REPORT.set(rsp_record, "model_level", {
        "per_class": {n: {"split": "tuning" if n in mt.TUNING else "held_out", "detected": per_class[n], "n": k}
                      for n in mt.MAKERS},
        "fired_heldout_normal": [t[:60] for t, f in zip(held, f_held) if f],
        "fired_user_prompts": [t[:60] for t, f in zip(user, f_user) if f], "reasons": dict(reasons)})
    REPORT.count(rsp_record, "model_level_inputs", len(texts))
    assert fp_held <= MAX_FALSE_POSITIVE_RATE, f"fired on {sum(f_held)}/{len(held)} held-out normal prompts"
    assert fp_user <= MAX_FALSE_POSITIVE_RATE, (
        f"fired on {sum(f_user)}/{len(user)} user prompts: {[t[:40] for t, f in zip(user, f_user) if f]}")
    assert det_tune >= MIN_DETECTION_RATE, f"detected {tune[0]}/{tune[1]} of the tuning classes: {dict(per_class)}"
    assert det_out >= det_tune - MAX_HELD_OUT_GAP, (
        f"held-out classes detected {out[0]}/{out[1]} ({det_out:.1%}, CI {ci_out[0]:.3f}-{ci_out[1]:.3f}), more "
        f"than {MAX_HELD_OUT_GAP:.0%} under the tuning classes' {det_tune:.1%}: {dict(per_class)}")


def test_the_packaged_detector_is_the_one_that_ran(rsp_engine: Any, rsp_options: Any, rsp_record: Any) -> None:
    """Every figure above is the detector's that ran: the stats name it, the record carries it
    (``extra.degradation_detector``), and on the embedded weights it must be the packaged score
    (a missing or damaged file falls back to the loss and norm checks, which these budgets were
    never set for)."""
    info = rsp_engine.detector_info()
    (res,) = rsp_engine.generate(["Name three rivers in Europe."], max_new_tokens=1, config=LOSSY)
    assert res.stats["detector"] == info["detector"], (res.stats["detector"], info)
    REPORT.set(rsp_record, "detector", info)
    if rsp_options.model is None:
        assert info["detector"].startswith("ood_score/") and info["packaged"], (
            f"the embedded weights ship a model-level score in reference_engine/data/calibration, but {info} ran")
        assert info["instruction_probe"] and info["language_rule"], (
            f"the embedded weights ship an instruction probe and a language rule, but {info} ran")


# --------------------------------------------------------------------------- engine batches


def _check_batch(engine: Any, rsp_record: Any, names: list[str], texts: list[str], counter: str) -> None:
    """Run one batch lossy and off and check every row: no crash, invariants, exactness."""
    vocab = usable_vocab(engine)
    try:
        lossy = generate(engine, texts, MAX_NEW)
    except PromptError as exc:
        # The one clear rejection these short texts may earn: a string that is not valid
        # Unicode (lone surrogates) cannot be tokenized.
        assert not all(encodable(t) for t in texts), f"PromptError on encodable prompts: {exc}"
        keep = [i for i, t in enumerate(texts) if encodable(t)]
        names, texts = [names[i] for i in keep], [texts[i] for i in keep]
        if not texts:
            return
        lossy = generate(engine, texts, MAX_NEW)
    off = generate(engine, texts, MAX_NEW, mode="off")
    REPORT.count(rsp_record, counter, len(texts))
    for name, text, res, ref in zip(names, texts, lossy, off):
        check_result(res, MAX_NEW, vocab)
        check_result(ref, MAX_NEW, vocab)
        assert ref.stats["degraded"] is False  # pruning off runs no checks: nothing to degrade
        reason = text_anomaly_reason(text)
        if reason is not None:
            assert res.stats["degraded_reason"] == reason, (name, res.stats["degraded_reason"], reason)
        if res.stats["degraded"]:
            assert res.token_ids == ref.token_ids, (
                f"{name}: degraded ({res.stats['degraded_reason']}) but output {res.token_ids} "
                f"differs from pruning off {ref.token_ids}")
    # Logits on a short continuation (the unpruned output), for the first row.
    forced = engine.teacher_forced(lossy[0].prompt_ids, off[0].token_ids, config=LOSSY)
    check_logits(forced.logits, len(off[0].token_ids), engine.dims.vocab)
    if forced.stats["degraded"]:
        forced_off = engine.teacher_forced(lossy[0].prompt_ids, off[0].token_ids, config=LOSSY, mode="off")
        assert bool((forced.logits == forced_off.logits).all()), "degraded teacher-forced logits differ from off"


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_class_runs_through_the_engine(rsp_engine: Any, rsp_record: Any, name: str) -> None:
    # The batch property below draws classes at random, so a 12-example run may miss one
    # entirely (it did: no lone-surrogate row in one derandomized run); this guarantees each
    # class reaches the engine. The first draws are hypothesis's simplest; take later ones.
    drawn = draw(STRATEGIES[name].strategy(), SIZE.per_class_engine + 2)[2:]
    _check_batch(rsp_engine, rsp_record, [name] * len(drawn), [cap_tokens(rsp_engine, t) for t in drawn],
                 "per_class_engine")


@hypothesis_settings(SIZE.engine_batches)
@given(batch=st.lists(TAGGED_TEXT, min_size=1, max_size=SIZE.max_batch))
def test_batches_never_crash_and_degraded_rows_equal_off(rsp_engine: Any, rsp_record: Any,
                                                         batch: list[tuple[str, str]]) -> None:
    names = [n for n, _ in batch]
    note(f"classes {names}")
    _check_batch(rsp_engine, rsp_record, names, [cap_tokens(rsp_engine, t) for _, t in batch], "engine_batches")
