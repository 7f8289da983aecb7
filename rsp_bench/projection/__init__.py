"""Roofline projection of one decode step onto a GPU profile: projected tokens/s, GPU busy
time, idle fraction, and the GPU time that residual-stream pruning frees.

One analysis per function, in three modules (``work``: what a step does; ``timeline``: how long
it takes on a profile; ``tables``: the rows printed and stored):
- ``decode_step_ops``: the operators of one decode step, in launch order, with FLOPs,
  bytes and kernel counts (the work model);
- ``op_time_s``: the roofline time of one operator on one profile;
- ``simulate_step``: the host/GPU timeline of a list of operators (launch overheads,
  GPU idle time);
- ``project_decode`` / ``project_pruning``: the two above applied to a model shape;
- ``bytes_per_token`` / ``cpu_ideal_speedup``: weight bytes per token, for the achieved
  bandwidth figure (gpt-fast style) and the ideal speed-up pruning implies on a CPU.

Every figure here is a projection from datasheet numbers and stated assumptions
(``rsp_bench.profiles``), never a measurement; the class is called ``Projection`` and
table headers say "projected".

Must NOT import transformers, torch or the engine: it prices a shape, not a model.
"""

from rsp_bench.projection.tables import projection_json, projection_table
from rsp_bench.projection.timeline import (Projection, StepTimeline, op_time_s, project_decode, project_pruning,
                                           simulate_step)
from rsp_bench.projection.work import (BYPASS_KINDS, EAGER_KERNELS, ModelShape, Op, bytes_per_token, cpu_ideal_speedup,
                                       decode_step_ops, elementwise_op, linear_op)

__all__ = ["BYPASS_KINDS", "EAGER_KERNELS", "ModelShape", "Op", "Projection", "StepTimeline", "bytes_per_token",
           "cpu_ideal_speedup", "decode_step_ops", "elementwise_op", "linear_op", "op_time_s", "project_decode",
           "project_pruning", "projection_json", "projection_table", "simulate_step"]
