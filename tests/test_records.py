"""Tests of rsp_bench.records (schema, builder, validation, files) and rsp_bench.baselines.

Must not import torch, transformers or reference_engine.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rsp_bench import records as rec
from rsp_bench.baselines import (list_baselines, load_baseline, metric_scope, quality_baseline_path,
                                 speed_baseline_path, update_baseline)
from rsp_bench.errors import RecordError
from rsp_bench.records import environment
from rsp_bench.records import (
    KNOWN_METRICS,
    RunRecordBuilder,
    latest_records,
    load_record,
    machine_fingerprint,
    parse_config_id,
    validate_record,
    write_record,
)

REPO = Path(__file__).resolve().parents[1]
MACHINE = {"fingerprint": "f00dfeed0001", "hostname": "h", "platform": "p", "cpu": "c", "cores": 2,
           "memory_gb": 8.0, "gpu": None}
VERSIONS = {"python": "3.11", "torch": None, "transformers": None, "rsp_bench": "0.1"}


def _builder(model: str = "tiny", **kw) -> RunRecordBuilder:
    kw.setdefault("machine", MACHINE)
    return RunRecordBuilder(model_name=model, commit=None, versions_info=VERSIONS, **kw)


def _record(top1: float = 0.9, **kw) -> dict:
    b = _builder(**kw)
    b.add_suite("equivalence")
    b.add_metric("reference/off", "top1_agreement", 1.0, n=200, unit="fraction")
    b.add_metric("reference/lossy/s=0.50", "top1_agreement", top1, n=200, ci=(top1 - 0.02, top1 + 0.01),
                 unit="fraction")
    b.add_metric("reference/lossy/s=0.50", "speedup_vs_off", 1.2, n=3, unit="x", samples=[1.1, 1.2, 1.3])
    return b.build(wall_time_s=2.5)


# --------------------------------------------------------------------------- building


def test_builder_produces_a_valid_record_with_the_documented_shape() -> None:
    r = _record()
    assert r["schema"] == "rsp-bench/run-record" and r["schema_version"] == 1
    assert set(r) == {"schema", "schema_version", "run_id", "created_utc", "wall_time_s", "quick", "suites",
                      "model", "machine", "versions", "git_commit", "configurations", "extra"}
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}", r["run_id"])
    assert r["suites"] == ["equivalence"] and r["wall_time_s"] == 2.5
    cfg = r["configurations"]["reference/lossy/s=0.50"]
    assert (cfg["engine"], cfg["mode"], cfg["sensitivity"]) == ("reference", "lossy", 0.5)
    assert cfg["metrics"]["top1_agreement"] == {"value": 0.9, "n": 200, "ci": [0.88, 0.91], "unit": "fraction"}
    assert cfg["metrics"]["speedup_vs_off"]["samples"] == [1.1, 1.2, 1.3]
    assert validate_record(r) is r


def test_run_ids_are_unique_even_within_one_second() -> None:
    assert len({rec.new_run_id() for _ in range(50)}) == 50


@pytest.mark.parametrize(
    "config_id, expected",
    [
        ("reference/lossy/s=0.50", ("reference", "lossy", 0.5, {})),
        ("reference/off", ("reference", "off", None, {})),
        ("hf-generate/off", ("hf-generate", "off", None, {})),
        ("static-shortgpt/k=3", ("static-shortgpt", "default", None, {"k": 3})),
        ("static-random/k=4/seed=7", ("static-random", "default", None, {"k": 4, "seed": 7})),
    ],
)
def test_parse_config_id(config_id: str, expected: tuple) -> None:
    assert parse_config_id(config_id) == expected


@pytest.mark.parametrize("bad", ["", " reference/off", "reference//off", "reference/s=abc"])
def test_parse_config_id_rejects_malformed_ids(bad: str) -> None:
    with pytest.raises(RecordError, match=re.escape(repr(bad))):
        parse_config_id(bad)


def test_explicit_engine_mode_and_params_override_the_id() -> None:
    b = _builder()
    b.add_metric("mine", "top1_agreement", 0.8, n=10, engine="my-engine", mode="lossless", sensitivity=0.25,
                 params={"draft": 4})
    cfg = b.build()["configurations"]["mine"]
    assert (cfg["engine"], cfg["mode"], cfg["sensitivity"], cfg["params"]) == ("my-engine", "lossless", 0.25, {"draft": 4})
    with pytest.raises(RecordError, match="already has engine='my-engine'"):
        b.add_metric("mine", "kl_mean", 0.1, n=10, engine="other")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"value": float("nan")}, "must be finite"),
        ({"value": True}, "must be a number"),
        ({"value": "0.9"}, "must be a number"),
        ({"n": 0}, "positive integer"),
        ({"n": 2.0}, "positive integer"),
        ({"ci": (0.9, 0.8)}, "lo > hi"),
        ({"ci": (0.1,)}, r"\[lo, hi\]"),
        ({"samples": [1.0, float("inf")]}, r"samples\[1\].*finite"),
        ({"sensitivity": 1.5}, r"\[0, 1\]"),
    ],
)
def test_add_metric_rejects_bad_values_naming_them(kwargs: dict, message: str) -> None:
    args = {"config_id": "reference/lossy/s=0.50", "name": "top1_agreement", "value": 0.9, "n": 10}
    args.update(kwargs)
    with pytest.raises(RecordError, match=message):
        _builder().add_metric(**args)


def test_adding_a_metric_twice_is_an_error_unless_replacing() -> None:
    b = _builder()
    b.add_metric("reference/off", "kl_mean", 0.0, n=5)
    with pytest.raises(RecordError, match="'kl_mean' of 'reference/off' was already recorded"):
        b.add_metric("reference/off", "kl_mean", 0.1, n=5)
    b.add_metric("reference/off", "kl_mean", 0.1, n=5, replace=True)
    assert b.build()["configurations"]["reference/off"]["metrics"]["kl_mean"]["value"] == 0.1


def test_build_refuses_a_record_without_a_model_name() -> None:
    b = RunRecordBuilder(machine=MACHINE, commit=None, versions_info=VERSIONS)
    with pytest.raises(RecordError, match="model.name: must not be empty"):
        b.build()


# --------------------------------------------------------------------------- machine, versions, git


def test_fingerprint_ignores_hostname_and_small_memory_differences(monkeypatch: pytest.MonkeyPatch) -> None:
    first = rec.machine_info(gpu=None)
    monkeypatch.setattr(socket, "gethostname", lambda: "another-ci-runner")
    second = rec.machine_info(gpu=None)
    assert second["hostname"] == "another-ci-runner"
    assert first["fingerprint"] == second["fingerprint"]
    assert re.fullmatch(r"[0-9a-f]{12}", first["fingerprint"])
    assert machine_fingerprint("EPYC", 2, 25.3, None) == machine_fingerprint("EPYC", 2, 24.9, None)


def test_fingerprint_changes_with_cpu_cores_memory_or_gpu() -> None:
    base = machine_fingerprint("EPYC", 2, 25.3, None)
    assert len({base, machine_fingerprint("Xeon", 2, 25.3, None), machine_fingerprint("EPYC", 4, 25.3, None),
                machine_fingerprint("EPYC", 2, 64.0, None), machine_fingerprint("EPYC", 2, 25.3, "NVIDIA H200")}) == 5


def test_cpu_description_tells_apart_generations_and_vector_units_of_one_name(tmp_path) -> None:
    """Two "AMD EPYC" runners measured 30% apart (AVX-512 and AVX2 only): the description that the
    fingerprint hashes carries family, model and the widest vector unit, read from the first
    processor's block."""
    def cpu(family: int, model: int, flags: str) -> str:
        block = f"processor\t: 0\nmodel name\t: AMD EPYC\ncpu family\t: {family}\nmodel\t\t: {model}\nflags\t\t: {flags}\n\n"
        path = tmp_path / f"cpuinfo-{family}-{model}-{len(flags)}"
        path.write_text(block + block.replace("processor\t: 0", "processor\t: 1").replace("AMD EPYC", "other"))
        return environment._cpu_model(str(path))

    zen3, zen4 = cpu(25, 1, "fpu sse avx2 fma"), cpu(25, 17, "fpu sse avx2 fma avx512f avx512bw")
    assert zen3 == "AMD EPYC (family 25, model 1, avx2)"
    assert zen4 == "AMD EPYC (family 25, model 17, avx512)"
    assert machine_fingerprint(zen3, 2, 25.3, None) != machine_fingerprint(zen4, 2, 25.3, None)
    bare = tmp_path / "bare"
    bare.write_text("Hardware\t: Some ARM board\n")
    assert environment._cpu_model(str(bare)) == "Some ARM board"
    assert environment._cpu_model(str(tmp_path / "missing")) not in ("", None)


def test_machine_info_fields_validate() -> None:
    info = rec.machine_info(gpu="NVIDIA H200")
    assert info["gpu"] == "NVIDIA H200" and info["cores"] >= 1 and info["memory_gb"] > 0
    validate_record({**_record(), "machine": info})


def test_git_commit_is_none_outside_a_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert rec.git_commit(tmp_path) is None


def test_versions_come_from_metadata_without_importing_heavy_libraries() -> None:
    # A fresh interpreter: importing the harness's record side must not pull torch in.
    code = (
        "import sys, rsp_bench.records as r, rsp_bench.gate, rsp_bench.baselines, rsp_bench.leaderboard\n"
        "v = r.versions(); r.machine_info()\n"
        "assert set(v) == {'python', 'torch', 'transformers', 'rsp_bench'}, v\n"
        "heavy = [m for m in ('torch', 'transformers', 'reference_engine', 'matplotlib') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- files and validation


def test_write_then_load_round_trips(tmp_path: Path) -> None:
    r = _record()
    path = write_record(r, tmp_path)
    assert path == tmp_path / "runs" / f"{r['run_id']}.json"
    assert load_record(path) == r
    with pytest.raises(RecordError, match="already exists"):
        write_record(r, tmp_path)


def _corrupt(tmp_path: Path, edit) -> Path:
    obj = _record()
    edit(obj)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda o: o["configurations"]["reference/off"]["metrics"]["top1_agreement"].update(n=0),
         "configurations['reference/off'].metrics['top1_agreement'].n"),
        (lambda o: o["configurations"]["reference/off"]["metrics"]["top1_agreement"].update(value=None),
         "configurations['reference/off'].metrics['top1_agreement'].value"),
        (lambda o: o["configurations"]["reference/off"]["metrics"]["top1_agreement"].update(stderr=0.1),
         "configurations['reference/off'].metrics['top1_agreement']: unknown field(s) 'stderr'"),
        (lambda o: o["configurations"]["reference/off"].update(sensitivity=2),
         "configurations['reference/off'].sensitivity"),
        (lambda o: o["machine"].pop("fingerprint"), "machine: missing fingerprint"),
        (lambda o: o.update(created_utc="yesterday"), "created_utc"),
        (lambda o: o.update(created_utc="2025-01-01T10:00:00+02:00"), "created_utc"),
        (lambda o: o.update(run_id="../escape"), "run_id"),
        (lambda o: o.update(quick="yes"), "quick"),
        (lambda o: o.update(schema="something-else"), "schema"),
        (lambda o: o.update(schema_version=2), "schema_version: 2 is newer"),
        (lambda o: o.update(surprise=1), "unknown field(s) 'surprise'"),
    ],
)
def test_load_record_names_the_file_and_the_bad_field(tmp_path: Path, edit, field: str) -> None:
    path = _corrupt(tmp_path, edit)
    with pytest.raises(RecordError) as info:
        load_record(path)
    assert str(path) in str(info.value)
    assert field in str(info.value)


def test_load_record_reports_bad_json_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": ', encoding="utf-8")
    with pytest.raises(RecordError, match=r"bad\.json: not valid JSON .* line 1"):
        load_record(bad)
    with pytest.raises(RecordError, match=r"nope\.json: no such run record"):
        load_record(tmp_path / "nope.json")


def test_latest_records_are_newest_first_and_ignore_temp_files(tmp_path: Path) -> None:
    old = _builder(created_utc="2025-01-01T00:00:00+00:00", run_id="20250101T000000Z-aaaaaa")
    old.add_metric("reference/off", "kl_mean", 0.0, n=1)
    new = _builder(created_utc="2025-02-01T00:00:00Z", run_id="20250201T000000Z-bbbbbb")
    new.add_metric("reference/off", "kl_mean", 0.0, n=1)
    new.write(tmp_path)
    old.write(tmp_path)
    (tmp_path / "runs" / ".20250301T000000Z-cccccc.json.x1.tmp").write_text("{half", encoding="utf-8")
    assert [r["run_id"] for r in latest_records(tmp_path)] == ["20250201T000000Z-bbbbbb", "20250101T000000Z-aaaaaa"]
    assert [r["run_id"] for r in latest_records(tmp_path, limit=1)] == ["20250201T000000Z-bbbbbb"]
    assert latest_records(tmp_path / "empty") == []


def test_docs_page_lists_every_known_metric() -> None:
    doc = (REPO / "docs" / "run-record.md").read_text(encoding="utf-8")
    for name in KNOWN_METRICS:
        generic = re.sub(r"_(V100|A100|H100|H200)$", "_<P>", name)
        assert f"`{generic}`" in doc or f"`{name}`" in doc, name


# --------------------------------------------------------------------------- baselines


def test_baseline_paths_are_per_weights_engine_and_machine_and_sanitized(tmp_path: Path) -> None:
    r = _record(model="HuggingFaceTB/SmolLM2 135M", quick=True)
    stem = f"HuggingFaceTB-SmolLM2-135M__{r['model']['weights_sha256'][:12] or 'unknown-weights'}__reference"
    assert quality_baseline_path(tmp_path, r) == tmp_path / f"{stem}.json"
    assert speed_baseline_path(tmp_path, r) == tmp_path / f"{stem}__f00dfeed0001.speed.json"
    full = {**r, "quick": False}  # a full run draws other prompt sets: files of its own
    assert quality_baseline_path(tmp_path, full) == tmp_path / f"{stem}.full.json"
    assert speed_baseline_path(tmp_path, full) == tmp_path / f"{stem}__f00dfeed0001.full.speed.json"
    other = {**r, "extra": {**r["extra"], "engine_under_test": "skip-odd"}}
    assert quality_baseline_path(tmp_path, other).name.endswith("__skip-odd.json")
    with pytest.raises(RecordError, match="model name '///'"):
        quality_baseline_path(tmp_path, {**r, "model": {**r["model"], "name": "///"}})


def test_missing_baseline_is_none_and_update_then_load_round_trips(tmp_path: Path) -> None:
    r = _record()
    found = load_baseline(tmp_path, r)
    assert found.quality is None and found.speed is None and found.merged() is None
    source = write_record(r, tmp_path / "results")
    quality_path, speed_path = update_baseline(source, tmp_path / "baselines")
    found = load_baseline(tmp_path / "baselines", r)
    assert found.quality_path == quality_path and found.speed_path == speed_path
    # Quality and timing metrics land in their own files; merged, they are the record again.
    assert set(found.quality["configurations"]["reference/lossy/s=0.50"]["metrics"]) == {"top1_agreement"}
    assert set(found.speed["configurations"]["reference/lossy/s=0.50"]["metrics"]) == {"speedup_vs_off"}
    assert found.merged()["configurations"] == r["configurations"]
    assert found.quality["extra"]["baseline_source_run_id"] == r["run_id"]
    assert rec._parse_utc(found.quality["extra"]["baseline_written_utc"]) is not None
    assert set(found.quality["extra"]["baseline_written_by"]) == {"git_commit", "hostname"}
    assert [p for p, _ in list_baselines(tmp_path / "baselines")] == sorted([quality_path, speed_path])


def test_quick_and_full_runs_each_have_their_own_baselines(tmp_path: Path) -> None:
    quick, full = _record(0.9, quick=True), _record(0.5, quick=False)
    quick_paths = update_baseline(quick, tmp_path)
    before = {p: p.read_bytes() for p in quick_paths}
    # a full run is never judged against the quick subset's figures: no baseline until it has one
    found = load_baseline(tmp_path, full)
    assert found.quality is None and found.speed is None
    full_paths = update_baseline(full, tmp_path)
    assert set(full_paths).isdisjoint(quick_paths) and all(".full." in p.name for p in full_paths)
    assert {p: p.read_bytes() for p in quick_paths} == before  # the full update left the quick files alone
    top1 = lambda b: b.quality["configurations"]["reference/lossy/s=0.50"]["metrics"]["top1_agreement"]["value"]  # noqa: E731
    assert top1(load_baseline(tmp_path, quick)) == 0.9 and top1(load_baseline(tmp_path, full)) == 0.5
    assert load_baseline(tmp_path, full).speed["quick"] is False


def test_a_full_record_under_the_quick_name_still_serves_both_sizes(tmp_path: Path) -> None:
    # baselines written before run sizes had files of their own: a full run's record under the
    # quick name is the full baseline, and quick runs keep reading it as before
    full = _record(0.5, quick=False)
    paths = update_baseline(full, tmp_path)
    for p in paths:
        p.rename(p.with_name(p.name.replace(".full.", ".")))
    for run in (full, _record(0.9, quick=True)):
        found = load_baseline(tmp_path, run)
        assert found.quality is not None and found.quality["quick"] is False and ".full." not in found.quality_path.name
        assert found.speed is not None
    # a quick record under the quick name never serves a full run
    update_baseline(_record(0.9, quick=True), tmp_path)
    assert load_baseline(tmp_path, full).quality is None


def test_metric_scope_puts_clock_figures_on_the_machine() -> None:
    assert metric_scope("speedup_vs_off") == metric_scope("tpot_ms_p50_b4") == "machine"
    assert metric_scope("decode_tokens_per_s") == metric_scope("router_ms_per_token") == "machine"
    for name in ("top1_agreement", "kl_mean", "json_field_f1_delta", "bypass_ratio", "projected_tokens_per_s_A100",
                 "degradation_detection_rate"):
        assert metric_scope(name) == "model", name


def test_a_partial_record_never_becomes_a_baseline(tmp_path: Path) -> None:
    r = _record()
    r["extra"]["partial"] = "session ended with INTERRUPTED"
    with pytest.raises(RecordError, match="partial"):
        update_baseline(r, tmp_path)
    assert not list(tmp_path.iterdir())


def test_another_engines_baseline_leaves_the_reference_baseline_untouched(tmp_path: Path) -> None:
    ref_paths = update_baseline(_record(), tmp_path)
    before = {p: p.read_bytes() for p in ref_paths}
    other = _record(top1=0.25)
    other["extra"]["engine_under_test"] = "skip-odd"
    other_paths = update_baseline(other, tmp_path)
    assert set(other_paths).isdisjoint(ref_paths)
    assert {p: p.read_bytes() for p in ref_paths} == before
    assert load_baseline(tmp_path, other).quality["configurations"]["reference/lossy/s=0.50"]["metrics"][
        "top1_agreement"]["value"] == 0.25


def test_a_bad_record_never_replaces_a_good_baseline(tmp_path: Path) -> None:
    good = update_baseline(_record(), tmp_path)[0]
    before = good.read_bytes()
    bad = _record()
    bad["configurations"]["reference/off"]["metrics"]["top1_agreement"]["n"] = -1
    with pytest.raises(RecordError, match=r"\.n: must be >= 1"):
        update_baseline(bad, tmp_path)
    assert good.read_bytes() == before


def test_two_model_names_sharing_a_file_are_detected(tmp_path: Path) -> None:
    update_baseline(_record(model="org/model"), tmp_path)
    with pytest.raises(RecordError, match="model.name is 'org/model' but the run has 'org-model'"):
        load_baseline(tmp_path, _record(model="org-model"))
