"""rsp-bench ab end to end, on the real engine: an A/A run (base and head at the same commit, each
in its own worktree and worker process) must pass, come out token-identical, and keep every
round of both sides in its record (markers ``ab`` and ``slow``: `pytest tests --run-slow -m slow`, the
step CI runs after the unit tests; it tests the ``rsp-bench ab`` command, not an engine, so it moved
from suites/ on 2026-12-04, 21-26 s of the quick suite). Deselect with ``-m "not ab"`` (measured 71 s on 2 cores at 4 prompts, 16 tokens and a 15 s budget; smaller now).

The run is kept short (2 prompts, 8 tokens, ``--budget 6`` after the 4 rounds that always
run, 8 timed tokens a call at batches 1 and 2 instead of the defaults' 16 at batches 1 and 4:
this test 37 s -> 21 s, `pytest suites --rsp-quick --durations=40`, 2026-12-04): this checks the
contract, not the power, which
results/ab_power.json measures over many runs. A decided slowdown here would be a false alarm,
and the A/A rate of those is measured under 5%, so this can fail on a bad day: that is a real
finding about the statistics, not flakiness to retry.

Must NOT import torch or the engine (the workers load it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.ab, pytest.mark.reference_only, pytest.mark.slow]
SPEED_TOKENS = 8


def _git_ok() -> bool:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "HEAD"], capture_output=True, text=True)
    return out.returncode == 0


@pytest.mark.skipif(not _git_ok(), reason="rsp-bench ab needs a git checkout")
def test_aa_run_passes_token_identical(tmp_path):
    out_path = tmp_path / "ab.json"
    md_path = tmp_path / "ab.md"
    proc = subprocess.run([sys.executable, "-m", "rsp_bench.cli", "ab", "--base", "HEAD", "--head", "HEAD",
                           "--prompts", "2", "--tokens", "8", "--budget", "6", "--min-rounds", "4",
                           "--speed-tokens", str(SPEED_TOKENS), "--batch", "1,2",
                           "--out", str(out_path), "--markdown", str(md_path), "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads(out_path.read_text())
    assert rec["schema"] == "rsp-bench-ab/1" and rec["exit_code"] == 0
    assert rec["speed_verdict"] in ("inside", "undecided", "faster")
    q = rec["quality"]
    assert q["flipped"] == [] and q["exact_match_rate"] == 1.0 and q["kl_mean"] == 0.0 and q["top1_agreement"] == 1.0
    # each side ran its own tree: two worktrees of one commit, neither the checkout itself
    roots = {side: Path(rec[side]["worker"]["modules"]["reference_engine"]).parents[1] for side in ("base", "head")}
    assert roots["base"] != roots["head"] and REPO not in roots.values()
    assert rec["base"]["commit"] == rec["head"]["commit"]
    assert all(not r.exists() for r in roots.values())  # the worktrees were removed afterwards
    # every round of both sides is kept, alternating who went first
    rounds = [r for r in rec["rounds"] if r["batch"] == 1]
    assert len(rounds) >= 4 and [r["order"][0] for r in rounds[:2]] == ["base", "head"]
    assert all(len(r["base"]["step_times_s"]) == SPEED_TOKENS - 1
               and len(r["head"]["step_times_s"]) == SPEED_TOKENS - 1 for r in rounds)
    assert "rsp-bench A/B" in md_path.read_text()
