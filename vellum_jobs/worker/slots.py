"""The threads of a worker process that run handlers, one attempt at a time each.

Each slot thread has its own database connection (Django's connections are
per thread), used by the handlers it runs. Around each job it does what
Django does around a web request: it drops a connection that failed and no
longer answers, or that is past ``CONN_MAX_AGE``, and with
``CONN_HEALTH_CHECKS`` lets Django check an idle one before its next use.
So a handler's first query after a database restart reconnects instead of
failing. Slots do not write outcomes: they hand them back to the
dispatcher, which records many in one transaction. Until then an attempt
counts as held, and its lease keeps being renewed.

Claimed attempts wait in a buffer in claim order (priority first), and a
thread that comes free takes the next one itself: with short jobs the
dispatcher claims ahead (``prefetch``), so a thread need not wait for the
dispatcher's next cycle between two jobs. Waiting attempts are held like
running ones; the dispatcher takes back those that waited too long, and all
of them at shutdown, before any thread starts them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

from django.db import close_old_connections, connections

from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Job
from vellum_jobs.execution import handler_run, retry_policy
from vellum_jobs.execution.outcome import Outcome
from vellum_jobs.worker.holder import Holder

logger = logging.getLogger("vellum_jobs")


class Slots(Holder):
    def __init__(
        self, count: int, worker_id: uuid.UUID, shutdown: threading.Event, on_finish: Callable[[], None]
    ):
        super().__init__(worker_id, shutdown, on_finish)
        self.count = count
        self.ready = threading.Condition(self.lock)  # an attempt is waiting, or the slots close
        # Under the lock: claimed attempts no thread has started, in claim order.
        self.waiting: list[tuple[tuple[Any, ...], Attempt]] = []
        self.closing = False
        self.threads: list[threading.Thread] = []
        self._order = itertools.count()

    def start(self) -> None:
        for i in range(self.count):
            thread = threading.Thread(target=self._serve, name=f"vellum-slot-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def idle(self) -> int:
        """Threads that no running or waiting attempt will keep busy."""
        with self.lock:
            return self.count - self.running - len(self.waiting)

    def longest_run(self, now: float) -> float:
        """Seconds the longest-running handler has been running (``now`` is ``time.monotonic()``)."""
        with self.lock:
            starts = [a.started for a in self.held if a.started is not None and not a.returned]
        return now - min(starts) if starts else 0.0

    def submit(self, jobs: list[Job]) -> list[Attempt]:
        """An attempt of each claimed job, to start in claim order as threads come free."""
        attempts = [Attempt(job, self.worker_id, self.shutdown) for job in jobs]
        claimed_at = time.monotonic()
        with self.lock:
            for attempt in attempts:
                attempt.claimed_at = claimed_at
                job = attempt.job
                # The claim's order; the counter keeps two attempts from being compared.
                key = (-job.priority, job.run_after, job.id, next(self._order))
                heapq.heappush(self.waiting, (key, attempt))
            self.held.update(dict.fromkeys(attempts))
            self.ready.notify(len(attempts))
        return attempts

    def waiting_ids(self) -> list[int]:
        """Ids of the jobs waiting for a thread, in the order they will start."""
        with self.lock:
            return [attempt.job.pk for _, attempt in sorted(self.waiting, key=lambda entry: entry[0])]

    def take_waiting(self, claimed_before: float | None = None) -> list[Attempt]:
        """Take back waiting attempts (those claimed before ``claimed_before``, or all): no thread will
        start them. They stay held until ``release``."""
        with self.lock:
            taken = [a for _, a in self.waiting if claimed_before is None or a.claimed_at < claimed_before]
            if taken:
                gone = set(taken)
                self.waiting = [entry for entry in self.waiting if entry[1] not in gone]
                heapq.heapify(self.waiting)
            return taken

    def take_finished(self) -> tuple[list[tuple[Attempt, Outcome]], int]:
        """The outcomes handed back so far, and how many slots are idle, read together.

        Read apart, a slot finishing in between would count as idle before
        its outcome is seen (or the other way round), and the dispatcher's
        decisions would depend on that timing.
        """
        with self.lock:
            batch, self.finished = self.finished, []
            return batch, self.count - self.running - len(self.waiting)

    def stop(self, wait: bool) -> None:
        """End the slot threads once no attempt waits; ``wait`` for them unless some are stuck in handlers."""
        with self.lock:
            self.closing = True
            self.ready.notify_all()
        if wait:
            for thread in self.threads:
                thread.join(timeout=5)

    def _next(self) -> tuple[Attempt | None, bool]:
        """The next waiting attempt, once there is one (None once the slots close), and whether
        the thread had to wait for it."""
        waited = False
        with self.lock:
            while not self.waiting:
                if self.closing:
                    return None, waited
                waited = True
                self.ready.wait()
            self.running += 1
            return heapq.heappop(self.waiting)[1], waited

    def _serve(self) -> None:
        try:
            while True:
                attempt, waited = self._next()
                if attempt is None:
                    break
                if waited:  # after the last job's cleanup, only time can have made a connection old
                    close_old_connections()
                try:
                    outcome = handler_run.run(attempt)
                except Exception:
                    logger.exception(
                        "%s #%s: error around the job, not in its handler; recorded as a failed attempt "
                        "job_id=%s",
                        attempt.job.name,
                        attempt.job.pk,
                        attempt.job.pk,
                    )
                    outcome = retry_policy.failed_attempt(attempt.job, None, traceback.format_exc())
                finally:
                    close_old_connections()
                self.hand_back(attempt, outcome)
        finally:
            connections.close_all()
