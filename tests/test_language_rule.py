"""Protective degradation's language rule (reference_engine/degradation/language_rule.py): which
prompts get a margin, and that a missing, damaged or foreign rule file gives none."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reference_engine.degradation import language_rule as lr

D = 8


def _unit(i: int, tilt: int | None = None) -> np.ndarray:
    v = np.zeros(D, np.float32)
    v[i] = 1.0
    if tilt is not None:
        v[tilt] = 0.2
    return v / np.linalg.norm(v)


# a bank of three languages along three axes: English (KL 0.10), Swahili, which pruning spares as
# it spares English (0.12), and German, which it hurts (0.50)
BANK = np.stack([_unit(0, 3)] * 3 + [_unit(1, 3)] * 3 + [_unit(2, 3)] * 3)
RULE = lr.LanguageRule(27, BANK, np.array([0.1] * 3 + [0.12] * 3 + [0.5] * 3, np.float32),
                       ("en",) * 3 + ("sw",) * 3 + ("de",) * 3, k=3, kl_ratio=1.5, min_share=0.9, min_coverage=0.8,
                       margin=1.0, info={})


@pytest.mark.parametrize("text, script, share", [
    ("Miten voin vaihtaa salasanani?", "Latin", 1.0),
    ("Как мне сменить пароль?", "Cyrillic", 1.0),
    ("", None, 0.0),
    ("12345 !!!", None, 0.0),
])
def test_dominant_script(text, script, share):
    assert lr.dominant_script(text) == (script, pytest.approx(share))


@pytest.mark.parametrize("text, pooled, margin", [
    ("Nawezaje kubadilisha nenosiri langu?", {27: _unit(1)}, 1.0),  # reads as Swahili: spared
    ("Nawezaje kubadilisha nenosiri langu?", {27: 5 * _unit(1, 4)}, 1.0),  # any length, near Swahili
    ("Wie ändere ich mein Passwort?", {27: _unit(2)}, 0.0),  # reads as German: pruning hurts it more
    ("How do I change my password?", {27: _unit(0)}, 0.0),  # English-like: the yardstick, never excused
    ("Wie heißt das auf Russisch: пароль, логин, сервер, ключ", {27: _unit(1)}, 0.0),  # under 90% one script
    ("Nawezaje kubadilisha nenosiri langu?", {22: _unit(1)}, 0.0),  # no direction at the bank's block
    ("", {27: _unit(1)}, 0.0),
])
def test_margin_for(text, pooled, margin):
    assert RULE.margin_for(text, pooled) == margin


# version 4's language probe: reads axis 1 (Swahili-like) as a language, axis 5 (a cipher-like
# direction near Swahili's neighbours) as odd input
PROBE = lr.LanguageProbe(np.zeros(D), np.ones(D), np.eye(D)[1] * 4 - np.eye(D)[5] * 4, 0.0, threshold=1.0, margin=3.0)
PROBED = lr.LanguageRule(**{**RULE.__dict__, "probe": PROBE})


@pytest.mark.parametrize("pooled, margin", [
    (_unit(1), 3.0),  # near Swahili, read as a language: the probe's margin
    (_unit(1, 5), 3.0),  # still a language to the probe (log-odds (4 - 4 x 0.2) / 1.02 > 1)
    (np.r_[0, 0.6, 0, 0, 0, 0.8, 0, 0].astype(np.float32), 1.0),  # Swahili's neighbours, read as odd: margin
    (_unit(2), 0.0),  # German: pruning hurts it more, whatever the probe reads
    (_unit(0), 0.0),  # English-like: never excused
])
def test_margin_for_with_the_language_probe(pooled, margin):
    assert PROBED.margin_for("Nawezaje kubadilisha nenosiri langu?", {27: pooled}) == margin


def test_estimate_without_a_table_is_the_neighbours_mean_damage_over_english():
    ratio, lang = RULE.estimate(_unit(2))
    assert lang == "de" and ratio == pytest.approx(5.0)  # 0.5 against English's 0.1
    assert RULE.english_kl == pytest.approx(0.1)


# version 5: the language's measured damage must also be within the ratio: here the table says
# Swahili is hurt twice as much as English (its bank rows say 1.2x) and German no more (its rows 5x)
TABLED = lr.LanguageRule(**{**RULE.__dict__, "language_ratio": {"sw": 2.0, "de": 1.0}})


@pytest.mark.parametrize("pooled, margin", [
    (_unit(1), 0.0),  # reads as Swahili: its neighbours are within the ratio, the language is not
    (_unit(2), 0.0),  # reads as German: the language is within it, its neighbours are not
    (_unit(0), 0.0),  # English-like: never excused
])
def test_the_table_can_only_take_a_margin_away(pooled, margin):
    assert TABLED.margin_for("Nawezaje kubadilisha nenosiri langu?", {27: pooled}) == margin


def test_a_language_missing_from_the_table_is_judged_by_its_neighbours():
    rule = lr.LanguageRule(**{**RULE.__dict__, "language_ratio": {"de": 1.0}})
    assert rule.margin_for("Nawezaje kubadilisha nenosiri langu?", {27: _unit(1)}) == 1.0
    assert lr.LanguageRule(**{**RULE.__dict__, "language_ratio": {"sw": 1.4}}).margin_for(
        "Nawezaje kubadilisha nenosiri langu?", {27: _unit(1)}) == 1.0  # both within 1.5


# version 6: Swahili's neighbours here are three rows at 0.2 (2x English: over the ratio); the table
# pools Swahili at 1.2x. Agreeing neighbours stand in for their own mean, not for the table.
AGREED = lr.LanguageRule(**{**RULE.__dict__, "kl": np.array([0.1] * 3 + [0.2] * 3 + [0.5] * 3, np.float32),
                            "language_ratio": {"sw": 1.2, "de": 3.0}, "agree_neighbours": 3, "agree_ratio": 1.25})


@pytest.mark.parametrize("change, margin", [
    ({}, 1.0),  # all 3 neighbours Swahili, the table within 1.25x: spared although their mean is 2x
    ({"agree_neighbours": None, "agree_ratio": None}, 0.0),  # version 5: the neighbours' mean decides
    ({"language_ratio": {"sw": 1.3, "de": 3.0}}, 0.0),  # the table over the agreement's bound
    ({"language_ratio": {"sw": 1.6, "de": 3.0}, "agree_ratio": 2.0}, 0.0),  # or over the ratio: never spared
    ({"language_ratio": {"de": 3.0}}, 0.0),  # a language the table lacks: its neighbours alone decide
])
def test_agreeing_neighbours_stand_in_for_their_mean(change, margin):
    rule = lr.LanguageRule(**{**AGREED.__dict__, **change})
    assert rule.margin_for("Nawezaje kubadilisha nenosiri langu?", {27: _unit(1)}) == margin


def test_agreement_counts_the_neighbours_of_the_language():
    # k = 4 over 3 Swahili rows and an English one: 3 agree, so 3 is enough and 4 is not
    near = lr.LanguageRule(**{**AGREED.__dict__, "k": 4})
    assert near.neighbours(_unit(1))[1:] == ("sw", 3)
    assert near.margin_for("Nawezaje kubadilisha nenosiri langu?", {27: _unit(1)}) == 1.0
    strict = lr.LanguageRule(**{**near.__dict__, "agree_neighbours": 4})
    assert strict.margin_for("Nawezaje kubadilisha nenosiri langu?", {27: _unit(1)}) == 0.0


def test_save_and_load_round_trip(tmp_path):
    sha = "ab" * 32
    path = lr.rule_path(tmp_path / "data", sha)
    lr.save(path, sha, RULE)
    back = lr.load(path, sha)
    assert back is not None and back.lang == RULE.lang and back.k == 3 and back.margin == 1.0
    np.testing.assert_allclose(back.bank, RULE.bank, atol=1e-3)  # stored as float16
    assert not list(path.parent.glob("*.tmp*"))  # written through a temporary file
    assert back.probe is None
    lr.save(path, sha, PROBED)
    back = lr.load(path, sha)
    assert back.probe is not None and back.probe.threshold == 1.0 and back.probe.margin == 3.0
    np.testing.assert_array_equal(back.probe.coef, PROBE.coef)
    assert back.margin_for("Nawezaje kubadilisha nenosiri langu?", {27: _unit(1)}) == 3.0
    assert back.language_ratio is None
    lr.save(path, sha, TABLED)
    assert lr.load(path, sha).language_ratio == {"sw": 2.0, "de": 1.0}
    assert lr.load(path, sha).agree_neighbours is None
    lr.save(path, sha, AGREED)
    back = lr.load(path, sha)
    assert (back.agree_neighbours, back.agree_ratio) == (3, 1.25)
    assert back.margin_for("Nawezaje kubadilisha nenosiri langu?", {27: _unit(1)}) == 1.0


def test_load_refuses_missing_damaged_and_foreign_files(tmp_path):
    sha = "ab" * 32
    path = lr.rule_path(tmp_path, sha)
    assert lr.load(path, sha) is None  # missing
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a zip")
    assert lr.load(path, sha) is None  # damaged
    lr.save(path, sha, RULE)
    assert lr.load(path, sha) is not None
    assert lr.load(path, "cd" * 32) is None  # other weights

    def rewrite(**meta_change):
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        meta = {**json.loads(str(arrays["meta"])), **meta_change}
        np.savez(path.with_suffix(""), **{**arrays, "meta": np.array(json.dumps(meta))})
        return path  # np.savez appends .npz

    assert lr.load(rewrite(version=lr.VERSION + 1), sha) is None  # other version
    assert lr.load(rewrite(version=lr.VERSION, margin=None), sha) is None  # a field of the wrong type
    assert lr.load(rewrite(version=lr.VERSION, margin=1.0, language_ratio={"sw": "x"}), sha) is None
    assert lr.load(rewrite(language_ratio={"sw": float("nan")}), sha) is None  # a damage that is not a number
    assert lr.load(rewrite(language_ratio={"sw": 1.2}), sha).language_ratio == {"sw": 1.2}
    assert lr.load(rewrite(agreement={"neighbours": 9, "ratio": 1.25}), sha) is None  # more than the k asked
    assert lr.load(rewrite(agreement={"neighbours": 2.5, "ratio": 1.25}), sha) is None  # not a count
    assert lr.load(rewrite(agreement={"neighbours": 2, "ratio": float("inf")}), sha) is None
    assert lr.load(rewrite(agreement={"neighbours": 2}), sha) is None  # no bound
    assert lr.load(rewrite(agreement={"neighbours": 2, "ratio": 1.25}), sha).agree_neighbours == 2
    lr.save(path, sha, lr.LanguageRule(27, BANK[:4], RULE.kl[:3], RULE.lang[:3], 3, 1.5, 0.9, 0.8, 1.0, {}))
    assert lr.load(path, sha) is None  # bank and damage of different lengths
    lr.save(path, sha, lr.LanguageRule(27, BANK[3:6], RULE.kl[3:6], RULE.lang[3:6], 3, 1.5, 0.9, 0.8, 1.0, {}))
    assert lr.load(path, sha) is None  # no English rows: no yardstick
    short = lr.LanguageProbe(np.zeros(D - 1), np.ones(D - 1), np.ones(D - 1), 0.0, 1.0, 3.0)
    lr.save(path, sha, lr.LanguageRule(**{**RULE.__dict__, "probe": short}))
    assert lr.load(path, sha) is None  # a probe of another width than the bank


def test_the_packaged_rule_loads_for_the_embedded_weights():
    from pathlib import Path

    import reference_engine

    data = Path(reference_engine.__file__).parent / "data" / "calibration"
    files = sorted(data.glob(f"*-language-damage-v{lr.VERSION}.npz"))
    assert files, f"no packaged language rule in {data}"
    with np.load(files[0]) as z:
        sha = json.loads(str(z["meta"]))["weights_sha256"]
    rule = lr.load(files[0], sha)
    assert rule is not None and rule.margin > 0 and 0 < rule.min_coverage <= 1 and rule.k >= 1
    assert len(rule.bank) == len(rule.lang) >= 100 and "en" in rule.lang
    # the splits it was fitted and chosen on are named, and none is a split this rule was reported on
    # blind or one held out for a report. A refit may use a split reported for an earlier rule; then
    # it edits this set, on purpose (stop 61's language probe is fitted on 12-05f and 12-05g, reported
    # for versions 2 and 3, and on 12-06k-m, reported for the detector before it).
    info = rule.info
    probe_fit = set(info.get("probe", {}).get("fitted_on", ()))
    assert set(info["fitted_on"]).isdisjoint(info["chosen_on"]) and probe_fit.isdisjoint(info["chosen_on"])
    assert rule.probe is None or probe_fit  # a probe names its fit
    table_fit = set(info.get("language_ratio", {}).get("fitted_on", ()))
    assert rule.language_ratio is None or table_fit  # a damage table names its fit
    assert table_fit.isdisjoint(info["chosen_on"])
    used = set(info["fitted_on"]) | set(info["chosen_on"]) | probe_fit | table_fit
    assert used.isdisjoint({"degradation_heldout_2026-12-04d", "degradation_heldout_2026-12-05",
                            "degradation_heldout_2026-12-05b", "degradation_heldout_2026-12-05c",
                            "degradation_heldout_2026-12-05d", "degradation_heldout_2026-12-05e"})
    from rsp_bench.degradation_report import REPORTED_SPLIT

    assert Path(REPORTED_SPLIT).parent.name not in used, "the language rule used the split the README reports"
    # a split with no report in results/ is held out for one (12-07f when stop 65 reported 12-07e): never used
    results = Path(reference_engine.__file__).parents[1] / "results"
    unreported = sorted(s for s in used if not (results / f"{s}.json").exists())
    assert not unreported, f"the language rule was fitted or chosen on unreported (held-out) splits: {unreported}"


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
def test_judge_applies_the_margin_only_to_covered_prompts(tiny_engine, tiny_prefill, over, margin, covered, expected):
    from reference_engine import ood

    eng = tiny_engine
    ids, lo, hi, hidden = tiny_prefill("Miten voin vaihtaa salasanani tässä sovelluksessa nyt heti?")
    n_words = int(round(covered * (hi - lo)))
    seen: list[float] = []
    reason = ood.judge(_FixedScore(over), eng.weights, hidden, 0, 0, ids, lo, hi, 60, eng._pieces, frozenset(),
                       lambda: list(range(lo, lo + n_words)), None,
                       (lambda stats: seen.append(stats) or margin), 0.9)
    assert reason == expected
    # the rule is asked with the whole prompt's stats, whose pooled directions it looks up
    assert all(isinstance(x, ood.PromptStats) and x.pooled for x in seen)
