"""Claims and leases by hand, on the test's connection: claim for a worker id, recover the
leases nobody renews, and a clock the test moves."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.utils import timezone

from vellum_jobs.conf import conf
from vellum_jobs.maintenance import recovery
from vellum_jobs.store.claim import ClaimRequest, claim


def claim_for(
    worker_id, limit: int = 10, queues=(), now=None, limits: bool = True, names=None, task_backends=None
):
    """Claim due jobs for ``worker_id`` on the test's connection: of ``names`` and Django tasks of
    ``task_backends`` (by default, those of this process)."""
    now = now or timezone.now()
    request = ClaimRequest(
        worker_id=worker_id,
        limit=limit,
        now=now,
        lease_until=now + timedelta(seconds=conf.lease),
        queues=queues,
        limits=limits,
        names=names,
        task_backends=task_backends,
    )
    return claim(connection, request)


class ManualClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.at = 0.0

    def __call__(self) -> float:
        return self.at


def recover_lapsed(alias: str = "default", now=None):
    """Recover the leases nobody renews, as a heartbeat would once it had watched them for a lease."""
    watched = ManualClock()
    watch = recovery.LapseWatch(clock=watched)
    now = now or timezone.now()
    early = recovery.recover_expired(alias, now, watch)
    assert early == [], "nothing lapses before it was watched for a lease"
    watched.at += conf.lease
    return recovery.recover_expired(alias, now, watch)


def beat_past_a_lease(beating) -> None:
    """Two beats of a ``Heartbeat`` a lease apart by its watch's clock: it recovers what nobody renewed."""
    watched = ManualClock()
    beating.duties.lapses = recovery.LapseWatch(clock=watched)
    beating.beat(timezone.now())
    watched.at += conf.lease
    beating.beat(timezone.now())
