"""Tests of rsp_bench.leaderboard (rows, tables, plot, byte-for-byte rebuilds) and the baseline CLI glue.

Must not import torch, transformers or reference_engine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest

from rsp_bench.errors import HarnessInputError
from rsp_bench.leaderboard import (
    MAIN_HEADERS,
    MISSING,
    PROJECTED_COLUMNS,
    SPEEDUP_HEADER,
    build_leaderboard,
    configure_leaderboard_parser,
    pareto_front,
    render_markdown,
    run_leaderboard,
    sections,
    what_changed,
    write_leaderboard,
)
from rsp_bench.baselines import configure_baseline_parser, run_baseline
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
        "reference/off": {"top1_agreement": 1.0, "exact_match_rate": 1.0, "decode_tokens_per_s": 12.0},
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


def _engines_run(run_id: str = "20250301T000000Z-000004", created: str = "2025-03-01T00:00:00+00:00",
                 machine: dict | None = None, seed: int = 0) -> dict:
    """One run holding every kind of row the board ranks, each against this run's reference/off."""
    b = RunRecordBuilder(model_name="tiny", machine=machine or MACHINE, commit=None, versions_info=VERSIONS,
                         run_id=run_id, created_utc=created, quick=True)
    b.set_extra("subset_seed", seed)
    rows = {
        "reference/off": ("reference", "off", {"exact_match_rate": 1.0, "top1_agreement": 1.0, "kl_mean": 0.0,
                                               "decode_tokens_per_s": 17.0, "speedup_vs_hf_generate": 1.25}),
        "reference/lossless/s=0.50": ("reference", "lossless", {"exact_match_rate": 1.0, "top1_agreement": 1.0,
                                                                "squad_f1_delta": 0.0, "speedup_vs_off": 1.5}),
        "reference/lossy/s=0.50": ("reference", "lossy", {"exact_match_rate": 0.5, "top1_agreement": 0.94,
                                                          "speedup_vs_off": 0.98}),
        "hf-generate/off": ("hf-generate", "off", {"exact_match_rate": 1.0, "top1_agreement": 1.0}),
        "static-shortgpt/k=1": ("static-shortgpt", "static", {"exact_match_rate": 0.25, "top1_agreement": 0.89}),
        "llama-cpp/f32": ("llama-cpp", "off", {"exact_match_rate": 0.875, "top1_agreement": 0.995,
                                               "speedup_vs_off": 2.6}),
        "llama-cpp/q4_1": ("llama-cpp", "off", {"exact_match_rate": 0.0, "top1_agreement": 0.80,
                                                "squad_f1_delta": -0.07, "speedup_vs_off": 7.0}),
    }
    for config, (engine, mode, metrics) in rows.items():
        for name, value in metrics.items():
            ci = (value - 0.1, value + 0.1) if name == "speedup_vs_off" else None
            b.add_metric(config, name, value, n=10, ci=ci, engine=engine, mode=mode)
    return b.build(wall_time_s=1.0)


def _section_rows(rows: list[dict], config_prefix: str = "") -> dict[str, dict]:
    return {r["configuration"]: r for r in rows if r["configuration"].startswith(config_prefix)}


def test_sections_split_models_machines_and_prompt_sets_newest_record_wins() -> None:
    secs, left_out = sections(_records())
    assert left_out == 0
    assert [(s.model, s.quick) for s in secs] == [("other<model>", False), ("tiny", True), ("tiny", False)]
    full = secs[2]
    assert [e.config for e in full.entries] == ["static-shortgpt/k=3", "reference/lossy/s=0.50", "reference/off"]
    # The quick run's figures are in their own section: never ranked against the full run's.
    quick = {e.config: e for e in secs[1].entries}
    assert set(quick) == {"reference/lossy/s=0.50", "hf-generate/off"}
    assert quick["reference/lossy/s=0.50"].value("top1_agreement") == 0.91
    newer = _record("20250102T000000Z-000009", "2025-01-02T00:00:00+00:00",
                    {"reference/lossy/s=0.50": {"top1_agreement": 0.5, "speedup_vs_off": 1.0}})
    rows = _section_rows([r for r in build_leaderboard([*_records(), newer]) if "full" in r["section"]
                          and r["section"].startswith("tiny")])
    assert rows["reference/lossy/s=0.50"]["top-1 agreement"] == "0.500"
    assert rows["reference/lossy/s=0.50"]["record"] == "20250102T000000Z-000009"
    assert rows["static-shortgpt/k=3"]["record"] == "20250101T000000Z-000001"  # only the older run had it


def test_every_engine_row_is_ranked_against_reference_off_of_its_own_run() -> None:
    rows = build_leaderboard([_engines_run()])
    order = [r["configuration"] for r in rows]
    assert order[:6] == ["llama-cpp/q4_1", "llama-cpp/f32", "reference/lossless/s=0.50", "reference/off",
                         "reference/lossy/s=0.50", "hf-generate/off"]
    by = _section_rows(rows)
    assert [by[c]["rank"] for c in order[:6]] == ["1", "2", "3", "4", "5", "6"]
    assert by["static-shortgpt/k=1"]["rank"] == MISSING  # no speed figure: listed, not ranked
    assert by["llama-cpp/q4_1"][SPEEDUP_HEADER] == "7.00× [6.90, 7.10]"
    assert by["reference/off"][SPEEDUP_HEADER] == "1.00× (anchor)"
    # hf-generate: 1 / reference/off's measured speed-up over it, labelled as derived
    assert by["hf-generate/off"][SPEEDUP_HEADER] == "0.80× (derived)"
    assert by["llama-cpp/q4_1"]["SQuAD F1 Δ"] == "-0.070"
    # exact: identical greedy output and no F1 change; lossless is, F32 llama.cpp (7/8 prompts) is not
    assert by["reference/lossless/s=0.50"]["exact"] == "yes" and by["reference/off"]["exact"] == "yes"
    assert by["llama-cpp/f32"]["exact"] == "no" and by["static-shortgpt/k=1"]["exact"] == "no"
    # Pareto: nothing is both faster and more faithful than these three
    assert {c for c, r in by.items() if r["Pareto"] == "★"} == {"llama-cpp/q4_1", "llama-cpp/f32",
                                                                  "reference/lossless/s=0.50"}


def test_pareto_front() -> None:
    pts = [(1.0, 1.0), (1.5, 1.0), (2.0, 0.9), (1.8, 0.85), (0.9, 1.0), (2.0, 0.9)]
    assert pareto_front(pts) == [1, 2, 5]
    assert pareto_front([]) == [] and pareto_front([(1.0, 0.5)]) == [0]


def test_machines_never_share_a_ratio_column_and_other_subsets_are_left_out() -> None:
    other_machine = dict(MACHINE, fingerprint="0123456789ab", cpu="other cpu")
    records = [_engines_run(), _engines_run("20250302T000000Z-000005", "2025-03-02T00:00:00+00:00", other_machine),
               _engines_run("20250303T000000Z-000006", "2025-03-03T00:00:00+00:00", seed=1)]
    secs, left_out = sections(records)
    assert left_out == 1
    assert [s.machine["fingerprint"] for s in secs] == ["0123456789ab", "f00dfeed0001"]
    for s in secs:
        assert {e.run_id for e in s.entries} == {s.records[0]["run_id"]}
    md = render_markdown(records)
    assert md.count("## tiny on machine") == 2 and "Left out: 1 record(s) drawn on other prompt subsets" in md
    assert "20250303T000000Z-000006" not in md


def test_projected_columns_are_in_their_own_labelled_table() -> None:
    assert not any("projected" in h for h in MAIN_HEADERS)
    assert all("projected" in h for h, *_ in PROJECTED_COLUMNS)
    for profile in ("V100", "A100", "H100", "H200"):
        assert f"projected tok/s {profile}" in [c[0] for c in PROJECTED_COLUMNS]
    md = render_markdown(_records())
    section = md[md.index("## tiny on machine f00dfeed0001 (c, 2 cores), full"):]
    projected = section[section.index("### Projected"):]
    assert "| static-shortgpt/k=3" in projected and "4,321" in projected and "0.432" in projected
    assert "reference/off" not in projected.split("\n\n")[1]  # rows without projections stay out


def test_what_changed_lists_figures_that_moved_and_new_configurations() -> None:
    first = _engines_run()
    second = _engines_run("20250305T000000Z-000007", "2025-03-05T00:00:00+00:00")
    second["configurations"]["llama-cpp/q4_1"]["metrics"]["top1_agreement"]["value"] = 0.70
    del second["configurations"]["static-shortgpt/k=1"]
    second["configurations"]["llama-cpp/q8_0"] = json.loads(json.dumps(second["configurations"]["llama-cpp/f32"]))
    section = sections([first, second])[0][0]
    changed = what_changed(section)
    assert changed[0] == "20250305T000000Z-000007 against 20250301T000000Z-000004:"
    assert "new configurations: llama-cpp/q8_0" in changed
    assert "not in the newest run (older figures kept): static-shortgpt/k=1" in changed
    assert "llama-cpp/q4_1: top-1 agreement 0.800 → 0.700" in changed
    assert len(changed) == 4
    assert what_changed(sections([first])[0][0]) == []
    same = sections([first, _engines_run("20250306T000000Z-000008", "2025-03-06T00:00:00+00:00")])[0][0]
    assert what_changed(same)[1:] == ["no figure the board shows changed"]
    md = render_markdown([first, second])
    assert "- llama-cpp/q4_1: top-1 agreement 0.800 → 0.700" in md


def _digests(paths: dict[str, Path]) -> dict[str, str]:
    return {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in paths.items()}


def test_rebuilding_from_the_same_records_gives_the_same_bytes(tmp_path: Path) -> None:
    results = tmp_path / "results"
    for record in [*_records(), _engines_run()]:
        write_record(record, results)
    first = write_leaderboard(results, tmp_path / "one")
    assert sorted(first) == ["html", "md", "png"]
    digests = _digests(first)
    # Same records, given as objects in another order, into another folder: same bytes.
    second = write_leaderboard(list(reversed([*_records(), _engines_run()])), tmp_path / "two")
    assert _digests(second) == digests
    png = first["png"].read_bytes()
    assert png.startswith(b"\x89PNG") and b"Matplotlib" not in png and b"Software" not in png
    # A changed figure changes the outputs (the test can fail).
    changed = [*_records(), _engines_run()]
    changed[-1]["configurations"]["reference/lossy/s=0.50"]["metrics"]["speedup_vs_off"]["value"] = 1.3
    fourth = _digests(write_leaderboard(changed, tmp_path / "four"))
    assert fourth["md"] != digests["md"] and fourth["png"] != digests["png"]
    # Marking a configuration exact changes the plot (its marker), not only the table.
    exact = [*_records(), _engines_run()]
    exact[-1]["configurations"]["llama-cpp/f32"]["metrics"]["exact_match_rate"]["value"] = 1.0
    assert _digests(write_leaderboard(exact, tmp_path / "five"))["png"] != digests["png"]


def test_markdown_and_html_content(tmp_path: Path) -> None:
    paths = write_leaderboard(_records(), tmp_path)
    md = paths["md"].read_text(encoding="utf-8")
    assert "| rank" in md and "quick prompt set" in md and "(quality_vs_speed.png)" in md
    assert "projected" in md and "not measured" in md
    page = paths["html"].read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>\n")
    assert "other&lt;model&gt;" in page and "other<model>" not in page
    assert '<img src="quality_vs_speed.png"' in page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leaderboard.html", "leaderboard.md", "quality_vs_speed.png"]


def test_partial_records_are_marked() -> None:
    record = _engines_run()
    record["extra"]["partial"] = "session ended with INTERRUPTED"
    rows = _section_rows(build_leaderboard([record]))
    assert rows["reference/off"]["record"] == "20250301T000000Z-000004 (partial)"


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
    assert out.startswith("# rsp-bench leaderboard") and "| static-shortgpt/k=3" in out
    assert (results / "leaderboard.md").exists() and (results / "quality_vs_speed.png").exists()
    with pytest.raises(HarnessInputError, match="no run records"):
        run_leaderboard(_parse(configure_leaderboard_parser, ["--results", str(tmp_path / "none")]))


def test_baseline_cli_update_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    record_path = write_record(_records()[0], results)
    assert run_baseline(_parse(configure_baseline_parser, ["show", "--results", str(results)])) == 0
    assert "no baselines" in capsys.readouterr().out
    assert run_baseline(_parse(configure_baseline_parser, ["update", str(record_path), "--results", str(results), "--reason", "test"])) == 0
    out = capsys.readouterr().out
    written = sorted((results / "baselines").glob("tiny__*.json"))
    assert written and all(str(p) in out for p in written)
    assert all(load_record(p)["extra"]["baseline_source_run_id"] == "20250201T000000Z-000002" for p in written)
    assert run_baseline(_parse(configure_baseline_parser, ["show", "--results", str(results)])) == 0
    shown = capsys.readouterr().out
    assert all(p.name in shown for p in written) and "20250201T000000Z-000002 (quick)" in shown


@pytest.mark.parametrize("flag, where", [("--baselines", "file"), ("--baselines", "file/sub"), ("--results", "file")])
def test_baseline_update_into_a_file_is_refused_naming_the_option(tmp_path: Path, capsys, flag, where) -> None:
    """They ended in a raw [Errno 17] File exists / [Errno 20] Not a directory."""
    from rsp_bench import cli

    record_path = write_record(_records()[0], tmp_path / "results")
    (tmp_path / "file").write_text("keep")
    assert cli.main(["baseline", "update", str(record_path), flag, str(tmp_path / where), "--reason", "t"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"{flag} '{tmp_path / 'file'}" in err
    assert "Errno" not in err and ("is a file" in err or "is not a folder" in err)
    assert (tmp_path / "file").read_text() == "keep"


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


def test_a_newer_record_with_only_side_figures_does_not_hide_the_main_row() -> None:
    full = _record("20250101T000000Z-000001", "2025-01-01T00:00:00+00:00", {
        "reference/off": {"top1_agreement": 1.0, "decode_tokens_per_s": 12.0},
        "reference/lossy/s=0.50": {"top1_agreement": 0.91, "speedup_vs_off": 1.25}})
    side = _record("20250201T000000Z-000002", "2025-02-01T00:00:00+00:00", {
        "reference/off": {"top1_agreement": 1.0, "decode_tokens_per_s": 13.0},
        "reference/lossy/s=0.50": {"degradation_detection_rate": 1.0}})
    [section], _ = sections([full, side])
    lossy = next(e for e in section.entries if e.config == "reference/lossy/s=0.50")
    assert lossy.run_id == "20250101T000000Z-000001" and lossy.value("top1_agreement") == 0.91
    off = next(e for e in section.entries if e.config == "reference/off")
    assert off.run_id == "20250201T000000Z-000002"  # the newest with main figures still wins


def _curve() -> dict:
    row = lambda s, bw, top1, static, speed: {  # noqa: E731
        "router": {"sensitivity": s, "blocks_worth": bw, "top1": top1, "kl": 0.1, "router_ms_per_token": 0.2},
        "static": {"block_bi": {"top1": static}}, "best_static": "block_bi",
        "router_minus_best_static_top1": top1 - static, "random": {"top1": 0.5}}
    return {"model": "tiny", "held_out_prompts": 3, "tokens": 8, "kernel": "torch", "threads": 1,
            "command": "python scripts/measure_router_curve.py --smoke",
            "held_out": [row(0.5, 2.5, 0.8, 0.7, True), row(0.1, 0.5, 0.95, 0.9, False)],
            "speed": [{"sensitivity": 0.5, "speedup": 1.05, "speedup_lo": 1.01, "speedup_hi": 1.09,
                       "ideal_speedup": 1.08}]}


def test_router_curve_closes_the_board_when_the_results_folder_has_one(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    for r in _records():
        write_record(r, results)
    (results / "router_curve.json").write_text(json.dumps(_curve()))
    md = write_leaderboard(results, tmp_path / "out")["md"].read_text()
    title = md.index("## Unit router vs static and random removal at equal weight bytes (tiny")
    shallow, deep = md.index("| 0.100 "), md.index("| 0.500 ")
    assert title < shallow < deep  # rows from shallow to deep budgets
    assert "+10.0 pts" in md and "1.05× [1.01, 1.09]" in md and "scripts/measure_router_curve.py --smoke" in md
    html_text = (tmp_path / "out" / "leaderboard.html").read_text()
    assert "Unit router vs static" in html_text
    assert run_leaderboard(_parse(configure_leaderboard_parser, ["--results", str(results)])) == 0  # the CLI too
    assert "+10.0 pts" in (results / "leaderboard.md").read_text() and "+10.0 pts" in capsys.readouterr().out
    (results / "router_curve.json").write_text("{not json")
    with pytest.raises(HarnessInputError, match="router_curve.json"):
        write_leaderboard(results, tmp_path / "bad")


def test_rows_of_records_made_by_older_engine_code_are_marked_stale(tmp_path: Path) -> None:
    old, new = _records()[:2]
    old["git_commit"], new["git_commit"] = "a" * 40, "b" * 40
    old["quick"] = new["quick"] = False  # one section: the newest record's row wins
    rows = build_leaderboard([old, new])
    by_config = {r["configuration"]: r["record"] for r in rows}
    assert by_config["static-shortgpt/k=3"] == "20250101T000000Z-000001 (stale)"
    assert by_config["reference/lossy/s=0.50"] == "20250201T000000Z-000002"
    md = render_markdown([old, new])
    assert "Stale: 1 of them ran other engine code than the newest record, 20250201T000000Z-000002" in md
    # one code digest on both: the same engine code whatever the commits say
    old["extra"]["code_digest"] = new["extra"]["code_digest"] = "0123456789abcdef"
    assert all("(stale)" not in r["record"] for r in build_leaderboard([old, new]))
    new["extra"]["code_digest"] = "fedcba9876543210"
    assert "(stale)" in {r["configuration"]: r["record"] for r in build_leaderboard([old, new])}["static-shortgpt/k=3"]
    assert write_leaderboard([old, new], tmp_path)["png"].read_bytes().startswith(b"\x89PNG")


def test_labels_of_coincident_points_are_placed_apart() -> None:
    from rsp_bench.leaderboard_plot import _overlaps, place_labels

    # three configurations at 1.00x and top-1 1.000 (off, f32, lossless): one spot on the plot
    anchors = [(100.0, 200.0), (100.0, 200.0), (101.0, 200.0), (300.0, 50.0)]
    widths = [80.0, 60.0, 120.0, 40.0]
    offsets = place_labels(anchors, widths, bounds=(0.0, 0.0, 600.0, 400.0))
    boxes = [(x + dx, y + dy, w, 9.1) for (x, y), (dx, dy), w in zip(anchors, offsets, widths)]
    assert not any(_overlaps(boxes[i], boxes[j]) for i in range(4) for j in range(i + 1, 4)), offsets
    assert all(0 <= b[0] and b[0] + b[2] <= 600 and 0 <= b[1] and b[1] + b[3] <= 400 for b in boxes)
    assert offsets[3] == (4.0, 4.0)  # a lone point keeps the plain place
    assert place_labels(anchors, widths, bounds=(0.0, 0.0, 600.0, 400.0)) == offsets  # deterministic


def test_router_curve_speed_rows_carry_the_bytes_they_were_measured_at() -> None:
    from rsp_bench.router_curve import curve_rows, curve_speed_rows

    curve = _curve()
    curve["speed"][0].update(blocks_worth=5.1, router_ms_per_token=0.14, pairs=8)
    [row] = curve_speed_rows(curve)
    assert row == ["0.500", "5.10", "1.05× [1.01, 1.09]", "1.08×", "0.14", "8"]
    # the quality rows carry no speed: a speed-up beside the teacher-forced row of its
    # sensitivity would sit at bytes it was not measured at
    assert all("×" not in cell for r in curve_rows(curve) for cell in r)
    md = render_markdown(_records(), curves=[curve])
    assert "### Measured speed, at the bytes each timed run skipped" in md and "| 5.10 " in md


def test_each_router_curve_file_is_shown_titled_with_its_held_out_prompts(tmp_path: Path) -> None:
    results = tmp_path / "results"
    for r in _records():
        write_record(r, results)
    (results / "router_curve.json").write_text(json.dumps(_curve()))
    fresh = {**_curve(), "held_out_source": "fixtures/router_curve/heldout_x.jsonl",
             "predictor_report": {"prompts": 164, "labels": "token"}}
    (results / "router_curve_heldout_x.json").write_text(json.dumps(fresh))
    md = write_leaderboard(results, tmp_path / "out")["md"].read_text()
    dev = md.index("3 development prompts (built-in) x 8 tokens, torch kernel, 1 thread(s))")  # no predictor report
    new = md.index("3 held-out prompts of heldout_x.jsonl x 8 tokens, torch kernel, 1 thread(s), "
                   "predictor of 164 prompts, token labels)")  # which predictor ran
    assert dev < new  # router_curve.json first, then the others by name
    assert "Held-out prompts: fixtures/router_curve/heldout_x.jsonl." in md
