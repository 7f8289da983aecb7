"""The parts of ``rsp-bench tune`` (rsp_bench.tune, which holds the command line, documents
the method and re-exports every name below):

  recommendation  the curve's rows and the recommendation: relative quality, effective
                  speed-up, budget cap, knee, margin (standard library alone)
  table           tune.csv written and read back; recommend_from_table
  report          tune.md and tune.png, and write_outputs (csv, then recommend from it)
  sweep           the sweep settings and the measuring: quality and interleaved speed-up
                  at each sensitivity (torch and the engine imported only when it runs)

This package imports none of them. Imports go one way: recommendation imports none of the
others; table imports recommendation; report imports recommendation and table; sweep
imports recommendation. None imports rsp_bench.tune. Must NOT import pytest.
"""
