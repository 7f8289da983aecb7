"""The ``rsp-bench`` command line: one subcommand per job, each a thin layer over a library module.

    rsp-bench generate PROMPT|-      one request through the reference engine
    rsp-bench calibrate              measure and cache a model's router calibration
    rsp-bench run [--quick]          the suites, records, gate and leaderboard (the main job)
    rsp-bench project                projected tokens/s and GPU idle time per hardware profile
    rsp-bench bench                  measured, interleaved decode speed on this machine
    rsp-bench ab --base REF          A/B of REF and the working tree, interleaved; exit 1 if slower
    rsp-bench gate                   compare a run record with a baseline; exit 1 on regression
    rsp-bench leaderboard            rebuild the leaderboard tables from the records
    rsp-bench baseline update|show   manage committed baselines
    rsp-bench tune                   sweep sensitivity and recommend one
    rsp-bench serve                  the reference engine as an OpenAI-compatible server

Bad input exits 2 with one line on stderr naming the flag as typed, the bad value and the allowed
range, never a traceback; whatever can be checked without the model (values, files named, the
blacklist and --max-new-tokens against the model's config or GGUF header) is checked before it
loads. Every command takes --quiet (no progress bars; --json implies it); `rsp-bench --version`.
Must not import torch at module level: ``rsp-bench --help`` stays instant.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .cli_checks import UserError, check_inputs, check_model_path, check_writable, results_folder
from .errors import HarnessInputError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (``rsp-bench COMMAND: error: ...``)
    and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse prefixes a type's message with "argument --flag: "; ours already start with
        # the flag, and saying it twice reads like a stutter.
        m = re.match(r"argument ([^:]+): (.*)", message, re.S)
        if m and any(m.group(2).startswith(flag) for flag in m.group(1).split("/")):
            message = m.group(2)
        sys.stderr.write(f"{self.prog}: error: {' '.join(message.split())}\n")
        raise SystemExit(2)


class _HelpFormatter(argparse.HelpFormatter):
    """Shows every option's default unless its help already says it (most do, in words)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (action.option_strings and "default" not in text and "%(default)" not in text
                and default not in (None, False, argparse.SUPPRESS, [], ())):
            text += " (default: %(default)s)"
        return text


@contextlib.contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    """Progress bars (tqdm, and transformers' "Loading weights") on or off for one command.

    tqdm reads TQDM_DISABLE when it is imported, which the CLI does not do before this point;
    the environment is restored afterwards, so calling main() in-process leaves no trace."""
    if enabled:
        yield
        return
    names = ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")
    saved = {n: os.environ.get(n) for n in names}
    os.environ.update({n: "1" for n in names})
    # transformers (and huggingface_hub) read the variable once, at import: if transformers is
    # already imported, tell it directly. Afterwards its bars go back to what they were (or, if
    # the command imported it, to what the restored environment says).
    hf_logging = sys.modules.get("transformers.utils.logging")
    was_on = hf_logging.is_progress_bar_enabled() if hf_logging else not saved["HF_HUB_DISABLE_PROGRESS_BARS"]
    if hf_logging:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v
        hf_logging = sys.modules.get("transformers.utils.logging")
        if hf_logging and was_on:
            import warnings

            with warnings.catch_warnings():  # huggingface_hub read the variable at import and says so
                warnings.simplefilter("ignore")
                hf_logging.enable_progress_bar()


# ---- run (the main job) ----
def _configure_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="the small fixed subset CI runs")
    p.add_argument("--model", default=None,
                   help="local Llama-family folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--engine", default=None, metavar="NAME",
                   help="engine adapter under test, a registry name such as hf-generate (default: reference)")
    p.add_argument("--engine-url", default=None, metavar="URL",
                   help="base URL of a served engine, for --engine openai (e.g. http://127.0.0.1:8000/v1)")
    p.add_argument("--sensitivity", default=None, metavar="LIST",
                   help="comma-separated sensitivities, e.g. 0.25,0.5,1.0 (default: the suites' own)")
    p.add_argument("--mode", default=None, metavar="LIST",
                   help="comma-separated modes, e.g. lossy,lossless (default: lossy)")
    p.add_argument("--results", default="results/local", metavar="DIR",
                   help="results folder: records go to DIR/runs, the leaderboard to DIR "
                        "(results/local is git-ignored; pass results to publish)")
    p.add_argument("--suites", default=None, help="suites folder (default: ./suites, else the checkout's)")
    p.add_argument("-m", dest="markers", default=None, metavar="EXPR",
                   help="pytest marker expression to select suites (default: all)")
    gate = p.add_mutually_exclusive_group()
    gate.add_argument("--update-baseline", action="store_true",
                      help="promote this run's record to the baseline instead of gating it")
    gate.add_argument("--no-gate", action="store_true",
                      help="write the record but do not compare it with the baseline")
    p.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS",
                   help="anything after -- goes to pytest unchanged (e.g. -- -k equivalence -x)")


def _find_suites(explicit: str | None) -> Path:
    candidates = [Path(explicit)] if explicit else [Path.cwd() / "suites", Path(__file__).resolve().parent.parent / "suites"]
    for c in candidates:
        if (c / "test_equivalence.py").is_file():
            return c
    from .errors import HarnessInputError

    raise HarnessInputError(f"no suites folder found (looked in {', '.join(map(str, candidates))}); pass --suites DIR")


def _check_run(args: argparse.Namespace) -> None:
    """What the suites' plugin would refuse only once pytest started (exit 4, and the leaderboard
    rebuilt anyway), or would not refuse at all, checked while nothing is written yet."""
    import pytest

    from .engines import available_engines, declared_modes
    from .load_client import check_url
    from .pytest_plugin.options import parse_modes, parse_sensitivities

    check_model_path(args.model)
    engine = args.engine or "reference"
    known = available_engines()
    if engine not in known:
        raise UserError(f"--engine {engine!r} is not a registered engine (known: {', '.join(known)})")
    try:  # the plugin's own parsers, so the two cannot disagree; their messages name --rsp-*
        if args.sensitivity is not None:
            parse_sensitivities(args.sensitivity)
        if args.mode is not None:
            modes = parse_modes(args.mode, engine)
            supported = declared_modes(engine)
            bad = [m for m in modes if supported is not None and m not in supported]
            if bad:
                raise UserError(f"--mode {bad[0]!r}: engine {engine!r} does not support it "
                                f"(it supports {', '.join(supported)})")
    except pytest.UsageError as exc:
        raise UserError(str(exc).replace("--rsp-", "--", 1)) from None
    if engine == "openai":
        url = args.engine_url or os.environ.get("RSP_ENGINE_URL")
        if not url:
            raise UserError("--engine openai needs --engine-url URL of the server under test "
                            "(e.g. http://127.0.0.1:8000/v1), or RSP_ENGINE_URL set")
        check_url(url, "--engine-url" if args.engine_url else "RSP_ENGINE_URL")
    check_writable("--results", args.results, folder=True)


def _run_run(args: argparse.Namespace) -> int:
    import pytest

    from . import leaderboard

    suites = _find_suites(args.suites)
    _check_run(args)
    argv = [str(suites), "-p", "no:cacheprovider", f"--rsp-results={args.results}"]
    if args.quick:
        argv.append("--rsp-quick")
    if args.model:
        argv.append(f"--rsp-model={args.model}")
    if args.engine:
        argv.append(f"--rsp-engine={args.engine}")
    if args.engine_url:
        argv.append(f"--rsp-engine-url={args.engine_url}")
    if args.no_gate:
        argv.append("--rsp-no-gate")
    if args.sensitivity:
        argv.append(f"--rsp-sensitivity={args.sensitivity}")
    if args.mode:
        argv.append(f"--rsp-mode={args.mode}")
    if args.markers:
        argv += ["-m", args.markers]
    if args.update_baseline:
        argv.append("--rsp-update-baseline")
    argv += args.pytest_args
    code = int(pytest.main(argv))
    if code == pytest.ExitCode.USAGE_ERROR:  # nothing ran: a rebuilt leaderboard would only restate old records
        return code
    out = Path(args.results)
    paths = leaderboard.write_leaderboard(out, out)  # a results folder: its runs/ are read
    print()
    print(Path(paths["md"]).read_text())
    print(f"leaderboard: {paths['md']}, {paths['html']}, {paths['png']}")
    return code


def _commands() -> dict[str, tuple[str, Callable, Callable]]:
    """name -> (help, configure(parser), run(args)); feature modules are imported lazily."""

    def lazy(module: str, configure: str, run: str):
        def conf(p):
            mod = __import__(f"rsp_bench.{module}", fromlist=[configure])
            getattr(mod, configure)(p)

        def go(a):
            mod = __import__(f"rsp_bench.{module}", fromlist=[run])
            return getattr(mod, run)(a)
        return conf, go

    table = {
        "generate": ("one request through the reference engine", *lazy("generate_cli", "configure_parser", "run")),
        "calibrate": ("measure and cache a model's router calibration, unit predictor and sensitivity scale",
                      *lazy("calibrate_cli", "configure_parser", "run")),
        "run": ("run the suites, write records, gate, rebuild the leaderboard", _configure_run, _run_run),
        "project": ("projected tokens/s and GPU idle time per profile", *lazy("speed", "configure_project_parser", "run_project")),
        "bench": ("measured interleaved decode speed on this machine", *lazy("speed", "configure_bench_parser", "run_bench")),
        "ab": ("A/B of a base ref and the working tree (or two URLs) on this machine: exit 1 on a decided slowdown",
               *lazy("ab.cli", "configure_parser", "run")),
        "gate": ("compare a run record with a baseline (exit 1 on regression)", *lazy("gate", "configure_gate_parser", "run_gate")),
        "compare": ("do two run records hold the same deterministic figures? (exit 1 where they differ)",
                    *lazy("records.compare", "configure_parser", "run")),
        "leaderboard": ("rebuild leaderboard tables from run records", *lazy("leaderboard", "configure_leaderboard_parser", "run_leaderboard")),
        "baseline": ("update or show baselines", *lazy("baselines", "configure_baseline_parser", "run_baseline")),
        "router-curve": ("the unit router's quality/speed curve against static removal of the same bytes (~35 min)",
                         *lazy("router_curve_measure", "configure_parser", "run")),
        "sensitivity-scale": ("what each sensitivity means for the unit router, measured on a prompt file",
                              *lazy("sensitivity_cli", "configure_parser", "run")),
        "lossless": ("lossless mode against pruning off: speed (interleaved) and exactness, on SQuAD, free or your prompts",
                     *lazy("lossless_measure", "configure_parser", "run")),
        "tune": ("sweep sensitivity and recommend one", *lazy("tune", "configure_tune_parser", "run_tune")),
        "degradation": ("protective degradation on a held-out prompt file: rates, each error's cost, the check's cost",
                        *lazy("degradation_report", "configure_parser", "run")),
        "language-damage": ("pruning's damage per language pooled over several degradation reports (sign test over splits)",
                            *lazy("language_damage_pool", "configure_parser", "run")),
        "loadtest": ("bounded concurrent load against an OpenAI-compatible server, checked",
                     *lazy("loadtest", "configure_parser", "run")),
        # The server lives beside the engine it serves (it must not import the harness).
        "serve": ("serve the reference engine over an OpenAI-compatible HTTP API",
                  lambda p: __import__("reference_engine.server.main", fromlist=["run"]).configure_parser(p),
                  lambda a: __import__("reference_engine.server.main", fromlist=["run"]).run(a)),
    }
    return table


class _VersionAction(argparse.Action):
    """``--version``: the installed package's version, read from its metadata only when asked
    (importing importlib.metadata costs a tenth of a second that every other command would pay)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kw) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the installed version and exit", **kw)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("rsp-bench")
        except PackageNotFoundError:  # run from a checkout that was never installed
            text = "unknown (not installed: pip install -e .)"
        print(f"{parser.prog} {text}")
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="rsp-bench", description="Benchmark and regression harness for residual-stream pruning.")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands = _commands()
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (help_text, configure, _) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_HelpFormatter)
        if name == chosen:  # only the chosen command's module is imported
            try:
                configure(p)
            except ModuleNotFoundError as exc:
                parser.error(f"command {name!r} is unavailable: {exc}")
            if "--quiet" not in p._option_string_actions:
                p.add_argument("--quiet", action="store_true",
                               help="no progress bars or loading messages (implied by --json where there is one)")
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    from reference_engine.errors import EngineInputError

    if isinstance(getattr(args, "results", None), str):
        args.results_typed, args.results = args.results, results_folder(args.results)
    args.quiet = bool(getattr(args, "quiet", False) or getattr(args, "json", False))
    try:
        check_inputs(args.command, args)
        if getattr(args, "results_typed", None) not in (None, getattr(args, "results", None)):
            sys.stderr.write(f"rsp-bench {args.command}: note: --results {args.results_typed} is the runs folder "
                             f"itself; using {args.results}, the folder that holds it\n")
        with _progress_bars(not args.quiet):
            return int(commands[args.command][2](args) or 0)
    except (EngineInputError, HarnessInputError) as exc:
        sys.stderr.write(f"rsp-bench {args.command}: error: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"rsp-bench {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("rsp-bench: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
