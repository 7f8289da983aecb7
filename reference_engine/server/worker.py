"""The engine's worker thread: a bounded queue, admission, cancellation, the batching rule's
scheduling side, a watchdog, and shutdown with a deadline.

Why one thread: ``Engine`` is not thread-safe (it reuses buffers) and one decode already keeps
the machine's memory bandwidth busy, so engine calls run one at a time, off the event loop.

Admission comes first: ``admit()`` takes a slot (or raises ``QueueFull``, the route's 429) before
the route parses, templates or tokenizes anything, so a full server refuses work at the cost of
reading headers. ``submit(..., ticket=)`` then queues the job in that slot. At most ``max_queue``
slots are held, waiting, preparing or running.

Every job carries a ``Cancel``: the route sets it when the client goes away, the watchdog when
the job's deadline passes, shutdown when the drain deadline passes. The engine asks it after
every decoded token (``Engine._run``'s ``stop_check``), so a cancelled decode ends within a step,
and the runner asks it between the prompts of one request.

The watchdog (a second thread, polling every ``poll_s``) fails every waiting and running request
with a 503 (``worker_down``) when the engine thread has died, or has gone ``hang_s`` without a
heartbeat (one per decoded token, and one as each engine call starts); ``alive`` then turns
False and /health answers 503. Queued requests whose deadline passed are failed with a 504.

Batching (``max_batch`` > 1, keys from runner.batch_key): the worker takes the oldest queued job;
if it is batchable it waits until ``batch_window_s`` after that job arrived (or until
``max_batch`` of its key are queued; the window starts when the engine becomes free if that is
later) and takes every queued job of the same key, oldest first, up to ``max_batch``; jobs of a
different key keep their place and run next.

Must not import torch, the engine or the harness.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures as cf
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from .knobs import APIError

log = logging.getLogger("reference_engine.server")


class QueueFull(Exception):
    pass


class ClientGone(Exception):
    """The client closed its connection before its answer: nobody is left to answer, and it is
    not a server error (the app logs it at INFO and counts it, never as an internal error)."""


class Cancel:
    """Why a request's work should end early (None: it should not). Set from any thread, read
    by the engine thread once per token: a plain attribute, no lock (one writer wins, and every
    reason ends the work)."""

    __slots__ = ("reason", "progress", "at_set", "at_stop")

    def __init__(self) -> None:
        self.reason: str | None = None
        self.progress: Callable[[], int] | None = None  # tokens decoded so far (set by the runner)
        self.at_set: int | None = None    # tokens decoded when the reason was set
        self.at_stop: int | None = None   # tokens decoded when the engine saw it and stopped

    def set(self, reason: str) -> None:
        if self.reason is None:
            progress = self.progress
            self.at_set = progress() if progress is not None else None
            self.reason = reason

    def steps_after(self) -> int | None:
        """Decode steps taken after the reason was set: how fast cancellation acted."""
        if self.at_set is None or self.at_stop is None:
            return None
        return self.at_stop - self.at_set

    def __bool__(self) -> bool:
        return self.reason is not None


def cancel_error(reason: str | None, timeout_s: float | None = None) -> APIError | None:
    """The answer for work that was cut short, or None (nothing cut it, or a client that left)."""
    if reason == "timeout":
        return APIError(504, f"the request ran past the server's request timeout ({timeout_s} s, "
                             "--request-timeout); what was decoded is discarded", None, "timeout_error",
                        "request_timeout")
    if reason == "shutdown":
        return APIError(503, "the server is shutting down", None, "server_error", "shutting_down")
    if reason == "worker_down":
        return APIError(503, "the engine worker is down", None, "server_error", "worker_down")
    return None


@dataclass
class Ticket:
    """A held queue slot: released by the job's future when submitted, else by ``release``."""

    worker: "EngineWorker"
    used: bool = False

    def release(self) -> None:
        if not self.used:
            self.used = True
            self.worker._free_slot()


@dataclass
class _Job:
    fut: cf.Future
    fn: Callable[[], Any] | None         # run alone
    key: Hashable | None = None          # batchable: same key -> may share one batch_fn call
    item: Any = None
    batch_fn: Callable[[list[Any]], list[Any]] | None = None
    t: float = 0.0
    cancel: Cancel = field(default_factory=Cancel)
    deadline: float = float("inf")


class EngineWorker:
    """Runs engine calls on one thread; at most ``max_queue`` requests admitted at once.

    ``submit(fn)`` runs ``fn()`` alone. ``submit(key=k, item=x, batch_fn=f)`` may be run
    together with other queued jobs of key ``k``: ``f([x1, x2, ...])`` returns one result (or an
    exception instance) per item, in order. ``on_batch(n)`` is called with the size of every
    engine call (1 for a job run alone). ``timeout_s``: a job's deadline from its submission
    (None: none); ``hang_s``: heartbeat silence after which the engine thread counts as hung."""

    def __init__(self, max_queue: int, max_batch: int = 1, batch_window_s: float = 0.0,
                 on_batch: Callable[[int], None] | None = None, timeout_s: float | None = None,
                 hang_s: float = 120.0, poll_s: float = 0.1,
                 on_cancelled: Callable[[Cancel], None] | None = None) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {batch_window_s}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
        if hang_s <= 0:
            raise ValueError(f"hang_s must be > 0, got {hang_s}")
        self.max_queue, self.max_batch, self.batch_window_s = max_queue, max_batch, batch_window_s
        self.on_batch, self.timeout_s, self.hang_s, self.poll_s = on_batch, timeout_s, hang_s, poll_s
        self.on_cancelled = on_cancelled
        self._jobs: collections.deque[_Job] = collections.deque()
        self._running: list[_Job] = []
        self._cv = threading.Condition()
        self._closed = False
        self.down_reason: str | None = None  # set once the engine thread died or hung
        self.depth = 0  # admitted: preparing, waiting or running
        self.beat = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="rsp-engine", daemon=True)
        self._thread.start()
        self._watch = threading.Thread(target=self._watchdog, name="rsp-engine-watchdog", daemon=True)
        self._watch.start()

    # ---- state ----
    @property
    def alive(self) -> bool:
        return self.down_reason is None and self._thread.is_alive()

    @property
    def waiting(self) -> int:
        return len(self._jobs)

    def heartbeat(self) -> None:
        self.beat = time.monotonic()

    # ---- admission and submission ----
    def admit(self) -> Ticket:
        """A slot for one request, before any work on it; raises QueueFull or a 503 APIError."""
        with self._cv:
            self._check_open()
            if self.depth >= self.max_queue:
                raise QueueFull()
            self.depth += 1
        return Ticket(self)

    def _check_open(self) -> None:
        if self.down_reason is not None:
            raise APIError(503, f"the engine worker is down ({self.down_reason}); restart the server", None,
                           "server_error", "worker_down")
        if self._closed:
            raise APIError(503, "the server is shutting down", None, "server_error", "shutting_down")

    def _free_slot(self) -> None:
        with self._cv:
            self.depth -= 1

    def submit(self, fn: Callable[[], Any] | None = None, *, key: Hashable | None = None, item: Any = None,
               batch_fn: Callable[[list[Any]], list[Any]] | None = None, cancel: Cancel | None = None,
               ticket: Ticket | None = None) -> "asyncio.Future[Any]":
        if key is not None and batch_fn is None:
            raise ValueError("a batchable job needs batch_fn")
        if key is None and fn is None:
            if batch_fn is None:
                raise ValueError("submit needs fn or batch_fn")
            fn = (lambda: _one(batch_fn, item))
        if ticket is None:
            ticket = self.admit()
        fut: cf.Future = cf.Future()
        now = time.monotonic()
        job = _Job(fut, fn if key is None else None, key, item, batch_fn, now,
                   cancel if cancel is not None else Cancel(),  # not `or`: an unset Cancel is falsy
                   now + self.timeout_s if self.timeout_s is not None else float("inf"))
        with self._cv:
            try:
                self._check_open()
            except APIError:
                ticket.release()
                raise
            ticket.used = True
            self._jobs.append(job)
            self._cv.notify_all()
        fut.add_done_callback(lambda _: self._free_slot())  # also on cancel: a cancelled request frees its slot
        return asyncio.wrap_future(fut)

    # ---- the engine thread ----
    def _take(self) -> list[_Job] | None:
        """The next engine call's jobs (None: closed and drained). Called on the worker thread."""
        free = time.monotonic()
        with self._cv:
            while not self._jobs and not self._closed:
                self._cv.wait()
            if not self._jobs:
                return None
            first = self._jobs[0]
            if first.key is None or self.max_batch == 1:
                return [self._jobs.popleft()]
            # Wait for company up to the window after the oldest request arrived, or after the
            # engine became free if that is later: clients whose answers just left are sending
            # their next request now, and a short wait lets them join instead of forming a
            # second, alternating batch.
            deadline = max(first.t, free) + self.batch_window_s
            while not self._closed:
                same = sum(1 for j in self._jobs if j.key == first.key and not j.fut.done())
                left = deadline - time.monotonic()
                if same >= self.max_batch or left <= 0:
                    break
                self._cv.wait(left)
            batch: list[_Job] = []
            rest: collections.deque[_Job] = collections.deque()
            for j in self._jobs:
                if j.fut.done():
                    continue  # its client went away (or its deadline passed); its slot is free
                if j.key == first.key and len(batch) < self.max_batch:
                    batch.append(j)
                else:
                    rest.append(j)
            self._jobs = rest
            return batch

    def _loop(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            live = [j for j in jobs if j.fut.set_running_or_notify_cancel()]  # drops cancelled ones
            if not live:
                continue
            with self._cv:
                self._running = live
            self.heartbeat()
            if self.on_batch is not None:
                try:
                    self.on_batch(len(live))
                except Exception:  # metrics must never stop the worker
                    log.exception("on_batch failed")
            try:
                if live[0].fn is not None:
                    results: list[Any] = [live[0].fn()]
                else:
                    results = list(live[0].batch_fn([j.item for j in live]))  # type: ignore[misc]
                    if len(results) != len(live):
                        raise RuntimeError(f"batch_fn returned {len(results)} results for {len(live)} items")
            except Exception as exc:  # every waiting caller gets the error; a BaseException ends the thread
                results = [exc] * len(live)
            with self._cv:
                self._running = []
            for j, r in zip(live, results):
                _settle(j.fut, r)
                if j.cancel.reason is not None and self.on_cancelled is not None:
                    try:
                        self.on_cancelled(j.cancel)
                    except Exception:
                        log.exception("on_cancelled failed")

    # ---- the watchdog ----
    def _watchdog(self) -> None:
        while True:
            time.sleep(self.poll_s)
            with self._cv:
                if self.down_reason is not None or (self._closed and not self._jobs and not self._running):
                    if not self._thread.is_alive():
                        return
                    continue
                now = time.monotonic()
                if not self._thread.is_alive():
                    reason = "the engine thread died"
                elif self._running and now - self.beat > self.hang_s:
                    reason = f"the engine call made no progress for {now - self.beat:.1f} s (hang limit {self.hang_s} s)"
                else:
                    reason = None
                    late = [j for j in self._jobs if now > j.deadline]
                    for j in late:
                        self._jobs.remove(j)
                    for j in self._running:
                        if now > j.deadline:
                            j.cancel.set("timeout")  # the engine ends it within a step
            if reason is not None:
                self._go_down(reason)
                continue
            for j in late:
                j.cancel.set("timeout")
                _settle(j.fut, cancel_error("timeout", self.timeout_s))

    def _go_down(self, reason: str) -> None:
        log.error("engine worker down: %s; failing waiting requests with 503", reason)
        with self._cv:
            self.down_reason = reason
            failed, self._jobs = list(self._jobs) + list(self._running), collections.deque()
            self._running = []
            self._cv.notify_all()
        err = APIError(503, f"the engine worker is down ({reason}); restart the server", None, "server_error",
                       "worker_down")
        for j in failed:
            j.cancel.set("worker_down")
            _settle(j.fut, err)

    # ---- shutdown ----
    def shutdown(self, deadline_s: float = 5.0) -> bool:
        """Refuse new work; fail what is still queued (503); cancel the running call and wait for
        it up to ``deadline_s``. True when the engine thread has stopped."""
        with self._cv:
            self._closed = True
            queued, self._jobs = list(self._jobs), collections.deque()
            running = list(self._running)
            self._cv.notify_all()
        err = cancel_error("shutdown")
        for j in queued:
            j.cancel.set("shutdown")
            if not j.fut.cancel():
                _settle(j.fut, err)
        for j in running:
            j.cancel.set("shutdown")
        if threading.current_thread() is not self._thread:
            self._thread.join(deadline_s)
        return not self._thread.is_alive()


def _settle(fut: cf.Future, result: Any) -> None:
    """Set a future's outcome unless someone (the watchdog, a cancel) already did."""
    try:
        if fut.done():
            return
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)
    except cf.InvalidStateError:
        pass


def _one(batch_fn: Callable[[list[Any]], list[Any]], item: Any) -> Any:
    [r] = batch_fn([item])
    if isinstance(r, BaseException):
        raise r
    return r


async def run_guarded(worker: EngineWorker, fn: Callable[[], Any] | None, is_disconnected: Callable[[], Any],
                      poll_s: float = 0.25, cancel: Cancel | None = None, **batch: Any) -> Any:
    """Submit ``fn`` (or a batchable job: ``key``, ``item``, ``batch_fn``) and wait for it. If the
    client disconnects, a queued job is dropped and a running one told to stop (``cancel``)."""
    cancel = cancel if cancel is not None else Cancel()
    fut = worker.submit(fn, cancel=cancel, **batch)
    try:
        while True:
            done, _ = await asyncio.wait({fut}, timeout=poll_s)
            if done:
                return fut.result()
            if await is_disconnected():
                cancel.set("disconnect")
                fut.cancel()  # succeeds while queued; a running decode sees the Cancel within a step
                raise ClientGone()
    except asyncio.CancelledError:  # the handler's task was cancelled (e.g. at shutdown)
        cancel.set("disconnect")
        raise
