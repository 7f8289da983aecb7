"""Response bodies and server-sent events built from runner.Generated: logprobs (token bytes and
text offsets that agree with the text), the buffered stream, and the live stream's events.

Both streams send text deltas whose concatenation equals the non-streamed answer: a character
split across tokens goes out whole with the token that completes it (never U+FFFD), text that
could still become a stop string is held back, and the deltas stop where the final text ends.
A stream that fails after its 200 header ends with an error event and ``[DONE]``.

Must not import the harness.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Sequence

from . import runner, schemas as S
from .knobs import APIError

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger("reference_engine.server")


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


DONE = "data: [DONE]\n\n"


def error_event(exc: BaseException) -> str:
    if isinstance(exc, APIError):
        return sse({"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}})
    return sse({"error": {"message": f"internal error ({type(exc).__name__}); see the server log",
                          "type": "server_error", "param": None, "code": "internal_error"}})


def pruning_fields(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: stats[k] for k in S.PruningStats.model_fields if k in stats}


def tok_str(engine: "Engine", t: int, as_ids: bool = False) -> str:
    return f"token_id:{t}" if as_ids else engine.tokenizer.decode([t], skip_special_tokens=False)


def chat_logprobs(engine: "Engine", gen: runner.Generated, n_top: int, as_ids: bool) -> S.ChatLogprobs:
    content = []
    for t, row in zip(gen.token_ids, gen.logits):
        tops = [S.TopLogprob(token=tok_str(engine, i, as_ids), logprob=v, bytes=runner.token_bytes(engine, i))
                for i, v in runner.top_entries(row, n_top)]
        content.append(S.TokenLogprob(token=tok_str(engine, t, as_ids), logprob=runner.token_logprob(row, t),
                                      bytes=runner.token_bytes(engine, t), top_logprobs=tops))
    return S.ChatLogprobs(content=content)


def completion_logprobs(engine: "Engine", g: runner.Generated, n: int, echo: bool, as_ids: bool) -> S.CompletionLogprobs:
    """OpenAI's completions logprobs; ``text_offset`` indexes the returned text (which skips
    special tokens: a special token starts where the text after it starts)."""
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []

    def add(t: int, row) -> None:
        s = tok_str(engine, t, as_ids)
        tokens.append(s)
        if row is None:
            token_lps.append(None)
            tops.append(None)
            return
        token_lps.append(runner.token_logprob(row, t))
        top = {tok_str(engine, i, as_ids): v for i, v in runner.top_entries(row, n)}
        top.setdefault(s, token_lps[-1])  # OpenAI: the sampled token is always listed
        tops.append(top)

    start = 0
    if echo:
        for i, t in enumerate(g.prompt_ids):
            add(t, None if i == 0 else g.prompt_logits[i - 1])
        offsets += runner.text_offsets(engine, g.prompt_ids)
        start = len(engine.decode(g.prompt_ids))
    for j, t in enumerate(g.token_ids):
        add(t, g.logits[j] if g.logits is not None else None)
    offsets += [min(o, start + len(g.text)) for o in runner.text_offsets(engine, g.token_ids, start)]
    return S.CompletionLogprobs(tokens=tokens, token_logprobs=token_lps, top_logprobs=tops, text_offset=offsets)


async def buffered_chat_events(engine: "Engine", gen: runner.Generated, base: dict[str, Any],
                               logprobs: S.ChatLogprobs | None, stats: S.PruningStats, usage: S.Usage | None
                               ) -> AsyncIterator[str]:
    """A stream of an answer already complete (stream with logprobs, or lossless mode)."""
    yield sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]})
    deltas = runner.text_deltas(engine, gen.token_ids, gen.text)
    for n, delta in enumerate(deltas):
        lp = {"content": [logprobs.content[n].model_dump()]} if logprobs is not None else None
        yield sse({**base, "choices": [{"index": 0, "delta": {"content": delta}, "logprobs": lp,
                                        "finish_reason": None}]})
        await asyncio.sleep(0)
    yield sse({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": gen.finish_reason}],
               "pruning": stats.model_dump()})
    if usage is not None:
        yield sse({**base, "choices": [], "usage": usage.model_dump(), "pruning": stats.model_dump()})
    yield DONE


async def live_chat_events(engine: "Engine", fut: "asyncio.Future[runner.Generated]", queue: asyncio.Queue,
                           done: object, base: dict[str, Any], stop: Sequence[str], n_prompt: int,
                           include_usage: bool, after: Callable[[Any], runner.Generated]) -> AsyncIterator[str]:
    """The live stream: a delta whenever the decoded text grows past what may be held back.
    ``after(result)`` turns the finished call's result into its Generated (it raises for a
    timeout or shutdown) and records it."""

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                    **extra})

    yield chunk({"role": "assistant", "content": ""})
    try:
        sent, toks = "", []
        while (item := await queue.get()) is not done:
            index, token = item
            toks = toks[:index] + [token]
            safe, _ = runner.stream_safe_text(engine.decode(toks), stop)
            if len(safe) > len(sent) and safe.startswith(sent):
                yield chunk({"content": safe[len(sent):]})
                sent = safe
        gen = after(fut.result())
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # an APIError (timeout, worker down) or a bug: end the stream properly
        if not isinstance(exc, APIError):
            log.error("live stream failed", exc_info=exc)
        yield error_event(exc)
        yield DONE
        return
    stats = S.PruningStats(**pruning_fields(gen.stats)).model_dump()
    if not gen.text.startswith(sent):
        log.warning("a degraded rerun changed tokens already streamed")
        yield error_event(APIError(500, "the router degraded this request after the fact and the unpruned rerun "
                                        "differs from the tokens already streamed; retry without stream", None,
                                   "server_error", "stream_diverged"))
        yield DONE
        return
    if len(gen.text) > len(sent):
        yield chunk({"content": gen.text[len(sent):]})
    yield chunk({}, gen.finish_reason, pruning=stats)
    if include_usage:
        usage = S.Usage(prompt_tokens=n_prompt, completion_tokens=len(gen.token_ids),
                        total_tokens=n_prompt + len(gen.token_ids))
        yield sse({**base, "choices": [], "usage": usage.model_dump(), "pruning": stats})
    yield DONE
