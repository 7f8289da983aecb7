"""The load client both HTTP load modes share: ``LoadConfig`` (what to send, validated) and
``LoadClient`` (one chat completion at a time on a shared, thread-safe httpx client, with the
429 / Retry-After handling). ``rsp_bench.loadtest`` (the load and burst phases) and
``rsp_bench.soak`` (the soak) are built on it; neither imports the other's internals.

Must NOT import torch, reference_engine, rsp_bench.loadtest or rsp_bench.soak: it speaks HTTP.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

from rsp_bench.errors import HarnessInputError

__all__ = ["LoadConfig", "LoadClient", "int_or_none", "check_url", "status_hint", "unreachable"]


def check_url(url: str, flag: str = "--url") -> str:
    """``url`` if it is http(s)://HOST[:PORT]/...; else an input error naming it (httpx would
    raise UnsupportedProtocol or InvalidURL at the first request instead)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port is None or parts.port > 0)
    except (ValueError, TypeError, AttributeError):  # a port that is not a number, not a string
        ok = False
    if not ok:
        raise HarnessInputError(f"{flag} {url!r} is not a server URL: give http(s)://HOST[:PORT]/v1")
    return url


def status_hint(status: int) -> str:
    """What to do about an HTTP error status, as a clause to end a message with."""
    if status == 401:
        return ": the server wants an API key, pass it with --api-key KEY (or set RSP_API_KEY)"
    if status == 403:
        return ": the server refused the key, check --api-key (or RSP_API_KEY)"
    return ""


def unreachable(url: str, exc: Exception) -> HarnessInputError:
    """A transport failure (refused, timed out, bad host) as one line naming the URL."""
    return HarnessInputError(f"cannot reach {url}: {str(exc) or type(exc).__name__}")


class LoadConfig:
    def __init__(self, prompts: Sequence[str], requests: int = 12, clients: int = 4, max_tokens: int = 8,
                 headers: dict[str, str] | None = None, model: str | None = None, burst: bool = True,
                 max_retries: int = 50, timeout_s: float = 300.0, progress: bool = False,
                 api_key: str | None = None) -> None:
        if not prompts:
            raise HarnessInputError("loadtest needs at least one prompt")
        for name, value in (("requests", requests), ("clients", clients), ("max_tokens", max_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise HarnessInputError(f"loadtest {name} must be an integer >= 1, got {value!r}")
        self.prompts, self.requests, self.clients, self.max_tokens = list(prompts), requests, clients, max_tokens
        self.headers = dict(headers or {})
        self.model, self.burst, self.max_retries, self.timeout_s = model, burst, max_retries, timeout_s
        self.progress = progress
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"


def _stats(header: str | None) -> dict[str, Any] | None:
    from rsp_bench.engines.openai_engine import parse_stats_header

    return parse_stats_header(header)


class LoadClient:
    """One chat call with 429 handling, on a shared httpx client (thread-safe)."""

    def __init__(self, base: str, cfg: LoadConfig) -> None:
        import httpx

        self.base, self.cfg = check_url(base).rstrip("/"), cfg
        self.http = httpx.Client(timeout=cfg.timeout_s, limits=httpx.Limits(max_connections=cfg.clients * 4 + 8))
        self.lock = threading.Lock()
        self.rejections: list[dict[str, Any]] = []

    def model(self) -> str:
        if self.cfg.model:
            return self.cfg.model
        import httpx

        url = self.base + "/models"
        try:
            r = self.http.get(url, headers=self.cfg.headers)
        except httpx.HTTPError as exc:
            raise unreachable(url, exc) from None
        if r.status_code != 200:
            raise HarnessInputError(f"GET {url} answered {r.status_code} {r.reason_phrase}{status_hint(r.status_code)}")
        try:
            return r.json()["data"][0]["id"]
        except (ValueError, LookupError, TypeError):
            raise HarnessInputError(f"GET {url} answered no model list (is it the server's OpenAI /v1 URL?); "
                                    "give the model with --model") from None

    def health(self) -> dict[str, Any] | None:
        root = self.base[:-3] if self.base.endswith("/v1") else self.base
        try:
            r = self.http.get(root + "/health")
            return r.json() if r.status_code == 200 else None
        except Exception:  # a server without /health
            return None

    def call(self, model: str, prompt: str, request_id: str, retry: bool = True) -> dict[str, Any]:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": self.cfg.max_tokens,
                "temperature": 0}
        headers = {**self.cfg.headers, "X-Request-Id": request_id}
        t0 = time.perf_counter()
        attempts = 0
        while True:
            attempts += 1
            r = self.http.post(self.base + "/chat/completions", json=body, headers=headers)
            if r.status_code == 429 and retry and attempts <= self.cfg.max_retries:
                after = r.headers.get("retry-after")
                with self.lock:
                    self.rejections.append({"request_id": request_id, "retry_after": after})
                time.sleep(float(after) if after not in (None, "") else 1.0)
                continue
            break
        out: dict[str, Any] = {"request_id": request_id, "status": r.status_code, "attempts": attempts,
                               "latency_s": time.perf_counter() - t0, "echoed_id": r.headers.get("x-request-id"),
                               "retry_after": r.headers.get("retry-after"),
                               "batch_size": int_or_none(r.headers.get("x-batch-size"))}
        if r.status_code == 200:
            data = r.json()
            out["text"] = data["choices"][0]["message"]["content"] or ""
            out["completion_tokens"] = (data.get("usage") or {}).get("completion_tokens")
            out["pruning"] = _stats(r.headers.get("x-pruning-stats"))
        else:
            out["error"] = r.text[:500]
        return out

    def close(self) -> None:
        self.http.close()


def int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None
