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
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
import uuid
from collections.abc import Callable

from django.db import close_old_connections, connections

from vellum_jobs import executor
from vellum_jobs.attempts import Attempt
from vellum_jobs.executor import Outcome
from vellum_jobs.models import Job

logger = logging.getLogger("vellum_jobs")


class Slots:
    def __init__(
        self, count: int, worker_id: uuid.UUID, shutdown: threading.Event, on_finish: Callable[[], None]
    ):
        self.count = count
        self.worker_id = worker_id
        self.shutdown = shutdown
        self.on_finish = on_finish
        self.inbox: queue.SimpleQueue[Attempt | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.finished: list[tuple[Attempt, Outcome]] = []  # under the lock, like running
        self.held: dict[Attempt, None] = {}  # claimed, outcome not yet recorded (in claim order)
        self.running = 0  # slots inside a handler
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.count):
            thread = threading.Thread(target=self._serve, name=f"vellum-slot-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def idle(self) -> int:
        with self.lock:
            return self.count - self.running

    def busy(self) -> int:
        with self.lock:
            return self.running

    def held_attempts(self) -> list[Attempt]:
        with self.lock:
            return list(self.held)

    def submit(self, jobs: list[Job]) -> list[Attempt]:
        """Start an attempt of each claimed job (the caller claimed no more than ``idle()`` jobs)."""
        attempts = [Attempt(job, self.worker_id, self.shutdown) for job in jobs]
        with self.lock:
            self.held.update(dict.fromkeys(attempts))
            self.running += len(attempts)
        for attempt in attempts:
            self.inbox.put(attempt)
        return attempts

    def has_finished(self) -> bool:
        with self.lock:
            return bool(self.finished)

    def take_finished(self) -> tuple[list[tuple[Attempt, Outcome]], int]:
        """The outcomes handed back so far, and how many slots are idle, read together.

        Read apart, a slot finishing in between would count as idle before
        its outcome is seen (or the other way round), and the dispatcher's
        decisions would depend on that timing.
        """
        with self.lock:
            batch, self.finished = self.finished, []
            return batch, self.count - self.running

    def release(self, attempts: list[Attempt]) -> None:
        """Stop holding ``attempts``: their outcomes are recorded (or left to their leases)."""
        with self.lock:
            for attempt in attempts:
                self.held.pop(attempt, None)

    def ask_to_stop(self) -> None:
        """Ask every held attempt's handler to stop (``should_stop()``): the worker lost its leases."""
        for attempt in self.held_attempts():
            attempt.stop.set()

    def stop(self, wait: bool) -> None:
        """End the slot threads once idle; ``wait`` for them unless some are stuck in handlers."""
        for _ in self.threads:
            self.inbox.put(None)
        if wait:
            for thread in self.threads:
                thread.join(timeout=5)

    def _serve(self) -> None:
        try:
            while (attempt := self.inbox.get()) is not None:
                close_old_connections()
                try:
                    outcome = executor.run(attempt)
                except Exception:
                    logger.exception(
                        "error around a job, recorded as a failed attempt job_id=%s", attempt.job.pk
                    )
                    outcome = executor.failed_attempt(attempt.job, None, traceback.format_exc())
                finally:
                    close_old_connections()
                attempt.returned = True
                with self.lock:
                    self.running -= 1
                    self.finished.append((attempt, outcome))
                self.on_finish()
        finally:
            connections.close_all()
