"""One run of a claimed job in a worker: its fencing token, its deadline, and the flags that ask it to stop.

A worker may hold two attempts of one job at once: a handler that ran past
its timeout keeps its thread until it returns, while the job's retry may be
claimed again by the same process. So everything in the worker (slots,
timeouts, leases, cancellations) keys by attempt, never by job id. The
``Job`` instance a handler sees points at its attempt, which is how
``current_job().should_stop()`` and ``check_timeout()`` answer.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime
from typing import TYPE_CHECKING

from vellum_jobs.core import history
from vellum_jobs.exceptions import JobTimeout

if TYPE_CHECKING:
    from vellum_jobs.core.models import Job


class Flag:
    """A flag threads set and read, never wait on: an ``Event`` without its lock and condition."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


# Why ``should_stop()`` asks a handler to stop (``Job.stop_reason``).
CANCELLED = "cancelled"  # someone cancelled the job
TIMED_OUT = "timed out"  # the attempt ran past its timeout
SHUTTING_DOWN = "shutting down"  # the worker is stopping
LEASE_LOST = "lease lost"  # the worker could not renew its leases: another may run the job


class Attempt:
    """A claim of ``job`` by ``worker_id``, from the claim to its recorded outcome."""

    def __init__(self, job: Job, worker_id: uuid.UUID, shutdown: threading.Event | None = None) -> None:
        self.job = job
        self.worker_id = worker_id
        # The claim counter the claim left on the row: every write of this
        # attempt is fenced on it.
        self.token = job.claims
        self.deadline: float | None = None  # time.monotonic() when it times out; set when it starts
        self.stop = Flag()  # set at the timeout, or when the worker lost its leases
        self.cancel = Flag()  # set when the worker learns of a cancellation request
        self.cancel_seen = False  # should_stop() told the handler about that request
        self.stop_seen: str | None = None  # the last reason should_stop() gave the handler
        self.shutdown = shutdown  # the worker's own stop signal
        self.returned = False  # the handler came back (its outcome may not be recorded yet)
        self.claimed_at = 0.0  # time.monotonic() when the worker took it from its claim
        self.started: float | None = None  # time.monotonic() when a thread or the event loop started it
        self.on_loop = False  # run by the worker's event loop (a coroutine job), not a slot thread
        # What the handler raised, for job_finished's receivers (the Tasks backend logs it).
        self.exception: BaseException | None = None
        job._attempt = self

    def __repr__(self) -> str:
        return f"<Attempt job={self.job.pk} token={self.token}>"

    def recorded(self) -> None:
        """Its outcome is recorded: once its handler came back, the job lets go of this attempt.

        The two refer to each other (``job._attempt``, for ``should_stop()``),
        and a pair left linked waits for Python's cycle collector: during a
        drain thousands of them did, several MiB of a worker's memory. A
        handler still running (it timed out) keeps the link: it learns so
        through ``should_stop()``.
        """
        if self.returned:
            self.job._attempt = None

    def start(self) -> float:
        """Start the clock on the timeout; returns the start (``time.monotonic()``)."""
        self.started = started = time.monotonic()
        self.deadline = started + self.job.timeout if self.job.timeout else None
        return started

    @property
    def time_remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def past_deadline(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def history_entry(
        self, outcome: str, error: str, started_at: datetime | None, ended_at: datetime
    ) -> history.Append:
        """This attempt's entry in its job's history, as the process that ran it writes it."""
        return history.entry(
            attempt=self.job.attempts,
            claim=self.token,
            outcome=outcome,
            error=error,
            worker_id=self.worker_id,
            worker=history.this_process(),
            started_at=started_at,
            ended_at=ended_at,
        )

    def check_timeout(self) -> None:
        if self.past_deadline(time.monotonic()):
            job = self.job
            raise JobTimeout(f"job {job.name!r} #{job.pk} timed out after {job.timeout:g}s")

    def stop_reason(self) -> str | None:
        """Why the handler should stop now (one of the reasons above), or None."""
        if self.cancel.is_set():
            return CANCELLED
        if self.past_deadline(time.monotonic()):
            return TIMED_OUT
        if self.stop.is_set():  # set at the deadline too, which the check above has seen
            return LEASE_LOST
        if self.shutdown is not None and self.shutdown.is_set():
            return SHUTTING_DOWN
        return None

    def should_stop(self) -> bool:
        """Whether the handler should stop; the reason it was given decides what an early return
        becomes (``handler_run.stopped_early``)."""
        reason = self.stop_reason()
        if reason is not None:
            self.stop_seen = reason
            self.cancel_seen = self.cancel_seen or reason == CANCELLED
        return reason is not None
