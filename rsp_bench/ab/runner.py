"""The A/B runner: prepares the two sides (a git worktree of the base ref, the head's checkout,
or two served URLs), starts one worker process per side, runs the quality comparison and the
interleaved speed rounds, and hands the numbers to ``rsp_bench.ab.report.ABReport``.

Speed rounds: every round runs each batch size once per side, back to back, the side that goes
first alternating round by round (A B, B A, A B ...), so slow drift of a shared machine and any
first-or-second position effect cancel in pairs. The per-round head/base ratio of decode
tokens/s (batch / median step time of the call) is the sample; ``stats.log_ratio_interval`` and
``stats.decide`` say when to stop (every gated metric decided, after ``min_rounds``) or the time
budget ends it (undecided).

Must NOT import torch at module level (only the quality phase needs it, through
rsp_bench.metrics), nor the pytest plugin, nor reference_engine (the workers import the
engine, each from its own source tree).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

from rsp_bench.ab.report import ABReport
from rsp_bench.ab.stats import decide, log_ratio_interval
from rsp_bench.errors import HarnessInputError
from rsp_bench.load_client import check_url

WORKER = Path(__file__).with_name("worker.py")


# --------------------------------------------------------------------------- settings

@dataclass
class ABSettings:
    """Everything one A/B run is told. Defaults fit a CI job of a few minutes on 2 cores."""

    base: str | None = None              # git ref of the base (in-process engines)
    head: str | None = None              # git ref of the head; None = the working tree
    base_url: str | None = None          # served engines: the two servers
    head_url: str | None = None
    repo: str = "."                      # the checkout (head's working tree)
    engine: str = "reference"
    model: str | None = None
    mode: str = "off"
    sensitivity: float | None = None
    horizon: float = 0.05
    confidence: float = 0.95
    trim: float = 0.2                    # share of pairs trimmed from each end (stats module docstring)
    budget_s: float = 60.0               # wall time of the speed phase
    min_rounds: int = 6
    max_rounds: int = 200
    batches: tuple[int, ...] = (1, 4)
    speed_tokens: int = 16
    quality_prompts: int = 8
    quality_tokens: int = 24
    squad: int = 0                       # SQuAD questions for the F1 delta (0: skipped)
    threads: int = 1                     # per side; 0 = every core this process may use (cli --threads says why 1)
    step_stat: str = "min"               # per call: "min" (fastest step) or "median" step time
    max_flips: int = 0
    min_top1: float = 0.99
    max_kl: float = 0.01
    max_f1_drop: float = 0.05
    gate_ttft: bool = False
    fail_undecided: bool = False
    warmup: int = 1

    def check(self) -> None:
        served = self.base_url is not None or self.head_url is not None
        if served and (self.base_url is None or self.head_url is None):
            raise HarnessInputError("--base-url and --head-url go together (got only "
                                    f"{'--base-url' if self.base_url else '--head-url'})")
        if served and (self.base is not None or self.head is not None):
            raise HarnessInputError("give either --base REF (in-process engines) or --base-url/--head-url "
                                    "(served engines), not both")
        if not served and self.base is None:
            raise HarnessInputError("--base REF is required (a git ref of the base), or --base-url with --head-url")
        if served and self.engine != "openai":
            # any other adapter loads the local engine and never calls the URLs: the run would
            # compare this tree with itself and pass
            raise HarnessInputError(f"--base-url/--head-url need --engine openai (the adapter that calls them), "
                                    f"got --engine {self.engine!r}")
        for flag, url in (("--base-url", self.base_url), ("--head-url", self.head_url)):
            if url is not None:
                check_url(url, flag)
        # the served sides run this harness's own tree, so only --base REF reads --repo
        if not served and not Path(self.repo).expanduser().is_dir():
            raise HarnessInputError(f"--repo {str(self.repo)!r} is not a folder (give the git checkout to compare in)")
        for name, value, lo in (("min_rounds", self.min_rounds, 2), ("max_rounds", self.max_rounds, 2),
                                ("speed_tokens", self.speed_tokens, 3), ("quality_prompts", self.quality_prompts, 0),
                                ("quality_tokens", self.quality_tokens, 1), ("squad", self.squad, 0),
                                ("threads", self.threads, 0), ("max_flips", self.max_flips, 0),
                                ("warmup", self.warmup, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise HarnessInputError(f"{name} must be an integer >= {lo}, got {value!r}")
        if self.max_rounds < self.min_rounds:
            raise HarnessInputError(f"max_rounds ({self.max_rounds}) must be >= min_rounds ({self.min_rounds})")
        if not self.batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batches):
            raise HarnessInputError(f"batches must be integers >= 1, got {self.batches!r}")
        for name, value, lo, hi in (("horizon", self.horizon, 0.0, 1.0), ("confidence", self.confidence, 0.0, 1.0),
                                    ("min_top1", self.min_top1, 0.0, 1.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo < value < hi and not (
                    name == "min_top1" and value in (0.0, 1.0)):
                raise HarnessInputError(f"{name} must be a number in ({lo:g}, {hi:g}), got {value!r}")
        if self.step_stat not in ("min", "median"):
            raise HarnessInputError(f"step_stat must be 'min' or 'median', got {self.step_stat!r}")
        if isinstance(self.trim, bool) or not isinstance(self.trim, (int, float)) or not 0 <= self.trim < 0.5:
            raise HarnessInputError(f"trim must be a number in [0, 0.5), got {self.trim!r}")
        for name, value in (("budget_s", self.budget_s), ("max_kl", self.max_kl), ("max_f1_drop", self.max_f1_drop)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
                raise HarnessInputError(f"{name} must be a number >= 0, got {value!r}")


# --------------------------------------------------------------------------- sides

class Side(Protocol):
    """What the runner needs of one side (a worker process, or a fake in tests)."""

    label: str

    def hello(self) -> dict[str, Any]: ...
    def generate(self, prompts: list[str], max_new_tokens: int, logits_dir: str | None = None) -> dict[str, Any]: ...
    def teacher_forced(self, prompt_ids: list[int], continuation_ids: list[int], path: str) -> dict[str, Any]: ...
    def time(self, prompts: list[str], max_new_tokens: int) -> dict[str, Any]: ...
    def close(self) -> None: ...


class WorkerSide:
    """A worker process (worker.py) serving one source tree, spoken to in JSON lines."""

    def __init__(self, label: str, root: Path, settings: ABSettings, log_dir: Path, url: str | None = None) -> None:
        self.label = label
        self.root = root
        self.log_path = log_dir / f"{label}.log"
        threads = settings.threads or _usable_cores()
        cmd = [sys.executable, str(WORKER), "--root", str(root), "--engine", settings.engine,
               "--mode", settings.mode, "--threads", str(threads)]
        if settings.model:
            cmd += ["--model", str(Path(settings.model).expanduser().resolve())]
        if settings.sensitivity is not None:
            cmd += ["--sensitivity", repr(settings.sensitivity)]
        if url is not None:
            cmd += ["--url", url]
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the worker puts its own tree first; nothing may come before it
        env["TQDM_DISABLE"] = "1"
        env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        env["OMP_WAIT_POLICY"] = env.get("OMP_WAIT_POLICY", "PASSIVE")  # an idle side must not spin on the cores the other is timing
        self._log = open(self.log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, bufsize=1, env=env, cwd=str(root))
        self._ready: dict[str, Any] | None = None

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(timeout=30)
            raise HarnessInputError(f"the {self.label} worker ({self.root}) exited with code {code}; "
                                    f"last lines of its log {self.log_path}:\n{_tail(self.log_path)}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise HarnessInputError(f"the {self.label} worker ({self.root}): {reply.get('error')} "
                                    f"(log: {self.log_path})")
        return reply

    def wait_ready(self) -> None:
        if self._ready is None:
            self._ready = self._read()

    def request(self, op: str, **kw: Any) -> dict[str, Any]:
        self.wait_ready()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def hello(self) -> dict[str, Any]:
        return self.request("hello")

    def generate(self, prompts: list[str], max_new_tokens: int, logits_dir: str | None = None) -> dict[str, Any]:
        return self.request("generate", prompts=prompts, max_new_tokens=max_new_tokens, logits_dir=logits_dir)

    def teacher_forced(self, prompt_ids: list[int], continuation_ids: list[int], path: str) -> dict[str, Any]:
        return self.request("teacher_forced", prompt_ids=prompt_ids, continuation_ids=continuation_ids, path=path)

    def time(self, prompts: list[str], max_new_tokens: int) -> dict[str, Any]:
        return self.request("time", prompts=prompts, max_new_tokens=max_new_tokens)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()  # our own child, by its handle
                self.proc.wait()
        self._log.close()


def _tail(path: Path, n: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


# --------------------------------------------------------------------------- git

def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise HarnessInputError("git is not installed: --base REF needs it (or use --base-url/--head-url)") from None


def repo_root(path: str | os.PathLike[str]) -> Path:
    out = _git(Path(path), "rev-parse", "--show-toplevel")
    if out.returncode != 0:
        raise HarnessInputError(f"{str(path)!r} is not inside a git checkout: `rsp-bench ab --base REF` compares "
                                "REF with the working tree of the checkout it runs in")
    return Path(out.stdout.strip())


def resolve_ref(repo: Path, ref: str, flag: str = "--base") -> str:
    """The commit ``ref`` names in ``repo``, or a usage error naming it."""
    if not isinstance(ref, str) or not ref.strip() or ref.startswith("-"):
        raise HarnessInputError(f"{flag} must name a git ref (a branch, tag or commit), got {ref!r}")
    out = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if out.returncode != 0:
        raise HarnessInputError(f"{flag} {ref!r} is not a commit in {repo} (try `git log --oneline` for refs)")
    return out.stdout.strip()


@contextmanager
def worktree(repo: Path, commit: str) -> Iterator[Path]:
    """A detached ``git worktree`` of ``commit`` in a temporary folder, removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="rsp-ab-"))
    path = tmp / "tree"
    out = _git(repo, "worktree", "add", "--detach", str(path), commit)
    if out.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise HarnessInputError(f"git worktree add of {commit[:12]} failed: {out.stderr.strip()}")
    try:
        yield path
    finally:
        _git(repo, "worktree", "remove", "--force", str(path))
        shutil.rmtree(tmp, ignore_errors=True)
        _git(repo, "worktree", "prune")


def _describe(repo: Path, root: Path, ref: str | None, commit: str | None) -> dict[str, Any]:
    dirty = None
    if ref is None:  # the working tree: say whether it holds uncommitted changes
        st = _git(root, "status", "--porcelain", "--untracked-files=no")
        dirty = bool(st.stdout.strip()) if st.returncode == 0 else None
        commit = _git(root, "rev-parse", "HEAD").stdout.strip() or None
    label = (ref or "working tree") + (f" ({commit[:12]})" if commit else "") + (" +changes" if dirty else "")
    return {"ref": ref, "commit": commit, "root": str(root), "dirty": dirty, "label": label}


# --------------------------------------------------------------------------- quality

def _prompt_items(n: int) -> list[Any]:
    from rsp_bench.datasets import load_prompts

    items = load_prompts()
    return items[:n]


def run_quality(base: Side, head: Side, settings: ABSettings, work: Path) -> dict[str, Any]:
    """The same prompts through both sides, greedy: exact match, prefix agreement, the flipped
    prompts, and the head's teacher-forced logits on the base's continuation (top-1, KL);
    optionally SQuAD F1 of both and its paired delta. Every figure comes from rsp_bench.metrics."""
    import numpy as np

    from rsp_bench import metrics

    items = _prompt_items(settings.quality_prompts)
    out: dict[str, Any] = {"prompts": len(items), "tokens": settings.quality_tokens, "flipped": []}
    if not items:
        return {}
    texts = [p.text for p in items]
    (work / "base").mkdir(exist_ok=True)
    (work / "head").mkdir(exist_ok=True)
    b = base.generate(texts, settings.quality_tokens, str(work / "base"))["outputs"]
    h = head.generate(texts, settings.quality_tokens, str(work / "head"))["outputs"]
    b_ids, h_ids = [r["token_ids"] for r in b], [r["token_ids"] for r in h]
    out["exact_match_rate"] = metrics.exact_match_rate(b_ids, h_ids)
    out["prefix_agreement"] = metrics.prefix_agreement(b_ids, h_ids)
    base_logits, head_logits = [], []
    for i, (item, rb, rh) in enumerate(zip(items, b, h)):
        base_logits.append(np.load(rb["logits"]))
        if rb["token_ids"] == rh["token_ids"] and rb["prompt_ids"] == rh["prompt_ids"]:
            head_logits.append(np.load(rh["logits"]))  # generation logits = teacher-forced ones here
        else:
            path = str(work / "head" / f"tf_{i}.npy")
            head_logits.append(np.load(head.teacher_forced(rb["prompt_ids"], rb["token_ids"], path)["logits"]))
        if rb["token_ids"] != rh["token_ids"]:
            out["flipped"].append({"index": i, "id": item.id, "prompt": item.text,
                                   "first_divergence": metrics.first_divergence(rb["token_ids"], rh["token_ids"]),
                                   "base_text": rb["text"], "head_text": rh["text"],
                                   "base_tokens": rb["token_ids"], "head_tokens": rh["token_ids"]})
    out["prompt_ids_equal"] = all(rb["prompt_ids"] == rh["prompt_ids"] for rb, rh in zip(b, h))
    out["top1_agreement"] = metrics.top1_agreement(base_logits, head_logits)
    out["positions"] = int(sum(x.shape[0] for x in base_logits))
    kl = metrics.kl_summary(metrics.kl_per_token(base_logits, head_logits).numpy())
    out["kl_mean"], out["kl_p99"] = kl["mean"], kl["p99"]
    if settings.engine == "openai":
        out["kl_name"] = "KL(base || head) mean (truncated top-N logprobs: an estimate)"
    if settings.squad:
        out["squad_f1_delta"] = _squad_delta(base, head, settings)
    failures = []
    if len(out["flipped"]) > settings.max_flips:
        names = ", ".join(f["id"] for f in out["flipped"])
        failures.append(f"{len(out['flipped'])} prompt(s) change tokens (allowed {settings.max_flips}): {names}")
    if out["top1_agreement"] < settings.min_top1:
        failures.append(f"top-1 agreement {out['top1_agreement']:.4f} < {settings.min_top1:g}")
    if out["kl_mean"] > settings.max_kl:
        failures.append(f"mean KL {out['kl_mean']:.4g} > {settings.max_kl:g} nats")
    d = out.get("squad_f1_delta")
    if d is not None and d["delta"] < -settings.max_f1_drop:
        failures.append(f"SQuAD F1 delta {d['delta']:+.3f} < -{settings.max_f1_drop:g}")
    out["budgets"] = {"max_flips": settings.max_flips, "min_top1": settings.min_top1, "max_kl": settings.max_kl,
                      "max_f1_drop": settings.max_f1_drop}
    out["failures"] = failures
    return out


def _squad_delta(base: Side, head: Side, settings: ABSettings) -> dict[str, Any]:
    from rsp_bench import metrics
    from rsp_bench.datasets import load_squad, quick_subset, squad_prompt

    items = quick_subset(load_squad(), settings.squad, seed=0)
    prompts = [squad_prompt(it) for it in items]
    fb = [metrics.squad_f1(r["text"], it.answers) for r, it in zip(base.generate(prompts, 24)["outputs"], items)]
    fh = [metrics.squad_f1(r["text"], it.answers) for r, it in zip(head.generate(prompts, 24)["outputs"], items)]
    delta, lo, hi = metrics.bootstrap_paired_diff_ci(fh, fb)
    return {"n": len(items), "base_f1": sum(fb) / len(fb), "head_f1": sum(fh) / len(fh), "delta": delta,
            "lo": lo, "hi": hi, "ids": [it.id for it in items]}


# --------------------------------------------------------------------------- speed

def _sample(t: dict[str, Any]) -> dict[str, Any]:
    steps = t["step_times_s"]
    if not steps:
        raise HarnessInputError("a timed call made no decode step (every prompt stopped at its first token): "
                                "raise --speed-tokens")
    med, best = statistics.median(steps), min(steps)
    return {"ttft_s": t["ttft_s"], "median_step_s": med, "min_step_s": best, "tokens_per_s": t["batch"] / med,
            "best_tokens_per_s": t["batch"] / best, "steps": len(steps), "step_times_s": steps, "batch": t["batch"],
            "method": t.get("method", "")}


def speed_metrics(rounds: Sequence[dict[str, Any]], settings: ABSettings) -> dict[str, dict[str, Any]]:
    """Per metric (decode tokens/s and TTFT at each batch): the paired ratios, their interval and
    decision. Both are speed ratios (> 1: head faster): tokens/s head/base, TTFT base/head.

    Decode tokens/s of a call is batch / its fastest step by default (``step_stat="min"``): other
    jobs on a shared machine only ever slow a step down, so the fastest of a call's 15 steps is the
    one least touched by them, and a change of the step's own work moves every step, the fastest
    included. Measured in A/A runs here (2 cores, two other jobs): the interval of the ratio of
    fastest steps was 1.5-4x narrower than that of median steps (docs/ab.md)."""
    out: dict[str, dict[str, Any]] = {}
    tps = "best_tokens_per_s" if settings.step_stat == "min" else "tokens_per_s"
    for batch in settings.batches:
        rs = [r for r in rounds if r["batch"] == batch]
        for key, name, gated in ((tps, f"decode tok/s, batch {batch}", True),
                                 ("ttft_s", f"TTFT speed, batch {batch}", settings.gate_ttft)):
            if not rs:
                continue
            if key != "ttft_s":
                ratios = [r["head"][key] / r["base"][key] for r in rs]
            else:  # a time: base / head, so that > 1 still means the head is faster
                ratios = [r["base"][key] / r["head"][key] for r in rs]
            iv = log_ratio_interval(ratios, settings.confidence, settings.trim)
            out[name] = {"metric": key, "batch": batch, "gated": gated, "ratios": ratios, "interval": iv.to_json(),
                         "decision": decide(iv, settings.horizon),
                         "base_median": statistics.median(r["base"][key] for r in rs),
                         "head_median": statistics.median(r["head"][key] for r in rs)}
    return out


def _speed_prompts(batch: int) -> list[str]:
    """The ``batch`` shortest prompts of the fixed set: a timed call is mostly prefill otherwise
    (prefill of ~45 tokens at one thread costs about 15 decode steps here), and only its decode
    steps are the sample."""
    from rsp_bench.speed.calls import fixed_prompts, prompts_for_batch

    return prompts_for_batch(sorted(fixed_prompts(), key=len), batch)


def run_speed(base: Side, head: Side, settings: ABSettings, progress: Callable[[int, dict], None] | None = None,
              clock: Callable[[], float] = time.monotonic) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], str]:
    """Interleaved rounds until every gated metric is decided, the budget runs out (both only
    after min_rounds, which always run), or max_rounds. Returns (rounds, metrics, why it stopped)."""
    prompts = {b: _speed_prompts(b) for b in settings.batches}
    t0 = clock()  # the budget covers the warm-up too: it is what a CI job waits for
    for _ in range(settings.warmup):  # first calls allocate, fault pages in, fill caches: discarded
        for b in settings.batches:
            base.time(prompts[b], settings.speed_tokens)
            head.time(prompts[b], settings.speed_tokens)
    rounds: list[dict[str, Any]] = []
    stopped, metrics_now = "max_rounds", {}
    for r in range(settings.max_rounds):
        order = [("base", base), ("head", head)] if r % 2 == 0 else [("head", head), ("base", base)]
        for b in settings.batches:
            row: dict[str, Any] = {"round": r, "batch": b, "order": [n for n, _ in order]}
            for name, side in order:
                row[name] = _sample(side.time(prompts[b], settings.speed_tokens))
            rounds.append(row)
        metrics_now = speed_metrics(rounds, settings)
        if progress is not None:
            progress(r + 1, metrics_now)
        gated = [m["decision"] for m in metrics_now.values() if m["gated"]]
        if r + 1 >= settings.min_rounds and (all(d != "undecided" for d in gated) or "slower" in gated):
            stopped = "decided"
            break
        # min_rounds is a floor the budget cannot cut: fewer paired rounds give no interval worth reading
        if r + 1 >= settings.min_rounds and clock() - t0 >= settings.budget_s:
            stopped = "budget"
            break
    return rounds, metrics_now, stopped


# --------------------------------------------------------------------------- the run

def _machine() -> dict[str, Any]:
    from rsp_bench.records.environment import machine_info

    return machine_info(gpu=None)


def run_with_sides(base: Side, head: Side, settings: ABSettings, base_info: dict[str, Any], head_info: dict[str, Any],
                   progress: Callable[[int, dict], None] | None = None, quality: bool = True,
                   speed: bool = True) -> ABReport:
    """Quality, then speed, over two ready sides; the report. (Tests call this with fake sides.)"""
    timing: dict[str, float] = {}
    report = ABReport(base=base_info, head=head_info, settings={}, machine=_machine())
    with tempfile.TemporaryDirectory(prefix="rsp-ab-logits-") as tmp:
        t = time.perf_counter()
        base_info["worker"], head_info["worker"] = base.hello(), head.hello()
        timing["start_s"] = time.perf_counter() - t
        if quality and settings.quality_prompts:
            t = time.perf_counter()
            report.quality = run_quality(base, head, settings, Path(tmp))
            timing["quality_s"] = time.perf_counter() - t
    if speed:
        t = time.perf_counter()
        report.rounds, report.speed, report.stopped = run_speed(base, head, settings, progress)
        timing["speed_s"] = time.perf_counter() - t
    report.timing = timing
    report.settings = {**asdict(settings), "rounds_run": len({r["round"] for r in report.rounds}),
                       "batches": list(settings.batches)}
    return report


@contextmanager
def prepared_sides(settings: ABSettings, log_dir: Path) -> Iterator[tuple[Side, Side, dict[str, Any], dict[str, Any]]]:
    """Both sides started (in parallel: each loads its model while the other does), closed and
    their worktrees removed on exit."""
    settings.check()
    with ExitStack() as stack:
        if settings.base_url is not None:
            head_root = Path(__file__).resolve().parents[2]  # the openai adapter of this harness, both sides
            base_info = {"ref": None, "url": settings.base_url, "label": settings.base_url, "root": str(head_root)}
            head_info = {"ref": None, "url": settings.head_url, "label": settings.head_url, "root": str(head_root)}
            urls = (settings.base_url, settings.head_url)
            roots = (head_root, head_root)
        else:
            repo = repo_root(settings.repo)
            base_commit = resolve_ref(repo, settings.base, "--base")
            head_commit = resolve_ref(repo, settings.head, "--head") if settings.head is not None else None
            base_root = stack.enter_context(worktree(repo, base_commit))
            head_root = stack.enter_context(worktree(repo, head_commit)) if head_commit else repo
            base_info = _describe(repo, base_root, settings.base, base_commit)
            head_info = _describe(repo, head_root, settings.head, head_commit)
            urls, roots = (None, None), (base_root, head_root)
        base = WorkerSide("base", roots[0], settings, log_dir, urls[0])
        stack.callback(base.close)
        head = WorkerSide("head", roots[1], settings, log_dir, urls[1])
        stack.callback(head.close)
        base.wait_ready()
        head.wait_ready()
        yield base, head, base_info, head_info


def run_ab(settings: ABSettings | None = None, *, progress: Callable[[int, dict], None] | None = None,
           log_dir: str | os.PathLike[str] | None = None, **overrides: Any) -> ABReport:
    """One A/B run: ``run_ab(base="origin/main")`` compares that ref with the working tree of the
    current checkout; ``run_ab(base_url=..., head_url=..., engine="openai")`` two served engines.
    What the pytest plugin and the CLI call; settings as ``ABSettings`` fields."""
    settings = settings or ABSettings()
    for k, v in overrides.items():
        if not hasattr(settings, k):
            raise HarnessInputError(f"run_ab got an unknown setting {k!r}")
        setattr(settings, k, v)
    settings.check()
    with ExitStack() as stack:
        logs = Path(log_dir) if log_dir else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rsp-ab-logs-")))
        logs.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        with prepared_sides(settings, logs) as (base, head, bi, hi):
            ready = time.perf_counter() - t
            report = run_with_sides(base, head, settings, bi, hi, progress)
        report.timing["ready_s"] = ready
        report.timing["total_s"] = time.perf_counter() - t
        return report
