"""What a request may ask for, and the checks that say no with a 400 naming the limit.

``Limits`` holds the operator's bounds (``rsp-bench serve`` flags): body bytes, prompts per
request, stop strings (count and length), max_tokens, logprobs, the per-request engine log level
and the request timeout. ``parse_body`` turns the raw body into its pydantic model (a bad value is
a 400 naming the field, as OpenAI and vLLM answer, not FastAPI's 422). ``refuse_unsupported``
answers the OpenAI sampling fields this engine does not implement with a 400 naming them, unless
they carry their neutral value: never accepted and silently ignored.

These checks run in the route's preparation step, off the event loop, after admission (the
429 check) and before any engine work. Must not import torch, the engine or the harness.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

from pydantic import BaseModel, ValidationError

from .knobs import APIError

LOG_LEVELS = ("NONE", "SUMMARY", "DETAILED")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 4 * 2 ** 20   # a full-context prompt as token ids is ~50 kB of JSON
    max_prompts: int = 16                # prompts of one /v1/completions request
    max_stop: int = 4                    # OpenAI's own limit
    max_stop_chars: int = 128
    max_tokens: int | None = None        # per request; None: whatever fits the context
    max_logprobs: int = 20               # top_logprobs / logprobs (OpenAI's limit)
    max_log_level: str = "SUMMARY"       # highest engine log level a request may ask for
    request_timeout_s: float | None = 600.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_prompts", "max_stop", "max_stop_chars", "max_logprobs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens}")
        if self.max_log_level not in LOG_LEVELS:
            raise ValueError(f"max_log_level must be one of {', '.join(LOG_LEVELS)}, got {self.max_log_level!r}")
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0 or None, got {self.request_timeout_s}")


def _loc_name(loc: Sequence[Any]) -> str:
    return ".".join(str(p) for p in loc if p != "body") or "body"


def validation_error(errors: Sequence[dict[str, Any]]) -> APIError:
    """pydantic's first error as a 400 naming the field and the value given."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}",
                        "body", code="invalid_json")
    param = _loc_name(first.get("loc", ()))
    got = "" if first.get("type") == "missing" else f", got {json.dumps(first.get('input'), default=str)[:200]}"
    return APIError(400, f"{param}: {first.get('msg', 'invalid value')}{got}", param, code="invalid_value")


def parse_body(model: type[M], raw: bytes) -> M:
    """``raw`` as a ``model``, or a 400 naming what is wrong. Runs off the event loop."""
    try:
        data = json.loads(raw)
    except ValueError as exc:  # also invalid UTF-8
        raise APIError(400, f"the body is not valid JSON: {exc}"[:300], "body", code="invalid_json") from None
    except RecursionError:
        # A few KB of '[' nest past the parser's recursion limit: valid JSON, but no request.
        raise APIError(400, "the body's JSON nests too deeply", "body", code="invalid_json") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


# field -> the neutral value that means "not used" (accepted); anything else is refused
_NEUTRAL: dict[str, Any] = {
    "top_p": 1, "frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1, "top_k": -1, "min_p": 0,
    "logit_bias": {}, "tools": [], "functions": [], "tool_choice": "none", "function_call": "none",
    "best_of": 1, "suffix": "", "response_format": {"type": "text"}, "parallel_tool_calls": None,
}


def refuse_unsupported(body: BaseModel) -> None:
    """A 400 naming every sampling field sent with a value this engine would not honour."""
    bad = []
    for name, neutral in _NEUTRAL.items():
        value = getattr(body, name, None)
        if value is None or value == neutral or (name == "top_k" and value == 0):
            continue
        if isinstance(value, BaseModel):
            value = value.model_dump(exclude_none=True)
            if value == neutral:
                continue
        bad.append(f"{name}={json.dumps(value, default=str)[:60]}")
    if bad:
        raise APIError(400, f"not supported by this server (it decodes greedily or by temperature only, with "
                            f"no penalties, tools or response formats): {', '.join(bad)}",
                       bad[0].split("=", 1)[0], code="unsupported_parameter")


def stop_strings(stop: str | list[str] | None, limits: Limits) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > limits.max_stop:
        raise APIError(400, f"stop: {len(stops)} stop strings, at most {limits.max_stop} are allowed", "stop",
                       code="too_many_stop_strings")
    for i, s in enumerate(stops):
        if len(s) > limits.max_stop_chars:
            raise APIError(400, f"stop.{i} is {len(s)} characters, at most {limits.max_stop_chars} are allowed",
                           f"stop.{i}", code="stop_string_too_long")
    return [s for s in stops if s]


def check_max_tokens(max_tokens: int, limits: Limits) -> None:
    if limits.max_tokens is not None and max_tokens > limits.max_tokens:
        raise APIError(400, f"max_tokens={max_tokens} is above this server's limit of {limits.max_tokens} "
                            "(--max-tokens-limit)", "max_tokens", code="max_tokens_exceeded")


def check_prompts(n: int, limits: Limits) -> None:
    if n > limits.max_prompts:
        raise APIError(400, f"prompt: {n} prompts in one request, at most {limits.max_prompts} are allowed "
                            "(--max-prompts)", "prompt", code="too_many_prompts")


def check_log_level(level: str, where: str, limits: Limits) -> None:
    """A request may lower the engine's log level, or raise it up to the operator's cap."""
    if LOG_LEVELS.index(level) > LOG_LEVELS.index(limits.max_log_level):
        raise APIError(400, f"{where} {level!r} is above this server's cap {limits.max_log_level!r} "
                            "(--max-client-log-level)", where, code="log_level_not_allowed")
