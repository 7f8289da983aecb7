"""What the adversarial and robustness suites share: the hypothesis profile and its sizes, the
lossy configuration they run, the per-result invariants every run must keep, and the figures
each suite adds to the run record's ``extra`` section.

Sizes (examples per property; the hypothesis profile comes from ``RSP_HYPOTHESIS_PROFILE``,
or ``RSP_BENCH_HYPOTHESIS_PROFILE``, default ``ci``; see ``SIZES``):

    property                          ci      dev     model runs per example       suite
    detector rate, per class (x14)    200     1000    none (misses only, at most   adversarial
                                                      24 / 1000 per class)
    every class through the engine    1       5       lossy + off batch (x16)      adversarial
    engine batches (1-4 / 1-8 rows)   12      200     lossy + off batch, 1-2       adversarial
                                                      teacher-forced
    valid configs and overrides       10      100     1                            robustness
    invalid configs                   120     1000    none (must raise first)      robustness
    random token ids                  8       100     1-2 teacher-forced           robustness
    special tokens in odd places      8       100     lossy + off                  robustness
    past the context limit            5       50      none (tokenizer only)        robustness

so ``ci`` generates about 3,470 examples (measured: 67 of them through the model, plus the
81-prompt normal corpus; about 159 s of single-thread CPU on the embedded model, both suites) and
``dev`` about 18,000 (about 1,100 through the model). ``ci`` is derandomized (the same examples
every run); both profiles keep failing examples in ``results/hypothesis`` (``RSP_HYPOTHESIS_DB``
overrides; a relative path is taken from the directory pytest runs in), so a failure replays
first on the next run.

Not a test module (pytest collects only ``test_*.py``); the suites import it by name from this
folder. Must NOT import torch, transformers or ``reference_engine.engine`` at module import (the
engine arrives through the plugin's ``rsp_engine`` fixture; collection stays light).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from reference_engine.config import PruningConfig
from reference_engine.degradation import REASONS
from reference_engine.errors import ConfigError, PromptError
from rsp_bench import adversarial
from rsp_bench.adversarial import STRATEGIES

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


def hypothesis_settings(max_examples: int, model: bool = True) -> settings:
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

# Every registered class, tagged with its name (the failure report says which class broke).
TAGGED_TEXT = st.one_of(*[
    STRATEGIES[name].strategy().map(lambda text, name=name: (name, text[:MODEL_MAX_CHARS]))
    for name in sorted(STRATEGIES)
])


class ExtraReport:
    """One suite's figures for the run record's ``extra`` section under its own key (a distributed
    run keeps each key from the first worker that set it, so two suites never share one)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.figures: dict[str, Any] = {"profile": PROFILE, "examples": {}}

    def set(self, rsp_record: Any, name: str, value: Any) -> None:
        self.figures[name] = value
        rsp_record.set_extra(self.key, self.figures)

    def count(self, rsp_record: Any, test: str, n: int = 1) -> None:
        self.figures["examples"][test] = self.figures["examples"].get(test, 0) + n
        rsp_record.set_extra(self.key, self.figures)


# --------------------------------------------------------------------------- helpers


def encodable(text: str) -> bool:
    """Whether the text can be encoded as UTF-8 (False for lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def draw(strategy: st.SearchStrategy[Any], n: int) -> list[Any]:
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


def finite_numbers(value: Any, where: str) -> None:
    """Every number in a (nested) stats value is finite."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, (int, float)):
        assert math.isfinite(value), f"stats {where} is {value!r}"
    elif isinstance(value, dict):
        for k, v in value.items():
            finite_numbers(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            finite_numbers(v, f"{where}[{i}]")


def check_result(res: Any, max_new: int, vocab: int) -> None:
    """The per-result invariants every run must keep, degraded or not."""
    s = res.stats
    finite_numbers(s, "stats")
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


def check_logits(logits: Any, n_tokens: int, vocab: int) -> None:
    assert tuple(logits.shape) == (n_tokens, vocab), tuple(logits.shape)
    assert bool(logits.isfinite().all()), "NaN or inf in teacher-forced logits"


def cap_tokens(engine: Any, text: str, max_tokens: int = MODEL_MAX_TOKENS) -> str:
    """The longest prefix of ``text`` (cut between characters) of at most ``max_tokens`` tokens.

    Cut at a character boundary from the tokenizer's offsets, never by decoding a token
    prefix: that would split a multi-byte character into U+FFFD and change the input class.
    Text the tokenizer cannot take (lone surrogates) is returned unchanged for the engine to
    reject or degrade.
    """
    if not encodable(text):
        return text
    enc = engine.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if len(enc["input_ids"]) <= max_tokens:
        return text
    return text[:enc["offset_mapping"][max_tokens - 1][1]]


def usable_vocab(engine: Any) -> int:
    # Ids the tokenizer can decode and the embedding can look up.
    return min(len(engine.tokenizer), engine.dims.vocab)


def generate(engine: Any, prompts: list[str], max_new: int, **overrides: Any) -> list[Any]:
    """engine.generate, turning any undocumented exception into a clear test failure."""
    try:
        return engine.generate(prompts, max_new_tokens=max_new, config=LOSSY, **overrides)
    except (PromptError, ConfigError):
        raise
    except Exception as exc:  # the property under test: nothing but the documented errors
        pytest.fail(f"engine.generate raised {type(exc).__name__}: {exc} (prompts {[p[:60] for p in prompts]!r})")


def _n_tokens(engine: Any, text: str) -> int:
    return len(engine.encode(text)) if encodable(text) else len(text)
