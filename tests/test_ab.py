"""rsp-bench ab: the statistics on known inputs, the sequential decision on fake sides (no model,
no clock: ratios and decisions only), the quality comparison on planted logits, the report's exit
codes, and the CLI's usage errors. One real worker over the tiny random model checks that a side
imports its own source tree."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rsp_bench.ab import stats
from rsp_bench.ab.report import ABReport
from rsp_bench.ab.runner import ABSettings, WorkerSide, run_quality, run_speed, speed_metrics
from rsp_bench.errors import HarnessInputError

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- stats

@pytest.mark.parametrize("df, expected", [(1, 12.7062), (2, 4.3027), (5, 2.5706), (10, 2.2281), (30, 2.0423)])
def test_t_quantile_matches_tables(df, expected):
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert stats.t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-4)


def test_plain_t_interval_on_log_ratios_by_hand():
    ratios = [0.9, 0.92, 0.88, 0.91, 0.9]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 5
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 4)
    half = 2.7764451 * sd / math.sqrt(5)  # t(0.975, 4)
    iv = stats.log_ratio_interval(ratios, trim=0.0)
    assert iv.n == 5
    assert iv.ratio == pytest.approx(math.exp(mean))
    assert iv.lo == pytest.approx(math.exp(mean - half), rel=1e-6)
    assert iv.hi == pytest.approx(math.exp(mean + half), rel=1e-6)


def test_trimmed_interval_ignores_one_burst_the_plain_one_does_not():
    rng = random.Random(3)
    ratios = [math.exp(rng.gauss(0.0, 0.02)) for _ in range(11)] + [0.58]  # one pair hit by someone's load
    plain = stats.log_ratio_interval(ratios, trim=0.0)
    trimmed = stats.log_ratio_interval(ratios, trim=0.2)
    assert stats.decide(plain, 0.05) == "undecided"
    assert stats.decide(trimmed, 0.05) == "inside"
    assert trimmed.hi - trimmed.lo < 0.5 * (plain.hi - plain.lo)


@pytest.mark.parametrize("trim", [0.0, 0.2])
def test_interval_coverage_under_normal_noise(trim):
    # seeded Monte Carlo: the 95% interval of the centre covers the true ratio about 95% of the time
    rng = random.Random(11)
    true, hits, reps = 0.9, 0, 600
    for _ in range(reps):
        iv = stats.log_ratio_interval([true * math.exp(rng.gauss(0, 0.06)) for _ in range(12)], trim=trim)
        hits += iv.lo <= true <= iv.hi
    assert 0.92 <= hits / reps <= 0.98


@pytest.mark.parametrize("lo, hi, expected", [
    (0.97, 1.03, "inside"), (0.95, 1.05, "inside"), (0.85, 0.94, "slower"), (1.06, 1.2, "faster"),
    (0.93, 1.02, "undecided"), (0.90, 1.10, "undecided"), (0.0, math.inf, "undecided"), (1.02, 1.07, "undecided")])
def test_decide_against_the_horizon(lo, hi, expected):
    iv = stats.RatioInterval(10, (lo + hi) / 2 if math.isfinite(hi) else 1.0, lo, hi, 0.95, 0.01)
    assert stats.decide(iv, 0.05) == expected


def test_one_pair_decides_nothing():
    iv = stats.log_ratio_interval([0.5])
    assert (iv.lo, iv.hi) == (0.0, math.inf)
    assert stats.decide(iv) == "undecided"


def test_overall_verdict():
    assert stats.overall(["inside", "inside"]) == "inside"
    assert stats.overall(["inside", "undecided"]) == "undecided"
    assert stats.overall(["undecided", "slower"]) == "slower"
    assert stats.overall(["faster", "inside"]) == "faster"
    with pytest.raises(HarnessInputError, match="maybe"):
        stats.overall(["maybe"])


@pytest.mark.parametrize("call, match", [
    (lambda: stats.log_ratio_interval([]), "empty"),
    (lambda: stats.log_ratio_interval([1.0, -0.5]), r"ratios\[1\] is -0.5"),
    (lambda: stats.log_ratio_interval([1.0, float("nan")]), "nan"),
    (lambda: stats.log_ratio_interval([1.0, 1.1], confidence=1.5), "1.5"),
    (lambda: stats.log_ratio_interval([1.0, 1.1], trim=0.5), "0.5"),
    (lambda: stats.decide(stats.log_ratio_interval([1.0, 1.1]), horizon=0), "horizon"),
    (lambda: stats.t_quantile(0.975, 0), "df"),
])
def test_stats_bad_input_names_the_value(call, match):
    with pytest.raises(HarnessInputError, match=match):
        call()


# --------------------------------------------------------------------------- fake sides

class FakeSide:
    """A side whose decode step takes ``step_s * noise``: known speed, seeded noise, no model.
    ``log`` keeps the order of calls so the test can check the interleaving."""

    def __init__(self, label: str, step_s: float, noise: float, seed: int, log: list, tokens=None, logits_seed=0):
        self.label, self.step_s, self.noise, self.log = label, step_s, noise, log
        self.rng = random.Random(seed)
        self.tokens = tokens
        self.logits_seed = logits_seed

    def hello(self):
        return {"fake": self.label}

    def time(self, prompts, max_new_tokens):
        self.log.append(self.label)
        f = math.exp(self.rng.gauss(0.0, self.noise))
        return {"ttft_s": 0.05 * f, "step_times_s": [self.step_s * f * len(prompts) ** 0.3] * (max_new_tokens - 1),
                "batch": len(prompts), "method": "fake"}

    def generate(self, prompts, max_new_tokens, logits_dir=None):
        rows = []
        for i, _ in enumerate(prompts):
            toks = list(self.tokens[i]) if self.tokens else [1, 2, 3]
            row = {"token_ids": toks, "prompt_ids": [7, 8], "text": " ".join(map(str, toks))}
            if logits_dir:
                rng = np.random.default_rng(100 + i)  # the same logits on both sides ...
                lg = rng.normal(size=(len(toks), 16)).astype(np.float32)
                for t, tok in enumerate(toks):
                    lg[t, tok] += 10.0  # ... each row's argmax is its own token
                path = f"{logits_dir}/gen_{i}.npy"
                np.save(path, lg)
                row["logits"] = path
            rows.append(row)
        return {"outputs": rows}

    def teacher_forced(self, prompt_ids, continuation_ids, path):
        lg = np.zeros((len(continuation_ids), 16), np.float32)
        for t, tok in enumerate(continuation_ids):
            lg[t, (tok + (1 if t >= 2 else 0)) % 16] = 10.0  # agrees on the first 2 tokens only
        np.save(path, lg)
        return {"logits": path}

    def close(self):
        pass


class FakeClock:
    def __init__(self, log: list, per_call_s: float = 1.0):
        self.log, self.per_call_s = log, per_call_s

    def __call__(self) -> float:
        return len(self.log) * self.per_call_s  # time advances with the calls made, not the wall


def _speed(head_step: float, noise: float, budget: float = 1e9, **kw):
    log: list[str] = []
    settings = ABSettings(base="x", budget_s=budget, warmup=1, **kw)
    base = FakeSide("base", 0.025, noise, 1, log)
    head = FakeSide("head", head_step, noise, 2, log)
    rounds, metrics, stopped = run_speed(base, head, settings, clock=FakeClock(log))
    return rounds, metrics, stopped, log, settings


def test_aa_decides_inside_and_alternates_who_goes_first():
    rounds, metrics, stopped, log, settings = _speed(0.025, 0.02)
    assert stopped == "decided"
    assert {m["decision"] for m in metrics.values() if m["gated"]} == {"inside"}
    assert len({r["round"] for r in rounds}) >= settings.min_rounds
    assert [r["order"][0] for r in rounds if r["batch"] == 1][:4] == ["base", "head", "base", "head"]
    assert log[:4] == ["base", "head", "base", "head"]  # the warm-up pair, then round 0 base first
    assert log[4:6] == ["base", "head"] and log[8:10] == ["head", "base"]


def test_planted_slowdown_is_decided_slower():
    rounds, metrics, stopped, *_ = _speed(0.025 / 0.85, 0.03)
    assert stopped == "decided"
    b1 = metrics["decode tok/s, batch 1"]
    assert b1["decision"] == "slower"
    assert b1["interval"]["ratio"] == pytest.approx(0.85, abs=0.03)


def test_faster_head_is_decided_faster_not_failed():
    _, metrics, _, _, _ = _speed(0.025 / 1.2, 0.02)
    assert metrics["decode tok/s, batch 1"]["decision"] == "faster"


def test_noise_beyond_the_budget_is_undecided():
    rounds, metrics, stopped, log, _ = _speed(0.025, 0.5, budget=40.0)
    assert stopped == "budget"
    assert "undecided" in {m["decision"] for m in metrics.values() if m["gated"]}
    # the budget is checked once per round: no more than one round past it
    assert len(log) <= 40 + 2 * 2 + 4


def test_ttft_is_reported_but_not_gated_unless_asked():
    _, metrics, *_ = _speed(0.025, 0.02)
    assert not metrics["TTFT speed, batch 1"]["gated"]
    _, metrics, *_ = _speed(0.025, 0.02, gate_ttft=True)
    assert metrics["TTFT speed, batch 1"]["gated"]


def test_speed_ratios_point_the_same_way():
    rounds = [{"round": 0, "batch": 1, "order": ["base", "head"],
               "base": {"tokens_per_s": 40.0, "best_tokens_per_s": 50.0, "ttft_s": 0.1},
               "head": {"tokens_per_s": 20.0, "best_tokens_per_s": 40.0, "ttft_s": 0.2}}]
    m = speed_metrics(rounds, ABSettings(base="x", batches=(1,)))
    assert m["decode tok/s, batch 1"]["ratios"] == [0.8]  # fastest steps by default
    assert m["TTFT speed, batch 1"]["ratios"] == [0.5]  # twice the TTFT reads as half the speed
    m = speed_metrics(rounds, ABSettings(base="x", batches=(1,), step_stat="median"))
    assert m["decode tok/s, batch 1"]["ratios"] == [0.5]


def test_a_decided_slowdown_stops_sampling_at_once():
    # batch 4 barely changes (undecided for long), batch 1 is 15% slower: no need to wait for batch 4
    log: list[str] = []
    settings = ABSettings(base="x", budget_s=1e9, min_rounds=6)

    class Split(FakeSide):
        def time(self, prompts, max_new_tokens):
            t = super().time(prompts, max_new_tokens)
            if self.label == "head" and len(prompts) == 1:
                t["step_times_s"] = [x / 0.85 for x in t["step_times_s"]]
            return t

    base, head = FakeSide("base", 0.025, 0.03, 1, log), Split("head", 0.025 * 1.03, 0.03, 2, log)
    rounds, metrics, stopped = run_speed(base, head, settings, clock=FakeClock(log))
    assert stopped == "decided" and metrics["decode tok/s, batch 1"]["decision"] == "slower"
    assert metrics["decode tok/s, batch 4"]["decision"] == "undecided"


# --------------------------------------------------------------------------- report and exit codes

def _report(decisions: dict[str, str], failures=()):
    speed = {k: {"decision": d, "gated": True, "interval": {"n": 6, "ratio": 1.0, "lo": 0.9, "hi": 1.1},
                 "base_median": 1.0, "head_median": 1.0} for k, d in decisions.items()}
    q = {"prompts": 8, "flipped": [], "failures": list(failures), "exact_match_rate": 1.0, "prefix_agreement": 1.0,
         "top1_agreement": 1.0, "positions": 10, "kl_mean": 0.0, "kl_p99": 0.0}
    return ABReport(base={"label": "main"}, head={"label": "wt"}, settings={"horizon": 0.05, "rounds_run": 6},
                    speed=speed, quality=q, stopped="decided")


@pytest.mark.parametrize("decisions, failures, fail_undecided, code", [
    ({"b1": "inside", "b4": "inside"}, (), False, 0),
    ({"b1": "inside", "b4": "undecided"}, (), False, 0),
    ({"b1": "inside", "b4": "undecided"}, (), True, 1),
    ({"b1": "slower", "b4": "inside"}, (), False, 1),
    ({"b1": "faster", "b4": "inside"}, (), False, 0),
    ({"b1": "inside", "b4": "inside"}, ("1 prompt(s) change tokens",), False, 1),
])
def test_exit_codes(decisions, failures, fail_undecided, code):
    report = _report(decisions, failures)
    assert report.exit_code(fail_undecided) == code
    text = report.table(fail_undecided)
    assert ("FAILED" if code else "PASSED") in text
    md = report.markdown(fail_undecided)
    assert md.startswith("### " + ("❌" if code else "✅"))
    json.dumps(report.to_json())  # the record is plain JSON


# --------------------------------------------------------------------------- quality on planted logits

def test_identical_sides_are_token_identical(tmp_path):
    log: list[str] = []
    base, head = FakeSide("base", 1, 0, 1, log), FakeSide("head", 1, 0, 2, log)
    q = run_quality(base, head, ABSettings(base="x", quality_prompts=3), tmp_path)
    assert q["exact_match_rate"] == 1.0 and q["flipped"] == [] and q["failures"] == []
    assert q["top1_agreement"] == 1.0 and q["kl_mean"] == pytest.approx(0.0, abs=1e-12)


def test_a_flipped_prompt_is_named_and_fails_the_budget(tmp_path):
    log: list[str] = []
    base = FakeSide("base", 1, 0, 1, log, tokens=[[1, 2, 3, 4]] * 3)
    head = FakeSide("head", 1, 0, 2, log, tokens=[[1, 2, 3, 4], [1, 2, 9, 9], [1, 2, 3, 4]])
    q = run_quality(base, head, ABSettings(base="x", quality_prompts=3), tmp_path)
    from rsp_bench.datasets import load_prompts

    assert [f["id"] for f in q["flipped"]] == [load_prompts()[1].id]
    assert q["flipped"][0]["first_divergence"] == 2
    assert q["exact_match_rate"] == pytest.approx(2 / 3)
    # the flipped prompt was teacher-forced on the base's tokens: 2 of its 4 positions agree
    assert q["top1_agreement"] == pytest.approx(10 / 12)
    assert any("change tokens" in f and load_prompts()[1].id in f for f in q["failures"])
    assert any("top-1" in f for f in q["failures"])
    q = run_quality(base, head, ABSettings(base="x", quality_prompts=3, max_flips=1, min_top1=0.8, max_kl=100), tmp_path)
    assert q["failures"] == []


# --------------------------------------------------------------------------- CLI usage errors

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsp_bench.cli", "ab", *args, "--quiet"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, named", [
    (("--base", "no-such-ref-xyz"), "'no-such-ref-xyz'"),
    (("--base", "HEAD", "--horizon", "2"), "'2'"),
    (("--base", "HEAD", "--batch", "0,4"), "'0,4'"),
    (("--base", "HEAD", "--budget", "-1"), "'-1'"),
    (("--base", "HEAD", "--min-rounds", "x"), "'x'"),
    (("--base-url", "http://127.0.0.1:9/v1"), "--head-url"),
    (("--base", "HEAD", "--base-url", "http://a/v1", "--head-url", "http://b/v1"), "not both"),
    ((), "--base REF is required"),
    (("--base", "HEAD", "--power-out", "x.json"), "--power-name"),
])
def test_usage_errors_exit_2_naming_the_value(args, named):
    out = _cli(*args)
    assert out.returncode == 2, out.stderr
    assert named in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("kw, named", [
    # the reference adapter never calls the URLs: the run compared this tree with itself and passed
    ({"base_url": "http://127.0.0.1:1/v1", "head_url": "http://127.0.0.1:1/v1"}, "need --engine openai"),
    ({"base_url": "notaurl", "head_url": "alsonot"}, "need --engine openai"),
    ({"base_url": "notaurl", "head_url": "http://127.0.0.1:1/v1", "engine": "openai"}, "--base-url 'notaurl'"),
    ({"base_url": "http://127.0.0.1:1/v1", "head_url": "ftp://h/v1", "engine": "openai"}, "--head-url 'ftp://h/v1'"),
    ({"base_url": "http://:8000/v1", "head_url": "http://h/v1", "engine": "openai"}, "--base-url 'http://:8000/v1'"),
    ({"base": "HEAD", "repo": "/no/such/checkout"}, "--repo '/no/such/checkout'"),
])
def test_settings_refuse_urls_the_run_would_not_call(kw, named):
    with pytest.raises(HarnessInputError) as info:
        ABSettings(**kw).check()
    assert named in str(info.value)


def test_served_urls_with_the_openai_engine_pass_the_check():
    ABSettings(base_url="http://127.0.0.1:1/v1", head_url="https://example.org:8443/v1", engine="openai").check()


def test_cli_urls_go_through_the_openai_engine_and_bad_ones_write_nothing(tmp_path):
    # URLs alone mean the openai adapter (docs/ab.md); a bad URL is named before anything runs
    out = _cli("--base-url", "notaurl", "--head-url", "alsonot", "--out", str(tmp_path / "x.json"))
    assert out.returncode == 2 and "--base-url 'notaurl' is not a server URL" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    # any other adapter named with them would never call them: refused, not a self-comparison
    out = _cli("--base-url", "http://127.0.0.1:1/v1", "--head-url", "http://127.0.0.1:1/v1", "--engine", "reference",
               "--out", str(tmp_path / "x.json"))
    assert out.returncode == 2 and "--engine openai" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "x.json").exists()


def test_outside_a_checkout_is_a_usage_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rsp_bench.cli", "ab", "--base", "HEAD", "--repo", str(tmp_path), "--quiet"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "not inside a git checkout" in out.stderr


# --------------------------------------------------------------------------- a real worker

@pytest.mark.slow
def test_worker_imports_its_own_tree_and_times_a_call(tiny_model_dir, tmp_path):
    settings = ABSettings(base="x", model=str(tiny_model_dir))
    side = WorkerSide("head", REPO, settings, tmp_path)
    try:
        hello = side.hello()
        assert Path(hello["modules"]["reference_engine"]).is_relative_to(REPO)
        assert Path(hello["modules"]["rsp_bench"]).is_relative_to(REPO)
        t = side.time(["hello there", "2 + 2 ="], 4)
        assert t["batch"] == 2 and len(t["step_times_s"]) == 3
        with pytest.raises(HarnessInputError, match="unknown op"):
            side.request("nope")
    finally:
        side.close()
    assert side.proc.returncode == 0


def test_an_interval_from_one_round_is_valid_json() -> None:
    # Under load a short budget may fit one round: its interval is (0, inf), written as null.
    import json

    from rsp_bench.ab.stats import log_ratio_interval

    data = log_ratio_interval([1.02]).to_json()
    assert data["hi"] is None and json.loads(json.dumps(data, allow_nan=False))["lo"] == 0.0
