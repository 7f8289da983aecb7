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
import json
import math
import os
import re
import struct
import sys
from pathlib import Path
from typing import Callable, Iterator, Sequence

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


class _UserError(HarnessInputError):
    """Bad input found by the CLI itself; the message names the flag as the user typed it."""


def _number(flag: str, lo: float | None = None, hi: float | None = None, *,
            integer: bool = False) -> Callable[[str], float]:
    """An argparse type: a number (an integer if asked) in [lo, hi], named by its flag on error."""
    kind = "an integer" if integer else "a number"
    if lo is not None and hi is not None:
        allowed = f"{kind} in [{lo:g}, {hi:g}]" if not integer else f"{kind} from {lo} to {hi}"
    elif lo is not None:
        allowed = f"{kind} >= {lo:g}" if not integer else f"{kind} >= {lo}"
    else:
        allowed = kind

    def parse(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            value = None
        if (value is None or (not integer and not math.isfinite(value))
                or (lo is not None and value < lo) or (hi is not None and value > hi)):
            raise argparse.ArgumentTypeError(f"{flag} must be {allowed}, got {text!r}")
        return value
    return parse


def _choice(flag: str, allowed: Sequence[str], upper: bool = False) -> Callable[[str], str]:
    """An argparse type: one of ``allowed`` (case-insensitive), named by its flag on error."""
    def parse(text: str) -> str:
        value = text.strip().upper() if upper else text.strip().lower()
        if value not in allowed:
            raise argparse.ArgumentTypeError(f"{flag} must be one of {', '.join(allowed)}, got {text!r}")
        return value
    return parse


def _blacklist_arg(text: str) -> tuple[int, ...]:
    """``--blacklist 0,29``: block indices never bypassed; an empty string means none."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not re.fullmatch(r"\d+", part):
            raise argparse.ArgumentTypeError(
                f"--blacklist must be comma-separated block indices (integers >= 0), got {part!r} in {text!r}")
        out.append(int(part))
    return tuple(out)


def _check_model_path(model: str | None) -> None:
    """--model names a path that exists (the loader says more about one that exists but is wrong)."""
    if model is not None and not Path(model).expanduser().exists():
        raise _UserError(f"--model {model!r} does not exist (give a local Llama-family model folder "
                         "or .gguf file, or leave --model out for the embedded SmolLM2-135M-Instruct)")


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _gguf_shape(path: Path) -> tuple[int, int] | None:
    """(blocks, context) from a GGUF file's metadata header, reading only as far as needed.

    ``gguf.GGUFReader`` maps every tensor first (seconds, here 27 s under load); the two keys
    sit near the start of the key-value section, so this stops as soon as both are read."""
    with open(path, "rb") as f:
        def unpack(fmt: str):
            size = struct.calcsize(fmt)
            data = f.read(size)
            if len(data) != size:
                raise EOFError
            return struct.unpack(fmt, data)[0]

        def text() -> str:
            return f.read(unpack("<Q")).decode("utf-8", "replace")

        def skip(vtype: int) -> object:
            if vtype in _GGUF_SCALARS:
                return unpack(_GGUF_SCALARS[vtype])
            if vtype == 8:
                return text()
            if vtype == 9:
                item, count = unpack("<I"), unpack("<Q")
                if item in _GGUF_SCALARS:
                    f.seek(count * struct.calcsize(_GGUF_SCALARS[item]), 1)
                else:
                    for _ in range(count):
                        skip(item)
                return None
            raise ValueError(vtype)

        if f.read(4) != b"GGUF" or unpack("<I") < 2:
            return None
        unpack("<Q")  # tensor count
        found: dict[str, int] = {}
        for _ in range(unpack("<Q")):
            key, value = text(), skip(unpack("<I"))
            for suffix in (".block_count", ".context_length"):
                if key.endswith(suffix) and isinstance(value, int):
                    found[suffix] = value
            if len(found) == 2:
                return found[".block_count"], found[".context_length"]
    return None


def _model_shape(model: str | None) -> tuple[int, int] | None:
    """(blocks, context in tokens) of the model --model names, read from its config.json or GGUF
    header without loading it; None when that cannot be read cheaply (then the checks run after
    loading, with the same messages)."""
    try:
        if model is None:
            from reference_engine.model_loading import embedded_gguf_path

            return _gguf_shape(embedded_gguf_path())
        path = Path(model).expanduser()
        if path.is_file():
            return _gguf_shape(path) if path.suffix.lower() == ".gguf" else None
        cfg = json.loads((path / "config.json").read_text())
        return int(cfg["num_hidden_layers"]), int(cfg["max_position_embeddings"])
    except Exception:  # any surprise here only postpones the checks until the model is loaded
        return None


def _check_blacklist(blacklist: tuple[int, ...] | None, n_layers: int) -> None:
    for i in blacklist or ():
        if i >= n_layers:
            raise _UserError(f"--blacklist block {i} is out of range: the model has {n_layers} blocks "
                             f"(indices 0 to {n_layers - 1})")


def _open_for_append(flag: str, path: str):
    """Open a file the user named, before any slow work, so a typo fails in a second."""
    try:
        return open(path, "a", encoding="utf-8")
    except OSError as exc:
        raise _UserError(f"{flag} {path!r} cannot be opened for writing: {exc.strerror or exc}") from None


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


# ---- generate ----
GENERATE_MODES = ("off", "lossy", "lossless")  # "static" needs a block list, which only the suites pass


def _configure_generate(p: argparse.ArgumentParser) -> None:
    from reference_engine.config import LOG_LEVELS

    p.add_argument("prompt", help="the prompt text, or - to read it from standard input (any bytes); "
                                  "an empty or all-whitespace prompt is refused (exit 2)")
    p.add_argument("--model", default=None, metavar="PATH", help="local Llama-family folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--sensitivity", type=_number("--sensitivity", 0.0, 1.0), default=0.5, metavar="S",
                   help="how eagerly blocks are bypassed, 0 (never: the full model) to 1")
    p.add_argument("--blacklist", type=_blacklist_arg, default=None, metavar="I,J,...",
                   help="comma-separated block indices never bypassed, '' for none (default: first and last)")
    p.add_argument("--log-level", type=_choice("--log-level", LOG_LEVELS, upper=True), default="SUMMARY",
                   metavar="LEVEL",
                   help=f"engine logs as JSON lines: {', '.join(LOG_LEVELS)}")
    p.add_argument("--log-file", default=None, metavar="FILE",
                   help="append the JSON-lines logs to FILE (default: stderr)")
    p.add_argument("--router", type=_choice("--router", ("block", "unit")), default="unit",
                   help="the lossy router: unit (default; attention and MLP apart; sensitivity asks for about "
                        "sensitivity x 20%% of the weight bytes not read) or block (sensitivity scales its threshold)")
    p.add_argument("--mode", type=_choice("--mode", GENERATE_MODES), default="lossy",
                   help="off (full model), lossy (the router bypasses blocks) or lossless (pruned drafts, "
                        "full verification: the output equals off)")
    p.add_argument("--max-new-tokens", type=_number("--max-new-tokens", 1, integer=True), default=64,
                   metavar="N", help="tokens to generate at most; prompt (chat template included) plus N must "
                                     "fit the model's context")
    p.add_argument("--temperature", type=_number("--temperature", 0.0), default=0.0, metavar="T",
                   help="0 is greedy (default); above 0 samples")
    p.add_argument("--seed", type=_number("--seed", 0, 2**64 - 1, integer=True), default=None,
                   metavar="N",
                   help="seed for sampling with --temperature above 0 (default: unseeded)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: text, token_ids, stats (implies --quiet)")


def _read_prompt(arg: str) -> str:
    if arg == "-":
        prompt, where = sys.stdin.buffer.read().decode("utf-8", errors="replace"), "read from standard input "
    else:
        prompt, where = arg, ""
    if not prompt.strip():
        # An empty request would still generate (the chat template alone is a prompt), and the
        # only hint would be a degraded flag on stderr: refuse it instead.
        kind = "empty" if not prompt else "only whitespace"
        raise _UserError(f"the prompt {where}is {kind}: give the text as PROMPT, or - to read it from standard input")
    return prompt


def _max_new_tokens_error(n: int, context: int, prompt_tokens: int | None, chat: bool) -> _UserError:
    what = "including the chat template" if chat else "(no chat template)"
    if prompt_tokens is None:
        return _UserError(f"--max-new-tokens {n} is larger than the model's context of {context} tokens, which "
                          f"must also hold the prompt and the chat template; the largest allowed value is "
                          f"{context} minus the prompt's token count")
    if prompt_tokens >= context:
        return _UserError(f"the prompt is {prompt_tokens} tokens {what}, which fills the model's context of "
                          f"{context} tokens: shorten it")
    return _UserError(f"--max-new-tokens {n} does not fit: the prompt is {prompt_tokens} tokens {what} and the "
                      f"model's context is {context} tokens, so the largest allowed value is {context - prompt_tokens}")


def _run_generate(args: argparse.Namespace) -> int:
    from reference_engine.config import PruningConfig

    # Everything that needs no model is checked first, and the named files opened first: a typo
    # must fail in a second, not after the weights load.
    kw = {"sensitivity": args.sensitivity, "log_level": args.log_level, "mode": args.mode, "router": args.router}
    if args.blacklist is not None:
        kw["layer_blacklist"] = args.blacklist
    config = PruningConfig(**kw)
    _check_model_path(args.model)
    prompt = _read_prompt(args.prompt)
    shape = _model_shape(args.model)
    if shape:
        _check_blacklist(args.blacklist, shape[0])
        if args.max_new_tokens >= shape[1]:
            raise _max_new_tokens_error(args.max_new_tokens, shape[1], None, not args.no_chat)
    log_file = _open_for_append("--log-file", args.log_file) if args.log_file else sys.stderr
    try:
        from reference_engine import Engine

        progress = None if args.quiet else (lambda m: print(m, file=sys.stderr))
        engine = Engine.load(args.model, progress=progress)
        dims = engine.dims
        _check_blacklist(args.blacklist, dims.n_layers)  # again: the header may have been unreadable
        n_prompt = len(engine.encode(prompt, chat=not args.no_chat))
        if n_prompt + args.max_new_tokens > dims.max_positions:
            raise _max_new_tokens_error(args.max_new_tokens, dims.max_positions, n_prompt, not args.no_chat)
        [res] = engine.generate([prompt], max_new_tokens=args.max_new_tokens, config=config,
                                chat=not args.no_chat, temperature=args.temperature, seed=args.seed,
                                log_file=log_file)
    finally:
        if args.log_file:
            log_file.close()
    stats = {k: v for k, v in res.stats.items() if k not in ("decode_step_times_s",)}
    if args.json:
        print(json.dumps({"text": res.text, "token_ids": res.token_ids, "stats": stats}))
    else:
        print(res.text)
        s = res.stats
        deg = f", degraded ({s['degraded_reason']})" if s["degraded"] else ""
        router = f", {s['router']} router" if s.get("router") else ""
        if s.get("router_fallback"):
            router += " (no unit-router predictor for these weights: `rsp-bench calibrate` trains one)"
        # the unit router skips parts of blocks: its count is in blocks' worth of weight bytes
        what = "blocks' worth of steps" if s.get("router") == "unit" else "block-steps"
        print(f"[{s['total_tokens']} tokens, {s['layers_bypassed']} {what} bypassed "
              f"({s['bypass_ratio']:.1%}), mode {s['mode']}{router}, sensitivity {s['sensitivity']}{deg}]",
              file=sys.stderr)
    return 0


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


def _run_run(args: argparse.Namespace) -> int:
    import pytest

    from . import leaderboard

    suites = _find_suites(args.suites)
    _check_model_path(args.model)
    if args.engine is not None:
        from .engines import available_engines

        known = available_engines()
        if args.engine not in known:
            raise _UserError(f"--engine {args.engine!r} is not a registered engine (known: {', '.join(known)})")
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
        "generate": ("one request through the reference engine", _configure_generate, _run_generate),
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


# Files named on the command line of the lazily loaded commands, checked here so the error names
# the flag as typed whatever the command's own module says later.
_INPUT_FILES = {"gate": (("baseline", "--baseline"), ("run", "--run"), ("policy", "--policy")),
                "compare": (("a", "RUN_A"), ("b", "RUN_B")),
                "tune": (("from_table", "--from-table"),), "degradation": (("prompts", "--prompts"),),
                "lossless": (("prompts", "--prompts"),),
                "router-curve": (("held_out", "--held-out"), ("tune_from", "--tune-from")),
                "sensitivity-scale": (("prompts", "--prompts"),)}


# Files and folders the lazily loaded commands write, most of them only at the end of a long
# measurement: a path that cannot be written must fail now, not after the work is lost.
_OUTPUT_PATHS = {"router-curve": (("out", "--out", False),), "sensitivity-scale": (("out", "--out", False),),
                 "lossless": (("out", "--out", False),), "degradation": (("out", "--out", False),),
                 "loadtest": (("out", "--out", False),), "tune": (("out", "--out", True),),
                 "leaderboard": (("out", "--out", True),),
                 "ab": (("out", "--out", False), ("markdown", "--markdown", False), ("power_out", "--power-out", False),
                        ("logs", "--logs", True))}

# Counts and values those commands take as plain int/float (argparse lets 0, -1 and nan through):
# (dest, flag, lowest, highest, integer).
_NUMBERS = {"router-curve": (("threads", "--threads", 1, None, True), ("speed_prompts", "--speed-prompts", 1, None, True),
                             ("speed_rounds", "--speed-rounds", 1, None, True)),
            "loadtest": (("clients", "--clients", 1, None, True), ("requests", "--requests", 1, None, True),
                         ("max_tokens", "--max-tokens", 1, None, True), ("prompts", "--prompts", 1, None, True),
                         ("max_queue", "--max-queue", 1, None, True), ("max_batch", "--max-batch", 1, None, True),
                         ("batch_window_ms", "--batch-window-ms", 0, None, False), ("soak", "--soak", 1, None, False),
                         ("soak_requests", "--soak-requests", 1, None, True),
                         ("sensitivity", "--sensitivity", 0, 1, False),
                         ("hardware_watermark", "--hardware-watermark", 0, 1, False))}
_LOADTEST_MODES = ("off", "lossy", "lossless", "static")


def _check_writable(flag: str, value: str, folder: bool) -> None:
    """``value`` can be written as a file (or created as a folder), found without writing it."""
    import tempfile

    path = Path(value).expanduser()
    if not folder and path.is_dir():
        raise _UserError(f"{flag} {value!r} is a folder; give a file path")
    if folder and path.exists() and not path.is_dir():
        raise _UserError(f"{flag} {value!r} is a file; give a folder")
    base = path if folder else path.parent
    while not base.exists():  # the command creates the missing folders; the nearest existing one must take them
        base = base.parent
    try:
        if not base.is_dir():
            raise NotADirectoryError(20, f"{base} is not a folder")
        # root passes os.access everywhere, so try it: an unnamed file that is gone when closed
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as exc:
        raise _UserError(f"{flag} {value!r} cannot be written: {exc.strerror or exc} (in {base})") from None


def _check_inputs(command: str, args: argparse.Namespace) -> None:
    for dest, flag in _INPUT_FILES.get(command, ()):
        value = getattr(args, dest, None)
        if value is None:
            continue
        value = str(value)  # some commands parse it to a Path, whose repr is not what the user typed
        if not Path(value).exists():
            raise _UserError(f"{flag} {value!r} does not exist")
        if Path(value).is_dir():
            raise _UserError(f"{flag} {value!r} is a folder; give a file")
    for dest, flag, lo, hi, integer in _NUMBERS.get(command, ()):
        value = getattr(args, dest, None)
        if value in (None, ""):  # not given ('' is loadtest's "send no watermark")
            continue
        try:
            _number(flag, lo, hi, integer=integer)(str(value))
        except argparse.ArgumentTypeError as exc:
            raise _UserError(str(exc)) from None
    if command == "loadtest" and args.mode not in _LOADTEST_MODES:
        raise _UserError(f"--mode must be one of {', '.join(_LOADTEST_MODES)}, got {args.mode!r}")
    for dest, flag, folder in _OUTPUT_PATHS.get(command, ()):
        value = getattr(args, dest, None)
        if value is not None and str(value) != "-":  # --markdown with no PATH prints to stdout
            _check_writable(flag, str(value), folder)
    if command == "baseline" and args.baseline_action == "show":
        # listing a folder that is not there would print "no baselines" and exit 0: a typo unnoticed
        flag, typed, where = (("--baselines", args.baselines, args.baselines) if args.baselines
                              else ("--results", args.results_typed, args.results))
        if not Path(where).is_dir():
            raise _UserError(f"{flag} {typed!r} is not a folder")
    if command == "leaderboard":
        from .records import record_paths

        typed = getattr(args, "results_typed", args.results)
        if not Path(args.results).is_dir():
            raise _UserError(f"--results {typed!r} does not exist (give the results folder that holds runs/)")
        if not record_paths(args.results):
            raise _UserError(f"--results {typed!r}: no run records in {Path(args.results) / 'runs'} "
                             "(give the results folder that holds runs/, or run `rsp-bench run` first)")


def _results_folder(text: str) -> str:
    """--results names the folder that holds runs/; a user pointing at runs/ itself means its parent."""
    path = Path(text)
    if path.name == "runs" and path.is_dir() and not (path / "runs").is_dir():
        return str(path.parent)
    return text


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
        args.results_typed, args.results = args.results, _results_folder(args.results)
    args.quiet = bool(getattr(args, "quiet", False) or getattr(args, "json", False))
    try:
        _check_inputs(args.command, args)
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
