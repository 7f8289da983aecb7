"""The engine calls the routes need, run on the worker thread (worker.py): generate from token
ids, logprobs of generated and prompt tokens, the batching rule, stop strings and cancellation
inside the decode, and the text helpers that keep streamed text equal to the final text.

Batching (``max_batch`` > 1): a request that is plain greedy generation (``batch_key`` is not
None: temperature 0, no logprobs, no echo, one prompt, mode off / lossy / static) may share one
``Engine._run`` call with others of the *same key*: the full PruningConfig and max_tokens equal.
Different knobs never share a batch; neither do different max_tokens (we group equal
max_tokens rather than run to the longest and truncate: a truncated row would count pruning
stats and decode work past its own end). Stop strings, chat vs completion and streaming do not
enter the key: each row has its own ``RowControl`` (its stop strings and its Cancel end that
row alone), and streaming is the per-row ``on_token`` hook. Lossless mode, sampling, logprobs
and echo always run alone.

What batching does to the output: the engine left-pads the rows and decodes them together.
With mode off (and static) a row's tokens equal the row's tokens alone (measured: see the README
and ``rsp-bench loadtest``). With mode lossy the router bypasses a block for the batch only when
every row agrees (and a degraded row vetoes every bypass; an unstable router reruns the whole
batch unpruned and marks every row degraded), so a lossy request is pruned no more than alone,
and its tokens and stats can depend on its neighbours. Each response keeps its own row's stats
(``layers_bypassed`` counts the blocks bypassed for that row's tokens) and its ``batch_size``.

Stop strings end the decode as soon as one appears (``RowControl.should_stop``, asked by the
engine after every token), and the answer is then cut just before it (``apply_stop``).

Must not import the harness.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Callable, Hashable, Sequence

import torch

from ..config import PruningConfig
from ..errors import PromptError
from .knobs import APIError
from .worker import Cancel

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


class RowControl:
    """What ends one row of an engine call early, asked by the engine after every token it takes
    (``Engine._run``'s ``on_token`` and ``stop_check``): the request's Cancel (disconnect,
    deadline, shutdown) and its stop strings, matched on the decoded tail as tokens arrive.
    Also forwards each token to the streaming hook and beats the worker's heartbeat."""

    def __init__(self, engine: "Engine", stop: Sequence[str] = (), cancel: Cancel | None = None,
                 on_token: Callable[[int, int, int], None] | None = None,
                 heartbeat: Callable[[], None] | None = None) -> None:
        self.decode = engine.decode
        self.stop = [s for s in stop if s]
        # A stop string of n characters spans at most 4 (n + 1) byte-level tokens (a character is
        # at most 4 byte tokens); decoding only that tail keeps the check cheap on long answers.
        self.window = 4 * (max(map(len, self.stop)) + 1) + 4 if self.stop else 0
        self.cancel = cancel if cancel is not None else Cancel()
        self.cancel.progress = lambda: len(self.toks)
        self.on_token, self.heartbeat = on_token, heartbeat
        self.toks: list[int] = []

    def token(self, row: int, index: int, token: int) -> None:
        del self.toks[index:]  # a degraded rerun starts again from index 0
        self.toks.append(token)
        if self.on_token is not None:
            self.on_token(0, index, token)

    def should_stop(self, row: int = 0) -> bool:
        if self.heartbeat is not None:
            self.heartbeat()
        if self.cancel.reason is not None:
            if self.cancel.at_stop is None:
                self.cancel.at_stop = len(self.toks)
            return True
        if self.stop:
            tail = self.decode(self.toks[-self.window:])
            return any(s in tail for s in self.stop)
        return False


def encode_text(engine: "Engine", text: str, add_special_tokens: bool = True) -> list[int]:
    """The tokenizer on client text. A lone surrogate (valid JSON, not valid UTF-8) makes the
    tokenizer raise; like ``Engine.encode``, tokenize a copy with U+FFFD in its place."""
    text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return list(engine.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def clean_text(text: str) -> str:
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def text_deltas(engine: "Engine", token_ids: Sequence[int], final_text: str) -> list[str]:
    """One text delta per token whose concatenation is exactly ``final_text``: a character split
    across tokens goes out with the token that completes it (never as U+FFFD), and the deltas
    stop where the final text ends (before a stop string)."""
    out, sent = [], ""
    for n in range(1, len(token_ids) + 1):
        text = engine.decode(token_ids[:n]).rstrip("\ufffd")[:len(final_text)]
        if len(text) > len(sent) and text.startswith(sent) and final_text.startswith(text):
            out.append(text[len(sent):])
            sent = text
        else:
            out.append("")
    if out and len(sent) < len(final_text):
        out[-1] += final_text[len(sent):]
    return out


_BYTE_DECODER: dict[str, int] | None = None


def token_bytes(engine: "Engine", token: int) -> list[int]:
    """The UTF-8 bytes a token adds to the text: its own bytes (a byte-level BPE piece may hold
    part of a character), none for a special token (the text skips those)."""
    global _BYTE_DECODER
    tok = engine.tokenizer
    if token in set(tok.all_special_ids):
        return []
    if _BYTE_DECODER is None:
        _BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}
    piece = tok.convert_ids_to_tokens(int(token))
    if _byte_level(tok) and isinstance(piece, str) and piece and all(c in _BYTE_DECODER for c in piece):
        return [_BYTE_DECODER[c] for c in piece]
    return list(tok.decode([int(token)], skip_special_tokens=True).encode("utf-8"))


_BYTE_LEVEL: dict[int, bool] = {}


def _byte_level(tok: Any) -> bool:
    """Whether the tokenizer's pieces are GPT-2 byte-level strings (then a piece is its bytes)."""
    if id(tok) not in _BYTE_LEVEL:
        try:
            decoder = json.loads(tok.backend_tokenizer.to_str()).get("decoder") or {}
        except Exception:  # a slow tokenizer: no backend to ask
            decoder = {}
        kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", []) or []]
        _BYTE_LEVEL[id(tok)] = "ByteLevel" in kinds
    return _BYTE_LEVEL[id(tok)]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def text_offsets(engine: "Engine", token_ids: Sequence[int], start: int = 0) -> list[int]:
    """Character offset in the decoded text (special tokens skipped, as the text skips them) at
    which each token starts, from ``start``."""
    return [start + len(engine.decode(token_ids[:i]).rstrip("\ufffd")) for i in range(len(token_ids))]


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


def chat_ids(engine: "Engine", messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
    """The chat template applied to ``messages`` (role and string content each, see
    schemas.ChatMessage.text): for one user message, exactly ``engine.encode``. A template that
    rejects the messages (roles out of order, two system messages) is a 400 naming them."""
    msgs = [{"role": m["role"], "content": clean_text(m["content"] or "")} for m in messages]
    try:
        ids = engine.tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, tokenize=True)
    except Exception as exc:  # jinja's TemplateError and whatever the template raises
        raise APIError(400, f"the chat template rejected the messages: {type(exc).__name__}: {exc}"[:500],
                       "messages", code="invalid_value") from None
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
                 want_logits: bool, control: RowControl | None = None) -> "GenerationResult":
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

        [res] = generate_lossless(engine, rows, max_new, cfg, log_file,
                                  stop_check=control.should_stop if control is not None else None,
                                  on_token=control.token if control is not None else None)
        if want_logits and res.token_ids:  # lossless output is the unpruned model's by construction
            res.logits = engine.teacher_forced(list(ids), res.token_ids, cfg.override(mode="off", log_level="NONE")).logits
        return res
    [res] = engine._run(rows, max_new, cfg, temperature, seed, None, log_file, keep_logits=want_logits,
                        on_token=control.token if control is not None else None,
                        stop_check=control.should_stop if control is not None else None)
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
                   control: RowControl | None = None) -> Generated:
    """One prompt of a (chat) completion request, everything the response needs. ``control``
    (default: one for ``stop`` alone) ends the decode early; see RowControl."""
    n_layers = engine.dims.n_layers
    out = Generated(list(ids), [], {}, finish_reason="length")
    control = control if control is not None else RowControl(engine, stop)
    try:
        if max_tokens > 0:
            res = generate_ids(engine, prompt_text, ids, max_tokens, cfg, temperature, seed, log_file, want_logits,
                               control)
            _take_result(engine, out, res, stop)
        if echo:
            full = prompt_logits(engine, ids) if len(ids) > 1 else torch.empty(0, engine.dims.vocab)
            if decode_from is not None:
                if decode_from >= len(ids):
                    raise APIError(400, f"decode_from={decode_from} must be below the prompt length {len(ids)}",
                                   "decode_from", code="invalid_value")
                # the cancel (and heartbeat) only: stop strings do not apply to given tokens
                forced = engine.teacher_forced(ids[:decode_from], ids[decode_from:], cfg,
                                               stop_check=RowControl(engine, (), control.cancel, None,
                                                                     control.heartbeat).should_stop)
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
    cancel: Cancel | None = None


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


def run_batch(engine: "Engine", cfg: PruningConfig, max_tokens: int, items: Sequence[BatchItem],
              heartbeat: Callable[[], None] | None = None) -> list[Any]:
    """Greedy generation of several requests of one batch key as one ``Engine._run`` call; one
    ``Generated`` (or an ``APIError``) per item. One item runs exactly as ``run_completion``.
    Each row stops on its own stop strings and Cancel. Should the batched call fail, each item
    is run alone, so one bad row cannot fail the others."""
    controls = [RowControl(engine, it.stop, it.cancel, it.on_token, heartbeat) for it in items]
    if len(items) == 1:
        it = items[0]
        try:
            return [run_completion(engine, it.ids, it.prompt_text, max_tokens, cfg, 0.0, None, it.stop, False, False,
                                   None, it.log_file, controls[0])]
        except APIError as exc:
            return [exc]
    from ..generation import PromptRow

    n_layers = engine.dims.n_layers
    cfg.blacklist_for(n_layers)
    sinks = [it.log_file for it in items]
    log_file = BatchLog(sinks) if any(s is not None for s in sinks) else None
    try:
        results = engine._run([PromptRow(it.prompt_text, list(it.ids)) for it in items], max_tokens, cfg, 0.0, None,
                              None, log_file, keep_logits=False,
                              on_token=lambda row, i, t: controls[row].token(row, i, t),
                              stop_check=lambda row: controls[row].should_stop(row))
    except Exception:
        log.warning("a batch of %d failed; running its requests one at a time", len(items), exc_info=True)
        return [r for it in items for r in run_batch(engine, cfg, max_tokens, [it], heartbeat)]
    outs: list[Any] = []
    for it, res in zip(items, results):
        out = Generated(list(it.ids), [], {}, finish_reason="length")
        _take_result(engine, out, res, it.stop)
        _finish_stats(out, cfg, n_layers)
        outs.append(out)
    return outs


# JSON has no -inf: a token of probability 0 is listed at vLLM's floor instead.
LOGPROB_FLOOR = -9999.0


def top_entries(logits_row: torch.Tensor, n: int) -> list[tuple[int, float]]:
    """The ``n`` most likely (token id, logprob) of one logits row."""
    logp = torch.log_softmax(logits_row.double(), -1)
    vals, idx = logp.topk(n) if n > 0 else (logp[:0], logp[:0].long())
    return [(int(i), max(float(v), LOGPROB_FLOOR)) for i, v in zip(idx.tolist(), vals.tolist())]


def token_logprob(logits_row: torch.Tensor, token: int) -> float:
    return max(float(torch.log_softmax(logits_row.double(), -1)[token]), LOGPROB_FLOOR)


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
            "batch_size": max(int(p.get("batch_size", 1)) for p in parts), "detector": parts[0].get("detector"),
            "router": parts[0].get("router"), "router_fallback": parts[0].get("router_fallback")}
