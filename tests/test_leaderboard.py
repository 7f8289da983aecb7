"""Tests of rsp_bench.leaderboard (rows, tables, plot, byte-for-byte rebuilds) and the baseline CLI glue.

Must not import torch, transformers or reference_engine.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest

from rsp_bench.errors import HarnessInputError
from rsp_bench.leaderboard import (
    COLUMNS,
    MISSING,
    build_leaderboard,
    configure_baseline_parser,
    configure_leaderboard_parser,
    run_baseline,
    run_leaderboard,
    write_leaderboard,
)
from rsp_bench.records import RunRecordBuilder, load_record, write_record

MACHINE = {"fingerprint": "f00dfeed0001", "hostname": "h", "platform": "p", "cpu": "c", "cores": 2,
           "memory_gb": 8.0, "gpu": None}
VERSIONS = {"python": "3.11", "torch": None, "transformers": None, "rsp_bench": "0.1"}


def _record(run_id: str, created: str, figures: dict[str, dict[str, float]], model: str = "tiny",
            quick: bool = False) -> dict:
    b = RunRecordBuilder(model_name=model, machine=MACHINE, commit=None, versions_info=VERSIONS,
                         run_id=run_id, created_utc=created, quick=quick)
    for config, metrics in figures.items():
        for name, value in metrics.items():
            b.add_metric(config, name, value, n=10)
    return b.build(wall_time_s=1.0)


def _records() -> list[dict]:
    old = _record("20250101T000000Z-000001", "2025-01-01T00:00:00+00:00", {
        "reference/off": {"top1_agreement": 1.0, "speedup_vs_off": 1.0, "exact_match_rate": 1.0},
        "reference/lossy/s=0.50": {"top1_agreement": 0.80, "speedup_vs_off": 1.10},
        "static-shortgpt/k=3": {"top1_agreement": 0.66, "speedup_vs_off": 1.12,
                                "projected_tokens_per_s_H100": 4321.4, "projected_idle_fraction_H100": 0.4321},
    })
    new = _record("20250201T000000Z-000002", "2025-02-01T00:00:00+00:00", {
        "reference/lossy/s=0.50": {"top1_agreement": 0.91, "speedup_vs_off": 1.25, "kl_mean": 0.05,
                                   "squad_f1_delta": -0.012, "bypass_ratio": 0.2},
        "hf-generate/off": {"top1_agreement": 1.0},
    }, quick=True)
    other_model = _record("20250115T000000Z-000003", "2025-01-15T00:00:00+00:00", {
        "reference/lossy/s=0.50": {"top1_agreement": 0.7, "speedup_vs_off": 1.3},
    }, model="other<model>")
    return [new, old, other_model]


def test_one_row_per_model_engine_config_newest_record_wins() -> None:
    rows = build_leaderboard(_records())
    keys = [(r["model"], r["engine"], r["config"]) for r in rows]
    assert keys == [
        ("other<model>", "reference", "reference/lossy/s=0.50"),
        ("tiny", "hf-generate", "hf-generate/off"),
        ("tiny", "reference", "reference/lossy/s=0.50"),
        ("tiny", "reference", "reference/off"),
        ("tiny", "static-shortgpt", "static-shortgpt/k=3"),
    ]
    lossy = rows[2]
    assert lossy["top-1 agreement"] == "0.910" and lossy["measured CPU speed-up"] == "1.25×"
    assert lossy["KL mean (nats)"] == "0.0500" and lossy["SQuAD F1 Δ"] == "-0.012"
    assert lossy["record"] == "20250201T000000Z-000002 (quick)"
    # A configuration only the older run had keeps that run's figures and says so.
    static = rows[4]
    assert static["record"] == "20250101T000000Z-000001"
    assert static["projected tok/s H100"] == "4,321" and static["projected idle H100"] == "0.432"
    assert static["exact match"] == MISSING and static["projected tok/s V100"] == MISSING
    assert list(rows[0]) == ["model", "engine", "config", *(c[0] for c in COLUMNS), "record"]


def test_headers_label_projections_and_cover_the_issue_columns() -> None:
    headers = [c[0] for c in COLUMNS]
    assert all("projected" in h for h, m, _ in COLUMNS if m.startswith("projected_"))
    for profile in ("V100", "A100", "H100"):
        assert f"projected tok/s {profile}" in headers and f"projected idle {profile}" in headers
    for needed in ("exact match", "top-1 agreement", "KL mean (nats)", "SQuAD F1 Δ", "JSON-field F1 Δ",
                   "bypass ratio", "measured CPU speed-up", "degradation FP rate", "degradation detection"):
        assert needed in headers


def _digests(paths: dict[str, Path]) -> dict[str, str]:
    return {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in paths.items()}


def test_rebuilding_from_the_same_records_gives_the_same_bytes(tmp_path: Path) -> None:
    results = tmp_path / "results"
    for record in _records():
        write_record(record, results)
    first = write_leaderboard(results, tmp_path / "one")
    assert sorted(first) == ["html", "md", "png"]
    digests = _digests(first)
    # Same records, given as objects in another order, into another folder: same bytes.
    second = write_leaderboard(list(reversed(_records())), tmp_path / "two")
    assert _digests(second) == digests
    png = first["png"].read_bytes()
    assert png.startswith(b"\x89PNG") and b"Matplotlib" not in png and b"Software" not in png
    # A changed figure changes the outputs (the test can fail).
    changed = _records()
    changed[0]["configurations"]["reference/lossy/s=0.50"]["metrics"]["speedup_vs_off"]["value"] = 1.5
    fourth = _digests(write_leaderboard(changed, tmp_path / "four"))
    assert fourth["md"] != digests["md"] and fourth["png"] != digests["png"]


def test_markdown_and_html_content(tmp_path: Path) -> None:
    paths = write_leaderboard(_records(), tmp_path)
    md = paths["md"].read_text(encoding="utf-8")
    assert "| model" in md and "20250201T000000Z-000002 (quick)" in md and "(quality_vs_speed.png)" in md
    assert "projected" in md and "not measured" in md
    page = paths["html"].read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>\n")
    assert "other&lt;model&gt;" in page and "other<model>" not in page
    assert '<img src="quality_vs_speed.png"' in page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leaderboard.html", "leaderboard.md", "quality_vs_speed.png"]


def test_empty_input_still_writes_valid_files(tmp_path: Path) -> None:
    paths = write_leaderboard([], tmp_path)
    assert "none" in paths["md"].read_text(encoding="utf-8")
    assert paths["png"].read_bytes().startswith(b"\x89PNG")


# --------------------------------------------------------------------------- CLI glue


def _parse(configure, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(argv)


def test_leaderboard_cli_prints_the_table_and_writes_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    for record in _records():
        write_record(record, results)
    assert run_leaderboard(_parse(configure_leaderboard_parser, ["--results", str(results)])) == 0
    out = capsys.readouterr().out
    assert out.startswith("| model") and "static-shortgpt/k=3" in out
    assert (results / "leaderboard.md").exists() and (results / "quality_vs_speed.png").exists()
    with pytest.raises(HarnessInputError, match="no run records"):
        run_leaderboard(_parse(configure_leaderboard_parser, ["--results", str(tmp_path / "none")]))


def test_baseline_cli_update_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    record_path = write_record(_records()[0], results)
    assert run_baseline(_parse(configure_baseline_parser, ["show", "--results", str(results)])) == 0
    assert "no baselines" in capsys.readouterr().out
    assert run_baseline(_parse(configure_baseline_parser, ["update", str(record_path), "--results", str(results)])) == 0
    written = results / "baselines" / "tiny__f00dfeed0001.json"
    assert str(written) in capsys.readouterr().out
    assert load_record(written)["extra"]["baseline_source_run_id"] == "20250201T000000Z-000002"
    assert run_baseline(_parse(configure_baseline_parser, ["show", "--results", str(results)])) == 0
    shown = capsys.readouterr().out
    assert "tiny__f00dfeed0001.json" in shown and "20250201T000000Z-000002 (quick)" in shown


def test_rsp_bench_run_rebuilds_the_leaderboard_from_its_results_folder(tmp_path: Path, monkeypatch) -> None:
    """`rsp-bench run --results DIR` must read DIR/runs (it once read DIR/runs/runs: an empty board)."""
    import pytest as pytest_module

    from rsp_bench import cli

    for record in _records():
        write_record(record, tmp_path)
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_equivalence.py").write_text("")
    monkeypatch.setattr(pytest_module, "main", lambda argv: 0)  # the suites themselves are not under test
    assert cli.main(["run", "--results", str(tmp_path), "--suites", str(tmp_path / "suites")]) == 0
    assert f"Built from {len(_records())} run record(s)" in (tmp_path / "leaderboard.md").read_text()
