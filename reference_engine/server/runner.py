"""The engine behind the server: one worker thread fed by a bounded queue, the batching rule,
and the engine calls the routes need (generate from token ids, logprobs of generated and prompt
tokens).

Why one thread: ``Engine`` is not thread-safe (it reuses buffers) and one decode already keeps
the machine's memory bandwidth busy, so engine calls run one at a time, off the event loop.

Batching (``max_batch`` > 1): a request that is plain greedy generation (``batch_key`` is not
None: temperature 0, no logprobs, no echo, one prompt, mode off / lossy / static) may share one
``Engine._run`` call with others of the *same key*: the full PruningConfig and max_tokens equal.
Different knobs never share a batch; neither do different max_tokens (we group equal
max_tokens rather than run to the longest and truncate: a truncated row would count pruning
stats and decode work past its own end). Stop strings, chat vs completion and streaming do not
enter the key: they do not change what the engine decodes (stop strings are applied to each row
afterwards, streaming is the per-row ``on_token`` hook). Lossless mode, sampling, logprobs and
echo always run alone. The worker takes the oldest queued request; if it is batchable it waits
until ``batch_window_s`` after that request arrived (or until ``max_batch`` of its key are
queued; the window starts when the engine becomes free if that is later, so clients answered by
the previous batch can rejoin) and takes every queued request of the same key, oldest first, up
to ``max_batch``: requests of a different key keep their place and run next.

What batching does to the output: the engine left-pads the rows and decodes them together.
With mode off (and static) a row's tokens equal the row's tokens alone (measured: see the README
and ``rsp-bench loadtest``). With mode lossy the router bypasses a block for the batch only when
every row agrees (and a degraded row vetoes every bypass; an unstable router reruns the whole
batch unpruned and marks every row degraded), so a lossy request is pruned no more than alone,
and its tokens and stats can depend on its neighbours. Each response keeps its own row's stats
(``layers_bypassed`` counts the blocks bypassed for that row's tokens) and its ``batch_size``.

The queue is bounded: ``submit`` raises ``QueueFull`` (the route answers 429 with
``Retry-After``) when ``max_queue`` requests are waiting or running. A request whose client
went away before its turn is cancelled, which frees its slot. ``shutdown`` cancels what is still
queued and waits for the running call.

Must not import the harness.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures as cf
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Callable, Hashable, Sequence

import torch

from ..config import PruningConfig
from ..errors import PromptError
from .knobs import APIError

if TYPE_CHECKING:
    from ..engine import Engine, GenerationResult

log = logging.getLogger("reference_engine.server")
# Modes whose requests may share a batch. Off and static are sound: every row runs the same
# blocks alone or together, and batched off answers were measured equal to single ones. Lossy is
# not by default: the router bypasses a block for a batch only when every row agrees, so a
# batched lossy request is pruned (and answered) according to its neighbours; measured with 8
# clients, bypass ratio 0.022 alone against 0.000-0.005 batched. `--batch-modes off,lossy,static`
# turns it on for throughput at that cost. Lossless never batches (batch-1 speculation).
BATCHABLE_MODES = ("off", "lossy", "static")
DEFAULT_BATCH_MODES = ("off", "static")


class QueueFull(Exception):
    pass


def batch_key(cfg: PruningConfig, temperature: float, max_tokens: int, *, logprobs: bool = False,
              echo: bool = False, n_prompts: int = 1,
              modes: Sequence[str] = DEFAULT_BATCH_MODES) -> Hashable | None:
    """The key under which a generation request may share a batch, or None (it runs alone).

    Two requests share a batch only when their keys are equal: the whole PruningConfig (every
    knob: mode, sensitivity, blacklist, log level, watermark, ...) and max_tokens, and only in
    the ``modes`` the server batches (``--batch-modes``)."""
    if temperature != 0.0 or logprobs or echo or n_prompts != 1 or max_tokens < 1:
        return None
    if cfg.mode not in modes:
        return None
    return ("generate", cfg, int(max_tokens))


@dataclass
class _Job:
    fut: cf.Future
    fn: Callable[[], Any] | None         # run alone
    key: Hashable | None = None          # batchable: same key -> may share one batch_fn call
    item: Any = None
    batch_fn: Callable[[list[Any]], list[Any]] | None = None
    t: float = 0.0


class EngineWorker:
    """Runs engine calls on one thread; at most ``max_queue`` requests waiting or running.

    ``submit(fn)`` runs ``fn()`` alone. ``submit(key=k, item=x, batch_fn=f)`` may be run
    together with other queued jobs of key ``k``: ``f([x1, x2, ...])`` returns one result (or an
    exception instance) per item, in order. ``on_batch(n)`` is called with the size of every
    engine call (1 for a job run alone)."""

    def __init__(self, max_queue: int, max_batch: int = 1, batch_window_s: float = 0.0,
                 on_batch: Callable[[int], None] | None = None) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {batch_window_s}")
        self.max_queue, self.max_batch, self.batch_window_s = max_queue, max_batch, batch_window_s
        self.on_batch = on_batch
        self._jobs: collections.deque[_Job] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self.depth = 0  # waiting + running
        self._thread = threading.Thread(target=self._loop, name="rsp-engine", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any] | None = None, *, key: Hashable | None = None, item: Any = None,
               batch_fn: Callable[[list[Any]], list[Any]] | None = None) -> "asyncio.Future[Any]":
        if key is not None and batch_fn is None:
            raise ValueError("a batchable job needs batch_fn")
        if key is None and fn is None:
            if batch_fn is None:
                raise ValueError("submit needs fn or batch_fn")
            fn = (lambda: _one(batch_fn, item))
        fut: cf.Future = cf.Future()
        with self._cv:
            if self._closed:  # the server is stopping
                raise APIError(503, "the server is shutting down", type_="server_error", code="shutting_down")
            if self.depth >= self.max_queue:
                raise QueueFull()
            self.depth += 1
            self._jobs.append(_Job(fut, fn if key is None else None, key, item, batch_fn, time.monotonic()))
            self._cv.notify_all()
        fut.add_done_callback(self._release)  # also on cancel: a cancelled request frees its slot
        return asyncio.wrap_future(fut)

    def _release(self, _: cf.Future) -> None:
        with self._cv:
            self.depth -= 1

    def _take(self) -> list[_Job] | None:
        """The next engine call's jobs (None: closed and drained). Called on the worker thread."""
        free = time.monotonic()
        with self._cv:
            while not self._jobs and not self._closed:
                self._cv.wait()
            if not self._jobs:
                return None
            first = self._jobs[0]
            if first.key is None or self.max_batch == 1:
                return [self._jobs.popleft()]
            # Wait for company up to the window after the oldest request arrived, or after the
            # engine became free if that is later: clients whose answers just left are sending
            # their next request now, and a short wait lets them join instead of forming a
            # second, alternating batch.
            deadline = max(first.t, free) + self.batch_window_s
            while not self._closed:
                same = sum(1 for j in self._jobs if j.key == first.key and not j.fut.cancelled())
                left = deadline - time.monotonic()
                if same >= self.max_batch or left <= 0:
                    break
                self._cv.wait(left)
            batch: list[_Job] = []
            rest: collections.deque[_Job] = collections.deque()
            for j in self._jobs:
                if j.fut.cancelled():
                    continue  # its client went away; its slot was freed when it was cancelled
                if j.key == first.key and len(batch) < self.max_batch:
                    batch.append(j)
                else:
                    rest.append(j)
            self._jobs = rest
            return batch

    def _loop(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            live = [j for j in jobs if j.fut.set_running_or_notify_cancel()]  # drops cancelled ones
            if not live:
                continue
            if self.on_batch is not None:
                try:
                    self.on_batch(len(live))
                except Exception:  # metrics must never stop the worker
                    log.exception("on_batch failed")
            try:
                if live[0].fn is not None:
                    results: list[Any] = [live[0].fn()]
                else:
                    results = list(live[0].batch_fn([j.item for j in live]))  # type: ignore[misc]
                    if len(results) != len(live):
                        raise RuntimeError(f"batch_fn returned {len(results)} results for {len(live)} items")
            except BaseException as exc:  # noqa: BLE001  (every waiting caller gets the error)
                results = [exc] * len(live)
            for j, r in zip(live, results):
                if isinstance(r, BaseException):
                    j.fut.set_exception(r)
                else:
                    j.fut.set_result(r)

    def shutdown(self) -> None:
        """Queued work is cancelled (its callers get an error); the running call finishes."""
        with self._cv:
            self._closed = True
            queued, self._jobs = list(self._jobs), collections.deque()
            self._cv.notify_all()
        for j in queued:
            j.fut.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join()


def _one(batch_fn: Callable[[list[Any]], list[Any]], item: Any) -> Any:
    [r] = batch_fn([item])
    if isinstance(r, BaseException):
        raise r
    return r


async def run_guarded(worker: EngineWorker, fn: Callable[[], Any] | None, is_disconnected: Callable[[], Any],
                      poll_s: float = 0.25, **batch: Any) -> Any:
    """Submit ``fn`` (or a batchable job: ``key``, ``item``, ``batch_fn``) and wait for it;
    cancel it while still queued if the client disconnects."""
    fut = worker.submit(fn, **batch)
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
            _take_result(engine, out, res, stop)
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
    _finish_stats(out, cfg, n_layers)
    return out


def _take_result(engine: "Engine", out: Generated, res: "GenerationResult", stop: Sequence[str]) -> None:
    out.token_ids, out.stats, out.logits = list(res.token_ids), dict(res.stats), res.logits
    if out.token_ids and out.token_ids[-1] == engine.eos_id:
        out.finish_reason = "stop"
    kept, out.text, stopped = apply_stop(engine, out.token_ids, stop)
    if stopped:
        out.token_ids, out.finish_reason = kept, "stop"
        if out.logits is not None:
            out.logits = out.logits[:len(kept)]


def _finish_stats(out: Generated, cfg: PruningConfig, n_layers: int) -> None:
    out.stats.setdefault("mode", cfg.mode)
    out.stats.setdefault("sensitivity", cfg.sensitivity)
    out.stats.setdefault("batch_size", 1)
    out.stats["blocks"] = n_layers


@dataclass
class BatchItem:
    """One batchable request: its prompt, stop strings, log sink and streaming hook. The knobs,
    max_tokens and temperature (0) are its batch key's, shared by the batch."""

    ids: list[int]
    prompt_text: str
    stop: Sequence[str] = ()
    log_file: IO[str] | None = None
    on_token: Callable[[int, int, int], None] | None = None  # called as (0, index, token)


class BatchLog:
    """The engine's log sink for a batch: each JSON line goes to its row's sink (``request`` is
    the row index in the batch; it is rewritten to 0, as alone), lines without one to every row."""

    def __init__(self, sinks: Sequence[IO[str] | None]) -> None:
        self.sinks = list(sinks)

    def write(self, text: str) -> int:
        per: list[list[str]] = [[] for _ in self.sinks]
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                rec = None
            row = rec.get("request") if isinstance(rec, dict) else None
            if isinstance(row, int) and 0 <= row < len(self.sinks):
                per[row].append(json.dumps({**rec, "request": 0}))
            else:
                for lines in per:
                    lines.append(line)
        for sink, lines in zip(self.sinks, per):
            if sink is not None and lines:
                sink.write("\n".join(lines) + "\n")
        return len(text)

    def flush(self) -> None:
        for sink in self.sinks:
            if sink is not None:
                sink.flush()


def run_batch(engine: "Engine", cfg: PruningConfig, max_tokens: int, items: Sequence[BatchItem]) -> list[Any]:
    """Greedy generation of several requests of one batch key as one ``Engine._run`` call; one
    ``Generated`` (or an ``APIError``) per item. One item runs exactly as ``run_completion``.
    Should the batched call fail, each item is run alone, so one bad row cannot fail the others."""
    if len(items) == 1:
        it = items[0]
        try:
            return [run_completion(engine, it.ids, it.prompt_text, max_tokens, cfg, 0.0, None, it.stop, False, False,
                                   None, it.log_file, it.on_token)]
        except APIError as exc:
            return [exc]
    from ..generation import PromptRow

    n_layers = engine.dims.n_layers
    cfg.blacklist_for(n_layers)

    def on_token(row: int, index: int, token: int) -> None:
        hook = items[row].on_token
        if hook is not None:
            hook(0, index, token)

    sinks = [it.log_file for it in items]
    log_file = BatchLog(sinks) if any(s is not None for s in sinks) else None
    try:
        results = engine._run([PromptRow(it.prompt_text, list(it.ids)) for it in items], max_tokens, cfg, 0.0, None,
                              None, log_file, keep_logits=False, on_token=on_token)
    except Exception:
        log.warning("a batch of %d failed; running its requests one at a time", len(items), exc_info=True)
        return [r for it in items for r in run_batch(engine, cfg, max_tokens, [it])]
    outs: list[Any] = []
    for it, res in zip(items, results):
        out = Generated(list(it.ids), [], {}, finish_reason="length")
        _take_result(engine, out, res, it.stop)
        _finish_stats(out, cfg, n_layers)
        outs.append(out)
    return outs


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
            "mode": parts[0]["mode"], "sensitivity": float(parts[0]["sensitivity"]), "blocks": blocks,
            "batch_size": max(int(p.get("batch_size", 1)) for p in parts)}
