"""Named hypothesis strategies for adversarial and edge-case inputs to a pruned engine.

Reusable from any test suite (``suites/test_adversarial.py`` and users' own tests). This
package only re-exports; each concept has one module:

- ``anomalies``: text classes, each a function returning ``SearchStrategy[str]``, which
  ``registry`` registers in ``STRATEGIES`` as an ``AdversarialClass`` with ``expect_degrade``
  (whether a protective detector should turn pruning off for it, DESIGN.md section 2);
- ``prose``: ``normal_text`` / ``multilingual_normal_text``, ordinary prose, the
  false-positive control, and ``near_context_limit``, long ordinary text sized against a
  character budget;
- ``tokens``: token-level strategies (``random_token_ids``, ``special_tokens_in_odd_places``);
- ``configs``: configuration strategies (``valid_pruning_configs``, ``invalid_pruning_configs``,
  ``pruning_overrides``);
- ``hypothesis_profiles``: the hypothesis profiles (``register_profiles``, ``load_profile``).

Anomalies are injected into ordinary text rather than generated alone, because a real attack
hides in a normal-looking prompt. Where a class is defined by a rate (combining marks,
emoji, mixed scripts) the generator builds text that meets the class definition stated in
its docstring, instead of hoping hypothesis draws it; bulk random edits use a drawn integer
seed so one example costs a handful of hypothesis choices.

Must NOT import torch or the engine (``reference_engine``) at module level, nor through its
modules: strategies are used to test any engine, and importing this must stay cheap.
"""

from __future__ import annotations

from rsp_bench.adversarial.anomalies import (
    bidi_override,
    char_run,
    combining_flood,
    control_chars,
    emoji_flood,
    empty_or_whitespace,
    invalid_bytes_lenient,
    lone_surrogates,
    lone_surrogates_lenient,
    mixed_script_flood,
    prompt_injection,
    punctuation_run,
    replacement_chars,
    zero_width,
)
from rsp_bench.adversarial.configs import (
    CONFIG_FIELDS,
    LOG_LEVELS,
    MODES,
    invalid_pruning_configs,
    pruning_overrides,
    valid_pruning_configs,
)
from rsp_bench.adversarial.hypothesis_profiles import (
    CI_MAX_EXAMPLES,
    DEFAULT_DATABASE_DIR,
    DEV_MAX_EXAMPLES,
    load_profile,
    register_profiles,
)
from rsp_bench.adversarial.prose import multilingual_normal_text, near_context_limit, normal_text
from rsp_bench.adversarial.registry import STRATEGIES, AdversarialClass
from rsp_bench.adversarial.tokens import random_token_ids, special_tokens_in_odd_places

__all__ = [
    "AdversarialClass",
    "STRATEGIES",
    "CI_MAX_EXAMPLES",
    "DEV_MAX_EXAMPLES",
    "DEFAULT_DATABASE_DIR",
    "register_profiles",
    "load_profile",
    "normal_text",
    "multilingual_normal_text",
    "control_chars",
    "zero_width",
    "combining_flood",
    "replacement_chars",
    "bidi_override",
    "lone_surrogates",
    "lone_surrogates_lenient",
    "invalid_bytes_lenient",
    "punctuation_run",
    "char_run",
    "mixed_script_flood",
    "emoji_flood",
    "prompt_injection",
    "empty_or_whitespace",
    "near_context_limit",
    "random_token_ids",
    "special_tokens_in_odd_places",
    "valid_pruning_configs",
    "pruning_overrides",
    "invalid_pruning_configs",
    "LOG_LEVELS",
    "MODES",
    "CONFIG_FIELDS",
]
