"""Keeping time for the schedules: the dispatcher ticks them at each scheduled instant.

A thread of its own only keeps time: it sleeps until the next instant a
schedule names, then asks the dispatcher to tick. The tick runs on the
dispatcher's connection: a few statements a minute are not worth one more
connection per process (see ``connections_held``).
"""

from __future__ import annotations

import logging
import threading

from vellum_jobs.maintenance import schedules
from vellum_jobs.store import transient_errors
from vellum_jobs.worker.silence import Calls

logger = logging.getLogger("vellum_jobs")


class ScheduleTimer:
    """Ticks the schedules of one process on ``alias`` at start and at each instant, until shutdown."""

    def __init__(self, alias: str, calls: Calls, wake: threading.Event, stopping: threading.Event) -> None:
        self.alias = alias
        self.calls = calls
        self.wake = wake  # set when a tick enqueued jobs, or an instant came
        self.stopping = stopping
        self.due = threading.Event()  # a scheduled instant came: the dispatcher ticks
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Tick once, in the calling thread; then keep time for the next instants, if there are schedules."""
        if self.tick():
            self.thread = threading.Thread(target=self._keep_time, name="vellum-scheduler", daemon=True)
            self.thread.start()

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def tick(self) -> bool:
        """Enqueue the schedules' due instants (a missed one included); False when there are no schedules.

        Runs once before the first claim, so a ``--burst`` worker catches up too.
        """
        if not schedules.declared():
            return False
        try:
            with self.calls.waiting("schedule tick"):
                ticked = schedules.tick(self.alias)
            if ticked:
                self.wake.set()
        except Exception as exc:  # a schedule must never stop the worker; the next instant tries again
            if isinstance(exc, transient_errors.TRANSIENT):  # a locked or lost database: no bug to show
                logger.warning("schedule tick failed, trying again at the next instant error=%r", exc)
            else:
                logger.exception("schedule tick failed, trying again at the next instant")
            transient_errors.reset_connection(self.alias)
        return True

    def tick_if_due(self) -> None:
        """Tick, in the dispatcher's thread, if an instant came since the last tick."""
        if self.due.is_set():
            self.due.clear()
            self.tick()

    def _keep_time(self) -> None:
        """Have the dispatcher tick at each scheduled instant, until shutdown starts."""
        while True:
            wait = schedules.seconds_until_next()
            if wait is None or self.stopping.wait(wait):
                return
            self.due.set()
            self.wake.set()
