"""Protective degradation's language rule (reference_engine/degradation/language_rule.py): which
prompts get a margin, and that a missing, damaged or foreign rule file gives none."""

from __future__ import annotations

import json
import math

import pytest

from reference_engine.degradation import language_rule as lr

RULE = lr.LanguageRule({"Latin": 5.0, "Greek": 0.0}, min_share=0.9, min_coverage=0.9, margin=1.0, info={})


@pytest.mark.parametrize("text, script, share", [
    ("Miten voin vaihtaa salasanani?", "Latin", 1.0),
    ("Как мне сменить пароль?", "Cyrillic", 1.0),
    ("", None, 0.0),
    ("12345 !!!", None, 0.0),
])
def test_dominant_script(text, script, share):
    assert lr.dominant_script(text) == (script, pytest.approx(share))


@pytest.mark.parametrize("text, loss, margin", [
    ("Miten voin vaihtaa salasanani?", 5.5, 1.0),  # Latin at a loss above its cut: spared
    ("Miten voin vaihtaa salasanani?", 5.0, 1.0),  # at the cut itself
    ("Miten voin vaihtaa salasanani?", 4.9, 0.0),  # Latin the model reads well: pruning hurts it more
    ("Πώς αλλάζω τον κωδικό μου;", 0.1, 1.0),  # a script spared whole (cut 0)
    ("Как мне сменить пароль?", 9.0, 0.0),  # Cyrillic: not in the spared set at any loss
    ("Wie heißt das auf Russisch: пароль, логин, сервер, ключ", 9.0, 0.0),  # Latin under 90% of the letters
    ("", 9.0, 0.0),
])
def test_margin_for(text, loss, margin):
    assert RULE.margin_for(text, loss) == margin


def test_load_refuses_missing_damaged_and_foreign_files(tmp_path):
    sha = "ab" * 32
    path = lr.rule_path(tmp_path, sha)
    assert lr.load(path, sha) is None  # missing
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert lr.load(path, sha) is None  # damaged
    good = {"version": lr.VERSION, "weights_sha256": sha, "min_loss": {"Latin": 5.25}, "min_share": 0.9,
            "min_coverage": 0.9, "margin": 1.0, "info": {"fitted_on": ["x"]}}
    path.write_text(json.dumps(good))
    rule = lr.load(path, sha)
    assert rule is not None and rule.scripts == {"Latin"} and rule.min_loss == {"Latin": 5.25} and rule.margin == 1.0
    assert lr.load(path, "cd" * 32) is None  # other weights
    path.write_text(json.dumps({**good, "version": lr.VERSION + 1}))
    assert lr.load(path, sha) is None  # other version
    path.write_text(json.dumps({**good, "margin": None}))
    assert lr.load(path, sha) is None  # a field of the wrong type
    path.write_text(json.dumps({**good, "min_loss": ["Latin"]}))
    assert lr.load(path, sha) is None  # version 1's list of scripts under version 2's field


def test_the_packaged_rule_loads_for_the_embedded_weights():
    from pathlib import Path

    import reference_engine

    data = Path(reference_engine.__file__).parent / "data" / "calibration"
    files = sorted(data.glob(f"*-script-damage-v{lr.VERSION}.json"))
    assert files, f"no packaged language rule in {data}"
    doc = json.loads(files[0].read_text())
    rule = lr.load(files[0], doc["weights_sha256"])
    assert rule is not None and rule.margin > 0 and 0 < rule.min_coverage <= 1
    # the splits it was fitted and chosen on are named, and neither is the report split
    info = rule.info
    assert set(info["fitted_on"]).isdisjoint(info["chosen_on"])
    used = set(info["fitted_on"]) | set(info["chosen_on"])
    assert used.isdisjoint({"degradation_heldout_2026-12-04d", "degradation_heldout_2026-12-05",
                            "degradation_heldout_2026-12-05b", "degradation_heldout_2026-12-05c",
                            "degradation_heldout_2026-12-05d"})  # reported blind


class _FixedScore:
    """A stand-in detector whose score is fixed: every prompt reads as odd, ``over`` above
    the threshold (the engine's real score needs the embedded weights)."""

    threshold = 0.0

    def __init__(self, over: float) -> None:
        self.over = over

    def score(self, _stats) -> float:
        return self.over

    def reason(self, _stats) -> str:
        return "ood_score"


@pytest.mark.parametrize("over, margin, covered, expected", [
    (0.5, 1.0, 1.0, None),  # a plain request under threshold + margin: excused
    (1.5, 1.0, 1.0, "ood_score"),  # above the margin: still odd
    (0.5, 0.0, 1.0, "ood_score"),  # no margin (a script the rule does not spare, or no rule)
    (0.5, 1.0, 0.5, "ood_score"),  # request words cover too little of the content: a payload
])
def test_judge_applies_the_margin_only_to_covered_prompts(tiny_engine, over, margin, covered, expected):
    import torch

    from reference_engine import ood
    from reference_engine.model import KVCache, prefill

    eng = tiny_engine
    ids = eng.encode("Miten voin vaihtaa salasanani tässä sovelluksessa nyt heti?")
    lo, hi = 1, len(ids)
    cache = KVCache.allocate(eng.dims, 1, len(ids))
    hidden: list = []
    prefill(eng.weights, cache, torch.tensor([ids]), torch.arange(len(ids))[None], torch.ones(1, len(ids), dtype=torch.bool),
            hidden_out=hidden)
    n_words = int(round(covered * (hi - lo)))
    seen: list[float] = []
    reason = ood.judge(_FixedScore(over), eng.weights, hidden, 0, 0, ids, lo, hi, 60, eng._pieces, frozenset(),
                       lambda: list(range(lo, lo + n_words)), None,
                       (lambda loss: seen.append(loss) or margin), 0.9)
    assert reason == expected
    # the rule is asked with the whole prompt's mean loss (nats), which its cut is compared with
    assert all(math.isfinite(x) and x > 0 for x in seen)
