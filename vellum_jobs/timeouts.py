"""Job timeouts: which running attempts are past their deadline, and which slots are stuck.

A Python thread cannot be killed, so a timeout cannot stop a handler. At the
deadline the worker records the attempt as timed out (retried or failed like
any failed attempt), stops renewing its lease and sets the job's stop flag,
which ``check_timeout()`` and ``should_stop()`` report to handlers that
cooperate. A handler that does not return within the grace period after
its deadline leaves its slot stuck: reported, and past ``--max-stuck`` a
reason for the process to exit so its process manager starts a fresh one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from vellum_jobs import executor
from vellum_jobs.executor import Outcome
from vellum_jobs.models import Job

logger = logging.getLogger("vellum_jobs")


class Watchdog:
    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.timed_out: dict[int, Job] = {}  # recorded as timed out, handler not back yet
        self.reported: set[int] = set()

    def expire(self, running: Iterable[Job], now: float) -> list[tuple[Job, Outcome]]:
        """Timed-out outcomes for running jobs past their deadline (``now`` is ``time.monotonic()``)."""
        expired = []
        for job in running:
            if job._deadline is None or now < job._deadline or job.pk in self.timed_out:
                continue
            if job._stop is not None:
                job._stop.set()
            self.timed_out[job.pk] = job
            logger.warning("job timed out job_id=%s name=%s timeout=%gs", job.pk, job.name, job.timeout)
            expired.append((job, executor.timed_out(job)))
        return expired

    def returned(self, job: Job) -> bool:
        """Note that ``job``'s handler came back; True if its attempt had already timed out."""
        self.reported.discard(job.pk)
        return self.timed_out.pop(job.pk, None) is not None

    def stuck(self, now: float) -> list[Job]:
        """Timed-out jobs whose handlers are still running past the grace period; logs new ones."""
        stuck = [
            job
            for job in self.timed_out.values()
            if job._deadline is not None and now >= job._deadline + self.grace
        ]
        for job in stuck:
            if job.pk not in self.reported:
                self.reported.add(job.pk)
                logger.error(
                    "slot stuck: handler still running past its timeout and the grace period "
                    "job_id=%s name=%s timeout=%gs grace=%gs",
                    job.pk,
                    job.name,
                    job.timeout,
                    self.grace,
                )
        return stuck

    def next_deadline(self, running: Iterable[Job]) -> float | None:
        """The soonest moment (monotonic) something here needs a look."""
        moments = [j._deadline for j in running if j._deadline is not None and j.pk not in self.timed_out]
        moments += [
            j._deadline + self.grace
            for j in self.timed_out.values()
            if j._deadline is not None and j.pk not in self.reported
        ]
        return min(moments, default=None)
