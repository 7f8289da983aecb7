"""The FastAPI application: thin route handlers over runner.py, OpenAI-style errors, metrics.

``create_app(engine, ServerSettings(...))`` builds the app; ``rsp-bench serve`` runs it under
uvicorn (main.py). Routes: POST /v1/chat/completions, POST /v1/completions, POST /tokenize,
POST /detokenize, GET /tokenizer_info (vLLM's shapes, for lm-eval's ``tokenizer_backend=remote``),
GET /v1/models, GET /health, GET /metrics (Prometheus text format).

Every response carries ``X-Request-Id``; generation responses also ``X-Pruning-Stats`` and the
same stats under ``pruning`` in the body, and ``X-Batch-Size`` (``pruning.batch_size``): how many
requests were decoded together with this one (batching: runner.py). Errors are ``{"error": {message, type, param, code}}``:
400 for a bad value or header, 422 for a body that does not match the schema, 404 for an
unknown model or route, 429 with ``Retry-After`` when the queue is full; a 500 is a bug and
never carries a traceback. Must not import the harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, AsyncIterator, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import PruningConfig
from . import runner, schemas as S
from .knobs import APIError, request_config, stats_header
from .metrics import ServerMetrics

if TYPE_CHECKING:
    from ..engine import Engine

log = logging.getLogger("reference_engine.server")
DEFAULT_CHAT_MAX_TOKENS = 128


@dataclass
class ServerSettings:
    default_config: PruningConfig
    max_queue: int = 32
    retry_after_s: int = 1
    max_batch: int = 8            # requests of one batch key per engine call; 1 disables batching
    batch_window_ms: float = 10.0  # how long the oldest batchable request waits for company
    batch_modes: tuple[str, ...] = runner.DEFAULT_BATCH_MODES  # modes whose requests may share a batch
    served_model_name: str | None = None
    log_file: IO[str] | None = None  # JSON-lines engine logs, tagged with request ids


def _error(status: int, message: str, param: str | None = None, type_: str = "invalid_request_error",
           code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    body = S.ErrorResponse(error=S.ErrorBody(message=message, type=type_, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _loc_name(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def create_app(engine: "Engine", settings: ServerSettings) -> FastAPI:
    """The OpenAI-compatible app serving ``engine`` (already loaded and calibrated)."""
    metrics = ServerMetrics(lambda: worker.depth)
    worker = runner.EngineWorker(settings.max_queue, settings.max_batch, settings.batch_window_ms / 1000.0,
                                 on_batch=metrics.observe_batch)
    model_name = settings.served_model_name or engine.name
    log_lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        worker.shutdown()  # after uvicorn's graceful drain: cancels what is still queued

    app = FastAPI(title="rsp-bench reference engine", version="0.1.0", lifespan=lifespan)
    app.state.worker, app.state.metrics, app.state.engine = worker, metrics, engine

    # ---- errors ----
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.param, exc.type, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            return _error(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}",
                          "body", code="invalid_json")
        param = _loc_name(first.get("loc", ()))
        got = first.get("input", None)
        got_text = "" if first.get("type") == "missing" else f", got {json.dumps(got, default=str)[:200]}"
        return _error(422, f"{param}: {first.get('msg', 'invalid value')}{got_text}", param, code=first.get("type"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", None,
                      code="not_found" if exc.status_code == 404 else None)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return _error(500, f"internal error ({type(exc).__name__}); see the server log", None, "server_error")

    @app.middleware("http")
    async def _request_id(request: Request, call_next):
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        request.state.request_id = rid
        t0 = time.perf_counter()
        response = await call_next(request)
        response.headers["X-Request-Id"] = rid
        metrics.observe(request.url.path, response.status_code, time.perf_counter() - t0)
        return response

    # ---- helpers ----
    def check_model(name: str | None) -> None:
        if name not in (None, "", model_name, engine.name):
            raise APIError(404, f"model {name!r} is not served here; this server serves {model_name!r}", "model",
                           code="model_not_found")

    def config_for(request: Request, body: S.PruningBody | None) -> PruningConfig:
        return request_config(settings.default_config, request.headers, body, engine.dims.n_layers)

    def log_for(request: Request) -> IO[str] | None:
        if settings.log_file is None:
            return None
        return runner.TaggedLog(settings.log_file, request.state.request_id, log_lock)

    def queue_full() -> APIError:
        metrics.rejected.inc()
        return APIError(429, f"the request queue is full ({worker.max_queue} requests waiting or running); "
                             f"retry after {settings.retry_after_s} s", None, "rate_limit_error", "queue_full",
                        {"Retry-After": str(settings.retry_after_s)})

    async def run(request: Request, fn, **batch: Any) -> Any:
        try:
            return await runner.run_guarded(worker, fn, request.is_disconnected, **batch)
        except runner.QueueFull:
            raise queue_full() from None

    def submit(fn, **batch: Any) -> "asyncio.Future[Any]":
        try:
            return worker.submit(fn, **batch)
        except runner.QueueFull:
            raise queue_full() from None

    def batched(key: Any, cfg: PruningConfig, max_tokens: int, item: runner.BatchItem) -> dict[str, Any]:
        """The worker's arguments for a batchable request (see runner.batch_key): requests of one
        key are equal in cfg and max_tokens, so any one's batch_fn serves the batch."""
        return {"key": key, "item": item, "batch_fn": lambda items: runner.run_batch(engine, cfg, max_tokens, items)}

    def tok_str(t: int, as_ids: bool = False) -> str:
        return f"token_id:{t}" if as_ids else engine.tokenizer.decode([t], skip_special_tokens=False)

    def stop_list(stop: str | list[str] | None) -> list[str]:
        return [stop] if isinstance(stop, str) else list(stop or [])

    def headers_for(request: Request, stats: dict[str, Any]) -> dict[str, str]:
        return {"X-Pruning-Stats": stats_header(stats), "X-Request-Id": request.state.request_id,
                "X-Batch-Size": str(int(stats.get("batch_size", 1)))}

    def live_stream(request: Request, body: S.ChatCompletionRequest, ids: list[int], prompt_text: str,
                    max_tokens: int, cfg: PruningConfig, lf: IO[str] | None) -> StreamingResponse:
        """A chat stream whose chunks leave as the engine decodes (the engine's ``on_token``
        hook feeds an asyncio queue from the worker thread). The pruning stats are known only at
        the end: they come in the last chunk's ``pruning`` object (and the usage chunk), not in
        an ``X-Pruning-Stats`` header. A lossy request the router degrades after the fact is
        rerun unpruned; the stream goes on from the rerun when it agrees with what was sent,
        else it ends with an error event (never a silently different answer)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        done = object()
        stop = stop_list(body.stop)

        def on_token(row: int, index: int, token: int) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (index, token))

        def work() -> runner.Generated:
            return runner.run_completion(engine, ids, prompt_text, max_tokens, cfg, float(body.temperature or 0.0),
                                         body.seed, stop, False, False, None, lf, on_token)

        key = runner.batch_key(cfg, float(body.temperature or 0.0), max_tokens, modes=settings.batch_modes)
        if key is not None:  # streamed rows batch too: each row's tokens reach its own queue
            fut = submit(None, **batched(key, cfg, max_tokens, runner.BatchItem(ids, prompt_text, stop, lf, on_token)))
        else:
            fut = submit(work)
        fut.add_done_callback(lambda _: queue.put_nowait(done))
        rid = f"chatcmpl-{request.state.request_id}"
        created = int(time.time())
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name}

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
            return _sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                         **extra})

        async def events() -> AsyncIterator[str]:
            try:
                yield chunk({"role": "assistant", "content": ""})
                sent, toks = "", []
                while (item := await queue.get()) is not done:
                    index, token = item
                    toks = toks[:index] + [token]
                    safe, _ = runner.stream_safe_text(engine.decode(toks), stop)
                    if len(safe) > len(sent) and safe.startswith(sent):
                        yield chunk({"content": safe[len(sent):]})
                        sent = safe
                try:
                    gen = fut.result()
                except APIError as exc:
                    yield _sse({"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}})
                    yield "data: [DONE]\n\n"
                    return
                metrics.record(gen.stats, len(ids), len(gen.token_ids))
                stats = S.PruningStats(**_pruning_fields(gen.stats)).model_dump()
                if not gen.text.startswith(sent):
                    log.warning("request %s: the degraded rerun changed tokens already streamed", request.state.request_id)
                    yield _sse({"error": {"message": "the router degraded this request after the fact and the unpruned "
                                          "rerun differs from the tokens already streamed; retry without stream",
                                          "type": "server_error", "param": None, "code": "stream_diverged"}})
                    yield "data: [DONE]\n\n"
                    return
                if len(gen.text) > len(sent):
                    yield chunk({"content": gen.text[len(sent):]})
                yield chunk({}, gen.finish_reason, pruning=stats)
                if include_usage:
                    usage = S.Usage(prompt_tokens=len(ids), completion_tokens=len(gen.token_ids),
                                    total_tokens=len(ids) + len(gen.token_ids))
                    yield _sse({**base, "choices": [], "usage": usage.model_dump(), "pruning": stats})
                yield "data: [DONE]\n\n"
            finally:
                if not fut.done():
                    fut.cancel()  # the client went away: a queued request frees its slot

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"X-Request-Id": request.state.request_id})

    # ---- generation ----
    @app.post("/v1/chat/completions", response_model=S.ChatCompletionResponse)
    async def chat_completions(body: S.ChatCompletionRequest, request: Request):
        check_model(body.model)
        cfg = config_for(request, body.pruning)
        messages = []
        for i, m in enumerate(body.messages):
            content = m.content
            if isinstance(content, list):  # OpenAI content parts: only text parts are served
                texts = []
                for part in content:
                    if part.get("type") != "text":
                        raise APIError(400, f"content part type {part.get('type')!r} is not supported (text only)",
                                       f"messages.{i}.content", code="invalid_value")
                    texts.append(str(part.get("text", "")))
                content = "".join(texts)
            messages.append({"role": m.role, "content": content or ""})
        max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_CHAT_MAX_TOKENS
        want_logprobs = bool(body.logprobs)
        n_top = body.top_logprobs or 0
        try:
            ids = runner.chat_ids(engine, messages)
        except Exception as exc:  # a template that rejects the roles, e.g. two system messages
            raise APIError(400, f"the chat template rejected the messages: {exc}", "messages",
                           code="invalid_value") from None
        runner.check_fit(engine, ids, max_tokens, "messages")
        users = [m["content"] for m in messages]
        prompt_text = users[0] if len(users) == 1 else "\n".join(users)
        lf = log_for(request)
        if body.stream and not want_logprobs and cfg.mode != "lossless":
            return live_stream(request, body, ids, prompt_text, max_tokens, cfg, lf)
        key = runner.batch_key(cfg, float(body.temperature or 0.0), max_tokens, logprobs=want_logprobs, modes=settings.batch_modes)
        if key is not None:
            gen = await run(request, None, **batched(key, cfg, max_tokens,
                                                     runner.BatchItem(ids, prompt_text, stop_list(body.stop), lf)))
        else:
            gen = await run(request, lambda: runner.run_completion(
                engine, ids, prompt_text, max_tokens, cfg, float(body.temperature or 0.0), body.seed,
                stop_list(body.stop), want_logprobs, False, None, lf))
        metrics.record(gen.stats, len(ids), len(gen.token_ids))
        stats = S.PruningStats(**_pruning_fields(gen.stats))
        usage = S.Usage(prompt_tokens=len(ids), completion_tokens=len(gen.token_ids),
                        total_tokens=len(ids) + len(gen.token_ids))
        logprobs = None
        if want_logprobs and gen.logits is not None:
            content = []
            as_ids = body.return_tokens_as_token_ids
            for t, row in zip(gen.token_ids, gen.logits):
                tops = [S.TopLogprob(token=tok_str(i, as_ids), logprob=v, bytes=list(tok_str(i).encode()))
                        for i, v in runner.top_entries(row, n_top)]
                s = tok_str(t, as_ids)
                content.append(S.TokenLogprob(token=s, logprob=runner.token_logprob(row, t), bytes=list(tok_str(t).encode()),
                                              top_logprobs=tops))
            logprobs = S.ChatLogprobs(content=content)
        rid = f"chatcmpl-{request.state.request_id}"
        created = int(time.time())
        headers = headers_for(request, gen.stats)
        if not body.stream:
            resp = S.ChatCompletionResponse(
                id=rid, created=created, model=model_name, usage=usage, pruning=stats,
                choices=[S.ChatChoice(index=0, message=S.ChatResponseMessage(content=gen.text), logprobs=logprobs,
                                      finish_reason=gen.finish_reason)])
            return JSONResponse(resp.model_dump(), headers=headers)

        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def events() -> AsyncIterator[str]:
            base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name}
            yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]})
            prev = ""
            for n, t in enumerate(gen.token_ids, 1):
                # capped at the final text, which ends before a stop string
                text = engine.decode(gen.token_ids[:n])[:len(gen.text)]
                delta, prev = text[len(prev):], text
                lp = None
                if logprobs is not None:
                    lp = {"content": [logprobs.content[n - 1].model_dump()]}
                yield _sse({**base, "choices": [{"index": 0, "delta": {"content": delta}, "logprobs": lp,
                                                 "finish_reason": None}]})
                await asyncio.sleep(0)
            yield _sse({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                             "finish_reason": gen.finish_reason}], "pruning": stats.model_dump()})
            if include_usage:
                yield _sse({**base, "choices": [], "usage": usage.model_dump(), "pruning": stats.model_dump()})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    @app.post("/v1/completions", response_model=S.CompletionResponse)
    async def completions(body: S.CompletionRequest, request: Request):
        check_model(body.model)
        cfg = config_for(request, body.pruning)
        if body.stream:
            raise APIError(400, "stream=true is served on /v1/chat/completions only", "stream", code="unsupported")
        if body.max_tokens == 0 and not body.echo:
            raise APIError(400, "max_tokens=0 needs echo=true (nothing would be returned)", "max_tokens",
                           code="invalid_value")
        if body.decode_from is not None and not body.echo:
            raise APIError(400, "decode_from needs echo=true", "decode_from", code="invalid_value")
        prompts = _prompt_list(body.prompt)
        encoded = []
        for i, p in enumerate(prompts):
            ids = list(engine.tokenizer(p, add_special_tokens=True)["input_ids"]) if isinstance(p, str) else list(p)
            param = "prompt" if len(prompts) == 1 else f"prompt.{i}"
            runner.check_fit(engine, ids, body.max_tokens, param)
            encoded.append((p if isinstance(p, str) else engine.decode(ids), ids))
        want = body.logprobs is not None
        lf = log_for(request)

        def work() -> list[runner.Generated]:
            return [runner.run_completion(engine, ids, text, body.max_tokens, cfg, float(body.temperature or 0.0),
                                          body.seed, stop_list(body.stop), want, body.echo, body.decode_from, lf)
                    for text, ids in encoded]

        key = runner.batch_key(cfg, float(body.temperature or 0.0), body.max_tokens, logprobs=want, echo=body.echo,
                               n_prompts=len(encoded), modes=settings.batch_modes)
        if key is not None and body.decode_from is None:
            text, ids = encoded[0]
            gens = [await run(request, None, **batched(key, cfg, body.max_tokens,
                                                       runner.BatchItem(ids, text, stop_list(body.stop), lf)))]
        else:
            gens = await run(request, work)
        choices = []
        n_prompt = n_out = 0
        for index, g in enumerate(gens):
            n_prompt += len(g.prompt_ids)
            n_out += len(g.token_ids)
            metrics.record(g.stats, len(g.prompt_ids), len(g.token_ids))
            text = (engine.decode(g.prompt_ids) if body.echo else "") + g.text
            lp = _completion_logprobs(g, body, tok_str) if want else None
            choices.append(S.CompletionChoice(index=index, text=text, logprobs=lp, finish_reason=g.finish_reason,
                                              pruning=S.PruningStats(**_pruning_fields(g.stats))))
        total = runner.sum_stats([g.stats for g in gens])
        resp = S.CompletionResponse(id=f"cmpl-{request.state.request_id}", created=int(time.time()), model=model_name,
                                    choices=choices, usage=S.Usage(prompt_tokens=n_prompt, completion_tokens=n_out,
                                                                   total_tokens=n_prompt + n_out),
                                    pruning=S.PruningStats(**total))
        return JSONResponse(resp.model_dump(), headers=headers_for(request, total))

    # ---- tokenizer (vLLM shapes) ----
    @app.post("/tokenize")
    async def tokenize(body: S.TokenizeRequest):
        check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt or messages", "prompt", code="invalid_value")
        if body.prompt is not None:
            ids = list(engine.tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"])
        else:
            ids = runner.chat_ids(engine, [m.model_dump() for m in body.messages])
        out: dict[str, Any] = {"count": len(ids), "max_model_len": engine.dims.max_positions, "tokens": ids}
        out["token_strs"] = engine.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return out

    @app.post("/detokenize")
    async def detokenize(body: S.DetokenizeRequest):
        check_model(body.model)
        bad = next((t for t in body.tokens if not 0 <= t < engine.dims.vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is out of range for a vocabulary of {engine.dims.vocab}", "tokens",
                           code="invalid_value")
        return {"prompt": engine.tokenizer.decode(body.tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        tok = engine.tokenizer
        return {"tokenizer_class": type(tok).__name__, "eos_token": tok.eos_token, "bos_token": tok.bos_token,
                "pad_token": tok.pad_token, "unk_token": tok.unk_token, "chat_template": tok.chat_template,
                "model_max_length": engine.dims.max_positions, "vocab_size": engine.dims.vocab}

    # ---- service ----
    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "rsp-bench", "max_model_len": engine.dims.max_positions}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "queue_depth": worker.depth, "max_queue": worker.max_queue}

    @app.get("/metrics")
    async def prometheus():
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    return app


def _pruning_fields(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: stats[k] for k in S.PruningStats.model_fields if k in stats}


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _prompt_list(prompt: S.PromptType) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt must not be empty", "prompt", code="invalid_value")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]


def _completion_logprobs(g: runner.Generated, body: S.CompletionRequest, tok_str) -> S.CompletionLogprobs:
    n = int(body.logprobs or 0)
    as_ids = body.return_tokens_as_token_ids
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = 0

    def add(t: int, row) -> None:
        nonlocal offset
        s = tok_str(t, as_ids)
        tokens.append(s)
        offsets.append(offset)
        offset += len(tok_str(t))
        if row is None:
            token_lps.append(None)
            tops.append(None)
            return
        token_lps.append(runner.token_logprob(row, t))
        top = {tok_str(i, as_ids): v for i, v in runner.top_entries(row, n)}
        top.setdefault(s, token_lps[-1])  # OpenAI: the sampled token is always listed
        tops.append(top)

    if body.echo:
        for i, t in enumerate(g.prompt_ids):
            add(t, None if i == 0 else g.prompt_logits[i - 1])
    for j, t in enumerate(g.token_ids):
        add(t, g.logits[j] if g.logits is not None else None)
    return S.CompletionLogprobs(tokens=tokens, token_logprobs=token_lps, top_logprobs=tops, text_offset=offsets)
