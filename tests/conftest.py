"""Shared fixtures for the unit tests: a seeded tiny random Llama model and its engine.

The tiny model (6 blocks, hidden 64, a 400-token BPE vocabulary) is built once per session in a
temporary folder, and its calibration is cached there too, so unit tests never touch the user's
cache or the embedded model.
"""

from __future__ import annotations

import os
from pathlib import Path

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
