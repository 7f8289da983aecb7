"""The server as an operator runs it (issue 27), on the tiny random model: the API key, the Host
and request-id checks, limits with 4xx answers naming them, the four reproduced 500s, stop
strings and disconnects ending the decode, engine exceptions, a dead or hung worker, timeouts,
shutdown, and the streamed text / logprob offsets that must agree with the text.

HTTP through FastAPI's TestClient, or a real uvicorn in a thread where a socket matters
(disconnects). Engine faults are planted by patching runner's engine calls: these test the
server around the engine, not the engine.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from fastapi.testclient import TestClient  # noqa: E402

from reference_engine import PruningConfig  # noqa: E402
from reference_engine.server import ServerSettings, create_app, runner, worker as W  # noqa: E402
from reference_engine.server.limits import Limits  # noqa: E402

DEFAULT = PruningConfig(hardware_watermark=0.0, log_level="NONE")
OFF = {"X-Pruning-Mode": "off"}
MSG = [{"role": "user", "content": "the quick brown fox"}]


def events(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def slowed(monkeypatch) -> None:
    """Decode slowed to 20 ms a token, so that a client can leave mid-request."""
    real = runner.RowControl.token
    monkeypatch.setattr(runner.RowControl, "token", lambda self, *a: (time.sleep(0.02), real(self, *a)))


@pytest.fixture(scope="module")
def client(tiny_engine):
    with TestClient(create_app(tiny_engine, ServerSettings(DEFAULT))) as c:
        yield c


# ---------------------------------------------------------------- access


def test_api_key_on_every_v1_route(tiny_engine):
    app = create_app(tiny_engine, ServerSettings(DEFAULT, api_key="s3cret"))
    with TestClient(app) as c:
        schema = c.get("/openapi.json").json()
        v1 = [(m.upper(), p) for p, ops in schema["paths"].items() for m in ops if p.startswith("/v1")]
        assert len(v1) == 3
        bodies = {"/v1/chat/completions": {"messages": MSG, "max_tokens": 2}, "/v1/completions": {"prompt": "a"}}
        for method, path in v1:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                r = c.request(method, path, json=bodies.get(path), headers=headers)
                assert r.status_code == 401, (path, headers)
                assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
                assert r.headers["x-request-id"]
            r = c.request(method, path, json=bodies.get(path), headers={"Authorization": "Bearer s3cret"})
            assert r.status_code == 200, (path, r.text)
        assert c.get("/health").status_code == 200  # open, as in vLLM
        assert c.post("/tokenize", json={"prompt": "a"}).status_code == 200


def test_host_check_and_request_id(tiny_engine):
    app = create_app(tiny_engine, ServerSettings(DEFAULT, allowed_hosts=("127.0.0.1", "localhost")))
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        assert c.get("/health").status_code == 200
        r = c.get("/health", headers={"Host": "attacker.example:8000"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "Host"
        assert c.get("/health", headers={"Host": "localhost:8000"}).status_code == 200
        for bad in ("x" * 129, "has space", "new\\nline", ""):
            r = c.get("/health", headers={"X-Request-Id": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "X-Request-Id", bad
            assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])  # a fresh id, not the bad one
        assert c.get("/health", headers={"X-Request-Id": "ok-1.2:3"}).headers["x-request-id"] == "ok-1.2:3"


def test_client_log_level_is_capped(tiny_engine):
    with TestClient(create_app(tiny_engine, ServerSettings(DEFAULT))) as c:  # cap SUMMARY by default
        r = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2},
                   headers={"X-Pruning-Log-Level": "DETAILED"})
        assert r.status_code == 400 and "--max-client-log-level" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "pruning": {"log_level": "DETAILED"}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "pruning.log_level"
        assert c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2},
                      headers={"X-Pruning-Log-Level": "SUMMARY"}).status_code == 200


# ---------------------------------------------------------------- limits


@pytest.mark.parametrize("path, payload, param, code", [
    ("/v1/chat/completions", {"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, "stop", "too_many_stop_strings"),
    ("/v1/chat/completions", {"messages": MSG, "stop": ["x" * 129]}, "stop.0", "stop_string_too_long"),
    ("/v1/completions", {"prompt": ["a"] * 17}, "prompt", "too_many_prompts"),
    ("/v1/completions", {"prompt": "a", "logprobs": 21}, "logprobs", "invalid_value"),
    ("/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid_value"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 10 ** 30}, "prompt", "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": MSG, "top_p": 0.9}, "top_p", "unsupported_parameter"),
    ("/v1/chat/completions", {"messages": MSG, "tools": [{"type": "function"}]}, "tools", "unsupported_parameter"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_object"}}, "response_format",
     "unsupported_parameter"),
    ("/v1/completions", {"prompt": "a", "logit_bias": {"3": 5}}, "logit_bias", "unsupported_parameter"),
    ("/v1/completions", {"prompt": "a", "frequency_penalty": 0.5}, "frequency_penalty", "unsupported_parameter"),
    ("/v1/chat/completions", {"messages": MSG, "seed": 2 ** 64}, "seed", "invalid_value"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages.0.content", "invalid_value"),
])
def test_limits_answer_400_naming_the_value(client, path, payload, param, code):
    r = client.post(path, json=payload)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (param, code)
    assert r.headers["x-request-id"]


def test_neutral_sampling_values_are_accepted(client):
    r = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "top_p": 1, "presence_penalty": 0,
                                                  "logit_bias": {}, "response_format": {"type": "text"}, "user": "u"})
    assert r.status_code == 200, r.text


def test_body_limit_413_declared_and_streamed(tiny_engine):
    with TestClient(create_app(tiny_engine, ServerSettings(DEFAULT, limits=Limits(max_body_bytes=1000)))) as c:
        r = c.post("/v1/completions", json={"prompt": "a" * 2000})
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large" and r.headers["x-request-id"]

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"prompt": "'
            for _ in range(20):
                yield b"a" * 100
            yield b'"}'

        r = c.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert c.post("/v1/completions", json={"prompt": "a", "max_tokens": 1}).status_code == 200


def test_admission_comes_before_parsing(tiny_engine, monkeypatch):
    gate, started = threading.Event(), threading.Event()
    real = runner.run_completion

    def held(*a, **kw):
        started.set()
        gate.wait(30)
        return real(*a, **kw)

    monkeypatch.setattr(runner, "run_completion", held)
    with TestClient(create_app(tiny_engine, ServerSettings(DEFAULT, max_queue=1))) as c, ThreadPoolExecutor(1) as pool:
        first = pool.submit(c.post, "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2})
        assert started.wait(30)
        r = c.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"  # refused before its body was read
        gate.set()
        assert first.result(30).status_code == 200


# ---------------------------------------------------------------- the reproduced 500s


def test_lone_surrogate_prompts(client):
    r = client.post("/v1/completions", content=b'{"prompt": "\\ud800 hi", "max_tokens": 2}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    r = client.post("/tokenize", content=b'{"prompt": "\\udfff x"}', headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["count"] >= 1
    r = client.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 1}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


def test_tokenize_messages_without_content_or_rejected_by_template(client, tiny_engine, monkeypatch):
    r = client.post("/tokenize", json={"messages": [{"role": "user"}]})
    assert r.status_code == 200 and r.json()["tokens"] == tiny_engine.encode("")
    no_prompt = client.post("/tokenize", json={"messages": MSG, "add_generation_prompt": False}).json()["count"]
    assert no_prompt < client.post("/tokenize", json={"messages": MSG}).json()["count"]  # the flag is honoured

    import jinja2

    def reject(*a, **kw):
        raise jinja2.TemplateError("Conversation roles must alternate user/assistant")

    monkeypatch.setattr(tiny_engine.tokenizer, "apply_chat_template", reject)
    for path, body in (("/tokenize", {"messages": MSG}), ("/v1/chat/completions", {"messages": MSG})):
        r = client.post(path, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
        assert "roles must alternate" in r.json()["error"]["message"]


def test_seed_range_and_tiny_temperature(client):
    top = 2 ** 64 - 1
    r = client.post("/v1/completions", json={"prompt": "a b", "max_tokens": 3, "temperature": 0.7, "seed": top})
    assert r.status_code == 200, r.text
    greedy = client.post("/v1/completions", json={"prompt": "a b", "max_tokens": 6}, headers=OFF).json()
    for t in (1e-38, 1e-40, 5e-324):  # logits / t overflows: the limit is the argmax
        r = client.post("/v1/completions", json={"prompt": "a b", "max_tokens": 6, "temperature": t, "seed": 1},
                        headers=OFF)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == greedy["choices"][0]["text"]


# ---------------------------------------------------------------- stop strings end the decode


def test_stop_string_ends_decoding_early(client, tiny_engine):
    body = {"prompt": "one two three", "max_tokens": 24}
    plain = client.post("/v1/completions", json={**body, "logprobs": 0, "return_tokens_as_token_ids": True},
                        headers=OFF).json()
    text = plain["choices"][0]["text"]
    ids = [int(t.split(":")[1]) for t in plain["choices"][0]["logprobs"]["tokens"]]
    if plain["pruning"]["total_tokens"] < 8 or len(text) < 6:
        pytest.skip("the tiny model's answer is too short to cut")
    stop = text[3:5]
    cut = client.post("/v1/completions", json={**body, "stop": [stop]}, headers=OFF).json()
    assert cut["choices"][0]["text"] == text[:text.find(stop)] and cut["choices"][0]["finish_reason"] == "stop"
    # the engine decoded exactly up to the token that completed the stop string (its stats
    # count decoded tokens), not to max_tokens
    first = next(n for n in range(1, len(ids) + 1) if stop in tiny_engine.decode(ids[:n]))
    assert cut["pruning"]["total_tokens"] == first < plain["pruning"]["total_tokens"] == len(ids)


# ---------------------------------------------------------------- text, bytes and offsets


def test_text_deltas_never_send_a_split_character(tiny_engine):
    text = "a 😀 é 中文 b"
    ids = tiny_engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text.split())  # the tiny vocabulary splits these characters into byte pieces
    partial = [tiny_engine.decode(ids[:n]) for n in range(1, len(ids) + 1)]
    assert any(p.endswith("\ufffd") for p in partial)  # what the old buffered stream sent
    deltas = runner.text_deltas(tiny_engine, ids, tiny_engine.decode(ids))
    assert "".join(deltas) == tiny_engine.decode(ids) and not any("\ufffd" in d for d in deltas)
    assert b"".join(bytes(runner.token_bytes(tiny_engine, t)) for t in ids) == tiny_engine.decode(ids).encode()


def test_offsets_and_bytes_agree_with_text_that_skips_special_tokens(client, tiny_engine):
    eos = tiny_engine.eos_id
    ids = tiny_engine.encode("ab 😀", chat=False) + [eos] + tiny_engine.encode("cd", chat=False)
    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text, offsets = choice["text"], choice["logprobs"]["text_offset"]
    assert text == tiny_engine.decode(ids) and tiny_engine.tokenizer.decode([eos]) not in text
    assert offsets == [len(tiny_engine.decode(ids[:i]).rstrip("\ufffd")) for i in range(len(ids))]
    assert offsets == sorted(offsets) and max(offsets) <= len(text)
    assert runner.token_bytes(tiny_engine, eos) == []  # a special token adds no bytes to the text


def test_buffered_stream_equals_the_answer(client):
    body = {"messages": MSG, "max_tokens": 12, "logprobs": True, "top_logprobs": 2}
    want = client.post("/v1/chat/completions", json=body, headers=OFF).json()["choices"][0]["message"]["content"]
    r = client.post("/v1/chat/completions", json={**body, "stream": True}, headers=OFF)
    chunks = [json.loads(e) for e in events(r.text) if e.startswith("{")]
    got = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert got == want and events(r.text)[-1] == "[DONE]"


# ---------------------------------------------------------------- faults


def test_engine_exception_is_a_counted_500_and_a_stream_error_event(tiny_engine, monkeypatch):
    def boom(*a, **kw):
        raise RuntimeError("planted engine fault")

    monkeypatch.setattr(runner, "run_completion", boom)
    with TestClient(create_app(tiny_engine, ServerSettings(DEFAULT)), raise_server_exceptions=False) as c:
        r = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2}, headers={"X-Request-Id": "f-1"})
        assert r.status_code == 500 and r.headers["x-request-id"] == "f-1"
        assert r.json()["error"]["type"] == "server_error" and "Traceback" not in r.text and "f-1" in r.text
        r = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "stream": True})
        assert r.status_code == 200
        evs = events(r.text)
        assert evs[-1] == "[DONE]" and json.loads(evs[-2])["error"]["code"] == "internal_error"
        text = c.get("/metrics").text
        assert metric(text, "rsp_requests_total", '{path="/v1/chat/completions",status="500"}') == 1.0
        monkeypatch.undo()
        assert c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2}).status_code == 200


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the planted death
def test_dead_worker_fails_waiting_requests_within_a_second(tiny_engine, monkeypatch):
    gate, started = threading.Event(), threading.Event()
    real = runner.run_completion

    def dying(*a, **kw):
        started.set()
        gate.wait(30)
        raise SystemExit("planted: the engine thread dies")  # escapes the worker loop, as a fatal error would

    monkeypatch.setattr(runner, "run_completion", dying)
    with TestClient(create_app(tiny_engine, ServerSettings(DEFAULT))) as c, ThreadPoolExecutor(3) as pool:
        send = lambda: c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2})  # noqa: E731
        running = pool.submit(send)
        assert started.wait(30)
        waiting = pool.submit(send)
        while c.get("/health").json()["waiting"] < 1:
            time.sleep(0.01)
        t0 = time.perf_counter()
        gate.set()
        answers = [running.result(10), waiting.result(10)]
        latency = time.perf_counter() - t0
        assert [a.status_code for a in answers] == [503, 503] and latency < 1.0, latency
        assert all(a.json()["error"]["code"] == "worker_down" for a in answers)
        h = c.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "down" and not h.json()["worker_alive"]
        monkeypatch.setattr(runner, "run_completion", real)
        assert send().status_code == 503  # no engine: refused at once, not queued forever
        assert metric(c.get("/metrics").text, "rsp_worker_alive") == 0.0


def test_hung_worker_turns_health_503(tiny_engine, monkeypatch):
    gate = threading.Event()
    monkeypatch.setattr(runner, "run_completion", lambda *a, **kw: gate.wait(30))
    with TestClient(create_app(tiny_engine, ServerSettings(DEFAULT, hang_s=0.3))) as c:
        r = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2})
        # the hang detector answered: the hung call itself returns only when the gate opens (after 30 s),
        # and then with no "no progress" 503
        assert r.status_code == 503 and "no progress" in r.json()["error"]["message"]
        assert c.get("/health").status_code == 503
        gate.set()


def test_request_timeout_is_504_and_stops_the_decode(tiny_engine, monkeypatch):
    real = runner.RowControl.token
    monkeypatch.setattr(runner.RowControl, "token", lambda self, *a: (time.sleep(0.02), real(self, *a)))
    settings = ServerSettings(DEFAULT, limits=Limits(request_timeout_s=0.3))
    with TestClient(create_app(tiny_engine, settings)) as c:
        r = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 200}, headers=OFF)
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
        text = c.get("/metrics").text
        assert metric(text, "rsp_cancelled_requests_total", '{reason="timeout"}') == 1.0
        # stopped by the timeout, not run to the end: ~15 tokens fit in 0.3 s at 20 ms a step, 200 would
        # take 4 s (counted in tokens, not wall-clock time, which a loaded machine stretches)
        assert re.search(r"^rsp_cancelled_decoded_tokens_sum ", text, re.M), "the cancelled request's tokens are counted"
        decoded = metric(text, "rsp_cancelled_decoded_tokens_sum")
        assert decoded < 100, decoded


def test_disconnect_mid_stream_stops_the_engine_within_steps(tiny_engine, monkeypatch, live_server):
    import httpx

    slowed(monkeypatch)
    with live_server(create_app(tiny_engine, ServerSettings(DEFAULT))) as url:
        with httpx.Client(base_url=url, timeout=60) as http:
            body = {"messages": MSG, "max_tokens": 200, "stream": True}
            with http.stream("POST", "/v1/chat/completions", json=body, headers=OFF) as r:
                seen = 0
                for line in r.iter_lines():
                    seen += line.startswith("data: {")
                    if seen >= 4:
                        break
            for _ in range(200):
                text = http.get("/metrics").text
                if metric(text, "rsp_cancelled_requests_total", '{reason="disconnect"}') >= 1:
                    break
                time.sleep(0.02)
            assert http.get("/health").json()["queue_depth"] == 0
        decoded = metric(text, "rsp_cancelled_decoded_tokens_sum")
        after = metric(text, "rsp_decode_steps_after_cancel_sum")
        assert after <= 1, after             # the engine stopped at the step after it heard
        assert 3 <= decoded <= 3 + 10, decoded  # ~4 tokens sent, a few in flight: far from 200


def test_shutdown_fails_queued_and_cancels_running_within_deadline():
    async def main():
        w = W.EngineWorker(max_queue=4)
        cancel, started = W.Cancel(), threading.Event()

        def decode() -> str:  # an engine call that honours its Cancel, as Engine._run does
            started.set()
            while not cancel:
                time.sleep(0.005)
            return cancel.reason

        running = w.submit(decode, cancel=cancel)
        queued = w.submit(lambda: "never")
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        # True: everything ended within the deadline (the running call heard its Cancel; a call that
        # ignored it would keep shutdown waiting to the deadline and return False)
        assert await asyncio.get_running_loop().run_in_executor(None, w.shutdown, 2.0)
        assert await running == "shutdown"
        with pytest.raises(BaseException):
            await queued
        assert w.depth == 0

    asyncio.run(main())


def test_engine_stop_check_is_asked_per_token(tiny_engine):
    from reference_engine.generation import PromptRow

    rows = [PromptRow("a", tiny_engine.encode("a")), PromptRow("b c", tiny_engine.encode("b c"))]
    cfg = DEFAULT.override(mode="off")
    asked: list[int] = []

    def stop(row: int) -> bool:
        asked.append(row)
        return row == 1 and asked.count(1) >= 3  # row 1 stops at its 3rd token, row 0 runs on

    full = tiny_engine._run(rows, 10, cfg, 0.0, None, None, None)
    got = tiny_engine._run(rows, 10, cfg, 0.0, None, None, None, stop_check=stop)
    assert got[1].token_ids == full[1].token_ids[:3] and got[0].token_ids == full[0].token_ids


# ---------------------------------------------------------------- stop 51's fuzzing


@pytest.mark.parametrize("argv, message", [
    (["--hang-timeout", "nan"], "--hang-timeout must be a finite number, got nan"),
    (["--request-timeout", "inf"], "--request-timeout must be a finite number, got inf"),
    (["--shutdown-deadline", "nan"], "--shutdown-deadline must be a finite number, got nan"),
    (["--api-key", ""], "--api-key is empty"),
    (["--api-key", "  "], "--api-key is empty"),
])
def test_serve_refuses_nan_timeouts_and_an_empty_key_before_loading(argv, message, monkeypatch):
    import argparse

    from reference_engine.errors import ConfigError
    from reference_engine.server import main as M

    monkeypatch.setattr("reference_engine.engine.Engine.load", lambda *a, **k: pytest.fail("loaded the model"))
    p = argparse.ArgumentParser()
    M.configure_parser(p)
    with pytest.raises(ConfigError, match=re.escape(message)):
        M.run(p.parse_args(["--port", "0", *argv]))


def test_an_empty_key_in_the_environment_is_refused_too(monkeypatch):
    import argparse

    from reference_engine.errors import ConfigError
    from reference_engine.server import main as M

    monkeypatch.setenv(M.API_KEY_ENV, "")
    p = argparse.ArgumentParser()
    M.configure_parser(p)
    with pytest.raises(ConfigError, match=f"{M.API_KEY_ENV} is empty"):
        M.run(p.parse_args(["--port", "0"]))


def test_deep_json_unknown_roles_and_coerced_types_are_400s(client):
    deep = b'{"messages":' + b"[" * 5000 + b"]" * 5000 + b"}"
    r = client.post("/v1/chat/completions", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
    for body, param in (({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
                        ({"messages": MSG, "max_tokens": "2"}, "max_tokens"),
                        ({"messages": MSG, "max_tokens": True}, "max_tokens"),
                        ({"messages": MSG, "stream": "yes"}, "stream")):
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, r.json()
    r = client.post("/v1/completions", json={"prompt": "a", "echo": "true"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


def test_a_client_that_leaves_mid_decode_is_not_an_internal_error(tiny_engine, monkeypatch, caplog, live_server):
    import httpx

    caplog.set_level("INFO", logger="reference_engine.server")
    slowed(monkeypatch)
    with live_server(create_app(tiny_engine, ServerSettings(DEFAULT))) as url:
        with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=url, timeout=0.3) as http:
            http.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 200}, headers=OFF)
        with httpx.Client(base_url=url, timeout=30) as http:
            for _ in range(500):  # the decode hears the cancel within a step
                if "client went away" in caplog.text and http.get("/health").json()["queue_depth"] == 0:
                    break
                time.sleep(0.02)
            assert http.get("/health").json()["queue_depth"] == 0
    assert "client went away" in caplog.text
    assert "internal error" not in caplog.text and "Exception in ASGI application" not in caplog.text
