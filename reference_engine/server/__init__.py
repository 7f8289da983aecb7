"""The reference engine as an OpenAI-compatible server (``rsp-bench serve``).

    schemas   pydantic request / response bodies (declared once)
    knobs     X-Pruning-* headers and the body's ``pruning`` object -> PruningConfig; APIError
    limits    the operator's request limits and the 400s naming them; body parsing
    guard     the ASGI layer: request ids, Host check, API key, body size, the last-resort 500
    worker    the engine's worker thread: admission, bounded queue, cancel, watchdog, shutdown
    runner    the engine calls the routes make: batching rule, stop strings, cancel per token
    output    response bodies and SSE streams from the engine's results
    metrics   Prometheus metrics (prometheus_client)
    app       create_app(engine, ServerSettings): thin FastAPI route handlers
    main      configure_parser / run: what ``rsp-bench serve`` calls

Imports run one way: schemas <- knobs <- limits, worker <- runner <- output <- app <- main;
guard and metrics import none of them.

Part of the engine library: it must not import the harness (``rsp_bench``). Needs the ``serve``
extra (fastapi, uvicorn, prometheus_client); importing this package imports none of them.
"""

__all__ = ["create_app", "ServerSettings"]


def __getattr__(name: str):
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module 'reference_engine.server' has no attribute {name!r}")
