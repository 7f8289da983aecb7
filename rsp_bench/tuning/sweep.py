"""The measuring of ``rsp-bench tune``: the sweep settings (``TuneSettings``, ``QUICK``,
``FULL``, ``sweep_sensitivities``) and ``run_sweep``, which measures quality and the
interleaved speed-up over pruning off at each sensitivity, on the same requests.

Must NOT import pytest, rsp_bench.tuning.table / .report, or torch, transformers, the
engine and rsp_bench.speed / .quality at module level: they are imported inside the
functions that measure.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from rsp_bench.errors import HarnessInputError
from rsp_bench.tuning.recommendation import TuneRow, _check_budget

METRICS = ("top1_agreement", "squad_f1", "json_field_f1")



# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class TuneSettings:
    """How big one sweep is: sensitivities, and per quality metric the items (prompts,
    questions, documents: also the interleaved speed rounds) and new tokens per item."""

    steps: int
    items: Mapping[str, int]
    max_new_tokens: Mapping[str, int]
    name: str


QUICK = TuneSettings(steps=6, items={"top1_agreement": 8, "squad_f1": 12, "json_field_f1": 6},
                     max_new_tokens={"top1_agreement": 16, "squad_f1": 16, "json_field_f1": 64}, name="quick")
FULL = TuneSettings(steps=11, items={"top1_agreement": 48, "squad_f1": 100, "json_field_f1": 60},
                    max_new_tokens={"top1_agreement": 64, "squad_f1": 16, "json_field_f1": 64}, name="full")


def sweep_sensitivities(steps: int) -> list[float]:
    """``steps`` evenly spaced sensitivities from 0 to 1 inclusive, rounded to 4 decimals."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 3:
        raise HarnessInputError(f"--steps must be an integer >= 3 (0, something between, 1), got {steps!r}")
    return [round(i / (steps - 1), 4) for i in range(steps)]



# --------------------------------------------------------------------------- measuring


def _log(message: str) -> None:
    print(f"[tune] {message}", file=sys.stderr, flush=True)


def _spec(s: float) -> Any:
    from rsp_bench.engines import ConfigSpec, format_config_id, pruning_config

    if s == 0.0:  # sensitivity 0 disables pruning: it is the "off" configuration
        return ConfigSpec("reference/off", "reference", "off", None, {}, pruning_config("off"))
    return ConfigSpec(format_config_id("reference", "lossy", s), "reference", "lossy", s, {},
                      pruning_config("lossy", s))


def _timing(stats: Mapping[str, Any], tokens: int, what: str) -> Any:
    """A CallTiming from the engine's own stats of one request (rsp_bench.speed's convention:
    ttft = prefill_time_s, one step time per decode step)."""
    from rsp_bench.speed import CallTiming

    missing = [k for k in ("prefill_time_s", "decode_step_times_s") if k not in stats]
    if missing:
        raise HarnessInputError(f"engine stats lack {missing}: tune times the engine by its own stats")
    counts = None
    if all(k in stats for k in ("layers_bypassed", "total_tokens", "blocks")):
        counts = [(int(stats["layers_bypassed"]), int(stats["total_tokens"]), int(stats["blocks"]))]
    return CallTiming(ttft_s=float(stats["prefill_time_s"]), step_times_s=[float(t) for t in stats["decode_step_times_s"]],
                      batch=1, new_tokens=tokens, method=f"engine stats ({what})", bypass_counts=counts)


# The speed anchor: pruning off, run in every round beside the sensitivities, so that every row,
# s=0 included, is a measured ratio (s=0 against the anchor is an A/A ratio: the noise floor).
ANCHOR = "anchor-off"


def _interleaved(sensitivities: Sequence[float], n: int, run_one: Callable[[float | None, int], Any],
                 progress: Callable[[str], None]) -> Any:
    """One InterleavedBench whose round i runs item i under every sensitivity and the anchor,
    in rotated order; ``run_one(s, i)`` does the work (``s`` None: the anchor, whose outputs
    are not kept), keeps what quality needs and returns the CallTiming."""
    from rsp_bench.speed import InterleavedBench

    def make(s: float | None) -> Callable[[], Any]:
        counter = iter(range(n))  # each configuration runs exactly once per round
        return lambda: run_one(s, next(counter))

    configs = {ANCHOR: make(None)}
    configs.update({f"s={s:.4f}": make(s) for s in sensitivities})
    bench = InterleavedBench(configs)
    for i in range(n):
        bench.run_round()
        progress(f"item {i + 1}/{n} done under all {len(sensitivities)} sensitivities")
    return bench


def _speed_figures(bench: Any, sensitivities: Sequence[float]) -> dict[float, dict[str, Any]]:
    """Speed-up of each sensitivity over the pruning-off anchor (pairs: the rounds), tokens/s
    and bypass ratio."""
    from rsp_bench import metrics as m

    out: dict[float, dict[str, Any]] = {}
    for s in sensitivities:
        name = f"s={s:.4f}"
        counts = [c for t in bench.samples(name) for c in (t.bypass_counts or [])]
        ratio = m.bypass_ratio(sum(c[0] for c in counts), counts[0][2], sum(c[1] for c in counts)) if counts else 0.0
        sp = bench.speedup(ANCHOR, name)
        out[s] = {"speedup": sp["ratio"], "lo": sp["lo"], "hi": sp["hi"], "pairs": int(sp["pairs"]),
                  "tokens_per_s": bench.summary(name)["decode_tokens_per_s"], "bypass_ratio": ratio}
    return out


def _sweep_top1(engine: Any, sensitivities: Sequence[float], n: int, max_new: int,
                progress: Callable[[str], None]) -> tuple[dict[float, tuple[float, float, float, int]], Any]:
    """Teacher-forced top-1 agreement, and the speed of the same teacher-forced decode steps."""
    from rsp_bench import datasets as ds
    from rsp_bench import metrics as m
    from rsp_bench.engines import ReferenceAdapter
    from rsp_bench.quality import ReferenceOutputs

    adapter = ReferenceAdapter(engine)
    prompts = [p.text for p in ds.quick_subset(ds.load_prompts(), n)]
    progress(f"reference: {len(prompts)} prompts x {max_new} tokens generated unpruned")
    reference = ReferenceOutputs(adapter, _spec(0.0)).get("tune", prompts, max_new)
    lengths = [len(r.token_ids) for r in reference]
    if min(lengths) < 1:
        raise HarnessInputError("an unpruned reference continuation is empty; use other prompts")
    logits: dict[float, list[Any]] = {s: [None] * n for s in sensitivities}
    specs = {s: _spec(s) for s in sensitivities}

    def run_one(s: float | None, i: int) -> Any:
        ref = reference[i]
        got, stats = adapter.teacher_forced_logits(ref.prompt_ids, ref.token_ids, specs[0.0 if s is None else s])
        if s is not None:
            logits[s][i] = got
        return _timing(stats, len(ref.token_ids), "teacher-forced decode steps")

    progress(f"teacher forcing the reference under {len(sensitivities)} sensitivities, interleaved")
    bench = _interleaved(sensitivities, n, run_one, progress)
    ref_logits = logits[0.0]  # sensitivity 0 is pruning off: these are the reference logits
    quality = {}
    for s in sensitivities:
        matches = [float(m.top1_matches(r, c).sum()) for r, c in zip(ref_logits, logits[s])]
        _, lo, hi = m.bootstrap_ratio_ci(matches, lengths)
        quality[s] = (m.top1_agreement(ref_logits, logits[s]), lo, hi, sum(lengths))
    return quality, bench


def _sweep_extraction(engine: Any, metric: str, sensitivities: Sequence[float], n: int, max_new: int,
                      progress: Callable[[str], None]) -> tuple[dict[float, tuple[float, float, float, int]], Any]:
    """SQuAD F1 or JSON field F1 (rsp_bench.quality.extraction_metrics), and the speed of the
    same generations."""
    from rsp_bench import datasets as ds
    from rsp_bench.engines import ReferenceAdapter
    from rsp_bench.quality import extraction_metrics, extraction_prompts

    adapter = ReferenceAdapter(engine)
    squad = ds.quick_subset(ds.load_squad(), n) if metric == "squad_f1" else []
    docs = ds.quick_subset(ds.load_structured(), n) if metric == "json_field_f1" else []
    squad_prompts, json_prompts = extraction_prompts(squad, docs)
    prompts = squad_prompts or json_prompts
    outputs: dict[float, dict[str, Any]] = {s: {} for s in sensitivities}
    specs = {s: _spec(s) for s in sensitivities}

    def run_one(s: float | None, i: int) -> Any:
        [out] = adapter.generate([prompts[i]], max_new, specs[0.0 if s is None else s])
        if s is not None:
            outputs[s][prompts[i]] = out
        return _timing(out.stats, len(out.token_ids), "generation")

    progress(f"{metric}: {n} items x {max_new} tokens under {len(sensitivities)} sensitivities, interleaved")
    bench = _interleaved(sensitivities, len(prompts), run_one, progress)
    quality = {}
    for s in sensitivities:
        answers = {"squad": [outputs[s][p] for p in squad_prompts], "json": [outputs[s][p] for p in json_prompts]}
        mv = extraction_metrics(None, specs[s], squad, docs, None, max_new, answers=answers)[metric]
        lo, hi = mv.ci if mv.ci is not None else (mv.value, mv.value)
        quality[s] = (mv.value, lo, hi, mv.n)
    return quality, bench


def run_sweep(engine: Any, metric: str, settings: TuneSettings, budget: float | None = None,
              steps: int | None = None, items: int | None = None, max_new_tokens: int | None = None,
              progress: Callable[[str], None] = _log) -> list[TuneRow]:
    """Measure quality and speed at each sensitivity of the sweep; return the curve.

    Round i of one interleaved bench runs item i (a prompt, question or document) under every
    sensitivity in rotated order (rsp_bench.speed.InterleavedBench); each call's output feeds
    the quality figure and its engine-timed decode steps the speed figure, so both come from
    the same requests and the speed-up pairs are neighbours in time.
    """
    if metric not in METRICS:
        raise HarnessInputError(f"--metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if budget is not None:
        _check_budget(budget)
    sens = sweep_sensitivities(settings.steps if steps is None else steps)
    n = settings.items[metric] if items is None else items
    max_new = settings.max_new_tokens[metric] if max_new_tokens is None else max_new_tokens
    # Two items at least, so that there are speed-up pairs to bootstrap; two tokens at least,
    # so that every call has a decode step to time.
    for name, v in (("--items", n), ("--max-new-tokens", max_new)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            raise HarnessInputError(f"{name} must be an integer >= 2, got {v!r}")
    if metric == "top1_agreement":
        quality, bench = _sweep_top1(engine, sens, n, max_new, progress)
    else:
        quality, bench = _sweep_extraction(engine, metric, sens, n, max_new, progress)
    speed = _speed_figures(bench, sens)
    return [TuneRow(sensitivity=s, metric=metric, quality=quality[s][0], quality_lo=quality[s][1],
                    quality_hi=quality[s][2], quality_n=quality[s][3], speedup=speed[s]["speedup"],
                    speedup_lo=speed[s]["lo"], speedup_hi=speed[s]["hi"], speedup_pairs=speed[s]["pairs"],
                    decode_tokens_per_s=speed[s]["tokens_per_s"], bypass_ratio=speed[s]["bypass_ratio"],
                    budget=budget) for s in sens]


# --------------------------------------------------------------------------- CLI
