"""Tests of rsp_bench.storage: atomic writes, and a baseline surviving a process killed mid-write.

Must not import torch, transformers or reference_engine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rsp_bench.errors import HarnessInputError
from rsp_bench.records import RunRecordBuilder, load_record
from rsp_bench.baselines import quality_baseline_path, update_baseline
from rsp_bench.storage import atomic_write_bytes, atomic_write_json, atomic_write_text

REPO = Path(__file__).resolve().parents[1]
MACHINE = {"fingerprint": "f00dfeed0001", "hostname": "h", "platform": "p", "cpu": "c", "cores": 2,
           "memory_gb": 8.0, "gpu": None}


def _record(tag: float, configs: int = 1, samples: int = 0) -> dict:
    b = RunRecordBuilder(model_name="tiny", machine=MACHINE, commit=None,
                         versions_info={"python": "3", "torch": None, "transformers": None, "rsp_bench": "0"})
    for c in range(configs):
        b.add_metric(f"reference/lossy/s={c / max(configs, 1):.4f}", "top1_agreement", tag, n=100)
        if samples:
            b.add_metric(f"reference/lossy/s={c / max(configs, 1):.4f}", "speedup_vs_off", 1.0 + tag, n=samples,
                         samples=[1.0 + tag + i * 1e-6 for i in range(samples)])
    return b.build(wall_time_s=1.0)


def test_json_is_sorted_indented_with_trailing_newline(tmp_path: Path) -> None:
    path = atomic_write_json(tmp_path / "a" / "b.json", {"b": 1, "a": [1, 2], "é": "ü"})
    text = path.read_text(encoding="utf-8")
    assert text == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1,\n  "é": "ü"\n}\n'
    assert json.loads(text) == {"b": 1, "a": [1, 2], "é": "ü"}


def test_text_and_bytes_are_written_exactly_and_leave_no_temp(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "t.md", "line\r\nline2\n")
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01\xff")
    assert (tmp_path / "t.md").read_bytes() == b"line\r\nline2\n"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01\xff"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "t.md"]


def test_written_file_gets_umask_permissions_not_mkstemp_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "x.txt", "x")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_failed_replace_keeps_old_file_and_removes_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = atomic_write_json(tmp_path / "r.json", {"old": True})

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        atomic_write_json(target, {"new": True})
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_nan_is_refused_naming_the_path_and_old_file_survives(tmp_path: Path) -> None:
    target = atomic_write_json(tmp_path / "r.json", {"v": 1.0})
    with pytest.raises(HarnessInputError, match=r"r\.json.*NaN"):
        atomic_write_json(target, {"v": float("nan")})
    assert json.loads(target.read_text()) == {"v": 1.0}


def test_wrong_payload_type_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="bytes"):
        atomic_write_bytes(tmp_path / "x", "not bytes")  # type: ignore[arg-type]


_CHILD = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    from rsp_bench import baselines

    record = json.load(open(sys.argv[1], encoding="utf-8"))
    where = sys.argv[3]

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    # Kill the process at the chosen point of the atomic write of the baseline.
    if where == "before_replace":
        os.replace = die
    elif where == "during_fsync":
        os.fsync = die
    elif where == "mid_write":
        # The kernel kills the process (SIGXFSZ, which CPython ignores unless reset) as soon
        # as a write crosses 64 KB, whatever code is writing: a truly torn write.
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
    baselines.update_baseline(record, sys.argv[2])
    print("finished without being killed")
    """
)


@pytest.mark.parametrize("where", ["before_replace", "during_fsync", "mid_write"])
def test_baseline_survives_kill_in_the_middle_of_the_write(tmp_path: Path, where: str) -> None:
    baselines = tmp_path / "baselines"
    old_path = update_baseline(_record(0.5), baselines)[0]
    old_bytes = old_path.read_bytes()
    big = _record(0.25, configs=300, samples=150)  # a few MB, so the write is not instantaneous
    big_file = tmp_path / "big.json"
    big_file.write_text(json.dumps(big), encoding="utf-8")
    assert quality_baseline_path(baselines, big) == old_path

    proc = subprocess.run([sys.executable, "-c", _CHILD, str(big_file), str(baselines), where],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    killed_by = signal.SIGXFSZ if where == "mid_write" else signal.SIGKILL
    assert proc.returncode == -killed_by, proc.stdout + proc.stderr
    assert old_path.read_bytes() == old_bytes
    assert load_record(old_path)["configurations"]["reference/lossy/s=0.0000"]["metrics"]["top1_agreement"]["value"] == 0.5
    # The new content reached disk only as a temporary file, which readers never glob.
    leftovers = [p for p in baselines.iterdir() if p != old_path and not p.name.endswith(".speed.json")]
    assert leftovers and all(p.name.startswith(".") and p.name.endswith(".tmp") for p in leftovers)
    if where == "before_replace":
        assert leftovers[0].stat().st_size > 50_000


_LOOP_CHILD = textwrap.dedent(
    """
    import json, sys
    from rsp_bench import baselines

    record = json.load(open(sys.argv[1], encoding="utf-8"))
    i = 0
    while True:
        record["extra"]["iteration"] = i
        baselines.update_baseline(record, sys.argv[2])
        if i == 0:
            print("ready", flush=True)
        i += 1
    """
)


def test_baseline_always_parseable_when_writer_is_killed_at_random_times(tmp_path: Path) -> None:
    baselines = tmp_path / "baselines"
    path = update_baseline(_record(0.5), baselines)[0]
    big_file = tmp_path / "big.json"
    big_file.write_text(json.dumps(_record(0.75, configs=150, samples=20)), encoding="utf-8")
    for delay in (0.0, 0.07, 0.19):
        proc = subprocess.Popen([sys.executable, "-c", _LOOP_CHILD, str(big_file), str(baselines)],
                                cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        record = load_record(path)  # whole and valid, whichever iteration it is
        assert record["configurations"]["reference/lossy/s=0.0000"]["metrics"]["top1_agreement"]["value"] == 0.75
