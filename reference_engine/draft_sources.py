"""Lossless mode's draft sources and their cost model: where drafts come from, how often each
source's drafts are accepted, what drafting and verifying cost, and which (source, k) pays.

Why a module of its own: speculative.py drafts, verifies, rolls back and keeps the output exact
whatever it drafts; what is here only decides how fast that is. It needs no model (token ids,
rates and wall times), so the cost model can be read, tested and replayed on its own
(scripts/lossless_policy_dev.py).

- **Prompt lookup.** The last n tokens (n = 4 .. 1) are looked up in the prompt plus the output
  so far, and the tokens that followed their latest earlier occurrence are copied (``NgramIndex``:
  an incremental n-gram table, a lookup is O(1); copying past the end repeats the period,
  LZ77-style, so loops draft well). Each match is a source of its own by n and by class
  (``MATCH_CLASSES``): "u" every earlier occurrence was followed by the same token, "o" one
  earlier occurrence, "x" they differed (acceptance 0.08-0.25 for a mixed 1-gram, 0.7-0.9 for a
  unanimous one on development extraction prompts), so the cost model drafts where a match is
  trustworthy. "copy": when a pass accepted every draft and the verifier's own token also matched
  the source, the next pass simply continues that span. The pruned draft (a full-model step with
  blocks bypassed) is run by speculative.py, which owns the engine's calibration and decode step;
  here it is one more source with an acceptance and a measured cost.
- **Adaptive.** Acceptance per source (``_Acceptance``) is a decayed count of successes and
  failures pulled towards a prior (evidence fades, so a source that failed is retried now and
  then). Costs are measured (``_Costs``), per engine and across calls: EMAs of the plain step's
  wall time, of an S-position verify pass and of a pruned draft step, both in plain steps. The
  (source, k) worth drafting maximises expected tokens per unit time (``expected_gain``),
  (1 - a^(k+1)) / (1 - a) / (k * draft_cost + verify_cost(k+1)). Measured on SmolLM2-135M,
  1 shared CPU core, in plain steps of the same kernel: the native pass ~1.0 at 2 positions, 1.1
  at 4, 1.4 at 8, 1.9 at 13 (against native steps); the torch pass (``verify_torch``) ~1.35 at 2,
  1.7 at 5, 2.4 at 13 (against torch steps). A pruned draft step ~0.8 (the LM head is 21% of a
  step) at ~75% acceptance never pays, so prompt lookup carries the speed-up.

Must not import ``speculative`` (which imports this module one way), ``engine``, or the harness
(``rsp_bench``).
"""

from __future__ import annotations

import weakref
from typing import Any

COST_EMA = 0.1  # slow: wall times on a shared machine are noisy
EVIDENCE_DECAY = 0.97  # per step: old acceptance evidence fades, so a failed source is retried


class _Costs:
    """Measured step costs of one engine, shared by its calls (wall-clock EMAs, in plain steps)."""

    def __init__(self, max_positions: int = 64) -> None:
        self.max_positions = max_positions
        self.kind: str | None = None  # (decode kernel, verify) the timings below belong to
        self.acceptance: dict[str, _Acceptance] = {}  # per source, across requests
        self.use("torch/torch")

    def use(self, kind: str) -> None:
        """Time EMAs belong to one (decode kernel, verify) pair: a new pair starts from its prior
        (acceptance does not depend on the kernels and is kept)."""
        if kind == self.kind:
            return
        self.kind = kind
        self.t_plain: float | None = None  # seconds per plain full-model step
        # verify[S]: an S-position verify pass in plain steps. Priors measured with SmolLM2-135M on
        # 1 shared CPU core: the torch pass costs a step-up at S=2 (1.3), then ~0.1 per position;
        # the native pass ~1.0 at S=2, 1.1 at 4, 1.4 at 8, 1.9 at 13 (its compute grows with S).
        native = kind.endswith("/native")
        self.verify = [1.0, 1.0] + [1.0 + 0.075 * (S - 2) if native else 1.3 + 0.1 * (S - 2)
                                    for S in range(2, self.max_positions + 1)]
        self.pruned: float | None = None  # one pruned draft step

    def engine_prior(self, name: str, prior: float, weight: float) -> "_Acceptance":
        if name not in self.acceptance:
            self.acceptance[name] = _Acceptance(prior, 2 * weight)
        return self.acceptance[name]

    def observe_plain(self, dt: float) -> None:
        self.t_plain = dt if self.t_plain is None else (1 - COST_EMA) * self.t_plain + COST_EMA * dt

    def observe_verify(self, positions: int, dt: float) -> None:
        if self.t_plain is None or positions >= len(self.verify):
            return
        obs = min(max(dt / self.t_plain, 1.0), 4.0 + positions)
        self.verify[positions] = (1 - COST_EMA) * self.verify[positions] + COST_EMA * obs

    def observe_pruned(self, steps: int, dt: float) -> None:
        if self.t_plain is None or steps < 1:
            return
        obs = min(dt / steps / self.t_plain, 3.0)
        self.pruned = obs if self.pruned is None else (1 - COST_EMA) * self.pruned + COST_EMA * obs

    def verify_costs(self, kmax: int) -> list[float]:
        """Cost of verifying k = 0..kmax drafts, made non-decreasing (noise must not make a
        longer pass look cheaper than a shorter one)."""
        out = [1.0]
        for k in range(1, kmax + 1):
            out.append(max(out[-1], self.verify[min(k + 1, len(self.verify) - 1)]))
        return out


_COSTS: "weakref.WeakKeyDictionary[Any, _Costs]" = weakref.WeakKeyDictionary()
ENGINE_DECAY = 0.98  # per verify pass: the engine's acceptance remembers the last ~50 passes


class _Acceptance:
    """Per-token acceptance of one draft source: decayed successes/failures plus a prior, which
    is a number or another _Acceptance (a request's estimate leans on the engine's)."""

    def __init__(self, prior: "float | _Acceptance", weight: float) -> None:
        self.prior, self.weight = prior, weight
        self.succ = self.fail = 0.0
        self.drafted = self.accepted = self.passes = 0

    @property
    def rate(self) -> float:
        prior = self.prior.rate if isinstance(self.prior, _Acceptance) else self.prior
        return (self.succ + prior * self.weight) / (self.succ + self.fail + self.weight)

    def update(self, drafted: int, accepted: int, judged: int) -> None:
        # Geometric model: each accepted draft is a success, the first rejection one failure;
        # ``judged`` < ``drafted`` when a draft's verdict was left uncertain (no certificate).
        self.succ += accepted
        self.fail += accepted < judged
        self.drafted += drafted
        self.accepted += accepted
        self.passes += 1

    def decay(self, factor: float = EVIDENCE_DECAY) -> None:
        self.succ *= factor
        self.fail *= factor


def expected_gain(a: float, k: int, draft_cost: float, verify_cost: float) -> float:
    """Expected tokens per plain-step time of a k-token draft at per-token acceptance ``a``,
    when one draft token costs ``draft_cost`` and the (k+1)-position verify ``verify_cost``."""
    a = min(max(a, 0.0), 0.999)
    tokens = (1.0 - a ** (k + 1)) / (1.0 - a)
    return tokens / (k * draft_cost + verify_cost)


def _best_k(a: float, draft_cost: float, verify: list[float]) -> tuple[int, float]:
    best = (0, 1.0)
    for k in range(1, len(verify)):
        g = expected_gain(a, k, draft_cost, verify[k])
        if g > best[1]:
            best = (k, g)
    return best


# A fresh match is classed by what followed its n-gram before: "u" every earlier occurrence was
# followed by the same token (two or more), "o" the n-gram occurred once, "x" continuations differed.
# Acceptance differs by class far more than by n (development prompts, scripts/lossless_policy_dev.py:
# n = 1 "x" 0.08-0.25, "u" 0.70-0.93), so each (n, class) is a draft source with its own estimate.
MATCH_CLASSES = ("u", "o", "x")


def _lookup_priors(n_max: int = 8) -> dict[str, float]:
    """Prior acceptance of each lookup source, from the development table (longer n: higher)."""
    out = {}
    for n in range(1, n_max + 1):
        out[f"lookup{n}u"] = min(0.85 + 0.03 * (n - 1), 0.95)
        out[f"lookup{n}o"] = min(0.45 + 0.1 * (n - 1), 0.8)
        out[f"lookup{n}x"] = min(0.15 + 0.1 * (n - 1), 0.45)
    return out


class NgramIndex:
    """Latest continuation start of every 1..n_max-gram of a growing token sequence, and whether
    its continuations so far agreed."""

    def __init__(self, tokens: list[int], n_max: int) -> None:
        self.n_max = n_max
        self.seq: list[int] = []
        # n-gram -> [latest continuation start, first continuation token, all agreed, occurrences]
        self.table: list[dict[tuple[int, ...], list]] = [{} for _ in range(n_max + 1)]
        for t in tokens:
            self.append(t)

    def append(self, tok: int) -> None:
        seq = self.seq
        seq.append(tok)
        end = len(seq) - 1  # the n-grams ending just before ``tok`` now have a continuation
        for n in range(1, self.n_max + 1):
            if end - n >= 0:
                key = tuple(seq[end - n:end])
                entry = self.table[n].get(key)
                if entry is None:
                    self.table[n][key] = [end, tok, True, 1]
                else:
                    entry[0] = end
                    entry[2] = entry[2] and entry[1] == tok
                    entry[3] += 1

    def _entry(self, n: int) -> list | None:
        seq = self.seq
        if len(seq) < n:
            return None
        return self.table[n].get(tuple(seq[len(seq) - n:]))

    def match(self, n: int) -> int | None:
        """Where the tokens after the latest earlier occurrence of the last n tokens start."""
        entry = self._entry(n)
        return None if entry is None else entry[0]

    def match_class(self, n: int) -> str | None:
        """The class of the last n tokens' match (MATCH_CLASSES), None without one."""
        entry = self._entry(n)
        if entry is None:
            return None
        return "o" if entry[3] == 1 else ("u" if entry[2] else "x")

    def copy(self, j: int, k: int) -> list[int]:
        """k tokens from position j on; past the end the copy repeats itself (LZ77-style)."""
        seq, out = self.seq, []
        for i in range(k):
            src = j + i
            out.append(seq[src] if src < len(seq) else out[src - len(seq)])
        return out

    def draft(self, n: int, k: int) -> list[int] | None:
        """The k tokens that followed the latest earlier occurrence of the last n tokens."""
        j = self.match(n)
        return None if j is None else self.copy(j, k)

