"""The A/B report: what one ``rsp-bench ab`` run decided, as data (``ABReport``), its exit code,
a terminal table (tabulate) and a pull-request comment (``--markdown``).

It holds results; it measures nothing. The verdict rules live here so that the CLI, the pytest
plugin and the power harness read one definition:
  exit 1  a gated speed metric is decided "slower" than the horizon, or a quality budget fails;
  exit 1  the verdict is "undecided" and the caller asked for that to fail (``fail_undecided``);
  exit 0  otherwise (inside, faster, or undecided by default).

Must NOT import torch, numpy, the reference engine, or rsp_bench.ab.runner (the runner builds
reports; a report never runs anything).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rsp_bench.ab.stats import overall

SCHEMA = "rsp-bench-ab/1"


@dataclass
class ABReport:
    """One A/B run. ``speed``: metric name -> {interval, decision, gated, ...}; ``quality``: the
    equivalence figures, the flipped prompts, the budgets and which failed; ``rounds``: every
    measured call of both sides, in run order."""

    base: dict[str, Any]
    head: dict[str, Any]
    settings: dict[str, Any]
    speed: dict[str, dict[str, Any]] = field(default_factory=dict)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    quality: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)  # wall seconds of each phase
    stopped: str = ""  # why speed sampling ended: "decided", "budget", "max_rounds"

    # ---- verdicts ----
    @property
    def speed_verdict(self) -> str:
        gated = [m["decision"] for m in self.speed.values() if m.get("gated")]
        return overall(gated) if gated else "not measured"

    @property
    def quality_failures(self) -> list[str]:
        return list(self.quality.get("failures", []))

    def exit_code(self, fail_undecided: bool = False) -> int:
        if self.speed_verdict == "slower" or self.quality_failures:
            return 1
        if fail_undecided and self.speed_verdict == "undecided":
            return 1
        return 0

    def summary_line(self, fail_undecided: bool = False) -> str:
        code = self.exit_code(fail_undecided)
        h = self.settings.get("horizon", 0.05)
        parts = [f"speed {self.speed_verdict} (horizon ±{100 * h:g}%, {self.settings.get('rounds_run', 0)} rounds, "
                 f"stopped: {self.stopped or 'n/a'})"]
        q = self.quality
        if q:
            flips = q.get("flipped", [])
            parts.append("quality " + ("FAILED: " + "; ".join(self.quality_failures) if self.quality_failures
                                       else f"ok ({len(flips)} of {q.get('prompts', 0)} prompts flip)"))
        return f"rsp-bench ab {'FAILED' if code else 'PASSED'}: " + ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "base": self.base, "head": self.head, "settings": self.settings,
                "speed": self.speed, "speed_verdict": self.speed_verdict, "stopped": self.stopped,
                "quality": self.quality, "quality_failures": self.quality_failures, "rounds": self.rounds,
                "machine": self.machine, "timing": self.timing,
                "exit_code": self.exit_code(bool(self.settings.get("fail_undecided", False)))}

    # ---- rendering ----
    def _speed_rows(self) -> list[list[str]]:
        rows = []
        for name, m in self.speed.items():
            iv = m["interval"]
            hi = "inf" if iv["hi"] in (None, float("inf")) else f"{iv['hi']:.3f}"
            rows.append([name, f"{m['base_median']:.4g}", f"{m['head_median']:.4g}", f"{iv['ratio']:.3f}",
                         f"[{iv['lo']:.3f}, {hi}]", str(iv["n"]), m["decision"] + ("" if m.get("gated") else " (info)")])
        return rows

    def _quality_rows(self) -> list[list[str]]:
        q = self.quality
        if not q:
            return []
        rows = [["exact match (head vs base)", f"{q['exact_match_rate']:.3f}", f"{q['prompts'] - len(q['flipped'])}/{q['prompts']} prompts"],
                ["prefix agreement", f"{q['prefix_agreement']:.3f}", ""],
                ["teacher-forced top-1", f"{q['top1_agreement']:.4f}", f"{q['positions']} positions"],
                [q.get("kl_name", "KL(base || head) mean"), f"{q['kl_mean']:.3g}", f"p99 {q['kl_p99']:.3g} nats"]]
        if "squad_f1_delta" in q:
            d = q["squad_f1_delta"]
            rows.append(["SQuAD F1 delta (head - base)", f"{d['delta']:+.3f}",
                         f"[{d['lo']:+.3f}, {d['hi']:+.3f}], n={d['n']}"])
        return rows

    def table(self, fail_undecided: bool = False) -> str:
        from tabulate import tabulate

        out = [f"base: {self.base.get('label')}   head: {self.head.get('label')}"]
        if self.speed:
            out.append(tabulate(self._speed_rows(), headers=["speed (head/base, >1 faster)", "base", "head", "ratio",
                                                             f"{100 * self.settings.get('confidence', 0.95):g}% CI", "n", "decision"]))
        if self.quality:
            out.append(tabulate(self._quality_rows(), headers=["quality", "value", ""]))
            for f in self.quality.get("flipped", []):
                out.append(f"  flips: prompt {f['index']} ({f['id']}) at token {f['first_divergence']}: "
                           f"{f['prompt'][:60]!r}")
        out.append(self.summary_line(fail_undecided))
        return "\n".join(out)

    def markdown(self, fail_undecided: bool = False) -> str:
        from tabulate import tabulate

        code = self.exit_code(fail_undecided)
        icon = "❌" if code else "✅"
        h = self.settings.get("horizon", 0.05)
        lines = [f"### {icon} rsp-bench A/B: `{self.head.get('label')}` against `{self.base.get('label')}`", "",
                 f"Speed verdict: **{self.speed_verdict}** (95% interval of the head/base ratio against ±{100 * h:g}%; "
                 f"{self.settings.get('rounds_run', 0)} paired rounds, alternating order, stopped: {self.stopped}). "
                 f"Machine `{self.machine.get('fingerprint', '?')}` ({self.machine.get('cpu', '?')}, "
                 f"{self.machine.get('cores', '?')} cores).", ""]
        if self.speed:
            lines.append(tabulate(self._speed_rows(), headers=["speed (>1: head faster)", "base", "head", "ratio", "95% CI", "n",
                                                               "decision"], tablefmt="github"))
            lines.append("")
        if self.quality:
            lines.append(tabulate(self._quality_rows(), headers=["quality", "value", ""], tablefmt="github"))
            lines.append("")
            flips = self.quality.get("flipped", [])
            if flips:
                lines.append(f"<details><summary>{len(flips)} prompt(s) change tokens</summary>\n")
                for f in flips:
                    lines.append(f"- `{f['id']}` (token {f['first_divergence']}): base `{f['base_text'][:80]}` / "
                                 f"head `{f['head_text'][:80]}`")
                lines.append("\n</details>\n")
            for fail in self.quality_failures:
                lines.append(f"- quality budget failed: {fail}")
        lines.append(f"`{self.summary_line(fail_undecided)}`")
        return "\n".join(lines) + "\n"
