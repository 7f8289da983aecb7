"""The ``rsp-bench`` command line: one subcommand per job, each a thin layer over a library module.

    rsp-bench generate PROMPT|-      one request through the reference engine
    rsp-bench calibrate              measure and cache a model's router calibration
    rsp-bench run [--quick]          the suites, records, gate and leaderboard (the main job)
    rsp-bench project                projected tokens/s and GPU idle time per hardware profile
    rsp-bench bench                  measured, interleaved decode speed on this machine
    rsp-bench gate                   compare a run record with a baseline; exit 1 on regression
    rsp-bench leaderboard            rebuild the leaderboard tables from the records
    rsp-bench baseline update|show   manage committed baselines
    rsp-bench tune                   sweep sensitivity and recommend one

Bad input exits 2 with one line on stderr naming the bad value, never a traceback.
Must not import torch at module level: ``rsp-bench --help`` stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Sequence


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"rsp-bench: error: {message}\n")
        raise SystemExit(2)


def _float_arg(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
    return parse


# ---- generate ----
def _configure_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the prompt text, or - to read it from standard input (any bytes)")
    p.add_argument("--model", default=None, help="local Llama-family folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--sensitivity", type=_float_arg("--sensitivity"), default=0.5)
    p.add_argument("--blacklist", default=None, help="comma-separated block indices never bypassed (default: first and last)")
    p.add_argument("--log-level", default="SUMMARY", help="NONE, SUMMARY or DETAILED")
    p.add_argument("--log-file", default=None, help="write JSON-lines logs here instead of stderr")
    p.add_argument("--mode", default="lossy", help="off, lossy or lossless")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=_float_arg("--temperature"), default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")


def _run_generate(args: argparse.Namespace) -> int:
    from reference_engine.config import PruningConfig, parse_blacklist
    from reference_engine.errors import PromptError

    kw = {"sensitivity": args.sensitivity, "log_level": args.log_level, "mode": args.mode}
    if args.blacklist is not None:
        kw["layer_blacklist"] = parse_blacklist(args.blacklist)
    config = PruningConfig(**kw)  # validated before the model loads, so bad input fails fast
    if args.max_new_tokens < 1:
        raise PromptError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.prompt == "-":
        prompt = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    else:
        prompt = args.prompt

    from reference_engine import Engine

    engine = Engine.load(args.model, progress=lambda m: print(m, file=sys.stderr))
    config.blacklist_for(engine.dims.n_layers)
    log_file = open(args.log_file, "a", encoding="utf-8") if args.log_file else sys.stderr
    try:
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
        print(f"[{s['total_tokens']} tokens, {s['layers_bypassed']} block-steps bypassed "
              f"({s['bypass_ratio']:.1%}), mode {s['mode']}, sensitivity {s['sensitivity']}{deg}]",
              file=sys.stderr)
    return 0


# ---- calibrate ----
def _configure_calibrate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--force", action="store_true", help="measure again even if cached")


def _run_calibrate(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from reference_engine import Engine

    engine = Engine.load(args.model, calibrate=False)
    cal = engine.calibration(progress=lambda m: print(m, file=sys.stderr), force=args.force)
    rows = [(i, f"{cal.rel_mean[i]:.3f}", f"{cal.block_influence[i]:.3f}", f"{cal.impact_identity[i]:.3f}",
             f"{cal.impact_linear[i]:.3f}", "linear" if cal.use_linear[i] else "identity")
            for i in range(cal.n_layers)]
    print(tabulate(rows, headers=["block", "rel. update", "block influence", "KL identity (nats)",
                                  "KL linear (nats)", "bypass"]))
    print(f"entropy_ref {cal.entropy_ref:.3f} nats, density_ref {cal.density_ref:.3f}, "
          f"prompt nll {cal.nll_mean:.3f} +- {cal.nll_std:.3f}; weights {cal.weights_sha256[:16]}")
    return 0


# ---- run (the main job) ----
def _configure_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="the small fixed subset CI runs")
    p.add_argument("--model", default=None)
    p.add_argument("--sensitivity", default=None, help="comma-separated, e.g. 0.25,0.5,1.0")
    p.add_argument("--mode", default=None, help="comma-separated modes, e.g. lossy,lossless")
    p.add_argument("--results", default="results")
    p.add_argument("--suites", default=None, help="suites folder (default: ./suites, else the checkout's)")
    p.add_argument("-m", dest="markers", default=None, help="pytest marker expression to select suites")
    p.add_argument("--update-baseline", action="store_true")


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
    argv = [str(suites), "-p", "no:cacheprovider", f"--rsp-results={args.results}"]
    if args.quick:
        argv.append("--rsp-quick")
    if args.model:
        argv.append(f"--rsp-model={args.model}")
    if args.sensitivity:
        argv.append(f"--rsp-sensitivity={args.sensitivity}")
    if args.mode:
        argv.append(f"--rsp-mode={args.mode}")
    if args.markers:
        argv += ["-m", args.markers]
    if args.update_baseline:
        argv.append("--rsp-update-baseline")
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
        "calibrate": ("measure and cache a model's router calibration", _configure_calibrate, _run_calibrate),
        "run": ("run the suites, write records, gate, rebuild the leaderboard", _configure_run, _run_run),
        "project": ("projected tokens/s and GPU idle time per profile", *lazy("speed", "configure_project_parser", "run_project")),
        "bench": ("measured interleaved decode speed on this machine", *lazy("speed", "configure_bench_parser", "run_bench")),
        "gate": ("compare a run record with a baseline (exit 1 on regression)", *lazy("gate", "configure_gate_parser", "run_gate")),
        "leaderboard": ("rebuild leaderboard tables from run records", *lazy("leaderboard", "configure_leaderboard_parser", "run_leaderboard")),
        "baseline": ("update or show baselines", *lazy("baselines", "configure_baseline_parser", "run_baseline")),
        "tune": ("sweep sensitivity and recommend one", *lazy("tune", "configure_tune_parser", "run_tune")),
    }
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="rsp-bench", description="Benchmark and regression harness for residual-stream pruning.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands = _commands()
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (help_text, configure, _) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # only the chosen command's module is imported
            try:
                configure(p)
            except ModuleNotFoundError as exc:
                parser.error(f"command {name!r} is unavailable: {exc}")
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    from reference_engine.errors import EngineInputError

    from .errors import HarnessInputError

    try:
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
