"""The watchdog of job timeouts: which running attempts are past their deadline, and which slots are stuck.

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

from vellum_jobs.core.attempts import Attempt
from vellum_jobs.execution import retry_policy
from vellum_jobs.execution.outcome import Outcome

logger = logging.getLogger("vellum_jobs")

# A coroutine job is cancelled at its deadline by its event loop, which
# records it timed out. The watchdog steps in this much later, for a loop
# held up by a blocking call, so that the two do not race for the outcome.
LOOP_BACKSTOP = 1.0


def _expires_at(attempt: Attempt) -> float | None:
    """When the watchdog times the attempt out (monotonic), or None without a timeout."""
    if attempt.deadline is None:
        return None
    return attempt.deadline + LOOP_BACKSTOP if attempt.on_loop else attempt.deadline


class Watchdog:
    """Times out attempts, each on its own deadline (two attempts of one job may be running)."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.timed_out: set[Attempt] = set()  # recorded as timed out, handler not back yet
        self.reported: set[Attempt] = set()

    def expire(self, running: Iterable[Attempt], now: float) -> list[tuple[Attempt, Outcome]]:
        """Timed-out outcomes for running attempts past their deadline (``now`` is ``time.monotonic()``)."""
        expired = []
        for attempt in running:
            expires_at = _expires_at(attempt)
            if expires_at is None or now < expires_at or attempt in self.timed_out:
                continue
            attempt.stop.set()
            self.timed_out.add(attempt)
            job = attempt.job
            logger.warning(
                "%s #%s timed out after %gs; its handler is asked to stop job_id=%s name=%s timeout=%gs",
                job.name,
                job.pk,
                job.timeout,
                job.pk,
                job.name,
                job.timeout,
            )
            expired.append((attempt, retry_policy.timed_out(job)))
        return expired

    def returned(self, attempt: Attempt) -> bool:
        """Note that the attempt's handler came back; True if it had already timed out."""
        self.reported.discard(attempt)
        if attempt in self.timed_out:
            self.timed_out.discard(attempt)
            return True
        return False

    def stuck(self, now: float) -> list[Attempt]:
        """Timed-out attempts whose handlers are still running past the grace period; logs new ones."""
        stuck = [a for a in self.timed_out if a.deadline is not None and now >= a.deadline + self.grace]
        for attempt in stuck:
            if attempt not in self.reported:
                self.reported.add(attempt)
                job = attempt.job
                logger.error(
                    "%s #%s: slot stuck, its handler still running past its timeout and the grace period "
                    "job_id=%s name=%s timeout=%gs grace=%gs",
                    job.name,
                    job.pk,
                    job.pk,
                    job.name,
                    job.timeout,
                    self.grace,
                )
        return stuck

    def next_deadline(self, running: Iterable[Attempt]) -> float | None:
        """The soonest moment (monotonic) something here needs a look."""
        moments = [
            moment for a in running if (moment := _expires_at(a)) is not None and a not in self.timed_out
        ]
        moments += [
            a.deadline + self.grace
            for a in self.timed_out
            if a.deadline is not None and a not in self.reported
        ]
        return min(moments, default=None)
