"""Shared fixtures for the unit tests: a seeded tiny random Llama model and its engine, and a
real uvicorn server in a thread for the server tests that need a socket.

The tiny model (6 blocks, hidden 64, a 400-token BPE vocabulary) is built once per session in a
temporary folder, and its calibration is cached there too, so unit tests never touch the user's
cache or the embedded model.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

# Tests that start processes which each import torch and load a model (nested pytest sessions,
# xdist workers, the embedded-model server, a fresh CLI): 92 s of the 134 s `pytest tests` took
# in CI (`pytest tests --durations=30`). They run with --run-slow; CI runs them as a second step.
SLOW_REASON = "starts processes that import torch: run with `pytest tests --run-slow -m slow` (CI does)"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run the tests marked slow (" + SLOW_REASON.split(":")[0] + ")")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: " + SLOW_REASON.split(":")[0] + "; skipped without --run-slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason=SLOW_REASON)
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    # The tiny model's ops are microseconds long: a second intra-op thread only adds spin-wait,
    # and on a shared 2-core machine oversubscription made calibration 8x slower.
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from reference_engine.model_loading import make_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    os.environ["RSP_BENCH_CACHE"] = str(root / "cache")  # calibrations of the tiny model stay here
    return make_tiny_model(root / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    from reference_engine import Engine

    return Engine.load(tiny_model_dir)


@pytest.fixture
def tiny_prefill(tiny_engine):
    """Prefill a prompt on the tiny engine: (ids, lo, hi, hidden), the hidden states per block that
    ``ood.judge`` reads, with the content span [lo, hi) after the first token."""
    import torch

    from reference_engine.model import KVCache, prefill

    def run(text: str) -> tuple[list[int], int, int, list]:
        ids = tiny_engine.encode(text)
        cache = KVCache.allocate(tiny_engine.dims, 1, len(ids))
        hidden: list = []
        prefill(tiny_engine.weights, cache, torch.tensor([ids]), torch.arange(len(ids))[None],
                torch.ones(1, len(ids), dtype=torch.bool), hidden_out=hidden)
        return ids, 1, len(ids), hidden

    return run


@contextlib.contextmanager
def _live_server(app: Any) -> Iterator[str]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="session")
def live_server():
    """``with live_server(app) as url``: ``app`` under a real uvicorn on a free port of
    127.0.0.1, in a thread (a socket matters for disconnects and real clients), stopped after."""
    return _live_server
