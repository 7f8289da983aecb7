"""Prometheus metrics of the server (prometheus_client, one registry per app, so two apps in one
process, as in the unit tests, do not share counters).

    rsp_requests_total{path,status}     answered requests
    rsp_request_latency_seconds{path}   latency histogram
    rsp_prompt_tokens_total, rsp_completion_tokens_total
    rsp_layers_bypassed_total, rsp_block_steps_total   bypass ratio = bypassed / block steps
    rsp_bypass_ratio                    bypass ratio of all decoded tokens so far
    rsp_degraded_requests_total         requests where protective degradation turned pruning off
    rsp_rejected_total                  429s (queue full)
    rsp_queue_depth                     requests waiting or running now
    rsp_batch_size                      requests per engine call (histogram; 1: run alone)
    rsp_cancelled_requests_total{reason} engine calls cut short: disconnect, timeout, shutdown
    rsp_decode_steps_after_cancel       decode steps a cancelled call took after the cancel (histogram)
    rsp_cancelled_decoded_tokens        tokens a cancelled call decoded in all (histogram)
    rsp_worker_alive                    1 while the engine worker thread runs, 0 once it died or hung
    process_resident_memory_bytes, ...  prometheus_client's process metrics (Linux)

Every answered request is counted in rsp_requests_total, 5xx included (guard.py observes them).

Must not import torch or the harness.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector,
                               generate_latest)

_PATHS = ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/tokenizer_info",
          "/v1/models", "/health", "/metrics")


class ServerMetrics:
    def __init__(self, queue_depth: Callable[[], int], worker_alive: Callable[[], bool] = lambda: True) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes: the soak test reads it
        self.requests = Counter("rsp_requests", "answered requests", ["path", "status"], registry=r)
        self.latency = Histogram("rsp_request_latency_seconds", "request latency", ["path"], registry=r,
                                 buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.prompt_tokens = Counter("rsp_prompt_tokens", "prompt tokens processed", registry=r)
        self.completion_tokens = Counter("rsp_completion_tokens", "tokens generated", registry=r)
        self.bypassed = Counter("rsp_layers_bypassed", "block-steps bypassed", registry=r)
        self.block_steps = Counter("rsp_block_steps", "block-steps decoded (blocks x tokens)", registry=r)
        self.degraded = Counter("rsp_degraded_requests", "requests degraded to unpruned", registry=r)
        self.rejected = Counter("rsp_rejected", "requests rejected with 429 (queue full)", registry=r)
        self.ratio = Gauge("rsp_bypass_ratio", "bypass ratio over all decoded tokens", registry=r)
        self.ratio.set_function(self._ratio)
        self.batch_size = Histogram("rsp_batch_size", "requests per engine call (1: run alone)", registry=r,
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64))
        depth = Gauge("rsp_queue_depth", "requests waiting or running", registry=r)
        depth.set_function(lambda: float(queue_depth()))
        alive = Gauge("rsp_worker_alive", "1 while the engine worker runs", registry=r)
        alive.set_function(lambda: float(worker_alive()))
        self.cancelled = Counter("rsp_cancelled_requests", "engine calls cut short", ["reason"], registry=r)
        self.cancelled_tokens = Histogram("rsp_cancelled_decoded_tokens", "tokens a cancelled call decoded in all",
                                          registry=r, buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256))
        self.steps_after_cancel = Histogram("rsp_decode_steps_after_cancel",
                                            "decode steps taken after a cancel was set", registry=r,
                                            buckets=(0, 1, 2, 3, 5, 8, 16, 64))
        self._bypassed = self._steps = 0

    def _ratio(self) -> float:
        return self._bypassed / self._steps if self._steps else 0.0

    def observe(self, path: str, status: int, seconds: float) -> None:
        label = path if path in _PATHS else "other"  # unknown paths must not grow the label set
        self.requests.labels(label, str(status)).inc()
        self.latency.labels(label).observe(seconds)

    def observe_cancel(self, cancel: Any) -> None:
        """A worker.Cancel whose job finished: why, and how many steps it took to stop."""
        self.cancelled.labels(str(cancel.reason)).inc()
        steps = cancel.steps_after()
        if cancel.at_stop is not None:
            self.cancelled_tokens.observe(cancel.at_stop)
        if steps is not None:
            self.steps_after_cancel.observe(steps)

    def observe_batch(self, size: int) -> None:
        self.batch_size.observe(size)

    def record(self, stats: Mapping[str, Any], prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)
        steps = int(stats["blocks"]) * int(stats["total_tokens"])
        self.bypassed.inc(int(stats["layers_bypassed"]))
        self.block_steps.inc(steps)
        self._bypassed += int(stats["layers_bypassed"])
        self._steps += steps
        if stats.get("degraded"):
            self.degraded.inc()

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
