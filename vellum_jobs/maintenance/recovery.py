"""Recovering the jobs of workers that died: a heartbeat duty, any worker's lapsed leases.

A lease lapses when nobody renewed it for a whole lease, and that is judged
without any clock but the observer's own monotonic one: the observer
(``LapseWatch``) must have seen a job's lease unchanged for ``LEASE``
seconds. Comparing ``lease_expires_at`` with "now" would trust two hosts to
agree about the time; one whose clock runs ahead would take live jobs, one
whose clock runs behind would have its own taken. A live owner renews
every ``HEARTBEAT``, so its lease never stays unchanged that long. The
stored end narrows the rows worth watching, and must have passed too (by
the database's clock where it is known, see ``clock``), so that a worker
configured with a longer lease keeps it: a clock that is off can only
delay a recovery, never hasten one.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import OperationalError

from vellum_jobs.conf import conf
from vellum_jobs.core import history, transitions
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.store import lock_waits, putback, rollup

logger = logging.getLogger("vellum_jobs")


class LapseWatch:
    """The running jobs' leases as one process has seen them, and since when by its monotonic clock.

    ``clock`` and ``lease`` (seconds; ``LEASE`` unless given) are there for
    tests that drive time themselves.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, lease: float | None = None) -> None:
        self.clock = clock
        self.lease = lease
        self.seen: dict[int, tuple[tuple[int, datetime | None], float]] = {}

    @property
    def length(self) -> float:
        return conf.lease if self.lease is None else self.lease

    def horizon(self, now: datetime) -> datetime:
        """Only leases ending before this instant are watched.

        A live owner's lease ends at least a lease, less a beat and its
        latency, after its last renewal: later ones are being renewed.
        """
        return now + timedelta(seconds=max(0.0, self.length - 2 * conf.heartbeat))

    def lapsed(self, rows: Sequence[tuple[int, int, datetime | None]], now: datetime) -> set[int]:
        """Of the watched jobs (id, claim token, lease end), those whose lease stayed as it was for a
        lease, and whose end has passed.

        Jobs no longer in ``rows`` are forgotten, so a job watched again starts afresh.
        The end's passing (by ``now``, the database's time as this process
        reckons it) only keeps a worker configured with a longer lease safe.
        """
        at = self.clock()
        seen = {}
        for pk, token, lease in rows:
            before = self.seen.get(pk)
            since = before[1] if before is not None and before[0] == (token, lease) else at
            seen[pk] = ((token, lease), since)
        self.seen = seen
        return {
            pk
            for pk, ((_, lease), since) in seen.items()
            if at - since >= self.length and lease is not None and lease < now
        }


def recover_expired(alias: str, now: datetime, watch: LapseWatch) -> list[tuple[int, str]]:
    """Requeue (or fail, when out of attempts) running jobs whose lease ``watch`` saw lapse.

    Returns (job id, new state) pairs. Each write is fenced on the token it
    read and on the lease being as it was seen, so a job that finished,
    was renewed or was claimed again in the meantime is left alone.
    """
    leased = (
        Job.objects.using(alias)
        .filter(transitions.leased(watch.horizon(now)))
        .values_list(
            "pk",
            "claims",
            "lease_expires_at",
            "worker_id",
            "attempts",
            "max_attempts",
            "cancel_requested_at",
            "started_at",
            "queue",
            "unique_key",
            "name",  # last: the job's figures by name
        )
    )
    rows = list(leased)
    lapsed = watch.lapsed([row[:3] for row in rows], now)
    # In id order, as every fenced write goes: of two recovered jobs with one unique key, the first
    # keeps it (the other is superseded).
    expired = sorted((row for row in rows if row[0] in lapsed), key=lambda row: row[0])
    if not expired:
        return []
    workers = {w.pk: str(w) for w in Worker.objects.using(alias).filter(pk__in={e[3] for e in expired})}
    recovered = []
    for row in expired:
        try:
            with lock_waits.bounded(alias):
                state = _recover_one(alias, now, row, workers)
        except OperationalError as exc:
            if not lock_waits.timed_out(alias, exc):
                raise
            # A session holds the job's row: its owner, cut off in the middle of
            # writing its outcome, perhaps. The others need not wait for it.
            logger.warning(
                "job #%s not recovered yet: another session holds its row; trying again next beat job_id=%s",
                row[0],
                row[0],
            )
            continue
        if state is not None:
            recovered.append((row[0], state))
    return recovered


def _recover_one(
    alias: str, now: datetime, row: tuple[Any, ...], workers: dict[uuid.UUID, str]
) -> str | None:
    """Requeue or fail one job of a lost worker; its new state, or None if its lease moved meanwhile."""
    pk, token, lease, worker_id, attempts, max_attempts, cancel_requested_at, started_at, queue, key = row[
        :10
    ]
    owner = workers.get(worker_id, "a process that is gone") if worker_id else "unknown"
    error = (
        f"worker lost: its lease expired during attempt {attempts} of {max_attempts} "
        f"(worker {owner}, id {worker_id}); the process died or stalled"
    )
    if cancel_requested_at is not None:
        error += "; its cancellation had been requested, so it is not retried"
    entry = history.entry(
        attempt=attempts,
        claim=token,
        outcome=history.LOST,
        error=error,
        worker_id=worker_id,
        worker=workers.get(worker_id, "") if worker_id else "",
        started_at=started_at,
        ended_at=now,
    )
    write = transitions.recovered(
        now,
        error,
        out_of_attempts=attempts >= max_attempts,
        cancel_requested=cancel_requested_at is not None,
        entry=entry,
    )

    def update(applied: transitions.Write) -> bool:
        rows = Job.objects.using(alias).filter(transitions.unrenewed(pk, token, lease))
        return bool(rows.update(**transitions.orm(applied.changes)))

    applied = putback.apply(alias, pk, key, write, update)
    if applied is None:
        return None
    state = applied.changes["state"]
    name = row[-1]
    logger.warning(
        "%s #%s recovered from a lost worker (its lease lapsed), now %s"
        " job_id=%s name=%s worker_id=%s state=%s",
        name,
        pk,
        state,
        pk,
        name,
        worker_id,
        state,
    )
    rollup.count(now, queue, rollup.LOST, name=name)
    return str(state)
