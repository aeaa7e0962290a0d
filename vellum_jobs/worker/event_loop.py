"""The event loop of a worker process: coroutine jobs, hundreds at once, beside the slot threads.

A process whose jobs include ``async def`` handlers runs one asyncio event
loop in a thread of its own, and each claimed coroutine job becomes a task
on it, up to ``--async-workers`` at once. The dispatcher claims for the
loop apart from the threads (``Job.is_async``) and records the loop's
outcomes with theirs, in the same batched writes: like ``Slots``, the loop
only hands outcomes back.

What a thread cannot do, a task can: be stopped. A task past its timeout
is cancelled (``asyncio.timeout``), and so is one whose cancellation was
requested; at shutdown those still running after the grace period are
cancelled once the worker handed their jobs back. A blocking call in a
coroutine stops every other one, so a watcher thread reports, with the
job's id and the line it is on, a loop that has gone without a turn for
longer than ``ASYNC_BLOCKED_WARNING``.

The loop thread never touches the database itself: Django refuses sync ORM
calls there. The handlers' own sync code (the async ORM, ``sync_to_async``)
runs in asgiref's one thread for sync code, shared by every coroutine job.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from types import FrameType

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections

from vellum_jobs.conf import conf
from vellum_jobs.core import transitions
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Job
from vellum_jobs.execution import handler_run, retry_policy, tracing
from vellum_jobs.execution.outcome import Outcome
from vellum_jobs.worker.holder import Holder

logger = logging.getLogger("vellum_jobs")

# How long stop() waits for cancelled tasks to run their ``finally:`` blocks.
CANCEL_WAIT = 1.0


class EventLoop(Holder):
    """Up to ``capacity`` coroutine jobs at once on one event loop, started in a thread on first use."""

    def __init__(
        self, capacity: int, worker_id: uuid.UUID, shutdown: threading.Event, on_finish: Callable[[], None]
    ) -> None:
        super().__init__(worker_id, shutdown, on_finish)
        self.capacity = capacity
        self.closed = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        # Only touched on the loop's thread.
        self.tasks: dict[Attempt, asyncio.Task[None]] = {}
        self.tidying: asyncio.Task[None] | None = None  # the close of _tidy_connections
        # A collection of garbage holds the loop, but it is not the job's code: the seconds the
        # loop's thread has spent in them, and when the one under way began.
        self.collected = 0.0
        self.collecting_since: float | None = None
        self.loop_ident: int | None = None
        # When the loop last ran its ticker, and ``collected`` then (one tuple: read together).
        self.turn = (time.monotonic(), 0.0)

    # -- what the dispatcher and the heartbeat ask ----------------------

    def idle(self) -> int:
        with self.lock:
            return max(0, self.capacity - self.running)

    def take_finished(self) -> tuple[list[tuple[Attempt, Outcome]], int]:
        """The outcomes handed back so far, and how many more tasks the loop may start, read together."""
        with self.lock:
            batch, self.finished = self.finished, []
            return batch, max(0, self.capacity - self.running)

    # -- running ---------------------------------------------------------

    def submit(self, jobs: list[Job]) -> list[Attempt]:
        """A task for each claimed job, started at once."""
        if not jobs:
            return []
        attempts = [Attempt(job, self.worker_id, self.shutdown) for job in jobs]
        claimed_at = time.monotonic()
        for attempt in attempts:
            attempt.claimed_at = claimed_at
            attempt.on_loop = True
        with self.lock:
            self.held.update(dict.fromkeys(attempts))
            self.running += len(attempts)
        self._loop().call_soon_threadsafe(self._start, attempts)
        return attempts

    def cancel(self, attempts: Iterable[Attempt]) -> None:
        """Cancel the tasks of ``attempts`` (those whose cancellation was requested)."""
        ours = [attempt for attempt in attempts if attempt.on_loop]
        if ours and self.loop is not None:
            self.loop.call_soon_threadsafe(self._cancel, ours)

    def stop(self) -> None:
        """Cancel every task still running, give them ``CANCEL_WAIT`` to finish, and end the loop."""
        self.closed.set()
        loop, thread = self.loop, self.thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(self._cancel, None)
        deadline = time.monotonic() + CANCEL_WAIT
        while self.busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=CANCEL_WAIT)

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, started on first use: a process that never claims a coroutine job has none."""
        if self.loop is None:
            ready = threading.Event()
            self.thread = threading.Thread(target=self._serve, args=(ready,), name="vellum-loop", daemon=True)
            self.thread.start()
            ready.wait()
            if self.loop is None:
                raise RuntimeError("the event loop's thread failed before it started (see the error logged)")
            watcher = threading.Thread(target=self._watch, name="vellum-loop-watch", daemon=True)
            watcher.start()
        assert self.loop is not None
        return self.loop

    def _serve(self, ready: threading.Event) -> None:
        # Whatever happens, the dispatcher waiting for the loop hears of it: a
        # loop that failed to start leaves self.loop None, and it raises.
        try:
            loop, ticker = self._new_loop()
        except BaseException:
            logger.exception("event loop not started; this worker runs no coroutine (async def) jobs")
            return
        finally:
            ready.set()
        try:
            loop.run_forever()
        finally:
            gc.callbacks.remove(self._on_collection)
            ticker.cancel()
            tidying = [self.tidying] if self.tidying is not None else []
            loop.run_until_complete(
                asyncio.gather(ticker, *self.tasks.values(), *tidying, return_exceptions=True)
            )
            # The connections the handlers' sync code opened, in asgiref's thread for it.
            loop.run_until_complete(sync_to_async(connections.close_all)())
            loop.close()

    def _new_loop(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Task[None]]:
        try:
            tracing.prepare()  # done by the worker already; here for a loop started on its own
        except Exception:  # an optional extra: coroutine jobs run without spans rather than not at all
            logger.exception("OpenTelemetry not prepared for the event loop")
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.run_until_complete(_start_sync_threads())
        self.loop_ident = threading.get_ident()
        gc.callbacks.append(self._on_collection)
        ticker = loop.create_task(self._tick())
        self.loop = loop
        return loop, ticker

    def _start(self, attempts: list[Attempt]) -> None:
        loop = asyncio.get_running_loop()
        for attempt in attempts:
            self.tasks[attempt] = loop.create_task(self._run(attempt), name=f"vellum-job-{attempt.job.pk}")

    def _cancel(self, attempts: list[Attempt] | None) -> None:
        for attempt, task in list(self.tasks.items()):
            if attempts is None or attempt in attempts:
                task.cancel()

    async def _run(self, attempt: Attempt) -> None:
        try:
            outcome = await handler_run.arun(attempt)
        except BaseException:  # around the handler, not in it: still this job's failure
            logger.exception(
                "%s #%s: error around the coroutine job, not in it; recorded as a failed attempt job_id=%s",
                attempt.job.name,
                attempt.job.pk,
                attempt.job.pk,
            )
            outcome = retry_policy.failed_attempt(attempt.job, None, traceback.format_exc())
        finally:
            self.tasks.pop(attempt, None)
        self.hand_back(attempt, outcome)
        if outcome.state != transitions.DONE:
            self._tidy_connections()

    def _tidy_connections(self) -> None:
        """Close the broken or old connections of the thread for sync code, in the background.

        A failure may have left that thread's connection broken, and the next
        job should not inherit it. The close runs in that one thread, which
        another job's long sync call may hold: so after the outcome is handed
        back, never before it, and one pending close covers every failure
        that comes meanwhile.
        """
        if self.tidying is None or self.tidying.done():
            self.tidying = asyncio.get_running_loop().create_task(sync_to_async(close_old_connections)())

    # -- the blocked-loop watch -------------------------------------------

    def _tick_interval(self) -> float:
        return max(0.005, min(0.05, conf.async_blocked_warning / 2))

    async def _tick(self) -> None:
        interval = self._tick_interval()
        while True:
            self.turn = (time.monotonic(), self.collected)
            await asyncio.sleep(interval)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        """``gc.callbacks``: time the collections the loop's thread runs (any thread may run one)."""
        if threading.get_ident() != self.loop_ident:
            return
        if phase == "start":
            self.collecting_since = time.monotonic()
        elif self.collecting_since is not None:
            self.collected += time.monotonic() - self.collecting_since
            self.collecting_since = None

    def _stalled(self, turn_at: float, collected_then: float, interval: float) -> float:
        """How long the loop has gone without a turn since ``turn_at``, less its garbage collections."""
        now = time.monotonic()
        since = self.collecting_since
        in_collections = self.collected - collected_then + (now - since if since is not None else 0.0)
        return now - turn_at - interval - in_collections

    def _watch(self) -> None:
        """Log, once per stall, a job that has held the loop for ``ASYNC_BLOCKED_WARNING``.

        A late turn alone is not a stall: when the machine is busy, the whole
        process waits for a core, the loop in its selector as much as this
        thread. So a late turn counts only while a job's code is on the loop's
        thread (a suspended coroutine's frame is not on any stack), and the
        time its thread spent collecting garbage does not count.
        """
        interval = self._tick_interval()
        threshold = conf.async_blocked_warning
        reported = 0.0
        while not self.closed.wait(interval):
            turn_at, collected_then = self.turn
            stalled = self._stalled(turn_at, collected_then, interval)
            if stalled < threshold or turn_at == reported:
                continue
            job, where = self._holder()
            if job is None:
                continue
            reported = turn_at
            logger.warning(
                "%s #%s blocked the event loop for %.2fs: it called something that blocks, and every "
                "other coroutine job waits for it (await it, or run it in sync_to_async) "
                "job_id=%s name=%s at=%s",
                job.name,
                job.pk,
                stalled,
                job.pk,
                job.name,
                where,
            )

    def _holder(self) -> tuple[Job | None, str]:
        """The job whose code the loop's thread is in, and the innermost line it is running."""
        thread = self.thread
        frame = sys._current_frames().get(thread.ident) if thread is not None and thread.ident else None
        if frame is None:
            return None, "?"
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        return _job_in(frame), where


async def _start_sync_threads() -> None:
    """Start the threads ``sync_to_async`` runs sync code in, before any job.

    The first call of each kind (thread-sensitive or not) starts its thread,
    and ``Thread.start`` waits on the calling thread, the loop's, until the new
    thread runs: on a busy machine long enough for the watch to report the job
    that made the call as holding the loop.
    """
    await sync_to_async(_nothing, thread_sensitive=False)()
    await sync_to_async(_nothing)()


def _nothing() -> None:
    pass


def _job_in(frame: FrameType | None) -> Job | None:
    """The ``job`` of the innermost ``handler_run.arun_handler`` frame on the stack from ``frame``."""
    while frame is not None:
        if frame.f_code is handler_run.arun_handler.__code__:
            job = frame.f_locals.get("job")
            return job if isinstance(job, Job) else None
        frame = frame.f_back
    return None
