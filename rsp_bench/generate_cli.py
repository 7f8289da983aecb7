"""``rsp-bench generate``: one request through the reference engine, its text on stdout and its
stats on stderr (or one JSON object with ``--json``).

Everything that needs no model (the values, the prompt, the blacklist and ``--max-new-tokens``
against the model's header, the log file) is checked before the weights load. Imports the engine
only when the command runs; must not import the pytest plugin or the suites.
"""

from __future__ import annotations

import argparse
import json
import sys

from .cli_checks import (UserError, blacklist_arg, check_blacklist, check_model_path, choice, model_shape, number,
                         open_for_append)

GENERATE_MODES = ("off", "lossy", "lossless")  # "static" needs a block list, which only the suites pass


def configure_parser(p: argparse.ArgumentParser) -> None:
    from reference_engine.config import LOG_LEVELS

    p.add_argument("prompt", help="the prompt text, or - to read it from standard input (any bytes); "
                                  "an empty or all-whitespace prompt is refused (exit 2)")
    p.add_argument("--model", default=None, metavar="PATH", help="local Llama-family folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--sensitivity", type=number("--sensitivity", 0.0, 1.0), default=0.5, metavar="S",
                   help="how eagerly blocks are bypassed, 0 (never: the full model) to 1")
    p.add_argument("--blacklist", type=blacklist_arg, default=None, metavar="I,J,...",
                   help="comma-separated block indices never bypassed, '' for none (default: first and last)")
    p.add_argument("--log-level", type=choice("--log-level", LOG_LEVELS, upper=True), default="SUMMARY",
                   metavar="LEVEL",
                   help=f"engine logs as JSON lines: {', '.join(LOG_LEVELS)}")
    p.add_argument("--log-file", default=None, metavar="FILE",
                   help="append the JSON-lines logs to FILE (default: stderr)")
    p.add_argument("--router", type=choice("--router", ("block", "unit")), default="unit",
                   help="the lossy router: unit (default; attention and MLP apart; sensitivity asks for about "
                        "sensitivity x 20%% of the weight bytes not read) or block (sensitivity scales its threshold)")
    p.add_argument("--mode", type=choice("--mode", GENERATE_MODES), default="lossy",
                   help="off (full model), lossy (the router bypasses blocks) or lossless (pruned drafts, "
                        "full verification: the output equals off)")
    p.add_argument("--max-new-tokens", type=number("--max-new-tokens", 1, integer=True), default=64,
                   metavar="N", help="tokens to generate at most; prompt (chat template included) plus N must "
                                     "fit the model's context")
    p.add_argument("--temperature", type=number("--temperature", 0.0), default=0.0, metavar="T",
                   help="0 is greedy (default); above 0 samples")
    p.add_argument("--seed", type=number("--seed", 0, 2**64 - 1, integer=True), default=None,
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
        raise UserError(f"the prompt {where}is {kind}: give the text as PROMPT, or - to read it from standard input")
    return prompt


def _max_new_tokens_error(n: int, context: int, prompt_tokens: int | None, chat: bool) -> UserError:
    what = "including the chat template" if chat else "(no chat template)"
    if prompt_tokens is None:
        return UserError(f"--max-new-tokens {n} is larger than the model's context of {context} tokens, which "
                          f"must also hold the prompt and the chat template; the largest allowed value is "
                          f"{context} minus the prompt's token count")
    if prompt_tokens >= context:
        return UserError(f"the prompt is {prompt_tokens} tokens {what}, which fills the model's context of "
                          f"{context} tokens: shorten it")
    return UserError(f"--max-new-tokens {n} does not fit: the prompt is {prompt_tokens} tokens {what} and the "
                      f"model's context is {context} tokens, so the largest allowed value is {context - prompt_tokens}")


def run(args: argparse.Namespace) -> int:
    from reference_engine.config import PruningConfig

    # Everything that needs no model is checked first, and the named files opened first: a typo
    # must fail in a second, not after the weights load.
    kw = {"sensitivity": args.sensitivity, "log_level": args.log_level, "mode": args.mode, "router": args.router}
    if args.blacklist is not None:
        kw["layer_blacklist"] = args.blacklist
    config = PruningConfig(**kw)
    check_model_path(args.model)
    prompt = _read_prompt(args.prompt)
    shape = model_shape(args.model)
    if shape:
        check_blacklist(args.blacklist, shape[0])
        if args.max_new_tokens >= shape[1]:
            raise _max_new_tokens_error(args.max_new_tokens, shape[1], None, not args.no_chat)
    log_file = open_for_append("--log-file", args.log_file) if args.log_file else sys.stderr
    try:
        from reference_engine import Engine

        progress = None if args.quiet else (lambda m: print(m, file=sys.stderr))
        engine = Engine.load(args.model, progress=progress)
        dims = engine.dims
        check_blacklist(args.blacklist, dims.n_layers)  # again: the header may have been unreadable
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
