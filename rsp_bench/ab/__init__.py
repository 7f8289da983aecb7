"""``rsp-bench ab``: the base and the head of a change, run side by side on this machine, speed
judged by the interval of their interleaved ratio against a horizon, quality by the same prompts
through both (DESIGN.md section 10: what gates a kernel change on a runner never seen before).

  stats    the t-interval of paired log ratios and the inside/slower/faster/undecided rule (no torch)
  worker   one side's process: its own source tree first on sys.path, JSON lines on stdin/stdout
  runner   worktree of the base ref, the two workers, quality and interleaved speed rounds
  report   ABReport: verdict, exit code, table, pull-request markdown
  power    the repeat harness behind results/ab_power.json (false alarms, power)
  cli      the ``rsp-bench ab`` subcommand

For the pytest plugin (and any caller)::

    from rsp_bench.ab import run_ab
    report = run_ab(base="origin/main")         # compares the ref with this checkout's working tree
    report.exit_code(), report.table(), report.markdown()

Must NOT import torch, reference_engine or the pytest plugin at import time: the names below are
loaded on first use, so importing the package is free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rsp_bench.ab.report import ABReport
    from rsp_bench.ab.runner import ABSettings

__all__ = ["run_ab", "ABSettings", "ABReport"]


def __getattr__(name: str) -> Any:
    if name in ("run_ab", "ABSettings"):
        from rsp_bench.ab import runner

        return getattr(runner, name)
    if name == "ABReport":
        from rsp_bench.ab.report import ABReport

        return ABReport
    raise AttributeError(f"module 'rsp_bench.ab' has no attribute {name!r}")
