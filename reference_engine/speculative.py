"""Lossless mode: self-speculative greedy decoding whose output is exactly the pruning-off output.

Each decode step either runs one plain full-model token (exactly what mode "off" runs) or drafts
k tokens and checks them with ONE full forward pass over k+1 positions:

- **Draft sources.** Prompt lookup: the last n tokens (n = 3, 2, 1) are looked up in the prompt
  plus the output so far and the tokens that followed their latest earlier occurrence are copied
  (an incremental n-gram table, so a lookup is O(1); copying past the end of the sequence repeats
  the period, LZ77-style, so loops draft well). The pruned path: ``decode_step`` with a static
  plan that bypasses the calibrated least-harmful quarter of the non-blacklisted blocks (with
  their linear bypass maps), writing its K/V into the very cache positions the verify pass then
  overwrites, so drafting needs no second cache.
- **Verify.** ``verify_forward`` runs every block over [current token, d1..dk] at
  start = cache.length with a causal mask over the cache. Accepted: the longest prefix of drafts
  that equals the verifier's argmax, plus the verifier's own next token; the cache is rolled back
  by setting ``cache.length`` (stale K/V past it is never read: attention reads [:length]).
- **Adaptive.** Per source (lookup by n, pruned) acceptance is a decayed count of successes and
  failures pulled towards a prior, so evidence fades and a source that failed is retried now and
  then. Costs are measured, not assumed: an EMA of the plain step's wall time, of the verify
  pass's extra cost per position (``beta``, in plain steps) and of a pruned draft step (in plain
  steps), kept per engine across calls. Each step takes the (source, k) that maximises expected
  tokens per unit time, E = (1 - a^(k+1)) / (1 - a) over k * draft_cost + 1 + beta * k, and runs
  a plain step unless that beats 1 by ``min_gain``. On the embedded model on 2 CPU cores a pruned
  draft still costs ~80% of a full step (the LM head alone is 21% of it) at ~75% acceptance, so
  the cost model keeps the pruned source off there; prompt lookup carries the speed-up.

Exactness (why a margin certificate). A pass over k+1 positions multiplies matrices where decode
multiplies a matrix by a vector; MKL rounds the two differently (rows differ by ~1e-6), and the
K/V that a verify pass leaves in the cache feed that difference into every later token. So the
verifier's logits are the off path's logits plus a tiny perturbation, and a near-tie could flip.
Making the arithmetic identical is not possible in plain PyTorch without giving up the single
weight read that makes verification cheap (a GEMM row never equals the GEMV bit for bit here),
and changing mode "off" itself would break its token-for-token equality with ``model.generate``.
Instead every token chosen from perturbed arithmetic carries a certificate: its top-1 minus
top-2 logit margin must be at least ``MARGIN_EPS``, far above the largest perturbation measured
(``scripts/measure_lossless.py`` reports it; on SmolLM2-135M fp32 it was below 1e-4 while
MARGIN_EPS is 1e-2). A token without a certificate is recomputed exactly: the cache is rolled
back to the last position whose K/V came from exact (single-token) arithmetic and those tokens
are replayed through ``decode_step``, which is then bit-for-bit the off path; the replay also
re-checks every token it passes (``certificate_failures`` counts disagreements, which are then
corrected; none was ever seen). Measured on the embedded model (48 equivalence prompts + 32
SQuAD prompts, 64 tokens): see ``scripts/measure_lossless.py``; flips without the certificate
and mismatches with it are reported there.

Scope: batch 1 per row (rows run one after another). Batched speculative decoding needs per-row
acceptance lengths, ragged caches and masks; it is out of scope. Greedy only: lossless output is
defined as mode "off" at temperature 0 and batch 1 (a batched off call pads and multiplies
matrices, so its own near-ties can differ from batch 1).

Must not import the harness (``rsp_bench``).
"""

from __future__ import annotations

import json
import time
import weakref
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from .config import PruningConfig
from .errors import PromptError
from .model import KVCache, ModelWeights, attention_mask, block_forward, decode_step, logits_from_hidden, prefill

if TYPE_CHECKING:
    from .engine import Engine, GenerationResult, _Row

Tensor = torch.Tensor

MARGIN_EPS = 1e-2  # logits; the measured perturbation of verify arithmetic is ~100x smaller
DRAFT_SKIP_SHARE = 0.25  # share of blocks the pruned draft bypasses
COST_EMA = 0.1  # slow: wall times on a shared machine are noisy
EVIDENCE_DECAY = 0.97  # per step: old acceptance evidence fades, so a failed source is retried


@dataclass
class DraftPolicy:
    """How lossless mode drafts. The defaults adapt on their own; tests pin costs and sources.

    lookup / pruned: which draft sources may be used. max_lookup / max_pruned: the longest draft.
    ngram_max: the longest n-gram looked up. min_gain: expected speed-up over a plain step
    needed before drafting. verify_beta / pruned_cost: pin the cost model (in plain steps; None:
    measured online). priors: prior acceptance per source ("lookup3", "lookup2", "lookup1",
    "pruned"), worth ``prior_weight`` observations. force: "lookup" or "pruned" drafts from that
    source at its longest length on every step it can, ignoring the cost model (tests).
    margin_eps: the certificate threshold (logits). draft_keep: a fixed keep plan for the pruned
    draft instead of the calibrated one (needs no calibration; skips the degradation checks).
    """

    lookup: bool = True
    pruned: bool = True
    max_lookup: int = 12
    max_pruned: int = 4
    ngram_max: int = 3
    min_gain: float = 1.05
    verify_beta: float | None = None
    pruned_cost: float | None = None
    priors: dict[str, float] = field(default_factory=lambda: {
        "lookup3": 0.6, "lookup2": 0.45, "lookup1": 0.3, "pruned": 0.5})
    prior_weight: float = 2.0
    force: str | None = None
    margin_eps: float = MARGIN_EPS
    draft_keep: list[bool] | None = None


class _Costs:
    """Measured step costs of one engine, shared by its calls (wall-clock EMAs)."""

    def __init__(self) -> None:
        self.t_plain: float | None = None  # seconds per plain full-model step
        self.beta = 0.15  # verify: extra plain-steps per extra position (prior until measured)
        self.pruned: float | None = None  # pruned draft step, in plain steps

    def observe_plain(self, dt: float) -> None:
        self.t_plain = dt if self.t_plain is None else (1 - COST_EMA) * self.t_plain + COST_EMA * dt

    def observe_verify(self, positions: int, dt: float) -> None:
        if self.t_plain is None or positions < 2:
            return
        obs = min(max((dt / self.t_plain - 1.0) / (positions - 1), 0.0), 3.0)
        self.beta = (1 - COST_EMA) * self.beta + COST_EMA * obs

    def observe_pruned(self, steps: int, dt: float) -> None:
        if self.t_plain is None or steps < 1:
            return
        obs = min(dt / steps / self.t_plain, 3.0)
        self.pruned = obs if self.pruned is None else (1 - COST_EMA) * self.pruned + COST_EMA * obs


_COSTS: "weakref.WeakKeyDictionary[Any, _Costs]" = weakref.WeakKeyDictionary()


class _Acceptance:
    """Per-token acceptance of one draft source: decayed successes/failures plus a prior."""

    def __init__(self, prior: float, weight: float) -> None:
        self.prior, self.weight = prior, weight
        self.succ = self.fail = 0.0
        self.drafted = self.accepted = self.passes = 0

    @property
    def rate(self) -> float:
        return (self.succ + self.prior * self.weight) / (self.succ + self.fail + self.weight)

    def update(self, drafted: int, accepted: int, judged: int) -> None:
        # Geometric model: each accepted draft is a success, the first rejection one failure;
        # ``judged`` < ``drafted`` when a draft's verdict was left uncertain (no certificate).
        self.succ += accepted
        self.fail += accepted < judged
        self.drafted += drafted
        self.accepted += accepted
        self.passes += 1

    def decay(self) -> None:
        self.succ *= EVIDENCE_DECAY
        self.fail *= EVIDENCE_DECAY


def expected_gain(a: float, k: int, draft_cost: float, beta: float) -> float:
    """Expected tokens per plain-step time of a k-token draft at per-token acceptance ``a``."""
    a = min(max(a, 0.0), 0.999)
    tokens = (1.0 - a ** (k + 1)) / (1.0 - a)
    return tokens / (k * draft_cost + 1.0 + beta * k)


def _best_k(a: float, kmax: int, draft_cost: float, beta: float) -> tuple[int, float]:
    best = (0, 1.0)
    for k in range(1, kmax + 1):
        g = expected_gain(a, k, draft_cost, beta)
        if g > best[1]:
            best = (k, g)
    return best


class NgramIndex:
    """Latest continuation start of every 1..n_max-gram of a growing token sequence."""

    def __init__(self, tokens: list[int], n_max: int) -> None:
        self.n_max = n_max
        self.seq: list[int] = []
        self.table: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_max + 1)]
        for t in tokens:
            self.append(t)

    def append(self, tok: int) -> None:
        seq = self.seq
        seq.append(tok)
        end = len(seq) - 1  # the n-grams ending just before ``tok`` now have a continuation
        for n in range(1, self.n_max + 1):
            if end - n >= 0:
                self.table[n][tuple(seq[end - n:end])] = end

    def draft(self, n: int, k: int) -> list[int] | None:
        """The k tokens that followed the latest earlier occurrence of the last n tokens."""
        seq = self.seq
        if len(seq) < n:
            return None
        j = self.table[n].get(tuple(seq[len(seq) - n:]))
        if j is None:
            return None
        out: list[int] = []
        for i in range(k):
            src = j + i
            out.append(seq[src] if src < len(seq) else out[src - len(seq)])
        return out


def verify_forward(w: ModelWeights, cache: KVCache, token_ids: list[int], start: int,
                   key_valid: Tensor) -> Tensor:
    """Every block over ``token_ids`` at cache positions start.. (batch 1); logits [S, V].

    Writes the K/V of all S positions; the caller rolls ``cache.length`` back past rejections.
    """
    S = len(token_ids)
    pos = torch.arange(start, start + S)
    h = F.embedding(torch.tensor([token_ids]), w.embed)
    cos, sin = w.rope_cos[pos][None, None], w.rope_sin[pos][None, None]
    mask = attention_mask(key_valid, start, S)
    for layer, blk in enumerate(w.blocks):
        h = block_forward(blk, w.dims, cache, layer, h, start, cos, sin, mask, causal=False)
    cache.length = start + S
    return logits_from_hidden(w, h[0])


def draft_plan(engine: "Engine", cfg: PruningConfig) -> list[bool]:
    """Static keep plan of the pruned draft: bypass the calibrated least-harmful quarter of blocks."""
    cal = engine.calibration()
    L = engine.dims.n_layers
    protected = cfg.blacklist_for(L)
    order = [int(i) for i in cal.impact.argsort() if int(i) not in protected]
    n = min(len(order), max(1, round(DRAFT_SKIP_SHARE * L)))
    keep = [True] * L
    for i in order[:n]:
        keep[i] = False
    return keep


def _pruned_cost_prior(w: ModelWeights, keep: list[bool]) -> float:
    """Weight bytes a pruned step reads relative to a full step (bypassed blocks still read K/V)."""
    blk = w.bytes_per_block()
    kv = w.blocks[0].wkv.numel() * w.blocks[0].wkv.element_size()
    head = w.lm_head.numel() * w.lm_head.element_size()
    kept = sum(keep)
    return (kept * blk + (len(keep) - kept) * kv + head) / (len(keep) * blk + head)


class _RowDecoder:
    """Greedy self-speculative decoding of one prompt (batch 1)."""

    def __init__(self, engine: "Engine", ids: list[int], max_new: int, policy: DraftPolicy,
                 costs: _Costs, keep: list[bool] | None, detail: list[str] | None, request: int) -> None:
        self.engine, self.w, self.policy, self.costs = engine, engine.weights, policy, costs
        self.keep, self.detail, self.request = keep, detail, request
        self.P, self.max_new = len(ids), max_new
        self.cache = KVCache.allocate(engine.dims, 1, len(ids) + max_new)
        self.key_valid = torch.ones(1, self.cache.capacity, dtype=torch.bool)
        self.index = NgramIndex(ids, policy.ngram_max)
        self.clean = 0  # positions [0, clean) hold K/V from exactly the off path's arithmetic
        self.out: list[int] = []
        self.acc = {name: _Acceptance(policy.priors.get(name, 0.3), policy.prior_weight)
                    for name in [f"lookup{n}" for n in range(1, policy.ngram_max + 1)] + ["pruned"]}
        self.bypassed = 0
        self.plain_steps = self.repairs = self.replayed = self.certificate_failures = 0
        self.step_times: list[float] = []
        self.block_trace: list[int] = []

    # ---- the three kinds of step; each appends >= 1 token through _emit ----
    def prefill(self, hidden: list[Tensor] | None) -> Tensor:
        ids = self.index.seq
        logits = prefill(self.w, self.cache, torch.tensor([ids]), torch.arange(self.P)[None],
                         self.key_valid, hidden_out=hidden)
        self.clean = self.P
        return logits[0]

    def run(self, first_logits: Tensor) -> None:
        self._emit([int(first_logits.argmax())])
        while not self.done:
            t0 = time.perf_counter()
            choice = self._choose()
            blocks = self._plain() if choice is None else self._draft_and_verify(*choice)
            dt = time.perf_counter() - t0
            # Attribute the step's time and weight reads evenly to the tokens it produced, so
            # per-token figures (TPOT, blocks per token) stay comparable with mode "off", whose
            # lists hold one entry per token after the first.
            n = len(self.out) - 1 - len(self.step_times)
            if n < 1:  # only after a certificate failure truncated the output
                self.step_times[-1:] = [sum(self.step_times[-1:]) + dt]
                continue
            self.step_times.extend([dt / n] * n)
            self.block_trace.extend(blocks // n + (i < blocks % n) for i in range(n))
            for a in self.acc.values():
                a.decay()

    @property
    def done(self) -> bool:
        return len(self.out) >= self.max_new or (self.out and self.out[-1] == self.engine.eos_id)

    def _emit(self, tokens: list[int]) -> int:
        n = 0
        for t in tokens:
            if self.done:
                break
            self.out.append(t)
            self.index.append(t)
            n += 1
        return n

    @property
    def _contaminated(self) -> bool:
        return self.cache.length > self.clean

    def _plain(self) -> int:
        """One full-model token, exactly the off path's step; returns block weight passes."""
        start = self.cache.length
        contaminated = self._contaminated
        t0 = time.perf_counter()
        logits = decode_step(self.w, self.cache, torch.tensor([self.out[-1]]), torch.tensor([start]),
                             self.key_valid, None, None, None)[0]
        self.plain_steps += 1
        L = self.engine.dims.n_layers
        if not contaminated:
            self.clean = self.cache.length
            self.costs.observe_plain(time.perf_counter() - t0)
            self._emit([int(logits.argmax())])
            return L
        # Earlier verify passes left K/V from other arithmetic: the token needs a certificate.
        top = logits.topk(2)
        if float(top.values[0] - top.values[1]) >= self.policy.margin_eps:
            self._emit([int(top.indices[0])])
            return L
        self.cache.length = start
        return L + self._repair()

    def _draft_and_verify(self, source: str, k: int) -> int:
        start = self.cache.length
        L = self.engine.dims.n_layers
        blocks = L
        if source == "pruned":
            drafts = self._pruned_drafts(k)
            blocks += k * sum(self.keep)
        else:
            drafts = self.index.draft(int(source[len("lookup"):]), k)
        t0 = time.perf_counter()
        logits = verify_forward(self.w, self.cache, [self.out[-1]] + drafts, start, self.key_valid)
        top = logits.topk(2, dim=-1)
        best = top.indices[:, 0].tolist()
        safe = ((top.values[:, 0] - top.values[:, 1]) >= self.policy.margin_eps).tolist()
        tokens: list[int] = []
        certified = True
        for i in range(k + 1):
            if not safe[i]:
                certified = False
                break
            tokens.append(best[i])
            if i == k or best[i] != drafts[i]:
                break
        accepted = sum(1 for i in range(min(len(tokens), k)) if tokens[i] == drafts[i])
        # Without a certificate the verdict on draft i is unknown: count it as neither.
        self.acc[source].update(k, accepted, k if certified else accepted)
        # Positions start.. now hold the current token and the accepted drafts; drop the rest.
        self.cache.length = start + len(tokens)
        self.costs.observe_verify(k + 1, time.perf_counter() - t0)
        if self.detail is not None:
            self.detail.append(json.dumps({"event": "verify", "request": self.request, "token": len(self.out),
                                           "source": source, "drafted": k, "accepted": accepted,
                                           "certified": certified}))
        self._emit(tokens)
        if not certified and not self.done:
            blocks += self._repair()
        return blocks

    def _pruned_drafts(self, k: int) -> list[int]:
        start = self.cache.length
        t0 = time.perf_counter()
        tok = self.out[-1]
        drafts = []
        for i in range(k):
            logits = decode_step(self.w, self.cache, torch.tensor([tok]), torch.tensor([start + i]),
                                 self.key_valid, self.keep, self.engine._bypass, None)
            tok = int(logits[0].argmax())
            drafts.append(tok)
        self.bypassed += k * (len(self.keep) - sum(self.keep))
        self.costs.observe_pruned(k, time.perf_counter() - t0)
        self.cache.length = start  # the verify pass overwrites these positions
        return drafts

    def _repair(self) -> int:
        """Emit the exact next token by replaying every token since the last exact position
        through decode_step (bit-for-bit the off path). Returns block weight passes."""
        self.repairs += 1
        seq = self.index.seq
        self.cache.length = self.clean
        replayed = 0
        for p in range(self.clean, len(seq)):
            logits = decode_step(self.w, self.cache, torch.tensor([seq[p]]), torch.tensor([p]),
                                 self.key_valid, None, None, None)[0]
            replayed += 1
            nxt = int(logits.argmax())
            if p + 1 < len(seq) and nxt != seq[p + 1]:
                # A certified token was wrong after all: the exact path wins, drop what followed.
                self.certificate_failures += 1
                del self.out[p + 1 - self.P:]
                del self.step_times[max(len(self.out) - 1, 0):]
                del self.block_trace[max(len(self.out) - 1, 0):]
                self.index = NgramIndex(seq[:p + 1], self.policy.ngram_max)
                break
        self.replayed += replayed
        self.clean = self.cache.length
        self._emit([nxt])
        return replayed * self.engine.dims.n_layers

    def _choose(self) -> tuple[str, int] | None:
        """The (source, k) with the best expected gain, or None for a plain step."""
        room = self.max_new - len(self.out) - 1  # a pass yields up to k + 1 tokens
        if room < 1:
            return None
        pol = self.policy
        if pol.force == "pruned" and self.keep is not None:
            return "pruned", min(pol.max_pruned, room)
        beta = pol.verify_beta if pol.verify_beta is not None else self.costs.beta
        best: tuple[str, int] | None = None
        best_gain = pol.min_gain
        if pol.lookup:
            for n in range(pol.ngram_max, 0, -1):
                if self.index.draft(n, 1) is None:
                    continue
                if pol.force == "lookup":
                    return f"lookup{n}", min(pol.max_lookup, room)
                k, g = _best_k(self.acc[f"lookup{n}"].rate, min(pol.max_lookup, room), 0.0, beta)
                if g > best_gain:
                    best, best_gain = (f"lookup{n}", k), g
        if pol.pruned and self.keep is not None and pol.force is None:
            cost = pol.pruned_cost if pol.pruned_cost is not None else self.costs.pruned
            if cost is None:
                cost = _pruned_cost_prior(self.w, self.keep)
            k, g = _best_k(self.acc["pruned"].rate, min(pol.max_pruned, room), cost, beta)
            if g > best_gain:
                best = ("pruned", k)
        return best

    def stats(self) -> dict[str, Any]:
        lookup = [a for name, a in self.acc.items() if name.startswith("lookup")]
        per_source = {
            "prompt_lookup": _source_stats(sum(a.drafted for a in lookup), sum(a.accepted for a in lookup),
                                           sum(a.passes for a in lookup)),
            "pruned": _source_stats(self.acc["pruned"].drafted, self.acc["pruned"].accepted,
                                    self.acc["pruned"].passes),
        }
        for name, a in self.acc.items():
            if name.startswith("lookup"):
                per_source["prompt_lookup"][f"n{name[len('lookup'):]}"] = _source_stats(a.drafted, a.accepted, a.passes)
        drafted = sum(a.drafted for a in self.acc.values())
        accepted = sum(a.accepted for a in self.acc.values())
        return {
            "drafted": drafted, "accepted": accepted, "rejected": drafted - accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "sources": per_source,
            "verify_passes": sum(a.passes for a in self.acc.values()),
            "plain_steps": self.plain_steps, "repairs": self.repairs, "replayed_tokens": self.replayed,
            "certificate_failures": self.certificate_failures, "margin_eps": self.policy.margin_eps,
        }


def _source_stats(drafted: int, accepted: int, passes: int) -> dict[str, Any]:
    return {"drafted": drafted, "accepted": accepted, "rejected": drafted - accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0, "verify_passes": passes}


def generate_lossless(engine: "Engine", rows: list["_Row"], max_new_tokens: int, cfg: PruningConfig,
                      log_file: IO[str] | None, policy: DraftPolicy | None = None) -> list["GenerationResult"]:
    """Greedy generation equal to mode "off" at batch 1, sped up by verified drafts; one row at a time."""
    from .engine import GenerationResult

    policy = policy or DraftPolicy()
    if policy.force not in (None, "lookup", "pruned"):
        raise ValueError(f"DraftPolicy.force must be None, 'lookup' or 'pruned', got {policy.force!r}")
    w, dims = engine.weights, engine.dims
    for i, r in enumerate(rows):
        if not r.ids:
            raise PromptError(f"prompt {i} encodes to no tokens: {r.prompt!r}")
        if len(r.ids) + max_new_tokens > dims.max_positions:
            raise PromptError(
                f"prompt {i} is {len(r.ids)} tokens; with max_new_tokens={max_new_tokens} it exceeds the "
                f"model's context of {dims.max_positions} tokens")
    costs = _COSTS.setdefault(engine, _Costs())
    use_pruned = policy.pruned and cfg.prunes
    detail: list[str] | None = [] if cfg.log_level == "DETAILED" else None
    results = []
    for b, r in enumerate(rows):
        t_start = time.perf_counter()
        calibrated = use_pruned and policy.draft_keep is None
        keep = (list(policy.draft_keep) if policy.draft_keep is not None else draft_plan(engine, cfg)) if use_pruned else None
        dec = _RowDecoder(engine, r.ids, max_new_tokens, policy, costs, keep, detail, b)
        hidden: list[Tensor] | None = [] if calibrated else None
        first = dec.prefill(hidden)
        if calibrated:
            # Odd input turns the pruned drafts off (the output is exact either way).
            engine._check_degradation([r], hidden, engine.calibration())
            if r.degraded_reason is not None:
                dec.keep = None
        del hidden
        t_first = time.perf_counter()
        dec.run(first)
        t_end = time.perf_counter()
        n_tok = len(dec.out)
        stats = {
            "layers_bypassed": dec.bypassed,
            "total_tokens": n_tok,
            "bypass_ratio": dec.bypassed / (dims.n_layers * n_tok) if n_tok else 0.0,
            "degraded": r.degraded_reason is not None,
            "degraded_reason": r.degraded_reason,
            "mode": cfg.mode,
            "sensitivity": cfg.sensitivity,
            "blocks": dims.n_layers,
            "prompt_tokens": len(r.ids),
            "executed_blocks_per_step": dec.block_trace,
            "router_time_s": 0.0,
            "prefill_time_s": t_first - t_start,
            "decode_time_s": t_end - t_first,
            "decode_step_times_s": dec.step_times,
            "batch_size": 1,
            **dec.stats(),
        }
        results.append(GenerationResult(engine.decode(dec.out), list(dec.out), list(r.ids), stats))
    engine._emit_logs(cfg, results, detail or [], log_file)
    return results
