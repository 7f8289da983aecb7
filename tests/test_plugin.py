"""Tests of the rsp-bench pytest plugin (rsp_bench.plugin) through pytester: option parsing and
usage errors, the run record written at session end, baseline update and the regression gate
turning a session red, and the fixtures end to end on the tiny model.

Must not load the embedded model: inner sessions get ``--rsp-model <tiny model folder>``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rsp_bench.records import load_record

pytest_plugins = ["pytester"]

RECORD_ONE_METRIC = """
    import pytest

    @pytest.mark.equivalence
    def test_adds_metric(rsp_record):
        rsp_record.add_metric("reference/lossy/s=0.50", "top1_agreement", {value}, n=40,
                              ci=({value} - 0.05, {value} + 0.05), unit="fraction")
"""


@pytest.fixture
def pytester(pytester: pytest.Pytester) -> pytest.Pytester:
    # Inner sessions run in-process with sys.modules restored after each, so hypothesis's
    # plugin would re-import hypothesis (seconds) at every inner terminal summary.
    original = pytester.runpytest

    def run(*args, **kwargs):
        return original("-p", "no:hypothesispytest", "-p", "no:cacheprovider", *args, **kwargs)

    pytester.runpytest = run  # type: ignore[method-assign]
    return pytester


def _runs(results: Path) -> list[Path]:
    return sorted((results / "runs").glob("*.json"))


def test_importing_the_plugin_does_not_import_torch() -> None:
    code = ("import sys, rsp_bench.plugin, rsp_bench.engines; "
            "bad = [m for m in ('torch', 'transformers', 'reference_engine.engine', 'numpy') if m in sys.modules]; "
            "sys.exit(repr(bad) if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_options_parse(pytester: pytest.Pytester, tiny_model_dir: Path) -> None:
    pytester.makepyfile(test_opts=f"""
        from pathlib import Path

        def test_options(rsp_options):
            assert rsp_options.model == {str(tiny_model_dir)!r}
            assert rsp_options.sensitivities == (0.25, 1.0)
            assert rsp_options.modes == ("lossy", "lossless")
            assert rsp_options.engine == "reference"
            assert rsp_options.quick is True
            assert rsp_options.results_dir == Path({str(pytester.path)!r}) / "out"
            assert rsp_options.update_baseline is False and rsp_options.gate is False
            assert rsp_options.max_new_tokens == 7
            assert rsp_options.subset_seed == 3
    """)
    result = pytester.runpytest("--rsp-model", str(tiny_model_dir), "--rsp-sensitivity", "0.25, 1.0,0.25",
                                "--rsp-mode", "lossy,lossless", "--rsp-quick", "--rsp-results", "out",
                                "--rsp-no-gate", "--rsp-max-new-tokens", "7", "--rsp-subset-seed", "3")
    result.assert_outcomes(passed=1)


def test_defaults_and_config_parametrization(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_collect="""
        def test_defaults(rsp_options):
            assert rsp_options.sensitivities == (0.5,)  # quick default
            assert rsp_options.modes == ("lossy",) and rsp_options.gate and rsp_options.model is None

        def test_each_config(rsp_config):
            pass
    """)
    result = pytester.runpytest("--rsp-quick", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_each_config?reference/off?*", "*test_each_config?reference/lossy/s=0.50?*"])
    result = pytester.runpytest("--collect-only", "-q", "--rsp-mode", "lossy,lossless")
    # off + lossy (the unit router, and the block router beside it) x 3 sensitivities + lossless x 3
    assert sum("test_each_config[" in line for line in result.outlines) == 10
    assert pytester.runpytest("--rsp-quick", "-k", "test_defaults").ret == 0  # never loads a model


@pytest.mark.parametrize("args, named", [
    (["--rsp-sensitivity", "0.5,abc"], "'abc'"),
    (["--rsp-sensitivity", "1.5"], "'1.5'"),
    (["--rsp-sensitivity", ","], "','"),
    (["--rsp-mode", "lossy,banana"], "'banana'"),
    (["--rsp-mode", "static"], "'static'"),
    (["--rsp-engine", "nope"], "'nope'"),
    (["--rsp-max-new-tokens", "0"], "'0'"),
    (["--rsp-model", "/no/such/model"], "'/no/such/model'"),
    (["--rsp-subset-seed", "-1"], "'-1'"),
    (["--rsp-subset-seed", "1", "--rsp-update-baseline"], "1"),
    # CI mode judges the run: an option that skips the gate is refused, not obeyed silently
    (["--rsp-ci", "--rsp-no-gate"], "--rsp-no-gate"),
    (["--rsp-ci", "--rsp-update-baseline"], "--rsp-update-baseline"),
    (["--rsp-ci", "--rsp-subset-seed", "2"], "--rsp-subset-seed"),
    (["--rsp-reason", "why"], "'why'"),
])
def test_bad_option_is_a_usage_error_naming_the_value(pytester: pytest.Pytester, args, named) -> None:
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    option = args[0]
    assert any(option in line and named in line for line in result.errlines), result.errlines


def test_session_without_metrics_writes_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_plain(): assert True")
    result = pytester.runpytest("--rsp-results", "out")
    assert result.ret == 0
    assert not (pytester.path / "out").exists()
    assert "run record" not in result.stdout.str()


def test_a_ci_session_that_recorded_nothing_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_plain(): assert True")
    result = pytester.runpytest("--rsp-results", "out", "--rsp-ci")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "recorded no metric" in result.stdout.str()


def test_record_written_at_session_end(pytester: pytest.Pytester, tiny_model_dir: Path) -> None:
    pytester.makepyfile(test_rec=textwrap.dedent(RECORD_ONE_METRIC).format(value=0.9))
    result = pytester.runpytest("--rsp-model", str(tiny_model_dir), "--rsp-results", "out", "--rsp-quick")
    assert result.ret == 0
    [path] = _runs(pytester.path / "out")
    record = load_record(path)  # validates the schema
    assert record["quick"] is True and record["suites"] == ["equivalence"]
    assert record["model"]["name"] == tiny_model_dir.name and record["model"]["weights_sha256"]
    config = record["configurations"]["reference/lossy/s=0.50"]
    assert (config["engine"], config["mode"], config["sensitivity"]) == ("reference", "lossy", 0.5)
    assert config["metrics"]["top1_agreement"] == {"value": 0.9, "n": 40, "ci": [0.9 - 0.05, 0.9 + 0.05], "unit": "fraction"}
    assert json.loads(path.read_text()) == record and path.read_text().endswith("\n")
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp file left
    result.stdout.fnmatch_lines(["*rsp-bench*", f"run record: {path}", "*reference/lossy/s=0.50*0.9*",
                                 "warning: no baseline*nothing gated*"])


def test_failed_write_leaves_no_record_and_fails(pytester: pytest.Pytester, tiny_model_dir: Path,
                                                 monkeypatch) -> None:
    import rsp_bench.storage as storage

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    pytester.makepyfile(test_rec=textwrap.dedent(RECORD_ONE_METRIC).format(value=0.9))
    monkeypatch.setattr(storage.os, "fsync", disk_full)
    result = pytester.runpytest("--rsp-model", str(tiny_model_dir), "--rsp-results", "out")
    monkeypatch.undo()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    runs = pytester.path / "out" / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []
    result.stdout.fnmatch_lines(["*run record not written*No space left*"])


def test_gate_failure_turns_the_session_red(pytester: pytest.Pytester, tiny_model_dir: Path) -> None:
    base_args = ["--rsp-model", str(tiny_model_dir), "--rsp-results", "out", "--rsp-baselines", "out/baselines",
                 "--rsp-quick"]
    pytester.makepyfile(test_rec=textwrap.dedent(RECORD_ONE_METRIC).format(value=0.9))
    assert pytester.runpytest(*base_args, "--rsp-ci").ret == pytest.ExitCode.TESTS_FAILED  # CI: no baseline fails
    result = pytester.runpytest(*base_args, "--rsp-update-baseline")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["baseline updated: *"])
    [baseline] = sorted((pytester.path / "out" / "baselines").glob("*.json"))
    assert load_record(baseline)["extra"]["baseline_source_run_id"]

    pytester.makepyfile(test_rec=textwrap.dedent(RECORD_ONE_METRIC).format(value=0.9))
    assert pytester.runpytest(*base_args).ret == 0  # unchanged rerun passes

    pytester.makepyfile(test_rec=textwrap.dedent(RECORD_ONE_METRIC).format(value=0.5))  # planted regression
    result = pytester.runpytest(*base_args)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*reference/lossy/s=0.50*top1_agreement*0.9*0.5*REGRESSED*",
                                 "*rsp-bench gate FAILED*", "*the gate failed*FAILED*"])
    assert load_record(baseline)["configurations"]["reference/lossy/s=0.50"]["metrics"]["top1_agreement"]["value"] == 0.9
    assert len(_runs(pytester.path / "out")) == 4  # every session keeps its record, red or green

    assert pytester.runpytest(*base_args, "--rsp-no-gate").ret == 0


def test_fixtures_end_to_end_on_tiny_model(pytester: pytest.Pytester, tiny_model_dir: Path,
                                           monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os
    import shutil

    # A cache with the tiny model's block-router calibration and no unit-router predictor (another
    # test may have trained one): the unit router's row (the default lossy row) is then left out,
    # whatever ran before, and the block router's comparison row runs.
    cache = tmp_path / "cache"
    shared = Path(os.environ["RSP_BENCH_CACHE"])
    cache.mkdir()
    for part in ("calibration", "models"):
        if (shared / part).is_dir():
            shutil.copytree(shared / part, cache / part)
    monkeypatch.setenv("RSP_BENCH_CACHE", str(cache))
    pytester.makepyfile(test_e2e="""
        import pytest
        import torch
        from rsp_bench.quality import equivalence_metrics, record_metrics

        PROMPTS = ["Hello there", "def add(a, b):"]

        @pytest.fixture(scope="module", autouse=True)
        def one_thread():
            torch.set_num_threads(1)

        @pytest.mark.equivalence
        def test_config(rsp_config, rsp_adapter_for, rsp_reference_outputs, rsp_record, rsp_engine):
            ref = rsp_reference_outputs.get("e2e", PROMPTS, 4, with_logits=True)
            values = equivalence_metrics(rsp_adapter_for(rsp_config), rsp_config, PROMPTS, ref, 4)
            record_metrics(rsp_record, rsp_config, values)
            assert rsp_config.pruning.hardware_watermark == 0.0
            if rsp_config.mode == "off":
                assert values["exact_match_rate"].value == 1.0

        def test_session_objects(rsp_engine, rsp_adapter, rsp_peer, rsp_configs):
            assert rsp_adapter.name == "reference" and rsp_peer.name == "hf-generate"
            assert rsp_peer.model is rsp_engine.hf_model
            assert [c.config_id for c in rsp_configs] == ["reference/off", "reference/lossy/s=0.50/router=block"]
    """)
    result = pytester.runpytest("--rsp-model", str(tiny_model_dir), "--rsp-results", "out", "--rsp-quick", "-q")
    result.assert_outcomes(passed=3, skipped=1)  # reference/lossy/s=0.50 (the unit router): no predictor
    assert any("no unit-router predictor" in line for line in result.outlines)
    [path] = _runs(pytester.path / "out")
    record = load_record(path)
    assert set(record["configurations"]) == {"reference/off", "reference/lossy/s=0.50/router=block"}
    off = record["configurations"]["reference/off"]["metrics"]
    assert off["exact_match_rate"]["value"] == 1.0 and off["exact_match_rate"]["n"] == 2
    assert {"top1_agreement", "kl_mean", "kl_p99", "perplexity_ratio", "bypass_ratio",
            "blocks_executed_per_token", "prefix_agreement"} <= set(off)
    assert record["extra"]["model_load_s"] >= 0


OTHER_ENGINE_CONFTEST = """
    from rsp_bench.engines import Output, register_engine

    class OffOnly:
        name = "{name}"
        modes = ("off",)
        batch_size = 1

        def generate(self, prompts, max_new_tokens, spec):
            return [Output(p, [1], [2], {{}}) for p in prompts]

        def teacher_forced_logits(self, prompt_ids, continuation_ids, spec):
            raise NotImplementedError

    @register_engine("{name}", modes=("off",))
    def make(**kwargs):
        return OffOnly()
"""


def test_unsupported_mode_is_a_usage_error_before_any_test(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(textwrap.dedent(OTHER_ENGINE_CONFTEST).format(name="off-only"))
    pytester.makepyfile(test_x="def test_x():\n    raise AssertionError('must not run')\n")
    result = pytester.runpytest("--rsp-engine", "off-only", "--rsp-mode", "lossy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--rsp-mode: engine 'off-only' does not support mode 'lossy' (it supports off)*"])


def test_reference_only_suites_skip_under_another_engine(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(textwrap.dedent(OTHER_ENGINE_CONFTEST).format(name="off-only-2"))
    pytester.makepyfile(test_x=textwrap.dedent("""
        import pytest

        @pytest.mark.reference_only
        def test_ref(rsp_record):
            rsp_record.add_metric("reference/off", "degradation_detection_rate", 1.0, n=1)
    """))
    result = pytester.runpytest("--rsp-engine", "off-only-2", "--rsp-mode", "off", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*exercises the reference engine itself; --rsp-engine off-only-2*"])
    assert not (pytester.path / "results" / "local" / "runs").exists()  # nothing measured, no record


def test_errored_setup_marks_the_record_partial(pytester: pytest.Pytester, tiny_model_dir: Path) -> None:
    pytester.makepyfile(test_rec=textwrap.dedent(RECORD_ONE_METRIC).format(value=0.9) + textwrap.dedent("""
        @pytest.fixture
        def broken():
            raise RuntimeError("adapter crashed")

        def test_broken(broken):
            pass
    """))
    result = pytester.runpytest("--rsp-model", str(tiny_model_dir), "--rsp-results", "out", "--rsp-baselines",
                                "out/baselines", "--rsp-update-baseline")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    [path] = _runs(pytester.path / "out")
    assert "1 test(s) errored: test_broken" in load_record(path)["extra"]["partial"]
    result.stdout.fnmatch_lines(["*PARTIAL*", "*baseline not updated: the run is partial*"])
    assert not (pytester.path / "out" / "baselines").exists()


def test_ab_base_that_is_no_commit_is_a_usage_error_naming_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("--rsp-ab-base", "no-such-ref-xyz")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "'no-such-ref-xyz' is not a commit" in result.stderr.str()


def test_ab_base_runs_rsp_bench_ab_and_its_exit_code_decides(monkeypatch, tmp_path) -> None:
    # The wiring only (the real A/B runs in tests/test_ab_end_to_end.py, slow): the command, and exit 1 failing the session.
    from types import SimpleNamespace

    from rsp_bench.pytest_plugin import session

    record = tmp_path / "runs" / "20261202T000000Z-abcdef.json"
    cmd = session.ab_command("HEAD~1", SimpleNamespace(model=None), record)
    assert cmd[1:6] == ["-m", "rsp_bench.cli", "ab", "--base", "HEAD~1"] and cmd[cmd.index("--repo") + 1] == "."
    assert cmd[cmd.index("--out") + 1].endswith("abcdef.ab.json") and cmd[cmd.index("--markdown") + 1].endswith(".ab.md")
    for rc, fails in ((0, False), (1, True), (2, True)):
        monkeypatch.setattr("subprocess.run", lambda *a, rc=rc, **k: SimpleNamespace(returncode=rc, stdout="table",
                                                                                   stderr="bad"))
        lines: list[str] = []
        failed: list[str] = []
        session._ab_against("HEAD~1", SimpleNamespace(model=None), lines, failed.append, record)
        assert lines[0].startswith("A/B against HEAD~1") and lines[0].endswith("table")
        assert bool(failed) is fails, (rc, failed)


def _module_last_files(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_a="""
        import pytest

        @pytest.mark.rsp_module_last
        def test_record():
            pass

        def test_bench_1():
            pass

        def test_bench_2():
            pass
    """, test_b="def test_other():\n    pass\n")


def _collected(result: pytest.RunResult) -> list[str]:
    return [line.split("::")[-1] for line in result.stdout.lines if "::" in line]


def test_module_last_tests_follow_their_module_in_any_order(pytester: pytest.Pytester) -> None:
    _module_last_files(pytester)
    pytester.makeconftest("""
        def pytest_collection_modifyitems(items):
            items.reverse()
    """)
    names = _collected(pytester.runpytest("--collect-only", "-q"))
    assert names == ["test_other", "test_bench_2", "test_bench_1", "test_record"], names


def test_rsp_reverse_reverses_the_run_and_keeps_module_last(pytester: pytest.Pytester) -> None:
    _module_last_files(pytester)
    assert _collected(pytester.runpytest("--collect-only", "-q")) == [
        "test_bench_1", "test_bench_2", "test_record", "test_other"]
    names = _collected(pytester.runpytest("--collect-only", "-q", "--rsp-reverse"))
    assert names == ["test_other", "test_bench_2", "test_bench_1", "test_record"], names
