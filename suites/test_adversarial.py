"""Adversarial suite: odd and adversarial input never breaks the engine, and protective
degradation (DESIGN.md section 2) fires where it should and nowhere else.

Properties, checked with hypothesis on the real engine (``rsp_engine``: the embedded
SmolLM2-135M-Instruct unless ``--rsp-model``):

- no exception but the documented clear errors (``PromptError``: empty prompt list, prompt
  past the context; ``ConfigError``: invalid configuration), no NaN or inf in logits
  (``teacher_forced``) or stats, output within ``max_new_tokens``;
- a degraded row's output tokens equal the pruning-off output of the same batch exactly
  (a degraded row vetoes bypass for its whole batch, so the reference is the same batch run
  with ``mode="off"``, never the row alone: padding may move the last bit of a logit);
- stats consistent: 0 <= layers_bypassed <= blocks x total_tokens, 0 when degraded,
  bypass_ratio in [0, 1]; a text-level detector verdict always reaches the stats;
- invalid configurations raise ``ConfigError`` (a ``ValueError``) naming the field and the
  bad value, and nothing is encoded or run;
- token-level input (random ids, special tokens in odd places, fed as ids through
  ``teacher_forced`` and decoded to text through ``generate``) never crashes;
- a prompt past the context raises ``PromptError`` naming its length; one that exactly
  fills the context runs.

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
  reported apart. These are regression checks; the split that chose nothing is
  ``fixtures/degradation_heldout_2026-12-04b`` (the four earlier ones, measured and looked at,
  are development splits now), reported once by ``rsp-bench degradation``. False
  alarms <= 5% each, tuning detection >= 95%, held-out detection within 5 points of it.

Sizes (examples per property; the hypothesis profile comes from ``RSP_HYPOTHESIS_PROFILE``,
or ``RSP_BENCH_HYPOTHESIS_PROFILE``, default ``ci``; see ``SIZES``):

    property                          ci      dev     model runs per example
    detector rate, per class (x14)    200     1000    none (misses only, at most 24 / 1000 per class)
    every class through the engine    1       5       lossy + off batch of them (x16)
    engine batches (1-4 / 1-8 rows)   12      200     lossy + off batch, 1-2 teacher-forced
    valid configs and overrides       10      100     1
    invalid configs                   120     1000    none (must raise first)
    random token ids                  8       100     1-2 teacher-forced
    special tokens in odd places      8       100     lossy + off
    past the context limit            5       50      none (tokenizer only)

so ``ci`` generates about 3,470 examples (measured: 67 of them through the model, plus the
81-prompt normal corpus; about 159 s of single-thread CPU on the embedded model) and ``dev``
about 18,000 (about 1,100 through the model). The normal corpus is 57 + 12 + 12 prompts with ``--rsp-quick``, 57 + 48 + 48
without. The at-the-limit check with a prompt that itself fills the context (an 8k-token
prefill on the embedded model, minutes on 2 cores) runs only without ``--rsp-quick`` or when
the context is at most 2,048 tokens; the quick run checks the same boundary with a short
prompt whose ``max_new_tokens`` fills the context and which ends at EOS.

``ci`` is derandomized (the same examples every run); both profiles keep failing examples
in ``results/hypothesis`` (``RSP_HYPOTHESIS_DB`` overrides; a relative path is taken from
the directory pytest runs in), so a failure replays first on the next run.

Must NOT import torch, transformers or ``reference_engine.engine`` at module import (the
engine arrives through the plugin's ``rsp_engine`` fixture; collection stays light). It
imports only the engine's light modules: configuration, errors and the pure detector.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from reference_engine.config import PruningConfig
from reference_engine.degradation import REASONS, text_anomaly_reason
from reference_engine.errors import ConfigError, PromptError
from rsp_bench import adversarial
from rsp_bench import datasets as ds
from rsp_bench.adversarial import STRATEGIES
from rsp_bench.metrics import wilson_interval

# reference_only: it exercises the reference engine's own protective degradation, whatever
# --rsp-engine is under test (another engine's run would only repeat the reference's figures).
pytestmark = [pytest.mark.adversarial, pytest.mark.reference_only]


# --------------------------------------------------------------------------- sizes, profile


@dataclass(frozen=True)
class Sizes:
    """Examples per property for one hypothesis profile (see the module docstring)."""

    rate_per_class: int
    misses_per_class: int  # text-rule misses per class that go through the engine (the rest are not counted)
    per_class_engine: int
    engine_batches: int
    max_batch: int
    valid_configs: int
    invalid_configs: int
    token_examples: int
    past_limit: int


SIZES: dict[str, Sizes] = {
    "ci": Sizes(rate_per_class=200, misses_per_class=24, per_class_engine=1, engine_batches=12, max_batch=4, valid_configs=10,
                invalid_configs=120, token_examples=8, past_limit=5),
    "dev": Sizes(rate_per_class=1000, misses_per_class=1000, per_class_engine=5, engine_batches=200, max_batch=8, valid_configs=100,
                 invalid_configs=1000, token_examples=100, past_limit=50),
}

PROFILE = os.environ.get("RSP_HYPOTHESIS_PROFILE") or os.environ.get("RSP_BENCH_HYPOTHESIS_PROFILE") or "ci"
if PROFILE not in SIZES:
    raise ValueError(f"RSP_HYPOTHESIS_PROFILE={PROFILE!r} is not a profile of this suite: use 'ci' or 'dev'")
SIZE = SIZES[PROFILE]
DATABASE_DIR = os.environ.get("RSP_HYPOTHESIS_DB") or adversarial.DEFAULT_DATABASE_DIR
adversarial.register_profiles(DATABASE_DIR)  # registers "ci" and "dev"; loads nothing globally


def _settings(max_examples: int, model: bool = True) -> settings:
    """The profile's settings with this property's example count.

    A child of the profile, not ``settings.load_profile()``: loading would change hypothesis
    defaults for every other test in the session. In ``ci`` a property that runs the model
    does not shrink: shrinking re-runs the engine hundreds of times (measured: over five
    minutes for one failure), which the quick run cannot afford. The failing example is
    still saved and replays first; rerun with ``RSP_HYPOTHESIS_PROFILE=dev`` to shrink it.
    """
    parent = settings.get_profile(PROFILE)
    if PROFILE == "ci" and model:
        return settings(parent, max_examples=max_examples,
                        phases=[Phase.explicit, Phase.reuse, Phase.generate])
    return settings(parent, max_examples=max_examples)


# --------------------------------------------------------------------------- constants

CONFIG_ID = "reference/lossy/s=0.50"
SENSITIVITY = 0.5
# Watermark pinned like every suite configuration (rsp_bench.engines.SUITE_WATERMARK): the
# degradation checks do not read it, but the router would, and outputs must not depend on
# who else is using the CPUs.
LOSSY = PruningConfig(sensitivity=SENSITIVITY, mode="lossy", hardware_watermark=0.0, log_level="NONE")
# Four tokens: step 0 is a probe (all blocks run), so two routed steps can bypass, enough for
# "degraded equals off" to be a claim that could fail, at a quarter of the cost of 16.
MAX_NEW = 4
# Model runs see at most this many characters, then this many tokens, of a generated text:
# a 500-mark Zalgo string is about 1,000 tokens, 200 characters of emoji or Thai 400-600, and
# one long row pads its whole batch (measured: 60 s of CPU per 4-row example uncapped). The
# anomaly classes inject into short text, so the cut rarely removes the anomaly; the
# detector-rate test sees full texts.
MODEL_MAX_CHARS = 200
MODEL_MAX_TOKENS = 48
RATE_BATCH = 8
MAX_FALSE_POSITIVE_RATE = 0.05
MIN_DETECTION_RATE = 0.95
QUICK_CORPUS, FULL_CORPUS = 12, 48  # SQuAD prompts and structured documents each
# Above this context, a prompt that fills it is an expensive prefill on CPU: quick runs skip it.
QUICK_LONG_PROMPT_MAX_CONTEXT = 2048

DEGRADE_CLASSES = sorted(n for n, c in STRATEGIES.items() if c.expect_degrade)
NORMAL_CLASSES = sorted(n for n, c in STRATEGIES.items() if not c.expect_degrade)

# Every registered class, tagged with its name (the failure report says which class broke).
TAGGED_TEXT = st.one_of(*[
    STRATEGIES[name].strategy().map(lambda text, name=name: (name, text[:MODEL_MAX_CHARS]))
    for name in sorted(STRATEGIES)
])

# Figures for the run record's "extra" section (per-class rates, examples run).
_REPORT: dict[str, Any] = {"profile": PROFILE, "examples": {}}


def _report(rsp_record: Any, key: str, value: Any) -> None:
    _REPORT[key] = value
    rsp_record.set_extra("adversarial", _REPORT)


def _count(rsp_record: Any, test: str, n: int = 1) -> None:
    _REPORT["examples"][test] = _REPORT["examples"].get(test, 0) + n
    rsp_record.set_extra("adversarial", _REPORT)


# --------------------------------------------------------------------------- helpers


def _encodable(text: str) -> bool:
    """Whether the text can be encoded as UTF-8 (False for lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _draw(strategy: st.SearchStrategy[Any], n: int) -> list[Any]:
    """``n`` examples of a strategy, the same ones every run (for rates, not properties).

    Generation phase only, no database: nothing fails inside, a rate is judged afterwards.
    """
    out: list[Any] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example: Any) -> None:
        out.append(example)

    collect()
    return out


def _finite_numbers(value: Any, where: str) -> None:
    """Every number in a (nested) stats value is finite."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, (int, float)):
        assert math.isfinite(value), f"stats {where} is {value!r}"
    elif isinstance(value, dict):
        for k, v in value.items():
            _finite_numbers(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _finite_numbers(v, f"{where}[{i}]")


def _check_result(res: Any, max_new: int, vocab: int) -> None:
    """The per-result invariants every run must keep, degraded or not."""
    s = res.stats
    _finite_numbers(s, "stats")
    assert 1 <= len(res.token_ids) <= max_new, f"{len(res.token_ids)} tokens for max_new_tokens={max_new}"
    assert all(0 <= t < vocab for t in res.token_ids), res.token_ids
    assert s["total_tokens"] == len(res.token_ids), s
    assert 0 <= s["layers_bypassed"] <= s["blocks"] * s["total_tokens"], s
    assert 0.0 <= s["bypass_ratio"] <= 1.0, s
    assert isinstance(s["degraded"], bool), s
    if s["degraded"]:
        assert s["degraded_reason"] in REASONS, s["degraded_reason"]
        assert s["layers_bypassed"] == 0 and s["bypass_ratio"] == 0.0, s
    else:
        assert s["degraded_reason"] is None, s


def _check_logits(logits: Any, n_tokens: int, vocab: int) -> None:
    assert tuple(logits.shape) == (n_tokens, vocab), tuple(logits.shape)
    assert bool(logits.isfinite().all()), "NaN or inf in teacher-forced logits"


def _cap_tokens(engine: Any, text: str, max_tokens: int = MODEL_MAX_TOKENS) -> str:
    """The longest prefix of ``text`` (cut between characters) of at most ``max_tokens`` tokens.

    Cut at a character boundary from the tokenizer's offsets, never by decoding a token
    prefix: that would split a multi-byte character into U+FFFD and change the input class.
    Text the tokenizer cannot take (lone surrogates) is returned unchanged for the engine to
    reject or degrade.
    """
    if not _encodable(text):
        return text
    enc = engine.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if len(enc["input_ids"]) <= max_tokens:
        return text
    return text[:enc["offset_mapping"][max_tokens - 1][1]]


def _vocab(engine: Any) -> int:
    # Ids the tokenizer can decode and the embedding can look up.
    return min(len(engine.tokenizer), engine.dims.vocab)


@contextmanager
def _must_not_run(engine: Any) -> Iterator[list[str]]:
    """Make encoding or running a request an error; yields the list of attempted calls.

    Patches the instance (the class stays untouched) and restores it: hypothesis forbids the
    function-scoped ``monkeypatch`` fixture inside ``@given``.
    """
    calls: list[str] = []

    def spy(name: str) -> Any:
        def called(*_a: Any, **_k: Any) -> None:
            calls.append(name)
            raise AssertionError(f"engine.{name} was called for an invalid configuration")
        return called

    had = {n: n in vars(engine) for n in ("_run", "encode")}
    saved = {n: vars(engine)[n] for n in had if had[n]}
    engine._run, engine.encode = spy("_run"), spy("encode")
    try:
        yield calls
    finally:
        for n in had:
            if had[n]:
                setattr(engine, n, saved[n])
            else:
                delattr(engine, n)


def _generate(engine: Any, prompts: list[str], max_new: int, **overrides: Any) -> list[Any]:
    """engine.generate, turning any undocumented exception into a clear test failure."""
    try:
        return engine.generate(prompts, max_new_tokens=max_new, config=LOSSY, **overrides)
    except (PromptError, ConfigError):
        raise
    except Exception as exc:  # the property under test: nothing but the documented errors
        pytest.fail(f"engine.generate raised {type(exc).__name__}: {exc} (prompts {[p[:60] for p in prompts]!r})")


def _n_tokens(engine: Any, text: str) -> int:
    return len(engine.encode(text)) if _encodable(text) else len(text)


def _run_sorted(engine: Any, prompts: Sequence[str], max_new: int = 1) -> list[Any]:
    """Results in input order, run in batches of similar token length. Sorted by tokens, not
    characters: a hex dump has three times the tokens of prose of its length, and sorting by
    characters padded the whole-detector test's batches to 1.6x its tokens (measured 76.8k
    padded tokens against 47.1k sorted by tokens)."""
    order = sorted(range(len(prompts)), key=lambda i: _n_tokens(engine, prompts[i]))
    out: list[Any] = [None] * len(prompts)
    for start in range(0, len(order), RATE_BATCH):
        idx = order[start:start + RATE_BATCH]
        for i, res in zip(idx, _generate(engine, [prompts[i] for i in idx], max_new)):
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
    _count(rsp_record, "false_positive_corpus", len(corpus))
    # The generated normal classes are text-level only: their word-salad prose is not what a
    # user writes, and the prompt-loss check rightly finds it improbable (see the report).
    text_fp = {}
    for name in NORMAL_CLASSES:
        texts = _draw(STRATEGIES[name].strategy(), SIZE.rate_per_class)
        text_fp[name] = {"n": len(texts), "fired": sum(text_anomaly_reason(t) is not None for t in texts)}
    _count(rsp_record, "normal_class_text_level", sum(v["n"] for v in text_fp.values()))
    _report(rsp_record, "false_positive", {"n": len(corpus), "fired": fired,
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
        texts = _draw(STRATEGIES[name].strategy(), SIZE.rate_per_class)
        per_class[name] = {"n": len(texts), "text_level": 0, "model_level": 0, "unencodable": 0}
        n_misses = 0
        for t in texts:
            if not _encodable(t):
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
    _count(rsp_record, "detection_rate", total)
    _report(rsp_record, "detection", {"n": total, "engine_runs": len(misses), "per_class": per_class,
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
    _report(rsp_record, "model_level", {
        "per_class": {n: {"split": "tuning" if n in mt.TUNING else "held_out", "detected": per_class[n], "n": k}
                      for n in mt.MAKERS},
        "fired_heldout_normal": [t[:60] for t, f in zip(held, f_held) if f],
        "fired_user_prompts": [t[:60] for t, f in zip(user, f_user) if f], "reasons": dict(reasons)})
    _count(rsp_record, "model_level_inputs", len(texts))
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
    _report(rsp_record, "detector", info)
    if rsp_options.model is None:
        assert info["detector"].startswith("ood_score/") and info["packaged"], (
            f"the embedded weights ship a model-level score in reference_engine/data/calibration, but {info} ran")


# --------------------------------------------------------------------------- engine batches


def _check_batch(engine: Any, rsp_record: Any, names: list[str], texts: list[str], counter: str) -> None:
    """Run one batch lossy and off and check every row: no crash, invariants, exactness."""
    vocab = _vocab(engine)
    try:
        lossy = _generate(engine, texts, MAX_NEW)
    except PromptError as exc:
        # The one clear rejection these short texts may earn: a string that is not valid
        # Unicode (lone surrogates) cannot be tokenized.
        assert not all(_encodable(t) for t in texts), f"PromptError on encodable prompts: {exc}"
        keep = [i for i, t in enumerate(texts) if _encodable(t)]
        names, texts = [names[i] for i in keep], [texts[i] for i in keep]
        if not texts:
            return
        lossy = _generate(engine, texts, MAX_NEW)
    off = _generate(engine, texts, MAX_NEW, mode="off")
    _count(rsp_record, counter, len(texts))
    for name, text, res, ref in zip(names, texts, lossy, off):
        _check_result(res, MAX_NEW, vocab)
        _check_result(ref, MAX_NEW, vocab)
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
    _check_logits(forced.logits, len(off[0].token_ids), engine.dims.vocab)
    if forced.stats["degraded"]:
        forced_off = engine.teacher_forced(lossy[0].prompt_ids, off[0].token_ids, config=LOSSY, mode="off")
        assert bool((forced.logits == forced_off.logits).all()), "degraded teacher-forced logits differ from off"


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_class_runs_through_the_engine(rsp_engine: Any, rsp_record: Any, name: str) -> None:
    # The batch property below draws classes at random, so a 12-example run may miss one
    # entirely (it did: no lone-surrogate row in one derandomized run); this guarantees each
    # class reaches the engine. The first draws are hypothesis's simplest; take later ones.
    drawn = _draw(STRATEGIES[name].strategy(), SIZE.per_class_engine + 2)[2:]
    _check_batch(rsp_engine, rsp_record, [name] * len(drawn), [_cap_tokens(rsp_engine, t) for t in drawn],
                 "per_class_engine")


@_settings(SIZE.engine_batches)
@given(batch=st.lists(TAGGED_TEXT, min_size=1, max_size=SIZE.max_batch))
def test_batches_never_crash_and_degraded_rows_equal_off(rsp_engine: Any, rsp_record: Any,
                                                         batch: list[tuple[str, str]]) -> None:
    names = [n for n, _ in batch]
    note(f"classes {names}")
    _check_batch(rsp_engine, rsp_record, names, [_cap_tokens(rsp_engine, t) for _, t in batch], "engine_batches")


# --------------------------------------------------------------------------- configurations


@_settings(SIZE.valid_configs)
@given(data=st.data())
def test_valid_configs_and_overrides_run_consistently(rsp_engine: Any, rsp_record: Any, data: st.DataObject) -> None:
    n_layers = rsp_engine.dims.n_layers
    base = data.draw(adversarial.valid_pruning_configs(n_layers), label="config")
    overrides = data.draw(adversarial.pruning_overrides(n_layers), label="overrides")
    _, text = data.draw(TAGGED_TEXT, label="prompt")
    text = _cap_tokens(rsp_engine, text)
    config = PruningConfig(hardware_watermark=0.0, **base)
    effective = config.override(**overrides)
    log = io.StringIO()
    res = _generate_with(rsp_engine, text, config, log, overrides)
    _count(rsp_record, "valid_configs")
    _check_result(res, MAX_NEW, _vocab(rsp_engine))
    s = res.stats
    assert s["mode"] == effective.mode and s["sensitivity"] == effective.sensitivity, s
    if not effective.prunes:
        assert s["layers_bypassed"] == 0 and s["degraded"] is False, s
    lines = [json.loads(line) for line in log.getvalue().splitlines() if line.strip()]
    if effective.log_level == "NONE":
        assert lines == []
        return
    (request,) = [r for r in lines if r["event"] == "request"]
    assert request["layers_bypassed"] == s["layers_bypassed"] and request["degraded"] == s["degraded"]
    protected = effective.blacklist_for(n_layers)
    for r in lines:
        if r["event"] == "block" and r["block"] in protected:
            assert r["decision"] != "BYPASS", f"blacklisted block {r['block']} bypassed"


def _generate_with(engine: Any, text: str, config: PruningConfig, log: io.StringIO, overrides: dict) -> Any:
    try:
        (res,) = engine.generate([text], max_new_tokens=MAX_NEW, config=config, log_file=log, **overrides)
    except PromptError as exc:
        assert not _encodable(text), f"PromptError on an encodable prompt: {exc}"
        (res,) = engine.generate(["Hello."], max_new_tokens=MAX_NEW, config=config, log_file=log, **overrides)
    except ConfigError:
        raise
    except Exception as exc:
        pytest.fail(f"engine.generate raised {type(exc).__name__}: {exc} (config {config}, overrides {overrides})")
    return res


def _names_bad_value(message: str, field: str, value: Any) -> bool:
    """The message names the field and the bad value (or, for a blacklist, the bad entry)."""
    candidates = [value] + (list(value) if isinstance(value, tuple) else [])
    return field in message and any(repr(v) in message for v in candidates)


@_settings(SIZE.invalid_configs, model=False)
@given(data=st.data())
def test_invalid_configs_raise_and_never_run(rsp_engine: Any, rsp_record: Any, data: st.DataObject) -> None:
    n_layers = rsp_engine.dims.n_layers
    config, field = data.draw(adversarial.invalid_pruning_configs(n_layers), label="config")
    value = config[field]
    _count(rsp_record, "invalid_configs")
    with _must_not_run(rsp_engine) as calls:
        # As per-request overrides of a valid configuration ...
        with pytest.raises(ConfigError) as info:
            rsp_engine.generate(["Hello there."], max_new_tokens=MAX_NEW, config=LOSSY, **config)
        assert _names_bad_value(str(info.value), field, value), str(info.value)
        # ... and as a configuration object: refused when built, or (a block index only the
        # model can range-check) when handed to the engine.
        with pytest.raises(ConfigError) as info:
            built = PruningConfig(hardware_watermark=0.0, **config)
            rsp_engine.generate(["Hello there."], max_new_tokens=MAX_NEW, config=built)
        assert isinstance(info.value, ValueError)
        assert _names_bad_value(str(info.value), field, value), str(info.value)
    assert calls == []


# --------------------------------------------------------------------------- token level


@_settings(SIZE.token_examples)
@given(data=st.data())
def test_random_token_ids_give_finite_logits(rsp_engine: Any, rsp_record: Any, data: st.DataObject) -> None:
    vocab = _vocab(rsp_engine)
    prompt_ids = data.draw(adversarial.random_token_ids(vocab, 1, 48), label="prompt ids")
    continuation = data.draw(adversarial.random_token_ids(vocab, 1, 3), label="continuation")
    _count(rsp_record, "random_token_ids")
    res = rsp_engine.teacher_forced(prompt_ids, continuation, config=LOSSY)
    _check_logits(res.logits, len(continuation), rsp_engine.dims.vocab)
    _check_result(res, len(continuation), vocab)
    if res.stats["degraded"]:
        off = rsp_engine.teacher_forced(prompt_ids, continuation, config=LOSSY, mode="off")
        assert bool((res.logits == off.logits).all()), "degraded teacher-forced logits differ from off"


@_settings(SIZE.token_examples)
@given(data=st.data())
def test_special_tokens_in_odd_places_never_crash(rsp_engine: Any, rsp_record: Any, data: st.DataObject) -> None:
    vocab = _vocab(rsp_engine)
    specials = [i for i in rsp_engine.tokenizer.all_special_ids if 0 <= i < vocab]
    ids = data.draw(adversarial.special_tokens_in_odd_places(specials, vocab, 1, 24), label="ids")
    # Decoded with the special tokens kept as text, so they reach the prompt as typed markers.
    text = rsp_engine.tokenizer.decode(ids, skip_special_tokens=False)
    note(f"text {text!r}")
    _count(rsp_record, "special_tokens")
    forced = rsp_engine.teacher_forced(ids, ids[-1:], config=LOSSY)
    _check_logits(forced.logits, 1, rsp_engine.dims.vocab)
    if not _encodable(text) or not text:
        return
    (res,) = _generate(rsp_engine, [text], MAX_NEW)
    (ref,) = _generate(rsp_engine, [text], MAX_NEW, mode="off")
    _check_result(res, MAX_NEW, vocab)
    reason = text_anomaly_reason(text)
    if reason is not None:
        assert res.stats["degraded_reason"] == reason
    if res.stats["degraded"]:
        assert res.token_ids == ref.token_ids


# --------------------------------------------------------------------------- context limit


@_settings(SIZE.past_limit, model=False)
@given(data=st.data())
def test_prompt_past_the_context_raises_naming_its_length(rsp_engine: Any, rsp_record: Any,
                                                          data: st.DataObject) -> None:
    limit = rsp_engine.dims.max_positions
    text = data.draw(adversarial.near_context_limit(limit), label="text")
    n = len(rsp_engine.encode(text))
    # Past the limit by 1-64 tokens of prompt + max_new_tokens, whatever the prompt's length.
    max_new = max(1, limit - n + data.draw(st.integers(1, 64), label="excess"))
    _count(rsp_record, "past_limit")
    with pytest.raises(PromptError) as info:
        rsp_engine.generate([text], max_new_tokens=max_new, config=LOSSY)
    assert f"{n} tokens" in str(info.value) and str(limit) in str(info.value), str(info.value)


def test_empty_prompt_list_is_a_prompt_error(rsp_engine: Any) -> None:
    for empty in ([], ()):
        with pytest.raises(PromptError, match="non-empty"):
            rsp_engine.generate(empty, max_new_tokens=MAX_NEW, config=LOSSY)


# A prompt the embedded model answers in a few tokens, then EOS (measured: "The capital of
# France is Paris." and EOS); any model that does not is skipped by the probe below.
SHORT_PROMPT = "What is the capital of France? One word."
PROBE_TOKENS = 12


def test_short_prompt_filling_the_context_runs(rsp_engine: Any) -> None:
    limit = rsp_engine.dims.max_positions
    # The default router first, then the block router: the boundary is the engine's, not a
    # router's, and the run below needs a router under which the model stops early (measured:
    # the unit router at 0.5 runs on past 12 tokens on this prompt, the block router stops).
    for router in (LOSSY.router, "block"):
        (probe,) = _generate(rsp_engine, [SHORT_PROMPT], PROBE_TOKENS, router=router)
        if rsp_engine.eos_id in probe.token_ids:
            break
    else:
        # Without an early EOS the run below would decode the whole context.
        pytest.skip(f"the model does not end {SHORT_PROMPT!r} within {PROBE_TOKENS} tokens: {probe.text!r}")
    n = len(probe.prompt_ids)
    (res,) = _generate(rsp_engine, [SHORT_PROMPT], limit - n, router=router)  # n + max_new == limit: fits
    _check_result(res, limit - n, _vocab(rsp_engine))
    with pytest.raises(PromptError, match=rf"\b{n} tokens\b"):
        rsp_engine.generate([SHORT_PROMPT], max_new_tokens=limit - n + 1, config=LOSSY)


def _text_of_length(engine: Any, lo: int, hi: int) -> tuple[str, int]:
    """Ordinary prose whose chat-encoded length is in [lo, hi] (binary search on length)."""
    # Comfortably past ``hi`` tokens, then cut: prose never has fewer than 1 token per 8 chars.
    (base,) = _draw(adversarial.near_context_limit(hi, chars_per_token=8.0, low=1.0, high=1.0), 1)
    a, b = 1, len(base)
    while a < b:
        mid = (a + b + 1) // 2
        if len(engine.encode(base[:mid])) <= hi:
            a = mid
        else:
            b = mid - 1
    n = len(engine.encode(base[:a]))
    assert lo <= n <= hi, f"no prose of {lo}-{hi} tokens (got {n})"
    return base[:a], n


def test_long_prompt_at_the_limit_runs(rsp_engine: Any, rsp_options: Any) -> None:
    limit = rsp_engine.dims.max_positions
    if rsp_options.quick and limit > QUICK_LONG_PROMPT_MAX_CONTEXT:
        pytest.skip(f"a {limit}-token prefill is too slow for --rsp-quick; "
                    "test_short_prompt_filling_the_context_runs checks the same boundary")
    text, n = _text_of_length(rsp_engine, limit - 4, limit - 1)
    (res,) = _generate(rsp_engine, [text], limit - n)
    _check_result(res, limit - n, _vocab(rsp_engine))
