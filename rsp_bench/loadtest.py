"""``rsp-bench loadtest``: a bounded load against an OpenAI-compatible server, checked.

    rsp-bench loadtest --url http://127.0.0.1:8000/v1 --clients 4 --requests 12 --max-tokens 8
    rsp-bench loadtest --clients 4 --requests 12        # starts `rsp-bench serve` on 127.0.0.1 itself

Three phases, each a chat completion at temperature 0 with the knobs as ``X-Pruning-*`` headers
(the watermark pinned to 0 by default, so the router does not read the machine's load and a
response cannot depend on what else runs):

1. single: each distinct prompt once, one at a time: the expected answer per prompt.
2. load: ``requests`` requests over ``clients`` concurrent clients, each with its own
   ``X-Request-Id`` (``lt-<run>-<i>``). Checked: every id answered exactly once and echoed back
   (nothing lost or duplicated), and the answers against the single-request answer for their
   prompt. ``rsp-bench serve`` batches concurrent greedy requests with identical knobs (its
   ``X-Batch-Size`` header says how many were decoded together). With mode off (or static, or
   lossless), or when no response was batched, every answer must equal the single-request one
   (a failure otherwise). With mode lossy under batching the router bypasses a block for the
   batch only when every row agrees, so an answer can depend on its neighbours: then the share
   equal to the single-request answers and the bypass ratio under load are reported, not failed
   (a note says so). A server that sends no ``X-Batch-Size`` is held to equality.
   Figures: p50 / p99 latency, completion tokens/s over the phase's wall time, the bypass ratio
   under load (from ``X-Pruning-Stats``) beside the single-request one, the batch sizes seen.
3. burst (the 429 path): ``max_queue + clients`` requests at once, ``max_queue`` read from the
   server's ``/health``; a 429 must carry ``Retry-After``; every rejected request is retried
   after it and must then succeed with the same answer (recovery), and ``/health`` must show
   an empty queue afterwards. Skipped, and said so, when the server reports no ``max_queue``.

Soak mode (``--soak SECONDS``, ``run_soak``): instead of phases 2 and 3, ``clients`` clients
send a bounded stream (at most ``--soak-requests`` requests, at most SECONDS long) mixing good
requests (checked as in phase 2: answered once, echoed id, equal to the single-request answer),
bad requests (each a known bad value: a 400 or 404 with an OpenAI error object naming it) and
disconnects (a stream closed after its first chunk). The server's resident memory
(``process_resident_memory_bytes`` on its /metrics) is read after the single phase and after the
soak, once the queue is empty; the check fails when it grew by ``rss_growth_limit`` (5%) or more,
or when the server answered any 5xx (its own ``rsp_requests_total``).

A 429 in the load phase is also retried (counted). The record is written atomically with
``rsp_bench.storage.atomic_write_json``; ``passed`` is false when any check failed, and the CLI
then exits 1. Progress bars go to stderr (tqdm) unless ``--quiet``.

The client (``LoadConfig``, ``LoadClient``) is ``rsp_bench.load_client``'s, shared with
``rsp_bench.soak``. Must NOT import torch or reference_engine: it speaks HTTP (the CLI starts a
server in its own process when no ``--url`` is given).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from rsp_bench.errors import HarnessInputError
from rsp_bench.load_client import LoadClient, LoadConfig, check_url, int_or_none, status_hint, unreachable

__all__ = ["LoadConfig", "run_loadtest", "configure_parser", "run"]

# Modes whose greedy output does not depend on the batch: held to equality under batching too.
BATCH_INVARIANT_MODES = ("off", "static", "lossless")


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _batching(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Batch sizes the server reported (``X-Batch-Size``) for these responses."""
    sizes = [r["batch_size"] for r in results if r.get("batch_size") is not None]
    counts: dict[str, int] = {}
    for n in sorted(sizes):
        counts[str(n)] = counts.get(str(n), 0) + 1
    return {"reported": len(sizes), "sizes": counts,
            "mean": statistics.fmean(sizes) if sizes else None,
            "batched_share": sum(1 for n in sizes if n > 1) / len(sizes) if sizes else None}


def must_equal_single(mode: str | None, results: Sequence[dict[str, Any]]) -> bool:
    """Whether these responses must equal the single-request ones: a batch-invariant mode, or
    none of them batched with others (so each was decoded as it is alone)."""
    return (mode or "").lower() in BATCH_INVARIANT_MODES or not any((r.get("batch_size") or 1) > 1 for r in results)


def _bypass(results: Sequence[dict[str, Any]]) -> float | None:
    stats = [r["pruning"] for r in results if r.get("pruning")]
    if not stats or any("blocks" not in s for s in stats):
        return None
    blocks = sum(s["blocks"] * s["total_tokens"] for s in stats)
    return sum(s["layers_bypassed"] for s in stats) / blocks if blocks else 0.0


def _bar(total: int, desc: str, on: bool):
    if not on:
        return None
    try:
        from tqdm import tqdm
    except ModuleNotFoundError:
        return None
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, disable=None)  # None: off unless a terminal


def run_loadtest(base_url: str, cfg: LoadConfig) -> dict[str, Any]:
    """Run the three phases against ``base_url`` (``http://HOST:PORT/v1``); the record as a dict."""
    import httpx

    client = LoadClient(base_url, cfg)
    run_id = uuid.uuid4().hex[:8]
    checks: dict[str, bool] = {}
    notes: list[str] = []
    try:
        model = client.model()
        # 1. single
        single = {}
        for i, prompt in enumerate(cfg.prompts):
            r = client.call(model, prompt, f"lt-{run_id}-single-{i}")
            if r["status"] != 200:
                raise HarnessInputError(f"loadtest: the single request for prompt {i} got {r['status']}: "
                                        f"{r.get('error')}{status_hint(r['status'])}")
            single[prompt] = r
        # 2. load
        plan = [(i, cfg.prompts[i % len(cfg.prompts)]) for i in range(cfg.requests)]
        bar = _bar(len(plan), "loadtest", cfg.progress)
        results: list[dict[str, Any]] = []

        def one(item: tuple[int, str]) -> dict[str, Any]:
            i, prompt = item
            r = client.call(model, prompt, f"lt-{run_id}-{i}")
            r["prompt_index"] = cfg.prompts.index(prompt)
            r["matches_single"] = r.get("text") == single[prompt]["text"]
            if bar is not None:
                bar.update(1)
            return r

        t0 = time.perf_counter()
        with ThreadPoolExecutor(cfg.clients) as pool:
            results = list(pool.map(one, plan))
        wall = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        load_rejections = len(client.rejections)
        ok = [r for r in results if r["status"] == 200]
        sent_ids = [f"lt-{run_id}-{i}" for i, _ in plan]
        got_ids = [r["echoed_id"] for r in ok]
        checks["all_succeeded"] = len(ok) == len(plan)
        checks["nothing_lost_or_duplicated"] = sorted(got_ids) == sorted(sent_ids) and len(set(got_ids)) == len(got_ids)
        checks["ids_echoed"] = all(r["echoed_id"] == r["request_id"] for r in results)
        mode = next((v for k, v in cfg.headers.items() if k.lower() == "x-pruning-mode"), None)
        batching = _batching(ok)
        match_share = sum(1 for r in ok if r["matches_single"]) / len(ok) if ok else None
        if must_equal_single(mode, ok):
            checks["greedy_equal_to_single"] = all(r["matches_single"] for r in ok)
        else:
            notes.append(f"mode {mode} under batching ({batching['batched_share']:.2f} of responses in batches > 1): "
                         f"{match_share:.2f} of answers equal the single-request one, bypass ratio reported beside "
                         f"the single-request one; the router bypasses a block for a batch only when every row "
                         f"agrees, so this is measured, not failed")
        tokens = sum(r.get("completion_tokens") or 0 for r in ok)
        lat = [r["latency_s"] for r in ok]
        load = {"requests": len(plan), "clients": cfg.clients, "succeeded": len(ok), "wall_s": wall,
                "latency_p50_s": _percentile(lat, 0.5), "latency_p99_s": _percentile(lat, 0.99),
                "latency_max_s": max(lat) if lat else None, "completion_tokens": tokens,
                "tokens_per_s": tokens / wall if wall > 0 else None,
                "bypass_ratio": _bypass(ok), "bypass_ratio_single": _bypass(list(single.values())),
                "rejected_429": load_rejections, "greedy_match_share": match_share, "batching": batching,
                "equality_enforced": "greedy_equal_to_single" in checks,
                "mismatches": [{"request_id": r["request_id"], "prompt_index": r["prompt_index"], "text": r.get("text"),
                                "single": single[cfg.prompts[r["prompt_index"]]]["text"]}
                               for r in ok if not r["matches_single"]]}
        if load["bypass_ratio"] is None:
            notes.append("no X-Pruning-Stats header: bypass ratio left out")
        # 3. burst: the 429 path and its recovery
        burst: dict[str, Any] = {"ran": False}
        health = client.health()
        max_queue = (health or {}).get("max_queue")
        if not cfg.burst:
            notes.append("burst phase off (--no-burst)")
        elif not isinstance(max_queue, int):
            notes.append("the server's /health reports no max_queue: the 429 path was not exercised")
        else:
            n = max_queue + cfg.clients
            before = len(client.rejections)
            gate = threading.Barrier(n)
            prompt = cfg.prompts[0]

            def fire(i: int) -> dict[str, Any]:
                gate.wait()
                first = client.call(model, prompt, f"lt-{run_id}-burst-{i}", retry=False)
                first["first_status"] = first["status"]
                if first["status"] == 429:  # recovery: wait as told, then it must be served
                    time.sleep(float(first["retry_after"] or 1))
                    again = client.call(model, prompt, f"lt-{run_id}-burst-{i}")
                    again["first_status"], again["first_retry_after"] = 429, first["retry_after"]
                    return again
                return first

            with ThreadPoolExecutor(n) as pool:
                fired = list(pool.map(fire, range(n)))
            rejected = [r for r in fired if r["first_status"] == 429]
            after = client.health() or {}
            burst = {"ran": True, "max_queue": max_queue, "requests": n, "rejected_429": len(rejected),
                     "retry_after": sorted({r.get("first_retry_after") for r in rejected} - {None}),
                     "recovered": sum(1 for r in rejected if r["status"] == 200),
                     "retries_after_recovery": len(client.rejections) - before,
                     "queue_depth_after": after.get("queue_depth")}
            checks["burst_saw_429"] = len(rejected) > 0
            checks["429_has_retry_after"] = all(r.get("first_retry_after") not in (None, "") for r in rejected)
            checks["burst_recovered"] = all(r["status"] == 200 for r in fired)
            burst["batching"] = _batching(fired)
            burst["greedy_match_share"] = (sum(1 for r in fired if r.get("text") == single[prompt]["text"]) / len(fired)
                                           if fired else None)
            if must_equal_single(mode, fired):
                checks["burst_equal_to_single"] = all(r.get("text") == single[prompt]["text"] for r in fired)
            checks["queue_empty_after"] = after.get("queue_depth") == 0
    except httpx.TransportError as exc:  # the server went away (or never answered) mid-run
        raise unreachable(base_url, exc) from None
    finally:
        client.close()
    return {"kind": "rsp-bench-loadtest", "run_id": run_id, "url": base_url, "model": model,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": {"requests": cfg.requests, "clients": cfg.clients, "max_tokens": cfg.max_tokens,
                       "prompts": len(cfg.prompts), "headers": cfg.headers},
            "single": {str(i): {"text": single[p]["text"], "latency_s": single[p]["latency_s"],
                                "pruning": single[p]["pruning"]} for i, p in enumerate(cfg.prompts)},
            "load": load, "burst": burst, "checks": checks, "notes": notes, "passed": all(checks.values())}


# ---------------------------------------------------------------- CLI


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help="server base URL, e.g. http://127.0.0.1:8000/v1 "
                                               "(default: start `rsp-bench serve` on a free port of 127.0.0.1)")
    p.add_argument("--model", default=None, help="model id to send (default: the server's first)")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    p.add_argument("--requests", type=int, default=12, help="requests in the load phase (default 12)")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per answer (default 8)")
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts from the project's prompt set (default 4)")
    p.add_argument("--mode", default="lossy", help="X-Pruning-Mode sent (default lossy)")
    p.add_argument("--sensitivity", default="0.5", help="X-Pruning-Sensitivity sent (default 0.5)")
    p.add_argument("--hardware-watermark", default="0",
                   help="X-Pruning-Hardware-Watermark sent (default 0: the router ignores machine load); '' sends none")
    p.add_argument("--max-queue", type=int, default=None,
                   help="the started server's --max-queue (default: --clients, so the load phase sees no 429)")
    p.add_argument("--batch-modes", default=None,
                   help="the started server's --batch-modes (default: the server's, off,static)")
    p.add_argument("--max-batch", type=int, default=None,
                   help="the started server's --max-batch (default: the server's; 1 disables batching)")
    p.add_argument("--batch-window-ms", type=float, default=None, help="the started server's --batch-window-ms")
    p.add_argument("--no-burst", action="store_true", help="skip the 429 burst phase")
    p.add_argument("--soak", type=float, default=None, metavar="SECONDS",
                   help="soak mode instead of the load and burst phases: good and bad requests and disconnects "
                        "mixed for at most SECONDS (see rsp_bench.soak)")
    p.add_argument("--soak-requests", type=int, default=400, help="at most this many soak requests (default 400)")
    p.add_argument("--api-key", default=None, help="send 'Authorization: Bearer KEY' (default: $RSP_API_KEY)")
    p.add_argument("--out", default=None, help="write the JSON record here (atomically)")
    p.add_argument("--json", action="store_true", help="print the record as JSON on stdout")


def run(args: argparse.Namespace) -> int:
    import json

    from rsp_bench import datasets as ds
    from rsp_bench.storage import atomic_write_json

    if args.url is not None:
        check_url(args.url)
    headers = {"X-Pruning-Mode": args.mode, "X-Pruning-Sensitivity": str(args.sensitivity),
               "X-Pruning-Log-Level": "NONE"}
    if args.hardware_watermark not in (None, ""):
        headers["X-Pruning-Hardware-Watermark"] = str(args.hardware_watermark)
    import os

    prompts = [p.text for p in ds.load_prompts()[:max(1, args.prompts)]]
    api_key = args.api_key if args.api_key is not None else os.environ.get("RSP_API_KEY") or None
    cfg = LoadConfig(prompts, args.requests, args.clients, args.max_tokens, headers, args.model,
                     burst=not args.no_burst, progress=not args.quiet, api_key=api_key)

    def go(url: str) -> dict[str, Any]:
        if args.soak is None:
            return run_loadtest(url, cfg)
        from rsp_bench.soak import run_soak

        return run_soak(url, cfg, args.soak, args.soak_requests)

    if args.url:
        record = go(args.url)
    else:
        from rsp_bench.engines.openai_engine import ServedProcess

        queue = args.max_queue if args.max_queue is not None else args.clients
        extra = []
        if args.max_batch is not None:
            extra += ["--max-batch", str(args.max_batch)]
        if args.batch_modes is not None:
            extra += ["--batch-modes", str(args.batch_modes)]
        if args.batch_window_ms is not None:
            extra += ["--batch-window-ms", str(args.batch_window_ms)]
        with ServedProcess(["--max-queue", str(queue), "--log-level", "NONE", "--hardware-watermark", "0", *extra]) as url:
            record = go(url + "/v1")
    if args.out:
        atomic_write_json(args.out, record)
    if args.json:
        print(json.dumps(record, indent=2, sort_keys=True))
    elif args.soak is not None:
        from rsp_bench.soak import summary

        print(summary(record))
    else:
        load, burst = record["load"], record["burst"]
        print(f"load: {load['succeeded']}/{load['requests']} ok over {load['clients']} clients in {load['wall_s']:.2f} s; "
              f"latency p50 {load['latency_p50_s']:.3f} s, p99 {load['latency_p99_s']:.3f} s; "
              f"{load['tokens_per_s']:.1f} tokens/s; bypass ratio {load['bypass_ratio']} "
              f"(single {load['bypass_ratio_single']}); 429s {load['rejected_429']}")
        b = load["batching"]
        if b["reported"]:
            print(f"batching: mean batch size {b['mean']:.2f}, {b['batched_share']:.2f} of responses batched, sizes "
                  f"{b['sizes']}; {load['greedy_match_share']:.2f} equal to the single-request answer "
                  f"({'enforced' if load['equality_enforced'] else 'measured, not enforced'})")
        if burst.get("ran"):
            print(f"burst: {burst['requests']} at once, max_queue {burst['max_queue']}: {burst['rejected_429']} got 429 "
                  f"(Retry-After {burst['retry_after']}), {burst['recovered']} recovered; queue depth after "
                  f"{burst['queue_depth_after']}")
        for name, ok in record["checks"].items():
            print(f"  {'ok  ' if ok else 'FAIL'} {name}")
        for note in record["notes"]:
            print(f"  note: {note}")
        if args.out:
            print(f"record: {args.out}")
    return 0 if record["passed"] else 1
