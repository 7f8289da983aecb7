"""The OpenAI-compatible server (reference_engine.server): routes, knobs, errors, queue, metrics
through FastAPI's TestClient on the tiny random model; and one end-to-end test that starts
``rsp-bench serve`` as a real process on a free port of 127.0.0.1 with the embedded model and
calls it with the official ``openai`` client.
"""

from __future__ import annotations

import functools

import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

import torch  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from reference_engine import PruningConfig  # noqa: E402
from reference_engine.server import ServerSettings, create_app  # noqa: E402
from reference_engine.server import runner, worker as W  # noqa: E402
from reference_engine.server.limits import Limits  # noqa: E402

PROMPT = "the quick brown fox"
# conftest points RSP_BENCH_CACHE at the tiny model's folder when its fixture first runs; the
# embedded model's cache is whatever it was before (read at collection, before any fixture).
_REAL_CACHE = os.environ.get("RSP_BENCH_CACHE")
DEFAULT = PruningConfig(hardware_watermark=0.0, log_level="NONE")


def parse_stats(header: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in header.split(","))


@pytest.fixture(scope="module")
def client(tiny_engine):
    with TestClient(create_app(tiny_engine, ServerSettings(DEFAULT))) as c:
        yield c


def chat(client, content=PROMPT, headers=None, **body):
    payload = {"messages": [{"role": "user", "content": content}], "max_tokens": 6, **body}
    return client.post("/v1/chat/completions", json=payload, headers=headers or {})


def test_chat_stats_header_and_body_agree(client, tiny_engine):
    r = chat(client, headers={"X-Pruning-Sensitivity": "0.8"})
    assert r.status_code == 200, r.text
    body = r.json()
    stats = parse_stats(r.headers["X-Pruning-Stats"])
    assert set(stats) >= {"layers_bypassed", "total_tokens", "bypass_ratio", "degraded", "degraded_reason"}
    assert int(stats["layers_bypassed"]) == body["pruning"]["layers_bypassed"]
    assert int(stats["total_tokens"]) == body["pruning"]["total_tokens"] == body["usage"]["completion_tokens"]
    assert body["pruning"]["sensitivity"] == 0.8 and body["pruning"]["blocks"] == tiny_engine.dims.n_layers
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["X-Request-Id"])
    # the same request in process, same knobs: same tokens and the same bypass count
    [ref] = tiny_engine.generate([PROMPT], max_new_tokens=6, config=DEFAULT.override(sensitivity=0.8))
    assert body["choices"][0]["message"]["content"] == ref.text
    assert body["pruning"]["layers_bypassed"] == ref.stats["layers_bypassed"]


def test_router_knob_in_header_and_body_and_its_stats(client, tiny_engine, monkeypatch):
    assert DEFAULT.router == "unit"  # the engine's default lossy router
    r = chat(client, headers={"X-Pruning-Router": "block"})
    assert parse_stats(r.headers["X-Pruning-Stats"])["router"] == "block" == r.json()["pruning"]["router"]
    assert r.json()["pruning"]["router_fallback"] is None
    r = chat(client, headers={"X-Pruning-Router": "sideways"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Pruning-Router"
    assert "sideways" in r.json()["error"]["message"]
    r = chat(client, pruning={"router": "diagonal"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "pruning.router"
    # the unit router where no predictor exists for the weights: a 400 naming the knob, never a
    # half-hour training inside the request
    monkeypatch.setattr(tiny_engine, "unit_predictor_available", lambda: False)
    r = chat(client, headers={"X-Pruning-Router": "unit"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Pruning-Router"
    assert "rsp-bench calibrate" in r.json()["error"]["message"]
    r = chat(client, pruning={"router": "unit", "mode": "off"})  # nothing to route: served
    assert r.status_code == 200 and r.json()["pruning"]["router"] is None
    # a request that asked for no router gets the default's fallback: served by the block
    # router, and the stats say so
    r = chat(client)
    assert r.status_code == 200, r.text
    assert r.json()["pruning"]["router"] == "block" == parse_stats(r.headers["X-Pruning-Stats"])["router"]
    assert "no unit-router predictor" in r.json()["pruning"]["router_fallback"]


def test_body_pruning_wins_over_header(client):
    r = chat(client, headers={"X-Pruning-Sensitivity": "0.8"}, pruning={"sensitivity": 0.3})
    assert r.json()["pruning"]["sensitivity"] == 0.3
    r = chat(client, headers={"X-Pruning-Mode": "off"})
    assert r.json()["pruning"]["mode"] == "off" and r.json()["pruning"]["layers_bypassed"] == 0


def test_completion_token_ids_mode_off_equal_engine(client, tiny_engine):
    ids = tiny_engine.encode(PROMPT)
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 8, "logprobs": 0,
                                             "return_tokens_as_token_ids": True},
                    headers={"X-Pruning-Mode": "off"})
    assert r.status_code == 200, r.text
    got = [int(t.split(":")[1]) for t in r.json()["choices"][0]["logprobs"]["tokens"]]
    [ref] = tiny_engine.generate([PROMPT], max_new_tokens=8, config=DEFAULT.override(mode="off"))
    assert got == ref.token_ids
    assert r.json()["usage"]["prompt_tokens"] == len(ids)


def test_stream_ends_with_done_and_matches(client):
    plain = chat(client).json()["choices"][0]["message"]["content"]
    r = chat(client, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    # streamed live: the stats are known only at the end, so they come in the last chunks
    assert "X-Pruning-Stats" not in r.headers and "X-Request-Id" in r.headers
    events = [line[len("data: "):] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == plain
    assert chunks[-1]["usage"]["completion_tokens"] >= 1
    assert chunks[-1]["pruning"]["total_tokens"] == chunks[-1]["usage"]["completion_tokens"]
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length") and "pruning" in chunks[-2]


def test_stream_stop_string_and_logprobs_fallback(client):
    plain = chat(client, max_tokens=8).json()["choices"][0]["message"]["content"]
    if len(plain) < 4:
        pytest.skip("the tiny model's answer is too short to cut")
    stop = plain[2:4]
    want = chat(client, max_tokens=8, stop=[stop]).json()["choices"][0]["message"]["content"]
    for extra in ({}, {"logprobs": True}):  # live, and buffered (stream with logprobs)
        r = chat(client, max_tokens=8, stop=[stop], stream=True, **extra)
        chunks = [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")]
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == want


def test_stream_safe_text():
    assert runner.stream_safe_text("hello wor", ["world"]) == ("hello ", False)
    assert runner.stream_safe_text("hello world!", ["world"]) == ("hello ", True)
    assert runner.stream_safe_text("ab\ufffd", []) == ("ab", False)
    assert runner.stream_safe_text("abc", ["x"]) == ("abc", False)


def test_chat_logprobs(client):
    body = chat(client, logprobs=True, top_logprobs=3).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    for entry in content:  # greedy: the chosen token is the most likely one
        assert len(entry["top_logprobs"]) == 3
        assert entry["logprob"] == pytest.approx(entry["top_logprobs"][0]["logprob"])


def test_echo_prompt_logprobs_are_the_models(client, tiny_engine):
    ids = tiny_engine.encode(PROMPT, chat=False)
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 2})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert r.json()["choices"][0]["text"] == tiny_engine.decode(ids)
    assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) == len(ids)
    # prefill logits equal the unpruned decode path (teacher forcing) up to float order
    tf = tiny_engine.teacher_forced(ids[:1], ids[1:], DEFAULT.override(mode="off")).logits
    want = torch.log_softmax(tf.double(), -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(lp["token_logprobs"][1:], dtype=torch.float64), want, atol=1e-4)


def test_decode_from_is_teacher_forcing_with_pruning(client, tiny_engine):
    prompt_ids = tiny_engine.encode(PROMPT)
    cont = tiny_engine.generate([PROMPT], max_new_tokens=6, config=DEFAULT.override(mode="off"))[0].token_ids
    cfg = DEFAULT.override(sensitivity=1.0)
    ref = tiny_engine.teacher_forced(prompt_ids, cont, cfg)
    r = client.post("/v1/completions", json={"prompt": prompt_ids + cont, "max_tokens": 0, "echo": True, "logprobs": 1,
                                             "decode_from": len(prompt_ids), "pruning": {"sensitivity": 1.0}})
    assert r.status_code == 200, r.text
    got = r.json()["choices"][0]["logprobs"]["token_logprobs"][len(prompt_ids):]
    want = torch.log_softmax(ref.logits.double(), -1).gather(-1, torch.tensor(cont)[:, None])[:, 0]
    assert got == pytest.approx(want.tolist(), abs=1e-9)
    assert r.json()["pruning"]["layers_bypassed"] == ref.stats["layers_bypassed"]


@pytest.mark.parametrize("headers, param", [
    ({"X-Pruning-Sensitivity": "abc"}, "X-Pruning-Sensitivity"),
    ({"X-Pruning-Sensitivity": "1.5"}, "X-Pruning-Sensitivity"),
    ({"X-Pruning-Mode": "fast"}, "X-Pruning-Mode"),
    ({"X-Pruning-Log-Level": "LOUD"}, "X-Pruning-Log-Level"),
    ({"X-Pruning-Blacklist": "1,x"}, "X-Pruning-Blacklist"),
    ({"X-Pruning-Blacklist": "99"}, "X-Pruning-Blacklist"),
    ({"X-Pruning-Speed": "1"}, "x-pruning-speed"),
])
def test_bad_header_is_400_naming_it_then_next_request_ok(client, headers, param):
    r = chat(client, headers=headers)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and list(headers.values())[0] in err["message"]
    assert set(err) == {"message", "type", "param", "code"}
    assert chat(client).status_code == 200


@pytest.mark.parametrize("path, payload, status, param", [
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x " * 600, "max_tokens": 4}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 10 ** 9], "max_tokens": 1}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ("/v1/chat/completions", {"messages": [], "max_tokens": 1}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "pruning": {"mode": "fast"}}, 400,
     "pruning.mode"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "pruning": {"sensitivity": 2}}, 400,
     "pruning.sensitivity"),
])
def test_bad_body_values_are_named(client, path, payload, status, param):
    r = client.post(path, json=payload)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_bad_json_and_unknown_route(client):
    r = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = client.get("/v2/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_tokenizer_routes_vllm_shapes(client, tiny_engine):
    r = client.post("/tokenize", json={"prompt": PROMPT, "add_special_tokens": False}).json()
    assert r["tokens"] == tiny_engine.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == tiny_engine.dims.max_positions
    r = client.post("/tokenize", json={"messages": [{"role": "user", "content": PROMPT}]}).json()
    assert r["tokens"] == tiny_engine.encode(PROMPT)
    assert client.post("/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == tiny_engine.tokenizer.decode(r["tokens"])
    info = client.get("/tokenizer_info").json()
    assert info["eos_token"] == tiny_engine.tokenizer.eos_token and info["chat_template"]
    assert client.get("/v1/models").json()["data"][0]["id"]
    assert client.get("/health").json()["status"] == "ok"


def test_metrics_prometheus_text(client):
    chat(client)
    text = client.get("/metrics").text
    for name in ("rsp_requests_total", "rsp_request_latency_seconds_bucket", "rsp_completion_tokens_total",
                 "rsp_bypass_ratio", "rsp_degraded_requests_total", "rsp_queue_depth", "rsp_rejected_total"):
        assert name in text, name
    assert re.search(r'rsp_requests_total\{path="/v1/chat/completions",status="200"\} [1-9]', text)


def test_queue_full_is_429_with_retry_after_then_recovers(tiny_engine, monkeypatch):
    gate, started = threading.Event(), threading.Event()
    real = runner.run_completion

    def held(*a, **kw):  # keeps the one slot busy until the test lets it go
        started.set()
        gate.wait(30)
        return real(*a, **kw)

    monkeypatch.setattr(runner, "run_completion", held)
    with TestClient(create_app(tiny_engine, ServerSettings(DEFAULT, max_queue=1, retry_after_s=2))) as c:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(chat, c)
            assert started.wait(30)
            r = chat(c)
            assert r.status_code == 429 and r.headers["Retry-After"] == "2"
            assert r.json()["error"]["code"] == "queue_full"
            gate.set()
            assert first.result(30).status_code == 200
        assert chat(c).status_code == 200
        assert re.search(r"rsp_rejected_total 1\.0", c.get("/metrics").text)


def test_detailed_log_lines_carry_request_id(tiny_engine, tmp_path):
    path = tmp_path / "log.jsonl"
    with open(path, "a", encoding="utf-8") as f, \
            TestClient(create_app(tiny_engine, ServerSettings(DEFAULT, log_file=f,
                                                              limits=Limits(max_log_level="DETAILED")))) as c:
        r = chat(c, headers={"X-Pruning-Log-Level": "DETAILED", "X-Request-Id": "req-42"})
        assert r.headers["X-Request-Id"] == "req-42"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records and all(rec["request_id"] == "req-42" for rec in records)
    events = {rec["event"] for rec in records}
    assert "request" in events and events & {"block", "unit"}  # per-token lines of whichever router ran


# ---------------------------------------------------------------- the real server


@pytest.fixture(scope="module")
def tiny_url(tiny_engine, live_server):
    """The app under a real uvicorn on a free port of 127.0.0.1, in a thread (tiny model)."""
    with live_server(create_app(tiny_engine, ServerSettings(DEFAULT))) as url:
        yield url + "/v1"


def test_openai_adapter_mode_off_matches_in_process(tiny_url, tiny_engine):
    pytest.importorskip("openai")
    from rsp_bench.engines import get_engine, pruning_config
    from rsp_bench.engines.base import ConfigSpec
    from rsp_bench.engines.openai_engine import truncated_kl_per_token

    adapter = get_engine("openai", engine=tiny_engine, engine_url=tiny_url)
    reference = get_engine("reference", engine=tiny_engine)
    for mode, s in (("off", None), ("lossy", 1.0)):
        spec = ConfigSpec(f"x/{mode}", "openai", mode, s, {}, pruning_config(mode, s))
        [got] = adapter.generate([PROMPT], 6, spec)
        [want] = reference.generate([PROMPT], 6, spec)
        assert got.token_ids == want.token_ids and got.prompt_ids == want.prompt_ids
        assert got.stats["layers_bypassed"] == want.stats["layers_bypassed"]
        assert got.stats["prompt_tokens_match"] and "token_ids_from_text" not in got.stats
        lp, stats = adapter.teacher_forced_logits(want.prompt_ids, want.token_ids, spec)
        ref, _ = reference.teacher_forced_logits(want.prompt_ids, want.token_ids, spec)
        assert lp.shape == ref.shape and stats["top_n"] == adapter.top_n
        assert torch.equal(lp.argmax(-1), ref.argmax(-1))
        kl = truncated_kl_per_token(ref, lp, stats["known"])
        assert float(kl.max()) < 1e-6  # the same engine, the same numbers: only JSON rounding left
    assert adapter.unverified == []


def test_truncated_kl_is_a_lower_bound():
    from rsp_bench.engines.openai_engine import truncated_kl_per_token
    from rsp_bench.metrics import kl_per_token

    g = torch.Generator().manual_seed(0)
    ref, cand = torch.randn(50, 40, generator=g) * 3, torch.randn(50, 40, generator=g) * 3
    logq = torch.log_softmax(cand.double(), -1)
    known = torch.zeros_like(logq, dtype=torch.bool)
    known.scatter_(1, logq.topk(5).indices, True)
    full = kl_per_token(ref, cand)
    trunc = truncated_kl_per_token(ref, logq, known)
    assert bool((trunc <= full + 1e-12).all()) and float(trunc.sum()) > 0
    everything = torch.ones_like(known)
    assert torch.allclose(truncated_kl_per_token(ref, logq, everything), full, atol=1e-9)


# ---------------------------------------------------------------- the real server


@pytest.fixture(scope="module")
def served():
    """``rsp-bench serve`` on a free port of 127.0.0.1 (embedded model), stopped with SIGTERM."""
    pytest.importorskip("openai")
    from rsp_bench.engines.openai_engine import ServedProcess

    env = {k: v for k, v in os.environ.items() if k != "RSP_BENCH_CACHE"}
    if _REAL_CACHE is not None:
        env["RSP_BENCH_CACHE"] = _REAL_CACHE
    server = ServedProcess(["--log-level", "NONE", "--hardware-watermark", "0", "--max-queue", "32"], env=env)
    url = server.__enter__()
    yield url
    assert server.stop() == 0, "rsp-bench serve did not exit 0 on SIGTERM"


@pytest.mark.slow
def test_real_server_with_official_client(served, monkeypatch):
    import openai

    from reference_engine import Engine

    client = openai.OpenAI(base_url=served + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "Name three colours."}]
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=msgs, max_tokens=8, temperature=0, extra_headers={"X-Pruning-Sensitivity": "0.8"})
    stats = parse_stats(raw.headers["X-Pruning-Stats"])
    comp = raw.parse()
    assert int(stats["total_tokens"]) == comp.usage.completion_tokens >= 1
    assert int(stats["layers_bypassed"]) >= 0 and stats["degraded"] in ("true", "false")

    # mode off over HTTP = the in-process engine with mode off, token for token
    if _REAL_CACHE is None:
        monkeypatch.delenv("RSP_BENCH_CACHE", raising=False)
    else:
        monkeypatch.setenv("RSP_BENCH_CACHE", _REAL_CACHE)
    engine = Engine.load()
    [ref] = engine.generate([msgs[0]["content"]], max_new_tokens=8, config=PruningConfig(mode="off", log_level="NONE"))
    off = client.completions.create(model=model, prompt=ref.prompt_ids, max_tokens=8, logprobs=0,
                                    extra_body={"return_tokens_as_token_ids": True},
                                    extra_headers={"X-Pruning-Mode": "off"})
    assert [int(t.split(":")[1]) for t in off.choices[0].logprobs.tokens] == ref.token_ids
    chat_off = client.chat.completions.create(model=model, messages=msgs, max_tokens=8,
                                              extra_headers={"X-Pruning-Mode": "off"})
    assert chat_off.choices[0].message.content == ref.text

    # a bad header: 400 naming it; the next request is served
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=msgs, max_tokens=2,
                                       extra_headers={"X-Pruning-Sensitivity": "lots"})
    assert "X-Pruning-Sensitivity" in str(info.value) and "lots" in str(info.value)
    assert client.chat.completions.create(model=model, messages=msgs, max_tokens=2).choices[0].message.content is not None

    # 16 concurrent requests all succeed
    def one(i: int) -> int:
        r = client.chat.completions.create(model=model, max_tokens=3,
                                           messages=[{"role": "user", "content": f"Count to {i}."}])
        return r.usage.completion_tokens

    with ThreadPoolExecutor(16) as pool:
        counts = list(pool.map(one, range(16)))
    assert len(counts) == 16 and all(c >= 1 for c in counts)


@pytest.mark.slow
def test_real_server_streams_tokens_as_decoded(served):
    """Chunks leave as tokens are decoded: the first arrives well before the last (a server that
    sent them after the whole completion shows them all within a few milliseconds)."""
    from rsp_bench.engines import pruning_config
    from rsp_bench.engines.base import ConfigSpec
    from rsp_bench.engines.openai_engine import OpenAIAdapter

    adapter = OpenAIAdapter(None, served + "/v1")  # streaming needs no reference tokenizer
    spec = ConfigSpec("x/off", "openai", "off", None, {}, pruning_config("off", None))
    got = adapter.stream_timings("Write a long story about a cat who learns to fly.", 24, spec)
    times = got["chunk_times_s"]
    assert len(times) >= 12, got
    spread = times[-1] - times[0]
    assert spread > 0.5 * (got["total_s"] - got["ttft_s"]) and spread > 0.1, got
    assert got["tpot_s"] > 0.002 and got["pruning"]["total_tokens"] == 24


# ---------------------------------------------------------------- batching


def test_batch_key_groups_only_identical_knobs_and_max_tokens():
    off, lossy = PruningConfig(mode="off", log_level="NONE"), PruningConfig(mode="lossy", log_level="NONE")
    assert runner.batch_key(lossy, 0.0, 8) is None  # lossy runs alone unless the server batches it
    key = functools.partial(runner.batch_key, modes=runner.BATCHABLE_MODES)
    assert key(off, 0.0, 8) == key(PruningConfig(mode="off", log_level="NONE"), 0.0, 8)  # equal knobs: one key
    variants = [lossy, off.override(sensitivity=0.4), off.override(layer_blacklist=(0, 3)), off.override(log_level="SUMMARY"),
                off.override(hardware_watermark=0.0), off.override(probe_interval=4), off.override(mode="static")]
    keys = {key(c, 0.0, 8) for c in variants} | {key(off, 0.0, 8), key(off, 0.0, 16)}
    assert None not in keys and len(keys) == len(variants) + 2  # any knob or max_tokens differs: another key
    # what always runs alone
    assert key(off, 0.7, 8) is None                        # sampling
    assert key(off, 0.0, 8, logprobs=True) is None         # logprobs
    assert key(off, 0.0, 8, echo=True) is None             # prompt logprobs (echo)
    assert key(off, 0.0, 8, n_prompts=2) is None           # a multi-prompt completion
    assert key(off, 0.0, 0) is None
    assert key(off.override(mode="lossless"), 0.0, 8) is None


def test_worker_never_mixes_keys_and_cancel_frees_the_slot():
    import asyncio

    off = PruningConfig(mode="off", log_level="NONE")
    a, b, c = (runner.batch_key(off, 0.0, 8), runner.batch_key(off.override(mode="lossy"), 0.0, 8, modes=("lossy",)),
               runner.batch_key(off, 0.0, 9))
    seen: list[list[tuple]] = []

    def batch_fn(items):
        seen.append(list(items))
        return [n * 10 for _, n in items]

    async def main():
        gate = threading.Event()
        w = W.EngineWorker(max_queue=16, max_batch=3, batch_window_s=0.05)
        blocker = w.submit(lambda: gate.wait(30))  # holds the engine thread while the others queue
        plan = [a, b, a, a, b, a, c, a]
        futs = [w.submit(key=k, item=(k, n), batch_fn=batch_fn) for n, k in enumerate(plan)]
        futs[7].cancel()  # its client went away while it was queued
        await asyncio.sleep(0.05)  # the loop passes the cancel on to the worker's future
        assert w.depth == 8
        gate.set()
        got = await asyncio.gather(blocker, *futs[:7])
        assert got[1:] == [n * 10 for n in range(7)]
        assert w.depth == 0
        w.shutdown()

    asyncio.run(main())
    assert [[n for _, n in batch] for batch in seen] == [[0, 2, 3], [1, 4], [5], [6]]
    assert all(len({k for k, _ in batch}) == 1 for batch in seen)  # never two keys in one batch


def test_worker_shutdown_cancels_queued_and_finishes_running():
    import asyncio

    async def main():
        gate, started = threading.Event(), threading.Event()
        w = W.EngineWorker(max_queue=4, max_batch=4, batch_window_s=0.0)
        running = w.submit(lambda: (started.set(), gate.wait(30), "done")[-1])
        queued = w.submit(key="k", item=1, batch_fn=lambda items: items)
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
        stopper = threading.Thread(target=w.shutdown)
        stopper.start()
        while not queued.done():
            await asyncio.sleep(0.01)
        assert queued.cancelled()
        gate.set()
        assert await running == "done"
        stopper.join(30)
        assert not stopper.is_alive() and w.depth == 0
        with pytest.raises(Exception, match="shutting down"):
            w.submit(lambda: None)

    asyncio.run(main())


def test_batch_log_sends_each_row_its_own_records():
    import io

    sink, lock = io.StringIO(), threading.Lock()
    log = runner.BatchLog([runner.TaggedLog(sink, "r0", lock), None, runner.TaggedLog(sink, "r2", lock)])
    log.write("\n".join(json.dumps({"event": "block", "request": b, "block": 1}) for b in (0, 1, 2)) + "\n")
    log.write(json.dumps({"event": "note"}) + "\n")  # no row: every row's log gets it
    records = [json.loads(line) for line in sink.getvalue().splitlines()]
    assert [(r["request_id"], r["event"], r.get("request")) for r in records] == [
        ("r0", "block", 0), ("r2", "block", 0), ("r0", "note", None), ("r2", "note", None)]


@pytest.fixture(scope="module")
def batching_url(tiny_engine, live_server):
    """A real uvicorn server (tiny model) batching up to 4 requests, with a long window so that 4
    requests sent at once share one batch even on a loaded machine."""
    settings = ServerSettings(DEFAULT, max_batch=4, batch_window_ms=2000.0, batch_modes=runner.BATCHABLE_MODES)
    with live_server(create_app(tiny_engine, settings)) as url:
        yield url


def _batch_sizes(text: str) -> tuple[float, float]:
    count = float(re.search(r"^rsp_batch_size_count (\S+)", text, re.M).group(1))
    total = float(re.search(r"^rsp_batch_size_sum (\S+)", text, re.M).group(1))
    return count, total


def test_real_server_batches_mode_off_and_equals_single(batching_url, tiny_engine):
    """4 concurrent mode-off requests (two chats, a live stream, a token-id completion) run as one
    batch (batch-size metric > 1) and each equals its request alone, token for token."""
    import httpx

    prompts = [PROMPT, "hello world, how are you", "one two three four five six", "a"]
    off = DEFAULT.override(mode="off")
    singles = [tiny_engine.generate([p], max_new_tokens=8, config=off)[0] for p in prompts]
    h = {"X-Pruning-Mode": "off"}
    with httpx.Client(base_url=batching_url, timeout=120) as http:
        count0, sum0 = _batch_sizes(http.get("/metrics").text)

        def send(i: int):
            msgs = [{"role": "user", "content": prompts[i]}]
            if i == 2:
                r = http.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 8, "stream": True}, headers=h)
                chunks = [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")]
                text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
                return text, None, chunks[-1]["pruning"]["batch_size"]
            if i == 3:
                r = http.post("/v1/completions", json={"prompt": singles[i].prompt_ids, "max_tokens": 8}, headers=h)
                return r.json()["choices"][0]["text"], r.headers["X-Batch-Size"], r.json()["pruning"]["batch_size"]
            r = http.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 8}, headers=h)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"], r.headers["X-Batch-Size"], r.json()["pruning"]["batch_size"]

        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(send, range(4)))
        count1, sum1 = _batch_sizes(http.get("/metrics").text)
    assert [t for t, _, _ in got] == [s.text for s in singles]
    assert [b for _, _, b in got] == [4, 4, 4, 4]
    assert [hdr for _, hdr, _ in got] == ["4", "4", None, "4"]
    assert count1 - count0 == 1 and sum1 - sum0 == 4  # one engine call of 4: rsp_batch_size saw it


def test_real_server_never_batches_different_knobs(batching_url):
    import httpx

    def send(item):
        mode, content = item
        r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}],
                                                    "max_tokens": 6}, headers={"X-Pruning-Mode": mode})
        assert r.status_code == 200, r.text
        return mode, int(r.headers["X-Batch-Size"]), r.json()["pruning"]["mode"]

    with httpx.Client(base_url=batching_url, timeout=120) as http, ThreadPoolExecutor(4) as pool:
        got = list(pool.map(send, [("off", PROMPT), ("lossy", PROMPT), ("off", "b c d"), ("lossy", "b c d")]))
    assert all(mode == served for mode, _, served in got)
    assert [size for _, size, _ in got] == [2, 2, 2, 2]  # two batches, one per mode, never one of four
