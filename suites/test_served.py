"""Served suite: the reference engine behind ``rsp-bench serve`` (a child process on a free port
of 127.0.0.1), measured through the ``openai`` adapter over HTTP, against the in-process
reference on the same prompts. It checks that serving changes nothing and that what the HTTP
path can measure agrees with the in-process figures:

- pruning off over HTTP: exact match 1.0 and top-1 agreement 1.0 with the in-process run;
- lossy at each session sensitivity: the same top-1 agreement as the in-process engine at that
  sensitivity (exact match is recorded beside the in-process one, not asserted equal), and a truncated KL (top-N listed, the rest merged
  into one bucket: a lower bound) beside the in-process full-vocabulary KL.

Records ``served-reference/<mode>[/s=..]`` rows: the equivalence figures as the HTTP path gives
them, ``kl_mean_truncated`` (params top_n) and, beside them, the in-process
``kl_mean_in_process`` (the full KL it estimates), ``exact_match_rate_in_process`` and
``top1_agreement_in_process``. The tail-uniform ``kl_mean`` an HTTP tensor would give is not recorded.

The server as an operator runs it (issue 27; one server with an API key): schemathesis fuzzing
from the server's own OpenAPI schema (no 5xx, no schema violation), bad input and the once
reproduced 500s, disconnects and stop strings ending the decode, a soak, SIGTERM with requests
in flight; figures as load_* metrics of served-reference-load/off.

Sizes: quick 4 prompts x 16 new tokens, pruning off only (see pytest_generate_tests); full 16 x 32. Skipped under ``--rsp-engine openai``
(the other suites then measure the server; this suite's rows would repeat theirs).

Must NOT compute a figure itself (rsp_bench.quality / rsp_bench.metrics / the adapter module do)
or import the reference engine (the plugin's fixtures hand it over).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rsp_bench import datasets as ds
from rsp_bench.engines import ConfigSpec, format_config_id, pruning_config
from rsp_bench.metrics import token_nll
from rsp_bench.quality import equivalence_metrics, record_metrics

# reference_only: it serves the reference engine (and runs llama-cpp-python's server), whatever
# --rsp-engine is under test; `--rsp-engine openai --rsp-engine-url` puts any server through the
# equivalence and extraction suites instead.
pytestmark = [pytest.mark.equivalence, pytest.mark.reference_only]

QUICK_PROMPTS, QUICK_NEW_TOKENS = 4, 16
FULL_PROMPTS, FULL_NEW_TOKENS = 16, 32
NAME = "served-reference"
LOAD_MAX_QUEUE = 4


@pytest.fixture(scope="module")
def served_url(rsp_options):
    """One ``rsp-bench serve`` for the match, lm-eval and bounded-load tests (each start is
    8-11 s of the quick suite): the knobs come per request, in headers, so nothing one test
    does changes what the next one is served. ``--max-queue 4`` is the load test's; the other
    tests send one request at a time."""
    pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")
    if rsp_options.engine == "openai":
        pytest.skip("--rsp-engine openai: the other suites measure the server already")
    from rsp_bench.engines.openai_engine import ServedProcess

    args = ["--hardware-watermark", "0", "--log-level", "NONE", "--max-queue", str(LOAD_MAX_QUEUE)]
    if rsp_options.model:
        args += ["--model", str(rsp_options.model)]
    with ServedProcess(args) as url:
        yield url


@pytest.fixture(scope="module")
def served_adapter(served_url, rsp_engine):
    pytest.importorskip("openai", reason="the 'serve' extra is not installed")
    from rsp_bench.engines.openai_engine import OpenAIAdapter

    return OpenAIAdapter(rsp_engine, served_url + "/v1")


@pytest.fixture(scope="module")
def served_sizes(rsp_options) -> tuple[list[str], int]:
    n, new = (QUICK_PROMPTS, QUICK_NEW_TOKENS) if rsp_options.quick else (FULL_PROMPTS, FULL_NEW_TOKENS)
    prompts = [p.text for p in ds.quick_subset(ds.load_prompts(), n, seed=rsp_options.subset_seed)]
    return prompts, rsp_options.max_new_tokens or new


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "served_case" in metafunc.fixturenames:
        from rsp_bench.plugin import get_options

        options = get_options(metafunc.config)
        # Quick (CI) runs pruning off only: over HTTP it must be exact, so it can be gated. The
        # lossy cross-check runs in full mode (16 prompts x 32 tokens, every sensitivity). An
        # earlier session saw served lossy figures move between two runs on the torch kernel
        # (cause not found); on the native kernel (bit-identical at 1 and 2 threads) two full
        # runs gave identical figures, equal to in-process (results/served_full/). Not yet in
        # CI: it needs its own baseline rows first.
        lossy = [] if options.quick else [("lossy", s) for s in options.sensitivities if "lossy" in options.modes]
        cases = [("off", None)] + lossy
        metafunc.parametrize("served_case", cases, ids=[format_config_id(NAME, m, s) for m, s in cases])


def test_served_matches_in_process(served_case, served_adapter, served_sizes, rsp_adapter_for,
                                   rsp_reference_outputs, rsp_record) -> None:
    from rsp_bench.quality import truncated_kl_mean

    mode, s = served_case
    prompts, max_new = served_sizes
    reference = rsp_reference_outputs.get("served", prompts, max_new, with_logits=True)
    pruning = pruning_config(mode, s)
    served_spec = ConfigSpec(format_config_id(NAME, mode, s), NAME, mode, s, {"top_n": served_adapter.top_n}, pruning)
    local_spec = ConfigSpec(format_config_id("reference", mode, s), "reference", mode, s, {}, pruning)

    served = equivalence_metrics(served_adapter, served_spec, prompts, reference, max_new)
    local = equivalence_metrics(rsp_adapter_for("reference"), local_spec, prompts, reference, max_new)
    trunc = truncated_kl_mean(served_adapter, served_spec, reference)
    for name in ("kl_mean", "kl_p99"):  # from a tail-uniform tensor: neither exact nor a bound
        served.pop(name, None)
    served["kl_mean_truncated"] = trunc
    for name in ("kl_mean", "exact_match_rate", "top1_agreement"):  # the in-process figures beside
        served[f"{name}_in_process"] = local[name]
    record_metrics(rsp_record, served_spec, served)

    assert served_adapter.unverified == [], served_adapter.unverified
    if mode == "off":
        assert served["exact_match_rate"].value == local["exact_match_rate"].value == 1.0
    # Lossy exact match is recorded, not asserted equal: a router decision that sits at its
    # threshold can flip on a last-bit difference between two processes' float reductions
    # (measured once here on the embedded model: 0.75 over HTTP, 0.50 in process, 4 prompts).
    assert served["top1_agreement"].value == local["top1_agreement"].value, (
        f"{served_spec.config_id}: top-1 agreement {served['top1_agreement'].value} over HTTP, "
        f"{local['top1_agreement'].value} in process")
    if "bypass_ratio" in local:
        assert served["bypass_ratio"].value == local["bypass_ratio"].value
    # a lower bound of the full KL; both 0 (up to JSON's float rounding) with pruning off
    assert trunc.value <= local["kl_mean"].value + 1e-6
    if mode == "off":
        assert served["exact_match_rate"].value == 1.0 and served["top1_agreement"].value == 1.0
        assert trunc.value < 1e-6


# ---------------------------------------------------------------- lm-eval's own clients

TASKS = Path(__file__).resolve().parent.parent / "fixtures" / "lm_eval_tasks"


def _lm_eval(tmp_path: Path, model: str, model_args: str, task: str, limit: int, *extra: str) -> list[dict]:
    """Run the stock ``lm_eval`` CLI; return its logged samples for ``task``."""
    out = tmp_path / model
    cmd = [sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks", task,
           "--include_path", str(TASKS), "--limit", str(limit), "--output_path", str(out), "--log_samples", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"lm_eval failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    files = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    assert files, f"lm_eval wrote no samples for {task} under {out}"
    return [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]


def test_stock_lm_eval_clients_against_served(served_adapter, rsp_engine, rsp_peer, rsp_adapter_for, tmp_path) -> None:
    """The unmodified ``lm_eval`` CLI: ``local-completions`` (rolling loglikelihood through echo,
    ``tokenizer_backend=remote``) and ``local-chat-completions`` (generate_until) against the
    served reference, checked against the in-process engine on the same items: the log-likelihood
    equals the unpruned model's (the transformers peer, one forward), and the generations equal
    the in-process engine's at the server's default knobs (lossy, s=0.5, watermark pinned 0).

    The two CLI runs are started together: each sends one request and spends the rest of its time
    starting up (one core), so side by side they took 31 s against 38 s one after the other."""
    import torch

    pytest.importorskip("lm_eval")
    pytest.importorskip("tenacity", reason="lm-eval's API clients need tenacity (the 'serve' extra)")
    base, model = served_adapter.url, served_adapter.model
    tok = rsp_engine.tokenizer

    with ThreadPoolExecutor(max_workers=2) as pool:
        completions = pool.submit(
            _lm_eval, tmp_path, "local-completions",
            f"base_url={base}/completions,tokenizer_backend=remote,model={model},num_concurrent=1,"
            f"max_retries=1,tokenized_requests=True,max_length=2048", "rsp_perplexity", 1)
        chat = pool.submit(
            _lm_eval, tmp_path, "local-chat-completions",
            f"base_url={base}/chat/completions,model={model},num_concurrent=1,max_retries=1",
            "rsp_squad", 1, "--apply_chat_template")
        [sample] = completions.result()
        [chat_sample] = chat.result()

    ids = tok(sample["doc"]["text"], add_special_tokens=False)["input_ids"]
    prefix = tok(tok.bos_token, add_special_tokens=False)["input_ids"][0] if tok.bos_token else rsp_engine.eos_id
    spec = ConfigSpec("hf-generate/off", "hf-generate", "off", None)
    logits, _ = rsp_peer.teacher_forced_logits([prefix], ids, spec)
    want = -float(token_nll(logits, torch.tensor(ids)).sum())
    got = float(sample["resps"][0][0][0]) if isinstance(sample["resps"][0][0], list) else float(sample["resps"][0][0])
    assert got == pytest.approx(want, rel=1e-4, abs=1e-3), f"lm-eval log-likelihood {got} vs in-process {want}"

    lossy = ConfigSpec("reference/lossy/s=0.50", "reference", "lossy", 0.5, {}, pruning_config("lossy", 0.5))
    [local] = rsp_adapter_for("reference").generate([chat_sample["doc"]["prompt"]], 16, lossy)
    assert chat_sample["resps"][0][0] == local.text.split("\n\n")[0], (
        "lm-eval's generation differs from the in-process engine's")


# ---------------------------------------------------------------- a server nobody here wrote

LLAMA_NAME = "served-llama-cpp"
LLAMA_INSTALL = "pip install -e '.[llama-cpp]' (llama-cpp-python[server]: sse-starlette, starlette-context, pydantic-settings)"


@pytest.fixture(scope="module")
def llama_cpp_adapter(rsp_options, rsp_engine):
    """llama-cpp-python's own OpenAI server on the F32 GGUF of the reference weights (the ladder's
    F32 rung: the model the reference computes), on a free port of 127.0.0.1, behind the adapter.

    Started without ``--chat_format chatml``: that format drops SmolLM2's default system prompt
    (21 prompt tokens where the reference template has 37), so the greedy answers would answer
    another prompt; without it the server applies the GGUF's own template, the reference's.
    F32, not a quantized rung: the server has no option for llama.cpp's extra buffer types, and
    quantized rungs SIGILL on this CPU with them on."""
    pytest.importorskip("openai", reason="the 'serve' extra is not installed")
    try:
        import llama_cpp.server.app  # noqa: F401
    except Exception as exc:  # ImportError, or the server's own imports failing
        pytest.skip(f"llama_cpp.server is not importable ({type(exc).__name__}); install with {LLAMA_INSTALL}")
    if rsp_options.engine == "openai":
        pytest.skip("--rsp-engine openai: the other suites measure the server already")
    from rsp_bench.engines.openai_engine import ExternalServer, OpenAIAdapter
    from rsp_bench.gguf_ladder import build_ladder, source_gguf

    gguf = build_ladder(source_gguf(None), ["f32"])["f32"].path
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--logits_all", "true",
           "--n_ctx", "2048", "--n_threads", "2", "--seed", "0"]
    with ExternalServer(cmd) as url:
        # its repeat_penalty defaults to 1.1 (not an OpenAI field): greedy answers need 1.0
        yield OpenAIAdapter(rsp_engine, url + "/v1", generation_extra={"repeat_penalty": 1.0})


def test_llama_cpp_server_through_openai_adapter(llama_cpp_adapter, served_sizes, rsp_reference_outputs,
                                                 rsp_record) -> None:
    """The adapter against llama-cpp-python's server, pruning off: greedy answers, top-1 agreement
    and the truncated KL (top-N) against the in-process reference. The server takes no token-id
    prompt (500), so teacher forcing goes as text and the token counts and echoed token strings
    are checked; what could not be verified is recorded (``unverified`` notes)."""
    from rsp_bench.quality import truncated_kl_mean

    adapter = llama_cpp_adapter
    prompts, max_new = served_sizes
    reference = rsp_reference_outputs.get("served", prompts, max_new, with_logits=True)
    spec = ConfigSpec(format_config_id(LLAMA_NAME, "off", None), LLAMA_NAME, "off", None,
                      {"top_n": adapter.top_n, "gguf": "f32"}, pruning_config("off", None))
    got = equivalence_metrics(adapter, spec, prompts, reference, max_new)
    trunc = truncated_kl_mean(adapter, spec, reference)
    for name in ("kl_mean", "kl_p99"):
        got.pop(name, None)
    got["kl_mean_truncated"] = trunc
    record_metrics(rsp_record, spec, got)

    # what this server cannot give, each recorded once, and nothing else
    assert adapter.token_id_prompts is False  # it answered token-id prompts with an error
    notes = "\n".join(adapter.unverified)
    assert "rejected token-id prompts" in notes
    assert "no X-Pruning-Stats header" in notes
    assert "echoed" not in notes or "aligned from the end" in notes
    assert "differ" not in notes, adapter.unverified  # counts and token strings all matched
    assert "server saw" not in notes and "server counted" not in notes, adapter.unverified
    # the same weights in another implementation: the same argmax everywhere, a tiny KL
    assert got["top1_agreement"].value >= 0.99, got["top1_agreement"]
    assert trunc.value < 1e-3, trunc
    assert got["exact_match_rate"].value == 1.0, got["exact_match_rate"]


# ---------------------------------------------------------------- bounded load


@pytest.mark.parametrize("load_mode", ["off", "lossy"])
def test_served_bounded_load(load_mode, served_url, rsp_options, rsp_record) -> None:
    """``rsp_bench.loadtest`` against ``rsp-bench serve --max-queue 4`` (batching on, the
    server's default ``--max-batch``): 4 clients, 12 requests, 8 tokens: nothing lost or
    duplicated, the 429 burst rejected with Retry-After and recovered; latency, tokens/s, bypass
    ratio and batch sizes recorded. Mode off: every answer equal to the single-request one, batched
    or not. Mode lossy: batched requests are pruned together (a block is bypassed for the batch
    only when every row agrees), so the share equal to the single-request answers and the bypass
    ratio under load beside the single-request one are recorded, not asserted."""
    pytest.importorskip("httpx", reason="the 'serve' extra is not installed")
    from rsp_bench.loadtest import LoadConfig, run_loadtest

    prompts = [p.text for p in ds.quick_subset(ds.load_prompts(), 4, seed=rsp_options.subset_seed)]
    headers = {"X-Pruning-Mode": load_mode, "X-Pruning-Sensitivity": "0.5", "X-Pruning-Hardware-Watermark": "0",
               "X-Pruning-Log-Level": "NONE"}
    rec = run_loadtest(served_url + "/v1", LoadConfig(prompts, requests=12, clients=4, max_tokens=8, headers=headers))
    load, burst = rec["load"], rec["burst"]
    sensitivity = 0.5 if load_mode == "lossy" else None
    cid = format_config_id("served-reference-load", load_mode, sensitivity)
    params = {"clients": 4, "requests": 12, "max_tokens": 8, "max_queue": LOAD_MAX_QUEUE}
    for name, value, unit in (("load_latency_p50_s", load["latency_p50_s"], "s"),
                              ("load_latency_p99_s", load["latency_p99_s"], "s"),
                              ("load_tokens_per_s", load["tokens_per_s"], "tokens/s"),
                              ("load_bypass_ratio", load["bypass_ratio"], "fraction"),
                              ("load_bypass_ratio_single", load["bypass_ratio_single"], "fraction"),
                              ("load_greedy_match_rate", load["greedy_match_share"], "fraction"),
                              ("load_batch_size_mean", load["batching"]["mean"], "requests"),
                              ("load_batched_share", load["batching"]["batched_share"], "fraction"),
                              ("load_burst_429", burst.get("rejected_429"), "count"),
                              ("load_burst_recovered", burst.get("recovered"), "count")):
        rsp_record.add_metric(cid, name, value, load["requests"], unit=unit, engine="served-reference-load",
                              mode=load_mode, sensitivity=sensitivity, params=params)
    assert rec["passed"], {k: v for k, v in rec["checks"].items() if not v} or rec
    assert load["succeeded"] == 12 and load["batching"]["reported"] == 12
    if load_mode == "off":
        assert load["equality_enforced"] and load["mismatches"] == [] and load["greedy_match_share"] == 1.0
        assert rec["checks"]["burst_equal_to_single"]
    elif load["equality_enforced"]:  # lossy, but nothing was batched: each request pruned as alone
        assert load["mismatches"] == []
        assert load["bypass_ratio"] == pytest.approx(load["bypass_ratio_single"], abs=1e-12)
    assert burst["ran"] and burst["rejected_429"] >= 1 and burst["recovered"] == burst["rejected_429"]
    assert burst["retry_after"] == ["1"] and burst["queue_depth_after"] == 0


# ---------------------------------------------------------------- the server as an operator runs it (issue 27)
#
# One server for these tests (the embedded model, an API key, max_tokens capped so that a fuzzed
# request stays short): the fuzzer, bad input, disconnects, the soak, and last SIGTERM with
# requests in flight (it stops this server). Their figures are recorded under the quick suite's
# existing configuration served-reference-load/off as new metrics named load_* (machine-scoped,
# like the load test's own: no new configuration, since CI mode fails one without a baseline).

HARD_KEY = "rsp-suite-key"
HARD_MAX_TOKENS = 32
HARD_CID = "served-reference-load/off"
SCHEMATHESIS = "schemathesis (pip install -e '.[test]')"


@pytest.fixture(scope="module")
def hardened(rsp_options):
    pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")
    httpx = pytest.importorskip("httpx", reason="the 'serve' extra is not installed")
    if rsp_options.engine == "openai":
        pytest.skip("--rsp-engine openai: the other suites measure the server already")
    from rsp_bench.engines.openai_engine import ServedProcess

    args = ["--api-key", HARD_KEY, "--max-tokens-limit", str(HARD_MAX_TOKENS), "--log-level", "NONE",
            "--hardware-watermark", "0", "--max-queue", "8", "--graceful-timeout", "60"]
    if rsp_options.model:
        args += ["--model", str(rsp_options.model)]
    holder = _Hardened(lambda: ServedProcess(args), httpx)
    try:
        yield holder
    finally:
        holder.close()


class _Hardened:
    """The module's hardened server, unpacked as ``server, url, http``. The SIGTERM test stops
    it; a test that unpacks it afterwards (another order, ``-k``) gets a fresh one, so the tests
    do not depend on running SIGTERM last."""

    def __init__(self, start, httpx) -> None:
        self._start, self._httpx = start, httpx
        self.server = self.url = self.http = None

    def __iter__(self):
        if self.server is None or self.server.proc.poll() is not None:
            self.close()
            self.server = self._start()
            self.url = self.server.__enter__()
            self.http = self._httpx.Client(base_url=self.url, timeout=120,
                                           headers={"Authorization": f"Bearer {HARD_KEY}"})
        return iter((self.server, self.url, self.http))

    def close(self) -> None:
        if self.http is not None:
            self.http.close()
        if self.server is not None:
            self.server.stop()
        self.server = self.url = self.http = None


def _server_metrics(http) -> str:
    return http.get("/metrics").text


def _status_counts(text: str) -> dict[int, float]:
    import re

    out: dict[int, float] = {}
    for code, n in re.findall(r'^rsp_requests_total\{path="[^"]*",status="(\d+)"\} (\S+)$', text, re.M):
        out[int(code)] = out.get(int(code), 0.0) + float(n)
    return out


def _gauge(text: str, name: str) -> float:
    import re

    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _hard_metric(rsp_record, name: str, value: float, n: int, unit: str) -> None:
    rsp_record.add_metric(HARD_CID, f"load_{name}", value, n, unit=unit, engine="served-reference-load", mode="off")


def test_served_fuzz_from_own_openapi(hardened, rsp_options, rsp_record, tmp_path) -> None:
    """schemathesis, stateless, from the server's own /openapi.json against the live process:
    no 5xx (its ``not_a_server_error``, and the server's own request counters), no response
    outside the schema (``response_schema_conformance``, status codes, content types), and the
    server still answering after. Quick: 15 s of generation (about 200 cases; 30 s gave 420 in
    the 2026-12-04 profile, 38 s of the quick run), at least 100 asserted; full: 300 s, 1000."""
    import re
    import shutil

    exe = shutil.which("schemathesis")
    if exe is None:
        pytest.skip(f"schemathesis is not installed: {SCHEMATHESIS}")
    _, url, http = hardened
    max_time, per_op = (15, 25) if rsp_options.quick else (300, 400)
    before = _status_counts(_server_metrics(http))
    cmd = [exe, "run", f"{url}/openapi.json", "-H", f"Authorization: Bearer {HARD_KEY}",
           "--checks", "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance",
           "--max-time", str(max_time), "-n", str(per_op), "--workers", "1", "--request-timeout", "60",
           "--seed", "27", "--report", "junit", "--report-dir", str(tmp_path), "--no-color"]
    # cwd: schemathesis keeps a .schemathesis/ cache where it runs; not in the checkout
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max_time + 240, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    m = re.search(r"(\d+) generated", out)
    cases = int(m.group(1)) if m else 0
    after = _status_counts(_server_metrics(http))
    fivexx = sum(n - before.get(code, 0.0) for code, n in after.items() if code >= 500)
    answered = sum(after.values()) - sum(before.values())
    _hard_metric(rsp_record, "fuzz_cases", cases, cases, "count")
    _hard_metric(rsp_record, "fuzz_5xx", fivexx, int(answered), "count")
    assert proc.returncode == 0, out[-4000:]
    assert cases >= (100 if rsp_options.quick else 1000), out[-2000:]
    assert fivexx == 0, after
    assert http.get("/health").json()["status"] == "ok"


def test_served_bad_input_and_the_reproduced_500s(hardened) -> None:
    """What used to answer 500 (or nothing): each is a 200 or a 4xx naming the value now."""
    import httpx

    _, url, http = hardened
    j = {"content-type": "application/json"}
    r = http.post("/v1/completions", content=b'{"prompt": "\\ud800 hi", "max_tokens": 2}', headers=j)
    assert r.status_code == 200, r.text
    assert http.post("/tokenize", content=b'{"prompt": "\\ud800"}', headers=j).status_code == 200
    assert http.post("/tokenize", json={"messages": [{"role": "user"}]}).status_code == 200
    msgs = [{"role": "user", "content": "Say hi."}]
    r = http.post("/v1/chat/completions", json={"messages": msgs, "seed": 2 ** 64, "temperature": 0.5, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
    r = http.post("/v1/chat/completions", json={"messages": msgs, "seed": 2 ** 64 - 1, "temperature": 0.5,
                                                "max_tokens": 2})
    assert r.status_code == 200, r.text
    r = http.post("/v1/chat/completions", json={"messages": msgs, "temperature": 1e-40, "max_tokens": 4})
    assert r.status_code == 200, r.text
    r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 10 ** 12})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens" and "--max-tokens-limit" in r.text
    r = http.post("/v1/completions", json={"prompt": ["a", "b"], "max_tokens": HARD_MAX_TOKENS})  # once unanswered
    assert r.status_code == 200 and len(r.json()["choices"]) == 2
    # a 10 MB body: refused at once, and the server keeps answering meanwhile
    big = b'{"prompt": "' + b"a" * 10_000_000 + b'"}'
    t0 = time.perf_counter()
    r = http.post("/v1/completions", content=big, headers=j)
    refused_s = time.perf_counter() - t0
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large" and refused_s < 5, refused_s
    t0 = time.perf_counter()
    assert http.get("/health").status_code == 200 and time.perf_counter() - t0 < 1
    # without the key: 401 on every /v1 route; /health stays open
    with httpx.Client(base_url=url, timeout=30) as anon:
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions")):
            r = anon.request(method, path, json={"messages": msgs, "prompt": "a"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
        assert anon.get("/health").status_code == 200


def test_served_disconnect_and_stop_strings_end_the_decode(hardened, rsp_record) -> None:
    """A client that closes a live stream after 3 chunks: the engine stops within a step or two
    of hearing it (``rsp_decode_steps_after_cancel``), far short of max_tokens. A stop string:
    decoding ends at the token that completes it (the engine's own token count, ``pruning``)."""
    _, _, http = hardened
    m0 = _server_metrics(http)
    body = {"messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
            "max_tokens": HARD_MAX_TOKENS, "stream": True, "temperature": 0}
    with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Pruning-Mode": "off"}) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: {") and '"content"' in line
            if seen >= 4:  # the role chunk, then 3 content chunks
                break
    for _ in range(300):
        m1 = _server_metrics(http)
        if _gauge(m1, "rsp_decode_steps_after_cancel_count") > _gauge(m0, "rsp_decode_steps_after_cancel_count"):
            break
        time.sleep(0.02)
    steps = _gauge(m1, "rsp_decode_steps_after_cancel_sum") - _gauge(m0, "rsp_decode_steps_after_cancel_sum")
    decoded = _gauge(m1, "rsp_cancelled_decoded_tokens_sum") - _gauge(m0, "rsp_cancelled_decoded_tokens_sum")
    _hard_metric(rsp_record, "disconnect_steps_after_cancel", steps, 1, "steps")
    _hard_metric(rsp_record, "disconnect_tokens_decoded", decoded, 1, "tokens")
    assert steps <= 2, m1
    assert decoded < HARD_MAX_TOKENS - 8, decoded

    prompt = {"prompt": "The days of the week are Monday, Tuesday,", "max_tokens": HARD_MAX_TOKENS}
    plain = http.post("/v1/completions", json=prompt, headers={"X-Pruning-Mode": "off"}).json()
    text = plain["choices"][0]["text"]
    words = [w for w in text.replace(",", " ").split() if len(w) >= 3]
    assert words, text
    cut = http.post("/v1/completions", json={**prompt, "stop": [words[0]]}, headers={"X-Pruning-Mode": "off"}).json()
    assert cut["choices"][0]["finish_reason"] == "stop" and cut["choices"][0]["text"] == text[:text.find(words[0])]
    _hard_metric(rsp_record, "stop_tokens_decoded", cut["pruning"]["total_tokens"], 1, "tokens")
    _hard_metric(rsp_record, "stop_tokens_decoded_without_stop", plain["pruning"]["total_tokens"], 1, "tokens")
    assert cut["pruning"]["total_tokens"] < plain["pruning"]["total_tokens"], (cut["pruning"], plain["pruning"])


def test_served_soak(hardened, rsp_options, rsp_record) -> None:
    """``rsp_bench.soak``: good and bad requests and disconnects mixed; nothing lost or
    duplicated, every good answer equal to the single request's, no 5xx, RSS growth < 5%.
    Quick: 10 s (about 37 requests; 20 s gave 75), which checks the mix, not a slow leak: the
    full run's 180 s is the RSS figure to read."""
    from rsp_bench.soak import run_soak
    from rsp_bench.loadtest import LoadConfig

    _, url, _ = hardened
    prompts = [p.text for p in ds.quick_subset(ds.load_prompts(), 3, seed=rsp_options.subset_seed)]
    duration, count = (10.0, 60) if rsp_options.quick else (180.0, 2000)
    cfg = LoadConfig(prompts, clients=3, max_tokens=8, api_key=HARD_KEY,
                     headers={"X-Pruning-Mode": "lossy", "X-Pruning-Hardware-Watermark": "0",
                              "X-Pruning-Log-Level": "NONE"})
    rec = run_soak(url + "/v1", cfg, duration, count)
    for name, value, unit in (("soak_requests", rec["requests"], "count"), ("soak_lost", rec["lost"], "count"),
                              ("soak_duplicated", rec["duplicated"], "count"),
                              ("soak_good_equal_share", rec["good_equal"] / max(rec["good"], 1), "fraction"),
                              ("soak_5xx", rec["server_5xx"], "count"),
                              ("soak_rss_growth", rec["rss_growth"] or 0.0, "fraction")):
        _hard_metric(rsp_record, name, value, rec["requests"], unit)
    assert rec["passed"], {k: v for k, v in rec["checks"].items() if not v} or rec
    assert rec["good"] >= 10 and rec["bad"] >= 2 and rec["disconnects"] >= 1, rec


def test_served_sigterm_with_requests_in_flight(hardened) -> None:
    """SIGTERM while a stream and a plain request run: both finish whole (uvicorn's graceful
    drain), the process exits 0, and nothing is served after. Stops the module's server (a
later test starts another)."""
    import signal

    import httpx

    server, url, http = hardened
    msgs = [{"role": "user", "content": "Count from one to forty in words."}]
    first = threading.Event()

    def stream() -> tuple[int, str]:
        with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {HARD_KEY}"}) as c:
            with c.stream("POST", "/v1/chat/completions", json={"messages": msgs, "stream": True, "max_tokens": 24},
                          headers={"X-Pruning-Mode": "off"}) as r:
                lines = []
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        first.set()
                return r.status_code, lines[-1] if lines else ""

    def plain() -> dict:
        with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {HARD_KEY}"}) as c:
            r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 24}, headers={"X-Pruning-Mode": "off"})
            return {"status": r.status_code, **(r.json() if r.status_code == 200 else {})}

    with ThreadPoolExecutor(2) as pool:
        s, p = pool.submit(stream), pool.submit(plain)
        assert first.wait(60)
        # SIGTERM only once both are admitted: the stream's first chunk says nothing of the plain
        # request, which on a loaded machine was still connecting and got "connection refused".
        deadline = time.monotonic() + 60
        while http.get("/health").json()["queue_depth"] < 2:
            assert not (s.done() or p.done()), "a request finished before both were in flight"
            assert time.monotonic() < deadline, "the plain request was not admitted within 60 s"
            time.sleep(0.01)
        t0 = time.perf_counter()
        server.proc.send_signal(signal.SIGTERM)
        status, last = s.result(120)
        answer = p.result(120)
    code = server.proc.wait(60)
    assert code == 0 and time.perf_counter() - t0 < 60
    assert status == 200 and last == "data: [DONE]"
    assert answer["status"] == 200 and answer["usage"]["completion_tokens"] >= 1, answer
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=5)
