"""Handing back, at shutdown, the jobs whose handlers outlived the grace period.

A job handed back while its handler may still run in this process (a
thread, which nothing can stop, or a task on a blocked loop) is due only
``RELEASE_MARGIN`` after: ``runjobs`` exits as soon as it has written it,
so no other worker starts the job while this one's handler can still run.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from vellum_jobs.core import clock
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.store import leases, transient_errors
from vellum_jobs.worker.silence import Calls

logger = logging.getLogger("vellum_jobs")

RELEASE_MARGIN = 2.0


def hand_back(alias: str, unfinished: list[Attempt], grace: float, calls: Calls) -> None:
    """Release the jobs of ``unfinished``: due now if their handler has come back (a coroutine
    cancelled at shutdown), ``RELEASE_MARGIN`` from now if it may still run (a thread, or a task
    on a blocked loop), which is after this process has exited."""
    reason = f"handed back at shutdown: still running after the {grace:g}s grace period"
    now = clock.now()
    later = now + timedelta(seconds=RELEASE_MARGIN)
    try:
        handed = transient_errors.retry(
            calls.timed(
                "hand back jobs",
                lambda: leases.hand_back(
                    alias, unfinished, reason, due=lambda attempt: now if attempt.returned else later
                ),
            ),
            what="hand back jobs",
            alias=alias,
            give_up_after=10,
        )
    except Exception as exc:  # noqa: BLE001 - the leases bring the jobs back
        logger.error(
            "jobs not handed back at shutdown; recovery queues them again once their leases lapse error=%r",
            exc,
        )
        handed = 0
    ids = [attempt.job.pk for attempt in unfinished]
    logger.warning("%d jobs handed back at shutdown, due now count=%d ids=%s", handed, handed, ids)
