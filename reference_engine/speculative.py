"""Lossless mode: self-speculative greedy decoding whose output is exactly the pruning-off output.

Each decode step either runs one plain full-model token (``model.decode_step`` on the engine's
decode kernel, exactly what mode "off" runs) or drafts k tokens and checks them with ONE full forward pass over k+1 positions.
The draft sources and the cost model that picks (source, k) live in draft_sources.py.

- **Drafts.** Prompt lookup (an n-gram match, by n and match class) and "copy" (continuing a span
  the last pass copied in full) come from ``draft_sources.NgramIndex``. The pruned path:
  ``decode_step`` with a static plan bypassing the calibrated least-harmful quarter of the
  non-blacklisted blocks (with their bypass maps), writing K/V into the very cache positions the
  verify pass then overwrites, so it needs no second cache. Its plan (calibration) and the
  protective-degradation checks run only when the cost model first wants a pruned draft.
- **Verify.** One pass runs every block over [current token, d1..dk] at start = cache.length,
  causal over the cache: on the native decode kernel ``decode_native.verify_native`` (one C call,
  exact: see below), on the torch / numpy kernels ``verify_forward`` (torch products, certified). Accepted: the longest prefix of drafts equal to
  the verifier's argmax, plus the verifier's own next token. Rollback is ``cache.length = ...``:
  attention reads only [:length], and the next pass overwrites the stale positions.
- **Choice.** Each step takes the (source, k) of best expected gain under the measured costs and
  per-source acceptance, and runs a plain step unless that beats 1 by ``min_gain``: lossless is
  then plain decoding plus a few probes.

Exactness on the native kernel: by construction. ``verify_native`` computes every row with the
same code and summation order as the native single-token step (each weight matrix is only streamed
once for all S rows), so its logits and the K/V it writes are bit-identical to S native decode
steps (tests/test_verify_native.py, tiny and real model, 1 and 2 threads). An accepted token is
then exactly the one mode "off" chooses, the cache stays clean, and no certificate is needed:
``margin_eps`` applies to the torch verify only (``DraftPolicy.verify="torch"`` forces it).

Exactness on the torch verify: a margin certificate. The verify pass multiplies matrices where decode multiplies a
matrix by a vector; MKL rounds them differently (~1e-6 per product, never bit-equal here), and the
K/V a verify pass leaves behind carries that into every later token, so verifier logits are the
off path's plus a small perturbation and a near-tie could flip. Identical arithmetic was measured
and rejected: running the verify as decode's own matrix-vector products layer by layer is bit-exact
but costs ~2.7 plain steps for 4 positions (LM head alone), i.e. no speed-up; computing mode
"off" with the multi-row kernels would break its equality with ``model.generate``. Instead every
token chosen from perturbed arithmetic must show a top-1 minus top-2 logit margin of at least
``MARGIN_EPS`` = 2e-3. A flip needs a pairwise logit change above the margin, i.e. above
2 x max |logit change|; measured on SmolLM2-135M fp32 (``rsp-bench lossless``:
the off continuation pushed through 2..8-position verify passes), max |logit change| was ~1e-4
and max margin change 4e-5, so the certificate has a >= 10x safety factor. A token without a
certificate is recomputed exactly: the cache rolls back to the last position whose K/V came from
exact single-token arithmetic and the tokens since are replayed through ``decode_step`` (then the
off path bit for bit); the replay re-checks each token it passes (``certificate_failures``
counts disagreements, which it then corrects). Without the certificate no flip was seen either;
the measured rates are in the output of ``rsp-bench lossless`` and
the report. The certificate is calibrated for fp32; half precision perturbs ~1000x more and would
need a larger MARGIN_EPS (measure it with the script first).

Scope: batch 1 per row (rows run one after another): batching speculative decoding needs per-row
acceptance lengths and ragged caches, out of scope. Greedy only, and "equal to off" means off at
batch 1 (a batched off call pads and multiplies matrices, so its own near-ties can differ).

Must not import the harness (``rsp_bench``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Callable

import torch

from .config import PruningConfig
from .decode_native import verify_native
from .draft_sources import (_COSTS, ENGINE_DECAY, MATCH_CLASSES, NgramIndex, _Acceptance, _best_k, _Costs,
                            _lookup_priors)
from .generation import GenerationResult, PromptRow, check_rows_fit
from .model import KVCache, ModelWeights, decode_step, prefill
from .verify_torch import verify_forward

if TYPE_CHECKING:
    from .engine import Engine  # annotations only: no run-time import of engine.py

Tensor = torch.Tensor

MARGIN_EPS = 2e-3  # logits; >= 10x twice the largest measured perturbation (module docstring)
DRAFT_SKIP_SHARE = 0.25  # share of blocks the pruned draft bypasses


@dataclass
class DraftPolicy:
    """How lossless mode drafts. The defaults adapt on their own; tests pin costs and sources.

    lookup / pruned: which draft sources may be used. max_lookup / max_pruned: the longest draft.
    ngram_max: the longest n-gram looked up. min_gain: expected speed-up over a plain step
    needed before drafting. verify_beta / pruned_cost: pin the cost model (a k-draft verify costs
    1 + verify_beta * k plain steps, a pruned draft token pruned_cost; None: measured online).
    priors: prior acceptance per source ("copy": continuing a span the last pass copied in full,
    "lookup<n><class>": a fresh n-gram match of a class in MATCH_CLASSES, "pruned"), worth ``prior_weight``
    observations. force: "lookup" or "pruned" drafts from that source at its longest length on
    every step it can, ignoring the cost model (tests).
    margin_eps: the torch verify's certificate threshold (logits). verify: "native" (exact C pass,
    needs the native decode kernel), "torch", or None (native when the engine decodes natively). draft_keep: a fixed keep plan for the pruned
    draft instead of the calibrated one (needs no calibration; skips the degradation checks).
    learn_priors: a request's prior acceptance per source is the engine's recent acceptance
    (seeded by ``priors``) rather than ``priors`` itself.
    """

    lookup: bool = True
    pruned: bool = True
    max_lookup: int = 12
    max_pruned: int = 4
    ngram_max: int = 4
    min_gain: float = 1.05
    verify_beta: float | None = None
    pruned_cost: float | None = None
    priors: dict[str, float] = field(default_factory=lambda: {
        "copy": 0.75, "pruned": 0.5, **_lookup_priors()})
    prior_weight: float = 2.0
    force: str | None = None
    margin_eps: float = MARGIN_EPS
    draft_keep: list[bool] | None = None
    learn_priors: bool = True
    verify: str | None = None


def verify_kind(policy: DraftPolicy, decode_kernel: str) -> str:
    """Which verify pass lossless mode runs: "native" (exact) or "torch" (certified)."""
    kind = policy.verify or ("native" if decode_kernel == "native" else "torch")
    if kind not in ("native", "torch"):
        raise ValueError(f"DraftPolicy.verify must be None, 'native' or 'torch', got {policy.verify!r}")
    if kind == "native" and decode_kernel != "native":
        # Exact only against native plain steps: other kernels round differently.
        raise ValueError(f"DraftPolicy.verify='native' needs the native decode kernel; the engine's is "
                         f"{decode_kernel!r}")
    return kind


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


def _pruned_cost_prior(w: ModelWeights, keep: list[bool] | None) -> float:
    """Weight bytes a pruned step reads relative to a full step (bypassed blocks still read K/V);
    before the plan exists, as if DRAFT_SKIP_SHARE of the blocks were bypassed."""
    L = w.dims.n_layers
    blk = w.bytes_per_block()
    kv = w.blocks[0].wkv.numel() * w.blocks[0].wkv.element_size()
    head = w.lm_head.numel() * w.lm_head.element_size()
    kept = sum(keep) if keep is not None else L - max(1, round(DRAFT_SKIP_SHARE * L))
    return (kept * blk + (L - kept) * kv + head) / (L * blk + head)


class _RowDecoder:
    """Greedy self-speculative decoding of one prompt (batch 1)."""

    def __init__(self, engine: "Engine", row: "PromptRow", max_new: int, policy: DraftPolicy, cfg: PruningConfig,
                 costs: _Costs, detail: list[str] | None, request: int) -> None:
        self.engine, self.w, self.policy, self.cfg, self.costs = engine, engine.weights, policy, cfg, costs
        self.exact_verify = verify_kind(policy, engine.decode_kernel) == "native"
        self.verify = verify_native if self.exact_verify else verify_forward
        self.row, self.detail, self.request = row, detail, request
        ids = row.ids
        self.P, self.max_new = len(ids), max_new
        # The pruned draft: "off", "fixed" (policy.draft_keep) or "pending" until first wanted,
        # then "ready" or "off": its plan needs the calibration and its use the degradation checks,
        # which would only cost time on the (common) requests where drafting from it never pays.
        self.keep: list[bool] | None = list(policy.draft_keep) if policy.draft_keep is not None else None
        if not (policy.pruned and cfg.prunes):
            self.pruned_state = "off"
        else:
            self.pruned_state = "fixed" if self.keep is not None else "pending"
        self.hidden: list[Tensor] | None = None  # prefill's residual streams, for the checks
        self.setup_time = 0.0
        self.cache = KVCache.allocate(engine.dims, 1, len(ids) + max_new)
        self.key_valid = torch.ones(1, self.cache.capacity, dtype=torch.bool)
        self.index = NgramIndex(ids, policy.ngram_max)
        self.clean = 0  # positions [0, clean) hold K/V from exactly the off path's arithmetic
        self.out: list[int] = []
        self.copy_from: int | None = None  # source position when the output is copying a span
        names = (["copy"] + [f"lookup{n}{c}" for n in range(1, policy.ngram_max + 1) for c in MATCH_CLASSES]
                 + ["pruned"])
        self.shared: dict[str, _Acceptance] = {}
        if policy.learn_priors:  # a request starts from what this engine saw lately
            self.shared = {n: costs.engine_prior(n, policy.priors.get(n, 0.3), policy.prior_weight) for n in names}
        self.acc = {n: _Acceptance(self.shared.get(n, policy.priors.get(n, 0.3)), policy.prior_weight)
                    for n in names}
        self.bypassed = 0
        self.plain_steps = self.repairs = self.replayed = self.certificate_failures = 0
        self.step_times: list[float] = []
        self.block_trace: list[int] = []

    # ---- the three kinds of step; each appends >= 1 token through _emit ----
    def prefill(self) -> Tensor:
        ids = self.index.seq
        self.hidden = [] if self.pruned_state == "pending" else None
        # the engine's head: the first token as pruning off computes it (lossless must equal off)
        logits = prefill(self.w, self.cache, torch.tensor([ids]), torch.arange(self.P)[None],
                         self.key_valid, hidden_out=self.hidden, head=self.engine._head())
        self.clean = self.P
        return logits[0]

    def _pruned_ready(self) -> bool:
        """Build the calibrated draft plan and run the degradation checks, once, when wanted."""
        if self.pruned_state == "pending":
            t0 = time.perf_counter()
            self.engine._check_degradation([self.row], self.hidden, self.engine.calibration())
            self.hidden = None
            if self.row.degraded_reason is None:
                self.keep, self.pruned_state = draft_plan(self.engine, self.cfg), "ready"
            else:  # odd input: no pruned drafts (the output is exact either way)
                self.pruned_state = "off"
            self.setup_time += time.perf_counter() - t0
        return self.pruned_state in ("ready", "fixed")

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

    stop_check: Callable[[int], bool] | None = None
    on_token: Callable[[int, int, int], None] | None = None
    stopped = False

    @property
    def done(self) -> bool:
        return (self.stopped or len(self.out) >= self.max_new
                or (bool(self.out) and self.out[-1] == self.engine.eos_id))

    def _emit(self, tokens: list[int]) -> int:
        n = 0
        for t in tokens:
            if self.done:
                break
            self.out.append(t)
            self.index.append(t)
            n += 1
            if self.on_token is not None:
                self.on_token(self.request, len(self.out) - 1, t)
            if self.stop_check is not None and self.stop_check(self.request):
                self.stopped = True
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
                             self.key_valid, None, None, None, kernel=self.engine.decode_kernel)[0]
        self.plain_steps += 1
        self.copy_from = None
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
        src = None
        if source == "pruned":
            drafts = self._pruned_drafts(k)
            blocks += k * sum(self.keep)
        else:
            src = self.copy_from if source == "copy" else self.index.match(int(source[len("lookup"):-1]))
            drafts = self.index.copy(src, k + 1)
            follow, drafts = drafts[k], drafts[:k]
        t0 = time.perf_counter()
        was_clean = not self._contaminated
        logits = self.verify(self.w, self.cache, [self.out[-1]] + drafts, start, self.key_valid)
        if self.exact_verify:  # bit-identical to plain native steps: every argmax is off's token
            best, safe = logits.argmax(-1).tolist(), [True] * (k + 1)
        else:
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
        if source in self.shared:
            self.shared[source].decay(ENGINE_DECAY)
            self.shared[source].update(k, accepted, k if certified else accepted)
        # Positions start.. now hold the current token and the accepted drafts; drop the rest.
        self.cache.length = start + len(tokens)
        if self.exact_verify and was_clean:
            self.clean = self.cache.length
        self.costs.observe_verify(k + 1, time.perf_counter() - t0)
        if self.detail is not None:
            self.detail.append(json.dumps({"event": "verify", "request": self.request, "token": len(self.out),
                                           "source": source, "drafted": k, "accepted": accepted,
                                           "certified": certified}))
        # When every draft and the verifier's own token match the source, the output is copying
        # a span: the next pass continues the copy (its acceptance is tracked on its own).
        self.copy_from = src + k + 1 if src is not None and certified and tokens == drafts + [follow] else None
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
                                 self.key_valid, self.keep, self.engine._bypass, None,
                                 kernel=self.engine.decode_kernel)
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
                                 self.key_valid, None, None, None, kernel=self.engine.decode_kernel)[0]
            replayed += 1
            nxt = int(logits.argmax())
            if p + 1 < len(seq) and nxt != seq[p + 1]:
                # A certified token was wrong after all: the exact path wins, drop what followed.
                self.certificate_failures += 1
                del self.out[p + 1 - self.P:]
                del self.step_times[max(len(self.out) - 1, 0):]
                del self.block_trace[max(len(self.out) - 1, 0):]
                self.index = NgramIndex(seq[:p + 1], self.policy.ngram_max)
                self.copy_from = None
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
        if pol.force == "pruned" and self.pruned_state != "off" and self._pruned_ready():
            return "pruned", min(pol.max_pruned, room)
        kmax = min(max(pol.max_lookup, pol.max_pruned), room)
        if pol.verify_beta is not None:
            verify = [1.0 + pol.verify_beta * k for k in range(kmax + 1)]
        else:
            verify = self.costs.verify_costs(kmax)
        best: tuple[str, int] | None = None
        best_gain = pol.min_gain
        if pol.lookup:
            names = ["copy"] if self.copy_from is not None else []
            for n in range(pol.ngram_max, 0, -1):
                c = self.index.match_class(n)
                if c is not None:
                    names.append(f"lookup{n}{c}")
            for name in names:
                if pol.force == "lookup":
                    return name, min(pol.max_lookup, room)
                k, g = _best_k(self.acc[name].rate, 0.0, verify[:min(pol.max_lookup, room) + 1])
                if g > best_gain:
                    best, best_gain = (name, k), g
        if self.pruned_state != "off" and pol.force is None:
            cost = pol.pruned_cost if pol.pruned_cost is not None else self.costs.pruned
            if cost is None:
                cost = _pruned_cost_prior(self.w, self.keep)
            k, g = _best_k(self.acc["pruned"].rate, cost, verify[:min(pol.max_pruned, room) + 1])
            if g > best_gain and self._pruned_ready():
                best = ("pruned", k)
        return best

    def stats(self) -> dict[str, Any]:
        lookup = [a for name, a in self.acc.items() if name != "pruned"]
        per_source = {
            "prompt_lookup": _source_stats(sum(a.drafted for a in lookup), sum(a.accepted for a in lookup),
                                           sum(a.passes for a in lookup)),
            "pruned": _source_stats(self.acc["pruned"].drafted, self.acc["pruned"].accepted,
                                    self.acc["pruned"].passes),
        }
        for name, a in self.acc.items():
            if name != "pruned":  # the breakdown: a continued copy, then fresh matches by n
                key = name if name == "copy" else f"n{name[len('lookup'):]}"
                per_source["prompt_lookup"][key] = _source_stats(a.drafted, a.accepted, a.passes)
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


def generate_lossless(engine: "Engine", rows: list["PromptRow"], max_new_tokens: int, cfg: PruningConfig,
                      log_file: IO[str] | None, policy: DraftPolicy | None = None,
                      stop_check: Callable[[int], bool] | None = None,
                      on_token: Callable[[int, int, int], None] | None = None) -> list[GenerationResult]:
    """Greedy generation equal to mode "off" at batch 1, sped up by verified drafts; one row at a time.

    ``on_token(row, index, token)`` and ``stop_check(row)`` as in ``Engine._run``: called after
    each token a row takes (an index lower than before: a certificate failure took tokens back)."""

    policy = policy or DraftPolicy()
    if policy.force not in (None, "lookup", "pruned"):
        raise ValueError(f"DraftPolicy.force must be None, 'lookup' or 'pruned', got {policy.force!r}")
    dims = engine.dims
    check_rows_fit(rows, max_new_tokens, dims.max_positions)
    costs = _COSTS.setdefault(engine, _Costs())
    costs.use(f"{engine.decode_kernel}/{verify_kind(policy, engine.decode_kernel)}")
    detail: list[str] | None = [] if cfg.log_level == "DETAILED" else None
    results = []
    for b, r in enumerate(rows):
        t_start = time.perf_counter()
        dec = _RowDecoder(engine, r, max_new_tokens, policy, cfg, costs, detail, b)
        dec.stop_check, dec.on_token = stop_check, on_token
        first = dec.prefill()
        t_first = time.perf_counter()
        dec.run(first)
        dec.hidden = None
        t_end = time.perf_counter()
        n_tok = len(dec.out)
        stats = {
            "layers_bypassed": dec.bypassed,
            "total_tokens": n_tok,
            "bypass_ratio": dec.bypassed / (dims.n_layers * n_tok) if n_tok else 0.0,
            "degraded": r.degraded_reason is not None,
            "degraded_reason": r.degraded_reason,
            "detector": engine.detector_name(),
            "mode": cfg.mode,
            "sensitivity": cfg.sensitivity,
            "blocks": dims.n_layers,
            "prompt_tokens": len(r.ids),
            "executed_blocks_per_step": dec.block_trace,
            "router_time_s": 0.0,
            "router_setup_time_s": dec.setup_time,  # inside decode: checks run when first needed
            "prefill_time_s": t_first - t_start,
            "decode_time_s": t_end - t_first,
            "decode_step_times_s": dec.step_times,
            "batch_size": 1,
            **dec.stats(),
        }
        results.append(GenerationResult(engine.decode(dec.out), list(dec.out), list(r.ids), stats))
    engine._emit_logs(cfg, results, detail or [], log_file)
    return results
