"""The reference pruned engine: load a model, then generate with per-token block pruning.

``Engine.load(model=None)`` loads the embedded SmolLM2-135M-Instruct (or a local Llama-family
folder / .gguf), re-lays its weights (model.py) and loads or computes its calibration.
``engine.generate(prompts, ...)`` runs prefill in full, checks each prompt for odd input
(protective degradation, protective_degradation.py), then decodes with the router (router.py)
planning each token's blocks.
``engine.teacher_forced(...)`` runs the same decode path on a given continuation and returns the
logits, so quality metrics compare distributions, not just samples.

Must not import the harness (``rsp_bench``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Sequence

import numpy as np
import torch

from . import calibration as calib_mod
from . import degradation
from .config import PruningConfig
from .errors import PromptError
from .generation import GenerationResult, PromptRow, check_rows_fit
from .model import BypassMap, KVCache, decode_step, prefill, weights_from_hf
from .model_loading import cache_root, file_digest, load_hf_model, load_tokenizer, resolve_model
from .prefill_memo import PrefillMemo
from .protective_degradation import ProtectiveDegradation
from .unit_routing import UnitRouting
from .router import (Router, RouterCalibration, density_factor, density_of_text, sample_watermark,
                     watermark_factor)

log = logging.getLogger("reference_engine")


def weights_digest(folder: Path) -> str:
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if len(files) == 1:
        return file_digest(files[0])
    import hashlib

    h = hashlib.sha256()
    for f in files:
        h.update(file_digest(f).encode())
    return h.hexdigest()


KERNEL_ENV = "RSP_DECODE_KERNEL"


def default_decode_kernel(environ: dict[str, str] | None = None) -> str:
    """The decode kernel an engine starts with (``engine.decode_kernel`` changes it later).

    ``RSP_DECODE_KERNEL`` = "auto" (the default), "native", "numpy" or "torch". "auto" is
    "native" (decode_native: the whole step in one C call, about 1.5x torch here) when a C
    compiler builds it, else "torch" with one warning. "torch" runs transformers' own kernels;
    "native" sums in another order, measured to flip no greedy token on the suites' prompt sets
    nor on held-out ones (scripts/measure_kernel_flips.py), and the equivalence suite re-checks
    pruning off against transformers on every run, whichever kernel runs.
    """
    import os

    from .decode_native import NativeKernelUnavailable, load_library
    from .model import DECODE_KERNELS

    raw = (os.environ if environ is None else environ).get(KERNEL_ENV, "auto") or "auto"
    if raw not in ("auto", *DECODE_KERNELS):
        raise ValueError(f"{KERNEL_ENV}={raw!r} must be auto, {', '.join(DECODE_KERNELS)}")
    if raw not in ("auto", "native"):
        return raw
    try:
        load_library()
    except NativeKernelUnavailable as exc:
        if raw == "native":
            raise
        log.warning("decode kernel: torch (the native kernel is unavailable: %s)", str(exc).splitlines()[0])
        return "torch"
    return "native"


class Engine(UnitRouting, ProtectiveDegradation):
    """A loaded model plus its calibration. Thread-compatible, not thread-safe."""

    def __init__(self, name: str, folder: Path, hf_model, tokenizer, weights_sha256: str,
                 default_config: PruningConfig | None = None):
        self.name = name
        self.folder = folder
        self.hf_model = hf_model
        self.tokenizer = tokenizer
        self.weights = weights_from_hf(hf_model)
        self.dims = self.weights.dims
        self.weights_sha256 = weights_sha256
        self.default_config = default_config or PruningConfig()
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (self.eos_id or 0)
        self._calibration: calib_mod.Calibration | None = None
        self._bypass: list[BypassMap | None] | None = None
        self._stream: torch.Tensor | None = None
        self.decode_kernel = default_decode_kernel()
        self._degradation_suspended = False
        self._raw_unit_scale = False
        self._prefill_memo: PrefillMemo | None = None  # memoized_prefill

    # ---- loading ----
    @classmethod
    def load(cls, model: str | Path | None = None, config: PruningConfig | None = None,
             calibrate: bool = True, progress: Callable[[str], None] | None = None) -> "Engine":
        """Load a model (None: the embedded default) and, unless told not to, its calibration."""
        torch.set_grad_enabled(False)
        name, folder = resolve_model(model)
        hf = load_hf_model(folder)
        tok = load_tokenizer(folder)
        engine = cls(name, folder, hf, tok, weights_digest(folder), config)
        if calibrate:
            engine.calibration(progress=progress)
        return engine

    def calibration(self, progress: Callable[[str], None] | None = None, force: bool = False) -> calib_mod.Calibration:
        """The model's calibration: packaged copy, else cache, else measured now and cached."""
        if self._calibration is not None and not force:
            return self._calibration
        found = None if force else self._packaged_or_cached(lambda where: calib_mod.load(where, self.weights_sha256))
        if found is None:
            found = calib_mod.calibrate(self.weights, self.encode, self.eos_id, self._density,
                                        self.weights_sha256, progress)
            calib_mod.save(found[0], found[1], cache_root())
        cal, maps = found
        self._calibration = cal
        self._bypass = [BypassMap(maps[f"{i}.down"], maps[f"{i}.up"]) if lin else None
                        for i, lin in enumerate(cal.use_linear)]
        return cal

    @staticmethod
    def _packaged_or_cached(load: Callable[[Path], Any]) -> Any:
        """What ``load`` finds in the packaged data (reference_engine/data), else in the user
        cache, else None: every per-weights artefact (calibration, predictor, OOD score) ships
        for the embedded model and is measured once and cached for any other."""
        for where in (Path(__file__).parent / "data", cache_root()):
            found = load(where)
            if found:
                return found
        return None

    # ---- text ----
    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        # A lone surrogate cannot be UTF-8 encoded and the tokenizer raises a bare TypeError on it;
        # tokenize a replacement-character copy instead. The row keeps the original text, so the
        # text check still reports lone_surrogate and the request degrades.
        prompt = prompt.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        if chat:
            ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                     add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return list(ids)
        return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _density(self, text: str, ids: list[int]) -> float:
        emb = self.weights.embed[torch.tensor(ids)]
        cos = torch.nn.functional.cosine_similarity(emb, emb.mean(0, keepdim=True), dim=-1).mean()
        return density_of_text(text, ids, self.dims.vocab, float(cos))

    # ---- public API ----
    def generate(self, prompts: str | Sequence[str], max_new_tokens: int = 64,
                 config: PruningConfig | None = None, chat: bool = True, temperature: float = 0.0,
                 seed: int | None = None, log_file: IO[str] | None = None, return_logits: bool = False,
                 **overrides: Any) -> list[GenerationResult]:
        """Generate for each prompt. ``overrides`` replace fields of ``config`` for this request.

        ``return_logits``: also fill each result's ``logits`` [len(token_ids), V] with the logits
        that chose its tokens: the same numbers ``teacher_forced`` returns for that continuation,
        so a caller comparing distributions need not decode twice (not in lossless mode)."""
        cfg = self._config(config, overrides)
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
            raise PromptError(f"prompts must be a non-empty list of strings, got {prompts!r}")
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise PromptError(f"prompt {i} must be a string, got {type(p).__name__}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise PromptError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
            raise PromptError(f"temperature must be a finite number >= 0, got {temperature!r}")
        rows = [PromptRow(p, self.encode(p, chat)) for p in prompts]
        if cfg.mode == "lossless":
            from .speculative import generate_lossless

            return generate_lossless(self, rows, max_new_tokens, cfg, log_file)
        return self._run(rows, max_new_tokens, cfg, temperature, seed, None, log_file, keep_logits=return_logits)

    def teacher_forced(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int],
                       config: PruningConfig | None = None, stop_check: Callable[[int], bool] | None = None,
                       **overrides: Any) -> GenerationResult:
        """Logits [len(continuation), V] that the engine predicts for each continuation token,
        feeding the given continuation instead of its own choices (pruning applied as in generate).
        ``stop_check`` as in ``_run`` (the server's cancel: a stopped call returns fewer rows)."""
        cfg = self._config(config, overrides)
        if cfg.mode == "lossless":
            cfg = cfg.override(mode="off")  # lossless output is the unpruned model's by construction
        if len(continuation_ids) == 0:
            raise PromptError("continuation_ids must not be empty")
        row = PromptRow(self.decode(prompt_ids), list(prompt_ids))
        return self._run([row], len(continuation_ids), cfg, 0.0, None, [list(continuation_ids)], None,
                         stop_check=stop_check)[0]

    def _config(self, config: PruningConfig | None, overrides: dict) -> PruningConfig:
        cfg = config or self.default_config
        if overrides:
            cfg = cfg.override(**overrides)
        cfg.blacklist_for(self.dims.n_layers)  # range-checks the blacklist against this model
        return cfg

    # ---- the loop ----
    def _run(self, rows: list[PromptRow], max_new: int, cfg: PruningConfig, temperature: float,
             seed: int | None, forced: list[list[int]] | None, log_file: IO[str] | None,
             keep_logits: bool = False,
             on_token: Callable[[int, int, int], None] | None = None,
             stop_check: Callable[[int], bool] | None = None) -> list[GenerationResult]:
        """``on_token(row, index, token_id)``, when given, is called as each token is chosen (the
        server streams with it). A lossy request that degrades after the fact is rerun in full,
        and the rerun calls it again from index 0: a caller that streamed must compare.

        ``stop_check(row)``, when given, is asked after each token a row takes (after its
        ``on_token``): True ends that row there, as an EOS would (a stop string matched, the
        client went away, a deadline passed). One call per row per step: no cost to the decode
        step itself, and none at all when it is None."""
        w, dims, B = self.weights, self.dims, len(rows)
        check_rows_fit(rows, max_new, dims.max_positions)
        t_start = time.perf_counter()
        S = max(len(r.ids) for r in rows)
        capacity = S + max_new
        ids = torch.full((B, S), self.pad_id, dtype=torch.long)
        key_valid = torch.zeros(B, capacity, dtype=torch.bool)
        for b, r in enumerate(rows):  # left padding keeps every row's next position aligned
            ids[b, S - len(r.ids):] = torch.tensor(r.ids)
            key_valid[b, S - len(r.ids):] = True
        positions = (key_valid[:, :S].long().cumsum(-1) - 1).clamp(min=0)
        cache = KVCache.allocate(dims, B, capacity)

        prunes = cfg.prunes and cfg.mode == "lossy"
        static_keep = static_attn = static_mlp = None
        static_saved = 0
        if cfg.mode == "static":
            self.calibration()
            static_keep = [i not in cfg.static_bypass for i in range(dims.n_layers)]
            if cfg.static_attn_bypass or cfg.static_mlp_bypass:  # per-unit static removal
                static_attn = [k and i not in cfg.static_attn_bypass for i, k in enumerate(static_keep)]
                static_mlp = [k and i not in cfg.static_mlp_bypass for i, k in enumerate(static_keep)]
        router_name, router_fallback = self.router_for(cfg) if prunes else (None, None)
        unit = prunes_unit = router_name == "unit"
        unit = unit or static_attn is not None
        # unit paths bypass with the unit maps and count bytes net of them (unit_predictor.py)
        unit_bytes, block_bytes = self.unit_bytes() if unit else (None, w.bytes_per_block())
        if static_attn is not None:
            static_saved = int(sum(unit_bytes[2 * i] for i, k in enumerate(static_attn) if not k) +
                               sum(unit_bytes[2 * i + 1] for i, k in enumerate(static_mlp) if not k))
        hidden: list[torch.Tensor] | None = [] if prunes else None
        # A lossy request's prompt logits come out of the degradation check's head pass (below).
        logits = self._prefill(rows, cache, ids, positions, key_valid, hidden, prunes)
        router = None
        router_time = 0.0  # per-token plan + observe: the cost the issue bounds per decode token
        setup_time = 0.0  # once per request: degradation checks, density, router construction
        # the degradation check's call, which also computes the prompt's last-position logits (the
        # pass it shares with them); part of setup_time, so of prefill_time_s. rsp-bench degradation
        # subtracts the same call with the detector suspended to get the check alone.
        check_time = 0.0
        detail = cfg.log_level == "DETAILED"
        detail_lines: list[str] = []
        if prunes:
            cal = self.calibration()
            router_t0 = time.perf_counter()
            logits = self._check_degradation(rows, hidden, cal, last_logits=True)
            check_time = time.perf_counter() - router_t0
            router = self._make_unit_router(rows, cfg, cal) if prunes_unit else self._make_router(rows, cfg, cal)
            setup_time = time.perf_counter() - router_t0
        t_first = time.perf_counter()

        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        next_pos = positions[:, -1] + 1
        out: list[list[int]] = [[] for _ in range(B)]
        done = [False] * B
        bypassed = np.zeros(B, dtype=np.int64)
        bytes_saved = np.zeros(B, dtype=np.int64)  # weight bytes not read, per row (unit paths)
        units_bypassed = np.zeros(B, dtype=np.int64)
        executed_trace: list[float] = []
        step_logits: list[torch.Tensor] = []
        active = np.array([r.degraded_reason is None for r in rows])
        stream = self._stream_buffer(B) if router is not None else None
        step_times: list[float] = []
        for step in range(max_new):
            if forced is not None:
                step_logits.append(logits[0].clone())
                tok = torch.tensor([forced[0][step]])
            else:
                if keep_logits:
                    step_logits.append(logits.clone())
                tok = self._sample(logits, temperature, gen)
            toks = tok.tolist()
            for b in range(B):
                if not done[b]:
                    out[b].append(toks[b])
                    if on_token is not None:
                        on_token(b, len(out[b]) - 1, toks[b])
                    if forced is None and toks[b] == self.eos_id:
                        done[b] = True
                    elif stop_check is not None and stop_check(b):
                        done[b] = True
            if all(done) or step == max_new - 1:
                break
            t0 = time.perf_counter()
            keep = static_keep
            if unit:
                logits = self._unit_step(router, static_attn, static_mlp, cache, tok, next_pos, key_valid, stream,
                                         active, done, bytes_saved, units_bypassed, executed_trace, detail,
                                         detail_lines, step, rows, block_bytes, static_saved if router is None else 0)
                next_pos = next_pos + 1
                if router is not None:
                    router_time += router.time_s
                step_times.append(time.perf_counter() - t0)
                continue
            if static_keep is not None:
                bypassed += np.where(np.array(done), 0, dims.n_layers - sum(keep))
            if router is not None:
                keep, probe = router.plan(active)
                n_bypass = dims.n_layers - sum(keep)
                bypassed += np.where(np.array(done), 0, n_bypass)
                if detail:
                    detail_lines.extend(self._detail_records(router, keep, probe, step, rows))
                t_plan = time.perf_counter()
                router_time += t_plan - t0
            executed_trace.append(dims.n_layers if keep is None else sum(keep))
            logits = decode_step(w, cache, tok, next_pos, key_valid, keep, self._bypass if keep else None, stream,
                                 kernel=self.decode_kernel)
            next_pos = next_pos + 1
            if router is not None:
                t1 = time.perf_counter()
                self._observe(router, stream, logits, keep)
                router_time += time.perf_counter() - t1
            step_times.append(time.perf_counter() - t0)

        if router is not None:
            reason = degradation.router_instability_reason(router.flips, router.decisions)
            if reason is not None and not self._degradation_suspended:
                # Instability is only known after the fact: rerun the request in full so the
                # output is exactly the unpruned one, as degradation promises.
                return self._rerun_degraded(rows, max_new, cfg, temperature, seed, forced, log_file, reason,
                                            keep_logits, on_token, stop_check)

        t_end = time.perf_counter()
        results = []
        for b, r in enumerate(rows):
            n_tok = len(out[b])
            if unit:  # units are parts of blocks: count block-equivalents by weight bytes not read
                bypassed[b] = int(round(bytes_saved[b] / block_bytes))
            stats = {
                "layers_bypassed": int(bypassed[b]),
                "total_tokens": n_tok,
                "bypass_ratio": (float(bytes_saved[b]) / (block_bytes * dims.n_layers * n_tok) if unit else
                                 float(bypassed[b]) / (dims.n_layers * n_tok)) if n_tok else 0.0,
                "bypassed_weight_bytes": int(bytes_saved[b]) if unit else int(bypassed[b]) * block_bytes,
                "units_bypassed": int(units_bypassed[b]) if unit else 2 * int(bypassed[b]),
                "router": router_name,  # None: no router ran (mode off, static, lossless)
                "router_fallback": router_fallback,  # why the router asked for did not run, or None
                "unit_threshold_scale": router.internal_sensitivity if prunes_unit and router is not None else None,
                # which of the predictor's ridges scored ("shallow", or "deep" from its deep_from on)
                "unit_ridges": router.ridges if prunes_unit and router is not None else None,
                # the share controller's final log factor on the row's threshold (None: no controller ran)
                "unit_share_steer": (float(router.ctl[b]) if prunes_unit and router is not None
                                     and getattr(router, "target_bytes", 0) > 0 else None),
                "degraded": r.degraded_reason is not None,
                "degraded_reason": r.degraded_reason,
                "detector": self.detector_name() if prunes else None,  # None: no check ran
                "mode": cfg.mode,
                "sensitivity": cfg.sensitivity,
                "blocks": dims.n_layers,
                "prompt_tokens": len(r.ids),
                "executed_blocks_per_step": executed_trace,
                "router_time_s": router_time,
                "router_setup_time_s": setup_time,
                "degradation_check_s": check_time,
                "prefill_time_s": t_first - t_start,
                "decode_time_s": t_end - t_first,
                "decode_step_times_s": step_times,
                "batch_size": B,
            }
            res = GenerationResult(self.decode(out[b]), out[b], r.ids, stats)
            if forced is not None:
                res.logits = torch.stack(step_logits)
            elif keep_logits:  # row b chose its n-th token at step n; it stops when it is done
                res.logits = torch.stack([s[b] for s in step_logits[:len(out[b])]])
            results.append(res)
        self._emit_logs(cfg, results, detail_lines, log_file)
        return results

    def _prefill(self, rows: list[PromptRow], cache: KVCache, ids: torch.Tensor, positions: torch.Tensor,
                 key_valid: torch.Tensor, hidden: list[torch.Tensor] | None, prunes: bool) -> torch.Tensor | None:
        """Prefill the prompts into ``cache`` (appending the streams to ``hidden`` when given); with
        ``memoized_prefill`` on, a batch-1 prompt seen before is copied from the memo instead."""
        memo = self._prefill_memo if len(rows) == 1 else None
        if memo is None:
            return prefill(self.weights, cache, ids, positions, key_valid, hidden_out=hidden, head=self._head(),
                           logits=not prunes)
        key = (tuple(rows[0].ids), self.decode_kernel)
        entry = memo.get(key)
        if entry is None:  # keep everything a later request of any mode may want
            streams: list[torch.Tensor] = []
            logits = prefill(self.weights, cache, ids, positions, key_valid, hidden_out=streams, head=self._head())
            memo.put(key, cache, streams, logits)
        else:
            entry.restore(cache)
            streams, logits = [h.clone() for h in entry.hidden], entry.logits.clone()
        if hidden is not None:
            hidden.extend(streams)
        return None if prunes else logits

    @contextlib.contextmanager
    def memoized_prefill(self, max_bytes: int = 1 << 30) -> Iterator[PrefillMemo]:
        """Within the block, batch-1 prefills are kept (up to ``max_bytes``, least recently used
        dropped) and reused for the same prompt ids: the same bits, none of the prefill time. For
        quality measurement only; timings taken inside the block leave out the prefill. Nested
        blocks share the outer memo."""
        if self._prefill_memo is not None:
            yield self._prefill_memo
            return
        self._prefill_memo = PrefillMemo(max_bytes)
        try:
            yield self._prefill_memo
        finally:
            self._prefill_memo = None

    def _rerun_degraded(self, rows, max_new, cfg, temperature, seed, forced, log_file, reason, keep_logits=False,
                        on_token=None, stop_check=None):
        results = self._run(rows, max_new, cfg.override(mode="off", log_level="NONE"), temperature, seed, forced, None,
                            keep_logits, on_token, stop_check)
        for r, res in zip(rows, results):
            res.stats.update(degraded=True, degraded_reason=r.degraded_reason or reason,
                             mode=cfg.mode, sensitivity=cfg.sensitivity)
        self._emit_logs(cfg, results, [], log_file)
        return results

    def _stream_buffer(self, batch: int) -> torch.Tensor:
        shape = (self.dims.n_layers + 1, batch, self.dims.hidden)
        if self._stream is None or self._stream.shape != shape:
            self._stream = torch.empty(shape)
        return self._stream

    @staticmethod
    def _sample(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> torch.Tensor:
        if temperature == 0.0:
            return logits.argmax(-1)
        scaled = logits / temperature
        if not bool(torch.isfinite(scaled).all()):
            # A temperature so small that logits / t overflows (below ~1e-37 in float32): inf - inf
            # made NaN probabilities. Shifted by the max in float64 the limit is the argmax (ties
            # shared); finite cases keep the plain path, so their samples are unchanged.
            shifted = logits.double() - logits.double().max(-1, keepdim=True).values
            scaled = shifted / temperature
        probs = torch.softmax(scaled, -1)
        return torch.multinomial(probs, 1, generator=gen)[:, 0]

    def _make_router(self, rows: list[PromptRow], cfg: PruningConfig, cal: calib_mod.Calibration) -> Router:
        rc = RouterCalibration(impact=cal.impact, rel_mean=np.asarray(cal.rel_mean),
                               grad_ref=np.asarray(cal.grad_ref), entropy_ref=cal.entropy_ref,
                               density_ref=cal.density_ref)
        f_density = np.array([density_factor(self._density(r.prompt, r.ids), cal.density_ref) for r in rows])
        if cfg.hardware_watermark is None:
            wm, _ = sample_watermark()
        else:
            wm = cfg.hardware_watermark
        return Router(rc, len(rows), cfg.sensitivity, cfg.tau0, cfg.blacklist_for(self.dims.n_layers),
                      f_density, watermark_factor(wm), cfg.probe_interval)

    @staticmethod
    def _observe(router: Router, stream: torch.Tensor, logits: torch.Tensor, keep: list[bool]) -> None:
        # numpy over zero-copy views: on arrays this small, right after a step that streamed
        # 0.5 GB of weights, torch's per-op overhead cost more than the math (router time per
        # token 1.12 ms with torch ops, 0.75 ms with these; same figures).
        s = stream.numpy()  # [L+1, B, H]
        norms = np.sqrt(np.einsum("lbh,lbh->bl", s, s))  # [B, L+1]
        d = s[1:] - s[:-1]
        updates = np.sqrt(np.einsum("lbh,lbh->bl", d, d))  # [B, L]
        z = logits.numpy()
        shifted = z - z.max(axis=-1, keepdims=True)
        e = np.exp(shifted)
        total = e.sum(axis=-1)
        entropy = np.log(total) - np.einsum("bv,bv->b", e, shifted) / total  # nats, -sum p log p
        router.observe(norms, updates, entropy, keep)

    def _detail_records(self, router: Router, keep: list[bool], probe: bool, step: int, rows: list[PromptRow]) -> list[str]:
        tau, f_ent, f_grad = router.thresholds()
        scores = router.scores()
        lines = []
        for b in range(len(rows)):
            for layer in range(self.dims.n_layers):
                if router.protected[layer]:
                    decision = "KEEP_BLACKLIST"
                elif probe:
                    decision = "KEEP_PROBE"
                else:
                    decision = "KEEP" if keep[layer] else "BYPASS"
                lines.append(json.dumps({
                    "event": "block", "request": b, "token": step + 1, "block": layer,
                    "score": round(float(scores[b, layer]), 6), "threshold": round(float(tau[b, layer]), 6),
                    "f_density": round(float(router.f_density[b]), 4), "f_entropy": round(float(f_ent[b]), 4),
                    "f_gradient": round(float(f_grad[b, layer]), 4), "f_watermark": round(router.f_watermark, 4),
                    "decision": decision,
                }))
        return lines

    def _emit_logs(self, cfg: PruningConfig, results: list[GenerationResult], detail: list[str],
                   log_file: IO[str] | None) -> None:
        if cfg.log_level == "NONE":
            return
        lines = list(detail)
        for b, res in enumerate(results):
            s = res.stats
            lines.append(json.dumps({
                "event": "request", "request": b, "layers_bypassed": s["layers_bypassed"],
                "total_tokens": s["total_tokens"], "bypass_ratio": round(s["bypass_ratio"], 6),
                "degraded": s["degraded"], "degraded_reason": s["degraded_reason"],
                "mode": s["mode"], "sensitivity": s["sensitivity"], "router": s.get("router"),
            }))
        if log_file is not None:
            log_file.write("\n".join(lines) + "\n")
            log_file.flush()
        else:
            for line in lines:
                log.info(line)
