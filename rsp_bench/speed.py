"""Measured speed: interleaved decode benchmarks, the bandwidth roofline of this machine, the
router's cost, measured against ideal speed-up, and the `rsp-bench project` / `bench` commands.

What it measures and how (DESIGN.md sections 3 and 5):

- **Interleaved runner** (``InterleavedBench``): named callables, each generating one fixed
  prompt set at one batch size, run in rounds A B C, B C A, C A B ... (the order rotates each
  round so that no engine always runs first, or always right after the same neighbour, and slow
  drift of the machine cancels). Warm-up calls are run and thrown away. Every call returns a
  ``CallTiming``: time to first token and one time per decode step.
- **Where the times come from.** The reference engine times itself: TTFT = its
  ``prefill_time_s`` (prefill, protective-degradation checks and router setup: everything
  before the first token exists), and one decode step time per generated token after the first
  (``decode_step_times_s``: router plan + block compute + router update). ``model.generate`` is
  timed from outside with a streamer (``StepClock``): ``generate`` hands the streamer the prompt,
  then each new token as soon as it is sampled (on the host, so the device has finished it);
  TTFT = call start to the first generated token, a decode step = the gap between two tokens.
  The token ids are encoded once, outside the timed region, for both.
- **Decode rate.** One decode step yields one token for each sequence of the batch, so the
  time per output token a user sees (TPOT) is the step time, and the batch's throughput is batch
  / step time. ``speed_summary`` is applied twice: to step times (latency figures) and to step
  time / batch (``decode_tokens_per_s``: aggregate tokens/s; per-sequence at batch 1).
- **Speed-up** of B over A: ``metrics.interleaved_speedup`` of per-round pairs (A's call,
  B's call of the same round), each call summarised by its median decode step time, so the
  ratio is of neighbours, never of two runs.
- **Bandwidth roofline** (``bandwidth_roofline``): the model's own per-token matrix-vector
  products (4 per block: fused qkv, o, fused gate/up, down; plus the LM head), timed alone in a
  loop: the fastest this machine can stream those weights, hence the batch-1 decode ceiling.
  Achieved bandwidth = weight bytes per decode step (``projection.bytes_per_token`` at the
  executed blocks, fp32) x decode steps per second, as gpt-fast prints it.
- **Router cost**, **ideal speed-up** (``projection.cpu_ideal_speedup`` from the engine's
  execution trace) and measured / ideal: see their functions.

Must NOT import the reference engine, transformers or pytest at module level: the runner works
with any callable, and the CLI's ``project --executed-blocks`` must not load a model. They are
imported inside the functions that need them.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics import (
    achieved_bandwidth_gbs,
    blocks_executed_per_token,
    interleaved_speedup,
    speed_summary,
)
from rsp_bench.profiles import PROFILES, get_profile, normalize_dtype
from rsp_bench.projection import (
    ModelShape,
    bytes_per_token,
    cpu_ideal_speedup,
    project_decode,
    projection_json,
    projection_table,
)

__all__ = [
    "CallTiming", "rotated_order", "InterleavedBench", "make_step_clock", "weights_to",
    "engine_call", "adapter_call", "hf_generate_call", "reference_math_call", "fixed_prompts", "prompts_for_batch",
    "Roofline", "bandwidth_roofline", "router_cost_per_token", "mean_executed_blocks",
    "engine_bypass", "model_shape", "ideal_speedup_from_trace", "measured_over_ideal",
    "metric_name", "bench_figures", "projected_figures", "gpu_decode_report",
    "configure_project_parser", "run_project", "configure_bench_parser", "run_bench",
    "PROJECTION_CONTEXT", "OFF_ID", "HF_ID",
]

# Config ids the speed figures are filed under (rsp_bench.records.parse_config_id reads them).
OFF_ID = "reference/off"
HF_ID = "hf-generate/off"

# Context length (cached positions) projections are priced at. Fixed rather than taken from
# the measured run, so a projected figure depends on the execution trace alone and a quick run
# and a full run project the same machine the same way (the gate compares them).
PROJECTION_CONTEXT = 512


# --------------------------------------------------------------------------------------
# One timed call
# --------------------------------------------------------------------------------------

@dataclass
class CallTiming:
    """What one benchmarked call measured.

    ``step_times_s``: one entry per decode step after the first token; each step yields one
    token for every still-running sequence of the batch. ``stats``: the engine's stats of the
    call (the first row's: the execution trace and router time are per batch), when it has any.
    """

    ttft_s: float
    step_times_s: list[float]
    batch: int
    new_tokens: int
    method: str = ""
    stats: dict | None = None
    wall_s: float = 0.0
    tokens: list[list[int]] | None = None  # generated ids per sequence, where the call keeps them
    # (layers_bypassed, total_tokens, blocks) per sequence, from engine stats that have them
    bypass_counts: list[tuple[int, int, int]] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.ttft_s, (int, float)) and math.isfinite(self.ttft_s)
                and self.ttft_s >= 0):
            raise HarnessInputError(f"CallTiming.ttft_s must be a finite time >= 0, got {self.ttft_s!r}")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise HarnessInputError(f"CallTiming.batch must be an integer >= 1, got {self.batch!r}")
        bad = [t for t in self.step_times_s if not (math.isfinite(t) and t > 0)]
        if bad:
            raise HarnessInputError(f"CallTiming.step_times_s holds a non-positive or non-finite time {bad[0]!r}")

    @property
    def steps(self) -> int:
        return len(self.step_times_s)

    @property
    def median_step_s(self) -> float:
        """The call's typical step: the median resists one stalled step on a shared machine."""
        if not self.step_times_s:
            raise HarnessInputError(
                "a call made no decode step (it stopped at the first token): raise max_new_tokens")
        return float(statistics.median(self.step_times_s))


def rotated_order(names: Sequence[str], round_index: int) -> list[str]:
    """Round r runs the names starting from the (r mod n)-th: A B C, B C A, C A B, ..."""
    names = list(names)
    if not names:
        raise HarnessInputError("rotated_order needs at least one name")
    k = round_index % len(names)
    return names[k:] + names[:k]


# --------------------------------------------------------------------------------------
# Interleaved runner
# --------------------------------------------------------------------------------------

class InterleavedBench:
    """Runs named calls interleaved, in rotated rounds, and keeps every measured call.

    Plain use: ``bench = InterleavedBench(calls); bench.warm_up(); bench.run(rounds=5)``.
    Under pytest-benchmark, one test per name times that name's call inside each round:
    ``setup, target, teardown = bench.pedantic_hooks(name)`` and
    ``benchmark.pedantic(target, setup=setup, teardown=teardown, rounds=R)``; setup runs the
    names before it in the round's rotated order, teardown the names after it, so every round
    is still a whole interleaved round whoever's test drives it.
    """

    def __init__(self, calls: Mapping[str, Callable[[], CallTiming]]) -> None:
        if not calls:
            raise HarnessInputError("InterleavedBench needs at least one named call")
        for name, fn in calls.items():
            if not isinstance(name, str) or not name:
                raise HarnessInputError(f"call names must be non-empty strings, got {name!r}")
            if not callable(fn):
                raise HarnessInputError(f"call {name!r} is not callable: {fn!r}")
        self.calls = dict(calls)
        self.names = list(self.calls)
        self.by_round: dict[str, dict[int, CallTiming]] = {n: {} for n in self.names}
        self.log: list[tuple[int, str]] = []  # (round, name) in run order; round -1 = warm-up
        self.rounds_done = 0
        self._open_round: tuple[int, list[str], int, str] | None = None

    def _call(self, name: str, round_index: int) -> CallTiming:
        t0 = time.perf_counter()
        timing = self.calls[name]()
        wall = time.perf_counter() - t0
        if not isinstance(timing, CallTiming):
            raise HarnessInputError(
                f"call {name!r} returned {type(timing).__name__}; a benchmarked call must "
                "return a CallTiming (use engine_call / hf_generate_call to wrap a generator)")
        timing.wall_s = wall
        self.log.append((round_index, name))
        if round_index >= 0:
            self.by_round[name][round_index] = timing
        return timing

    def warm_up(self, rounds: int = 1) -> None:
        """Run every call ``rounds`` times and discard the timings (first-call allocations,
        lazy imports, caches filling)."""
        for _ in range(rounds):
            for name in self.names:
                self._call(name, -1)

    def run_round(self) -> None:
        self.close_round()
        r = self.rounds_done
        for name in rotated_order(self.names, r):
            self._call(name, r)
        self.rounds_done += 1

    def run(self, rounds: int) -> "InterleavedBench":
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise HarnessInputError(f"rounds must be an integer >= 1, got {rounds!r}")
        for _ in range(rounds):
            self.run_round()
        return self

    def pedantic_hooks(self, name: str) -> tuple[Callable[[], None], Callable[[], CallTiming],
                                                  Callable[..., None]]:
        """(setup, target, teardown) that run one whole rotated round around ``name``'s call."""
        if name not in self.calls:
            raise HarnessInputError(f"unknown call {name!r}; calls: {', '.join(self.names)}")

        def setup() -> None:
            self.close_round()  # a round left open (teardown skipped) is finished first
            r = self.rounds_done
            order = rotated_order(self.names, r)
            self._open_round = (r, order, order.index(name), name)
            for other in order[:order.index(name)]:
                self._call(other, r)

        def target() -> CallTiming:
            if self._open_round is None or self._open_round[3] != name:
                setup()  # pytest-benchmark --benchmark-disable calls the target without setup
            return self._call(name, self._open_round[0])

        def teardown(*_: object, **__: object) -> None:
            self.close_round()

        return setup, target, teardown

    def close_round(self) -> None:
        """Finish a round that ``pedantic_hooks``' setup opened: run the names after the timed
        one and count the round. No-op when no round is open."""
        if self._open_round is None:
            return
        r, order, pos, _ = self._open_round
        self._open_round = None
        for other in order[pos + 1:]:
            self._call(other, r)
        self.rounds_done += 1

    def samples(self, name: str) -> list[CallTiming]:
        if name not in self.by_round:
            raise HarnessInputError(f"unknown call {name!r}; calls: {', '.join(self.names)}")
        return [self.by_round[name][r] for r in sorted(self.by_round[name])]

    def summary(self, name: str) -> dict[str, Any]:
        """Latency and throughput of ``name`` over all its measured calls.

        Keys: speed_summary's (ttft/tpot p50/p90 in ms, from step times) with
        ``decode_tokens_per_s`` replaced by the aggregate rate batch / step time, plus
        per-call samples (``ttft_ms``, ``tpot_ms``: the call's median step, ``tokens_per_s``)
        and counts.
        """
        calls = self.samples(name)
        if not calls:
            raise HarnessInputError(f"call {name!r} has no measured round yet")
        batch = calls[0].batch
        ttft = [c.ttft_s for c in calls]
        steps = [t for c in calls for t in c.step_times_s]
        if not steps:
            raise HarnessInputError(
                f"call {name!r} made no decode step in any round (every sequence stopped at its "
                "first token): raise max_new_tokens or use other prompts")
        out = speed_summary(ttft, steps)
        out["decode_tokens_per_s"] = speed_summary(ttft, [t / batch for t in steps])["decode_tokens_per_s"]
        out.update(
            batch=batch,
            calls=len(calls),
            steps=len(steps),
            ttft_ms=[1000 * c.ttft_s for c in calls],
            tpot_ms=[1000 * c.median_step_s for c in calls if c.steps],
            tokens_per_s=[batch / c.median_step_s for c in calls if c.steps],
            method=calls[0].method,
        )
        return out

    def paired_durations(self, base: str, candidate: str) -> tuple[list[float], list[float]]:
        """Median step times of ``base`` and ``candidate`` in the rounds where both ran."""
        a, b = self.by_round[base], self.by_round[candidate]
        rounds = [r for r in sorted(a) if r in b and a[r].steps and b[r].steps]
        return [a[r].median_step_s for r in rounds], [b[r].median_step_s for r in rounds]

    def pair_ratios(self, base: str, candidate: str) -> list[float]:
        """Per-round base / candidate step time: above 1 when the candidate decodes faster."""
        a, b = self.paired_durations(base, candidate)
        return [x / y for x, y in zip(a, b)]

    def speedup(self, base: str, candidate: str) -> dict[str, Any]:
        """``metrics.interleaved_speedup`` of the candidate over the base, plus the pair ratios."""
        for n in (base, candidate):
            if n not in self.by_round:
                raise HarnessInputError(f"unknown call {n!r}; calls: {', '.join(self.names)}")
        a, b = self.paired_durations(base, candidate)
        if not a:
            raise HarnessInputError(
                f"no round measured both {base!r} and {candidate!r}: nothing to pair")
        out = interleaved_speedup(a, b)
        out["ratios"] = [x / y for x, y in zip(a, b)]
        out["pairs"] = len(a)
        return out


# --------------------------------------------------------------------------------------
# Adapters: turn a generator into a call that returns a CallTiming
# --------------------------------------------------------------------------------------

def fixed_prompts(limit: int | None = None) -> list[str]:
    """The benchmark's fixed prompt set: the equivalence prompts, in file order."""
    from rsp_bench.datasets import load_prompts

    texts = [p.text for p in load_prompts()]
    return texts[:limit] if limit is not None else texts


def prompts_for_batch(prompts: Sequence[str], batch: int) -> list[str]:
    """The first ``batch`` prompts, cycling when the set is smaller than the batch."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise HarnessInputError(f"batch must be an integer >= 1, got {batch!r}")
    if not prompts:
        raise HarnessInputError("the prompt set is empty")
    return [prompts[i % len(prompts)] for i in range(batch)]


_TIMING_KEYS = ("prefill_time_s", "decode_step_times_s")


def _bypass_counts(results: Sequence[Any]) -> list[tuple[int, int, int]] | None:
    counts = []
    for r in results:
        st = r.stats
        if not all(k in st for k in ("layers_bypassed", "total_tokens", "blocks")):
            return None
        counts.append((int(st["layers_bypassed"]), int(st["total_tokens"]), int(st["blocks"])))
    return counts


def _timing_from_stats(results: Sequence[Any], batch: int) -> CallTiming:
    stats = results[0].stats  # trace and timings are per batch: every row carries the same
    return CallTiming(
        ttft_s=float(stats["prefill_time_s"]),
        step_times_s=[float(t) for t in stats["decode_step_times_s"]],
        batch=batch,
        new_tokens=sum(len(r.token_ids) for r in results),
        method="engine stats: ttft = prefill_time_s, step = decode_step_times_s",
        stats=dict(stats),
        tokens=[list(r.token_ids) for r in results],
        bypass_counts=_bypass_counts(results),
    )


def engine_call(engine: Any, prompts: Sequence[str], max_new_tokens: int,
                config: Any = None) -> Callable[[], CallTiming]:
    """A call that runs ``engine.generate(prompts, max_new_tokens, config=config)`` (the
    reference engine's API) and reports the engine's own timings (module docstring)."""
    prompts = list(prompts)

    def call() -> CallTiming:
        results = engine.generate(prompts, max_new_tokens=max_new_tokens, config=config)
        missing = [k for k in _TIMING_KEYS if k not in results[0].stats]
        if missing:
            raise HarnessInputError(
                f"engine stats lack {missing}; keys present: {sorted(results[0].stats)}")
        return _timing_from_stats(results, len(prompts))

    return call


def adapter_call(adapter: Any, spec: Any, prompts: Sequence[str],
                 max_new_tokens: int) -> Callable[[], CallTiming]:
    """A call through an ``rsp_bench.engines.EngineAdapter``: ``adapter.generate(prompts,
    max_new_tokens, spec)``.

    Engines whose stats carry ``prefill_time_s`` and ``decode_step_times_s`` (the reference
    engine does) are timed by those. Any other engine is timed from outside: TTFT = the wall
    time of the same call with max_new_tokens=1 (prefill plus one sampling), made right before
    the full call; each decode step = (full call - TTFT) / (longest output - 1), the same for
    every step (so its p90 equals its p50: say so when reporting one).
    """
    prompts = list(prompts)

    def call() -> CallTiming:
        t0 = time.perf_counter()
        outs = adapter.generate(prompts, max_new_tokens, spec)
        wall = time.perf_counter() - t0
        if all(k in outs[0].stats for k in _TIMING_KEYS):
            return _timing_from_stats(outs, len(prompts))
        t1 = time.perf_counter()
        adapter.generate(prompts, 1, spec)
        ttft = time.perf_counter() - t1
        steps = max(len(o.token_ids) for o in outs) - 1
        step = (wall - ttft) / steps if steps > 0 else 0.0
        return CallTiming(
            ttft_s=ttft,
            step_times_s=[step] * steps if step > 0 else [],
            batch=len(prompts),
            new_tokens=sum(len(o.token_ids) for o in outs),
            method="external: ttft = a max_new_tokens=1 call; step = (call - ttft) / steps",
            stats=dict(outs[0].stats),
            tokens=[list(o.token_ids) for o in outs],
            bypass_counts=_bypass_counts(outs),
        )

    return call


def make_step_clock() -> Any:
    """A ``model.generate`` streamer that notes the time of every ``put``.

    generate() puts the prompt once, then each sampled token after copying it to the host (so
    the device has finished that step). Built on call as a BaseStreamer subclass so that this
    module does not import transformers.
    """
    from transformers.generation.streamers import BaseStreamer

    class StepClock(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.ended: float | None = None

        def put(self, value: Any) -> None:
            self.times.append(time.perf_counter())

        def end(self) -> None:
            self.ended = time.perf_counter()

    return StepClock()


def hf_generate_call(model: Any, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
                     pad_id: int, eos_id: int | None = None, device: str | None = None,
                     fixed_length: bool = False) -> Callable[[], CallTiming]:
    """A call that runs greedy ``model.generate`` on pre-encoded, left-padded prompts and
    times it from outside with ``make_step_clock`` (see the module docstring).

    A fresh GenerationConfig (greedy, ``eos_id``, ``pad_id``) keeps the checkpoint's own
    defaults (sampling, penalties, extra stop ids) out. ``fixed_length``: exactly
    ``max_new_tokens`` tokens whatever is sampled (random-weight models, GPU timing).
    """
    import torch
    from transformers import GenerationConfig

    rows = [list(map(int, ids)) for ids in prompt_ids]
    if not rows or any(not r for r in rows):
        raise HarnessInputError("hf_generate_call needs non-empty token id lists")
    width = max(len(r) for r in rows)
    dev = device or str(next(model.parameters()).device)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):  # left padding, as the engine pads
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    gen_cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                               eos_token_id=eos_id, pad_token_id=int(pad_id),
                               min_new_tokens=max_new_tokens if fixed_length else None)

    def call() -> CallTiming:
        clock = make_step_clock()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg,
                                 streamer=clock)
        # times[0] is the prompt put; times[1] the first generated token
        if len(clock.times) < 2:
            raise HarnessInputError("model.generate produced no token through the streamer")
        gen = clock.times[1:]
        new_tokens = int(out[:, width:].numel())
        return CallTiming(
            ttft_s=gen[0] - t0,
            step_times_s=[b - a for a, b in zip(gen, gen[1:])],
            batch=len(rows),
            new_tokens=new_tokens,
            method="external: streamer put times; ttft = call start to first token",
            tokens=out[:, width:].tolist(),
        )

    return call


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def reference_math_call(weights: Any, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
                        pad_id: int, device: str = "cpu", keep: Sequence[bool] | None = None,
                        bypass: Sequence[Any] | None = None) -> Callable[[], CallTiming]:
    """The reference engine's own prefill and decode-step math (``reference_engine.model``)
    on any device, greedy, a fixed number of tokens (no end-of-sequence stop), no router.

    For the GPU measurement: the engine proper keeps its tensors on the CPU, but its model
    functions are device-agnostic, so this runs exactly the eager kernels the projection
    models. ``weights``: a ``ModelWeights`` already on ``device`` (see ``weights_to``);
    ``keep``: a fixed block plan for every step (None: all blocks), with ``bypass`` maps.
    """
    import torch

    from reference_engine.model import KVCache, decode_step, prefill

    rows = [list(map(int, ids)) for ids in prompt_ids]
    if not rows or any(not r for r in rows):
        raise HarnessInputError("reference_math_call needs non-empty token id lists")
    dims = weights.dims
    if keep is not None and len(keep) != dims.n_layers:
        raise HarnessInputError(f"keep has {len(keep)} entries; the model has {dims.n_layers} blocks")
    B, S = len(rows), max(len(r) for r in rows)
    capacity = S + max_new_tokens
    ids = torch.full((B, S), int(pad_id), dtype=torch.long)
    key_valid = torch.zeros(B, capacity, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, S - len(r):] = torch.tensor(r)
        key_valid[b, S - len(r):] = True
    positions = (key_valid[:, :S].long().cumsum(-1) - 1).clamp(min=0)
    ids, key_valid, positions = ids.to(device), key_valid.to(device), positions.to(device)
    dtype = weights.embed.dtype
    keep_list = list(keep) if keep is not None else None

    def call() -> CallTiming:
        with torch.inference_mode():
            cache = KVCache.allocate(dims, B, capacity, dtype=dtype, device=device)
            t0 = time.perf_counter()
            logits = prefill(weights, cache, ids, positions, key_valid)
            tok = logits.argmax(-1)
            out = [tok.tolist()]  # the host needs the token, as the engine's loop does: a sync
            t_first = time.perf_counter()
            next_pos = positions[:, -1] + 1
            steps = []
            for _ in range(max_new_tokens - 1):
                t = time.perf_counter()
                logits = decode_step(weights, cache, tok, next_pos, key_valid, keep_list,
                                     bypass if keep_list else None, None)
                tok = logits.argmax(-1)
                out.append(tok.tolist())
                next_pos = next_pos + 1
                steps.append(time.perf_counter() - t)
        return CallTiming(ttft_s=t_first - t0, step_times_s=steps, batch=B,
                          new_tokens=B * max_new_tokens,
                          method=f"reference math on {device}: host clock around synchronised steps",
                          tokens=[list(col) for col in zip(*out)])

    return call


def weights_to(weights: Any, device: str, dtype: Any = None) -> Any:
    """A copy of a ``reference_engine.model.ModelWeights`` on ``device`` (and ``dtype``)."""
    import dataclasses

    import torch

    def mv(t: "torch.Tensor") -> "torch.Tensor":
        return t.to(device=device, dtype=dtype if (dtype is not None and t.is_floating_point()) else t.dtype)

    blocks = []
    for blk in weights.blocks:
        wqkv = mv(blk.wqkv)
        blocks.append(dataclasses.replace(
            blk, attn_norm=mv(blk.attn_norm), wqkv=wqkv, wkv=wqkv[weights.dims.q_dim:],
            wo=mv(blk.wo), mlp_norm=mv(blk.mlp_norm), w_gate_up=mv(blk.w_gate_up),
            w_down=mv(blk.w_down)))
    embed = mv(weights.embed)
    lm_head = embed if weights.lm_head is weights.embed else mv(weights.lm_head)
    return dataclasses.replace(weights, embed=embed, blocks=blocks, final_norm=mv(weights.final_norm),
                               lm_head=lm_head, rope_cos=mv(weights.rope_cos),
                               rope_sin=mv(weights.rope_sin))


# --------------------------------------------------------------------------------------
# Engine-derived figures: shape, bypass, trace, router cost, ideal speed-up
# --------------------------------------------------------------------------------------

def model_shape(engine: Any) -> ModelShape:
    """The projection's ModelShape of an engine's model (from its Hugging Face config)."""
    cfg = getattr(getattr(engine, "hf_model", None), "config", None)
    if cfg is None:
        raise HarnessInputError(f"{type(engine).__name__} has no hf_model.config to read a shape from")
    return ModelShape.from_hf_config(cfg)


def engine_bypass(engine: Any) -> tuple[str, int]:
    """(bypass_kind, bypass_rank) to price the engine's bypassed blocks with.

    The engine uses a rank-r linear map on blocks where calibration found it better than the
    identity, the identity elsewhere; a projection takes one kind, so the majority's is used
    (on the embedded model the linear map wins on almost every block).
    """
    cal_fn = getattr(engine, "calibration", None)
    if cal_fn is None:
        return "identity", 0
    cal = cal_fn()
    use = list(getattr(cal, "use_linear", []))
    rank = int(getattr(cal, "bypass_rank", 0) or 0)
    if rank >= 1 and use and sum(use) * 2 >= len(use):
        return "linear", rank
    return "identity", 0


def _stats_list(stats: Mapping | Sequence[Mapping]) -> list[Mapping]:
    items = [stats] if isinstance(stats, Mapping) else list(stats)
    if not items:
        raise HarnessInputError("no engine stats given")
    for i, s in enumerate(items):
        if not isinstance(s, Mapping):
            raise HarnessInputError(f"stats[{i}] is {type(s).__name__}, not an engine stats dict")
    return items


def _need(s: Mapping, key: str) -> Any:
    if key not in s:
        raise HarnessInputError(f"engine stats lack {key!r}; keys present: {sorted(s)}")
    return s[key]


def mean_executed_blocks(stats: Mapping | Sequence[Mapping]) -> float:
    """Blocks executed per decode step, pooled over every step of the given stats."""
    trace = [int(x) for s in _stats_list(stats) for x in _need(s, "executed_blocks_per_step")]
    if not trace:
        raise HarnessInputError("the execution trace is empty (no decode step ran)")
    return sum(trace) / len(trace)


def router_cost_per_token(stats: Mapping | Sequence[Mapping]) -> dict[str, float]:
    """The router's cost per decode step (= per token of each sequence), pooled over calls.

    ms_per_token = 1000 x router time / decode steps; step_share = router time / the sum of the
    step times (which contain the router's plan and update). The reference engine's
    ``router_time_s`` is the per-token plan and update only; its once-per-request setup
    (degradation checks, router construction) is reported apart as ``router_setup_time_s``.
    """
    items = _stats_list(stats)
    router = sum(float(_need(s, "router_time_s")) for s in items)
    steps = sum(len(_need(s, "decode_step_times_s")) for s in items)
    decode = sum(float(t) for s in items for t in s["decode_step_times_s"])
    if steps == 0 or decode <= 0:
        raise HarnessInputError("no decode step in the stats: the router cost per token is undefined")
    return {"ms_per_token": 1000.0 * router / steps, "step_share": router / decode,
            "steps": float(steps)}


def ideal_speedup_from_trace(engine: Any, stats: Mapping | Sequence[Mapping]) -> float:
    """The speed-up a purely bandwidth-bound decode would get from the weight bytes the
    bypassed blocks did not read: ``projection.cpu_ideal_speedup`` at the trace's mean
    executed blocks, fp32, with the engine's bypass kind."""
    kind, rank = engine_bypass(engine)
    return cpu_ideal_speedup(model_shape(engine), mean_executed_blocks(stats), 4, kind, rank)


def measured_over_ideal(measured_speedup: float, ideal_speedup: float) -> float:
    """measured / ideal speed-up: 1 when pruning saves exactly the time its skipped bytes
    imply, below 1 when router and bypass overheads eat into it."""
    for name, v in (("measured_speedup", measured_speedup), ("ideal_speedup", ideal_speedup)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise HarnessInputError(f"{name} must be a positive finite number, got {v!r}")
    return measured_speedup / ideal_speedup


# --------------------------------------------------------------------------------------
# Bandwidth roofline of this machine
# --------------------------------------------------------------------------------------

@dataclass
class Roofline:
    """The measured batch-1 decode ceiling of this machine for one model (fp32 weights)."""

    bytes_per_token: float        # projection.bytes_per_token, unpruned, fp32
    gemv_bytes: float             # bytes of the matrices the loop streams
    gemv_count: int               # matrix-vector products per token
    seconds_per_token: float      # median time of one token's products
    tokens_per_s: float           # the ceiling: 1 / seconds_per_token
    gbs: float                    # gemv_bytes / seconds_per_token, 1e9 bytes/s
    iterations: int
    threads: int
    samples_s: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("samples_s")
        return d


def bandwidth_roofline(engine: Any, min_time_s: float = 1.0, max_iterations: int = 200,
                       warmup: int = 3) -> Roofline:
    """Time the model's own per-token matrix-vector products alone in a loop (DESIGN.md 5).

    Per block: fused qkv, o, fused gate/up, down; then the LM head (121 products on the
    embedded model). Each is ``torch.mv`` into a preallocated output, with nothing else in
    the loop: no norms, attention or Python per-op dispatch beyond the call, so its rate is
    the most this machine can stream these weights, and 1 / (time per token) the batch-1
    decode ceiling. Iterates until ``min_time_s`` has passed (at least 5 times) or
    ``max_iterations``; the median iteration is reported.
    """
    import torch

    w = getattr(engine, "weights", engine)
    blocks = getattr(w, "blocks", None)
    if not blocks:
        raise HarnessInputError(f"{type(engine).__name__} has no weights.blocks to time")
    mats = [m for b in blocks for m in (b.wqkv, b.wo, b.w_gate_up, b.w_down)] + [w.lm_head]
    mats = [m.contiguous() for m in mats]
    xs = [torch.randn(m.shape[1], dtype=m.dtype, device=m.device) for m in mats]
    outs = [torch.empty(m.shape[0], dtype=m.dtype, device=m.device) for m in mats]
    jobs = list(zip(mats, xs, outs))
    samples: list[float] = []
    with torch.inference_mode():
        for _ in range(warmup):
            for m, x, o in jobs:
                torch.mv(m, x, out=o)
        start = time.perf_counter()
        while len(samples) < max_iterations and (len(samples) < 5 or
                                                 time.perf_counter() - start < min_time_s):
            t0 = time.perf_counter()
            for m, x, o in jobs:
                torch.mv(m, x, out=o)
            samples.append(time.perf_counter() - t0)
    per_token = float(statistics.median(samples))
    gemv_bytes = float(sum(m.numel() * m.element_size() for m in mats))
    shape = model_shape(engine) if hasattr(engine, "hf_model") else None
    bpt = bytes_per_token(shape, mats[0].element_size()) if shape is not None else gemv_bytes
    return Roofline(bytes_per_token=bpt, gemv_bytes=gemv_bytes, gemv_count=len(mats),
                    seconds_per_token=per_token, tokens_per_s=1.0 / per_token,
                    gbs=gemv_bytes / per_token / 1e9, iterations=len(samples),
                    threads=torch.get_num_threads(), samples_s=samples)


# --------------------------------------------------------------------------------------
# Figures for the run record and the tables
# --------------------------------------------------------------------------------------

def metric_name(base: str, batch: int) -> str:
    """Batch 1 keeps the metric's plain name (the gated headline); other batches get _b<N>."""
    return base if batch == 1 else f"{base}_b{batch}"


def _m(value: float, n: int, unit: str, ci: Sequence[float] | None = None,
       samples: Sequence[float] | None = None) -> dict[str, Any]:
    return {"value": float(value), "n": int(n), "ci": list(ci) if ci is not None else None,
            "unit": unit, "samples": [float(s) for s in samples] if samples is not None else None}


def bench_figures(bench: InterleavedBench, engine: Any = None, roofline: Roofline | None = None,
                  base: str = OFF_ID, hf: str | None = HF_ID,
                  bypass: tuple[str, int] | None = None) -> dict[str, dict[str, dict]]:
    """Every measured figure of one interleaved bench, by call name then metric name (plain
    names; the caller adds the batch suffix). Each figure: value, n, ci, unit, samples.

    Speed-ups are against ``base``; names whose calls carry engine stats also get blocks per
    token, router cost (when the router ran) and, beside their speed-up, the ideal speed-up and
    measured / ideal; with an engine, achieved bandwidth, and with a ``roofline`` its fraction.
    ``bypass``: (kind, rank) to price bypassed blocks with; default ``engine_bypass(engine)``.
    """
    out: dict[str, dict[str, dict]] = {}
    shape = model_shape(engine) if engine is not None else None
    if bypass is not None:
        kind, rank = bypass
    else:
        kind, rank = engine_bypass(engine) if engine is not None else ("identity", 0)
    for name in bench.names:
        s = bench.summary(name)
        calls = bench.samples(name)
        figs: dict[str, dict] = {
            "ttft_ms_p50": _m(s["ttft_ms_p50"], s["calls"], "ms", samples=s["ttft_ms"]),
            "ttft_ms_p90": _m(s["ttft_ms_p90"], s["calls"], "ms"),
            "tpot_ms_p50": _m(s["tpot_ms_p50"], s["steps"], "ms", samples=s["tpot_ms"]),
            "tpot_ms_p90": _m(s["tpot_ms_p90"], s["steps"], "ms"),
            "decode_tokens_per_s": _m(s["decode_tokens_per_s"], s["steps"], "tokens/s",
                                      samples=s["tokens_per_s"]),
        }
        # model.generate gets no speedup_vs_off: it is the inverse of the engine's own
        # speedup_vs_hf_generate, and gated as "higher is better" it would flag a faster engine.
        if name not in (base, hf) and base in bench.by_round:
            sp = bench.speedup(base, name)
            figs["speedup_vs_off"] = _m(sp["ratio"], sp["pairs"], "x", (sp["lo"], sp["hi"]),
                                        sp["ratios"])
        if hf is not None and name == base and hf in bench.by_round:
            sp = bench.speedup(hf, base)  # engine off over model.generate
            figs["speedup_vs_hf_generate"] = _m(sp["ratio"], sp["pairs"], "x",
                                                (sp["lo"], sp["hi"]), sp["ratios"])
        stats = [c.stats for c in calls
                 if c.stats is not None and "executed_blocks_per_step" in c.stats]
        counts = [rc for c in calls for rc in (c.bypass_counts or [])]
        if counts and all(c.bypass_counts for c in calls):
            figs["blocks_executed_per_token"] = _m(
                blocks_executed_per_token(sum(b for b, _, _ in counts), counts[0][2],
                                          sum(t for _, t, _ in counts)),
                sum(t for _, t, _ in counts), "blocks")
        # Blocks a decode step ran: the execution trace when there is one, else the engine's
        # bypass counts, else (model.generate, an engine without stats) all of them.
        if stats:
            blocks = mean_executed_blocks(stats)
        elif "blocks_executed_per_token" in figs:
            blocks = figs["blocks_executed_per_token"]["value"]
        else:
            blocks = shape.n_layers if shape else None
        if stats:
            # The trace counts decode steps only (the first token comes from the full prefill):
            # that is what a decode step costs, so the projection and ideal speed-up use it.
            figs["trace_blocks_per_step"] = _m(blocks, sum(len(x["executed_blocks_per_step"])
                                                           for x in stats), "blocks")
            if any(float(x.get("router_time_s", 0.0)) > 0 for x in stats):
                rc = router_cost_per_token(stats)
                figs["router_ms_per_token"] = _m(rc["ms_per_token"], int(rc["steps"]), "ms")
                figs["router_step_share"] = _m(rc["step_share"], int(rc["steps"]), "fraction")
            if shape is not None and name != base and "speedup_vs_off" in figs:
                ideal = cpu_ideal_speedup(shape, blocks, 4, kind, rank)
                figs["ideal_speedup"] = _m(ideal, len(stats), "x")
                figs["speedup_over_ideal"] = _m(
                    measured_over_ideal(figs["speedup_vs_off"]["value"], ideal),
                    figs["speedup_vs_off"]["n"], "x")
        if shape is not None and blocks is not None:
            steps_per_s = 1.0 / (s["tpot_ms_p50"] / 1000.0)
            bpt = bytes_per_token(shape, 4, blocks, kind, rank)
            gbs = achieved_bandwidth_gbs(bpt, steps_per_s)
            figs["achieved_bandwidth_gbs"] = _m(gbs, s["steps"], "GB/s")
            if roofline is not None:
                figs["roofline_fraction"] = _m(gbs / roofline.gbs, s["steps"], "fraction")
        out[name] = figs
    if roofline is not None and base in out:
        out[base]["roofline_tokens_per_s"] = _m(roofline.tokens_per_s, roofline.iterations,
                                                "tokens/s", samples=[1.0 / t for t in roofline.samples_s])
        out[base]["roofline_gbs"] = _m(roofline.gbs, roofline.iterations, "GB/s")
    return out


def projected_figures(shape: ModelShape, executed_blocks: float | None, batch: int = 1,
                      context: int = PROJECTION_CONTEXT, dtype: str = "fp16",
                      bypass_kind: str = "identity", bypass_rank: int = 0,
                      router_host_us_per_step: float = 0.0,
                      profiles: Sequence[str] = tuple(PROFILES)) -> dict[str, dict[str, float]]:
    """Projected tokens/s, idle fraction and GPU time freed, per profile, of a decode that ran
    ``executed_blocks`` blocks per token (None: all, the unpruned engine).

    ``router_host_us_per_step``: the router's measured host time per decode step, spread over
    the blocks, so the pruned projection pays for the router as the measured run did.
    Keys: ``projected_tokens_per_s_<P>``, ``projected_idle_fraction_<P>``,
    ``projected_freed_fraction_<P>`` (freed = 1 - busy / unpruned busy; 0 when unpruned).
    """
    out: dict[str, float] = {}
    for p in profiles:
        prof = get_profile(p)
        off = project_decode(shape, prof, dtype, batch, context)
        if executed_blocks is None:
            proj, freed = off, 0.0
        else:
            proj = project_decode(shape, prof, dtype, batch, context, executed_blocks, bypass_kind,
                                  bypass_rank,
                                  router_host_us_per_block=router_host_us_per_step / shape.n_layers)
            freed = 1.0 - proj.busy_ms_per_token / off.busy_ms_per_token
        out[f"projected_tokens_per_s_{prof.name}"] = proj.tokens_per_s
        out[f"projected_idle_fraction_{prof.name}"] = proj.idle_fraction
        out[f"projected_freed_fraction_{prof.name}"] = freed
        out[f"projected_busy_ms_per_token_{prof.name}"] = proj.busy_ms_per_token
    return out


# --------------------------------------------------------------------------------------
# Measured GPU decode with the projection beside it
# --------------------------------------------------------------------------------------

def gpu_decode_report(call: Callable[[], CallTiming], shape: ModelShape, dtype: str,
                      context: int, rounds: int = 5, executed_blocks: float | None = None,
                      bypass_kind: str = "identity", bypass_rank: int = 0,
                      device_index: int = 0) -> dict[str, Any]:
    """Measure a CUDA decode call and put the projection for this device beside it.

    One warm-up call, then ``rounds`` calls timed by their own step clock and by CUDA events
    (whole call), under NVML sampling (when nvidia-ml-py is installed; else the reason is
    reported), then one call under ``torch.profiler`` for the kernel timeline: idle time over
    the kernels' span (HTA definition, ``gpu_timeline.profiler_idle_time``) and kernels per
    decode step. The projection (``profiles.match_device_name``) is priced at ``context``;
    its error = (projected - measured) / measured. Every figure is measured unless its key
    says projected.
    """
    import torch

    from rsp_bench.gpu_timeline import (NvmlSampler, cuda_event_timer, profiler_idle_time,
                                        kernel_intervals_from_profiler, projection_error)
    from rsp_bench.profiles import match_device_name

    if not torch.cuda.is_available():
        raise HarnessInputError("gpu_decode_report needs a CUDA device; none is available")
    name = torch.cuda.get_device_name(device_index)
    call()  # warm-up: cuBLAS handles, allocator, kernels' first launch
    timings: list[CallTiming] = []
    event_ms: list[float] = []
    sampler: NvmlSampler | None = NvmlSampler(device_index=device_index, interval_ms=20)
    nvml_error = None
    try:
        sampler.__enter__()
    except HarnessInputError as exc:  # nvidia-ml-py missing or NVML unusable: say so, don't fake
        sampler, nvml_error = None, str(exc)
    try:
        for _ in range(rounds):
            with cuda_event_timer() as ev:
                timings.append(call())
            event_ms.append(ev.elapsed_ms)
    finally:
        if sampler is not None:
            sampler.__exit__(None, None, None)
    nvml = sampler.summary() if sampler is not None else {"samples": 0, "error": nvml_error}
    steps = [t for c in timings for t in c.step_times_s]
    batch = timings[0].batch
    summary = speed_summary([c.ttft_s for c in timings], [t / batch for t in steps])
    measured_tps = summary["decode_tokens_per_s"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        profiled = call()
    idle = profiler_idle_time(prof)
    n_kernels = len(kernel_intervals_from_profiler(prof))
    report: dict[str, Any] = {
        "device": name,
        "dtype": normalize_dtype(dtype),
        "batch": batch,
        "context": context,
        "method": timings[0].method,
        "measured_decode_tokens_per_s": measured_tps,
        "measured_tpot_ms_p50": summary["tpot_ms_p50"] * batch,
        "measured_ttft_ms_p50": summary["ttft_ms_p50"],
        "measured_call_ms_cuda_events": event_ms,
        "measured_idle_fraction": idle.idle_fraction,
        "measured_idle": idle.to_dict(),
        # kernels per forward pass, the prefill counted as one pass
        "measured_kernels_per_step": n_kernels / (profiled.steps + 1),
        "nvml": nvml,
    }
    profile = match_device_name(name)
    if profile is None:
        report["projection"] = None
        report["projection_note"] = f"no hardware profile matches {name!r}: no projection error"
        return report
    proj = project_decode(shape, profile, dtype, batch, context, executed_blocks, bypass_kind,
                          bypass_rank)
    report.update(
        profile=profile.name,
        projected_tokens_per_s=proj.tokens_per_s,
        projected_idle_fraction=proj.idle_fraction,
        projected_kernels_per_step=proj.kernels_per_step,
        projected_busy_ms_per_token=proj.busy_ms_per_token,
        projection_error_tokens_per_s=projection_error(proj.tokens_per_s, measured_tps),
    )
    return report


# --------------------------------------------------------------------------------------
# CLI: rsp-bench project
# --------------------------------------------------------------------------------------

def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return v


def _int_list(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if part:
            out.append(_positive_int(part))
    if not out:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}")
    return out


def _unit_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= v <= 1.0:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return v


def _float_list(text: str) -> list[float]:
    out = [_unit_float(p.strip()) for p in text.split(",") if p.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of numbers, got {text!r}")
    return out


def configure_project_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``rsp-bench project`` (projected figures only; nothing here is measured
    except, without --executed-blocks, the blocks the engine runs per token)."""
    p.add_argument("--model", default=None,
                   help="local Hugging Face Llama-family folder or .gguf (default: the embedded model)")
    p.add_argument("--profiles", default=",".join(PROFILES),
                   help=f"comma-separated hardware profiles (default: {','.join(PROFILES)})")
    p.add_argument("--batch", type=_positive_int, default=1, help="sequences decoded together (default 1)")
    p.add_argument("--context", type=_positive_int, default=PROJECTION_CONTEXT,
                   help=f"cached positions attention reads per step (default {PROJECTION_CONTEXT})")
    p.add_argument("--sensitivity", type=_unit_float, default=0.5,
                   help="pruning sensitivity of the measured short generation (default 0.5)")
    p.add_argument("--dtype", default="fp16", help="fp16 or bf16 (default fp16)")
    p.add_argument("--executed-blocks", type=float, default=None, metavar="X",
                   help="blocks executed per decode token when pruned; skips the measuring generation")
    p.add_argument("--bypass-rank", type=int, default=None, metavar="R",
                   help="rank of the linear bypass map (0: identity); default: the engine's calibration "
                        "when the engine is loaded, else identity")
    p.add_argument("--tokens", type=_positive_int, default=24,
                   help="tokens per prompt of the measuring generation (default 24)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object keyed by profile (off and pruned figures)")
    return p


def _shape_without_engine(model: str | None) -> ModelShape | None:
    """The shape when it can be read without loading weights; None when it cannot."""
    if model is None:
        return ModelShape.smollm2_135m()
    path = Path(model)
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise HarnessInputError(f"--model {model!r}: folder has no config.json")
        try:
            return ModelShape.from_hf_config(json.loads(cfg.read_text(encoding="utf-8")))
        except json.JSONDecodeError as exc:
            raise HarnessInputError(f"--model {model!r}: config.json is not JSON ({exc})") from exc
    if not path.exists():
        raise HarnessInputError(f"--model {model!r} does not exist")
    return None


def _measure_executed_blocks(engine: Any, sensitivity: float, tokens: int,
                             n_prompts: int = 4) -> tuple[float, float]:
    """(mean blocks per decode token, router us per step) of a short pruned generation.

    The router's load signal is pinned to an idle machine (hardware_watermark=0) so the figure
    does not depend on what else this machine is running.
    """
    from reference_engine import PruningConfig

    cfg = PruningConfig(sensitivity=sensitivity, mode="lossy" if sensitivity > 0 else "off",
                        log_level="NONE", hardware_watermark=0.0)
    stats = [engine.generate([p], max_new_tokens=tokens, config=cfg)[0].stats
             for p in fixed_prompts(n_prompts)]
    stats = [s for s in stats if s["executed_blocks_per_step"]]
    if not stats:
        raise HarnessInputError("the measuring generation made no decode step; raise --tokens")
    router_us = (router_cost_per_token(stats)["ms_per_token"] * 1000.0
                 if any(s["router_time_s"] > 0 for s in stats) else 0.0)
    return mean_executed_blocks(stats), router_us


def run_project(args: argparse.Namespace) -> int:
    """``rsp-bench project``: print projected figures for pruning off and pruned."""
    try:
        dtype = normalize_dtype(args.dtype)
        profiles = [get_profile(p) for p in str(args.profiles).split(",") if p.strip()]
        if not profiles:
            raise HarnessInputError(f"--profiles {args.profiles!r} names no profile")
        for prof in profiles:
            prof.peak_tflops(dtype)  # bf16 on a V100: an error naming the card
        shape = _shape_without_engine(args.model)
        engine = None
        router_us = 0.0
        if args.executed_blocks is None or shape is None:
            from reference_engine import Engine

            engine = Engine.load(args.model, calibrate=args.executed_blocks is None)
            shape = model_shape(engine)
        if args.executed_blocks is not None:
            blocks = float(args.executed_blocks)
            if not math.isfinite(blocks) or not 0 <= blocks <= shape.n_layers:
                raise HarnessInputError(
                    f"--executed-blocks {args.executed_blocks!r} is outside [0, {shape.n_layers}] "
                    "(the model's blocks)")
            source = "given by --executed-blocks"
        else:
            blocks, router_us = _measure_executed_blocks(engine, args.sensitivity, args.tokens)
            source = (f"measured: mean of a {args.tokens}-token generation on 4 fixed prompts at "
                      f"sensitivity {args.sensitivity}")
        if args.bypass_rank is not None:
            if args.bypass_rank < 0:
                raise HarnessInputError(f"--bypass-rank must be >= 0, got {args.bypass_rank}")
            kind, rank = ("linear", args.bypass_rank) if args.bypass_rank > 0 else ("identity", 0)
        elif engine is not None and args.executed_blocks is None:
            kind, rank = engine_bypass(engine)
        else:
            kind, rank = "identity", 0
        kw = {"router_host_us_per_block": router_us / shape.n_layers} if router_us else {}
        if args.json:
            out = projection_json(shape, profiles, dtype, args.batch, args.context, blocks,
                                  kind, rank, **kw)
            print(json.dumps(out, indent=2))
            return 0
        from tabulate import tabulate

        rows = projection_table(shape, profiles, dtype, args.batch, args.context, blocks,
                                kind, rank, **kw)
        model = args.model or "embedded SmolLM2-135M-Instruct"
        print(f"PROJECTED (roofline model from datasheet figures, not measured): {model}, "
              f"{shape.n_layers} blocks, {dtype}, batch {args.batch}, context {args.context}")
        print(f"pruned: {blocks:.2f} of {shape.n_layers} blocks per token ({source}); "
              f"bypass {kind}{f' rank {rank}' if rank else ''}"
              + (f"; router host time {router_us:.0f} us/step (measured here)" if router_us else ""))
        print(tabulate(rows, headers="keys", floatfmt="g"))
        return 0
    except (HarnessInputError, ValueError) as exc:
        print(f"rsp-bench project: error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------------------
# CLI: rsp-bench bench
# --------------------------------------------------------------------------------------

def configure_bench_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``rsp-bench bench`` (measured, interleaved, on this machine)."""
    p.add_argument("--model", default=None,
                   help="local Hugging Face Llama-family folder or .gguf (default: the embedded model)")
    p.add_argument("--batch", type=_int_list, default=[1, 4, 8], help="batch sizes (default 1,4,8)")
    p.add_argument("--tokens", type=_positive_int, default=48, help="new tokens per call (default 48)")
    p.add_argument("--rounds", type=_positive_int, default=8, help="interleaved rounds (default 8)")
    p.add_argument("--sensitivity", type=_float_list, default=[0.5],
                   help="pruned configurations, comma-separated sensitivities (default 0.5)")
    p.add_argument("--no-hf", action="store_true", help="leave model.generate out")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p


def _bench_calls(engine: Any, prompts: Sequence[str], batch: int, tokens: int,
                 configs: Mapping[str, Any], include_hf: bool) -> dict[str, Callable[[], CallTiming]]:
    batch_prompts = prompts_for_batch(prompts, batch)
    calls = {cid: engine_call(engine, batch_prompts, tokens, cfg) for cid, cfg in configs.items()}
    if include_hf:
        calls[HF_ID] = hf_generate_call(engine.hf_model, [engine.encode(p) for p in batch_prompts],
                                        tokens, engine.pad_id, engine.eos_id)
    return calls


def run_bench(args: argparse.Namespace) -> int:
    """``rsp-bench bench``: engine off vs pruned vs model.generate, interleaved, measured."""
    try:
        from reference_engine import Engine, PruningConfig

        engine = Engine.load(args.model)
        configs: dict[str, Any] = {OFF_ID: PruningConfig(mode="off", log_level="NONE")}
        for s in args.sensitivity:
            configs[f"reference/lossy/s={s:.2f}"] = PruningConfig(
                sensitivity=s, mode="lossy", log_level="NONE", hardware_watermark=0.0)
        roof = bandwidth_roofline(engine)
        prompts = fixed_prompts()
        results: dict[str, Any] = {"roofline": roof.to_dict(), "batches": {}}
        if not args.json:
            print(f"MEASURED on this machine ({roof.threads} threads); interleaved rounds, "
                  f"{args.rounds} rounds x {args.tokens} tokens, warm-up excluded")
            print(f"roofline: the model's {roof.gemv_count} matrix-vector products alone: "
                  f"{roof.tokens_per_s:.1f} tokens/s, {roof.gbs:.1f} GB/s")
        for batch in args.batch:
            bench = InterleavedBench(_bench_calls(engine, prompts, batch, args.tokens, configs,
                                                  not args.no_hf))
            bench.warm_up()
            bench.run(args.rounds)
            figs = bench_figures(bench, engine, roof if batch == 1 else None,
                                 hf=None if args.no_hf else HF_ID)
            results["batches"][str(batch)] = figs
            if args.json:
                continue
            from tabulate import tabulate

            rows = []
            for name, f in figs.items():
                def v(key: str, fmt: str = "{:.2f}") -> str:
                    if key not in f:
                        return ""
                    x = f[key]
                    ci = f" [{x['ci'][0]:.2f}, {x['ci'][1]:.2f}]" if x["ci"] else ""
                    return fmt.format(x["value"]) + ci
                rows.append({"config": name, "ttft ms p50": v("ttft_ms_p50", "{:.1f}"),
                             "tpot ms p50": v("tpot_ms_p50", "{:.1f}"),
                             "tpot ms p90": v("tpot_ms_p90", "{:.1f}"),
                             "decode tok/s": v("decode_tokens_per_s", "{:.1f}"),
                             "speed-up vs off": v("speedup_vs_off") or v("speedup_vs_hf_generate"),
                             "blocks/token": v("blocks_executed_per_token"),
                             "GB/s": v("achieved_bandwidth_gbs", "{:.1f}"),
                             "of roofline": v("roofline_fraction"),
                             "router ms/token": v("router_ms_per_token", "{:.3f}"),
                             "measured/ideal": v("speedup_over_ideal")})
            print(f"\nbatch {batch} (decode tok/s: all sequences together; "
                  f"on {OFF_ID} the speed-up column is engine off over model.generate)")
            print(tabulate(rows, headers="keys"))
        if args.json:
            print(json.dumps(results, indent=2))
        return 0
    except (HarnessInputError, ValueError) as exc:
        print(f"rsp-bench bench: error: {exc}", file=sys.stderr)
        return 2


def _main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m rsp_bench.speed project|bench ...``) until cli.py wires it."""
    parser = argparse.ArgumentParser(prog="rsp-bench")
    sub = parser.add_subparsers(dest="command", required=True)
    configure_project_parser(sub.add_parser("project", help="projected GPU figures"))
    configure_bench_parser(sub.add_parser("bench", help="measured interleaved speed"))
    args = parser.parse_args(argv)
    return run_project(args) if args.command == "project" else run_bench(args)


if __name__ == "__main__":
    raise SystemExit(_main())
