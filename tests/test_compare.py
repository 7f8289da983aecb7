"""rsp-bench compare: two run records' deterministic figures, compared exactly."""

from __future__ import annotations

from pathlib import Path

from rsp_bench.cli import main
from rsp_bench.records import RunRecordBuilder, write_record
from rsp_bench.records.compare import compare_records

MACHINE = {"fingerprint": "f00dfeed0001", "hostname": "h", "platform": "p", "cpu": "c", "cores": 2,
           "memory_gb": 8.0, "gpu": None}
VERSIONS = {"python": "3.11", "torch": None, "transformers": None, "rsp_bench": "0.1"}
LOSSY = "reference/lossy/s=0.50"


def _record(top1: float = 0.9, n: int = 600, speedup: float = 1.1, extra: bool = False) -> dict:
    b = RunRecordBuilder(model_name="tiny", machine=MACHINE, commit=None, versions_info=VERSIONS, quick=True)
    b.add_metric(LOSSY, "top1_agreement", top1, n=n, unit="fraction")
    b.add_metric(LOSSY, "speedup_vs_off", speedup, n=20, unit="x")
    if extra:
        b.add_metric(LOSSY, "kl_mean", 0.1, n=n, unit="nats")
    return b.build(wall_time_s=1.0)


def test_equal_figures_pass_and_timings_are_left_out() -> None:
    c = compare_records(_record(), _record(speedup=1.5))
    assert c.ok and c.same == 1 and c.differ == []


def test_a_changed_value_or_n_differs() -> None:
    assert compare_records(_record(), _record(top1=0.9000001)).differ[0][:2] == (LOSSY, "top1_agreement")
    assert not compare_records(_record(), _record(n=599)).ok


def test_figures_one_side_lacks_are_listed_not_failed() -> None:
    c = compare_records(_record(extra=True), _record())
    assert c.ok and c.only_a == [f"{LOSSY} kl_mean"] and c.only_b == []


def test_cli_exit_codes(tmp_path: Path, capsys) -> None:
    paths = []
    for i, top1 in enumerate((0.9, 0.9, 0.8)):
        rec = _record(top1=top1)
        rec["run_id"] = f"20260101T00000{i}Z-abc12{i}"
        paths.append(str(write_record(rec, tmp_path)))
    assert main(["compare", paths[0], paths[1]]) == 0
    assert main(["compare", paths[0], paths[2]]) == 1
    assert "DIFFERS" in capsys.readouterr().out
    assert main(["compare", paths[0], str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err
