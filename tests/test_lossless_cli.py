"""``rsp-bench lossless`` (rsp_bench/lossless_measure.py): bad input exits 2 naming the value, and
one end-to-end run on the tiny model writes an exact, complete report. The README's figures come
from running it on the embedded model."""

from __future__ import annotations

import json

import pytest

from rsp_bench import cli


@pytest.mark.parametrize("args, message", [
    (["--prompts", "MISSING"], "--prompts '{tmp}/missing.jsonl' does not exist"),
    (["--prompts", "BAD"], "bad.jsonl:1 is not valid JSON"),
    (["--squad", "0", "--free", "0"], "nothing to measure"),
    (["--tokens", "0"], "--tokens must be >= 1, got 0"),
    (["--squad", "-1"], "--squad must be >= 0, got -1"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    # it measured the few hundred there are and said nothing
    (["--squad", "100000"], "--squad 100000 is more than the"),
    (["--free", "1000"], "--free 1000 is more than the"),
])
def test_bad_input_exits_2_and_names_it(tmp_path, capsys, args, message) -> None:
    (tmp_path / "bad.jsonl").write_text("{not json\n", encoding="utf-8")
    args = [a.replace("MISSING", str(tmp_path / "missing.jsonl")).replace("BAD", str(tmp_path / "bad.jsonl"))
            for a in args]
    assert cli.main(["lossless", "--out", str(tmp_path / "out.json"), *args]) == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_a_tiny_run_is_exact_and_complete(tmp_path, tiny_model_dir) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in
                               enumerate(["Copy: alpha beta gamma alpha beta", "Name: Ada. Name: Ada. Name:"])))
    out = tmp_path / "out.json"
    code = cli.main(["lossless", "--model", str(tiny_model_dir), "--squad", "0", "--free", "0", "--prompts",
                     str(prompts), "--tokens", "6", "--no-hf", "--no-flips", "--out", str(out), "--quiet"])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["complete"] and doc["prompts"]["prompts"] == 2
    assert doc["prompts"]["lossless"]["exact"] == 2  # lossless equals pruning off
    got = doc["prompts"]["lossless"]
    lo, hi = got["speedup_vs_off_ci95"]  # the metric's bootstrap interval around its median
    assert 0 < lo <= got["speedup_vs_off_median"] <= hi and got["speedup_pairs"] == 2
