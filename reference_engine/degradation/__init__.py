"""Protective degradation: the pure, model-free parts of the odd-input detector.

DESIGN.md section 2 ("Protective degradation") says odd or adversarial input turns pruning
off for the whole request, so the output is exactly the unpruned output and the stats say
``degraded=True`` with a reason. This package holds the decisions, as pure functions of
numbers and strings the engine measures:

- ``text_anomaly_reason``: text-level signals (invalid, control, zero-width and direction
  characters, runs, floods, mixed scripts, injection boilerplate, instructions planted for the
  model in content, prose in a container with no request, words spelled out or tagged),
  thresholds in ``TextThresholds``;
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

Layout (one concept per module; this package re-exports the public names):

  reasons               REASONS and first_reason
  thresholds            TextThresholds and the default injection / special-token patterns
  chars                 character classes: scripts, emoji, invisible, separators
  scan                  the one-pass character count of a prompt (_Scan)
  text_rules            text_anomaly_reason(s): the text-level rules over the scan
  embedded_instructions the embedded-instruction rule (indirect prompt injection) and its cues
  containers            prose in a container (literals, text nodes) with no request around it
  word_shapes           words spelled out letter by letter, or every word tagged
  model_checks          loss, hidden-norm and router-instability checks
  detector_calibration  DetectorCalibration, what the model-level checks compare against
  request_words         which tokens of a prompt are a request in words (the request rule's
                        first half; ``ood.judge`` is the other), not re-exported
  language_rule         which plain requests in other languages pruning spares, not re-exported
  instruction_probe     instructions addressed to the model read from the pooled hidden states
                        (an ensemble of small networks; ``ood.judge`` runs it), not re-exported

The model-level out-of-distribution score that catches what no character rule lists (random
and machine-made text, stacked combining marks) is ``reference_engine.ood``; the mean-loss and
norm checks here stand in for it only for weights that have no fitted score.

Imports go one way (reasons, thresholds, chars, model_checks import none of the others;
scan imports chars; text_rules imports chars, containers, embedded_instructions, scan, thresholds, word_shapes;
containers and word_shapes import none; detector_calibration imports
model_checks; request_words and instruction_probe import none; language_rule imports chars);
none imports this package's ``__init__``.
"""

from __future__ import annotations

import hashlib

from .detector_calibration import DetectorCalibration
from .embedded_instructions import rule_patterns
from .model_checks import loss_anomaly_reason, norm_anomaly_reason, router_instability_reason
from .reasons import REASONS, first_reason
from .text_rules import special_token_patterns, text_anomaly_reason, text_anomaly_reasons
from .thresholds import DEFAULT_INJECTION_PATTERNS, DEFAULT_SPECIAL_TOKEN_PATTERNS, TextThresholds


def text_rules_fingerprint(thresholds: TextThresholds = TextThresholds()) -> str:
    """A short fingerprint of the text rules that run: the reasons they can give and every
    threshold, the embedded-instruction rule's patterns and what tells a named special token from
    a used one. A report or record carrying it says
    which rule set judged its prompts (the rules change between stops; the packaged score's file
    name does not)."""
    return hashlib.sha256(repr((REASONS, thresholds, rule_patterns(), special_token_patterns())).encode()).hexdigest()[:12]


__all__ = [
    "text_rules_fingerprint",
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
