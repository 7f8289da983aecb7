"""The gate's policy: which metric is judged how (direction, tolerance, significance), read
from TOML. ``gate_policy.toml`` beside this file is the default; a user's file is layered over
it (``load_policy``). ``rsp_bench.gate`` compares records under a ``Policy``.

Must NOT import rsp_bench.gate (which imports this), torch, numpy or reference_engine.
"""

from __future__ import annotations

import fnmatch
import importlib.resources
import math
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from rsp_bench.errors import PolicyError

__all__ = ["DIRECTIONS", "DEFAULT_ALPHA", "MetricRule", "Policy", "load_policy"]

DIRECTIONS = ("higher", "lower", "none")
DEFAULT_ALPHA = 0.01
_RULE_KEYS = {"direction", "abs", "rel", "flips", "significance"}
_GATE_KEYS = {"alpha", "inherit_default"}


@dataclass(frozen=True)
class MetricRule:
    """How one metric (or glob of metrics) is judged."""

    pattern: str
    direction: str
    tolerance: float = 0.0
    kind: str = "abs"  # "abs", "rel" or "flips" (tolerance = that many items of the metric's n)
    significance: bool = False

    @property
    def is_glob(self) -> bool:
        return any(ch in self.pattern for ch in "*?[")

    def describe(self) -> str:
        if self.direction == "none":
            return "—"
        arrow = "↑" if self.direction == "higher" else "↓"
        amount = {"abs": f"±{self.tolerance:g}", "rel": f"±{self.tolerance * 100:g}%",
                  "flips": f"±{self.tolerance:g} of n"}[self.kind]
        return f"{arrow} {amount}{' +U' if self.significance else ''}"


@dataclass(frozen=True)
class Policy:
    """A gate policy: layers of rules (consulted in order) and the test level.

    Within a layer an exact metric name beats a glob, and globs are tried in the order
    written; the first layer with a match decides.
    """

    layers: tuple[tuple[MetricRule, ...], ...]
    alpha: float = DEFAULT_ALPHA
    source: str = "default"

    def rule_for(self, metric: str) -> MetricRule | None:
        """The rule judging ``metric``, or None (the metric is then reported as info)."""
        for layer in self.layers:
            for rule in layer:
                if not rule.is_glob and rule.pattern == metric:
                    return rule
            for rule in layer:
                if rule.is_glob and fnmatch.fnmatchcase(metric, rule.pattern):
                    return rule
        return None


def _check_table(value: Any, allowed: set[str], where: str, like: str = "") -> None:
    """``value`` is a TOML table holding only ``allowed`` keys, else a PolicyError naming it."""
    if not isinstance(value, dict):
        raise PolicyError(f"{where} must be a table{like}, got {value!r}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise PolicyError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} (allowed: {sorted(allowed)})")


def _parse_rule(pattern: str, spec: Any, source: str) -> MetricRule:
    where = f"{source}: metrics.{pattern!r}"
    _check_table(spec, _RULE_KEYS, where, ' like { direction = "higher", abs = 0.02 }')
    direction = spec.get("direction")
    if direction not in DIRECTIONS:
        raise PolicyError(f"{where}: direction {direction!r} must be one of {', '.join(DIRECTIONS)}")
    significance = spec.get("significance", False)
    if not isinstance(significance, bool):
        raise PolicyError(f"{where}: significance {significance!r} must be true or false")
    given = [k for k in ("abs", "rel", "flips") if k in spec]
    if len(given) > 1:
        raise PolicyError(f"{where}: give one of abs, rel or flips, not {' and '.join(given)}")
    kind = given[0] if given else None
    if kind is None:
        if direction != "none":
            raise PolicyError(f"{where}: direction {direction!r} needs a tolerance (abs = ..., rel = ... or flips = ...)")
        return MetricRule(pattern, "none")
    tolerance = spec[kind]
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance) or tolerance < 0:
        raise PolicyError(f"{where}: {kind} tolerance {tolerance!r} must be a finite number >= 0")
    return MetricRule(pattern, direction, float(tolerance), kind, significance)


def _parse_policy(data: Mapping[str, Any], source: str) -> tuple[tuple[MetricRule, ...], float | None, bool]:
    unknown = sorted(set(data) - {"gate", "metrics"})
    if unknown:
        raise PolicyError(f"{source}: unknown table(s) {', '.join(map(repr, unknown))} (allowed: gate, metrics)")
    gate = data.get("gate", {})
    _check_table(gate, _GATE_KEYS, f"{source}: gate")
    alpha = gate.get("alpha")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1):
        raise PolicyError(f"{source}: gate.alpha {alpha!r} must be a number strictly between 0 and 1")
    inherit = gate.get("inherit_default", True)
    if not isinstance(inherit, bool):
        raise PolicyError(f"{source}: gate.inherit_default {inherit!r} must be true or false")
    metrics = data.get("metrics", {})
    if not isinstance(metrics, dict):
        raise PolicyError(f"{source}: metrics must be a table, got {metrics!r}")
    rules = tuple(_parse_rule(pattern, spec, source) for pattern, spec in metrics.items())
    return rules, (float(alpha) if alpha is not None else None), inherit


def _read_toml(path: Path | None) -> tuple[dict[str, Any], str]:
    try:
        if path is None:
            resource = importlib.resources.files("rsp_bench").joinpath("gate_policy.toml")
            return tomllib.loads(resource.read_text(encoding="utf-8")), "default policy (rsp_bench/gate_policy.toml)"
        return tomllib.loads(path.read_text(encoding="utf-8")), str(path)
    except FileNotFoundError:
        raise PolicyError(f"{path}: no such policy file") from None
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: policy file is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path or 'default policy'}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read policy file ({exc.strerror})") from None


def load_policy(path: str | os.PathLike[str] | None = None) -> Policy:
    """Load the default policy, or the one at ``path`` layered over it.

    A user policy's rules are consulted before the default's, so a file that only says
    ``top1_agreement = { direction = "higher", abs = 0.05 }`` loosens that one metric and
    keeps every other default; ``[gate] inherit_default = false`` drops the defaults.
    """
    default_data, default_source = _read_toml(None)
    default_rules, default_alpha, _ = _parse_policy(default_data, default_source)
    if path is None:
        return Policy(layers=(default_rules,), alpha=default_alpha or DEFAULT_ALPHA, source=default_source)
    user_data, user_source = _read_toml(Path(path))
    user_rules, user_alpha, inherit = _parse_policy(user_data, user_source)
    layers = (user_rules, default_rules) if inherit else (user_rules,)
    alpha = user_alpha if user_alpha is not None else (default_alpha if inherit else None)
    return Policy(layers=layers, alpha=alpha or DEFAULT_ALPHA, source=user_source)
