"""Deleting finished jobs past their age: what ``prunejobs`` and automatic retention do.

Rows go in small batches by primary key, each batch its own short
transaction, so another writer (a web request, a worker recording an
outcome; on SQLite the only writer at a time) waits for one batch at most.
Each DELETE repeats the state and age filter of the SELECT that found the
ids, so a job retried in between is not deleted. Queued and running jobs are
never candidates.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from datetime import datetime

from vellum_jobs.conf import RETENTION_STATES
from vellum_jobs.models import Job, JobQuerySet

# Rows per DELETE: short enough that no writer waits long for the lock, and
# far below SQLite's limit on parameters in one statement.
BATCH_SIZE = 500


@dataclasses.dataclass
class Pruned:
    """How many jobs were deleted (or would be, in a dry run), by state."""

    counts: dict[str, int]
    complete: bool = True  # False when the deadline stopped it with rows left

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def prune(
    alias: str | None,
    cutoffs: Mapping[str, datetime],
    *,
    dry_run: bool = False,
    batch_size: int | None = None,
    deadline: float | None = None,
) -> Pruned:
    """Delete jobs in each state of ``cutoffs`` that finished before its cutoff.

    ``deadline`` (a ``time.monotonic()`` value) stops between batches, leaving
    the rest for the next call. A dry run counts instead of deleting.
    """
    for state in cutoffs:
        if state not in RETENTION_STATES:
            raise ValueError(f"{state!r} jobs cannot be pruned; only {', '.join(RETENTION_STATES)}")
    pruned = Pruned(counts=dict.fromkeys(cutoffs, 0))
    for state, cutoff in cutoffs.items():
        rows = expired(alias, state, cutoff)
        if dry_run:
            pruned.counts[state] = rows.count()
            continue
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                pruned.complete = False
                return pruned
            deleted, more = _delete_batch(rows, batch_size or BATCH_SIZE)
            pruned.counts[state] += deleted
            if not more:
                break
    return pruned


def expired(alias: str | None, state: str, cutoff: datetime) -> JobQuerySet:
    """Jobs in ``state`` that finished before ``cutoff`` (served by the ``vellum_job_finished`` index)."""
    return Job.objects.using(alias).filter(state=state, finished_at__lt=cutoff)


def _delete_batch(rows: JobQuerySet, batch_size: int) -> tuple[int, bool]:
    """Delete the oldest ``batch_size`` of ``rows``; returns (deleted, whether more may be left)."""
    ids = list(rows.order_by("finished_at").values_list("pk", flat=True)[:batch_size])
    if not ids:
        return 0, False
    # QuerySet.delete() is one transaction; it still sends delete signals
    # and cascades to rows that reference a job, as Django users expect.
    _, by_model = rows.filter(pk__in=ids).delete()
    return by_model.get(Job._meta.label, 0), len(ids) == batch_size
