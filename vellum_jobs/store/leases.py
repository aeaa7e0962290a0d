"""Leases on running jobs: the ones this worker renews, and hands back at shutdown.

A claim leases a job until ``lease_expires_at``; the owning process renews
the lease on every heartbeat. Only a lapsed lease makes a job recoverable
(``maintenance.recovery`` requeues it), so starting, stopping or restarting
other processes never touches a job a live worker holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from datetime import datetime

from django.db import connections

from vellum_jobs.core import clock, history, transitions
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.store import fence, putback


def renew(alias: str, worker_id: uuid.UUID, job_ids: Collection[int], until: datetime) -> int:
    """Extend the leases this worker still holds on ``job_ids``; returns how many it renewed.

    Fewer than asked is normal (a job can finish between the snapshot of held
    ids and this write); a lease that was really lost shows when the fence
    discards that job's outcome.
    """
    if not job_ids:
        return 0
    return fence.renew_leases(connections[alias], worker_id, sorted(job_ids), until)


def hand_back(
    alias: str, attempts: Sequence[Attempt], reason: str, due: Callable[[Attempt], datetime] | None = None
) -> int:
    """Return jobs these attempts still hold to the queue, due now or at ``due(attempt)``, refunding
    the attempt.

    A job someone asked to stop is cancelled instead: it is not handed to
    another worker to run again.
    """
    handed = 0
    now = clock.now()
    for attempt in sorted(attempts, key=lambda attempt: attempt.job.pk):
        entry = attempt.history_entry(history.HANDED_BACK, reason, attempt.job.started_at, now)
        run_after = now if due is None else due(attempt)
        for cancel_requested in (False, True):
            write = transitions.handed_back(
                now, reason, cancel_requested=cancel_requested, entry=entry, due=run_after
            )
            if putback.if_held(attempt.job, attempt.token, write) is not None:
                handed += 1
                break
    return handed
