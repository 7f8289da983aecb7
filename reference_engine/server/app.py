"""The FastAPI application: thin route handlers over the worker (worker.py) and the engine calls
(runner.py), OpenAI-style errors, metrics.

``create_app(engine, ServerSettings(...))`` builds the app; ``rsp-bench serve`` runs it under
uvicorn (main.py). Routes: POST /v1/chat/completions, POST /v1/completions, POST /tokenize,
POST /detokenize, GET /tokenizer_info (vLLM's shapes, for lm-eval's ``tokenizer_backend=remote``),
GET /v1/models, GET /health, GET /metrics (Prometheus text format).

A generation request goes: guard.py (request id, Host, API key, body size) -> admission (a queue
slot, else 429 with ``Retry-After``) -> preparation on a thread of its own, off the event loop
(JSON parsing, limits, knobs, chat template, tokenization) -> the engine worker -> formatting.
Every response carries ``X-Request-Id``; generation responses also ``X-Pruning-Stats``, the same
stats under ``pruning`` in the body, and ``X-Batch-Size``. Errors are ``{"error": {message, type,
param, code}}``: 400 for a bad value, header or body (OpenAI's and vLLM's answer; never 422),
401 without the API key, 404 for an unknown model or route, 413 for a body over the limit, 429
when the queue is full, 503 when the worker is down or the server is stopping, 504 past the
request timeout; a 500 is a bug and never carries a traceback. Must not import the harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Callable, Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..config import PruningConfig
from . import limits as L, output as O, runner, schemas as S
from .guard import BodyTooLarge, Guard
from .knobs import APIError, request_config, stats_header
from .metrics import ServerMetrics
from .worker import Cancel, ClientGone, EngineWorker, QueueFull, Ticket, cancel_error, run_guarded

log = logging.getLogger("reference_engine.server")

if TYPE_CHECKING:
    from ..engine import Engine

DEFAULT_CHAT_MAX_TOKENS = 128
_ERRORS = {code: {"model": S.ErrorResponse} for code in (400, 401, 404, 413, 429, 500, 503, 504)}


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
    limits: L.Limits = field(default_factory=L.Limits)
    api_key: str | None = None       # required on /v1 routes when set
    allowed_hosts: Iterable[str] | None = None  # Host names answered (None: any); main.py sets loopback's
    hang_s: float = 120.0            # engine silence after which the worker counts as hung
    shutdown_deadline_s: float = 5.0  # how long shutdown waits for a cancelled engine call


class JSONOut(JSONResponse):
    """JSON that survives a lone surrogate in a string (echoed input): escaped, never a 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            import json

            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def _error(exc: APIError) -> JSONResponse:
    body = S.ErrorResponse(error=S.ErrorBody(message=exc.message, type=exc.type, param=exc.param, code=exc.code))
    return JSONOut(body.model_dump(), status_code=exc.status, headers=exc.headers)


def _body_schema(model: type) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


@dataclass
class _Prepared:
    """A generation request after preparation: everything the engine call and the answer need."""

    body: Any
    cfg: PruningConfig
    prompts: list[tuple[str, list[int]]]  # (text for the degradation check, token ids)
    max_tokens: int
    stop: list[str]
    temperature: float


def create_app(engine: "Engine", settings: ServerSettings) -> Guard:
    """The OpenAI-compatible app serving ``engine`` (already loaded and calibrated), wrapped in
    guard.Guard; the FastAPI app is ``.app`` (and ``.state``'s worker, metrics, engine)."""
    lim = settings.limits
    metrics = ServerMetrics(lambda: worker.depth, lambda: worker.alive)
    worker = EngineWorker(settings.max_queue, settings.max_batch, settings.batch_window_ms / 1000.0,
                          on_batch=metrics.observe_batch, timeout_s=lim.request_timeout_s, hang_s=settings.hang_s,
                          on_cancelled=metrics.observe_cancel)
    # One preparation thread: the tokenizer is shared with the engine thread, and one thread
    # bounds what parsing can take from the machine; admission bounds what waits for it.
    prep_pool = ThreadPoolExecutor(1, thread_name_prefix="rsp-prep")
    model_name = settings.served_model_name or engine.name
    log_lock = threading.Lock()
    vocab_chars = max((len(t) for t in engine.tokenizer.get_vocab()), default=1)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        # after uvicorn's graceful drain: fail what is queued, cancel what runs, wait a bounded time
        await asyncio.get_running_loop().run_in_executor(None, worker.shutdown, settings.shutdown_deadline_s)
        prep_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="rsp-bench reference engine", version="0.1.0", lifespan=lifespan)
    app.state.worker, app.state.metrics, app.state.engine = worker, metrics, engine

    # ---- errors ----
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        return _error(APIError(413, f"the body is above this server's limit of {lim.max_body_bytes} bytes "
                                    "(--max-body-bytes)", "body", code="body_too_large"))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(L.validation_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(APIError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", None,
                               code="not_found" if exc.status_code == 404 else None))

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        log.info("client went away before its answer (request %s)", request.state.request_id)
        return Response(status_code=499)  # nginx's "client closed request": logged, never received

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        return _error(APIError(500, f"internal error ({type(exc).__name__}); see the server log for request "
                                    f"{request.state.request_id}", None, "server_error", "internal_error"))

    # ---- admission and preparation ----
    def admit() -> Ticket:
        try:
            return worker.admit()
        except QueueFull:
            metrics.rejected.inc()
            raise APIError(429, f"the request queue is full ({worker.max_queue} requests admitted); retry after "
                                f"{settings.retry_after_s} s", None, "rate_limit_error", "queue_full",
                           {"Retry-After": str(settings.retry_after_s)}) from None

    async def off_loop(fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(prep_pool, fn)

    def check_model(name: str | None) -> None:
        if name not in (None, "", model_name, engine.name):
            raise APIError(404, f"model {name!r} is not served here; this server serves {model_name!r}", "model",
                           code="model_not_found")

    def config_for(request: Request, body: Any) -> PruningConfig:
        cfg = request_config(settings.default_config, request.headers, body.pruning, engine.dims.n_layers)
        asked = (body.pruning is not None and body.pruning.router is not None) or "x-pruning-router" in request.headers
        if asked and cfg.router == "unit" and cfg.prunes and not engine.unit_predictor_available():
            where = "pruning.router" if body.pruning and body.pruning.router else "X-Pruning-Router"
            # training a predictor takes about half an hour of CPU: never inside a request. A
            # request that did not ask for a router gets the engine's fallback (the block router,
            # named in its stats' router and router_fallback).
            raise APIError(400, f"{where} 'unit': no unit-router predictor for this model's weights; "
                                "`rsp-bench calibrate --model ...` trains one", where, code="invalid_value")
        if cfg.log_level != settings.default_config.log_level:
            where = "pruning.log_level" if body.pruning and body.pruning.log_level else "X-Pruning-Log-Level"
            L.check_log_level(cfg.log_level, where, lim)
        return cfg

    def fits_text(text_chars: int, max_tokens: int, param: str) -> None:
        # no token is longer than vocab_chars characters: a text this long cannot fit, so it is
        # refused without tokenizing megabytes
        ctx = engine.dims.max_positions
        if text_chars > 2 * vocab_chars * ctx:
            raise APIError(400, f"the prompt is {text_chars} characters: at least {text_chars // vocab_chars} "
                                f"tokens, beyond the model's context of {ctx} tokens", param,
                           code="context_length_exceeded")

    def common(request: Request, body: Any, max_tokens: int) -> tuple[PruningConfig, list[str], float]:
        check_model(body.model)
        L.refuse_unsupported(body)
        L.check_max_tokens(max_tokens, lim)
        return config_for(request, body), L.stop_strings(body.stop, lim), float(body.temperature or 0.0)

    def prepare_chat(request: Request, raw: bytes) -> _Prepared:
        body = L.parse_body(S.ChatCompletionRequest, raw)
        max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_CHAT_MAX_TOKENS
        if body.top_logprobs and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs", code="invalid_value")
        cfg, stop, temperature = common(request, body, max_tokens)
        messages = []
        for i, m in enumerate(body.messages):
            try:
                messages.append({"role": m.role, "content": m.text(f"messages.{i}.content")})
            except ValueError as exc:
                raise APIError(400, str(exc), f"messages.{i}.content", code="invalid_value") from None
        fits_text(sum(len(m["content"]) for m in messages), max_tokens, "messages")
        ids = runner.chat_ids(engine, messages)
        runner.check_fit(engine, ids, max_tokens, "messages")
        users = [m["content"] for m in messages]
        return _Prepared(body, cfg, [(users[0] if len(users) == 1 else "\n".join(users), ids)], max_tokens, stop,
                         temperature)

    def prepare_completion(request: Request, raw: bytes) -> _Prepared:
        body = L.parse_body(S.CompletionRequest, raw)
        cfg, stop, temperature = common(request, body, body.max_tokens)
        if body.stream:
            raise APIError(400, "stream=true is served on /v1/chat/completions only", "stream", code="unsupported")
        if body.max_tokens == 0 and not body.echo:
            raise APIError(400, "max_tokens=0 needs echo=true (nothing would be returned)", "max_tokens",
                           code="invalid_value")
        if body.decode_from is not None and not body.echo:
            raise APIError(400, "decode_from needs echo=true", "decode_from", code="invalid_value")
        prompts = _prompt_list(body.prompt)
        L.check_prompts(len(prompts), lim)
        encoded = []
        for i, p in enumerate(prompts):
            param = "prompt" if len(prompts) == 1 else f"prompt.{i}"
            if isinstance(p, str):
                fits_text(len(p), body.max_tokens, param)
            ids = runner.encode_text(engine, p) if isinstance(p, str) else list(p)
            runner.check_fit(engine, ids, body.max_tokens, param)
            encoded.append((runner.clean_text(p) if isinstance(p, str) else engine.decode(ids), ids))
        return _Prepared(body, cfg, encoded, body.max_tokens, stop, temperature)

    async def prepared(request: Request, prepare: Callable[[Request, bytes], _Prepared]) -> tuple[Ticket, _Prepared]:
        ticket = admit()  # before reading or parsing anything: a full server costs nothing more
        try:
            try:
                raw = await request.body()
            except ClientDisconnect:
                raise ClientGone() from None
            return ticket, await off_loop(lambda: prepare(request, raw))
        except BaseException:
            ticket.release()
            raise

    def log_for(request: Request) -> IO[str] | None:
        if settings.log_file is None:
            return None
        return runner.TaggedLog(settings.log_file, request.state.request_id, log_lock)

    def finished(cancel: Cancel) -> None:
        """Raise the answer for work cut short by a deadline or shutdown (its output is partial)."""
        err = cancel_error(cancel.reason if cancel.reason != "disconnect" else None, lim.request_timeout_s)
        if err is not None:
            raise err

    def job(p: _Prepared, request: Request, cancel: Cancel, want_logprobs: bool = False, echo: bool = False,
            decode_from: int | None = None, on_token: Callable[[int, int, int], None] | None = None) -> dict[str, Any]:
        """The worker's arguments: a batchable job when the batch key allows, else one run alone."""
        lf = log_for(request)
        key = runner.batch_key(p.cfg, p.temperature, p.max_tokens, logprobs=want_logprobs, echo=echo,
                               n_prompts=len(p.prompts), modes=settings.batch_modes)
        if key is not None and decode_from is None:
            text, ids = p.prompts[0]
            cfg, max_tokens = p.cfg, p.max_tokens  # equal across the key: any item's batch_fn serves the batch
            return {"key": key, "item": runner.BatchItem(ids, text, p.stop, lf, on_token, cancel),
                    "batch_fn": lambda items: runner.run_batch(engine, cfg, max_tokens, items, worker.heartbeat)}
        seed = getattr(p.body, "seed", None)

        def work() -> list[runner.Generated]:
            gens = []
            for text, ids in p.prompts:
                if cancel:
                    break  # between prompts: a cancelled request runs no further prompt
                control = runner.RowControl(engine, p.stop, cancel, on_token, worker.heartbeat)
                gens.append(runner.run_completion(engine, ids, text, p.max_tokens, p.cfg, p.temperature, seed, p.stop,
                                                  want_logprobs, echo, decode_from, lf, control))
            return gens

        return {"fn": work}

    async def run(request: Request, ticket: Ticket, cancel: Cancel, args: dict[str, Any]) -> list[runner.Generated]:
        fn = args.pop("fn", None)
        out = await run_guarded(worker, fn, request.is_disconnected, cancel=cancel, ticket=ticket, **args)
        finished(cancel)
        return out if fn is not None else [out]

    def headers_for(request: Request, stats: dict[str, Any]) -> dict[str, str]:
        return {"X-Pruning-Stats": stats_header(stats), "X-Request-Id": request.state.request_id,
                "X-Batch-Size": str(int(stats.get("batch_size", 1)))}

    def live_stream(request: Request, ticket: Ticket, p: _Prepared) -> StreamingResponse:
        """Chunks leave as the engine decodes (``on_token`` feeds an asyncio queue from the worker
        thread); the stats come in the last chunk's ``pruning`` object and the usage chunk. A lossy
        request the router degrades after the fact is rerun unpruned; the stream goes on from the
        rerun when it agrees with what was sent, else it ends with an error event."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        done, cancel = object(), Cancel()

        def on_token(row: int, index: int, token: int) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (index, token))

        try:
            fut = worker.submit(**job(p, request, cancel, on_token=on_token), cancel=cancel, ticket=ticket)
        except Exception:
            ticket.release()
            raise
        fut.add_done_callback(lambda _: queue.put_nowait(done))
        body = p.body
        base = {"id": f"chatcmpl-{request.state.request_id}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": model_name}
        n_prompt = len(p.prompts[0][1])

        def after(result: Any) -> runner.Generated:
            finished(cancel)
            [gen] = result if isinstance(result, list) else [result]
            metrics.record(gen.stats, n_prompt, len(gen.token_ids))
            return gen

        async def watch() -> None:
            # uvicorn (ASGI 2.4) reports a gone client only on the next send; a decode that is
            # between tokens must hear of it sooner
            while not fut.done():
                if await request.is_disconnected():
                    cancel.set("disconnect")
                    fut.cancel()
                    return
                await asyncio.sleep(0.05)

        async def events():
            watcher = asyncio.ensure_future(watch())
            try:
                async for ev in O.live_chat_events(engine, fut, queue, done, base, p.stop, n_prompt,
                                                   bool(body.stream_options and body.stream_options.include_usage),
                                                   after):
                    yield ev
            finally:
                watcher.cancel()
                if not fut.done():
                    cancel.set("disconnect")
                    fut.cancel()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"X-Request-Id": request.state.request_id})

    # ---- generation ----
    @app.post("/v1/chat/completions", response_model=S.ChatCompletionResponse, openapi_extra=_body_schema(
        S.ChatCompletionRequest), responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}}})
    async def chat_completions(request: Request):
        ticket, p = await prepared(request, prepare_chat)
        body = p.body
        want_logprobs = bool(body.logprobs)
        if body.stream and not want_logprobs and p.cfg.mode != "lossless":
            return live_stream(request, ticket, p)
        cancel = Cancel()
        [gen] = await run(request, ticket, cancel, job(p, request, cancel, want_logprobs))
        n_prompt = len(gen.prompt_ids)
        metrics.record(gen.stats, n_prompt, len(gen.token_ids))
        stats = S.PruningStats(**O.pruning_fields(gen.stats))
        usage = S.Usage(prompt_tokens=n_prompt, completion_tokens=len(gen.token_ids),
                        total_tokens=n_prompt + len(gen.token_ids))
        logprobs = None
        if want_logprobs and gen.logits is not None:
            logprobs = await off_loop(lambda: O.chat_logprobs(engine, gen, body.top_logprobs or 0,
                                                              body.return_tokens_as_token_ids))
        rid, created = f"chatcmpl-{request.state.request_id}", int(time.time())
        headers = headers_for(request, gen.stats)
        if not body.stream:
            resp = S.ChatCompletionResponse(
                id=rid, created=created, model=model_name, usage=usage, pruning=stats,
                choices=[S.ChatChoice(index=0, message=S.ChatResponseMessage(content=gen.text), logprobs=logprobs,
                                      finish_reason=gen.finish_reason)])
            return JSONOut(resp.model_dump(), headers=headers)
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name}
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(O.buffered_chat_events(engine, gen, base, logprobs, stats,
                                                        usage if include_usage else None),
                                 media_type="text/event-stream", headers=headers)

    @app.post("/v1/completions", response_model=S.CompletionResponse, openapi_extra=_body_schema(S.CompletionRequest),
              responses=_ERRORS)
    async def completions(request: Request):
        ticket, p = await prepared(request, prepare_completion)
        body = p.body
        want = body.logprobs is not None
        cancel = Cancel()
        gens = await run(request, ticket, cancel, job(p, request, cancel, want, body.echo, body.decode_from))

        def build() -> S.CompletionResponse:
            choices = []
            n_prompt = n_out = 0
            for index, g in enumerate(gens):
                n_prompt += len(g.prompt_ids)
                n_out += len(g.token_ids)
                metrics.record(g.stats, len(g.prompt_ids), len(g.token_ids))
                text = (engine.decode(g.prompt_ids) if body.echo else "") + g.text
                lp = O.completion_logprobs(engine, g, int(body.logprobs or 0), body.echo,
                                           body.return_tokens_as_token_ids) if want else None
                choices.append(S.CompletionChoice(index=index, text=text, logprobs=lp, finish_reason=g.finish_reason,
                                                  pruning=S.PruningStats(**O.pruning_fields(g.stats))))
            total = runner.sum_stats([g.stats for g in gens])
            return S.CompletionResponse(id=f"cmpl-{request.state.request_id}", created=int(time.time()),
                                        model=model_name, choices=choices,
                                        usage=S.Usage(prompt_tokens=n_prompt, completion_tokens=n_out,
                                                      total_tokens=n_prompt + n_out),
                                        pruning=S.PruningStats(**total))

        resp = await off_loop(build)
        return JSONOut(resp.model_dump(), headers=headers_for(request, resp.pruning.model_dump()))

    # ---- tokenizer (vLLM shapes) ----
    @app.post("/tokenize", response_model=S.TokenizeResponse, openapi_extra=_body_schema(S.TokenizeRequest),
              responses=_ERRORS)
    async def tokenize(request: Request):
        raw = await request.body()

        def work() -> S.TokenizeResponse:
            body = L.parse_body(S.TokenizeRequest, raw)
            check_model(body.model)
            if (body.prompt is None) == (body.messages is None):
                raise APIError(400, "give exactly one of prompt or messages", "prompt", code="invalid_value")
            ctx = engine.dims.max_positions
            if body.prompt is not None:
                fits_text(len(body.prompt), 0, "prompt")
                ids = runner.encode_text(engine, body.prompt, body.add_special_tokens)
            else:
                msgs = []
                for i, m in enumerate(body.messages):
                    try:
                        msgs.append({"role": m.role, "content": m.text(f"messages.{i}.content")})
                    except ValueError as exc:
                        raise APIError(400, str(exc), f"messages.{i}.content", code="invalid_value") from None
                fits_text(sum(len(m["content"]) for m in msgs), 0, "messages")
                ids = runner.chat_ids(engine, msgs, body.add_generation_prompt)
            strs = engine.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
            return S.TokenizeResponse(count=len(ids), max_model_len=ctx, tokens=ids, token_strs=strs)

        return JSONOut((await off_loop(work)).model_dump())

    @app.post("/detokenize", response_model=S.DetokenizeResponse, openapi_extra=_body_schema(S.DetokenizeRequest),
              responses=_ERRORS)
    async def detokenize(request: Request):
        raw = await request.body()

        def work() -> S.DetokenizeResponse:
            body = L.parse_body(S.DetokenizeRequest, raw)
            check_model(body.model)
            bad = next((t for t in body.tokens if not 0 <= t < engine.dims.vocab), None)
            if bad is not None:
                raise APIError(400, f"token id {bad} is out of range for a vocabulary of {engine.dims.vocab}",
                               "tokens", code="invalid_value")
            return S.DetokenizeResponse(prompt=engine.tokenizer.decode(body.tokens))

        return JSONOut((await off_loop(work)).model_dump())

    @app.get("/tokenizer_info", response_model=S.TokenizerInfo, responses=_ERRORS)
    async def tokenizer_info():
        tok = engine.tokenizer
        return S.TokenizerInfo(tokenizer_class=type(tok).__name__, eos_token=tok.eos_token, bos_token=tok.bos_token,
                               pad_token=tok.pad_token, unk_token=tok.unk_token, chat_template=tok.chat_template,
                               model_max_length=engine.dims.max_positions, vocab_size=engine.dims.vocab)

    # ---- service ----
    @app.get("/v1/models", response_model=S.ModelList, responses=_ERRORS)
    async def models():
        return S.ModelList(data=[S.ModelCard(id=model_name, max_model_len=engine.dims.max_positions)])

    @app.get("/health", response_model=S.Health, responses={503: {"model": S.Health}})
    async def health():
        alive = worker.alive
        h = S.Health(status="ok" if alive else "down", model=model_name, worker_alive=alive,
                     down_reason=worker.down_reason if not alive else None, queue_depth=worker.depth,
                     waiting=worker.waiting, max_queue=worker.max_queue)
        return JSONOut(h.model_dump(), status_code=200 if alive else 503)

    @app.get("/metrics", responses={200: {"content": {"text/plain": {}}}})
    async def prometheus():
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    _openapi_with_request_models(app, [S.ChatCompletionRequest, S.CompletionRequest, S.TokenizeRequest,
                                       S.DetokenizeRequest], sorted({model_name, engine.name}))
    guarded = Guard(app, observe=metrics.observe, max_body_bytes=lim.max_body_bytes, api_key=settings.api_key,
                    allowed_hosts=settings.allowed_hosts)
    guarded.state = app.state  # type: ignore[attr-defined]
    return guarded


def _openapi_with_request_models(app: FastAPI, models: list[type], names: list[str]) -> None:
    """The routes read their bodies themselves (to parse off the event loop, after admission),
    so FastAPI does not see the request models: add them to the schema it serves, with ``model``
    narrowed to the names this server answers (anything else is a 404)."""
    from pydantic.json_schema import models_json_schema

    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = base()
        _, defs = models_json_schema([(m, "validation") for m in models], ref_template="#/components/schemas/{model}")
        defs = defs.get("$defs", {})
        for m in models:
            if "model" in defs[m.__name__].get("properties", {}):
                defs[m.__name__]["properties"]["model"] = {"anyOf": [{"enum": names}, {"type": "null"}],
                                                           "title": "Model"}
        schema.setdefault("components", {}).setdefault("schemas", {}).update(defs)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _prompt_list(prompt: S.PromptType) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt must not be empty", "prompt", code="invalid_value")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]
