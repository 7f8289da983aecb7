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

Sizes: quick 4 prompts x 16 new tokens, pruning off only (see pytest_generate_tests); full 16 x 32. Skipped under ``--rsp-engine openai``
(the other suites then measure the server; this suite's rows would repeat theirs).

Must NOT compute a figure itself (rsp_bench.quality / rsp_bench.metrics / the adapter module do)
or import the reference engine (the plugin's fixtures hand it over).
"""

from __future__ import annotations

import json
import subprocess
import sys
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


@pytest.fixture(scope="module")
def served_adapter(rsp_options, rsp_engine):
    pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")
    pytest.importorskip("openai", reason="the 'serve' extra is not installed")
    if rsp_options.engine == "openai":
        pytest.skip("--rsp-engine openai: the other suites measure the server already")
    from rsp_bench.engines.openai_engine import OpenAIAdapter, ServedProcess

    args = ["--hardware-watermark", "0", "--log-level", "NONE"]
    if rsp_options.model:
        args += ["--model", str(rsp_options.model)]
    with ServedProcess(args) as url:
        yield OpenAIAdapter(rsp_engine, url + "/v1")


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
    from rsp_bench.engines.openai_engine import truncated_kl_mean

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
    import torch

    """The unmodified ``lm_eval`` CLI: ``local-completions`` (rolling loglikelihood through echo,
    ``tokenizer_backend=remote``) and ``local-chat-completions`` (generate_until) against the
    served reference, checked against the in-process engine on the same items: the log-likelihood
    equals the unpruned model's (the transformers peer, one forward), and the generations equal
    the in-process engine's at the server's default knobs (lossy, s=0.5, watermark pinned 0)."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("tenacity", reason="lm-eval's API clients need tenacity (the 'serve' extra)")
    base, model = served_adapter.url, served_adapter.model
    tok = rsp_engine.tokenizer

    samples = _lm_eval(tmp_path, "local-completions",
                       f"base_url={base}/completions,tokenizer_backend=remote,model={model},num_concurrent=1,"
                       f"max_retries=1,tokenized_requests=True,max_length=2048", "rsp_perplexity", 1)
    [sample] = samples
    ids = tok(sample["doc"]["text"], add_special_tokens=False)["input_ids"]
    prefix = tok(tok.bos_token, add_special_tokens=False)["input_ids"][0] if tok.bos_token else rsp_engine.eos_id
    spec = ConfigSpec("hf-generate/off", "hf-generate", "off", None)
    logits, _ = rsp_peer.teacher_forced_logits([prefix], ids, spec)
    want = -float(token_nll(logits, torch.tensor(ids)).sum())
    got = float(sample["resps"][0][0][0]) if isinstance(sample["resps"][0][0], list) else float(sample["resps"][0][0])
    assert got == pytest.approx(want, rel=1e-4, abs=1e-3), f"lm-eval log-likelihood {got} vs in-process {want}"

    samples = _lm_eval(tmp_path, "local-chat-completions",
                       f"base_url={base}/chat/completions,model={model},num_concurrent=1,max_retries=1",
                       "rsp_squad", 1, "--apply_chat_template")
    [sample] = samples
    lossy = ConfigSpec("reference/lossy/s=0.50", "reference", "lossy", 0.5, {}, pruning_config("lossy", 0.5))
    [local] = rsp_adapter_for("reference").generate([sample["doc"]["prompt"]], 16, lossy)
    assert sample["resps"][0][0] == local.text.split("\n\n")[0], "lm-eval's generation differs from the in-process engine's"


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
    from rsp_bench.engines.openai_engine import truncated_kl_mean

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
def test_served_bounded_load(load_mode, rsp_options, rsp_record) -> None:
    """``rsp_bench.loadtest`` against ``rsp-bench serve --max-queue 4`` (batching on, the
    server's default ``--max-batch``): 4 clients, 12 requests, 8 tokens: nothing lost or
    duplicated, the 429 burst rejected with Retry-After and recovered; latency, tokens/s, bypass
    ratio and batch sizes recorded. Mode off: every answer equal to the single-request one, batched
    or not. Mode lossy: batched requests are pruned together (a block is bypassed for the batch
    only when every row agrees), so the share equal to the single-request answers and the bypass
    ratio under load beside the single-request one are recorded, not asserted."""
    pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")
    pytest.importorskip("httpx", reason="the 'serve' extra is not installed")
    if rsp_options.engine == "openai":
        pytest.skip("--rsp-engine openai: the other suites measure the server already")
    from rsp_bench.engines.openai_engine import ServedProcess
    from rsp_bench.loadtest import LoadConfig, run_loadtest

    prompts = [p.text for p in ds.quick_subset(ds.load_prompts(), 4, seed=rsp_options.subset_seed)]
    headers = {"X-Pruning-Mode": load_mode, "X-Pruning-Sensitivity": "0.5", "X-Pruning-Hardware-Watermark": "0",
               "X-Pruning-Log-Level": "NONE"}
    args = ["--max-queue", "4", "--log-level", "NONE", "--hardware-watermark", "0"]
    if rsp_options.model:
        args += ["--model", str(rsp_options.model)]
    with ServedProcess(args) as url:
        rec = run_loadtest(url + "/v1", LoadConfig(prompts, requests=12, clients=4, max_tokens=8, headers=headers))
    load, burst = rec["load"], rec["burst"]
    sensitivity = 0.5 if load_mode == "lossy" else None
    cid = format_config_id("served-reference-load", load_mode, sensitivity)
    params = {"clients": 4, "requests": 12, "max_tokens": 8, "max_queue": 4}
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
