"""One engine, many concurrent HTTP requests: a background thread runs the engine's step loop
(continuous batching across every request in flight); each request gets an asyncio queue that
the thread feeds with the request's updates.

Only the engine thread touches the engine. Requests and aborts reach it through an inbox that
it drains before every step; `submit` awaits the thread's verdict, so a bad request raises its
RequestError in the caller. A request whose consumer goes away (client disconnect, cancelled
task) is aborted and its KV blocks are freed; /metrics counts aborts by reason
(metrics.ABORT_REASONS).

What is admitted is bounded (server/limits.py's `Limits`):
- by count: beyond `max_pending` requests in flight, `submit` raises `QueueFull` (HTTP 503);
- by cost: a request whose estimated wait before it starts — replaying the scheduler's
  admission with every request ahead generating its expected output, at the engine's measured
  step costs (engine/backlog.py) — exceeds `max_queue_time` raises `Overloaded` (HTTP 503 with
  a Retry-After of the excess), before the queue grows to a latency nobody waits for;
- by time: a request still unfinished at its deadline (its own `timeout`, or the server's
  `request_timeout`) is stopped within a step and ends as if it had reached a limit, with
  what it generated and finish_reason "timeout" (not an error: a client's own deadline is
  no server failure, and an error status would make clients retry it).

An engine that cannot step any more (a tensor-parallel worker died or hung: `WorkerError`)
fails the requests in flight and refuses new ones with `EngineStopped` (HTTP 503), and tells
`on_failure` (the server exits non-zero: server/lifecycle.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from infergen.compiler.traffic import TrafficRecord
from infergen.engine.engine import Engine
from infergen.engine.request import RequestOutput, StreamDelta
from infergen.engine.sampling_params import SamplingParams
from infergen.engine.workers import WorkerError
from infergen.server.limits import Limits
from infergen.server.metrics import ABORT_REASONS, ServerMetrics

log = logging.getLogger("infergen.server")
TRAFFIC_SAVE_S = 30.0  # how often the traffic record is written (and at shutdown)


class QueueFull(Exception):
    """More requests are in flight than the server accepts (retry after `retry_after` s)."""

    retry_after = 1


class Overloaded(QueueFull):
    """The request would wait longer than the queue-time budget before it starts."""

    def __init__(self, wait: float, budget: float):
        super().__init__(
            f"this request could wait {wait:.0f} s before it starts (the server's queue-time "
            f"budget is {budget:g} s)"
        )
        self.retry_after = max(1, math.ceil(wait - budget))


class EngineFailure(Exception):
    """The engine step running this request raised (a bug, reported as HTTP 500). A request
    that ends early for another reason raises a subclass: its HTTP status and error type are
    what the response (or a stream's error event) shows."""

    status, kind = 500, "server_error"


class ShuttingDown(EngineFailure):
    """The server is stopping: no new requests (HTTP 503), and the ones still running when
    the shutdown timeout ends are aborted (503, or an error event in a stream)."""

    status, kind = 503, "server_shutting_down"


class EngineStopped(EngineFailure):
    """The engine cannot step any more (a tensor-parallel worker died or hung: engine/
    workers.py): the requests in flight end and new ones are refused (HTTP 503), /health
    answers 503, and the server exits with a non-zero status."""

    status, kind = 503, "engine_unavailable"


@dataclass
class _AbortAll:
    """Abort every request in flight (the shutdown timeout ended)."""


@dataclass
class Update:
    """One step's news for a request: the delta, and the final output once it finished."""

    delta: StreamDelta
    output: RequestOutput | None


@dataclass
class _Abort:
    request_id: str
    reason: str


@dataclass
class _Submission:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    accepted: asyncio.Future
    submitted: float  # time.perf_counter() at submission
    timeout: float | None  # seconds from submission to the last token


class AsyncEngine:
    def __init__(self, engine: Engine, limits: Limits | None = None):
        self.engine = engine
        self.limits = limits or Limits()
        self._deadlines: dict[str, float] = {}  # request id → perf_counter() deadline
        self._inbox: list[_Submission | _Abort | _AbortAll] = []
        self.draining = False  # shutting down: no new requests
        self.failed: Exception | None = None  # the engine cannot step any more: why
        self.on_failure = None  # called (engine thread) with that error, once
        self._inbox_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self.metrics = ServerMetrics()
        # the steps per token-count bucket, saved for the next start's compile plan
        # (compile_budget_s; compiler/traffic.py)
        if engine.traffic is None:
            engine.traffic = TrafficRecord.for_model(str(engine.checkpoint_path))
        self._traffic_saved = time.perf_counter()
        self._times: dict[str, list[float]] = {}  # request id → [submitted, last token time]
        self._thread = threading.Thread(target=self._run, name="infergen-engine", daemon=True)
        self._thread.start()

    # ---- the engine thread ----------------------------------------------------------------------
    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            items, self._inbox = self._inbox, []
        for item in items:
            if isinstance(item, _AbortAll):  # the shutdown timeout ended
                failure = ShuttingDown("the server shut down before this request finished")
                for rid, (loop, queue) in list(self._queues.items()):
                    self._abort(rid, "shutdown")
                    loop.call_soon_threadsafe(queue.put_nowait, failure)
                self._queues.clear()
                continue
            if isinstance(item, _Abort):
                self._abort(item.request_id, item.reason)
                continue
            try:
                self.engine.add_request(item.prompt, item.params, request_id=item.request_id)
                self._admit(item.request_id)
            except Exception as exc:  # noqa: BLE001 - handed to the waiting caller
                self._queues.pop(item.request_id, None)
                self.metrics.rejected("overloaded" if isinstance(exc, Overloaded) else "invalid")
                item.loop.call_soon_threadsafe(_settle, item.accepted, exc)
            else:
                self._times[item.request_id] = [item.submitted, 0.0]
                if item.timeout is not None:
                    self._deadlines[item.request_id] = item.submitted + item.timeout
                item.loop.call_soon_threadsafe(_settle, item.accepted, None)

    def _admit(self, request_id: str) -> None:
        """Admission by cost: withdraw the request just added (raising Overloaded) when its
        estimated wait (engine/backlog.py, at the engine's measured step costs) passes the
        queue-time budget. Before the first step there is no estimate."""
        budget = self.limits.max_queue_time
        if budget is None or not self.engine.step_cost.known:
            return
        wait = self.engine.seconds_until_admitted(request_id)
        if wait > budget:
            self.engine.abort(request_id)
            self.engine.release(request_id)
            raise Overloaded(wait, budget)

    def _expire(self) -> list[Update]:
        """Stop the requests whose deadline has passed (engine thread): their last update,
        finish_reason "timeout"."""
        now = time.perf_counter()
        updates = []
        for rid in [rid for rid, deadline in self._deadlines.items() if deadline <= now]:
            del self._deadlines[rid]
            delta = self.engine.abort(rid, reason="timeout")
            if delta is not None:
                updates.append(Update(delta, self.engine.output(rid)))
                self.engine.release(rid)
                self.metrics.aborted("timeout")
        return updates

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain_inbox()
            updates: list[Update] = self._expire() if self._deadlines else []
            if self.engine.has_unfinished():
                try:
                    stepped = self._step()
                except WorkerError as exc:  # the engine is gone: fail what runs, refuse more
                    self._stopped(exc)
                    stepped = []
                except Exception as exc:  # noqa: BLE001 - a bug: fail the batch, keep serving
                    self._fail_all(exc)
                    stepped = []
                updates += stepped
            self._observe(updates)
            for update in updates:
                target = self._queues.get(update.delta.request_id)
                if target is not None:
                    loop, queue = target
                    loop.call_soon_threadsafe(queue.put_nowait, update)
            if not updates and not self.engine.has_unfinished():
                self._wake.wait(0.05)
                self._wake.clear()

    def _account(self, output: RequestOutput, outcome: str) -> None:
        self.metrics.account(outcome, len(output.prompt_token_ids), output.num_cached_prompt_tokens)

    def _observe(self, updates: list[Update]) -> None:
        """Latency histograms, token counters and gauges after a step (engine thread)."""
        now = time.perf_counter()
        m, scheduler, pool = self.metrics, self.engine.scheduler, self.engine.pool
        for update in updates:
            times = self._times.get(update.delta.request_id)
            if times is not None and update.delta.token_ids:
                m.tokens(
                    len(update.delta.token_ids), now - (times[1] or times[0]), first=not times[1]
                )
                times[1] = now
            if update.output is not None:
                self._times.pop(update.delta.request_id, None)
                self._deadlines.pop(update.delta.request_id, None)
                timed_out = update.output.finish_reason == "timeout"
                self._account(update.output, "aborted" if timed_out else "finished")
        if self.engine.kv_tiers is not None:
            m.set_tiers(self.engine.kv_tiers.stats())
        checkpoints = self.engine.scheduler.checkpoints
        if checkpoints is not None:
            m.set_checkpoints(dict(checkpoints.stats, nbytes=checkpoints.nbytes))
        if self.engine.speculator is not None:
            m.set_speculation(self.engine.speculator.summary())
        if now - self._traffic_saved >= TRAFFIC_SAVE_S:
            self._save_traffic()
        m.set_load(
            waiting=len(scheduler.waiting),
            running=len(scheduler.running),
            blocks_used=pool.num_blocks - pool.num_free,
            blocks_free=pool.num_free,
        )

    def _step(self) -> list[Update]:
        updates = []
        for delta in self.engine.step():
            output = None
            if delta.finished:
                output = self.engine.output(delta.request_id)
                self.engine.release(delta.request_id)
            updates.append(Update(delta, output))
        return updates

    def _stopped(self, exc: Exception) -> None:
        """The engine cannot step any more: the requests in flight end with EngineStopped
        (HTTP 503), new ones are refused with it, and `on_failure` hears why."""
        first = self.failed is None
        self.failed = exc
        self._fail_all(exc, EngineStopped(f"the engine stopped: {exc}"))
        if first and self.on_failure is not None:
            self.on_failure(exc)

    def _fail_all(self, exc: Exception, failure: EngineFailure | None = None) -> None:
        """An engine step raised: every request in flight ends with `failure` (default
        EngineFailure, HTTP 500), its blocks are freed, and the loop goes on with the
        requests that come next."""
        log.error("engine step failed; ending %d requests", len(self._queues), exc_info=exc)
        failure = failure or EngineFailure(f"internal error in the engine step: {exc!r}")
        for request_id, (loop, queue) in list(self._queues.items()):
            self.engine.abort(request_id)
            self.engine.release(request_id)
            self._times.pop(request_id, None)
            self._deadlines.pop(request_id, None)
            self.metrics.count("failed")
            loop.call_soon_threadsafe(queue.put_nowait, failure)
        self._queues.clear()

    def _abort(self, request_id: str, reason: str) -> None:
        """Abort one request if it still runs (counted by reason, its prompt accounted) and
        forget it (engine thread)."""
        if self.engine.abort(request_id) is not None:  # it was still running
            self._account(self.engine.output(request_id), "aborted")
            self.metrics.aborted(reason)
        self.engine.release(request_id)
        self._times.pop(request_id, None)
        self._deadlines.pop(request_id, None)

    def drain(self, timeout: float) -> None:
        """Begin a bounded shutdown (any thread): refuse new requests now, and abort the ones
        still in flight after `timeout` seconds."""
        if self.draining:
            return
        self.draining = True
        log.warning("shutting down: %d requests in flight, %.0f s to finish", len(self._queues),
                    timeout)  # fmt: skip
        timer = threading.Timer(timeout, self._abort_all)
        timer.daemon = True
        timer.start()

    def _abort_all(self) -> None:
        with self._inbox_lock:
            self._inbox.append(_AbortAll())
        self._wake.set()

    def _save_traffic(self) -> None:
        self._traffic_saved = time.perf_counter()
        try:
            self.engine.traffic.save()
        except OSError as error:  # (a read-only cache directory: the server goes on)
            log.warning("could not save the traffic record: %s", error)

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
        if self.engine.traffic is not None and self.engine.traffic.steps:
            self._save_traffic()
        if self.engine.kv_tiers is not None:  # blocks queued for writing through: on disk
            self.engine.kv_tiers.flush()
        self.engine.close()  # (tensor-parallel workers stopped)

    # ---- requests ---------------------------------------------------------------------------
    async def submit(
        self, prompt: Sequence[int], params: SamplingParams, timeout: float | None = None
    ) -> tuple[str, asyncio.Queue]:
        """Add a request (raises RequestError for a bad one, QueueFull when full, Overloaded
        when it would wait too long, ShuttingDown once the server stops). `timeout`: seconds
        it may take to finish, then it stops with finish_reason "timeout"."""
        if self.failed is not None:
            self.metrics.rejected("engine_stopped")
            raise EngineStopped(f"the engine stopped: {self.failed}")
        if self.draining:
            self.metrics.rejected("shutting_down")
            raise ShuttingDown("the server is shutting down; retry on another replica or later")
        if len(self._queues) >= self.limits.max_pending:
            self.metrics.rejected("queue_full")
            limit = self.limits.max_pending
            raise QueueFull(f"{len(self._queues)} requests in flight (limit {limit})")
        loop = asyncio.get_running_loop()
        request_id = f"srv-{next(self._ids)}"
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = (loop, queue)
        accepted = loop.create_future()
        with self._inbox_lock:
            self._inbox.append(
                _Submission(
                    request_id,
                    list(prompt),
                    params,
                    loop,
                    queue,
                    accepted,
                    time.perf_counter(),
                    timeout,
                )
            )
        self._wake.set()
        try:
            await accepted
        except asyncio.CancelledError:
            self.abort(request_id, reason="cancelled")
            raise
        return request_id, queue

    def abort(self, request_id: str, reason: str = "cancelled") -> None:
        """Stop a request (if still running) and forget it; its KV blocks go back to the pool.
        `reason`: one of ABORT_REASONS (counted when the request was still running)."""
        assert reason in ABORT_REASONS, reason
        self._queues.pop(request_id, None)
        with self._inbox_lock:
            self._inbox.append(_Abort(request_id, reason))
        self._wake.set()

    async def stream(self, request_id: str, queue: asyncio.Queue) -> AsyncIterator[Update]:
        """The request's updates until it finishes; aborts it if the consumer stops early."""
        finished = False
        try:
            while not finished:
                update = await queue.get()
                if isinstance(update, EngineFailure):
                    finished = True
                    raise update
                finished = update.delta.finished
                yield update
        finally:
            if finished:
                self._queues.pop(request_id, None)
            else:  # the consumer stopped early: the client went away
                self.abort(request_id, reason="disconnect")


def _settle(future: asyncio.Future, error: Exception | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
