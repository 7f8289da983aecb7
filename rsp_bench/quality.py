"""The quality runner: put one configuration through the equivalence or extraction task and
return its figures, ready for the run record.

The suites (suites/test_equivalence.py, suites/test_extraction.py), and later
``rsp-bench run`` / ``tune``, call:

  equivalence_metrics(adapter, spec, prompts, reference_outputs, max_new_tokens)
      exact_match_rate (Wilson CI), prefix_agreement, top1_agreement, kl_mean (CIs by a
      cluster bootstrap over prompts, never over tokens), kl_p99, perplexity_ratio,
      bypass_ratio, blocks_executed_per_token
  extraction_metrics(adapter, spec, squad_items, structured_docs, reference_answers, max_new_tokens)
      squad_em, squad_f1, json_field_f1 (bootstrap CIs over questions / documents), and
      squad_f1_delta, json_field_f1_delta: pruned minus unpruned, paired bootstrap CI

"Reference" is always the unpruned run (``reference/off``), generated once per prompt set
by ``ReferenceOutputs`` and shared by every configuration; its teacher-forced logits on its
own continuation are what the pruned engine's teacher-forced logits are compared with.

Every figure comes from ``rsp_bench.metrics``; this module only runs engines and gathers
their outputs. Must NOT import pytest or the reference engine (it talks to engines only
through the adapter protocol of ``rsp_bench.engines``).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from rsp_bench import metrics as m
from rsp_bench.datasets import SquadItem, StructuredDoc, squad_prompt, structured_prompt
from rsp_bench.engines import ConfigSpec, EngineAdapter, Output
from rsp_bench.errors import HarnessInputError

__all__ = [
    "MetricValue", "ReferenceOutputs", "generate_all", "teacher_forced_all",
    "equivalence_metrics", "truncated_kl_mean", "extraction_metrics", "extraction_prompts", "short_answer",
    "record_metrics", "interpolated_metrics",
]


@dataclass(frozen=True)
class MetricValue:
    """One figure as the run record stores it: value, sample size, CI (or None), unit."""

    value: float
    n: int
    ci: tuple[float, float] | None
    unit: str


# --------------------------------------------------------------------------- running


def _progress(total: int, desc: str):
    from tqdm import tqdm

    # Progress goes to stderr and only to a terminal: CI logs and pytest's captured output
    # would otherwise fill with carriage-return noise.
    return tqdm(total=total, desc=desc, file=sys.stderr, disable=not sys.stderr.isatty(),
                leave=False, unit="prompt", dynamic_ncols=True)


def generate_all(adapter: EngineAdapter, spec: ConfigSpec, prompts: Sequence[str], max_new_tokens: int,
                 desc: str = "", keep_logits: bool = False) -> list[Output]:
    """Generate for every prompt in chunks of ``adapter.batch_size`` (1: per request).

    Logits an adapter returns are dropped unless ``keep_logits``: at 200 kB per token for a
    49k vocabulary, a full extraction run would otherwise hold gigabytes it never reads.
    """
    prompts = list(prompts)
    if not prompts:
        raise HarnessInputError(f"{spec.config_id}: no prompts to generate for")
    batch = max(1, int(getattr(adapter, "batch_size", 1) or 1))
    outputs: list[Output] = []
    with _progress(len(prompts), desc or f"{spec.config_id} generate") as bar:
        for start in range(0, len(prompts), batch):
            chunk = prompts[start:start + batch]
            got = adapter.generate(chunk, max_new_tokens, spec)
            if len(got) != len(chunk):
                raise HarnessInputError(f"engine {adapter.name!r} returned {len(got)} outputs for {len(chunk)} prompts")
            if not keep_logits:
                for out in got:
                    out.logits = None
            outputs.extend(got)
            bar.update(len(chunk))
    return outputs


def teacher_forced_all(adapter: EngineAdapter, spec: ConfigSpec, reference: Sequence[Output],
                       desc: str = "", generated: Sequence[Output] | None = None) -> list[Any]:
    """The adapter's teacher-forced logits on each reference continuation (list of [T, V]).

    Where ``generated[i]`` (this configuration's own output for the same prompt) produced
    exactly the reference tokens and carries logits, those are the teacher-forced logits
    already (the adapter promises it), and the second decode is skipped.
    """
    logits = []
    with _progress(len(reference), desc or f"{spec.config_id} teacher-forced") as bar:
        for i, ref in enumerate(reference):
            own = generated[i] if generated is not None else None
            if own is not None and own.logits is not None and list(own.token_ids) == list(ref.token_ids):
                logits.append(own.logits)
                bar.update(1)
                continue
            got, _ = adapter.teacher_forced_logits(ref.prompt_ids, ref.token_ids, spec)
            if tuple(got.shape)[:1] != (len(ref.token_ids),):
                raise HarnessInputError(
                    f"engine {adapter.name!r} returned teacher-forced logits of shape {tuple(got.shape)} "
                    f"for prompt {i}, expected [{len(ref.token_ids)}, vocab]")
            logits.append(got)
            bar.update(1)
    return logits


def code_version() -> str:
    """A digest of the code that produces reference outputs (the reference engine's sources,
    its native kernel's C included, and the harness's adapters), so a cached reference set is
    never read by other code."""
    from rsp_bench.records import code_digest

    return code_digest(("reference_engine", "rsp_bench.engines"))


def reference_cache_dir(weights_sha256: str) -> Path:
    """Where workers of one host share reference outputs: the engine's cache folder
    (``RSP_BENCH_CACHE`` overrides) / reference-outputs / <weights digest>."""
    from reference_engine.model_loading import cache_root

    return cache_root() / "reference-outputs" / (weights_sha256[:16] or "unknown-weights")


class ReferenceOutputs:
    """Unpruned reference generations, computed once per (prompt set, max_new_tokens).

    ``get(name, prompts, max_new_tokens, with_logits=True)`` also fills each output's
    ``logits`` (teacher-forced on its own continuation) the first time they are asked for.
    Reusing a name with different prompts is refused: two suites would otherwise silently
    compare against each other's reference.

    With ``disk`` (a folder; pytest-xdist workers of one host share it), each set is also
    computed once across processes: the file is keyed by set name, prompts, token count, logits
    or not, and code version, guarded by a file lock so two workers never compute or write it
    twice, and written atomically so a half-written file is never read.
    """

    def __init__(self, adapter: EngineAdapter, spec: ConfigSpec, disk: Path | None = None) -> None:
        self.adapter = adapter
        self.spec = spec
        self.disk = disk
        #: set name -> "computed" or "disk: <file>": how each set this session used was obtained
        self.sources: dict[str, str] = {}
        self._cache: dict[tuple[str, int], tuple[tuple[str, ...], list[Output]]] = {}

    def is_reference(self, spec: ConfigSpec) -> bool:
        """Whether ``spec`` is the configuration that produces these outputs (same engine,
        pruning off, no extra parameters), so its own figures can be read from them."""
        return (spec.engine == self.spec.engine and spec.mode == "off" == self.spec.mode
                and not spec.params and not self.spec.params)

    def _fill_logits(self, name: str, outputs: list[Output]) -> list[Output]:
        """Teacher-forced logits for the outputs that have none (on their own continuation)."""
        missing = [o for o in outputs if o.logits is None]
        if missing:
            for out, logits in zip(missing, teacher_forced_all(self.adapter, self.spec, missing,
                                                               desc=f"reference {name} logits")):
                out.logits = logits
        return outputs

    def _compute(self, name: str, prompts: tuple[str, ...], max_new_tokens: int, with_logits: bool) -> list[Output]:
        outputs = generate_all(self.adapter, self.spec, prompts, max_new_tokens, desc=f"reference {name}",
                               keep_logits=with_logits)
        return self._fill_logits(name, outputs) if with_logits else outputs

    def _from_disk(self, name: str, prompts: tuple[str, ...], max_new_tokens: int, with_logits: bool) -> list[Output]:
        import hashlib
        import json

        import torch
        from filelock import FileLock

        assert self.disk is not None
        key = hashlib.sha256(json.dumps([name, prompts, max_new_tokens, with_logits, code_version(),
                                         self._numerics()]).encode())
        path = self.disk / f"{name}-{key.hexdigest()[:20]}.pt"
        self.disk.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            if path.exists():
                try:
                    rows = torch.load(path, weights_only=False)
                    outputs = [Output(r["text"], r["token_ids"], r["prompt_ids"], r["stats"], r["logits"]) for r in rows]
                except Exception:  # a damaged copy is recomputed, never trusted
                    outputs = None
                if outputs is not None and len(outputs) == len(prompts):
                    self.sources[name] = f"disk: {path.name}"
                    return outputs
            outputs = self._compute(name, prompts, max_new_tokens, with_logits)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            torch.save([{"text": o.text, "token_ids": o.token_ids, "prompt_ids": o.prompt_ids, "stats": o.stats,
                         "logits": o.logits} for o in outputs], tmp)
            os.replace(tmp, path)
            return outputs

    def _numerics(self) -> list[Any]:
        """What besides the code can move the last bit of an output: library versions, the
        decode kernel and the thread count."""
        import torch
        import transformers

        engine = getattr(self.adapter, "engine", None)
        return [torch.__version__, transformers.__version__, getattr(engine, "decode_kernel", None),
                torch.get_num_threads(), getattr(engine, "weights_sha256", None)]

    def get(self, name: str, prompts: Sequence[str], max_new_tokens: int, *,
            with_logits: bool = False) -> list[Output]:
        key = (name, int(max_new_tokens))
        prompts_t = tuple(prompts)
        if key in self._cache:
            cached_prompts, outputs = self._cache[key]
            if cached_prompts != prompts_t:
                raise HarnessInputError(f"reference set {name!r} was built for other prompts; use another name")
            return self._fill_logits(name, outputs) if with_logits else outputs
        if self.disk is not None:
            outputs = self._from_disk(name, prompts_t, int(max_new_tokens), with_logits)
        else:
            outputs = self._compute(name, prompts_t, int(max_new_tokens), with_logits)
        self.sources.setdefault(name, "computed")
        self._cache[key] = (prompts_t, outputs)
        return outputs


# --------------------------------------------------------------------------- equivalence


def _compute_metrics(outputs: Sequence[Output]) -> dict[str, MetricValue]:
    """bypass_ratio and blocks_executed_per_token from the generation stats (if reported)."""
    needed = ("layers_bypassed", "total_tokens", "blocks")
    if not outputs or not all(all(k in o.stats for k in needed) for o in outputs):
        return {}
    blocks = {int(o.stats["blocks"]) for o in outputs}
    if len(blocks) != 1:
        raise HarnessInputError(f"outputs report different block counts {sorted(blocks)}")
    n_blocks = blocks.pop()
    bypassed = [int(o.stats["layers_bypassed"]) for o in outputs]
    tokens = [int(o.stats["total_tokens"]) for o in outputs]
    total_b, total_t = sum(bypassed), sum(tokens)
    if total_t == 0:
        return {}
    ratio = m.bypass_ratio(total_b, n_blocks, total_t)
    executed = m.blocks_executed_per_token(total_b, n_blocks, total_t)
    # The CI resamples prompts; every prompt produced at least one token (EOS counts).
    units = [(b, n_blocks * t) for b, t in zip(bypassed, tokens) if t > 0]
    _, lo, hi = m.bootstrap_ratio_ci([u[0] for u in units], [u[1] for u in units])
    return {
        "bypass_ratio": MetricValue(ratio, total_t, (lo, hi), "fraction"),
        "blocks_executed_per_token": MetricValue(executed, total_t, (n_blocks * (1 - hi), n_blocks * (1 - lo)), "blocks"),
    }


def equivalence_metrics(adapter: EngineAdapter, spec: ConfigSpec, prompts: Sequence[str],
                        reference_outputs: Sequence[Output], max_new_tokens: int) -> dict[str, MetricValue]:
    """Run ``spec`` on ``prompts`` and compare with the unpruned ``reference_outputs``.

    ``reference_outputs`` must carry teacher-forced logits (``ReferenceOutputs.get(...,
    with_logits=True)``). Greedy outputs give exact match and prefix agreement; the
    configuration's teacher-forced logits on the *reference* continuation give top-1
    agreement, KL(unpruned || pruned) and the perplexity ratio, so one early divergence does
    not make every later token incomparable.
    """
    prompts = list(prompts)
    if len(reference_outputs) != len(prompts):
        raise HarnessInputError(f"{len(reference_outputs)} reference outputs for {len(prompts)} prompts")
    for i, ref in enumerate(reference_outputs):
        if ref.logits is None:
            raise HarnessInputError(f"reference output {i} has no logits; get it with with_logits=True")
        if not ref.token_ids:
            raise HarnessInputError(f"reference output {i} is empty; teacher forcing needs a continuation")
    candidates = generate_all(adapter, spec, prompts, max_new_tokens, keep_logits=True)
    ref_ids = [r.token_ids for r in reference_outputs]
    cand_ids = [c.token_ids for c in candidates]
    n_prompts = len(prompts)
    ref_lens = [len(r) for r in ref_ids]
    n_tokens = sum(ref_lens)

    exact = m.exact_match_rate(ref_ids, cand_ids)
    matches = sum(1 for r, c in zip(ref_ids, cand_ids) if m.exact_match_rate([r], [c]) == 1.0)
    out: dict[str, MetricValue] = {
        "exact_match_rate": MetricValue(exact, n_prompts, m.wilson_interval(matches, n_prompts), "fraction"),
    }
    prefix = m.prefix_agreement(ref_ids, cand_ids)
    agreed = [min(m.first_divergence(r, c), len(r)) for r, c in zip(ref_ids, cand_ids)]
    _, lo, hi = m.bootstrap_ratio_ci(agreed, ref_lens)
    out["prefix_agreement"] = MetricValue(prefix, n_tokens, (lo, hi), "fraction")

    ref_logits = [r.logits for r in reference_outputs]
    cand_logits = teacher_forced_all(adapter, spec, reference_outputs, generated=candidates)
    per_prompt_top1 = [float(m.top1_matches(r, c).sum()) for r, c in zip(ref_logits, cand_logits)]
    top1 = m.top1_agreement(ref_logits, cand_logits)
    _, lo, hi = m.bootstrap_ratio_ci(per_prompt_top1, ref_lens)
    out["top1_agreement"] = MetricValue(top1, n_tokens, (lo, hi), "fraction")

    kl = m.kl_per_token(ref_logits, cand_logits)
    summary = m.kl_summary(kl)
    kl_sums, start = [], 0
    for length in ref_lens:
        kl_sums.append(float(kl[start:start + length].sum()))
        start += length
    _, lo, hi = m.bootstrap_ratio_ci(kl_sums, ref_lens)
    out["kl_mean"] = MetricValue(summary["mean"], n_tokens, (lo, hi), "nats")
    out["kl_p99"] = MetricValue(summary["p99"], n_tokens, None, "nats")

    targets = [_ids_tensor(r) for r in ref_ids]
    ratio = m.perplexity_ratio(m.token_nll(ref_logits, targets), m.token_nll(cand_logits, targets))
    out["perplexity_ratio"] = MetricValue(ratio, n_tokens, None, "ratio")
    out.update(_compute_metrics(candidates))
    return out


def truncated_kl_mean(adapter: Any, spec: ConfigSpec, reference: Sequence[Output]) -> MetricValue:
    """Mean truncated KL over every reference continuation token, in nats, for an engine that
    returns only its top-N log-probabilities (an ``rsp_bench.engines.openai_engine.OpenAIAdapter``):
    a lower bound of the KL, an estimate (``truncated_kl_per_token``). The adapter's cached
    teacher-forced answers are reused, so after ``equivalence_metrics`` this sends no request."""
    import torch

    from rsp_bench.engines.openai_engine import truncated_kl_per_token

    per_token = []
    for ref in reference:
        if ref.logits is None:
            raise HarnessInputError("truncated KL needs reference outputs with logits (with_logits=True)")
        logprobs, stats = adapter.teacher_forced_logits(ref.prompt_ids, ref.token_ids, spec)
        per_token.append(truncated_kl_per_token(ref.logits, logprobs, stats["known"]))
    kl = torch.cat(per_token)
    return MetricValue(float(kl.mean()), int(kl.numel()), None, "nats")


def _ids_tensor(ids: Sequence[int]):
    import torch

    return torch.tensor(list(ids), dtype=torch.long)


# --------------------------------------------------------------------------- extraction


def extraction_prompts(squad_items: Sequence[SquadItem], structured_docs: Sequence[StructuredDoc]) -> tuple[list[str], list[str]]:
    """The prompts the extraction task sends: (SQuAD questions, JSON extraction documents)."""
    return [squad_prompt(i) for i in squad_items], [structured_prompt(d) for d in structured_docs]


def short_answer(text: str) -> str:
    """Lenient reading of a short SQuAD answer: the first non-empty line, without an
    "Answer:" label, quotes or markdown emphasis. Scoring stays strict (official SQuAD)."""
    for line in text.splitlines():
        line = line.strip()
        if line.lower().startswith("answer:"):
            line = line[len("answer:"):].strip()
        line = line.strip("*\"'`“”").strip()
        if line:
            return line
    return ""


def _max_new(max_new_tokens: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(max_new_tokens, tuple) and len(max_new_tokens) == 2:
        squad_n, json_n = max_new_tokens
    else:
        squad_n = json_n = max_new_tokens  # type: ignore[assignment]
    for what, n in (("SQuAD", squad_n), ("JSON", json_n)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise HarnessInputError(f"max_new_tokens for {what} must be an integer >= 1, got {n!r}")
    return squad_n, json_n


def _score_squad(items: Sequence[SquadItem], outputs: Sequence[Output]) -> tuple[list[float], list[float]]:
    ems = [m.squad_em(short_answer(o.text), it.answers) for it, o in zip(items, outputs)]
    f1s = [m.squad_f1(short_answer(o.text), it.answers) for it, o in zip(items, outputs)]
    return ems, f1s


def _score_json(docs: Sequence[StructuredDoc], outputs: Sequence[Output]) -> list[float]:
    return [m.doc_field_f1(m.parse_json_answer(o.text), d.fields) for d, o in zip(docs, outputs)]


def _mean_metric(values: Sequence[float], unit: str = "fraction") -> MetricValue:
    value, lo, hi = m.bootstrap_mean_ci(values)
    return MetricValue(value, len(values), (lo, hi), unit)


def _delta_metric(candidate: Sequence[float], reference: Sequence[float]) -> MetricValue:
    value, lo, hi = m.bootstrap_paired_diff_ci(candidate, reference)
    return MetricValue(value, len(candidate), (lo, hi), "fraction")


def extraction_metrics(adapter: EngineAdapter | None, spec: ConfigSpec, squad_items: Sequence[SquadItem],
                       structured_docs: Sequence[StructuredDoc],
                       reference_answers: Mapping[str, Sequence[Output]] | None,
                       max_new_tokens: int | tuple[int, int], *,
                       answers: Mapping[str, Sequence[Output]] | None = None) -> dict[str, MetricValue]:
    """Run ``spec`` on the SQuAD questions and structured documents and score the answers.

    ``answers`` (same shape as ``reference_answers``) scores outputs this configuration already
    generated (the reference run scoring itself, outputs timed elsewhere, outputs lm-eval
    produced) instead of generating again; ``adapter`` may then be None.

    ``reference_answers`` is ``{"squad": [...], "json": [...]}``: the unpruned outputs for the
    same items (from ``ReferenceOutputs``), or None to skip the deltas. ``max_new_tokens`` is
    one limit or a (SQuAD, JSON) pair. json_field_f1 is the mean over documents of the
    per-document field F1, so its delta is exactly the paired mean difference the bootstrap
    resamples.
    """
    if adapter is None and answers is None:
        raise HarnessInputError(f"{spec.config_id}: extraction_metrics needs an adapter or the answers to score")
    squad_n, json_n = _max_new(max_new_tokens)
    squad_prompts, json_prompts = extraction_prompts(squad_items, structured_docs)
    out: dict[str, MetricValue] = {}
    if squad_items:
        got = (_reference_for(answers, "squad", len(squad_items)) if answers is not None
               else generate_all(adapter, spec, squad_prompts, squad_n, desc=f"{spec.config_id} SQuAD"))
        ems, f1s = _score_squad(squad_items, got)
        out["squad_em"] = _mean_metric(ems)
        out["squad_f1"] = _mean_metric(f1s)
        if reference_answers is not None:
            ref = _reference_for(reference_answers, "squad", len(squad_items))
            out["squad_f1_delta"] = _delta_metric(f1s, _score_squad(squad_items, ref)[1])
    if structured_docs:
        got = (_reference_for(answers, "json", len(structured_docs)) if answers is not None
               else generate_all(adapter, spec, json_prompts, json_n, desc=f"{spec.config_id} JSON"))
        doc_f1 = _score_json(structured_docs, got)
        out["json_field_f1"] = _mean_metric(doc_f1)
        if reference_answers is not None:
            ref = _reference_for(reference_answers, "json", len(structured_docs))
            out["json_field_f1_delta"] = _delta_metric(doc_f1, _score_json(structured_docs, ref))
    if not out:
        raise HarnessInputError(f"{spec.config_id}: no SQuAD items and no structured documents to score")
    return out


def _reference_for(reference_answers: Mapping[str, Sequence[Output]], key: str, n: int) -> Sequence[Output]:
    ref = reference_answers.get(key)
    if ref is None or len(ref) != n:
        got = "none" if ref is None else len(ref)
        raise HarnessInputError(f"reference_answers[{key!r}] must hold {n} outputs, got {got}")
    return ref


# --------------------------------------------------------------------------- records


def record_metrics(builder: Any, spec: ConfigSpec, values: Mapping[str, MetricValue]) -> None:
    """Add every figure to the run record under ``spec.config_id`` (engine, mode,
    sensitivity and params stated explicitly, not parsed from the id).

    One value per name and configuration: a duplicate is a bug and raises. (The throughput
    suite records its compute figures, on its own prompts, only at batches above 1, with a
    suffix such as ``_b4``, so a record holds the same figures whatever order the suites ran in.)
    """
    for name, mv in values.items():
        builder.add_metric(spec.config_id, name, mv.value, mv.n, ci=mv.ci, unit=mv.unit,
                           engine=spec.engine, mode=spec.mode, sensitivity=spec.sensitivity,
                           params=spec.params or None)


def interpolated_metrics(low: Mapping[str, MetricValue], high: Mapping[str, MetricValue],
                         t: float) -> dict[str, MetricValue]:
    """Figures of a static curve at a budget between two measured whole-block budgets:
    (1 - t) * low + t * high for every figure both carry, ``t`` in [0, 1] the budget's fraction of
    the way from low's to high's. An interpolation has no sampling interval of its own: ci None,
    n the smaller of the two. A dynamic run is compared with this at its own executed budget, not
    with the rounded-up whole block (which hands it up to half a block)."""
    if not (isinstance(t, (int, float)) and math.isfinite(t) and 0.0 <= t <= 1.0):
        raise HarnessInputError(f"t must be a number in [0, 1], got {t!r}")
    return {name: MetricValue((1 - t) * low[name].value + t * high[name].value, min(low[name].n, high[name].n),
                              None, low[name].unit)
            for name in low if name in high and low[name].unit == high[name].unit}
