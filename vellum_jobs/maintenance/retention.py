"""Deleting finished jobs past their age: what ``prunejobs`` and automatic retention do.

Rows go in small batches by primary key, each batch its own short
transaction, so another writer (a web request, a worker recording an
outcome; on SQLite the only writer at a time) waits for one batch at most.
Queued and running jobs are never candidates, and a job retried after its
batch was picked is not deleted. Jobs of a workflow or batch are not
candidates either: they go together, with their edges and the workflow's row
(``workflow_pruning``), after the jobs of no workflow. Django's delete keeps the state and age
filter in its DELETE only when it need not load the rows; with a delete
receiver for Job, or a model that references it, it SELECTs them and
DELETEs by id alone. So the batch's transaction first locks its rows that
still match (``SELECT ... FOR UPDATE`` on PostgreSQL and MariaDB/MySQL,
which check the filter against each row's latest version), and a retry
waits for the batch and finds its job gone. SQLite has no row locks: the
batch's transaction holds the database's write lock from its ``BEGIN
IMMEDIATE`` (the setting system check W001 asks for); in a deferred
transaction a write committed in between makes the DELETE fail with
"database is locked", and the batch is tried again.

Automatic retention runs on the heartbeat of every ``runjobs`` process, and
a maintenance lock in the database lets one of them at a time prune. The
lock is held like a job's lease (renewed each beat, lost with the process
after ``LEASE``), and after a complete run it rests for ``INTERVAL``, so all
the processes together prune once per interval. A heartbeat prunes for a
slice of its period at most, then carries on renewing leases; a backlog is
worked off over several beats.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, connections, router

from vellum_jobs.conf import RETENTION_STATES, conf
from vellum_jobs.core import transitions
from vellum_jobs.core.models import Job, JobQuerySet
from vellum_jobs.maintenance import workflow_pruning
from vellum_jobs.store import lock_waits, locks, transient_errors

logger = logging.getLogger("vellum_jobs")

# Rows per DELETE: short enough that no writer waits long for the lock, and
# far below SQLite's limit on parameters in one statement.
BATCH_SIZE = 500

# The maintenance lock's name, and how long it rests after a complete run:
# retention runs once per INTERVAL, whichever process gets to it.
LOCK = "retention"
INTERVAL = timedelta(minutes=5)

# A heartbeat prunes for at most this share of HEARTBEAT (and at most
# MAX_SLICE seconds); HEARTBEAT is at most half of LEASE, so leases are
# still renewed well before they lapse.
SLICE_SHARE = 0.5
MAX_SLICE = 5.0


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
    """Delete jobs in each state of ``cutoffs`` that finished before its cutoff; a workflow's jobs
    together, once all have ended and the newest end is older than each of their states' cutoffs.

    Once ``deadline`` (a ``time.monotonic()`` value) has passed it stops after
    the batch at hand, leaving the rest for the next call; each call makes
    progress however short the time. A dry run counts instead of deleting.
    """
    for state in cutoffs:
        if state not in RETENTION_STATES:
            raise ValueError(f"{state!r} jobs cannot be pruned; only {', '.join(RETENTION_STATES)}")
    pruned = Pruned(counts=dict.fromkeys(cutoffs, 0))
    # Found and deleted on the database the deletes go to.
    alias = alias or router.db_for_write(Job) or DEFAULT_DB_ALIAS
    for state, cutoff in cutoffs.items():
        rows = expired(alias, state, cutoff)
        if dry_run:
            pruned.counts[state] = rows.count()
            continue
        more = True
        while more:
            deleted, more = _delete_batch(rows, batch_size or BATCH_SIZE)
            pruned.counts[state] += deleted
            if more and deadline is not None and time.monotonic() >= deadline:
                pruned.complete = False
                return pruned
    pruned.complete = workflow_pruning.prune(
        alias, cutoffs, pruned.counts, dry_run=dry_run, batch_size=batch_size or BATCH_SIZE, deadline=deadline
    )
    return pruned


def expired(alias: str | None, state: str, cutoff: datetime) -> JobQuerySet:
    """Jobs of no workflow in ``state`` that finished before ``cutoff`` (served by the
    ``vellum_job_finished`` index). A workflow's jobs go together (``workflow_pruning``)."""
    return Job.objects.using(alias).filter(transitions.prunable(state, cutoff), workflow__isnull=True)


def _delete_batch(rows: JobQuerySet, batch_size: int) -> tuple[int, bool]:
    """Delete the oldest ``batch_size`` of ``rows``; returns (deleted, whether more are left)."""
    # One id more than the batch tells whether another batch is needed.
    ids = list(rows.order_by("finished_at").values_list("pk", flat=True)[: batch_size + 1])
    if not ids:
        return 0, False
    # finished(): whatever ``rows`` asks, never a queued or running job.
    batch = rows.filter(pk__in=ids[:batch_size]).finished()
    deleted = lock_waits.short_transaction(
        batch.db, lambda: _delete_still_matching(batch), what="prune batch"
    )
    return deleted, len(ids) > batch_size


def _delete_still_matching(batch: JobQuerySet) -> int:
    """Delete the jobs of ``batch`` that still match its filter, in the caller's transaction.

    ``QuerySet.delete()`` still sends delete signals and cascades to rows
    that reference a job, as Django users expect; it sends them for the
    deleted jobs only.
    """
    if connections[batch.db].features.has_select_for_update:
        # Locked in id order, so two prunes never wait on each other in a cycle.
        locked = list(batch.select_for_update().order_by("pk").values_list("pk", flat=True))
        batch = batch.filter(pk__in=locked)
    _, by_model = batch.delete()
    return by_model.get(Job._meta.label, 0)


@dataclasses.dataclass
class _Turn:
    """One process's place in the retention schedule."""

    next_try: datetime | None = None
    holding: bool = False  # it holds the lock with a backlog left


_turns: dict[tuple[str, str], _Turn] = {}


def run_if_due(alias: str, holder: uuid.UUID | str, now: datetime) -> Pruned | None:
    """Apply ``RETENTION`` if it is this process's turn; what it pruned, or None if it did not run.

    Called on every heartbeat. Never raises: a failure is logged and tried again after a lease.
    """
    turn = _turns.setdefault((alias, str(holder)), _Turn())
    try:
        return _run_if_due(alias, str(holder), now, turn)
    except Exception as exc:  # noqa: BLE001 - retention must never stop the heartbeat that calls it
        transient_errors.log_failure("retention failed; trying again next beat holder=%s", exc, holder)
        transient_errors.reset_connection(alias)
        turn.holding = False
        turn.next_try = now + timedelta(seconds=conf.lease)
        return None


def _run_if_due(alias: str, holder: str, now: datetime, turn: _Turn) -> Pruned | None:
    ages = conf.retention
    if not ages or (turn.next_try is not None and now < turn.next_try):
        return None
    hold = now + timedelta(seconds=conf.lease)
    if not _take_lock(alias, holder, now, hold, turn):
        turn.holding = False
        free = locks.free_at(alias, LOCK)
        # Ask again when the holder's hold or rest ends (it may renew it).
        turn.next_try = free if free is not None and free > now else hold
        logger.debug(
            "retention skipped: another process holds its lock holder=%s lock_free_at=%s", holder, free
        )
        return None
    cutoffs = {state: now - timedelta(seconds=age) for state, age in ages.items()}
    slice_ = min(conf.heartbeat * SLICE_SHARE, MAX_SLICE)
    pruned = prune(alias, cutoffs, deadline=time.monotonic() + slice_)
    if pruned.complete:
        locks.release(alias, LOCK, holder, until=now + INTERVAL)
        turn.holding, turn.next_try = False, now + INTERVAL
    else:
        turn.holding, turn.next_try = True, None
    log = logger.info if pruned.total else logger.debug
    log(
        "retention pruned %d finished jobs holder=%s deleted=%d %s complete=%s",
        pruned.total,
        holder,
        pruned.total,
        " ".join(f"{state}={n}" for state, n in pruned.counts.items()),
        pruned.complete,
    )
    return pruned


def let_go(alias: str, holder: uuid.UUID | str, now: datetime) -> None:
    """At shutdown: free the lock at once if ``holder`` holds it with a backlog left.

    Otherwise the backlog would wait a lease for another process to take the
    lock over. A lock that rests after a complete run keeps resting. Never raises.
    """
    turn = _turns.pop((alias, str(holder)), None)
    if turn is None or not turn.holding:
        return
    try:
        locks.release(alias, LOCK, str(holder), until=now)
    except Exception as exc:  # noqa: BLE001 - the lock then lapses with its lease
        logger.warning(
            "retention lock not released; another process takes it once its lease lapses error=%r", exc
        )


def _take_lock(alias: str, holder: str, now: datetime, until: datetime, turn: _Turn) -> bool:
    # Mid-backlog the lock is already ours; a lapsed one may still be free.
    if turn.holding and locks.renew(alias, LOCK, holder, now, until):
        return True
    return locks.acquire(alias, LOCK, holder, now, until)
