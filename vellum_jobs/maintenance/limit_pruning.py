"""The limit-pruning duty: slots and holds no gate needs any more, deleted once a minute.

A key like ``customer:{customer_id}`` makes slots for every customer that
ever started a job; a ``Throttled`` hold outlives its time. A rate slot that
has rested well past its period, a concurrency slot whose job no longer
runs under its claim, and a hold that has lifted decide nothing: a gate
finds the key with room either way, and makes the slot again if it needs it.
A key's slots go together, once all are of no use: the gate numbers them
densely. A gate that read such a slot just before it went finds nothing to
update, and checks its limits again (``limit_gate``), so a start is never lost.

The cost: one process, once per ``INTERVAL``, reads which keys have a slot
idle for ``IDLE`` (the table holds only keys in use), and for each of at
most ``GROUPS`` of them, under the key's lock, reads its slots and deletes
them all if all are idle.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.db import connections, transaction

from vellum_jobs.core.limit_models import CONCURRENCY, LimitHold, LimitSlot
from vellum_jobs.core.limits import guard
from vellum_jobs.core.models import Job
from vellum_jobs.core.transitions import RUNNING
from vellum_jobs.store import lock_waits, locks, sql, transient_errors

LOCK = "limit_pruning"
INTERVAL = timedelta(minutes=1)
# A slot or hold is pruned only once it has been of no use for this long.
IDLE = timedelta(minutes=5)
# Keys looked at per run; the rest wait for the next.
GROUPS = 200

_turns = locks.Turns(LOCK, INTERVAL)


def run_if_due(alias: str, holder: uuid.UUID | str, now: datetime) -> int | None:
    """Prune if it is this process's turn; how many rows went, or None if it did not look.
    Never raises: a failure is logged and tried again next interval."""
    try:
        if not _turns.take(alias, holder, now):
            return None
        with lock_waits.bounded(alias):
            return prune(alias, now)
    except Exception as exc:  # noqa: BLE001 - the duty must never stop the heartbeat that runs it
        transient_errors.log_failure(
            "limit pruning failed; trying again next interval holder=%s", exc, holder
        )
        transient_errors.reset_connection(alias)
        return None


def prune(alias: str, now: datetime) -> int:
    """Delete the slots and holds of no use since ``now - IDLE``; how many."""
    cutoff = now - IDLE
    holds, _ = LimitHold.objects.using(alias).filter(until__lt=cutoff).delete()
    return holds + _prune_slots(alias, now, cutoff)


def _prune_slots(alias: str, now: datetime, cutoff: datetime) -> int:
    """Delete the slots of each key whose every slot has been of no use since ``cutoff``.

    Each key under its lock (the gate's), so no gate takes or makes one of
    its slots meanwhile.
    """
    candidates = (
        LimitSlot.objects.using(alias)
        .filter(taken_at__lt=cutoff)
        .exclude(next_at__gte=cutoff)
        .values_list("key", "kind", "period")
        .distinct()[:GROUPS]
    )
    return sum(_prune_key(alias, key, kind, period, cutoff) for key, kind, period in list(candidates))


def _prune_key(alias: str, key: str, kind: str, period: float, cutoff: datetime) -> int:
    connection = connections[alias]
    with transaction.atomic(using=alias):
        if connection.vendor != "sqlite":  # SQLite: the transaction holds the one write lock
            sql.of(connection).lock_keys(connection, [key], cutoff)
        slots = LimitSlot.objects.using(alias).filter(key=key, kind=kind, period=period)
        rows = list(slots.values_list("taken_at", "next_at", "job_id", "claim"))
        holders = [job_id for _, _, job_id, _ in rows if job_id is not None]
        running = set(
            Job.objects.using(alias).filter(pk__in=holders, state=RUNNING).values_list("pk", "claims")
        )
        for taken_at, next_at, job_id, claim in rows:
            if (job_id, claim) in running or (next_at is not None and next_at >= cutoff):
                return 0
            if kind != CONCURRENCY and not _rested(taken_at, period, cutoff):
                return 0
        return slots.delete()[0]


def _rested(taken_at: datetime | None, period: float, cutoff: datetime) -> bool:
    """Whether a rate slot last started a job a whole period (and its guard) before ``cutoff``."""
    return taken_at is None or taken_at + timedelta(seconds=period + guard(period)) < cutoff
