"""Leases on running jobs: renewing our own, and requeueing those whose worker died.

A claim leases a job until ``lease_expires_at``; the owning process renews
the lease on every heartbeat. Only a lapsed lease makes a job recoverable,
so starting, stopping or restarting other processes never touches a job a
live worker holds.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Sequence
from datetime import datetime

from django.db import connections
from django.utils import timezone

from vellum_jobs import fence, history, rollup, transitions
from vellum_jobs.attempts import Attempt
from vellum_jobs.models import Job, Worker

logger = logging.getLogger("vellum_jobs")


def renew(alias: str, worker_id: uuid.UUID, job_ids: Collection[int], until: datetime) -> int:
    """Extend the leases this worker still holds on ``job_ids``; returns how many it renewed.

    Fewer than asked is normal (a job can finish between the snapshot of held
    ids and this write); a lease that was really lost shows when the fence
    discards that job's outcome.
    """
    if not job_ids:
        return 0
    return fence.renew_leases(connections[alias], worker_id, sorted(job_ids), until)


def recover_expired(alias: str, now: datetime) -> list[tuple[int, str]]:
    """Requeue (or fail, when out of attempts) running jobs whose lease lapsed before ``now``.

    Returns (job id, new state) pairs. Each write is fenced on the token it
    read and re-checks the lapsed lease, so a job that finished, was
    renewed or was claimed again in the meantime is left alone.
    """
    expired = list(
        Job.objects.using(alias)
        .filter(transitions.lapsed(now))
        .values_list(
            "pk",
            "claims",
            "worker_id",
            "attempts",
            "max_attempts",
            "cancel_requested_at",
            "started_at",
            "queue",
        )
    )
    if not expired:
        return []
    workers = {w.pk: str(w) for w in Worker.objects.using(alias).filter(pk__in={e[2] for e in expired})}
    recovered = []
    for pk, token, worker_id, attempts, max_attempts, cancel_requested_at, started_at, queue in expired:
        owner = workers.get(worker_id, "a process that is gone") if worker_id else "unknown"
        error = (
            f"worker lost: its lease expired during attempt {attempts} of {max_attempts} "
            f"(worker {owner}, id {worker_id}); the process died or stalled"
        )
        if cancel_requested_at is not None:
            error += "; its cancellation had been requested, so it is not retried"
        entry = history.entry(
            attempt=attempts,
            outcome=history.LOST,
            error=error,
            worker_id=worker_id,
            worker=workers.get(worker_id, "") if worker_id else "",
            started_at=started_at,
            ended_at=now,
        )
        changes = transitions.recovered(
            now,
            error,
            out_of_attempts=attempts >= max_attempts,
            cancel_requested=cancel_requested_at is not None,
            entry=entry,
        )
        rows = Job.objects.using(alias).filter(transitions.held(pk, token) & transitions.lapsed(now))
        if rows.update(**transitions.orm(changes)):
            logger.warning(
                "recovered job from lost worker job_id=%s worker_id=%s state=%s",
                pk,
                worker_id,
                changes["state"],
            )
            recovered.append((pk, str(changes["state"])))
            rollup.count(now, queue, rollup.LOST)
    return recovered


def hand_back(
    alias: str, attempts: Sequence[Attempt], reason: str, due: Callable[[Attempt], datetime] | None = None
) -> int:
    """Return jobs these attempts still hold to the queue, due now or at ``due(attempt)``, refunding
    the attempt.

    A job someone asked to stop is cancelled instead: it is not handed to
    another worker to run again.
    """
    handed = 0
    now = timezone.now()
    for attempt in sorted(attempts, key=lambda attempt: attempt.job.pk):
        entry = attempt.history_entry(history.HANDED_BACK, reason, attempt.job.started_at, now)
        run_after = now if due is None else due(attempt)
        for cancel_requested in (False, True):
            write = transitions.handed_back(
                now, reason, cancel_requested=cancel_requested, entry=entry, due=run_after
            )
            if fence.update_if_held(attempt.job, attempt.token, write.changes, write.nulls):
                handed += 1
                break
    return handed
