"""The reference pruned engine as an lm-evaluation-harness model named ``rsp``.

With this, any lm-eval task (and the offline tasks in fixtures/lm_eval_tasks/) can be run
through the engine with pruning off, lossy or lossless:

    python -m rsp_bench.lm_eval_model --model rsp \\
        --model_args model=PATH,sensitivity=0.5,mode=lossy \\
        --tasks rsp_squad,rsp_structured,rsp_perplexity --include_path fixtures/lm_eval_tasks

``python -m rsp_bench.lm_eval_model`` takes exactly lm-eval's own command line. It exists
because lm-eval 0.4.13 finds models only in its registry: its ``get_model`` knows the names
that ``lm_eval.models`` lists and those registered by an imported module, and it reads no entry
point group, so the stock ``lm_eval --model rsp`` cannot see a model that lives in another
package. The wrapper imports this module (which runs ``@register_model("rsp")``) and then hands
the command line to lm-eval's CLI unchanged. From Python, import this module and pass
``--model rsp`` / ``model="rsp"`` to ``lm_eval.simple_evaluate``, or an ``RSPLM`` instance
(``RSPLM(engine=loaded_engine, ...)`` reuses a loaded engine).

Model arguments (``--model_args k=v,...``):
  model           local Llama-family folder or .gguf (default: the embedded SmolLM2-135M-Instruct;
                  ``embedded`` or ``default`` say so explicitly)
  mode            off | lossy | lossless (default lossy)
  sensitivity     0..1 (default 0.5)
  max_new_tokens  default generation limit when a task gives no ``max_gen_toks`` (default 256)
  max_length      tokens the model reads per loglikelihood request or rolling window (default
                  min(2048, model's context - 1)); longer contexts are cut from the left
  watermark       hardware watermark in [0, 1] pinned for every request (default 0.0, as the
                  suites pin it: figures then do not depend on who else uses the machine), or
                  ``auto`` to let the router sample the machine's load per request
  stats_file      path of a JSON side file with the summed pruning stats (rewritten atomically
                  after every batch of requests)
  seed            sampling seed for tasks that ask for ``do_sample: true``
  batch_size      prompts per ``engine.generate`` call in generate_until (lm-eval's --batch_size;
                  default 1). The router plans one set of blocks per batch (a block is bypassed
                  only when every row agrees), so with pruning on, batch 1 is what the suites
                  measure and larger batches prune less.

Conventions (as lm-eval's own HF model): prompts are used raw; the chat template is applied
only when lm-eval asks for it (``--apply_chat_template``, through ``apply_chat_template``),
and then the token ids equal ``engine.encode(prompt, chat=True)``; a one-message chat is sent
to the engine as that message with ``chat=True`` (``apply_chat_template`` says why). ``generate_until`` cuts the
text at the first of the request's ``until`` strings (the engine has no stop strings, so it
decodes up to ``max_gen_toks`` or EOS and the cut happens afterwards). ``loglikelihood`` and
``loglikelihood_rolling`` run ``engine.teacher_forced``: the context is prefilled in full and
every continuation token is a decode step with pruning applied exactly as in generation; the
log-probabilities come from ``rsp_bench.metrics.token_nll``. A context with no text (a rolling
window's first, which is only the prefix token) would make the engine's protective degradation
turn pruning off for the whole document, so its first 16 tokens are scored with pruning off and
the rest with pruning on (``RSPLM._score``).

Pruning stats (decode tokens, block-steps bypassed, bypass ratio, degraded requests and why)
are summed over every request, exposed as ``RSPLM.pruning_stats``, added to lm-eval's results
under ``config.rsp_pruning`` (through ``get_model_info``) and written to ``stats_file``.

Must NOT import pytest, and must not import torch, transformers or the engine at module import
beyond what lm-eval itself imports: the engine is loaded when the model is built.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from rsp_bench.errors import HarnessInputError

if TYPE_CHECKING:  # names only
    from lm_eval.api.instance import Instance

    from reference_engine import Engine, PruningConfig

__all__ = ["RSPLM", "MODEL_NAME", "MODES", "main", "register"]

log = logging.getLogger("rsp_bench.lm_eval_model")

MODEL_NAME = "rsp"
MODES = ("off", "lossy", "lossless")
DEFAULT_MAX_NEW_TOKENS = 256
DEFAULT_MAX_LENGTH = 2048
# Generation kwargs the engine honours; any other key with a non-neutral value is refused
# rather than silently ignored (a task asking for top_p=0.9 must not get greedy output unsaid).
_NEUTRAL_GEN_KWARGS = {"top_p": (1, 1.0, None), "top_k": (0, None), "num_beams": (1, None),
                       "repetition_penalty": (1, 1.0, None)}
_EMBEDDED_NAMES = (None, "", "embedded", "default")
# Continuation tokens scored with pruning off when the context has no text (RSPLM._score).
WARMUP_TOKENS = 16


def _as_bool_or_none(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if value in (None, 0, 1):
        return bool(value)
    raise HarnessInputError(f"generation kwarg {name} must be true or false, got {value!r}")


def _positive_int(value: Any, name: str) -> int:
    # lm-eval's arg parser turns "32" into 32 but a YAML may still hold "32".
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or number < 1 or (isinstance(value, float) and value != number):
        raise HarnessInputError(f"{name} must be an integer >= 1, got {value!r}")
    return number


class RSPLM(LM):
    """lm-eval model over ``reference_engine.Engine`` (module docstring: arguments, conventions)."""

    def __init__(self, model: str | None = None, mode: str = "lossy", sensitivity: float = 0.5,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, max_length: int | None = None,
                 watermark: float | str = 0.0, stats_file: str | None = None, seed: int | None = None,
                 batch_size: int | str = 1, engine: "Engine | None" = None,
                 device: str | None = None, max_batch_size: int | None = None, **unknown: Any) -> None:
        super().__init__()
        if unknown:
            raise HarnessInputError(
                f"unknown model argument(s) for --model {MODEL_NAME}: {', '.join(sorted(unknown))} "
                "(known: model, mode, sensitivity, max_new_tokens, max_length, watermark, stats_file, "
                "seed, batch_size)")
        if mode not in MODES:
            raise HarnessInputError(f"model argument mode must be one of {', '.join(MODES)}, got {mode!r}")
        if isinstance(sensitivity, bool) or not isinstance(sensitivity, (int, float)) \
                or not math.isfinite(sensitivity) or not 0.0 <= sensitivity <= 1.0:
            raise HarnessInputError(f"model argument sensitivity must be a number in [0, 1], got {sensitivity!r}")
        self.max_new_tokens = _positive_int(max_new_tokens, "model argument max_new_tokens")
        if batch_size == "auto" or (isinstance(batch_size, str) and batch_size.startswith("auto")):
            # "auto" searches for the largest batch that fits in GPU memory; on this CPU engine
            # batch 1 is both the safe and the comparable choice (module docstring).
            log.warning("batch_size=%r: the rsp model has no automatic batch search; using 1", batch_size)
            batch_size = 1
        self.batch_size = _positive_int(batch_size, "batch_size")
        if watermark == "auto":
            pinned: float | None = None
        elif isinstance(watermark, bool) or not isinstance(watermark, (int, float)) \
                or not math.isfinite(watermark) or not 0.0 <= watermark <= 1.0:
            raise HarnessInputError(f"model argument watermark must be a number in [0, 1] or 'auto', got {watermark!r}")
        else:
            pinned = float(watermark)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise HarnessInputError(f"model argument seed must be an integer, got {seed!r}")
        self.seed = seed
        if device not in (None, "cpu"):
            # lm-eval's CLI defaults --device to cuda:0; the reference engine runs on the CPU.
            log.info("device=%r ignored: the reference engine runs on the CPU", device)

        from reference_engine import PruningConfig

        self.config: PruningConfig = PruningConfig(mode=mode, sensitivity=float(sensitivity),
                                                   hardware_watermark=pinned, log_level="NONE")
        if engine is None:
            from reference_engine import Engine

            engine = Engine.load(None if model in _EMBEDDED_NAMES else model)
        elif model not in _EMBEDDED_NAMES and str(model) not in (str(engine.folder), engine.name):
            raise HarnessInputError(f"model={model!r} names another model than the engine passed in ({engine.name})")
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.config.blacklist_for(engine.dims.n_layers)
        # The engine holds prompt + continuation in its cache (max_positions), and the model reads
        # max_length tokens plus the one it predicts last: hence max_positions - 1.
        limit = engine.dims.max_positions - 1
        self.max_length = min(DEFAULT_MAX_LENGTH, limit) if max_length is None else \
            _positive_int(max_length, "model argument max_length")
        if self.max_length > limit:
            raise HarnessInputError(f"model argument max_length={self.max_length} exceeds the model's context "
                                    f"of {limit + 1} tokens (at most {limit})")
        self.stats_file = Path(stats_file).expanduser() if stats_file else None
        self._totals: dict[str, Any] = self._empty_totals()
        self._chat_messages: dict[str, str] = {}  # chat-templated text -> its one user message

    # ------------------------------------------------------------------ identity

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "RSPLM":
        from lm_eval.utils import simple_parse_args_string

        args = simple_parse_args_string(arg_string)
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        # "model=0.5" would arrive as a float; a model is always a path or a name.
        if "model" in args and args["model"] is not None:
            args["model"] = str(args["model"])
        return cls(**args, **extra)

    @property
    def eot_token_id(self) -> int:
        return int(self.engine.eos_id)

    @property
    def prefix_token_id(self) -> int:
        # What an empty context is conditioned on, as lm-eval's HF model does: BOS, else EOS.
        bos = self.tokenizer.bos_token_id
        return int(bos) if bos is not None else self.eot_token_id

    @property
    def tokenizer_name(self) -> str:
        return str(self.engine.name).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) or ""

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat template as text (lm-eval passes that text back as the request's context).

        A single user message is also remembered: generate_until then sends the message itself
        with ``chat=True``. The token ids are the same (checked here), but the engine's
        protective degradation reads the prompt text, and the template's own special-token text
        (``<|im_start|>``...) would otherwise turn pruning off for every chat request.
        """
        text = self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)
        if add_generation_prompt and len(chat_history) == 1 and chat_history[0].get("role") == "user":
            content = chat_history[0].get("content")
            if isinstance(content, str) and self.engine.encode(content, chat=True) == self._encode(text):
                self._chat_messages[text] = content
        return text

    def get_model_info(self) -> dict[str, Any]:
        """Added by lm-eval to results["config"] after the evaluation: the pruning stats too."""
        return {"rsp_model": self.engine.name, "rsp_weights_sha256": self.engine.weights_sha256,
                "rsp_pruning": self.pruning_stats}

    # ------------------------------------------------------------------ stats

    def _empty_totals(self) -> dict[str, Any]:
        return {"requests": Counter(), "decode_tokens": 0, "layers_bypassed": 0, "degraded": 0,
                "degraded_reasons": Counter()}

    def _add_stats(self, kind: str, stats: dict[str, Any], count_request: bool = True) -> None:
        t = self._totals
        if count_request:
            t["requests"][kind] += 1
        t["decode_tokens"] += int(stats.get("total_tokens", 0))
        t["layers_bypassed"] += int(stats.get("layers_bypassed", 0))
        if stats.get("degraded"):
            t["degraded"] += 1
            t["degraded_reasons"][str(stats.get("degraded_reason"))] += 1

    @property
    def pruning_stats(self) -> dict[str, Any]:
        """Summed over every request so far: requests per kind, decode tokens (generated plus
        teacher-forced), block-steps bypassed, bypass ratio (rsp_bench.metrics.bypass_ratio),
        degraded requests and their reasons, and the configuration that produced them."""
        from rsp_bench.metrics import bypass_ratio

        t = self._totals
        blocks = int(self.engine.dims.n_layers)
        return {
            "mode": self.config.mode,
            "sensitivity": self.config.sensitivity,
            "hardware_watermark": self.config.hardware_watermark,
            "blocks": blocks,
            "requests": dict(sorted(t["requests"].items())),
            "decode_tokens": t["decode_tokens"],
            "layers_bypassed": t["layers_bypassed"],
            "bypass_ratio": bypass_ratio(t["layers_bypassed"], blocks, t["decode_tokens"]),
            "degraded_requests": t["degraded"],
            "degraded_reasons": dict(sorted(t["degraded_reasons"].items())),
        }

    def reset_stats(self) -> None:
        self._totals = self._empty_totals()

    def _flush_stats(self) -> None:
        if self.stats_file is not None:
            from rsp_bench.storage import atomic_write_json

            atomic_write_json(self.stats_file, self.pruning_stats)

    # ------------------------------------------------------------------ tokens

    def _encode(self, text: str) -> list[int]:
        # The engine's own raw-prompt encoding, so a loglikelihood context is tokenized exactly
        # as generate_until's engine.generate(chat=False) tokenizes the same text.
        return self.engine.encode(text, chat=False)

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        if context == "":
            return [self.prefix_token_id], list(self.tokenizer(continuation, add_special_tokens=False)["input_ids"])
        # As lm-eval's HF model: trailing spaces of the context belong to the continuation, and
        # the continuation's ids are the tail of the whole string's ids (merges across the seam
        # then match what the model sees when it reads context and continuation together).
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self._encode(context + continuation)
        ctx = self._encode(context)
        return ctx, whole[len(ctx):]

    def _score(self, context_ids: list[int], continuation_ids: list[int], kind: str) -> tuple[float, bool]:
        """Summed log-probability of the continuation and whether greedy decoding gives it.

        A context without text (only the prefix token: a rolling window's first, or an empty
        loglikelihood context) gives the router nothing to route on, and the engine's protective
        degradation turns such a request's pruning off as a whole. So its first
        ``WARMUP_TOKENS`` continuation tokens are scored with pruning off, and the rest with
        those tokens as the prompt and pruning applied: the same log-likelihood, split by the
        chain rule, with pruning on every decode step it can act on.
        """
        # Lossless teacher forcing is the unpruned model by construction: nothing to split.
        if (self.config.prunes and self.config.mode == "lossy" and len(continuation_ids) > 1
                and not self.engine.decode(context_ids).strip()):
            k = min(WARMUP_TOKENS, len(continuation_ids) - 1)
            head = self._score_one(context_ids, continuation_ids[:k], kind, self.config.override(mode="off"))
            tail = self._score_one(context_ids + continuation_ids[:k], continuation_ids[k:], kind, self.config,
                                   count_request=False)
            return head[0] + tail[0], head[1] and tail[1]
        return self._score_one(context_ids, continuation_ids, kind, self.config)

    def _score_one(self, context_ids: list[int], continuation_ids: list[int], kind: str,
                   config: "PruningConfig", count_request: bool = True) -> tuple[float, bool]:
        import torch

        from rsp_bench.metrics import token_nll

        if len(continuation_ids) > self.max_length:
            raise HarnessInputError(
                f"{kind}: continuation of {len(continuation_ids)} tokens does not fit max_length={self.max_length}")
        # The model reads context + continuation[:-1]: at most max_length tokens, as lm-eval's
        # HF model keeps the last max_length + 1 (context cut from the left).
        keep = self.max_length + 1 - len(continuation_ids)
        context_ids = context_ids[-keep:] if len(context_ids) > keep else context_ids
        res = self.engine.teacher_forced(context_ids, continuation_ids, config)
        self._add_stats(kind, res.stats, count_request)
        target = torch.tensor(continuation_ids, dtype=torch.long)
        logprob = -float(token_nll(res.logits, target).sum())
        greedy = bool((res.logits.argmax(-1) == target).all())
        return logprob, greedy

    # ------------------------------------------------------------------ requests

    def loglikelihood(self, requests: list["Instance"], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out: list[tuple[float, bool]] = []
        for req in self._progress(requests, "rsp loglikelihood", disable_tqdm):
            context, continuation = req.args[0], req.args[1]
            ctx, cont = self._encode_pair(context, continuation)
            if not cont:
                # Nothing to score (an empty continuation): probability 1, trivially greedy.
                answer = (0.0, True)
            else:
                answer = self._score(ctx, cont, "loglikelihood")
            self.cache_hook.add_partial("loglikelihood", (context, continuation), answer)
            out.append(answer)
        self._flush_stats()
        return out

    def loglikelihood_rolling(self, requests: list["Instance"], disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out: list[float] = []
        for req in self._progress(requests, "rsp loglikelihood_rolling", disable_tqdm):
            (text,) = req.args[:1]
            tokens = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1)]
            total = 0.0
            for ctx, pred in windows:
                total += self._score(list(ctx), list(pred), "loglikelihood_rolling")[0]
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        self._flush_stats()
        return out

    def _generation_args(self, gen_kwargs: dict[str, Any]) -> tuple[list[str], int, float]:
        kwargs = copy.deepcopy(gen_kwargs) if gen_kwargs else {}
        if not isinstance(kwargs, dict):
            raise HarnessInputError(f"generate_until expects a dict of generation kwargs, got {gen_kwargs!r}")
        until = kwargs.pop("until", None)
        if isinstance(until, str):
            until = [until]
        elif until is None:
            until = []
        if not isinstance(until, list) or not all(isinstance(u, str) for u in until):
            raise HarnessInputError(f"generation kwarg until must be a string or a list of strings, got {until!r}")
        limit = kwargs.pop("max_gen_toks", kwargs.pop("max_new_tokens", self.max_new_tokens))
        max_new = _positive_int(limit, "generation kwarg max_gen_toks")
        do_sample = _as_bool_or_none(kwargs.pop("do_sample", False), "do_sample")
        temperature = kwargs.pop("temperature", None)
        if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                        or not math.isfinite(temperature) or temperature < 0):
            raise HarnessInputError(f"generation kwarg temperature must be a number >= 0, got {temperature!r}")
        # Greedy unless sampling is asked for with a positive temperature (lm-eval's HF model:
        # do_sample false or temperature 0 means greedy).
        temp = float(temperature if temperature is not None else 1.0) if do_sample else 0.0
        for key in list(kwargs):
            if key in _NEUTRAL_GEN_KWARGS and kwargs[key] in _NEUTRAL_GEN_KWARGS[key]:
                kwargs.pop(key)
        if kwargs:
            raise HarnessInputError(
                f"generation kwarg(s) the rsp model cannot honour: "
                f"{', '.join(f'{k}={v!r}' for k, v in sorted(kwargs.items()))} "
                "(supported: until, max_gen_toks, do_sample, temperature)")
        if temp > 0 and self.config.mode == "lossless":
            raise HarnessInputError(
                f"do_sample with temperature={temp!r} cannot run in mode lossless (its verification is greedy); "
                "use mode off or lossy, or greedy decoding")
        return until, max_new, temp

    def generate_until(self, requests: list["Instance"], disable_tqdm: bool = False) -> list[str]:
        if not requests:
            return []
        results: list[str | None] = [None] * len(requests)
        # Group requests that share generation kwargs (one engine call serves one setting),
        # keeping the task's order inside a group.
        groups: dict[tuple[str, bool], list[int]] = {}
        for i, req in enumerate(requests):
            key = (json.dumps(req.args[1], sort_keys=True, default=str), req.args[0] in self._chat_messages)
            groups.setdefault(key, []).append(i)
        bar = self._progress(None, "rsp generate_until", disable_tqdm, total=len(requests))
        for (_, chat), indices in groups.items():
            until, max_new, temp = self._generation_args(requests[indices[0]].args[1])
            if self.batch_size > 1:
                # Similar lengths together: left padding then wastes little prefill.
                indices = sorted(indices, key=lambda i: -len(requests[i].args[0]))
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start:start + self.batch_size]
                contexts = [requests[i].args[0] for i in chunk]
                self._check_fits(contexts, max_new, chunk)
                prompts = [self._chat_messages[c] for c in contexts] if chat else contexts
                outs = self.engine.generate(prompts, max_new_tokens=max_new, config=self.config, chat=chat,
                                            temperature=temp, seed=self.seed)
                for i, res in zip(chunk, outs):
                    self._add_stats("generate_until", res.stats)
                    text = res.text
                    for stop in until:
                        if stop:
                            text = text.split(stop)[0]
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                if bar is not None:
                    bar.update(len(chunk))
        if bar is not None:
            bar.close()
        self._flush_stats()
        return [r if r is not None else "" for r in results]

    def _check_fits(self, contexts: Sequence[str], max_new: int, indices: Sequence[int]) -> None:
        limit = self.engine.dims.max_positions
        for i, ctx in zip(indices, contexts):
            n = len(self._encode(ctx))
            if n + max_new > limit:
                raise HarnessInputError(
                    f"generate_until request {i}: prompt of {n} tokens plus max_gen_toks={max_new} exceeds "
                    f"the model's context of {limit} tokens")

    @staticmethod
    def _progress(items: Iterable[Any] | None, desc: str, disable: bool, total: int | None = None):
        from tqdm import tqdm

        # Only on a terminal: CI logs would fill with carriage-return noise.
        off = disable or not sys.stderr.isatty()
        if items is None:
            return None if off else tqdm(total=total, desc=desc, file=sys.stderr)
        return items if off else tqdm(items, desc=desc, file=sys.stderr)


def register() -> None:
    """Register ``RSPLM`` as lm-eval's ``rsp`` model (idempotent).

    lm-eval's ``get_model`` imports its built-in model table only while the registry is
    empty, so that table is imported first: registering ``rsp`` into an empty registry would
    hide ``hf`` and the rest. A class of the same name already registered (this file run as
    ``__main__`` and imported again under its package name) is kept, not re-registered.
    """
    import lm_eval.models  # noqa: F401  (fills the registry with the built-in models)
    from lm_eval.api.registry import model_registry

    existing = model_registry.get(MODEL_NAME, None)
    if existing is None:
        register_model(MODEL_NAME)(RSPLM)
    elif getattr(existing, "__qualname__", None) != RSPLM.__qualname__:
        raise HarnessInputError(f"lm-eval model name {MODEL_NAME!r} is already taken by {existing!r}")


register()


def main(argv: Sequence[str] | None = None) -> int:
    """lm-eval's command line with the ``rsp`` model registered (module docstring)."""
    from lm_eval.__main__ import cli_evaluate

    args = list(sys.argv[1:] if argv is None else argv)
    # lm-eval's CLI parses sys.argv itself (and inserts its "run" subcommand by looking at it).
    saved = sys.argv
    sys.argv = ["lm_eval", *args]
    from reference_engine.errors import EngineInputError

    try:
        cli_evaluate()
    except (HarnessInputError, EngineInputError) as exc:
        sys.stderr.write(f"rsp lm-eval: error: {exc}\n")
        return 2
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
