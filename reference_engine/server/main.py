"""``rsp-bench serve``: load the engine, bind the socket, run the app under uvicorn.

The CLI (``rsp_bench.cli``) only calls ``configure_parser`` and ``run`` here. The socket is bound
before uvicorn starts, so ``--port 0`` takes a free port, and the line
``rsp-bench serve: listening on http://HOST:PORT`` on stderr says which (tests read it).
SIGINT / SIGTERM: uvicorn stops accepting, lets requests in flight finish (up to
``--graceful-timeout`` seconds, then cancels them), then the worker cancels what is still
queued; the process exits 0.

Must not import the harness.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import threading
from typing import IO

from ..config import PruningConfig, parse_blacklist
from ..errors import ConfigError


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


def default_config(args: argparse.Namespace) -> PruningConfig:
    kw = {"sensitivity": args.sensitivity, "log_level": args.log_level, "mode": args.mode,
          "hardware_watermark": args.hardware_watermark}
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

        _Server = _server_class()

        engine = Engine.load(args.model, progress=lambda m: print(m, file=sys.stderr))
        config.blacklist_for(engine.dims.n_layers)
        app = create_app(engine, ServerSettings(config, max_queue=args.max_queue, retry_after_s=args.retry_after,
                                                max_batch=args.max_batch, batch_window_ms=args.batch_window_ms,
                                                batch_modes=args.batch_modes,
                                                served_model_name=args.served_model_name, log_file=log_file))
        port = sock.getsockname()[1]
        server = _Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=args.graceful_timeout,
                                               access_log=False))
        print(f"rsp-bench serve: listening on http://{args.host}:{port} (model {engine.name})", file=sys.stderr, flush=True)
        server.run(sockets=[sock])
        how = f" on {signal.Signals(server.stop_signal).name}" if server.stop_signal else ""
        print(f"rsp-bench serve: stopped{how}", file=sys.stderr, flush=True)
        return 0
    finally:
        if log_file is not None:
            log_file.close()
