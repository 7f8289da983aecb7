"""The ``llama-cpp`` adapter: llama.cpp through llama-cpp-python, an engine nobody here wrote,
run on the reference engine's own weights (an F32 GGUF) and on a quantization ladder of them.

Each rung of the ladder (rsp_bench.gguf_ladder) is one configuration, ``llama-cpp/<rung>``
(mode "quant": llama.cpp prunes nothing, but a quantized model is not the reference), declared at registration so the suites run
``reference/off`` and then every rung. What keeps the comparison with the reference exact:

- prompts are token-identical: the reference engine's encoder (chat template applied) makes
  the prompt ids, and llama.cpp decodes from those ids, never from text;
- greedy decoding is an argmax over llama.cpp's full-vocabulary logits of the last position,
  stopping at the reference engine's EOS id (kept in the output, as the reference does);
- teacher forcing evaluates prompt + continuation in one batch with every position's logits
  (``logits_all``), so KL is over the full vocabulary, exact, not a top-N estimate.

Timing: the adapter times its own prefill and each decode step (``prefill_time_s``,
``decode_step_times_s``), the keys rsp_bench.speed reads, so the throughput suite measures
llama.cpp's decode interleaved with the reference in one process. One Llama object per rung,
loaded once, ``n_threads`` = the cores this process may use (``RSP_LLAMA_CPP_THREADS``
overrides: the thread count is a knob a kernel change can turn). Batch size is 1: several
prompts in one call run one after the other, and such a call carries no per-call timings (each
output has its own under ``own_*``), so rsp_bench.speed times it from outside.

Must NOT import torch or llama_cpp at module import (the plugin imports the registry light;
a machine without llama-cpp-python must still collect the suites and unit tests).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from typing import TYPE_CHECKING, Any, Sequence

from rsp_bench.engines.base import ConfigSpec, Output, register_engine
from rsp_bench.engines.configs import format_config_id
from rsp_bench.engines.reference import need_engine
from rsp_bench.errors import HarnessInputError
from rsp_bench.gguf_ladder import (INSTALL_HINT, Rung, RungFile, build_ladder, file_sha256, ladder_from_env,
                                   llama_cpp_version, require_llama_cpp, source_gguf)

if TYPE_CHECKING:
    import torch
    from reference_engine import Engine

NAME = "llama-cpp"
THREADS_ENV = "RSP_LLAMA_CPP_THREADS"
# llama.cpp's "extra buffer types" re-lay quantized weights for AMX tiles or repacked SIMD
# kernels when the CPU advertises them. On this project's Intel Xeon VMs the CPU advertises AMX
# and a Q8_0 / Q4_1 / Q4_K_M model loaded that way died of SIGILL on its first eval (F32 ran:
# it has no such layout). Off by default, so every rung runs llama.cpp's plain CPU kernels;
# RSP_LLAMA_CPP_EXTRA_BUFFERS=1 turns them back on where the machine really has them.
EXTRA_BUFFERS_ENV = "RSP_LLAMA_CPP_EXTRA_BUFFERS"
# Weights are read into the process's own memory, not mapped from the page cache. Mapped, a
# rung's decode speed followed the history of its file's cached pages: on one Intel runner,
# after a memory-heavy job, Q4_K_M decoded at 58-62 tok/s against 72-74 in its baseline runs
# (Q4_1, Q8_0 and F32 unchanged) and the speed gate failed CI; dropping the page cache gave
# 76-80 again. A copy costs the file's size in RAM (about 0.9 GB for the four rungs) and makes
# the layout the same on every load.
USE_MMAP = False
# Context the Llama objects are made with: the longest quick or full extraction prompt plus its
# answer fits with room. With logits for every position, llama-cpp-python keeps an
# n_ctx x vocab float32 array per rung (2048 x 49,152 x 4 B = 400 MB), so not the model's 8k.
DEFAULT_N_CTX = 2048
# The rungs' mode. Not "off": llama.cpp prunes nothing, but a quantized model is not the
# unpruned reference, so the suites' exactness checks and [off] budgets for mode "off" must not
# apply to it; rows are judged by the gate against llama-cpp's own baseline instead.
MODE = "quant"


def configurations(modes: Sequence[str] = ("quant",), sensitivities: Sequence[float] = ()) -> list[ConfigSpec]:
    """One configuration per rung of this process's ladder (``RSP_LLAMA_CPP_LADDER``), read
    before any model loads. Pruning modes and sensitivities do not apply to llama.cpp."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise HarnessInputError(f"engine {NAME!r} needs llama-cpp-python, which is not installed: {INSTALL_HINT}")
    return [spec_for(rung) for rung in ladder_from_env()]


def spec_for(rung: Rung, gguf_sha256: str | None = None) -> ConfigSpec:
    """Configuration ``llama-cpp/<rung name>``; ``params`` carry the file type (and, once the
    file exists, its digest) into the run record."""
    params: dict[str, Any] = {"quant": rung.file_type}
    if gguf_sha256 is not None:
        params["gguf_sha256"] = gguf_sha256
    return ConfigSpec(format_config_id(NAME, rung.name), NAME, MODE, None, params)


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _extra_buffers_from_env() -> bool:
    raw = os.environ.get(EXTRA_BUFFERS_ENV, "0")
    if raw not in ("0", "1"):
        raise HarnessInputError(f"{EXTRA_BUFFERS_ENV}={raw!r} must be 0 or 1")
    return raw == "1"


@contextlib.contextmanager
def _model_params(llama_cpp: Any, use_extra_bufts: bool):
    """Llama() builds its llama_model_params from ``llama_model_default_params()`` and exposes
    no ``use_extra_bufts`` argument; wrap that one call while a model loads."""
    module = llama_cpp.llama_cpp
    default = module.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = use_extra_bufts
        return p

    module.llama_model_default_params = params
    try:
        yield
    finally:
        module.llama_model_default_params = default


def _threads_from_env() -> int | None:
    raw = os.environ.get(THREADS_ENV)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise HarnessInputError(f"{THREADS_ENV}={raw!r} is not an integer >= 1")
    return int(raw)


class LlamaCppAdapter:
    """llama.cpp on the rungs of a GGUF ladder, fed the reference engine's prompt ids."""

    name = NAME
    modes = (MODE,)
    batch_size = 1

    def __init__(self, engine: "Engine", model: str | os.PathLike[str] | None = None, *,
                 rungs: Sequence[Rung] | None = None, n_threads: int | None = None,
                 n_ctx: int = DEFAULT_N_CTX, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.llama_cpp = require_llama_cpp()
        self.engine = engine
        self.source = source_gguf(model)
        self.source_sha256 = file_sha256(self.source)
        self.rungs = {r.name: r for r in (rungs if rungs is not None else ladder_from_env())}
        self.n_threads = n_threads or _threads_from_env() or usable_cores()
        self.extra_buffers = _extra_buffers_from_env()
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 16:
            raise HarnessInputError(f"n_ctx must be an integer >= 16, got {n_ctx!r}")
        self.n_ctx = n_ctx
        self.cache_dir = cache_dir
        self._files: dict[str, RungFile] | None = None
        self._llamas: dict[str, Any] = {}
        self._weight_bytes: dict[str, int] = {}

    # ---- configurations and files

    def files(self) -> dict[str, RungFile]:
        """The GGUF of every file type the ladder needs, built (or read from the cache) once."""
        if self._files is None:
            types = list(dict.fromkeys(r.file_type for r in self.rungs.values()))
            self._files = build_ladder(self.source, types, cache_dir=self.cache_dir, nthread=self.n_threads,
                                       source_sha256=self.source_sha256)
        return self._files

    def configurations(self, modes: Sequence[str] = ("quant",), sensitivities: Sequence[float] = ()) -> list[ConfigSpec]:
        """The ladder's configurations with each file's digest in ``params``."""
        files = self.files()
        return [spec_for(r, files[r.file_type].sha256) for r in self.rungs.values()]

    def describe(self) -> dict[str, Any]:
        """What the run record's ``extra`` should say about this engine."""
        files = self.files()
        return {"source": str(self.source), "source_sha256": self.source_sha256, "n_threads": self.n_threads,
                "n_ctx": self.n_ctx, "extra_buffers": self.extra_buffers, "llama_cpp_python": llama_cpp_version(),
                "system_info": self.llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
                "rungs": {name: {"quant": r.file_type, "gguf_sha256": files[r.file_type].sha256,
                                 "size": files[r.file_type].size} for name, r in self.rungs.items()}}

    def weight_bytes(self, rung: Rung, llm: Any) -> int:
        """Bytes of weights one decode step reads: llama.cpp's own tensor total for this rung
        (``llama_model_size``). The embedding is tied to the LM head, which reads it whole every
        token, so every tensor is read once per step (the prompt's embedding rows aside)."""
        if rung.file_type not in self._weight_bytes:
            self._weight_bytes[rung.file_type] = int(self.llama_cpp.llama_model_size(llm.model))
        return self._weight_bytes[rung.file_type]

    def _rung(self, spec: ConfigSpec) -> Rung:
        if spec.engine != NAME or spec.mode != MODE:
            raise HarnessInputError(f"engine {NAME!r} runs its own ladder configurations (mode {MODE!r}), "
                                    f"got {spec.config_id!r} (engine {spec.engine!r}, mode {spec.mode!r})")
        rung_name = spec.config_id.split("/", 1)[1] if "/" in spec.config_id else ""
        rung = self.rungs.get(rung_name)
        if rung is None:
            raise HarnessInputError(f"configuration {spec.config_id!r}: no rung {rung_name!r} in this ladder "
                                    f"({', '.join(self.rungs)}); set RSP_LLAMA_CPP_LADDER to change it")
        quant = spec.params.get("quant")
        if quant is not None and quant != rung.file_type:
            raise HarnessInputError(f"configuration {spec.config_id!r} asks for quant {quant!r} but rung "
                                    f"{rung.name!r} is {rung.file_type!r} in this ladder")
        return rung

    def llama(self, spec: ConfigSpec) -> Any:
        """The loaded Llama of ``spec``'s rung (loaded on first use, then kept)."""
        rung = self._rung(spec)
        if rung.file_type not in self._llamas:
            path = self.files()[rung.file_type].path
            with _model_params(self.llama_cpp, self.extra_buffers):
                llm = self.llama_cpp.Llama(model_path=str(path), n_ctx=self.n_ctx, n_threads=self.n_threads,
                                           n_threads_batch=self.n_threads, logits_all=True, n_gpu_layers=0,
                                           use_mmap=USE_MMAP, seed=0, verbose=False)
            if bool(llm.model_params.use_extra_bufts) != self.extra_buffers:
                raise HarnessInputError(f"llama-cpp-python {llama_cpp_version()} ignored use_extra_bufts="
                                        f"{self.extra_buffers}; this adapter is written against 0.3.36")
            vocab = int(self.engine.hf_model.config.vocab_size)
            if llm.n_vocab() != vocab:
                raise HarnessInputError(f"{path}: llama.cpp vocabulary {llm.n_vocab()} != the reference engine's "
                                        f"{vocab}: not the same model (--rsp-model must name one GGUF for both)")
            if not hasattr(llm, "_logits_all"):
                # generate() switches per-position logits off for its prefill (see there)
                raise HarnessInputError(f"llama-cpp-python {llama_cpp_version()} has no Llama._logits_all; "
                                        "this adapter is written against 0.3.36")
            self._llamas[rung.file_type] = llm
        return self._llamas[rung.file_type]

    # ---- the adapter protocol

    def _check_fits(self, prompt_len: int, new: int) -> None:
        if prompt_len == 0:
            raise HarnessInputError("prompt encodes to no tokens")
        if prompt_len + new > self.n_ctx:
            raise HarnessInputError(f"prompt of {prompt_len} tokens + {new} new tokens exceeds the llama.cpp "
                                    f"context of {self.n_ctx} (LlamaCppAdapter(n_ctx=...))")

    def _last_logits(self, llm: Any) -> Any:
        import numpy as np

        ptr = self.llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))

    def generate(self, prompts: list[str], max_new_tokens: int, spec: ConfigSpec) -> list[Output]:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise HarnessInputError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        rung = self._rung(spec)
        llm = self.llama(spec)
        eos = self.engine.eos_id
        outputs = []
        for prompt in prompts:
            ids = self.engine.encode(prompt, chat=True)
            self._check_fits(len(ids), max_new_tokens)
            llm.reset()
            # Only the last position's logits are needed to decode: with per-position logits on,
            # the prefill would also run the LM head over every prompt position (about a quarter
            # more work) and copy them out, which is not what a llama.cpp server does.
            llm._logits_all = False
            try:
                t0 = time.perf_counter()
                llm.eval(ids)
                token = int(self._last_logits(llm).argmax())
                prefill_s = time.perf_counter() - t0
                new, steps = [token], []
                while len(new) < max_new_tokens and token != eos:
                    ts = time.perf_counter()
                    llm.eval([token])
                    token = int(self._last_logits(llm).argmax())
                    steps.append(time.perf_counter() - ts)
                    new.append(token)
            finally:
                llm._logits_all = True
            stats = {"layers_bypassed": 0, "total_tokens": len(new), "bypass_ratio": 0.0,
                     "blocks": self.engine.dims.n_layers, "degraded": False, "degraded_reason": None,
                     "mode": MODE, "sensitivity": None, "prompt_tokens": len(ids), "batch_size": 1,
                     "decode_time_s": prefill_s + sum(steps), "quant": rung.file_type,
                     "n_threads": self.n_threads, "weight_bytes_per_token": self.weight_bytes(rung, llm)}
            if len(prompts) == 1:
                # rsp_bench.speed reads these as the timings of the whole call (one batch). Several
                # prompts run one after the other, so no one prompt's times are the call's: the
                # speed suite then times the call from outside, which is what a sequential engine
                # delivers at that batch size.
                stats.update(prefill_time_s=prefill_s, decode_step_times_s=steps)
            else:
                stats.update(own_prefill_time_s=prefill_s, own_decode_step_times_s=steps)
            outputs.append(Output(self.engine.decode(new), new, list(ids), stats))
        return outputs

    def teacher_forced_logits(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int],
                              spec: ConfigSpec) -> tuple["torch.Tensor", dict[str, Any]]:
        import torch

        rung = self._rung(spec)
        p, t = len(prompt_ids), len(continuation_ids)
        if p == 0 or t == 0:
            raise HarnessInputError("teacher forcing needs a non-empty prompt and continuation")
        self._check_fits(p, t)
        llm = self.llama(spec)
        llm.reset()
        llm.eval(list(prompt_ids) + list(continuation_ids)[:-1])
        # Position p-1 (the last prompt token) predicts continuation[0], and so on.
        logits = torch.from_numpy(llm.scores[p - 1:p - 1 + t].copy())
        stats = {"layers_bypassed": 0, "total_tokens": t, "bypass_ratio": 0.0,
                 "blocks": self.engine.dims.n_layers, "mode": MODE, "quant": rung.file_type}
        return logits, stats


@register_engine(NAME, modes=(MODE,), configurations=configurations)
def _llama_cpp_factory(engine: "Engine | None" = None, model: str | None = None, **_: Any) -> LlamaCppAdapter:
    return LlamaCppAdapter(need_engine(NAME, engine), model)
