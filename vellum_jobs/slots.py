"""The threads of a worker process that run handlers, one job at a time each.

Each slot thread has its own database connection (Django's connections are
per thread), used by the handlers it runs and closed when it ends. Slots do
not write outcomes: they hand them back to the dispatcher, which records
many in one transaction. Until then a job counts as held, and its lease
keeps being renewed.
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
import uuid
from collections.abc import Callable

from django.db import connections

from vellum_jobs import executor, transient
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
        self.inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.finished: list[tuple[Job, Outcome]] = []  # under the lock, like running
        self.held: dict[int, Job] = {}  # claimed, outcome not yet recorded
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

    def held_jobs(self) -> list[Job]:
        with self.lock:
            return list(self.held.values())

    def submit(self, jobs: list[Job]) -> None:
        """Hand claimed jobs to idle slots (the caller claimed no more than ``idle()``)."""
        with self.lock:
            for job in jobs:
                self.held[job.pk] = job
            self.running += len(jobs)
        for job in jobs:
            self.inbox.put(job)

    def has_finished(self) -> bool:
        with self.lock:
            return bool(self.finished)

    def take_finished(self) -> tuple[list[tuple[Job, Outcome]], int]:
        """The outcomes handed back so far, and how many slots are idle, read together.

        Read apart, a slot finishing in between would count as idle before
        its outcome is seen (or the other way round), and the dispatcher's
        decisions would depend on that timing.
        """
        with self.lock:
            batch, self.finished = self.finished, []
            return batch, self.count - self.running

    def release(self, jobs: list[Job]) -> None:
        """Stop holding ``jobs``: their outcomes are recorded (or left to their leases)."""
        with self.lock:
            for job in jobs:
                self.held.pop(job.pk, None)

    def stop(self, wait: bool) -> None:
        """End the slot threads once idle; ``wait`` for them unless some are stuck in handlers."""
        for _ in self.threads:
            self.inbox.put(None)
        if wait:
            for thread in self.threads:
                thread.join(timeout=5)

    def _serve(self) -> None:
        try:
            while (job := self.inbox.get()) is not None:
                try:
                    outcome = executor.run(job, self.worker_id, shutdown=self.shutdown)
                except Exception:
                    logger.exception("error around a job, recorded as a failed attempt job_id=%s", job.pk)
                    outcome = executor.failed_attempt(job, None, traceback.format_exc())
                finally:
                    transient.discard_broken_connections()
                with self.lock:
                    self.running -= 1
                    self.finished.append((job, outcome))
                self.on_finish()
        finally:
            connections.close_all()
