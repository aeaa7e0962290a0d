"""Putting a claimed job back in the queue when it has a unique key: in a savepoint, or superseded.

Every queued job with a key holds it (the ``vellum_job_unique_queued``
index), however it came back to the queue. A job running under
``unique_while="queued"`` holds no key, so a newer job with that key may be
enqueued meanwhile; should the running job then go back to the queue (a
retry, a shutdown's hand-back, a recovery, an unclaim), the index refuses
the write. The database decides, not Python: the write of a job with a key
runs in a savepoint, and when the index refuses it, the job ends
``cancelled`` instead, naming the job that waits with the key and runs in
its place (``transitions.superseded``), with the same fence. The savepoint
also keeps the rest of the transaction (a batch of outcomes) alive, which
PostgreSQL would abort at the failed statement. A job without a key is
written as before: not one statement more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import IntegrityError, connections

from vellum_jobs.core import clock, transitions
from vellum_jobs.core.models import HOLDS_KEY, Job
from vellum_jobs.core.transitions import Write
from vellum_jobs.store import fence, transactions

logger = logging.getLogger("vellum_jobs")

# Writes tried before giving up; each retry means the job that waited with
# the key started between the refused write and the look for it.
ATTEMPTS = 5
SAVEPOINT = "vellum_put_back"


def if_held(job: Job, token: int, write: Write) -> Write | None:
    """``fence.update_if_held`` of ``write``, which may put ``job`` back in the queue: the write that
    applied (``write``, or the job superseded), or None if the claim no longer holds the job."""

    def update(applied: Write) -> bool:
        return fence.update_if_held(job, token, applied.changes, applied.nulls)

    return apply(job._state.db or "default", job.pk, job.unique_key, write, update)


def may_collide(key: str | None, write: Write) -> bool:
    """Whether the unique index may refuse ``write``: it puts a job with a key back in the queue."""
    return key is not None and write.requeues


def apply(
    alias: str, pk: int, key: str | None, write: Write, update: Callable[[Write], bool]
) -> Write | None:
    """``update(write)`` of job ``pk``; or, when the index refuses ``write`` because another job
    waits with ``key``, ``update`` of the job superseded. The write that applied, or None."""
    if key is None or not may_collide(key, write):
        return write if update(write) else None
    for attempt in range(ATTEMPTS):
        try:
            with transactions.savepoint(connections[alias], SAVEPOINT):
                return write if update(write) else None
        except IntegrityError:
            holder = _waiting(alias, key)
            if holder is not None:
                return _supersede(pk, holder, key, write, update)
            if attempt == ATTEMPTS - 1:
                raise
            # The job that held the key started meanwhile: it is free again.
    raise AssertionError("unreachable")  # pragma: no cover


def _supersede(pk: int, holder: int, key: str, write: Write, update: Callable[[Write], bool]) -> Write | None:
    instead = transitions.superseded(write.changes, holder, key, clock.now())
    if not update(instead):
        return None
    logger.info(
        "job #%s superseded by job #%s, which waits with its unique key; it ends cancelled "
        "job_id=%s by=%s key=%s",
        pk,
        holder,
        pk,
        holder,
        key,
    )
    return instead


def _waiting(alias: str, key: str) -> int | None:
    """The job that waits with ``key``, if one does."""
    rows = Job.objects.using(alias).filter(HOLDS_KEY, unique_key=key).order_by("pk")
    return rows.values_list("pk", flat=True).first()
