"""``rsp-bench serve``: load the engine, bind the socket, run the app under uvicorn.

The CLI (``rsp_bench.cli``) only calls ``configure_parser`` and ``run`` here. The socket is bound
before uvicorn starts, so ``--port 0`` takes a free port, and the line
``rsp-bench serve: listening on http://HOST:PORT`` on stderr says which (tests read it).
SIGINT / SIGTERM: uvicorn stops accepting, lets requests in flight finish (up to
``--graceful-timeout`` seconds), then the worker fails what is still queued with 503, tells the
running engine call to stop (it ends within a decode step) and waits for it at most
``--shutdown-deadline`` seconds; the process exits 0.

The API key comes from ``--api-key`` or, when that is not given, the ``RSP_API_KEY`` environment
variable (a key on the command line is visible to every user of the machine in ``ps``). Bound to
a loopback address, the server answers only Host headers naming loopback (DNS rebinding).

Must not import the harness.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import socket
import sys
import threading
from typing import IO

from ..config import PruningConfig, parse_blacklist
from ..errors import ConfigError

API_KEY_ENV = "RSP_API_KEY"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but a SIGINT / SIGTERM is a normal stop: after the graceful drain the
        process returns 0 instead of re-raising the signal (uvicorn's default since 0.29)."""

        stop_signal: int | None = None

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            original = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in original.items():
                    signal.signal(s, handler)

        def _on_signal(self, sig: int, frame) -> None:
            self.stop_signal = sig
            self.handle_exit(sig, frame)

    return Server


def _unit(name: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        return value
    return parse


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="local Llama-family folder or .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (127.0.0.1: this machine only; 0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: a free one, printed on stderr)")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: the engine's name)")
    p.add_argument("--sensitivity", type=_unit("--sensitivity"), default=0.5, help="default sensitivity in [0, 1]")
    p.add_argument("--blacklist", default=None, help="default blacklist, comma-separated block indices (default: first and last)")
    p.add_argument("--log-level", default="SUMMARY", help="default engine log level: NONE, SUMMARY or DETAILED")
    p.add_argument("--log-file", default=None, help="append the engine's JSON-lines logs (tagged with request ids) here")
    p.add_argument("--mode", default="lossy", help="default mode: off, lossy, lossless or static")
    p.add_argument("--router", default=None,
                   help="default lossy router: unit (the engine's default) or block (X-Pruning-Router overrides)")
    p.add_argument("--hardware-watermark", type=_unit("--hardware-watermark"), default=None,
                   help="pin the load factor's watermark in [0, 1] (default: sampled per request)")
    p.add_argument("--max-queue", type=int, default=32, help="requests waiting or running before 429 (default 32)")
    p.add_argument("--max-batch", type=int, default=8,
                   help="greedy requests with identical knobs and max_tokens decoded together, at most (default 8; "
                        "1 disables batching)")
    p.add_argument("--batch-window-ms", type=_unit("--batch-window-ms"), default=10.0,
                   help="how long a batch that is not full waits for more requests of its kind, from the oldest one's arrival or the engine becoming free, whichever is later (default 10 ms)")
    p.add_argument("--batch-modes", default="off,static",
                   help="modes whose requests may share a batch, comma-separated from off, lossy, static (default "
                        "off,static: a batched lossy request is pruned by what every row of its batch agrees on, "
                        "so its output depends on its neighbours)")
    p.add_argument("--retry-after", type=int, default=1, help="seconds in the 429's Retry-After header")
    p.add_argument("--graceful-timeout", type=int, default=30, help="seconds requests in flight get at shutdown")
    p.add_argument("--shutdown-deadline", type=float, default=5.0,
                   help="seconds the engine gets to stop its cancelled call after the graceful drain (default 5)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on every /v1 route (default: ${API_KEY_ENV}, else none)")
    p.add_argument("--max-body-bytes", type=int, default=4 * 2 ** 20, help="largest request body (default 4 MiB; 413 above)")
    p.add_argument("--max-prompts", type=int, default=16, help="prompts in one /v1/completions request (default 16)")
    p.add_argument("--max-stop", type=int, default=4, help="stop strings per request (default 4)")
    p.add_argument("--max-stop-chars", type=int, default=128, help="characters per stop string (default 128)")
    p.add_argument("--max-tokens-limit", type=int, default=None,
                   help="largest max_tokens a request may ask for (default: whatever fits the context)")
    p.add_argument("--max-client-log-level", default="SUMMARY",
                   help="highest engine log level a request may ask for (X-Pruning-Log-Level): NONE, SUMMARY or "
                        "DETAILED (default SUMMARY: DETAILED writes ~30 lines per token)")
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds a request may wait and run before it is stopped with 504 (default 600; 0: none)")
    p.add_argument("--hang-timeout", type=float, default=120.0,
                   help="seconds without engine progress after which the worker counts as hung: waiting requests "
                        "get 503 and /health turns 503 (default 120)")


def default_config(args: argparse.Namespace) -> PruningConfig:
    kw = {"sensitivity": args.sensitivity, "log_level": args.log_level, "mode": args.mode,
          "hardware_watermark": args.hardware_watermark}
    if args.router is not None:
        kw["router"] = args.router
    if args.blacklist is not None:
        kw["layer_blacklist"] = parse_blacklist(args.blacklist)
    return PruningConfig(**kw)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401  (fastapi too: the ``serve`` extra)
        import fastapi  # noqa: F401
    except ModuleNotFoundError as exc:
        raise ConfigError(f"rsp-bench serve needs the 'serve' extra (pip install -e '.[serve]'): {exc}") from None
    import uvicorn

    config = default_config(args)  # validated before the model loads, so bad input fails fast
    if args.max_queue < 1:
        raise ConfigError(f"--max-queue must be >= 1, got {args.max_queue}")
    BATCHABLE_MODES = ("off", "lossy", "static")  # runner.BATCHABLE_MODES (runner imports torch)
    modes = tuple(m.strip() for m in str(args.batch_modes).split(",") if m.strip())
    bad = [m for m in modes if m not in BATCHABLE_MODES]
    if bad:
        raise ConfigError(f"--batch-modes: {bad[0]!r} is not a batchable mode (choose from {', '.join(BATCHABLE_MODES)})")
    args.batch_modes = modes
    if args.max_batch < 1:
        raise ConfigError(f"--max-batch must be >= 1, got {args.max_batch}")
    if not (0.0 <= args.batch_window_ms <= 60_000.0):
        raise ConfigError(f"--batch-window-ms must be in 0..60000, got {args.batch_window_ms}")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if args.retry_after < 0 or args.graceful_timeout < 0:
        raise ConfigError(f"--retry-after and --graceful-timeout must be >= 0, got {args.retry_after}, {args.graceful_timeout}")
    for name in ("max_body_bytes", "max_prompts", "max_stop", "max_stop_chars"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_tokens_limit is not None and args.max_tokens_limit < 1:
        raise ConfigError(f"--max-tokens-limit must be >= 1, got {args.max_tokens_limit}")
    level = str(args.max_client_log_level).upper()
    if level not in ("NONE", "SUMMARY", "DETAILED"):
        raise ConfigError(f"--max-client-log-level must be NONE, SUMMARY or DETAILED, got {args.max_client_log_level!r}")
    for name in ("request_timeout", "hang_timeout", "shutdown_deadline", "retry_after", "graceful_timeout",
                 "batch_window_ms"):
        # NaN passes every range check below (each comparison is False) and then turns a timeout off.
        if not math.isfinite(getattr(args, name)):
            raise ConfigError(f"--{name.replace('_', '-')} must be a finite number, got {getattr(args, name)}")
    if args.request_timeout < 0 or args.hang_timeout <= 0 or args.shutdown_deadline < 0:
        raise ConfigError("--request-timeout and --shutdown-deadline must be >= 0 and --hang-timeout > 0, got "
                          f"{args.request_timeout}, {args.shutdown_deadline}, {args.hang_timeout}")
    import os

    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    if api_key is not None and not api_key.strip():
        # An empty key would silently serve without authentication.
        source = "--api-key" if args.api_key is not None else API_KEY_ENV
        raise ConfigError(f"{source} is empty: give a key, or leave it unset to serve without one")
    loopback = args.host in ("127.0.0.1", "localhost", "::1") or args.host.startswith("127.")
    log_file: IO[str] | None = open(args.log_file, "a", encoding="utf-8") if args.log_file else None
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((args.host, args.port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None

        from ..engine import Engine
        from .app import ServerSettings, create_app
        from .limits import Limits

        _Server = _server_class()

        engine = Engine.load(args.model, progress=lambda m: print(m, file=sys.stderr))
        config.blacklist_for(engine.dims.n_layers)
        if args.router == "unit" and not engine.unit_predictor_available():
            raise ConfigError("--router unit: no unit-router predictor for this model's weights; "
                              "`rsp-bench calibrate --model ...` trains one (about half an hour of CPU)")
        app = create_app(engine, ServerSettings(config, max_queue=args.max_queue, retry_after_s=args.retry_after,
                                                max_batch=args.max_batch, batch_window_ms=args.batch_window_ms,
                                                batch_modes=args.batch_modes,
                                                served_model_name=args.served_model_name, log_file=log_file,
                                                limits=Limits(max_body_bytes=args.max_body_bytes,
                                                              max_prompts=args.max_prompts, max_stop=args.max_stop,
                                                              max_stop_chars=args.max_stop_chars,
                                                              max_tokens=args.max_tokens_limit, max_log_level=level,
                                                              request_timeout_s=args.request_timeout or None),
                                                api_key=api_key, hang_s=args.hang_timeout,
                                                shutdown_deadline_s=args.shutdown_deadline,
                                                allowed_hosts=LOOPBACK_HOSTS + (args.host,) if loopback else None))
        port = sock.getsockname()[1]
        server = _Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=args.graceful_timeout,
                                               access_log=False))
        print(f"rsp-bench serve: listening on http://{args.host}:{port} (model {engine.name}"
              f"{', API key required on /v1' if api_key else ''})", file=sys.stderr, flush=True)
        server.run(sockets=[sock])
        how = f" on {signal.Signals(server.stop_signal).name}" if server.stop_signal else ""
        print(f"rsp-bench serve: stopped{how}", file=sys.stderr, flush=True)
        return 0
    finally:
        if log_file is not None:
            log_file.close()
