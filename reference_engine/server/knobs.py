"""Per-request pruning knobs: headers and the body's ``pruning`` object -> one PruningConfig.

Precedence, field by field: the body's ``pruning`` object wins over the ``X-Pruning-*`` header of
the same knob, and both win over the server's defaults (the ``rsp-bench serve`` flags). The body
is the request's own payload; headers are often set once per client (``extra_headers``, a
gateway), so the more specific source wins.

    X-Pruning-Sensitivity          number in [0, 1]
    X-Pruning-Blacklist            comma list of block indices ("" = none)
    X-Pruning-Log-Level            NONE, SUMMARY or DETAILED
    X-Pruning-Mode                 off, lossy, lossless or static
    X-Pruning-Router               unit (the default) or block: which lossy router decides
    X-Pruning-Hardware-Watermark   number in [0, 1] (pins the load factor; suites pin 0.0)

Every bad value raises ``APIError`` (a 400) naming the header or field and the value.
Must not import torch or the harness.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from ..config import ROUTERS, PruningConfig, parse_blacklist
from ..errors import EngineInputError
from .schemas import PruningBody

HEADERS = {
    "sensitivity": "X-Pruning-Sensitivity",
    "blacklist": "X-Pruning-Blacklist",
    "log_level": "X-Pruning-Log-Level",
    "mode": "X-Pruning-Mode",
    "router": "X-Pruning-Router",
    "hardware_watermark": "X-Pruning-Hardware-Watermark",
}
SERVED_MODES = ("off", "lossy", "lossless", "static")


class APIError(Exception):
    """An error answered as ``{"error": {message, type, param, code}}`` with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code
        self.headers = dict(headers or {})


def _unit_number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise APIError(400, f"{where} must be a number in [0, 1], got {text!r}", where, code="invalid_value")
    return value


def _from_headers(headers: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    """knob -> (raw value, where it came from) for every X-Pruning-* header present."""
    lowered = {k.lower(): v for k, v in headers.items()}
    known = {h.lower() for h in HEADERS.values()}
    for name, value in lowered.items():
        if name.startswith("x-pruning-") and name not in known and name not in ("x-pruning-stats",):
            raise APIError(400, f"unknown pruning header {name!r} (value {value!r}); known: {', '.join(HEADERS.values())}",
                           name, code="unknown_header")
    out = {}
    for knob, header in HEADERS.items():
        if header.lower() in lowered:
            out[knob] = (lowered[header.lower()].strip(), header)
    return out


def _from_body(body: PruningBody | None) -> dict[str, tuple[Any, str]]:
    if body is None:
        return {}
    return {k: (v, f"pruning.{k}") for k, v in body.model_dump().items() if v is not None}


def request_config(default: PruningConfig, headers: Mapping[str, str], body: PruningBody | None,
                   n_layers: int) -> PruningConfig:
    """The request's PruningConfig: server default < header < body, validated for this model."""
    merged = _from_headers(headers)
    merged.update(_from_body(body))
    changes: dict[str, Any] = {}
    for knob, (raw, where) in merged.items():
        try:
            if knob in ("sensitivity", "hardware_watermark"):
                value = _unit_number(raw, where) if isinstance(raw, str) else raw
                changes[knob] = float(value) if knob == "hardware_watermark" else value
            elif knob == "blacklist":
                changes["layer_blacklist"] = parse_blacklist(raw) if isinstance(raw, str) else tuple(raw)
            elif knob == "log_level":
                changes["log_level"] = str(raw).upper()
            elif knob == "mode":
                if raw not in SERVED_MODES:
                    raise APIError(400, f"{where} must be one of {', '.join(SERVED_MODES)}, got {raw!r}", where,
                                   code="invalid_value")
                changes["mode"] = raw
            elif knob == "router":
                if raw not in ROUTERS:
                    raise APIError(400, f"{where} must be one of {', '.join(ROUTERS)}, got {raw!r}", where,
                                   code="invalid_value")
                changes["router"] = raw
            # Validate each knob alone so the error names the header or field that was wrong.
            cfg = default.override(**{k: v for k, v in changes.items()})
            cfg.blacklist_for(n_layers)
        except APIError:
            raise
        except EngineInputError as exc:
            raise APIError(400, f"{where} {raw!r}: {exc}", where, code="invalid_value") from None
    return default.override(**changes) if changes else default


def stats_header(stats: Mapping[str, Any]) -> str:
    """``layers_bypassed=3,total_tokens=156,bypass_ratio=0.0192,degraded=false,degraded_reason=none,...``"""
    reason = stats.get("degraded_reason")
    parts = [
        f"layers_bypassed={int(stats['layers_bypassed'])}",
        f"total_tokens={int(stats['total_tokens'])}",
        f"bypass_ratio={float(stats['bypass_ratio']):.6f}",
        f"degraded={'true' if stats['degraded'] else 'false'}",
        # a header value must stay one token per field: the reason is an identifier already,
        # but strip separators in case a future reason carries them
        f"degraded_reason={str(reason).replace(',', ';').replace('=', ':') if reason else 'none'}",
        f"mode={stats['mode']}",
        f"router={stats.get('router') or 'none'}",
        f"blocks={int(stats['blocks'])}",
        f"detector={stats.get('detector') or 'none'}",
    ]
    return ",".join(parts)
