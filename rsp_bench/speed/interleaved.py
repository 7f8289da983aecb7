"""The interleaved runner: one timed call (``CallTiming``) and ``InterleavedBench``, which runs
named calls in rotated rounds (A B C, B C A, C A B ...) so that no engine always runs first and
slow drift of a shared machine cancels; speed-ups are ratios of neighbours in one round.

Must NOT import the reference engine, transformers or pytest: it works with any callable.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rsp_bench.errors import HarnessInputError
from rsp_bench.metrics import interleaved_speedup, speed_summary

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
