"""The engine behind the server: one worker thread fed by a bounded queue, and the engine calls
the routes need (generate from token ids, logprobs of generated and prompt tokens).

Why one thread: ``Engine`` is not thread-safe (it reuses buffers) and one decode already keeps
the machine's memory bandwidth busy, so requests run one at a time, in arrival order, off the
event loop. Requests are not batched: the router bypasses a block for a batch only when every
row agrees, so a batched request would be pruned differently from the same request alone and
its output would depend on its neighbours (batching is left for a later change, with that cost
measured). The queue is bounded: ``submit`` raises ``QueueFull`` (the route answers 429 with
``Retry-After``) when ``max_queue`` requests are waiting or running. A request whose client
went away before its turn is cancelled, which frees its slot.

Must not import the harness.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import threading
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Callable, Sequence

import torch

from ..config import PruningConfig
from ..errors import PromptError
from .knobs import APIError

if TYPE_CHECKING:
    from ..engine import Engine, GenerationResult


class QueueFull(Exception):
    pass


class EngineWorker:
    """Runs callables on one thread; at most ``max_queue`` waiting or running at once."""

    def __init__(self, max_queue: int) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.max_queue = max_queue
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rsp-engine")
        self._lock = threading.Lock()
        self.depth = 0  # waiting + running

    def submit(self, fn: Callable[[], Any]) -> "asyncio.Future[Any]":
        with self._lock:
            if self.depth >= self.max_queue:
                raise QueueFull()
            self.depth += 1
        try:
            fut = self._pool.submit(fn)
        except RuntimeError:  # the pool is shut down: the server is stopping
            with self._lock:
                self.depth -= 1
            raise APIError(503, "the server is shutting down", type_="server_error", code="shutting_down") from None
        fut.add_done_callback(self._release)
        return asyncio.wrap_future(fut)

    def _release(self, _: cf.Future) -> None:
        with self._lock:
            self.depth -= 1

    def shutdown(self) -> None:
        # Queued work is cancelled (its callers get an error); the running request finishes.
        self._pool.shutdown(wait=True, cancel_futures=True)


async def run_guarded(worker: EngineWorker, fn: Callable[[], Any], is_disconnected: Callable[[], Any],
                      poll_s: float = 0.25) -> Any:
    """Submit ``fn`` and wait for it; cancel it while still queued if the client disconnects."""
    fut = worker.submit(fn)
    while True:
        done, _ = await asyncio.wait({fut}, timeout=poll_s)
        if done:
            return fut.result()
        if await is_disconnected():
            fut.cancel()  # only succeeds while queued; a running decode finishes
            raise asyncio.CancelledError()


def stream_safe_text(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """What of ``text`` (the decoded output so far) may be sent now: (text, stopped). Cut at the
    first stop string (stopped); else hold back a tail that could still become a stop string,
    and a trailing U+FFFD (a character whose bytes are not all decoded yet)."""
    hits = [text.find(s) for s in stop if s and s in text]
    if hits:
        return text[:min(hits)], True
    keep = len(text)
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                keep = min(keep, len(text) - n)
                break
    out = text[:keep]
    return out.rstrip("\ufffd"), False


# ---------------------------------------------------------------- log records


class TaggedLog:
    """A file-like object the engine writes JSON lines to; each line gets the request id."""

    def __init__(self, sink: IO[str], request_id: str, lock: threading.Lock) -> None:
        self.sink, self.request_id, self.lock = sink, request_id, lock

    def write(self, text: str) -> int:
        lines = []
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                rec = {"request_id": self.request_id, **rec} if isinstance(rec, dict) else rec
                lines.append(json.dumps(rec))
            except ValueError:
                lines.append(json.dumps({"request_id": self.request_id, "message": line}))
        with self.lock:
            self.sink.write("".join(s + "\n" for s in lines))
            self.sink.flush()
        return len(text)

    def flush(self) -> None:
        pass


# ---------------------------------------------------------------- engine calls


@dataclass
class Generated:
    """One prompt's answer: new tokens, their logprob rows, prompt logprob rows, stats."""

    prompt_ids: list[int]
    token_ids: list[int]
    stats: dict[str, Any]
    logits: torch.Tensor | None = None          # [len(token_ids), V] that chose each new token
    prompt_logits: torch.Tensor | None = None   # [len(prompt_ids) - 1, V]: row i predicts prompt[i + 1]
    finish_reason: str = "length"
    text: str = ""
    extras: dict[str, Any] = field(default_factory=dict)


def check_fit(engine: "Engine", ids: Sequence[int], max_tokens: int, param: str = "prompt") -> None:
    vocab, ctx = engine.dims.vocab, engine.dims.max_positions
    if not ids:
        raise APIError(400, "the prompt encodes to no tokens", param, code="empty_prompt")
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is out of range for a vocabulary of {vocab}", param, code="invalid_value")
    if len(ids) + max_tokens > ctx:
        raise APIError(400, f"the prompt is {len(ids)} tokens; with max_tokens={max_tokens} it exceeds the model's "
                            f"context of {ctx} tokens", param, code="context_length_exceeded")


def chat_ids(engine: "Engine", messages: Sequence[dict[str, Any]]) -> list[int]:
    """The chat template applied to ``messages``: for one user message, exactly ``engine.encode``."""
    ids = engine.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def prompt_logits(engine: "Engine", ids: Sequence[int]) -> torch.Tensor:
    """Full-model logits at every prompt position but the last, from the engine's own prefill:
    row i predicts ids[i + 1] (prefill is never pruned, so these are the unpruned model's)."""
    from ..model import KVCache, logits_from_hidden, prefill

    S = len(ids)
    cache = KVCache.allocate(engine.dims, 1, S)
    hidden: list[torch.Tensor] = []
    key_valid = torch.ones(1, S, dtype=torch.bool)
    positions = torch.arange(S)[None]
    prefill(engine.weights, cache, torch.tensor([list(ids)]), positions, key_valid, hidden_out=hidden)
    return logits_from_hidden(engine.weights, hidden[-1][0, :-1])


def generate_ids(engine: "Engine", prompt_text: str, ids: Sequence[int], max_new: int, cfg: PruningConfig,
                 temperature: float, seed: int | None, log_file: IO[str] | None,
                 want_logits: bool, on_token: Callable[[int, int, int], None] | None = None) -> "GenerationResult":
    """``Engine.generate`` for already-templated token ids (the engine's own loop and checks).

    ``prompt_text`` is what the degradation text check and the density factor read; for a single
    chat message it is the message, as ``Engine.generate`` would see it.
    """
    # The engine's public generate takes text; the server must also take token ids (completions,
    # multi-message chats), so it drives the same internal loop generate uses.
    from ..generation import PromptRow

    cfg.blacklist_for(engine.dims.n_layers)
    rows = [PromptRow(prompt_text, list(ids))]
    if cfg.mode == "lossless":
        from ..speculative import generate_lossless

        [res] = generate_lossless(engine, rows, max_new, cfg, log_file)
        if want_logits and res.token_ids:  # lossless output is the unpruned model's by construction
            res.logits = engine.teacher_forced(list(ids), res.token_ids, cfg.override(mode="off", log_level="NONE")).logits
        return res
    [res] = engine._run(rows, max_new, cfg, temperature, seed, None, log_file, keep_logits=want_logits,
                        on_token=on_token)
    return res


def apply_stop(engine: "Engine", token_ids: list[int], stop: Sequence[str]) -> tuple[list[int], str, bool]:
    """Cut the output at the first stop string: (kept ids, text, stopped). The engine has no stop
    strings, so they are applied to its output; the kept ids are the shortest prefix whose text
    reaches the stop string, the text ends just before it (OpenAI: the stop string is not returned)."""
    text = engine.decode(token_ids)
    hits = [text.find(s) for s in stop if s and s in text]
    if not hits:
        return token_ids, text, False
    cut = min(hits)
    for n in range(1, len(token_ids) + 1):
        if len(engine.decode(token_ids[:n])) > cut:
            return token_ids[:n], text[:cut], True
    return token_ids, text[:cut], True


def run_completion(engine: "Engine", ids: list[int], prompt_text: str, max_tokens: int, cfg: PruningConfig,
                   temperature: float, seed: int | None, stop: Sequence[str], want_logits: bool,
                   echo: bool, decode_from: int | None, log_file: IO[str] | None,
                   on_token: Callable[[int, int, int], None] | None = None) -> Generated:
    """One prompt of a (chat) completion request, everything the response needs."""
    n_layers = engine.dims.n_layers
    out = Generated(list(ids), [], {}, finish_reason="length")
    try:
        if max_tokens > 0:
            res = generate_ids(engine, prompt_text, ids, max_tokens, cfg, temperature, seed, log_file, want_logits,
                               on_token)
            out.token_ids, out.stats, out.logits = list(res.token_ids), dict(res.stats), res.logits
            if out.token_ids and out.token_ids[-1] == engine.eos_id:
                out.finish_reason = "stop"
            kept, out.text, stopped = apply_stop(engine, out.token_ids, stop)
            if stopped:
                out.token_ids, out.finish_reason = kept, "stop"
                if out.logits is not None:
                    out.logits = out.logits[:len(kept)]
        if echo:
            full = prompt_logits(engine, ids) if len(ids) > 1 else torch.empty(0, engine.dims.vocab)
            if decode_from is not None:
                if decode_from >= len(ids):
                    raise APIError(400, f"decode_from={decode_from} must be below the prompt length {len(ids)}",
                                   "decode_from", code="invalid_value")
                forced = engine.teacher_forced(ids[:decode_from], ids[decode_from:], cfg)
                full = torch.cat([full[:decode_from - 1], forced.logits])
                if max_tokens == 0:
                    out.stats = dict(forced.stats)
            out.prompt_logits = full
    except PromptError as exc:
        raise APIError(400, str(exc), "prompt", code="invalid_value") from None
    if not out.stats:  # echo only: nothing decoded, nothing bypassed
        out.stats = {"layers_bypassed": 0, "total_tokens": 0, "bypass_ratio": 0.0, "degraded": False,
                     "degraded_reason": None}
    out.stats.setdefault("mode", cfg.mode)
    out.stats.setdefault("sensitivity", cfg.sensitivity)
    out.stats["blocks"] = n_layers
    return out


def top_entries(logits_row: torch.Tensor, n: int) -> list[tuple[int, float]]:
    """The ``n`` most likely (token id, logprob) of one logits row."""
    logp = torch.log_softmax(logits_row.double(), -1)
    vals, idx = logp.topk(n) if n > 0 else (logp[:0], logp[:0].long())
    return [(int(i), float(v)) for i, v in zip(idx.tolist(), vals.tolist())]


def token_logprob(logits_row: torch.Tensor, token: int) -> float:
    return float(torch.log_softmax(logits_row.double(), -1)[token])


def sum_stats(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stats of a multi-prompt request: counts summed, ratio recomputed, degraded if any was."""
    bypassed = sum(int(p["layers_bypassed"]) for p in parts)
    tokens = sum(int(p["total_tokens"]) for p in parts)
    blocks = int(parts[0]["blocks"])
    reasons = [p["degraded_reason"] for p in parts if p.get("degraded_reason")]
    return {"layers_bypassed": bypassed, "total_tokens": tokens,
            "bypass_ratio": bypassed / (blocks * tokens) if tokens else 0.0,
            "degraded": any(p["degraded"] for p in parts), "degraded_reason": reasons[0] if reasons else None,
            "mode": parts[0]["mode"], "sensitivity": float(parts[0]["sensitivity"]), "blocks": blocks}
