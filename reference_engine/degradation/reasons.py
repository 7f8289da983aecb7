"""The reasons protective degradation reports: ``REASONS``, every short machine-readable
reason string a check can return, and ``first_reason``, the one reported when several fire.

Must NOT import: ``rsp_bench`` (the engine never depends on the harness), torch (the
harness and tests import this without a model), or any other module of this package.
Only stdlib.
"""

from __future__ import annotations

#: Every reason string this module can return, in the order the text checks run, then the
#: model-level ones. The engine copies the first firing one into ``degraded_reason``.
REASONS: tuple[str, ...] = (
    "empty_or_whitespace",
    "nul_byte",
    "lone_surrogate",
    "replacement_chars",
    "mojibake",
    "noncharacter",
    "control_chars",
    "bidi_override",
    "zero_width_chars",
    "unassigned_or_private",
    "combining_flood",
    "punctuation_run",
    "char_run",
    "whitespace_run",
    "emoji_flood",
    "script_mixing",
    "punctuation_flood",
    "repeated_passage",
    "stacked_words",
    "growing_lines",
    "even_letters",
    "spelled_out_word",
    "tagged_words",
    "prose_in_container",
    "special_token_text",
    "prompt_injection",
    "embedded_instruction",
    "ood_score",
    "instruction_probe",
    "prompt_loss",
    "hidden_norm",
    "router_unstable",
)


def first_reason(*reasons: str | None) -> str | None:
    """The first reason that is not None (the order of the arguments is the priority)."""
    for r in reasons:
        if r is None:
            continue
        if not isinstance(r, str) or not r:
            raise ValueError(f"a reason must be a non-empty str or None, got {r!r}")
        return r
    return None
