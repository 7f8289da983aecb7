"""Distributed runs (rsp_bench.distributed with pytest-xdist): configurations grouped on workers,
one merged record whose figures equal a serial run's, the reference set computed once on disk,
a crashed worker failing the run with a partial record, and an execnet popen gateway with its
own interpreter as the stand-in for a second host.

Inner sessions run in subprocesses (xdist forks workers) on the tiny model.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from rsp_bench.records import load_record

pytest.importorskip("xdist", reason="pytest-xdist is not installed (pip install pytest-xdist)")
pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow

SUITE = """
    import os
    import time
    import pytest

    @pytest.mark.equivalence
    def test_cfg(rsp_config, rsp_record, rsp_reference_outputs):
        if rsp_config.config_id == os.environ.get("CRASH_ON"):
            # late enough that the other worker has recorded its rows: a partial record holds them
            time.sleep(5)
            os._exit(3)
        ref = rsp_reference_outputs.get("x", ["hello there", "a b c"], 3)
        rsp_record.add_metric(rsp_config.config_id, "exact_match_rate", 1.0, n=2, unit="fraction")
        rsp_record.add_metric(rsp_config.config_id, "prefix_agreement", len(ref[0].token_ids) / 3, n=2,
                              unit="fraction")
"""


CRASH_GROUPS = """
    import os
    import pytest

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(items):
        for item in items:
            spec = getattr(item, "callspec", None)
            config_id = spec.params.get("rsp_config") if spec is not None else None
            crashing = config_id is not None and config_id == os.environ.get("CRASH_ON")
            item.add_marker(pytest.mark.xdist_group("crash" if crashing else "rest"))
"""


def _run(pytester: pytest.Pytester, model: Path, *extra: str, env: dict | None = None) -> pytest.RunResult:
    pytester.makepyfile(test_suite=textwrap.dedent(SUITE))
    # The tiny model's ops are microseconds long: one thread per process (tests/conftest.py).
    # RSP_BENCH_CACHE stays the tiny model's (its calibration is there; the subprocesses inherit it).
    pytester._monkeypatch.setenv("OMP_NUM_THREADS", "1")
    if env:
        for k, v in env.items():
            pytester._monkeypatch.setenv(k, v)
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--rsp-model", str(model), "--rsp-sensitivity", "0.25,0.5",
        "--rsp-results", "out", "--rsp-baselines", "out/baselines", *extra, timeout=600)


def _expected(tiny_engine) -> set[str]:
    """The rows a tiny-model run plans: off, the block router's comparison rows, and the default
    (unit) router's rows only where a unit predictor for the tiny weights is cached (another test
    may have trained one; without one they are left out)."""
    ids = {"reference/off", "reference/lossy/s=0.25/router=block", "reference/lossy/s=0.50/router=block"}
    if tiny_engine.unit_predictor_available():
        ids |= {"reference/lossy/s=0.25", "reference/lossy/s=0.50"}
    return ids


def _records(pytester: pytest.Pytester) -> list[dict]:
    return [load_record(p) for p in sorted((pytester.path / "out" / "runs").glob("*.json"))]


def test_two_workers_write_one_record_equal_to_the_serial_one(pytester: pytest.Pytester, tiny_model_dir: Path,
                                                              tiny_engine) -> None:
    tiny_engine.calibration()  # computed once here, read from the shared cache by the subprocesses
    tiny_engine.unit_predictor()  # so every planned row records (none left out): both workers get some
    import os
    import shutil

    shared = Path(os.environ["RSP_BENCH_CACHE"]) / "reference-outputs"
    shutil.rmtree(shared, ignore_errors=True)
    serial = _run(pytester, tiny_model_dir)
    assert serial.ret == 0, serial.stdout.str()[-2000:]
    parallel = _run(pytester, tiny_model_dir, "-n", "2", "--dist", "loadgroup")
    assert parallel.ret == 0, parallel.stdout.str()[-2000:]
    one, two = _records(pytester)
    assert set(two["configurations"]) == set(one["configurations"]) == _expected(tiny_engine)
    for cid, conf in one["configurations"].items():
        assert two["configurations"][cid]["metrics"] == conf["metrics"], cid
    info = two["extra"]["distributed"]
    assert info["workers"] == 2 and set(info["placement"]) == set(one["configurations"])
    assert set(info["placement"].values()) <= {"gw0", "gw1"}
    assert two["extra"]["contended"] == "2 workers on 1 host(s)" and "partial" not in two["extra"]
    assert parallel.stdout.str().count("run record:") == 1  # the controller's summary only
    # The reference set was computed once and shared through the disk cache.
    assert len(list(shared.rglob("x-*.pt"))) == 1


def test_a_crashed_worker_fails_the_run_and_leaves_a_partial_record(pytester: pytest.Pytester,
                                                                    tiny_model_dir: Path, tiny_engine) -> None:
    import os
    import shutil

    tiny_engine.calibration()  # computed once here, read from the shared cache by the subprocesses
    # A cache without a unit-router predictor (another test may have trained one): three rows, as
    # in a fresh CI, so the crash lands while the other worker still has its row to record.
    shared, cache = Path(os.environ["RSP_BENCH_CACHE"]), pytester.path / "cache"
    cache.mkdir()
    for part in ("calibration", "models"):
        if (shared / part).is_dir():
            shutil.copytree(shared / part, cache / part)
    # The crashing configuration in a group of its own and every other test in one group, so the
    # two workers split that way: the surviving worker's rows are what a partial record holds.
    pytester.makeconftest(CRASH_GROUPS)
    # No restart: a replacement worker would run the crashed worker's configuration again.
    result = _run(pytester, tiny_model_dir, "-n", "2", "--dist", "loadgroup", "--max-worker-restart", "0",
                  "--rsp-update-baseline", env={"CRASH_ON": "reference/lossy/s=0.50/router=block",
                                                "RSP_BENCH_CACHE": str(cache)})
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*ERROR: distributed run: worker gw* *reference/lossy/s=0.50/router=block*"])
    # Whether the surviving worker's rows reach the controller before xdist tears the session
    # down is a race (measured: about half the runs on this host since the unit router became the
    # default and the planned rows changed); a record, when one is written, must say it is partial.
    records = _records(pytester)
    assert len(records) <= 1
    for record in records:
        assert "reference/lossy/s=0.50/router=block" in record["extra"]["partial"]
    assert not (pytester.path / "out" / "baselines").exists()


def test_popen_gateway_with_its_own_interpreter_stands_in_for_a_second_host(pytester: pytest.Pytester,
                                                                             tiny_model_dir: Path,
                                                                             tiny_engine) -> None:
    tiny_engine.calibration()  # computed once here, read from the shared cache by the subprocesses
    result = _run(pytester, tiny_model_dir, "--tx", f"popen//python={sys.executable}", "--dist", "loadgroup")
    assert result.ret == 0, result.stdout.str()[-2000:]
    [record] = _records(pytester)
    assert record["extra"]["distributed"]["workers"] == 1 and "contended" not in record["extra"]
    assert set(record["configurations"]) == _expected(tiny_engine)
