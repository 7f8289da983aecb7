"""Regression gate: compare a run record with a baseline record under a TOML policy.

Owns the Mann-Whitney U significance test used on timing samples, the comparison itself and
the ``rsp-bench gate`` CLI glue; the policy it judges by (``gate_policy.toml`` beside this file
is the default) is ``rsp_bench.gate_policy``'s. The pytest plugin calls :func:`compare` and fails the
session when ``GateReport.passed`` is false; CI calls ``rsp-bench gate``.

Decision rule, metric by metric, for every configuration present in both records:
  * direction "none" (or no rule matches): verdict "info", never fails;
  * a "higher" fraction whose baseline is 0 is at its floor and cannot regress: "info"
    (saying so), not a check that passes for ever;
  * the change (``now - baseline`` for an ``abs`` tolerance, ``(now - baseline) / |baseline|``
    for ``rel``; a ``flips = k`` tolerance is k items of the metric's n, so "one prompt may
    flip" means what it says at any sample size) is worse than the tolerance -> "regressed",
    better than it -> "improved", else "ok";
  * for a rule with ``significance = true`` and raw ``samples`` in both records, "regressed"
    and "improved" additionally need the two-sided Mann-Whitney U test to reject at family-wise
    level ``alpha`` (Holm's step-down over every significance test of the comparison, so a CI
    run with many timing metrics still expects fewer than alpha false alarms in all), and the
    sample medians moving the same way.
Metrics or configurations on one side only are "new" / "missing": reported, never failing
(a quick run holds a subset of a full baseline), except in CI mode (``GateReport.ci_problems``):
there a configuration with no baseline, a configuration or metric the run lost (when run and
baseline are the same size), a quality metric the baseline lacks, or a comparison that gated
nothing, fails.
A baseline metric with a ``range`` (several machines' quality baselines:
``rsp_bench.baselines.least_favourable``) regresses only past its least favourable bound and
improves only past its most favourable one.
A timing figure's relative tolerance widens to the stored runs' between-run spread and to its
between-session drift on this machine kind (``rsp_bench.speed_drift``: a fresh CI runner is another
session), whichever is larger; the table's tolerance column says which.
Timing metrics (``rsp_bench.baselines.metric_scope`` "machine") are "info" when there is no
speed baseline for this machine, when it is stale (made by other engine code) or when the
timings were taken under contention: reported, not gated, and the summary says so in one line
with how to get speed judged. A configuration that carries only timing metrics is then "info"
too, never "new". Portable speed budgets (ratios that hold on any machine) are the suites' job
(suites/budgets.toml); the A/B of base and head on one machine is ``rsp-bench ab``.

Must NOT import torch, transformers, reference_engine, numpy or scipy: the gate runs in
the lightest CI job there is.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from tabulate import tabulate

from rsp_bench.baselines import DEFAULT_BASELINES_DIR, load_baseline, metric_scope
from rsp_bench.errors import RecordError
from rsp_bench.gate_policy import DIRECTIONS, MetricRule, Policy, load_policy
from rsp_bench.records import latest_records, load_record, validate_record
from rsp_bench.speed_drift import DRIFT_LEVEL, Drift

__all__ = [
    "DIRECTIONS",
    "VERDICTS",
    "MetricRule",
    "Policy",
    "GateReport",
    "load_policy",
    "mann_whitney_u",
    "min_attainable_p",
    "holm_reject",
    "compare",
    "configure_gate_parser",
    "run_gate",
]

VERDICTS = ("ok", "improved", "regressed", "new", "missing", "info")
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
    same_size: bool = True  # baseline and run drew the same prompt sets (both quick or both full)
    drift_basis: str = ""  # what the between-session drift was read from (empty: not used)

    @property
    def passed(self) -> bool:
        return not any(row["verdict"] == "regressed" for row in self.rows)

    @property
    def gated_count(self) -> int:
        """Metrics actually judged against a tolerance (ok, improved or regressed)."""
        return sum(1 for row in self.rows if row["verdict"] in ("ok", "improved", "regressed"))

    def ci_problems(self) -> list[str]:
        """Why CI mode fails a comparison that passed: configurations with no baseline, a
        configuration or metric the run lost, a quality metric the baseline lacks, a
        deterministic (quality) figure that improved past its tolerance, or nothing gated at
        all. Empty when there is nothing to object to.

        An improved quality figure fails CI because greedy quality figures do not move by
        themselves: a configuration that now scores better computes something else than its
        baseline says (a swapped quantization, a changed kernel), and the change must land with
        its new baseline (``--rsp-update-baseline``), not pass silently. Timing figures that
        improved do not fail: they move with the machine. What the run lost fails only when
        run and baseline drew the same sets: a quick run holds a subset of a full baseline."""
        problems = []
        new = sorted({row["config"] for row in self.rows if row["verdict"] == "new" and row["metric"] == "(all)"})
        if new:
            problems.append(f"{len(new)} configuration(s) have no baseline: {', '.join(new)}")
        if self.same_size:
            lost = [row["config"] if row["metric"] == "(all)" else f"{row['config']} {row['metric']}"
                    for row in self.rows if row["verdict"] == "missing"]
            if lost:
                problems.append(f"{len(lost)} configuration(s) or metric(s) of the baseline are not in this run "
                                f"(a test that stopped recording, or a renamed figure): {_some(lost)}")
        unjudged = [f"{row['config']} {row['metric']}" for row in self.rows
                    if row["verdict"] == "new" and row["metric"] != "(all)" and metric_scope(row["metric"]) == "model"]
        if unjudged:
            problems.append(f"{len(unjudged)} quality metric(s) have no baseline value, so nothing judged them "
                            f"(update the baseline with the change): {_some(unjudged)}")
        moved = [f"{row['config']} {row['metric']}" for row in self.rows
                 if row["verdict"] == "improved" and metric_scope(row["metric"]) == "model"]
        if moved:
            problems.append(f"{len(moved)} quality figure(s) improved past their tolerance, so the baseline no longer "
                            f"describes what runs (update it with the change): {_some(moved)}")
        if self.gated_count == 0:
            problems.append("no metric was gated")
        return problems

    @property
    def regressions(self) -> list[dict[str, Any]]:
        return [row for row in self.rows if row["verdict"] == "regressed"]

    def counts(self) -> dict[str, int]:
        return {v: sum(1 for row in self.rows if row["verdict"] == v) for v in VERDICTS}

    def speed_line(self) -> str:
        """One line on whether speed was judged against a stored baseline, and how to get it
        judged when it was not."""
        if self.speed_gated:
            return ("speed: gated against this machine's stored speed baseline (Holm-corrected Mann-Whitney; "
                    f"between-session drift from {self.drift_basis or 'nothing'})")
        return (f"speed: reported, not gated against a stored baseline ({self.speed_reason}); the suites' portable "
                "speed budgets still apply. To judge speed here: `rsp-bench ab --base REF` (base and head "
                "interleaved on this machine), or a speed baseline for this machine "
                "(`rsp-bench baseline update` from 3 or more runs)")

    def summary(self) -> str:
        tally = self.counts()
        # Worst news first: the line is what a CI log shows.
        order = ("regressed", "improved", "ok", "new", "missing", "info")
        counts = ", ".join(f"{tally[v]} {v}" for v in order if tally[v])
        state = "PASSED" if self.passed else "FAILED"
        speed = "" if self.speed_gated else f"; speed reported, not gated ({self.speed_reason})"
        # A CI log shows its last lines: name what regressed there, not only how many.
        which = [f"{row['config']} {row['metric']} {_fmt_change(row['change'], row['change_kind'])} "
                 f"(tolerance {row['tolerance']})" for row in self.regressions]
        named = f"; regressed: {_some(which)}" if which else ""
        return (f"rsp-bench gate {state}: {counts or 'nothing to compare'} (baseline {self.baseline_id}, "
                f"run {self.run_id}; {self.policy_source}{speed}){named}")

    def _body(self) -> list[list[str]]:
        return [
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

    _HEADERS = ["config", "metric", "baseline", "now", "change", "tolerance", "p (Holm)", "verdict"]

    def format_table(self, tablefmt: str = "simple") -> str:
        """Every row as a readable table (tabulate), warnings first, a summary line last."""
        body = self._body()
        parts = [f"warning: {w}" for w in self.warnings]
        parts.append(tabulate(body, headers=self._HEADERS, tablefmt=tablefmt, disable_numparse=True)
                     if body else "(no rows)")
        notes = [f"  {row['config']} {row['metric']}: {row['note']}" for row in self.rows if row["note"] and row["verdict"] != "info"]
        if notes:
            parts.append("notes:\n" + "\n".join(notes))
        parts.append(self.speed_line())
        parts.append(self.summary())
        return "\n".join(parts)

    def format_markdown(self) -> str:
        """A pull-request comment: the verdict, what moved (everything but "ok" and "info"),
        the speed line, and every row folded away."""
        tally = self.counts()
        state = "passed" if self.passed else "**FAILED**"
        moved = [r for r, row in zip(self._body(), self.rows) if row["verdict"] not in ("ok", "info")]
        parts = [f"### rsp-bench gate {state}",
                 "",
                 ", ".join(f"{tally[v]} {v}" for v in ("regressed", "improved", "ok", "new", "missing", "info")
                           if tally[v]) + f" — baseline `{self.baseline_id}`, run `{self.run_id}`",
                 ""]
        parts += [f"> warning: {w}" for w in self.warnings]
        if moved:
            parts += ["", tabulate(moved, headers=self._HEADERS, tablefmt="github", disable_numparse=True)]
        parts += ["", self.speed_line(), "", "<details><summary>every row</summary>", "",
                  tabulate(self._body(), headers=self._HEADERS, tablefmt="github", disable_numparse=True)
                  if self.rows else "(no rows)", "", "</details>"]
        return "\n".join(parts)


def _some(items: Sequence[str], shown: int = 6) -> str:
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")


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


def _tolerance(rule: MetricRule, base: Mapping[str, Any], now: Mapping[str, Any]) -> tuple[float, str]:
    """The tolerance in the change's own unit, and how it reads in the table. ``flips = k`` is
    k items of the smaller n of the two sides (the coarser set decides what one item moves)."""
    if rule.kind != "flips":
        return rule.tolerance, rule.describe()
    sizes = [int(m["n"]) for m in (base, now) if isinstance(m.get("n"), int) and m["n"] > 0]
    if not sizes:
        raise RecordError(f"metric rule {rule.pattern!r} counts flips, but the metric records no n")
    n = min(sizes)
    arrow = "↑" if rule.direction == "higher" else "↓"
    return rule.tolerance / n, f"{arrow} ±{rule.tolerance:g}/{n}"


def _judge(config: str, metric: str, base: Mapping[str, Any], now: Mapping[str, Any], policy: Policy,
           spread: float = 0.0, drift: Drift | None = None) -> dict[str, Any]:
    """One row, with the significance test's raw p-value under ``"_p_raw"`` (the family-wise
    correction across rows happens in :func:`compare`)."""
    b, v = float(base["value"]), float(now["value"])
    rule = policy.rule_for(metric)
    machines_note = ""
    favourable = None
    if rule is not None and rule.direction != "none" and isinstance(base.get("range"), list):
        # Several machines' baselines (rsp_bench.baselines.least_favourable): a regression is
        # judged against the least favourable bound, an improvement against the most favourable.
        lo, hi = (float(x) for x in base["range"])
        b = lo if rule.direction == "higher" else hi
        favourable = hi if rule.direction == "higher" else lo
        if lo != hi:
            machines_note = f"least favourable of the known machines ({lo:.4g}-{hi:.4g})"
    if rule is None or rule.direction == "none":
        change = v - b
        return _row(config, metric, "info", baseline=b, now=v, change=change, change_kind="abs",
                    note="no policy rule" if rule is None else "not gated (direction none)")
    if rule.direction == "higher" and b <= 0.0 and base.get("unit") == "fraction" and not metric.endswith("_delta"):
        # A share that is already 0 cannot fall: a "higher" check on it passes for ever.
        return _row(config, metric, "info", baseline=b, now=v, change=v - b,
                    note="at its floor (0): cannot regress, not gated")
    tolerance, described = _tolerance(rule, base, now)
    kind = "abs" if rule.kind == "flips" else rule.kind
    allowance = drift.allowance(config, metric, rule.direction) if drift is not None and kind == "rel" else 0.0
    if kind == "rel" and max(spread, allowance) > tolerance:
        # The stored runs of this machine already differ by more than the tolerance (spread),
        # or the same code on this machine kind moved the figure that much between sessions (a
        # fresh CI runner is another session): a change inside either is the machine, not the code.
        if allowance >= spread:
            tolerance = allowance
            described = (f"{described} (between-session drift, {DRIFT_LEVEL:.0%} bound: {allowance * 100:.1f}%, "
                         f"{drift.describe(config, metric)})")
        else:
            tolerance, described = spread, f"{described} (between-run spread {spread * 100:.1f}%)"
    if kind == "abs":
        change = v - b
    elif b != 0:
        change = (v - b) / abs(b)
    else:
        # A relative change from zero is undefined; any move is then "infinitely" large.
        change = 0.0 if v == 0 else math.copysign(math.inf, v)
    worse = -change if rule.direction == "higher" else change
    beyond = worse > tolerance + _EPS
    better = -worse > tolerance + _EPS
    if better and favourable is not None:
        gain = (v - favourable) if kind == "abs" else ((v - favourable) / abs(favourable) if favourable else 0.0)
        better = (gain if rule.direction == "higher" else -gain) > tolerance + _EPS
    p_value = None
    note = ""
    samples_worse = None
    if rule.significance:
        xs, ys = base.get("samples") or [], now.get("samples") or []
        if xs and ys and min_attainable_p(len(xs), len(ys)) < policy.alpha:
            _, p_value = mann_whitney_u(xs, ys)
            shift = statistics.median(ys) - statistics.median(xs)
            samples_worse = shift < 0 if rule.direction == "higher" else shift > 0
        elif xs or ys:
            note = f"too few samples for a significance test ({len(xs)} vs {len(ys)}): tolerance alone"
        else:
            note = "no samples: tolerance alone"
    note = "; ".join(x for x in (machines_note, note) if x)
    row = _row(config, metric, "regressed" if beyond else "improved" if better else "ok", baseline=b, now=v,
               change=change, change_kind=kind, tolerance=described, p_value=p_value, note=note)
    row["_test"] = (p_value, samples_worse) if p_value is not None else None
    return row


def holm_reject(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure: which of ``p_values`` are rejected at family-wise level
    ``alpha``. Sorted ascending, the i-th smallest (0-based) is compared with alpha / (m - i),
    stopping at the first that is not below; it controls the chance of any false rejection at
    alpha under any dependence between the tests, and is never less powerful than Bonferroni."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    m = len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] < alpha / (m - rank):
            rejected[i] = True
        else:
            break
    return rejected


def _apply_significance(rows: list[dict[str, Any]], alpha: float) -> None:
    """Holm over every significance test of the comparison: a change beyond tolerance counts
    only when its test rejects family-wise and the medians move its way. Adjusted p-values
    (Holm's, monotone) replace the raw ones in the table."""
    tested = [row for row in rows if row.get("_test")]
    raw = [row["_test"][0] for row in tested]
    rejected = holm_reject(raw, alpha)
    m = len(raw)
    order = sorted(range(m), key=lambda i: raw[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * raw[i]))
        adjusted[i] = running
    for row, reject, p_adj in zip(tested, rejected, adjusted):
        _, samples_worse = row["_test"]
        row["p_value"] = p_adj
        if row["verdict"] == "regressed" and not (reject and samples_worse):
            row["verdict"] = "ok"
            row["note"] = (f"beyond tolerance but not significant (Holm-adjusted p={p_adj:.2g} over {m} tests, "
                           f"alpha {alpha:g}, or the samples disagree)")
        elif row["verdict"] == "improved" and not (reject and not samples_worse):
            row["verdict"] = "ok"
    for row in rows:
        row.pop("_test", None)


def compare(baseline: Mapping[str, Any], run: Mapping[str, Any], policy: Policy | None = None, *,
            speed_gated: bool = True, speed_reason: str = "no speed baseline for this machine",
            spread: Mapping[tuple[str, str], float] | None = None, drift: Drift | None = None) -> GateReport:
    """Compare ``run`` against ``baseline`` (both run records) metric by metric.

    ``speed_gated=False`` (no speed baseline for this machine, a stale one, or timings taken
    under contention: ``speed_reason`` says which) turns every machine-scope metric into
    "info", and a configuration that holds only such metrics is then reported, never "new".
    ``spread`` maps (configuration, metric) to the stored speed runs' relative spread: a
    timing change inside it is never a regression; nor is one inside ``drift``, the figure's
    between-session drift on this machine kind (``rsp_bench.speed_drift``). Rows come in a deterministic order:
    configurations sorted by id, metrics by name. Records are validated first so a malformed
    one raises RecordError.
    """
    spread = spread or {}
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

    def speed_only(conf: Mapping[str, Any]) -> bool:
        return bool(conf["metrics"]) and all(metric_scope(m) == "machine" for m in conf["metrics"])

    for config in sorted(set(base_configs) | set(run_configs)):
        if config not in run_configs:
            if not speed_gated and speed_only(base_configs[config]):
                continue  # a timing-only configuration of a baseline that is not judged here
            rows.append(_row(config, "(all)", "missing", note="configuration not in this run"))
            continue
        if config not in base_configs:
            if not speed_gated and speed_only(run_configs[config]):
                for metric, value in sorted(run_configs[config]["metrics"].items()):
                    rows.append(_row(config, metric, "info", now=float(value["value"]), note=f"speed: {speed_reason}"))
                continue
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
                rows.append(_judge(config, metric, base_metrics[metric], run_metrics[metric], policy,
                                   spread.get((config, metric), 0.0), drift if speed_gated else None))
    _apply_significance(rows, policy.alpha)
    if not any(c in base_configs for c in run_configs):
        warnings.append("no configuration is present in both records: nothing was gated")
    return GateReport(rows=rows, warnings=warnings, baseline_id=baseline["run_id"], run_id=run["run_id"],
                      policy_source=policy.source, speed_gated=speed_gated, speed_reason=speed_reason,
                      same_size=baseline["quick"] == run["quick"],
                      drift_basis=drift.basis if drift is not None and speed_gated else "")


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
                   help="CI mode: also fail when a configuration has no baseline or went missing, a quality "
                        "figure improved past its tolerance, or nothing was gated")
    p.add_argument("--markdown", action="store_true",
                   help="print the report as Markdown for a pull-request comment instead of a plain table")


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
    speed_problem: str | None = None
    spread: dict[tuple[str, str], float] = {}
    drift: Drift | None = None
    if args.baseline:
        if not Path(args.baseline).exists():
            raise RecordError(f"--baseline: {args.baseline!r} does not exist")
        baseline = load_record(args.baseline)
    else:
        found = load_baseline(args.baselines, run)
        baseline, speed_problem, spread = found.merged(), found.speed_problem(), found.spread()
        drift = found.drift()
        if baseline is None:
            size = "" if run["quick"] else "full-run "  # a full run is judged only against a full run's baseline
            message = (f"no {size}baseline for model {run['model']['name']!r}, engine "
                       f"{run['extra'].get('engine_under_test', 'reference')!r} under {args.baselines} "
                       f"(looked for {found.quality_path.name}); create one with: rsp-bench baseline update RECORD")
            print(("rsp-bench gate FAILED (--ci): " if args.ci else "warning: ") + message, file=sys.stderr)
            return 1 if args.ci else 0
    contended = run["extra"].get("contended")
    if contended:
        # The plugin's rule, here too: timings taken by several workers sharing a host's cores
        # measure the sharing, not the engine.
        speed_problem = f"timings taken under contention: {contended} (run speed with one worker per host)"
    report = compare(baseline, run, policy, speed_gated=speed_problem is None, speed_reason=speed_problem or "",
                     spread=spread, drift=drift)
    print(report.format_markdown() if args.markdown else report.format_table())
    if not report.passed:
        return 1
    if args.ci and report.ci_problems():
        print("rsp-bench gate FAILED (--ci): " + "; ".join(report.ci_problems()), file=sys.stderr)
        return 1
    return 0
