"""After a blind report: what the rest of the detector does on the prompts that stop 66's text
rules (``prose_in_container``, ``spelled_out_word``, ``tagged_words``) fire on, with those rules
off. It reads a split's prompts, keeps those the three rules fire on, and runs them through the
engine at the default lossy configuration with the three rules' thresholds at 0 (off).

    python scripts/text_rules_effect.py fixtures/degradation_heldout_2026-12-07f/prompts.jsonl

Development only: a split this reads after its report is development from then on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEW_REASONS = ("prose_in_container", "spelled_out_word", "tagged_words")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/text_rules_effect.py PROMPTS.jsonl", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        items = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        texts = [(x["group"], x["kind"], x["text"]) for x in items]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: cannot read the prompt file {path}: {e}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    import reference_engine.protective_degradation as engine_side
    from reference_engine import Engine, PruningConfig, degradation
    from reference_engine.degradation import TextThresholds, text_anomaly_reason

    fired = [(g, k, t, text_anomaly_reason(t)) for g, k, t in texts]
    fired = [x for x in fired if x[3] in NEW_REASONS]
    without = TextThresholds(spelled_min_distinct=0, tagged_min_words=0, container_min_spans=0)

    class _WithoutNewRules:
        """The degradation package as the engine sees it, with the three rules off."""

        def __getattr__(self, name: str):
            return getattr(degradation, name)

        @staticmethod
        def text_anomaly_reason(text: str) -> str | None:
            return text_anomaly_reason(text, without)

    engine_side.degradation = _WithoutNewRules()
    engine = Engine.load(None)
    cfg = PruningConfig(mode="lossy", sensitivity=0.5, hardware_watermark=0.0)
    results = engine.generate([t for _, _, t, _ in fired], max_new_tokens=1, config=cfg) if fired else []
    print(f"{len(fired)} of {len(texts)} prompts fire stop 66's text rules; without them:")
    for (group, kind, _, reason), r in zip(fired, results):
        print(f"  {group:15s} {kind:55s} {reason:20s} -> {r.stats['degraded_reason']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
