"""Failing the jobs whose name no live worker has known for ``UNKNOWN_NAME_TIMEOUT``: a heartbeat duty.

A worker claims only jobs whose name it knows (``claim``), so in a rolling
deploy a new kind of job, enqueued by new code before any worker runs that
code, waits for a worker that has it instead of failing. It must not wait
forever for a name no worker will know again (a job kind removed while jobs
of it were queued), so this duty fails such jobs, with "no handler
registered" and why, once no live worker has known their name for
``UNKNOWN_NAME_TIMEOUT``.

The trick is the clock it counts on. A check (once per ``INTERVAL``, by
whichever worker takes the maintenance lock at its heartbeat) finds the
names of queued jobs that no live worker knows, and adds the time since the
previous check to each name's count in its ``UnknownName`` row. Checks run
only on a live worker's heartbeat, so time counts only while some worker is
alive to see it; and a gap between two checks counts as ``max_gap()`` at
most, so a fleet that was down for hours and comes back with old code does
not find every new job past its time and fail them all at once. A name's
row goes as soon as a live worker knows the name, or a check finds no job of
it queued: its count then starts again from zero.

A worker knows a ``@job`` name that its registry has (``Worker.names``), and
a Django task of a ``TASKS`` alias it runs whose module path it has not
found unimportable (``Worker.knows``). The cost: a check reads the distinct
names of the queued jobs, a scan of the queued rows, once a minute by one
process.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Collection
from datetime import datetime, timedelta

from django.db.models import QuerySet

from vellum_jobs.conf import conf, describe_duration
from vellum_jobs.core import history, transitions
from vellum_jobs.core.models import Job, UnknownName, Worker
from vellum_jobs.execution import job_signals
from vellum_jobs.store import lock_waits, locks, rollup, transient_errors

logger = logging.getLogger("vellum_jobs")

# The maintenance lock's name, and how often the names are checked: a job is
# failed at most this long after its name's time ran out.
LOCK = "unknown_names"
INTERVAL = timedelta(minutes=1)

# Jobs failed per UPDATE; a check fails them for this many seconds at most
# (a backlog is worked off over several checks), so the heartbeat that runs
# it still renews the leases in time.
BATCH_SIZE = 500
MAX_SLICE = 5.0

_turns = locks.Turns(LOCK, INTERVAL)


def max_gap() -> float:
    """The most seconds one gap between two checks counts.

    Checks come one ``INTERVAL`` apart, later when the process whose turn
    it was died or its beat was slow (by up to a lease): such a gap counts
    in full. A longer one means no worker was alive to check, and counts no
    more than this.
    """
    return 2 * INTERVAL.total_seconds() + conf.lease


def run_if_due(alias: str, holder: uuid.UUID | str, now: datetime) -> list[int] | None:
    """Check the names if it is this process's turn; the ids of the jobs failed, or None if it did not check.

    Called on every heartbeat. Never raises: a failure is logged and the
    check tried again after an interval.
    """
    try:
        return check(alias, now) if _turns.take(alias, holder, now) else None
    except Exception as exc:  # noqa: BLE001 - the duty must never stop the heartbeat that runs it
        transient_errors.log_failure(
            "unknown-name check failed; trying again next beat holder=%s", exc, holder
        )
        transient_errors.reset_connection(alias)
        return None


def check(alias: str, now: datetime) -> list[int]:
    """Count the time since the last check for each name of a queued job that no live worker knows,
    and fail the due jobs of the names past ``UNKNOWN_NAME_TIMEOUT``; the ids of the jobs failed.

    Counts nothing while no worker is alive (a check outside a heartbeat).
    """
    live = live_workers(alias, now)
    if not live:
        return []
    with lock_waits.bounded(alias):
        counted = _count(alias, unknown(alias, live), now)
    timeout = conf.unknown_name_timeout
    deadline = time.monotonic() + min(conf.heartbeat / 2, MAX_SLICE)
    failed: list[int] = []
    for row in counted:
        if row.unknown_for >= timeout and time.monotonic() < deadline:
            failed += _fail(alias, row, now, deadline)
    job_signals.report_ended(alias, [(pk, transitions.FAILED) for pk in failed])
    return failed


def live_workers(alias: str, now: datetime) -> list[Worker]:
    """The workers alive at ``now`` (a heartbeat within a lease), with what they know."""
    since = now - timedelta(seconds=conf.lease)
    rows = Worker.objects.using(alias).filter(last_heartbeat__gte=since)
    return list(rows.only("names", "task_backends", "unknown_tasks"))


def unknown(alias: str, live: Collection[Worker]) -> set[str]:
    """The names of queued jobs that none of the ``live`` workers knows."""
    registered = {name for worker in live for name in worker.names or ()}
    # @job jobs whose name a live worker registered are known: left out in the query.
    rows = (
        Job.objects.using(alias)
        .queued()
        .exclude(task_backend="", name__in=registered)
        .order_by()
        .values_list("name", "task_backend")
        .distinct()
    )
    return {name for name, task in rows if not any(worker.knows(name, task) for worker in live)}


def _count(alias: str, names: set[str], now: datetime) -> list[UnknownName]:
    """Add the time since the last check to each of ``names``, forget the others; the rows of ``names``."""
    rows = UnknownName.objects.using(alias)
    rows.exclude(name__in=names).delete()
    counted = list(rows.filter(name__in=names))
    for row in counted:
        gap = (now - row.checked_at).total_seconds()
        row.unknown_for += max(0.0, min(gap, max_gap()))
        row.checked_at = now
        row.save(using=alias, update_fields=["unknown_for", "checked_at"])
    new = sorted(names - {row.name for row in counted})
    if new:
        for name in new:
            logger.info(
                "no live worker knows job name %s; its jobs wait for one, failed after %gs "
                "name=%s timeout=%gs",
                name,
                conf.unknown_name_timeout,
                name,
                conf.unknown_name_timeout,
            )
        added = [UnknownName(name=name, since=now, checked_at=now) for name in new]
        rows.bulk_create(added, ignore_conflicts=True)
        counted += added
    return sorted(counted, key=lambda row: row.name)


def _fail(alias: str, row: UnknownName, now: datetime, deadline: float) -> list[int]:
    """Fail the due queued jobs of ``row``'s name, in batches until none is left or ``deadline``."""
    error = (
        f"no handler registered for {row.name!r}: no live worker has known this name for "
        f"{describe_duration(row.unknown_for)}, past VELLUM_JOBS['UNKNOWN_NAME_TIMEOUT'] "
        f"({describe_duration(conf.unknown_name_timeout)}). Deploy code that registers it and retry the job."
    )
    rows = Job.objects.using(alias).filter(transitions.unrunnable(row.name, now))
    failed: list[int] = []
    while True:
        batch = list(rows.order_by("pk").values_list("pk", "attempts", "queue")[:BATCH_SIZE])
        for (attempts, queue), ids in _groups(batch).items():
            with lock_waits.bounded(alias):
                failed += _fail_group(rows, ids, now, error, attempts, queue)
        if len(batch) < BATCH_SIZE or time.monotonic() >= deadline:
            break
    rollup.count_name(now, row.name, rollup.FAILED, len(failed))
    if failed:
        logger.warning(
            "%d %s jobs failed: no live worker has known their name for %.0fs "
            "name=%s jobs=%d unknown_for=%.0fs timeout=%gs",
            len(failed),
            row.name,
            row.unknown_for,
            row.name,
            len(failed),
            row.unknown_for,
            conf.unknown_name_timeout,
        )
    return failed


def _groups(batch: list[tuple[int, int, str]]) -> dict[tuple[int, str], list[int]]:
    """Job ids by (attempts, queue): one UPDATE each, as their history entries and rollup rows differ."""
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for pk, attempts, queue in batch:
        groups[attempts, queue].append(pk)
    return groups


def _fail_group(
    rows: QuerySet[Job], ids: list[int], now: datetime, error: str, attempts: int, queue: str
) -> list[int]:
    """Fail the jobs ``ids`` of ``rows`` (those still due and queued), all ``attempts`` and ``queue``."""
    entry = history.entry(
        attempt=attempts,
        claim=None,  # no worker ran it
        outcome=history.FAILED,
        error=error,
        worker_id=None,
        worker="",
        started_at=None,
        ended_at=now,
    )
    changed = rows.filter(pk__in=ids).update(**transitions.orm(transitions.no_handler(now, error, entry)))
    if changed:
        rollup.count(now, queue, rollup.FAILED, changed)
    if changed == len(ids):
        return ids
    # Some were claimed or cancelled since they were read: only the others were failed.
    done = Job.objects.using(rows.db).filter(pk__in=ids, state=transitions.FAILED, finished_at=now)
    return list(done.values_list("pk", flat=True))
