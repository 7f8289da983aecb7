"""The ``rsp-bench ab`` subcommand: options, progress bar, record file, table, markdown, exit code.

    rsp-bench ab --base origin/main                 # REF against this checkout's working tree
    rsp-bench ab --base-url URL_A --head-url URL_B  # two served engines (OpenAI API)

Exit 0: the head is not decided slower than the horizon and quality is within its budgets
(undecided included unless --fail-undecided); 1: a decided slowdown or a quality regression
(or undecided with --fail-undecided); 2: a usage error, named.

Must NOT import torch or reference_engine at module level (``rsp-bench ab --help`` is instant),
nor rsp_bench.cli (which imports this lazily: no import circle).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import secrets
import sys
import time
from pathlib import Path
from typing import Any, Callable

from rsp_bench.errors import HarnessInputError


def _num(flag: str, lo: float | None = None, hi: float | None = None, *, integer: bool = False,
         open_lo: bool = False, open_hi: bool = False) -> Callable[[str], float]:
    kind = "an integer" if integer else "a number"
    rng = ""
    if lo is not None and hi is not None:
        rng = f" in {'(' if open_lo else '['}{lo:g}, {hi:g}{')' if open_hi else ']'}"
    elif lo is not None:
        rng = f" {'>' if open_lo else '>='} {lo:g}"

    def parse(text: str) -> float:
        try:
            value: float | None = int(text) if integer else float(text)
        except ValueError:
            value = None
        bad = value is None or (not integer and not math.isfinite(value))
        if not bad and lo is not None:
            bad = value <= lo if open_lo else value < lo
        if not bad and hi is not None:
            bad = value >= hi if open_hi else value > hi
        if bad:
            raise argparse.ArgumentTypeError(f"{flag} must be {kind}{rng}, got {text!r}")
        return value  # type: ignore[return-value]
    return parse


def _batches(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"--batch must be comma-separated integers >= 1, e.g. 1,4, got {text!r}")
    return tuple(dict.fromkeys(int(p) for p in parts))


def _mode(text: str) -> str:
    if text not in ("off", "lossy", "lossless", "static"):
        raise argparse.ArgumentTypeError(f"--mode must be one of off, lossy, lossless, static, got {text!r}")
    return text


def configure_parser(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to compare")
    g.add_argument("--base", metavar="REF", help="git ref of the base (a temporary worktree of it runs); "
                   "the head is this checkout's working tree")
    g.add_argument("--head", metavar="REF", help="git ref of the head instead of the working tree (default: the working tree)")
    g.add_argument("--base-url", metavar="URL", help="served engines: the base's OpenAI-compatible URL (with --head-url)")
    g.add_argument("--head-url", metavar="URL", help="served engines: the head's URL")
    g.add_argument("--repo", default=".", metavar="DIR", help="the checkout (default: the current directory)")
    g.add_argument("--engine", default=None, metavar="NAME",
                   help="adapter, a registry name (default: reference; openai with --base-url/--head-url)")
    g.add_argument("--model", default=None, help="local model folder or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--mode", type=_mode, default="off", help="pruning mode both sides run (default: off)")
    g.add_argument("--sensitivity", type=_num("--sensitivity", 0, 1), default=None, help="sensitivity for lossy mode")
    s = p.add_argument_group("speed")
    s.add_argument("--horizon", type=_num("--horizon", 0, 1, open_lo=True, open_hi=True), default=0.05,
                   help="decide inside or outside 1 +- HORIZON (default: 0.05)")
    s.add_argument("--confidence", type=_num("--confidence", 0, 1, open_lo=True, open_hi=True), default=0.95,
                   help="of the interval (default: 0.95)")
    s.add_argument("--trim", type=_num("--trim", 0, 0.5, open_hi=True), default=0.2,
                   help="share of paired rounds trimmed from each end of the interval (default: 0.2; 0: plain t)")
    s.add_argument("--budget", type=_num("--budget", 0), default=60.0, metavar="SECONDS",
                   help="wall time of the speed rounds before stopping undecided (default: 60)")
    s.add_argument("--min-rounds", type=_num("--min-rounds", 2, integer=True), default=6,
                   help="rounds always run, whatever the budget (default: 6)")
    s.add_argument("--max-rounds", type=_num("--max-rounds", 2, integer=True), default=200, help="(default: 200)")
    s.add_argument("--batch", type=_batches, default=(1, 4), metavar="LIST", help="batch sizes (default: 1,4)")
    s.add_argument("--speed-tokens", type=_num("--speed-tokens", 3, integer=True), default=16,
                   help="tokens per timed call (default: 16)")
    s.add_argument("--threads", type=_num("--threads", 0, integer=True), default=1,
                   help="torch/kernel threads per side (default 1: on a shared machine a second thread waits for a "
                        "descheduled one at every barrier, which doubles the noise; 0: every usable core)")
    s.add_argument("--step-stat", choices=("min", "median"), default="min",
                   help="per call, decode speed from its fastest step (default) or its median step")
    s.add_argument("--gate-ttft", action="store_true", help="gate TTFT too (default: reported, not gated)")
    s.add_argument("--fail-undecided", action="store_true", help="exit 1 when speed is undecided at the budget")
    s.add_argument("--no-speed", action="store_true", help="quality only")
    q = p.add_argument_group("quality")
    q.add_argument("--prompts", type=_num("--prompts", 0, integer=True), default=8,
                   help="equivalence prompts through both sides (default: 8; 0 skips quality)")
    q.add_argument("--tokens", type=_num("--tokens", 1, integer=True), default=24, help="greedy tokens per prompt (default: 24)")
    q.add_argument("--squad", type=_num("--squad", 0, integer=True), default=0,
                   help="SQuAD questions for the F1 delta (default: 0, skipped)")
    q.add_argument("--max-flips", type=_num("--max-flips", 0, integer=True), default=0,
                   help="prompts allowed to change tokens (default: 0: a kernel-only change must be token-identical)")
    q.add_argument("--min-top1", type=_num("--min-top1", 0, 1), default=0.99, help="(default: 0.99)")
    q.add_argument("--max-kl", type=_num("--max-kl", 0), default=0.01, help="mean KL(base || head), nats (default: 0.01)")
    q.add_argument("--max-f1-drop", type=_num("--max-f1-drop", 0, 1), default=0.05, help="(default: 0.05)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=None, metavar="PATH",
                   help="the run record (default: results/local/ab/<time>-<id>.json)")
    o.add_argument("--markdown", nargs="?", const="-", default=None, metavar="PATH",
                   help="also write a pull-request comment (to PATH, or stdout with no PATH)")
    o.add_argument("--json", action="store_true", help="print the record as JSON instead of the table")
    o.add_argument("--logs", default=None, metavar="DIR", help="keep the workers' logs in DIR")
    r = p.add_argument_group("repeat harness (false alarms and power)")
    r.add_argument("--repeat", type=_num("--repeat", 1, integer=True), default=1,
                   help="independent runs, fresh workers each (quality on the first only: it is deterministic)")
    r.add_argument("--power-out", default=None, metavar="PATH", help="write the runs' decisions to this power file")
    r.add_argument("--power-name", default=None, metavar="NAME", help="experiment name in the power file (e.g. aa)")
    r.add_argument("--power-note", default=None, metavar="TEXT", help="what the head plants, in words")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _settings(a: argparse.Namespace) -> Any:
    from rsp_bench.ab.runner import ABSettings

    return ABSettings(base=a.base, head=a.head, base_url=a.base_url, head_url=a.head_url, repo=a.repo,
                      engine=a.engine or ("openai" if a.base_url or a.head_url else "reference"),
                      model=a.model, mode=a.mode, sensitivity=a.sensitivity, horizon=a.horizon, confidence=a.confidence, trim=a.trim,
                      budget_s=a.budget, min_rounds=a.min_rounds, max_rounds=a.max_rounds, batches=a.batch,
                      speed_tokens=a.speed_tokens, quality_prompts=a.prompts, quality_tokens=a.tokens, squad=a.squad,
                      threads=a.threads, step_stat=a.step_stat, max_flips=a.max_flips, min_top1=a.min_top1, max_kl=a.max_kl,
                      max_f1_drop=a.max_f1_drop, gate_ttft=a.gate_ttft, fail_undecided=a.fail_undecided)


def _bar(quiet: bool, settings: Any):
    if quiet:
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=settings.max_rounds, desc="ab rounds", unit="round", file=sys.stderr, leave=False,
               bar_format="{desc}: {n} rounds, {elapsed} {postfix}")

    def progress(n: int, metrics: dict) -> None:
        bar.n = n
        bar.set_postfix_str("  ".join(f"{k.split(',')[-1].strip()}: {m['interval']['ratio']:.3f} {m['decision']}"
                                      for k, m in metrics.items() if m["gated"]))
    return bar, progress


def _default_out() -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("results/local/ab") / f"{stamp}-{secrets.token_hex(3)}.json"


def run(a: argparse.Namespace) -> int:
    from rsp_bench.ab import power
    from rsp_bench.ab.runner import prepared_sides, run_with_sides
    from rsp_bench.storage import atomic_write_json

    settings = _settings(a)
    settings.check()
    if a.no_speed and a.prompts == 0:
        raise HarnessInputError("--no-speed with --prompts 0 leaves nothing to compare")
    if (a.power_out is None) != (a.power_name is None):
        raise HarnessInputError("--power-out and --power-name go together")
    if a.power_name is not None and not a.power_name.replace("-", "").replace("_", "").isalnum():
        raise HarnessInputError(f"--power-name must be letters, digits, - or _, got {a.power_name!r}")
    out_path = Path(a.out) if a.out else _default_out()
    if out_path.exists() and out_path.is_dir():
        raise HarnessInputError(f"--out {a.out!r} is a folder; give a file path")
    logs = Path(a.logs) if a.logs else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    import tempfile

    reports, runs = [], []
    with tempfile.TemporaryDirectory(prefix="rsp-ab-logs-") as tmp:
        for i in range(a.repeat):
            bar, progress = _bar(a.quiet, settings)
            t0 = time.perf_counter()
            try:
                with prepared_sides(settings, logs or Path(tmp)) as (base, head, bi, hi):
                    ready = time.perf_counter() - t0
                    report = run_with_sides(base, head, settings, bi, hi, progress,
                                            quality=i == 0, speed=not a.no_speed)
            finally:
                if bar is not None:
                    bar.close()
            report.timing["ready_s"] = ready
            report.timing["total_s"] = time.perf_counter() - t0
            reports.append(report)
            runs.append(power.run_summary(report))
            if a.repeat > 1 and not a.quiet:
                sys.stderr.write(f"run {i + 1}/{a.repeat}: {report.summary_line(a.fail_undecided)}\n")
            if a.power_out:  # written after every run, so a run cut short keeps what it measured
                power.update_power_file(a.power_out, a.power_name,
                                        power.power_entry(runs, reports, None, _diff_cache(settings), a.power_note))
    report = reports[0] if len(reports) == 1 else reports[-1]
    record = report.to_json()
    if len(reports) > 1:
        record["repeats"] = runs
    atomic_write_json(out_path, record)
    if a.json:
        import json

        print(json.dumps(record, indent=2))
    else:
        print(report.table(a.fail_undecided))
        print(f"record: {out_path}")
    if a.markdown is not None:
        md = report.markdown(a.fail_undecided)
        if a.markdown == "-":
            print(md)
        else:
            from rsp_bench.storage import atomic_write_text

            atomic_write_text(a.markdown, md)
    codes = [r.exit_code(a.fail_undecided) for r in reports]
    return max(codes)


_DIFFS: dict[tuple, str | None] = {}


def _diff_cache(settings: Any) -> str | None:
    key = (settings.base, settings.head, settings.repo)
    if key not in _DIFFS:
        _DIFFS[key] = _diff(settings)
    return _DIFFS[key]


def _diff(settings: Any) -> str | None:
    """The change under test as text: ``git diff BASE HEAD`` (HEAD: the working tree)."""
    if settings.base is None:
        return None
    import subprocess

    args = ["git", "-C", settings.repo, "diff", settings.base] + ([settings.head] if settings.head else [])
    try:
        out = subprocess.run(args + ["--", "reference_engine", "rsp_bench"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None
