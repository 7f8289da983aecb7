"""Adapters that turn a generator into a benchmarked call returning a ``CallTiming``: the
reference engine (its own step timings), any ``EngineAdapter``, ``model.generate`` (timed from
outside by a streamer), and the reference engine's bare model math on any device.

Must NOT import the reference engine or transformers at module level (they are imported inside
the functions that need them), nor pytest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from rsp_bench.errors import HarnessInputError
from rsp_bench.speed.interleaved import CallTiming

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
                config: Any = None, kernel: str | None = None) -> Callable[[], CallTiming]:
    """A call that runs ``engine.generate(prompts, max_new_tokens, config=config)`` (the
    reference engine's API) and reports the engine's own timings (module docstring).

    ``kernel``: the engine's decode kernel for this call (``engine.decode_kernel``: "torch",
    the exact path, or "numpy"), restored afterwards; None leaves the engine's own."""
    prompts = list(prompts)

    def call() -> CallTiming:
        before = getattr(engine, "decode_kernel", None)
        if kernel is not None:
            engine.decode_kernel = kernel
        try:
            results = engine.generate(prompts, max_new_tokens=max_new_tokens, config=config)
        finally:
            if kernel is not None:
                engine.decode_kernel = before
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
