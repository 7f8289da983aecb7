"""Protective degradation: the pure, model-free parts of the odd-input detector.

DESIGN.md section 2 ("Protective degradation") says odd or adversarial input turns pruning
off for the whole request, so the output is exactly the unpruned output and the stats say
``degraded=True`` with a reason. This package holds the decisions, as pure functions of
numbers and strings the engine measures:

- ``text_anomaly_reason``: text-level signals (invalid, control, zero-width and direction
  characters, runs, floods, mixed scripts, injection boilerplate), thresholds in
  ``TextThresholds``;
- ``loss_anomaly_reason``, ``norm_anomaly_reason``, ``router_instability_reason``: model-level
  signals compared with numbers calibrated on normal text (``DetectorCalibration``);
- ``first_reason``: the reason reported when several signals fire.

Every reason is a short machine-readable string (``REASONS`` lists them all).

Degrading is the safe direction: a false positive only costs the speed-up on one request,
a false negative lets a router tuned on clean text prune on input it never saw. Thresholds
therefore fire on anything clearly abnormal, and are loosened only where ordinary text
(multilingual prose, code, markdown, math, chat with a few emoji) really does it.

Must NOT import: ``rsp_bench`` (the engine never depends on the harness) or torch at module
level (the harness and tests import this without a model). Only stdlib and numpy.

Layout (one concept per module; this package re-exports every name, private ones included,
so ``reference_engine.degradation.X`` keeps working):

  reasons               REASONS and first_reason
  thresholds            TextThresholds and the default injection / special-token patterns
  chars                 character classes: scripts, emoji, invisible, separators
  scan                  the one-pass character count of a prompt (_Scan)
  text_rules            text_anomaly_reason(s): the text-level rules over the scan
  model_checks          loss, hidden-norm and router-instability checks
  detector_calibration  DetectorCalibration, what the model-level checks compare against

Imports go one way (reasons, thresholds, chars, model_checks import none of the others;
scan imports chars; text_rules imports chars, scan, thresholds; detector_calibration imports
model_checks); none imports this package's ``__init__``.
"""

from __future__ import annotations

from .chars import (  # noqa: F401
    _ALWAYS_INVISIBLE,
    _BIDI_MARKS,
    _BIDI_OVERRIDES,
    _BOM,
    _FREE_SWITCHES,
    _JOINER_NATIVE,
    _MARK_NATIVE,
    _MVS,
    _ORTHOGRAPHIC_MARKS,
    _SCRIPT_RANGES,
    _SCRIPT_STARTS,
    _SEPARATOR_CHARS,
    _SEPARATOR_NEIGHBOURS,
    _SKIN_TONES,
    _ZWJ,
    _ZWNJ,
    _is_emoji,
    _is_noncharacter,
    _is_separator_char,
    _is_variation_selector,
    _script_of,
    _separator_neighbour_ok,
)
from .detector_calibration import (  # noqa: F401
    DetectorCalibration,
)
from .model_checks import (  # noqa: F401
    _finite,
    loss_anomaly_reason,
    norm_anomaly_reason,
    router_instability_reason,
)
from .reasons import (  # noqa: F401
    REASONS,
    first_reason,
)
from .scan import (  # noqa: F401
    _ANY_WS_RE,
    _ASCII_CONTROL_RE,
    _ASCII_OTHER_PUNCT,
    _ASCII_SEPARATORS,
    _Scan,
    _scan,
    _scan_ascii,
)
from .text_rules import (  # noqa: F401
    _CONTENT_RE,
    _HEX_RUN_OK,
    _MIXED_PUNCT_RE,
    _RUN_RE,
    _WS_RE,
    _in_hex_literal,
    _iter_reasons,
    _normalise_for_patterns,
    _run_reason,
    _separator_allowed,
    text_anomaly_reason,
    text_anomaly_reasons,
)
from .thresholds import (  # noqa: F401
    DEFAULT_INJECTION_PATTERNS,
    DEFAULT_SPECIAL_TOKEN_PATTERNS,
    TextThresholds,
    _check_count,
    _check_rate,
)

__all__ = [
    "REASONS",
    "TextThresholds",
    "DEFAULT_INJECTION_PATTERNS",
    "DEFAULT_SPECIAL_TOKEN_PATTERNS",
    "text_anomaly_reason",
    "text_anomaly_reasons",
    "loss_anomaly_reason",
    "norm_anomaly_reason",
    "router_instability_reason",
    "first_reason",
    "DetectorCalibration",
]
