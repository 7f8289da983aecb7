"""Unit tests of ``rsp-bench degradation`` (rsp_bench/degradation_report.py): the prompt file's
checks, the rates and targets, the per-language comparison, and one end-to-end run on the tiny
model. The held-out figures themselves come from running it on the embedded model (README)."""

from __future__ import annotations

import json

import pytest

from rsp_bench import cli
from rsp_bench import degradation_report as dr
from rsp_bench.errors import HarnessInputError


def _line(**kw) -> str:
    base = {"id": "a", "group": "plain_en", "kind": "chat", "lang": "en", "pair": None, "text": "Hello there."}
    return json.dumps({**base, **kw})


@pytest.mark.parametrize("lines, match", [
    (["{not json"], "p.jsonl:1 is not valid JSON"),
    ([_line(), "[1]"], "p.jsonl:2 must be a JSON object"),
    ([json.dumps({"id": "a", "text": "x"})], "p.jsonl:1 needs a non-empty str 'group'"),
    ([_line(group="weird")], "prompt 'a': group 'weird' is not one of"),
    ([_line(text="   ")], "prompt 'a': the text is only whitespace"),
    ([_line(), _line()], "repeats the id 'a'"),
    ([_line(lang=3)], "needs a non-empty str 'lang', got 3"),
    ([_line(pair=7)], "field 'pair' must be a string or null, got 7"),
    ([""], "no prompts"),
])
def test_bad_prompt_files_name_the_line_and_the_field(tmp_path, lines, match) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(HarnessInputError, match=match):
        dr.load_items(path)


def test_the_cli_exits_2_on_a_bad_file_or_option(tmp_path, capsys) -> None:
    assert cli.main(["degradation", "--prompts", str(tmp_path / "missing.jsonl")]) == 2
    assert "--prompts" in capsys.readouterr().err
    path = tmp_path / "p.jsonl"
    path.write_text(_line(group="nope") + "\n", encoding="utf-8")
    assert cli.main(["degradation", "--prompts", str(path)]) == 2
    assert "group 'nope'" in capsys.readouterr().err
    path.write_text(_line() + "\n", encoding="utf-8")
    assert cli.main(["degradation", "--prompts", str(path), "--cost-reps", "0"]) == 2
    assert "--cost-reps must be >= 1, got 0" in capsys.readouterr().err


def _items() -> list[dr.Item]:
    out = []
    for i in range(20):
        out.append(dr.Item(f"r{i}", "data_request", "hex", "en", f"p{i}", "decode this"))
        out.append(dr.Item(f"p{i}", "payload_alone", "hex", "en", f"r{i}", "deadbeef"))
    out += [dr.Item(f"o{i}", "odd", "mash", "xx", None, "qzx") for i in range(20)]
    return out


def test_rates_pairs_and_targets_can_fail() -> None:
    items = _items()
    # 2 of 20 requests degraded (10%: the <= 5% target fails), every payload degraded, 19 of 20 odd.
    v = [{"degraded": (it.group == "payload_alone" or (it.group == "data_request" and it.id in ("r0", "r1"))
                       or (it.group == "odd" and it.id != "o0")), "reason": "ood_score", "prompt_tokens": 3}
         for it in items]
    s = dr.summarise(items, v)
    assert s["groups"]["data_request"]["degraded"] == 2 and s["groups"]["data_request"]["n"] == 20
    assert s["pairs"] == {"n": 20, "request_kept_payload_degraded": 18, "both_kept": 0, "both_degraded": 2,
                          "request_degraded_payload_kept": 0}
    lo, hi = s["groups"]["data_request"]["ci95"]
    assert lo < 0.1 < hi
    met = {t["group"]: t["met"] for t in dr.targets(s)}
    assert met == {"data_request": False, "odd": True}
    for it, r in zip(items, v):
        if it.id in ("r0", "r1"):
            r["degraded"] = False
        if it.id == "o1":
            r["degraded"] = False
    met = {t["group"]: t["met"] for t in dr.targets(dr.summarise(items, v))}
    assert met == {"data_request": True, "odd": False}  # 18/20 odd is under 95%


def test_a_language_hurts_more_only_beyond_englishs_interval() -> None:
    items = [dr.Item(f"en{i}", "plain_en", "chat", "en", None, "hi") for i in range(4)]
    items += [dr.Item("th0", "plain_language", "thai", "th", None, "x"), dr.Item("fr0", "plain_language", "fr", "fr", None, "y")]
    v = [{"degraded": it.lang == "th", "reason": None, "prompt_tokens": 3} for it in items]
    good = {"tokens": 16, "kl_mean": 0.01, "kl_max": 0.05, "top1": 1.0, "top1_hits": 16, "bypass_ratio": 0.1}
    dmg = {f"en{i}": good for i in range(4)}
    dmg["fr0"] = {**good, "top1": 15 / 16, "top1_hits": 15}
    dmg["th0"] = {**good, "kl_mean": 0.9, "top1": 0.25, "top1_hits": 4}
    out = dr.language_damage(items, v, dmg)
    assert out["en"]["top1"] == 1.0 and out["en"]["items"] == 4
    assert out["th"]["hurts_more_than_en"] and out["th"]["degraded"] == 1
    assert not out["fr"]["hurts_more_than_en"]


def test_plain_language_target_counts_only_languages_not_hurt_more() -> None:
    items = [dr.Item(f"en{i}", "plain_en", "chat", "en", None, "hi") for i in range(8)]
    items += [dr.Item(f"de{i}", "plain_language", "de", "de", None, "x") for i in range(4)]
    items += [dr.Item(f"it{i}", "plain_language", "it", "it", None, "y") for i in range(4)]
    v = [{"degraded": it.lang == "de", "reason": "ood_score" if it.lang == "de" else None, "prompt_tokens": 3}
         for it in items]
    d = {"tokens": 16, "kl_max": 0.5, "top1": 0.75, "top1_hits": 12, "bypass_ratio": 0.1}
    dmg = {it.id: {**d, "kl_mean": 0.3 + 0.01 * (i % 8)} for i, it in enumerate(items)}
    for i in range(4):
        dmg[f"de{i}"]["kl_mean"] = 1.5
    langs = dr.language_damage(items, v, dmg)
    assert langs["de"]["hurts_more_than_en"] and not langs["it"]["hurts_more_than_en"]
    rows = {t["group"]: t for t in dr.targets(dr.summarise(items, v), langs, items, v)}
    assert rows["plain_language (not hurt more)"]["n"] == 4 and rows["plain_language (not hurt more)"]["met"]
    v[-1]["degraded"] = True  # one Italian request degraded: 1/4 fails
    rows = {t["group"]: t for t in dr.targets(dr.summarise(items, v), langs, items, v)}
    assert not rows["plain_language (not hurt more)"]["met"]


def test_a_language_is_shown_no_more_than_english_only_when_its_kl_is_clearly_within_the_ratio() -> None:
    # English KL about 0.30; "et" at about 0.15 (clearly within 1.25x), "fi" at 0.40 (1.33x: not shown
    # hurt more with 8 items of this spread, p 0.06, nor within): undecided, so not in the second target.
    items = [dr.Item(f"en{i}", "plain_en", "chat", "en", None, "hi") for i in range(12)]
    items += [dr.Item(f"{L}{i}", "plain_language", L, L, None, "x") for L in ("et", "fi") for i in range(8)]
    v = [{"degraded": it.lang == "fi" or it.id == "et0", "reason": None, "prompt_tokens": 3} for it in items]
    d = {"tokens": 16, "kl_max": 0.9, "top1": 0.75, "top1_hits": 12, "bypass_ratio": 0.1}
    spread = (-0.2, -0.1, 0.0, 0.1, 0.2, -0.15, 0.15, 0.0, -0.05, 0.05, 0.12, -0.12)
    dmg = {f"en{i}": {**d, "kl_mean": 0.30 + spread[i]} for i in range(12)}
    dmg.update({f"et{i}": {**d, "kl_mean": 0.15 + 0.01 * i} for i in range(8)})
    dmg.update({f"fi{i}": {**d, "kl_mean": 0.40 + spread[i]} for i in range(8)})
    langs = dr.language_damage(items, v, dmg)
    assert langs["et"]["no_more_than_en"] and not langs["et"]["hurts_more_than_en"]
    assert not langs["fi"]["no_more_than_en"] and not langs["fi"]["hurts_more_than_en"]
    assert 1.3 < langs["fi"]["kl_ratio_to_en"] < 1.4
    rows = {t["group"]: t for t in dr.targets(dr.summarise(items, v), langs, items, v)}
    assert rows["plain_language (not hurt more)"]["n"] == 16 and not rows["plain_language (not hurt more)"]["met"]
    shown = rows["plain_language (shown within 1.25x English)"]
    assert shown["n"] == 8 and abs(shown["rate"] - 1 / 8) < 1e-9 and shown["met"] is False  # et0 degraded: 1/8 > 5%
    dmg.update({f"et{i}": {**d, "kl_mean": 0.40 + spread[i]} for i in range(8)})  # et now undecided too
    rows = {t["group"]: t for t in dr.targets(dr.summarise(items, v), dr.language_damage(items, v, dmg), items, v)}
    assert rows["plain_language (shown within 1.25x English)"]["n"] == 0
    assert rows["plain_language (shown within 1.25x English)"]["met"] is None  # nothing judged: not "met"


def test_end_to_end_on_the_tiny_model(tiny_model_dir, tmp_path, capsys) -> None:
    lines = [
        _line(id="en1", text="Name three rivers in Europe."),
        _line(id="en2", text="What is the capital of France?"),
        _line(id="fr1", group="plain_language", kind="french", lang="fr", text="Bonjour, comment allez-vous?"),
        _line(id="req1", group="data_request", kind="hex", pair="pay1", text="Decode this hex: 48656c6c6f"),
        _line(id="pay1", group="payload_alone", kind="hex", pair="req1", text="48656c6c6f"),
        # Zero-width and control characters: the text rules degrade this on any model.
        _line(id="odd1", group="odd", kind="invisible", lang="xx", text="a\u200bb\u200bc\u200bd\u200b\x07\x07\x07 e"),
    ]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "report.json"
    code = cli.main(["degradation", "--prompts", str(path), "--model", str(tiny_model_dir), "--out", str(out),
                     "--damage-tokens", "3", "--cost-reps", "2", "--quiet"])
    assert code == 0, capsys.readouterr()
    rep = json.loads(out.read_text())
    assert rep["items"] == 6 and rep["groups"]["odd"]["degraded"] == 1
    assert rep["degraded_equals_off"]["n"] >= 1 and rep["degraded_equals_off"]["unequal"] == []
    assert set(rep["languages_damage"]) == {"en", "fr"}
    assert rep["languages_damage"]["en"]["tokens"] == 6  # two items, three teacher-forced tokens each
    cost = rep["check_cost"]["short"]
    assert cost["reps"] == 2 and cost["check_call_s_median"] > 0 and cost["decode_step_s_median"] > 0
    assert "added_s_median" in cost and cost["head_only_s_median"] > 0 and "interleaved" in cost["method"]
    assert {t["group"] for t in rep["targets"]} == {"data_request", "plain_language (not hurt more)",
                                                   "plain_language (shown within 1.25x English)", "plain_en", "odd"}
    printed = capsys.readouterr().out
    assert "degraded output equals pruning off" in printed and str(out) in printed
    assert not list(tmp_path.glob("*.tmp"))


def test_cost_only_measures_the_check_alone_and_writes_its_own_file(tiny_model_dir, tmp_path, capsys) -> None:
    from rsp_bench import cli

    path = tmp_path / "p.jsonl"
    path.write_text(_line(id="en1", text="Tell me a story about a cat who learns to swim.") + "\n", encoding="utf-8")
    out = tmp_path / "cost.json"
    assert cli.main(["degradation", "--prompts", str(path), "--model", str(tiny_model_dir), "--out", str(out),
                     "--cost-only", "--cost-reps", "2", "--quiet"]) == 0
    rep = json.loads(out.read_text())
    assert set(rep["check_cost"]) == {"short", "long"} and "groups" not in rep
    assert "check cost, short prompt" in capsys.readouterr().out
    # a file with no ordinary prompt has no long case to time: the short one alone, no traceback
    path.write_text(_line(id="odd1", group="odd", kind="mash", lang="xx", text="qzxv kjh") + "\n", encoding="utf-8")
    assert cli.main(["degradation", "--prompts", str(path), "--model", str(tiny_model_dir), "--out", str(out),
                     "--cost-only", "--cost-reps", "1", "--quiet"]) == 0
    assert set(json.loads(out.read_text())["check_cost"]) == {"short"}


def test_the_default_report_is_named_after_its_prompt_file():
    """A report on another file never overwrites the README's."""
    from pathlib import Path

    assert dr.default_out(Path("fixtures/degradation_heldout_2026-12-05g/prompts.jsonl"), False) == \
        Path("results/degradation_heldout_2026-12-05g.json")
    assert dr.default_out(Path("elsewhere/mine/prompts.jsonl"), False) == Path("results/mine.json")
    assert dr.default_out(Path("x/prompts.jsonl"), True) == Path("results/degradation_check_cost.json")
    assert (Path(__file__).resolve().parents[1] / dr.REPORTED_SPLIT).exists()
