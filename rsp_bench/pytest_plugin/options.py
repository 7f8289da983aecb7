"""The --rsp-* command-line options of the rsp-bench pytest plugin: ``pytest_addoption``,
the markers, and the parsing and checking of the options into the frozen ``RspOptions``
(``_parse_options``, called once by the plugin's pytest_configure; bad values are
pytest.UsageError naming the flag).

Must NOT import rsp_bench.plugin or the other rsp_bench.pytest_plugin modules (they import
this one). Must NOT import torch, transformers, reference_engine or rsp_bench.quality at module
import (pytest loads the plugin for every run): anything heavy is imported inside the
function that needs it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

MARKERS = {
    "equivalence": "output equivalence of pruned vs unpruned generation (rsp-bench quality suite)",
    "extraction": "SQuAD and structured-extraction F1, pruned vs unpruned (rsp-bench quality suite)",
    "throughput": "decode speed and projected GPU figures (rsp-bench speed suite)",
    "adversarial": "odd and adversarial inputs, protective degradation (rsp-bench)",
    "lm_eval": "lm-evaluation-harness tasks through the engine adapter (rsp-bench)",
    "router_curve": "the unit router's quality/speed curve against static removal of the same bytes "
                    "(rsp-bench; full run only)",
    "gpu": "needs a CUDA device; skipped without one",
    "reference_only": "exercises the reference engine itself; skipped under another --rsp-engine",
    "docs": "a documentation page's examples, run as written",
    "ab": "rsp-bench ab end to end (two worktrees, two workers); deselect with -m 'not ab'",
    "rsp_module_last": "runs after the other selected tests of its module whatever the order asked "
                       "(it records what they measured)",
}
# Markers whose tests, when they run, name a suite in the run record.
SUITE_MARKERS = ("equivalence", "extraction", "throughput", "adversarial", "lm_eval", "router_curve")

DEFAULT_SENSITIVITIES = "0.25,0.5,1.0"
DEFAULT_RESULTS = "results/local"
DEFAULT_BASELINES = "results/baselines"
QUICK_SENSITIVITIES = "0.5"
# The router-curve suite's default size (suites/test_router_curve.py says why): held-out prompts
# and target budgets, in blocks' worth of weight bytes skipped per decode token.
DEFAULT_CURVE_PROMPTS = 6
DEFAULT_CURVE_TARGETS = "1,3,6"
# Modes a --rsp-mode may name for the reference engine; "static" needs a block list, which
# the static-shortgpt / static-random baselines supply.
REFERENCE_MODES = ("off", "lossy", "lossless")
_MODE_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclass(frozen=True)
class RspOptions:
    """The --rsp-* options, parsed and checked once in pytest_configure."""

    model: str | None
    sensitivities: tuple[float, ...]
    modes: tuple[str, ...]
    engine: str
    quick: bool
    results_dir: Path
    update_baseline: bool
    gate: bool
    max_new_tokens: int | None = None
    subset_seed: int = 0  # which seeded subset of the fixtures the suites draw; 0 = the baseline's
    baselines_dir: Path = Path("results") / "baselines"
    ci: bool = False
    engine_url: str | None = None
    engine_model: str | None = None
    reason: str | None = None
    reference_cache: bool = True
    ab_base: str | None = None  # git ref the session's end A/B-tests this working tree against
    curve_prompts: int = DEFAULT_CURVE_PROMPTS  # the router-curve suite's held-out prompts
    curve_targets: tuple[int, ...] = (1, 3, 6)  # and its target budgets (blocks' worth per token)
    curve_held_out: Path | None = None  # a JSONL file of held-out prompts (None: the built-in set)


# --------------------------------------------------------------------------- options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rsp-bench", "rsp-bench: residual-stream pruning benchmark")
    group.addoption("--rsp-model", metavar="PATH", default=None,
                    help="model folder or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    group.addoption("--rsp-sensitivity", metavar="LIST", default=None,
                    help=f"comma-separated sensitivities in [0, 1] (default {DEFAULT_SENSITIVITIES}; "
                         f"{QUICK_SENSITIVITIES} with --rsp-quick)")
    group.addoption("--rsp-mode", metavar="LIST", default=None,
                    help="comma-separated pruning modes, e.g. lossy,lossless (default lossy); "
                         "reference/off always runs")
    group.addoption("--rsp-engine", metavar="NAME", default="reference",
                    help="engine adapter under test (registry name; default reference)")
    group.addoption("--rsp-quick", action="store_true", default=False,
                    help="small fixed subsets for CI")
    group.addoption("--rsp-results", metavar="DIR", default=DEFAULT_RESULTS,
                    help=f"where run records go (DIR/runs; default {DEFAULT_RESULTS}, git-ignored; "
                         "pass results to publish)")
    group.addoption("--rsp-baselines", metavar="DIR", default=DEFAULT_BASELINES,
                    help=f"baselines folder read by the gate and written by --rsp-update-baseline "
                         f"(default {DEFAULT_BASELINES})")
    group.addoption("--rsp-ci", action="store_true", default=False,
                    help="CI mode: a configuration with no baseline, or a run that gated nothing, fails")
    group.addoption("--rsp-engine-url", metavar="URL", default=None,
                    help="base URL of a served engine (for --rsp-engine openai), e.g. http://127.0.0.1:8000/v1")
    group.addoption("--rsp-engine-model", metavar="NAME", default=None,
                    help="model name to ask a served engine for (default: the first of its /v1/models)")
    group.addoption("--rsp-update-baseline", action="store_true", default=False,
                    help="promote this session's run record to the baseline (no gating)")
    group.addoption("--rsp-reason", metavar="TEXT", default=None,
                    help="with --rsp-update-baseline: why the baseline changes (kept in the baseline for review)")
    group.addoption("--rsp-no-gate", action="store_true", default=False,
                    help="write the record but do not compare it with the baseline")
    group.addoption("--rsp-max-new-tokens", metavar="N", default=None,
                    help="override every suite's max_new_tokens")
    group.addoption("--rsp-no-reference-cache", action="store_true", default=False,
                    help="compute the unpruned reference outputs afresh instead of reading the on-disk copy "
                         "(keyed by weights, prompts, tokens, code digest, torch/transformers versions, "
                         "decode kernel and threads)")
    group.addoption("--rsp-ab-base", metavar="REF", default=None,
                    help="after the suites, run `rsp-bench ab --base REF` (REF and this working tree "
                         "interleaved on this machine) and fail the session on a decided slowdown or a "
                         "quality regression: speed judged on a machine with no stored baseline")
    group.addoption("--rsp-reverse", action="store_true", default=False,
                    help="run the selected tests in reverse order (tests marked rsp_module_last still "
                         "close their module): checks that no suite depends on another having run first")
    group.addoption("--rsp-curve-prompts", metavar="N", default=str(DEFAULT_CURVE_PROMPTS),
                    help="held-out prompts of the router-curve suite (full run only; default %(default)s)")
    group.addoption("--rsp-curve-targets", metavar="LIST", default=DEFAULT_CURVE_TARGETS,
                    help="target budgets of the router-curve suite, in blocks' worth skipped per token "
                         "(integers 1-6; default %(default)s)")
    group.addoption("--rsp-curve-held-out", metavar="JSONL", default=None,
                    help="held-out prompts of the router-curve suite, one JSON object with a \"text\" per line "
                         "(default: the built-in set of `rsp-bench router-curve`)")
    group.addoption("--rsp-subset-seed", metavar="N", default="0",
                    help="seed of the fixture subsets the suites draw (default 0, the baseline's); "
                         "another seed checks that figures reproduce on prompts nobody tuned to, "
                         "and is never gated")


def parse_sensitivities(text: str) -> tuple[float, ...]:
    """``"0.25,0.5,1.0"`` -> (0.25, 0.5, 1.0), order kept, duplicates dropped.

    Raises pytest.UsageError naming the bad value: these come from the command line.
    """
    values: list[float] = []
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise pytest.UsageError(f"--rsp-sensitivity: no value given in {text!r} (expected e.g. 0.25,0.5,1.0)")
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise pytest.UsageError(
                f"--rsp-sensitivity: {part!r} is not a number in [0, 1] (expected a list such as 0.25,0.5,1.0)")
        if value not in values:
            values.append(value)
    return tuple(values)


def parse_modes(text: str, engine: str) -> tuple[str, ...]:
    """``"lossy,lossless"`` -> ("lossy", "lossless"); the reference engine's are checked here,
    a third-party engine's against its adapter when it is built."""
    modes: list[str] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not _MODE_NAME.match(part):
            raise pytest.UsageError(f"--rsp-mode: {part!r} is not a mode name (expected e.g. lossy,lossless)")
        if engine == "reference" and part not in REFERENCE_MODES:
            hint = " (static baselines run as the static-shortgpt / static-random rows)" if part == "static" else ""
            raise pytest.UsageError(
                f"--rsp-mode: {part!r} is not a mode of the reference engine; use one of {', '.join(REFERENCE_MODES)}{hint}")
        if part not in modes:
            modes.append(part)
    return tuple(modes)


def _parse_options(config: pytest.Config) -> RspOptions:
    from rsp_bench.engines import available_engines, declared_modes  # light: no torch
    from rsp_bench.errors import HarnessInputError

    quick = bool(config.getoption("--rsp-quick"))
    raw_sens = config.getoption("--rsp-sensitivity")
    sensitivities = parse_sensitivities(raw_sens if raw_sens is not None else
                                        (QUICK_SENSITIVITIES if quick else DEFAULT_SENSITIVITIES))
    engine = str(config.getoption("--rsp-engine")).strip()
    if engine not in available_engines():
        raise pytest.UsageError(f"--rsp-engine: unknown engine {engine!r}; available: {', '.join(available_engines())}")
    try:
        supported = declared_modes(engine)
    except HarnessInputError as exc:
        raise pytest.UsageError(f"--rsp-engine: {exc}") from None
    raw_modes = config.getoption("--rsp-mode")
    if raw_modes is None:
        # The default is lossy, for an engine that has it; an engine that declared other modes
        # (llama-cpp: "off", one configuration per quantization rung) runs those.
        raw_modes = "lossy" if supported is None or "lossy" in supported else ",".join(supported)
    modes = parse_modes(raw_modes, engine)
    if supported is not None:
        bad = [m for m in modes if m not in supported]
        if bad:
            raise pytest.UsageError(f"--rsp-mode: engine {engine!r} does not support mode {bad[0]!r} "
                                    f"(it supports {', '.join(supported)})")
    raw_max = config.getoption("--rsp-max-new-tokens")
    max_new: int | None = None
    if raw_max is not None:
        try:
            max_new = int(raw_max)
        except ValueError:
            max_new = 0
        if max_new < 1:
            raise pytest.UsageError(f"--rsp-max-new-tokens: {raw_max!r} is not an integer >= 1")
    raw_seed = str(config.getoption("--rsp-subset-seed"))
    if not raw_seed.isdigit():
        raise pytest.UsageError(f"--rsp-subset-seed: {raw_seed!r} is not an integer >= 0")
    subset_seed = int(raw_seed)
    if subset_seed and config.getoption("--rsp-update-baseline"):
        raise pytest.UsageError(f"--rsp-update-baseline needs the baseline's prompts: drop --rsp-subset-seed {raw_seed}")
    ci = bool(config.getoption("--rsp-ci"))
    if ci:
        # CI mode exists to judge the run: an option that skips the gate would let it exit 0
        # having judged nothing.
        for flag, skips in (("--rsp-no-gate", bool(config.getoption("--rsp-no-gate"))),
                            ("--rsp-update-baseline", bool(config.getoption("--rsp-update-baseline"))),
                            ("--rsp-subset-seed", subset_seed != 0)):
            if skips:
                raise pytest.UsageError(f"--rsp-ci judges the run against its baseline, and {flag} skips that gate: "
                                        f"drop one of the two")
    reason = config.getoption("--rsp-reason")
    if reason is not None and (not config.getoption("--rsp-update-baseline") or not str(reason).strip()):
        raise pytest.UsageError(f"--rsp-reason {reason!r}: give a non-empty reason, together with --rsp-update-baseline")
    folders = {}
    for flag in ("--rsp-results", "--rsp-baselines"):
        folder = Path(config.getoption(flag)).expanduser()
        if not folder.is_absolute():
            folder = Path(config.invocation_params.dir) / folder
        if folder.exists() and not folder.is_dir():
            raise pytest.UsageError(f"{flag}: {str(folder)!r} exists and is not a folder")
        folders[flag] = folder
    results = folders["--rsp-results"]
    model = config.getoption("--rsp-model")
    if model is not None and not Path(model).expanduser().exists():
        raise pytest.UsageError(f"--rsp-model: {model!r} does not exist (a model folder or .gguf file)")
    ab_base = config.getoption("--rsp-ab-base")
    if ab_base is not None:
        import subprocess

        try:
            found = subprocess.run(["git", "-C", str(config.rootpath), "rev-parse", "--verify", "--quiet",
                                    f"{ab_base}^{{commit}}"], capture_output=True, text=True)
        except OSError as exc:
            raise pytest.UsageError(f"--rsp-ab-base {ab_base!r} needs git: {exc}") from None
        if found.returncode != 0:
            raise pytest.UsageError(f"--rsp-ab-base: {ab_base!r} is not a commit of the checkout at {config.rootpath}")
        if engine != "reference":
            raise pytest.UsageError(f"--rsp-ab-base runs the reference engine's A/B; for --rsp-engine {engine!r} "
                                    f"use `rsp-bench ab --engine {engine}` or `--base-url/--head-url`")
    curve_prompts, curve_targets, curve_held_out = _parse_curve_options(config)
    return RspOptions(model=model, sensitivities=sensitivities, modes=modes, engine=engine, quick=quick,
                      results_dir=results, update_baseline=bool(config.getoption("--rsp-update-baseline")),
                      gate=not config.getoption("--rsp-no-gate"), max_new_tokens=max_new,
                      subset_seed=subset_seed, baselines_dir=folders["--rsp-baselines"],
                      ci=ci, engine_url=config.getoption("--rsp-engine-url"),
                      engine_model=config.getoption("--rsp-engine-model"), reason=reason,
                      reference_cache=not config.getoption("--rsp-no-reference-cache"), ab_base=ab_base,
                      curve_prompts=curve_prompts, curve_targets=curve_targets, curve_held_out=curve_held_out)


def _parse_curve_options(config: pytest.Config) -> tuple[int, tuple[int, ...], Path | None]:
    """--rsp-curve-prompts, --rsp-curve-targets and --rsp-curve-held-out, checked (the file's
    contents are read by the suite)."""
    raw = str(config.getoption("--rsp-curve-prompts"))
    if not raw.isdigit() or int(raw) < 1:
        raise pytest.UsageError(f"--rsp-curve-prompts: {raw!r} is not an integer >= 1")
    targets: list[int] = []
    for part in (p.strip() for p in str(config.getoption("--rsp-curve-targets")).split(",")):
        if not part.isdigit() or not 1 <= int(part) <= 6:
            raise pytest.UsageError(f"--rsp-curve-targets: {part!r} is not an integer in 1..6 (expected e.g. 1,3,6)")
        if int(part) not in targets:
            targets.append(int(part))
    held = config.getoption("--rsp-curve-held-out")
    path = None
    if held is not None:
        path = Path(held).expanduser()
        if not path.is_absolute():
            path = Path(config.invocation_params.dir) / path
        if not path.is_file():
            raise pytest.UsageError(f"--rsp-curve-held-out: {held!r} is not a file")
    return int(raw), tuple(sorted(targets)), path
