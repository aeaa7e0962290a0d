"""Leases on running jobs: renewing our own, and requeueing those whose worker died.

A claim leases a job until ``lease_expires_at``; the owning process renews
the lease on every heartbeat. Only a lapsed lease makes a job recoverable,
so starting, stopping or restarting other processes never touches a job a
live worker holds.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta

from django.db import connections
from django.utils import timezone

from vellum_jobs.fence import renew_leases
from vellum_jobs.models import Job, Worker

logger = logging.getLogger("vellum_jobs")

# Rows of workers gone this long are deleted; until then the admin and
# jobstats show them as stale, which is how a crash gets noticed.
FORGET_WORKERS_AFTER = timedelta(hours=1)


def renew(alias: str, worker_id: uuid.UUID, job_ids: Collection[int], until: datetime) -> int:
    """Extend the leases this worker still holds on ``job_ids``; returns how many it renewed.

    Fewer than asked is normal (a job can finish between the snapshot of held
    ids and this write); a lease that was really lost shows when the fence
    discards that job's outcome.
    """
    if not job_ids:
        return 0
    return renew_leases(connections[alias], worker_id, sorted(job_ids), until)


def recover_expired(alias: str, now: datetime) -> list[tuple[int, str]]:
    """Requeue (or fail, when out of attempts) running jobs whose lease lapsed before ``now``.

    Returns (job id, new state) pairs. Each write re-checks the lapsed lease,
    so a job that finished or was renewed in the meantime is left alone.
    """
    expired = list(
        Job.objects.using(alias)
        .filter(state=Job.State.RUNNING, lease_expires_at__lt=now)
        .values_list("pk", "worker_id", "attempts", "max_attempts", "cancel_requested_at")
    )
    if not expired:
        return []
    workers = {w.pk: str(w) for w in Worker.objects.using(alias).filter(pk__in={e[1] for e in expired})}
    recovered = []
    for pk, worker_id, attempts, max_attempts, cancel_requested_at in expired:
        owner = workers.get(worker_id, "a process that is gone") if worker_id else "unknown"
        error = (
            f"worker lost: its lease expired during attempt {attempts} of {max_attempts} "
            f"(worker {owner}, id {worker_id}); the process died or stalled"
        )
        fence = Job.objects.using(alias).filter(
            pk=pk, state=Job.State.RUNNING, worker_id=worker_id, attempts=attempts, lease_expires_at__lt=now
        )
        if cancel_requested_at is not None:
            error += "; its cancellation had been requested, so it is not retried"
            changes = {"state": Job.State.CANCELLED, "finished_at": now}
        elif attempts < max_attempts:
            changes = {"state": Job.State.QUEUED, "run_after": now, "worker_id": None}
        else:
            changes = {"state": Job.State.FAILED, "finished_at": now}
        if fence.update(lease_expires_at=None, error=error, **changes):
            logger.warning(
                "recovered job from lost worker job_id=%s worker_id=%s state=%s",
                pk,
                worker_id,
                changes["state"],
            )
            recovered.append((pk, str(changes["state"])))
    return recovered


def hand_back(alias: str, worker_id: uuid.UUID, jobs: Sequence[Job], reason: str) -> int:
    """Return jobs this worker still holds to the queue, due now, refunding the attempt."""
    from django.db.models import F

    handed = 0
    for job in jobs:
        held = Job.objects.using(alias).filter(
            pk=job.pk, state=Job.State.RUNNING, worker_id=worker_id, attempts=job.attempts
        )
        handed += held.filter(cancel_requested_at=None).update(
            state=Job.State.QUEUED,
            worker_id=None,
            lease_expires_at=None,
            run_after=timezone.now(),
            attempts=F("attempts") - 1,
            error=reason,
        )
        # A job someone asked to stop is not handed to another worker to run again.
        handed += held.exclude(cancel_requested_at=None).update(
            state=Job.State.CANCELLED,
            lease_expires_at=None,
            finished_at=timezone.now(),
            error=f"{reason}; its cancellation had been requested, so it is not run again",
        )
    return handed


def register_worker(alias: str, worker: Worker) -> None:
    worker.save(using=alias, force_insert=True)


def beat(alias: str, worker: Worker, now: datetime) -> None:
    """Record that ``worker`` is alive (recreating its row if something deleted it)."""
    worker.last_heartbeat = now
    if not Worker.objects.using(alias).filter(pk=worker.pk).update(last_heartbeat=now, stuck=worker.stuck):
        worker.save(using=alias, force_insert=True)
    Worker.objects.using(alias).filter(last_heartbeat__lt=now - FORGET_WORKERS_AFTER).delete()


def unregister_worker(alias: str, worker_id: uuid.UUID) -> None:
    Worker.objects.using(alias).filter(pk=worker_id).delete()


def hostname() -> str:
    return socket.gethostname()
