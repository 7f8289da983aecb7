"""Regression gate: compare a run record with a baseline record under a TOML policy.

Owns the gate policy (``gate_policy.toml`` beside this file is the default), the
Mann-Whitney U significance test used on timing samples, the comparison itself and the
``rsp-bench gate`` CLI glue. The pytest plugin calls :func:`compare` and fails the
session when ``GateReport.passed`` is false; CI calls ``rsp-bench gate``.

Decision rule, metric by metric, for every configuration present in both records:
  * direction "none" (or no rule matches): verdict "info", never fails;
  * the change (``now - baseline`` for an ``abs`` tolerance, ``(now - baseline) / |baseline|``
    for ``rel``) is worse than the tolerance -> "regressed", better than it -> "improved",
    else "ok";
  * for a rule with ``significance = true`` and raw ``samples`` in both records, "regressed"
    and "improved" additionally need the two-sided Mann-Whitney U p-value below ``alpha``
    (and the sample medians moving the same way), so noise alone does not fail the gate.
Metrics or configurations on one side only are "new" / "missing": reported, never failing
(a quick run holds a subset of a full baseline), except in CI mode (``GateReport.ci_problems``):
there a configuration with no baseline, or a comparison that gated nothing, fails.
Timing metrics (``rsp_bench.baselines.metric_scope`` "machine") are "info" when there is no
speed baseline for this machine: reported, not gated, and the summary says so.

Must NOT import torch, transformers, reference_engine, numpy or scipy: the gate runs in
the lightest CI job there is.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.resources
import math
import os
import statistics
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from tabulate import tabulate

from rsp_bench.baselines import DEFAULT_BASELINES_DIR, load_baseline, metric_scope
from rsp_bench.errors import PolicyError, RecordError
from rsp_bench.records import latest_records, load_record, validate_record

__all__ = [
    "DIRECTIONS",
    "VERDICTS",
    "MetricRule",
    "Policy",
    "GateReport",
    "load_policy",
    "mann_whitney_u",
    "min_attainable_p",
    "compare",
    "configure_gate_parser",
    "run_gate",
]

DIRECTIONS = ("higher", "lower", "none")
VERDICTS = ("ok", "improved", "regressed", "new", "missing", "info")
DEFAULT_ALPHA = 0.01
_RULE_KEYS = {"direction", "abs", "rel", "significance"}
_GATE_KEYS = {"alpha", "inherit_default"}
# Float round-off: a drop of exactly the tolerance (0.90 -> 0.88 with abs 0.02) is not a
# regression, and 0.90 - 0.88 is 0.020000000000000018 in binary.
_EPS = 1e-9


# --------------------------------------------------------------------------- statistics


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Two-sided Mann-Whitney U test, normal approximation with tie and continuity correction.

    Returns ``(U_x, p)`` where ``U_x`` counts pairs with x > y (ties count one half).
    Matches ``scipy.stats.mannwhitneyu(x, y, method="asymptotic", use_continuity=True)``.
    The test is rank-based, so it makes no normality assumption about timings (which are
    skewed by stragglers) and one outlier cannot drag it.
    """
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError(f"Mann-Whitney U needs samples on both sides, got {n1} and {n2}")
    pooled = sorted([(float(v), 0) for v in x] + [(float(v), 1) for v in y])
    n = n1 + n2
    rank_sum_x = 0.0
    tie_term = 0.0
    i = 0
    while i < n:
        j = i
        while j + 1 < n and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        average_rank = (i + j) / 2.0 + 1.0  # ranks are 1-based
        t = j - i + 1
        tie_term += t**3 - t
        rank_sum_x += average_rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 0)
        i = j + 1
    u_x = rank_sum_x - n1 * (n1 + 1) / 2.0
    mean_u = n1 * n2 / 2.0
    variance = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0.0:
        # Every value identical: no evidence of any difference.
        return u_x, 1.0
    z = (abs(u_x - mean_u) - 0.5) / math.sqrt(variance)
    p = math.erfc(max(z, 0.0) / math.sqrt(2.0))
    return u_x, min(1.0, p)


def min_attainable_p(n1: int, n2: int) -> float:
    """The smallest p :func:`mann_whitney_u` can give for these sizes (complete separation, no ties).

    When it is not below alpha the test cannot detect anything, so the gate falls back to
    the tolerance alone instead of silently never failing.
    """
    return mann_whitney_u(list(range(n1)), list(range(n1, n1 + n2)))[1]


# --------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class MetricRule:
    """How one metric (or glob of metrics) is judged."""

    pattern: str
    direction: str
    tolerance: float = 0.0
    kind: str = "abs"  # "abs" or "rel"
    significance: bool = False

    @property
    def is_glob(self) -> bool:
        return any(ch in self.pattern for ch in "*?[")

    def describe(self) -> str:
        if self.direction == "none":
            return "—"
        arrow = "↑" if self.direction == "higher" else "↓"
        amount = f"±{self.tolerance:g}" if self.kind == "abs" else f"±{self.tolerance * 100:g}%"
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


def _parse_rule(pattern: str, spec: Any, source: str) -> MetricRule:
    where = f"{source}: metrics.{pattern!r}"
    if not isinstance(spec, dict):
        raise PolicyError(f"{where} must be a table like {{ direction = \"higher\", abs = 0.02 }}, got {spec!r}")
    unknown = sorted(set(spec) - _RULE_KEYS)
    if unknown:
        raise PolicyError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} (allowed: {sorted(_RULE_KEYS)})")
    direction = spec.get("direction")
    if direction not in DIRECTIONS:
        raise PolicyError(f"{where}: direction {direction!r} must be one of {', '.join(DIRECTIONS)}")
    significance = spec.get("significance", False)
    if not isinstance(significance, bool):
        raise PolicyError(f"{where}: significance {significance!r} must be true or false")
    if "abs" in spec and "rel" in spec:
        raise PolicyError(f"{where}: give either abs or rel, not both")
    kind = "abs" if "abs" in spec else "rel" if "rel" in spec else None
    if kind is None:
        if direction != "none":
            raise PolicyError(f"{where}: direction {direction!r} needs a tolerance (abs = ... or rel = ...)")
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
    if not isinstance(gate, dict):
        raise PolicyError(f"{source}: gate must be a table, got {gate!r}")
    unknown = sorted(set(gate) - _GATE_KEYS)
    if unknown:
        raise PolicyError(f"{source}: gate: unknown key(s) {', '.join(map(repr, unknown))} (allowed: {sorted(_GATE_KEYS)})")
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


# --------------------------------------------------------------------------- comparison


@dataclass
class GateReport:
    """The outcome of one comparison: a row per (configuration, metric) and any warnings."""

    rows: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    baseline_id: str = ""
    run_id: str = ""
    policy_source: str = ""

    speed_gated: bool = True
    speed_reason: str = "no speed baseline for this machine"

    @property
    def passed(self) -> bool:
        return not any(row["verdict"] == "regressed" for row in self.rows)

    @property
    def gated_count(self) -> int:
        """Metrics actually judged against a tolerance (ok, improved or regressed)."""
        return sum(1 for row in self.rows if row["verdict"] in ("ok", "improved", "regressed"))

    def ci_problems(self) -> list[str]:
        """Why CI mode fails a comparison that passed: configurations with no baseline, a
        deterministic (quality) figure that improved past its tolerance, or nothing gated at
        all. Empty when there is nothing to object to.

        An improved quality figure fails CI because greedy quality figures do not move by
        themselves: a configuration that now scores better computes something else than its
        baseline says (a swapped quantization, a changed kernel), and the change must land with
        its new baseline (``--rsp-update-baseline``), not pass silently. Timing figures that
        improved do not fail: they move with the machine."""
        problems = []
        new = sorted({row["config"] for row in self.rows if row["verdict"] == "new" and row["metric"] == "(all)"})
        if new:
            problems.append(f"{len(new)} configuration(s) have no baseline: {', '.join(new)}")
        moved = [f"{row['config']} {row['metric']}" for row in self.rows
                 if row["verdict"] == "improved" and metric_scope(row["metric"]) == "model"]
        if moved:
            problems.append(f"{len(moved)} quality figure(s) improved past their tolerance, so the baseline no longer "
                            f"describes what runs (update it with the change): {', '.join(moved[:6])}"
                            + (f" and {len(moved) - 6} more" if len(moved) > 6 else ""))
        if self.gated_count == 0:
            problems.append("no metric was gated")
        return problems

    @property
    def regressions(self) -> list[dict[str, Any]]:
        return [row for row in self.rows if row["verdict"] == "regressed"]

    def counts(self) -> dict[str, int]:
        return {v: sum(1 for row in self.rows if row["verdict"] == v) for v in VERDICTS}

    def summary(self) -> str:
        tally = self.counts()
        # Worst news first: the line is what a CI log shows.
        order = ("regressed", "improved", "ok", "new", "missing", "info")
        counts = ", ".join(f"{tally[v]} {v}" for v in order if tally[v])
        state = "PASSED" if self.passed else "FAILED"
        speed = "" if self.speed_gated else f"; speed reported, not gated ({self.speed_reason})"
        return (f"rsp-bench gate {state}: {counts or 'nothing to compare'} (baseline {self.baseline_id}, "
                f"run {self.run_id}; {self.policy_source}{speed})")

    def format_table(self, tablefmt: str = "simple") -> str:
        """Every row as a readable table (tabulate), warnings first, a summary line last."""
        headers = ["config", "metric", "baseline", "now", "change", "tolerance", "p", "verdict"]
        body = [
            [
                row["config"],
                row["metric"],
                _fmt_value(row["baseline"]),
                _fmt_value(row["now"]),
                _fmt_change(row["change"], row["change_kind"]),
                row["tolerance"],
                "—" if row["p_value"] is None else f"{row['p_value']:.2g}",
                row["verdict"].upper() if row["verdict"] == "regressed" else row["verdict"],
            ]
            for row in self.rows
        ]
        parts = [f"warning: {w}" for w in self.warnings]
        parts.append(tabulate(body, headers=headers, tablefmt=tablefmt, disable_numparse=True) if body else "(no rows)")
        notes = [f"  {row['config']} {row['metric']}: {row['note']}" for row in self.rows if row["note"] and row["verdict"] != "info"]
        if notes:
            parts.append("notes:\n" + "\n".join(notes))
        parts.append(self.summary())
        return "\n".join(parts)


def _fmt_value(value: float | None) -> str:
    if value is None:
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _fmt_change(change: float | None, kind: str) -> str:
    if change is None:
        return "—"
    if kind == "rel":
        return "n/a (baseline 0)" if math.isinf(change) else f"{change * 100:+.1f}%"
    return f"{change:+.4g}"


def _row(config: str, metric: str, verdict: str, *, baseline: float | None = None, now: float | None = None,
         change: float | None = None, change_kind: str = "abs", tolerance: str = "—",
         p_value: float | None = None, note: str = "") -> dict[str, Any]:
    return {
        "config": config, "metric": metric, "baseline": baseline, "now": now, "change": change,
        "change_kind": change_kind, "tolerance": tolerance, "p_value": p_value, "verdict": verdict, "note": note,
    }


def _judge(config: str, metric: str, base: Mapping[str, Any], now: Mapping[str, Any], policy: Policy) -> dict[str, Any]:
    b, v = float(base["value"]), float(now["value"])
    rule = policy.rule_for(metric)
    if rule is None or rule.direction == "none":
        change = v - b
        return _row(config, metric, "info", baseline=b, now=v, change=change, change_kind="abs",
                    note="no policy rule" if rule is None else "not gated (direction none)")
    if rule.kind == "abs":
        change = v - b
    elif b != 0:
        change = (v - b) / abs(b)
    else:
        # A relative change from zero is undefined; any move is then "infinitely" large.
        change = 0.0 if v == 0 else math.copysign(math.inf, v)
    worse = -change if rule.direction == "higher" else change
    beyond = worse > rule.tolerance + _EPS
    better = -worse > rule.tolerance + _EPS
    p_value = None
    note = ""
    if rule.significance:
        xs, ys = base.get("samples") or [], now.get("samples") or []
        if xs and ys and min_attainable_p(len(xs), len(ys)) < policy.alpha:
            _, p_value = mann_whitney_u(xs, ys)
            shift = statistics.median(ys) - statistics.median(xs)
            samples_worse = shift < 0 if rule.direction == "higher" else shift > 0
            significant = p_value < policy.alpha
            if beyond and not (significant and samples_worse):
                note = f"beyond tolerance but not significant (p={p_value:.2g} >= alpha {policy.alpha:g} or samples disagree)"
                beyond = False
            if better and not (significant and not samples_worse):
                better = False
        elif xs or ys:
            note = f"too few samples for a significance test ({len(xs)} vs {len(ys)}): tolerance alone"
        else:
            note = "no samples: tolerance alone"
    verdict = "regressed" if beyond else "improved" if better else "ok"
    return _row(config, metric, verdict, baseline=b, now=v, change=change, change_kind=rule.kind,
                tolerance=rule.describe(), p_value=p_value, note=note)


def compare(baseline: Mapping[str, Any], run: Mapping[str, Any], policy: Policy | None = None, *,
            speed_gated: bool = True, speed_reason: str = "no speed baseline for this machine") -> GateReport:
    """Compare ``run`` against ``baseline`` (both run records) metric by metric.

    ``speed_gated=False`` (no speed baseline for this machine, or timings taken under
    contention: ``speed_reason`` says which) turns every machine-scope metric into "info". Rows come in a deterministic order: configurations sorted by id,
    metrics by name. Records are validated first so a malformed one raises RecordError.
    """
    policy = policy or load_policy()
    validate_record(baseline, source="baseline")
    validate_record(run, source="run")
    warnings = []
    checked = (("model", "name"), ("machine", "fingerprint")) if speed_gated else (("model", "name"),)
    for field_name, key in checked:
        if baseline[field_name][key] != run[field_name][key]:
            warnings.append(
                f"{field_name}.{key} differs: baseline {baseline[field_name][key]!r}, run {run[field_name][key]!r}"
            )
    if baseline["quick"] != run["quick"]:
        warnings.append(
            f"baseline quick={baseline['quick']} but run quick={run['quick']}: quality figures come from different prompt sets"
        )
    rows: list[dict[str, Any]] = []
    base_configs, run_configs = baseline["configurations"], run["configurations"]
    for config in sorted(set(base_configs) | set(run_configs)):
        if config not in run_configs:
            rows.append(_row(config, "(all)", "missing", note="configuration not in this run"))
            continue
        if config not in base_configs:
            rows.append(_row(config, "(all)", "new", note="configuration not in the baseline"))
            continue
        base_metrics, run_metrics = base_configs[config]["metrics"], run_configs[config]["metrics"]
        for metric in sorted(set(base_metrics) | set(run_metrics)):
            if not speed_gated and metric_scope(metric) == "machine":
                value = run_metrics.get(metric, base_metrics.get(metric))
                rows.append(_row(config, metric, "info", now=float(value["value"]) if metric in run_metrics else None,
                                 note=f"speed: {speed_reason}"))
            elif metric not in run_metrics:
                rows.append(_row(config, metric, "missing", baseline=float(base_metrics[metric]["value"]),
                                 note="metric not in this run"))
            elif metric not in base_metrics:
                rows.append(_row(config, metric, "new", now=float(run_metrics[metric]["value"]),
                                 note="metric not in the baseline"))
            else:
                rows.append(_judge(config, metric, base_metrics[metric], run_metrics[metric], policy))
    if not any(c in base_configs for c in run_configs):
        warnings.append("no configuration is present in both records: nothing was gated")
    return GateReport(rows=rows, warnings=warnings, baseline_id=baseline["run_id"], run_id=run["run_id"],
                      policy_source=policy.source, speed_gated=speed_gated, speed_reason=speed_reason)


# --------------------------------------------------------------------------- CLI glue


def configure_gate_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``rsp-bench gate``."""
    p.add_argument("--baseline", metavar="FILE",
                   help="baseline record (default: the one for the run's model and machine under --baselines)")
    p.add_argument("--run", metavar="FILE", help="run record to judge (default: the newest under --results)")
    p.add_argument("--policy", metavar="FILE", help="TOML policy layered over the default gate policy")
    p.add_argument("--results", metavar="DIR", default="results/local",
                   help="results folder whose newest run record is judged (default: results/local)")
    p.add_argument("--baselines", metavar="DIR", default=str(DEFAULT_BASELINES_DIR),
                   help=f"baselines folder (default: {DEFAULT_BASELINES_DIR})")
    p.add_argument("--ci", action="store_true",
                   help="CI mode: also fail when a configuration has no baseline or nothing was gated")


def run_gate(args: argparse.Namespace) -> int:
    """Print the gate table; 1 if anything regressed (or, with --ci, if nothing could be
    gated), 0 otherwise."""
    policy = load_policy(args.policy)
    if args.run:
        run = load_record(args.run)
    else:
        newest = latest_records(args.results, limit=1)
        if not newest:
            raise RecordError(f"--results: {Path(args.results) / 'runs'} holds no run records to gate (pass --run FILE)")
        run = newest[0]
    speed_gated = True
    if args.baseline:
        if not Path(args.baseline).exists():
            raise RecordError(f"--baseline: {args.baseline!r} does not exist")
        baseline = load_record(args.baseline)
    else:
        found = load_baseline(args.baselines, run)
        baseline, speed_gated = found.merged(), found.speed is not None
        if baseline is None:
            message = (f"no baseline for model {run['model']['name']!r}, engine "
                       f"{run['extra'].get('engine_under_test', 'reference')!r} under {args.baselines} "
                       f"(looked for {found.quality_path.name}); create one with: rsp-bench baseline update RECORD")
            print(("rsp-bench gate FAILED (--ci): " if args.ci else "warning: ") + message, file=sys.stderr)
            return 1 if args.ci else 0
    report = compare(baseline, run, policy, speed_gated=speed_gated)
    print(report.format_table())
    if not report.passed:
        return 1
    if args.ci and report.ci_problems():
        print("rsp-bench gate FAILED (--ci): " + "; ".join(report.ci_problems()), file=sys.stderr)
        return 1
    return 0
