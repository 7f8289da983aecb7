"""``rsp-bench loadtest --soak SECONDS``: a bounded soak of an OpenAI-compatible server with good
requests, bad requests and disconnects mixed, checked for lost or duplicated answers, answers
that differ from the single-request one, any 5xx, and resident memory growth.

Why a module of its own: the plain load test (loadtest.py) measures throughput and the 429
path; the soak asks whether the server stays correct and flat while clients misbehave. Both are
built on ``rsp_bench.load_client``. Must not import torch, reference_engine or rsp_bench.loadtest
(whose CLI starts a soak): it speaks HTTP.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rsp_bench.errors import HarnessInputError
from rsp_bench.load_client import LoadClient, LoadConfig

__all__ = ["BAD_REQUESTS", "run_soak"]

# (name, path, body patch, expected status, param the error must name): each is refused by any
# server that checks its input; the soak counts a different status as a failure.
BAD_REQUESTS: list[tuple[str, str, dict[str, Any] | bytes, int, str | None]] = [
    ("negative_temperature", "/chat/completions", {"temperature": -1}, 400, "temperature"),
    ("unsupported_top_p", "/chat/completions", {"top_p": 0.5}, 400, "top_p"),
    ("unknown_model", "/chat/completions", {"model": "no-such-model"}, 404, "model"),
    ("bad_json", "/chat/completions", b"{not json", 400, "body"),
    ("too_many_stops", "/chat/completions", {"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("huge_max_tokens", "/chat/completions", {"max_tokens": 10 ** 9}, 400, "max_tokens"),
    ("empty_prompt", "/completions", {"prompt": ""}, 400, "prompt"),
    ("lone_surrogate", "/completions", b'{"prompt": "\\ud800 hi", "max_tokens": 0, "echo": true}', 200, None),
]
_RSS = re.compile(r"^process_resident_memory_bytes (\S+)$", re.M)
_STATUS = re.compile(r'^rsp_requests_total\{path="[^"]*",status="(\d+)"\} (\S+)$', re.M)


def _metrics(client: LoadClient) -> tuple[float | None, dict[int, float]]:
    root = client.base[:-3] if client.base.endswith("/v1") else client.base
    try:
        text = client.http.get(root + "/metrics").text
    except Exception:
        return None, {}
    m = _RSS.search(text)
    by_status: dict[int, float] = {}
    for code, n in _STATUS.findall(text):
        by_status[int(code)] = by_status.get(int(code), 0.0) + float(n)
    return (float(m.group(1)) if m else None), by_status


def _bad(client: LoadClient, model: str, kind: int, rid: str) -> dict[str, Any]:
    name, path, patch, want, param = BAD_REQUESTS[kind % len(BAD_REQUESTS)]
    headers = {**client.cfg.headers, "X-Request-Id": rid}
    if isinstance(patch, bytes):
        r = client.http.post(client.base + path, content=patch,
                             headers={**headers, "Content-Type": "application/json"})
    else:
        body = ({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
                if path == "/chat/completions" else {"model": model, "prompt": "hi", "max_tokens": 2})
        r = client.http.post(client.base + path, json={**body, **patch}, headers=headers)
    ok = r.status_code == want
    if ok and want >= 400:
        try:
            err = r.json()["error"]
            ok = set(err) >= {"message", "type", "param", "code"} and (param is None or err["param"] == param
                                                                       or param in (err["message"] or ""))
        except (ValueError, KeyError, TypeError):
            ok = False
    return {"kind": "bad", "name": name, "status": r.status_code, "want": want, "ok": ok,
            "echoed_id": r.headers.get("x-request-id"), "request_id": rid}


def _disconnect(client: LoadClient, model: str, prompt: str, rid: str) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": client.cfg.max_tokens * 2, "temperature": 0}
    with client.http.stream("POST", client.base + "/chat/completions", json=body,
                            headers={**client.cfg.headers, "X-Request-Id": rid}) as r:
        status = r.status_code
        if status == 200:
            for _ in r.iter_lines():
                break  # the first chunk, then go away
    return {"kind": "disconnect", "status": status, "ok": status in (200, 429), "request_id": rid}


def run_soak(base_url: str, cfg: LoadConfig, duration_s: float, max_requests: int,
             rss_growth_limit: float = 0.05) -> dict[str, Any]:
    """Soak ``base_url`` for at most ``duration_s`` seconds and ``max_requests`` requests; the
    record as a dict (``passed`` false when any check failed)."""
    if not duration_s > 0 or max_requests < 1:
        raise HarnessInputError(f"soak needs a duration > 0 and at least 1 request, got {duration_s}, {max_requests}")
    client = LoadClient(base_url, cfg)
    run_id = uuid.uuid4().hex[:8]
    try:
        model = client.model()
        single: dict[str, str] = {}
        for i, prompt in enumerate(cfg.prompts):
            r = client.call(model, prompt, f"soak-{run_id}-single-{i}")
            if r["status"] != 200:
                raise HarnessInputError(f"soak: the single request for prompt {i} got {r['status']}: {r.get('error')}")
            single[prompt] = r["text"]
        rss0, status0 = _metrics(client)
        deadline = time.monotonic() + duration_s
        counter = iter(range(max_requests))
        lock = threading.Lock()
        results: list[dict[str, Any]] = []

        def worker() -> None:
            while time.monotonic() < deadline:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                rid, kind = f"soak-{run_id}-{i}", i % 8
                try:
                    if kind in (5, 6):
                        out = _bad(client, model, i // 8 * 2 + kind - 5, rid)
                    elif kind == 7:
                        out = _disconnect(client, model, cfg.prompts[i % len(cfg.prompts)], rid)
                    else:
                        prompt = cfg.prompts[i % len(cfg.prompts)]
                        out = client.call(model, prompt, rid)
                        out.update(kind="good", ok=out["status"] == 200 and out.get("text") == single[prompt])
                except Exception as exc:  # a dropped connection, a timeout: counted, never hidden
                    out = {"kind": "error", "ok": False, "request_id": rid, "status": None,
                           "error": f"{type(exc).__name__}: {exc}"[:300]}
                with lock:
                    results.append(out)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(cfg.clients) as pool:
            for f in [pool.submit(worker) for _ in range(cfg.clients)]:
                f.result()
        wall = time.perf_counter() - t0
        for _ in range(100):  # the disconnected streams' engine calls end within a step or two
            h = client.health() or {}
            if h.get("queue_depth") == 0:
                break
            time.sleep(0.1)
        health = client.health()
        rss1, status1 = _metrics(client)
    finally:
        client.close()
    good = [r for r in results if r["kind"] == "good"]
    bad = [r for r in results if r["kind"] == "bad"]
    gone = [r for r in results if r["kind"] == "disconnect"]
    sent_ids = sorted(r["request_id"] for r in good)
    got_ids = sorted(r["echoed_id"] for r in good if r["status"] == 200)
    server_5xx = sum(n - status0.get(code, 0.0) for code, n in status1.items() if code >= 500)
    growth = (rss1 - rss0) / rss0 if rss0 and rss1 else None
    checks = {
        "no_transport_errors": not any(r["kind"] == "error" for r in results),
        "good_all_answered_equal": bool(good) and all(r["ok"] for r in good),
        "nothing_lost_or_duplicated": got_ids == sent_ids and len(set(got_ids)) == len(got_ids),
        "bad_refused_as_expected": all(r["ok"] for r in bad),
        "disconnects_no_5xx": all(r["ok"] for r in gone),
        "server_answered_no_5xx": server_5xx == 0,
        "healthy_after": bool(health) and health.get("status", "ok") == "ok" and health.get("queue_depth") == 0,
        "rss_growth_under_limit": growth is not None and growth < rss_growth_limit,
    }
    return {"kind": "rsp-bench-soak", "run_id": run_id, "url": base_url, "model": model,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": {"duration_s": duration_s, "max_requests": max_requests, "clients": cfg.clients,
                       "max_tokens": cfg.max_tokens, "prompts": len(cfg.prompts), "rss_growth_limit": rss_growth_limit},
            "wall_s": wall, "requests": len(results), "good": len(good), "bad": len(bad), "disconnects": len(gone),
            "good_equal": sum(1 for r in good if r["ok"]), "lost": len(set(sent_ids) - set(got_ids)),
            "duplicated": len(got_ids) - len(set(got_ids)), "server_5xx": server_5xx,
            "rss_start_bytes": rss0, "rss_end_bytes": rss1, "rss_growth": growth,
            "failures": [r for r in results if not r["ok"]][:20], "checks": checks, "passed": all(checks.values())}


def summary(record: dict[str, Any]) -> str:
    g = record["rss_growth"]
    return (f"soak: {record['requests']} requests in {record['wall_s']:.1f} s ({record['good']} good, {record['bad']} "
            f"bad, {record['disconnects']} disconnects): {record['good_equal']} good answers equal to the single "
            f"request's, {record['lost']} lost, {record['duplicated']} duplicated, {record['server_5xx']:.0f} 5xx; "
            f"RSS {record['rss_start_bytes'] or 0:.0f} -> {record['rss_end_bytes'] or 0:.0f} bytes "
            f"({'n/a' if g is None else f'{100 * g:+.2f}%'})\n"
            + "\n".join(f"  {'ok  ' if ok else 'FAIL'} {name}" for name, ok in record["checks"].items())
            + ("\n  failures: " + json.dumps(record["failures"][:5]) if record["failures"] else ""))
