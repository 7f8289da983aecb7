"""The ``rsp-bench project`` and ``rsp-bench bench`` commands: argument parsing, and the glue that
loads an engine, runs the interleaved bench or the projection, and prints tables or JSON.

Must NOT import the reference engine at module level: ``project --executed-blocks`` must not
load a model.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rsp_bench.errors import HarnessInputError
from rsp_bench.profiles import PROFILES, get_profile, normalize_dtype
from rsp_bench.projection import ModelShape, projection_json, projection_table
from rsp_bench.speed.calls import adapter_call, engine_call, fixed_prompts, hf_generate_call, prompts_for_batch
from rsp_bench.speed.figures import (HF_ID, OFF_ID, PROJECTION_CONTEXT, bench_figures, engine_bypass,
                                     mean_executed_blocks, model_shape, router_cost_per_token)
from rsp_bench.speed.interleaved import CallTiming, InterleavedBench
from rsp_bench.speed.roofline import bandwidth_roofline

def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return v


def _int_list(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if part:
            out.append(_positive_int(part))
    if not out:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}")
    return out


def _unit_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= v <= 1.0:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return v


def _float_list(text: str) -> list[float]:
    out = [_unit_float(p.strip()) for p in text.split(",") if p.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of numbers, got {text!r}")
    return out


def configure_project_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``rsp-bench project`` (projected figures only; nothing here is measured
    except, without --executed-blocks, the blocks the engine runs per token)."""
    p.add_argument("--model", default=None,
                   help="local Hugging Face Llama-family folder or .gguf (default: the embedded model)")
    p.add_argument("--profiles", default=",".join(PROFILES),
                   help=f"comma-separated hardware profiles (default: {','.join(PROFILES)})")
    p.add_argument("--batch", type=_positive_int, default=1, help="sequences decoded together (default 1)")
    p.add_argument("--context", type=_positive_int, default=PROJECTION_CONTEXT,
                   help=f"cached positions attention reads per step (default {PROJECTION_CONTEXT})")
    p.add_argument("--sensitivity", type=_unit_float, default=0.5,
                   help="pruning sensitivity of the measured short generation (default 0.5)")
    p.add_argument("--dtype", default="fp16", help="fp16 or bf16 (default fp16)")
    p.add_argument("--executed-blocks", type=float, default=None, metavar="X",
                   help="blocks executed per decode token when pruned; skips the measuring generation")
    p.add_argument("--bypass-rank", type=int, default=None, metavar="R",
                   help="rank of the linear bypass map (0: identity); default: the engine's calibration "
                        "when the engine is loaded, else identity")
    p.add_argument("--tokens", type=_positive_int, default=24,
                   help="tokens per prompt of the measuring generation (default 24)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object keyed by profile (off and pruned figures)")
    return p


def _shape_without_engine(model: str | None) -> ModelShape | None:
    """The shape when it can be read without loading weights; None when it cannot."""
    if model is None:
        return ModelShape.smollm2_135m()
    path = Path(model)
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise HarnessInputError(f"--model {model!r}: folder has no config.json")
        try:
            return ModelShape.from_hf_config(json.loads(cfg.read_text(encoding="utf-8")))
        except json.JSONDecodeError as exc:
            raise HarnessInputError(f"--model {model!r}: config.json is not JSON ({exc})") from exc
    if not path.exists():
        raise HarnessInputError(f"--model {model!r} does not exist")
    return None


def _measure_executed_blocks(engine: Any, sensitivity: float, tokens: int,
                             n_prompts: int = 4) -> tuple[float, float]:
    """(mean blocks per decode token, router us per step) of a short pruned generation.

    The router's load signal is pinned to an idle machine (hardware_watermark=0) so the figure
    does not depend on what else this machine is running.
    """
    from reference_engine import PruningConfig

    cfg = PruningConfig(sensitivity=sensitivity, mode="lossy" if sensitivity > 0 else "off",
                        log_level="NONE", hardware_watermark=0.0)
    stats = [engine.generate([p], max_new_tokens=tokens, config=cfg)[0].stats
             for p in fixed_prompts(n_prompts)]
    stats = [s for s in stats if s["executed_blocks_per_step"]]
    if not stats:
        raise HarnessInputError("the measuring generation made no decode step; raise --tokens")
    router_us = (router_cost_per_token(stats)["ms_per_token"] * 1000.0
                 if any(s["router_time_s"] > 0 for s in stats) else 0.0)
    return mean_executed_blocks(stats), router_us


def run_project(args: argparse.Namespace) -> int:
    """``rsp-bench project``: print projected figures for pruning off and pruned."""
    try:
        dtype = normalize_dtype(args.dtype)
        profiles = [get_profile(p) for p in str(args.profiles).split(",") if p.strip()]
        if not profiles:
            raise HarnessInputError(f"--profiles {args.profiles!r} names no profile")
        for prof in profiles:
            prof.peak_tflops(dtype)  # bf16 on a V100: an error naming the card
        shape = _shape_without_engine(args.model)
        engine = None
        router_us = 0.0
        if args.executed_blocks is None or shape is None:
            from reference_engine import Engine

            engine = Engine.load(args.model, calibrate=args.executed_blocks is None)
            shape = model_shape(engine)
        if args.executed_blocks is not None:
            blocks = float(args.executed_blocks)
            if not math.isfinite(blocks) or not 0 <= blocks <= shape.n_layers:
                raise HarnessInputError(
                    f"--executed-blocks {args.executed_blocks!r} is outside [0, {shape.n_layers}] "
                    "(the model's blocks)")
            source = "given by --executed-blocks"
        else:
            blocks, router_us = _measure_executed_blocks(engine, args.sensitivity, args.tokens)
            source = (f"measured: mean of a {args.tokens}-token generation on 4 fixed prompts at "
                      f"sensitivity {args.sensitivity}")
        if args.bypass_rank is not None:
            if args.bypass_rank < 0:
                raise HarnessInputError(f"--bypass-rank must be >= 0, got {args.bypass_rank}")
            kind, rank = ("linear", args.bypass_rank) if args.bypass_rank > 0 else ("identity", 0)
        elif engine is not None and args.executed_blocks is None:
            kind, rank = engine_bypass(engine)
        else:
            kind, rank = "identity", 0
        kw = {"router_host_us_per_block": router_us / shape.n_layers} if router_us else {}
        if args.json:
            out = projection_json(shape, profiles, dtype, args.batch, args.context, blocks,
                                  kind, rank, **kw)
            print(json.dumps(out, indent=2))
            return 0
        from tabulate import tabulate

        rows = projection_table(shape, profiles, dtype, args.batch, args.context, blocks,
                                kind, rank, **kw)
        model = args.model or "embedded SmolLM2-135M-Instruct"
        print(f"PROJECTED (roofline model from datasheet figures, not measured): {model}, "
              f"{shape.n_layers} blocks, {dtype}, batch {args.batch}, context {args.context}")
        print(f"pruned: {blocks:.2f} of {shape.n_layers} blocks per token ({source}); "
              f"bypass {kind}{f' rank {rank}' if rank else ''}"
              + (f"; router host time {router_us:.0f} us/step (measured here)" if router_us else ""))
        print(tabulate(rows, headers="keys", floatfmt="g"))
        return 0
    except (HarnessInputError, ValueError) as exc:
        print(f"rsp-bench project: error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------------------
# CLI: rsp-bench bench
# --------------------------------------------------------------------------------------

def configure_bench_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``rsp-bench bench`` (measured, interleaved, on this machine)."""
    p.add_argument("--model", default=None,
                   help="local Hugging Face Llama-family folder or .gguf (default: the embedded model)")
    p.add_argument("--batch", type=_int_list, default=[1, 4, 8], help="batch sizes (default 1,4,8)")
    p.add_argument("--tokens", type=_positive_int, default=48, help="new tokens per call (default 48)")
    p.add_argument("--rounds", type=_positive_int, default=8, help="interleaved rounds (default 8)")
    p.add_argument("--sensitivity", type=_float_list, default=[0.5],
                   help="pruned configurations, comma-separated sensitivities (default 0.5)")
    p.add_argument("--no-hf", action="store_true", help="leave model.generate out")
    p.add_argument("--kernel", choices=DECODE_KERNELS, default=None,
                   help="decode kernel of reference/off and the pruned configurations (default: the "
                        "engine's, RSP_DECODE_KERNEL=auto: native where a C compiler builds it, else "
                        "torch): torch (transformers' own kernels), numpy (OpenBLAS GEMV, last-bit "
                        "differences) or native (the whole step in C, compiled on first use; last-bit "
                        "differences)")
    p.add_argument("--compare-kernels", type=_kernel_list, default=None, metavar="K[,K]",
                   help="also run pruning off on these decode kernels, as reference/off/kernel=K "
                        "(default: every kernel but --kernel; 'none' for none)")
    p.add_argument("--lossless", action="store_true", help="also run reference/lossless")
    p.add_argument("--llama-cpp", action="store_true",
                   help="also run llama.cpp (llama-cpp-python) on the rungs of RSP_LLAMA_CPP_LADDER, "
                        "batch 1 only (its adapter decodes one sequence at a time)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p


DECODE_KERNELS = ("torch", "numpy", "native")  # reference_engine.model.DECODE_KERNELS, not imported: no model load


def _kernel_list(text: str) -> list[str]:
    if text.strip() == "none":
        return []
    out = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in out if k not in DECODE_KERNELS]
    if bad or not out:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(DECODE_KERNELS)} (or none), got {text!r}")
    return out


def _bench_calls(engine: Any, prompts: Sequence[str], batch: int, tokens: int,
                 configs: Mapping[str, tuple[Any, str]], include_hf: bool,
                 llama: Any = None) -> dict[str, Callable[[], CallTiming]]:
    batch_prompts = prompts_for_batch(prompts, batch)
    calls = {cid: engine_call(engine, batch_prompts, tokens, cfg, kernel)
             for cid, (cfg, kernel) in configs.items()}
    if llama is not None and batch == 1:
        for spec in llama.configurations():
            calls[spec.config_id] = adapter_call(llama, spec, batch_prompts, tokens)
    if include_hf:
        calls[HF_ID] = hf_generate_call(engine.hf_model, [engine.encode(p) for p in batch_prompts],
                                        tokens, engine.pad_id, engine.eos_id)
    return calls


def run_bench(args: argparse.Namespace) -> int:
    """``rsp-bench bench``: engine off vs pruned vs model.generate, interleaved, measured."""
    try:
        from reference_engine import Engine, PruningConfig

        engine = Engine.load(args.model)
        if args.kernel is None:
            args.kernel = engine.decode_kernel
        off = PruningConfig(mode="off", log_level="NONE")
        configs: dict[str, tuple[Any, str]] = {OFF_ID: (off, args.kernel)}
        others = args.compare_kernels if args.compare_kernels is not None else \
            [k for k in DECODE_KERNELS if k != args.kernel and (k != "native" or engine.decode_kernel == "native")]
        for k in others:
            if k != args.kernel:
                configs[f"{OFF_ID}/kernel={k}"] = (off, k)
        for s in args.sensitivity:
            configs[f"reference/lossy/s={s:.2f}"] = (PruningConfig(
                sensitivity=s, mode="lossy", log_level="NONE", hardware_watermark=0.0), args.kernel)
        if args.lossless:
            configs["reference/lossless"] = (PruningConfig(mode="lossless", log_level="NONE"), args.kernel)
        llama = None
        if args.llama_cpp:
            from rsp_bench.engines.llama_cpp import LlamaCppAdapter

            llama = LlamaCppAdapter(engine, args.model)
        roof = bandwidth_roofline(engine)
        prompts = fixed_prompts()
        results: dict[str, Any] = {"roofline": roof.to_dict(), "decode_kernel": args.kernel,
                                   "batches": {}}
        if not args.json:
            print(f"MEASURED on this machine ({roof.threads} threads); interleaved rounds, "
                  f"{args.rounds} rounds x {args.tokens} tokens, warm-up excluded; reference decode "
                  f"kernel {args.kernel}")
            kernels = ", ".join(f"{k} {v['gbs']:.1f}" for k, v in roof.kernels.items())
            print(f"roofline: {roof.gbs:.1f} GB/s ({roof.kernel}, the fastest of: {kernels} GB/s), "
                  f"{roof.tokens_per_s:.1f} tokens/s at {roof.bytes_per_token / 1e6:.0f} MB per token; "
                  f"torch's own GEMV (the old roofline): {roof.torch_gemv_tokens_per_s:.1f} tokens/s")
        for batch in args.batch:
            bench = InterleavedBench(_bench_calls(engine, prompts, batch, args.tokens, configs,
                                                  not args.no_hf, llama))
            bench.warm_up()
            bench.run(args.rounds)
            figs = bench_figures(bench, engine, roof if batch == 1 else None,
                                 hf=None if args.no_hf else HF_ID)
            results["batches"][str(batch)] = figs
            if args.json:
                continue
            from tabulate import tabulate

            rows = []
            for name, f in figs.items():
                def v(key: str, fmt: str = "{:.2f}") -> str:
                    if key not in f:
                        return ""
                    x = f[key]
                    ci = f" [{x['ci'][0]:.2f}, {x['ci'][1]:.2f}]" if x["ci"] else ""
                    return fmt.format(x["value"]) + ci
                rows.append({"config": name, "ttft ms p50": v("ttft_ms_p50", "{:.1f}"),
                             "tpot ms p50": v("tpot_ms_p50", "{:.1f}"),
                             "tpot ms p90": v("tpot_ms_p90", "{:.1f}"),
                             "decode tok/s": v("decode_tokens_per_s", "{:.1f}"),
                             "speed-up vs off": v("speedup_vs_off") or v("speedup_vs_hf_generate"),
                             "blocks/token": v("blocks_executed_per_token"),
                             "GB/s": v("achieved_bandwidth_gbs", "{:.1f}"),
                             "of roofline": v("roofline_fraction"),
                             "router ms/token": v("router_ms_per_token", "{:.3f}"),
                             "measured/ideal": v("speedup_over_ideal")})
            print(f"\nbatch {batch} (decode tok/s: all sequences together; "
                  f"on {OFF_ID} the speed-up column is engine off over model.generate)")
            print(tabulate(rows, headers="keys"))
        if args.json:
            print(json.dumps(results, indent=2))
        return 0
    except (HarnessInputError, ValueError) as exc:
        print(f"rsp-bench bench: error: {exc}", file=sys.stderr)
        return 2


def _main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m rsp_bench.speed project|bench ...``) until cli.py wires it."""
    parser = argparse.ArgumentParser(prog="rsp-bench")
    sub = parser.add_subparsers(dest="command", required=True)
    configure_project_parser(sub.add_parser("project", help="projected GPU figures"))
    configure_bench_parser(sub.add_parser("bench", help="measured interleaved speed"))
    args = parser.parse_args(argv)
    return run_project(args) if args.command == "project" else run_bench(args)
