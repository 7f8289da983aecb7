"""Pruning's damage per language pooled over degradation reports (rsp_bench/language_damage_pool.py)
and its CLI, ``rsp-bench language-damage``."""

from __future__ import annotations

import json

import pytest

from rsp_bench import language_damage_pool as ldp
from rsp_bench.cli import main


def _split(en: float, **langs: tuple[int, float, int]) -> dict:
    """A split's per-language damage: English's KL, and per language (items, KL, degraded)."""
    return {"en": {"items": 49, "kl_mean": en},
            **{L: {"items": n, "kl_mean": kl, "degraded": deg, "hurts_more_than_en": False} for L, (n, kl, deg) in langs.items()}}


# five splits: Tagalog above its English on all five, Welsh on two, Zulu measured on three only
SPLITS = [_split(0.10, tl=(8, 0.20, 3), cy=(8, 0.09, 2), zu=(8, 0.1, 0)),
          _split(0.20, tl=(8, 0.30, 2), cy=(8, 0.25, 1), zu=(8, 0.3, 0)),
          _split(0.10, tl=(8, 0.15, 1), cy=(8, 0.11, 0), zu=(8, 0.1, 0)),
          _split(0.10, tl=(8, 0.25, 4), cy=(8, 0.08, 3)),
          _split(0.10, tl=(8, 0.12, 0), cy=(8, 0.09, 0))]


def test_sign_test_is_the_one_sided_binomial_tail():
    from rsp_bench.errors import HarnessInputError
    from rsp_bench.metrics.intervals import sign_test_greater_p

    assert sign_test_greater_p(4, 4) == 1 / 16
    assert sign_test_greater_p(0, 7) == 1.0
    assert sign_test_greater_p(5, 5) == pytest.approx(1 / 32)
    assert sign_test_greater_p(4, 5) == pytest.approx(6 / 32)
    for bad in ((6, 5), (-1, 5), (True, 5)):
        with pytest.raises(HarnessInputError):
            sign_test_greater_p(*bad)


def test_pool_weighs_each_split_english_by_the_language_items():
    pooled = ldp.pool(SPLITS)
    assert set(pooled) == {"tl", "cy", "zu"}  # English is the yardstick, not a row
    tl = pooled["tl"]
    assert tl["splits"] == 5 and tl["items"] == 40 and tl["splits_above_en"] == 5
    assert tl["ratio_to_en"] == pytest.approx((0.20 + 0.30 + 0.15 + 0.25 + 0.12) / (0.1 + 0.2 + 0.1 + 0.1 + 0.1), abs=1e-4)
    assert tl["sign_p"] == pytest.approx(1 / 32, abs=1e-6) and tl["hurt_more"] is True
    cy = pooled["cy"]
    assert cy["splits_above_en"] == 2 and cy["hurt_more"] is False
    zu = pooled["zu"]  # three splits: the sign test cannot reach 5%, so it says nothing
    assert zu["splits"] == 3 and zu["sign_p"] is None and zu["hurt_more"] is None


def test_a_split_without_english_is_left_out():
    pooled = ldp.pool([{"tl": {"items": 8, "kl_mean": 9.0}}, *SPLITS])
    assert pooled["tl"]["splits"] == 5


def test_split_by_pooled_verdict_counts_degraded_requests():
    report = {"languages_damage": {**SPLITS[3], "tl": {**SPLITS[3]["tl"], "hurts_more_than_en": True}}}
    groups = ldp.split_by_pooled_verdict(report, ldp.pool(SPLITS))
    assert groups["pooled: hurt more"] == {"degraded": 4, "n": 8, "languages": ["tl"]}
    assert groups["pooled: not hurt more"] == {"degraded": 3, "n": 8, "languages": ["cy"]}
    assert groups["pooled: hurt more / split: hurt more"]["degraded"] == 4
    assert groups["pooled: not hurt more / split: not shown hurt more"]["n"] == 8


def _write(tmp_path, name: str, damage: dict, config: dict | None = None) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"model": "m", "config": config or {"mode": "lossy", "router": "unit", "sensitivity": 0.5},
                                "languages_damage": damage}))
    return str(path)


def test_cli_pools_reports_and_writes_json(tmp_path, capsys):
    files = [_write(tmp_path, f"r{i}.json", d) for i, d in enumerate(SPLITS)]
    out = tmp_path / "pool.json"
    assert main(["language-damage", "--reports", *files[:4], "--split", files[4], "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hurt more" in text and "degraded / n" in text
    got = json.loads(out.read_text())
    assert got["languages"]["tl"]["splits"] == 5 and len(got["reports"]) == 5  # the split joins the pool
    assert got["split"]["groups"]["pooled: hurt more"]["degraded"] == 0


def test_cli_refuses_a_bad_file_or_mixed_configurations_with_exit_2(tmp_path, capsys):
    good = _write(tmp_path, "good.json", SPLITS[0])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["language-damage", "--reports", good, str(bad)]) == 2
    assert "bad.json" in capsys.readouterr().err
    other = _write(tmp_path, "other.json", SPLITS[1], {"mode": "lossy", "router": "block", "sensitivity": 0.5})
    assert main(["language-damage", "--reports", good, other]) == 2
    assert "other.json" in capsys.readouterr().err
    no_damage = tmp_path / "cost.json"
    no_damage.write_text(json.dumps({"check_cost": {}}))
    assert main(["language-damage", "--reports", str(no_damage)]) == 2
