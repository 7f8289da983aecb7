"""The ASGI layer in front of every route: request ids, the Host check, the API key, the body
size limit, request metrics, and the last-resort 500.

Pure ASGI (not Starlette's BaseHTTPMiddleware) so that it also wraps what escapes the app: an
unhandled exception still gets an OpenAI-style 500 that carries ``X-Request-Id`` and is counted
in ``rsp_requests_total``; and the body limit is enforced while the body streams in (a
``Content-Length`` over the limit is refused before a byte of the body is read).

- ``X-Request-Id``: the client's, when it is 1..``max_request_id_chars`` characters of
  ``[A-Za-z0-9._:-]`` (it lands in logs), else a 400 naming it; a fresh one when absent.
- Host: when the server listens on loopback only, a Host header naming anything but a loopback
  name is refused (400): a DNS-rebinding page in a browser reaches 127.0.0.1 under its own name.
- API key: every ``/v1`` route needs ``Authorization: Bearer <key>`` when a key is set (401
  otherwise); ``/health``, ``/metrics`` and the tokenizer routes stay open, as in vLLM.

Must not import torch, the engine or the harness.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
import uuid
from typing import Any, Awaitable, Callable, Iterable

log = logging.getLogger("reference_engine.server")
_ID = re.compile(r"[A-Za-z0-9._:\-]+")
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class BodyTooLarge(Exception):
    pass


def error_bytes(message: str, param: str | None, type_: str, code: str | None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


def host_name(host_header: str) -> str:
    """``[::1]:8000`` -> ``::1``; ``localhost:8000`` -> ``localhost``."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class Guard:
    """Wraps the FastAPI app; see the module docstring."""

    def __init__(self, app: ASGIApp, *, observe: Callable[[str, int, float], None], max_body_bytes: int,
                 api_key: str | None = None, allowed_hosts: Iterable[str] | None = None,
                 max_request_id_chars: int = 128) -> None:
        self.app, self.observe, self.max_body_bytes = app, observe, max_body_bytes
        self.api_key = api_key.encode() if api_key else None
        self.allowed_hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        self.max_request_id_chars = max_request_id_chars

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path = scope.get("path", "")
        given = headers.get("x-request-id")
        rid = given if given is not None and self._valid_id(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        status = {"code": 500, "started": False}

        async def send_wrapped(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
                hdrs = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": hdrs + [(b"x-request-id", rid.encode())]}
            await send(message)

        async def refuse(code: int, message: str, param: str | None, type_: str, err_code: str,
                         extra: list[tuple[bytes, bytes]] = ()) -> None:
            body = error_bytes(message, param, type_, err_code)
            await send_wrapped({"type": "http.response.start", "status": code,
                                "headers": [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(body)).encode()), *extra]})
            await send_wrapped({"type": "http.response.body", "body": body})

        try:
            if given is not None and not self._valid_id(given):
                await refuse(400, f"X-Request-Id must be 1-{self.max_request_id_chars} characters of "
                                  f"[A-Za-z0-9._:-], got {given[:80]!r}{'...' if len(given) > 80 else ''}",
                             "X-Request-Id", "invalid_request_error", "invalid_request_id")
                return
            if self.allowed_hosts is not None and host_name(headers.get("host", "")) not in self.allowed_hosts:
                await refuse(400, f"Host {headers.get('host', '')[:100]!r} is not served here: this server listens "
                                  f"on loopback and answers only to {', '.join(sorted(self.allowed_hosts))}",
                             "Host", "invalid_request_error", "invalid_host")
                return
            if self.api_key is not None and (path == "/v1" or path.startswith("/v1/")) and not self._authorized(headers):
                await refuse(401, "a valid API key is required: send 'Authorization: Bearer <key>' (the key given "
                                  "to rsp-bench serve --api-key or RSP_API_KEY)", None, "authentication_error",
                             "invalid_api_key", [(b"www-authenticate", b"Bearer")])
                return
            length = headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
                await refuse(413, f"the body is {int(length)} bytes, above this server's limit of "
                                  f"{self.max_body_bytes} bytes (--max-body-bytes)", "body",
                             "invalid_request_error", "body_too_large")
                return
            await self.app(scope, self._limited(receive), send_wrapped)
        except BodyTooLarge:
            if not status["started"]:
                await refuse(413, f"the body is above this server's limit of {self.max_body_bytes} bytes "
                                  "(--max-body-bytes)", "body", "invalid_request_error", "body_too_large")
        except Exception as exc:  # a bug: answered, counted, never a traceback to the client
            log.exception("internal error on %s (request %s)", path, rid)
            if status["started"]:  # the app's own 500 handler (or a stream) already answered
                return
            await refuse(500, f"internal error ({type(exc).__name__}); see the server log for request {rid}", None,
                         "server_error", "internal_error")
        finally:
            self.observe(path, status["code"], time.perf_counter() - t0)

    def _valid_id(self, rid: str) -> bool:
        return 0 < len(rid) <= self.max_request_id_chars and _ID.fullmatch(rid) is not None

    def _authorized(self, headers: dict[str, str]) -> bool:
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(token.strip().encode("latin-1", "replace"), self.api_key)

    def _limited(self, receive):
        seen = 0

        async def wrapped() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise BodyTooLarge()
            return message

        return wrapped
