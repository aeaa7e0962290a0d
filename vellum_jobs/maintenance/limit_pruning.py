"""The limit-pruning duty: slots and holds no gate needs any more, deleted once a minute.

A key like ``customer:{customer_id}`` makes slots for every customer that
ever started a job; a ``Throttled`` hold outlives its time. A rate slot that
has rested well past its period, a concurrency slot whose job no longer
runs under its claim, and a hold that has lifted decide nothing: a gate
finds the key with room either way, and makes the slot again if it needs it.
A gate that read such a slot just before it went finds nothing to update,
and checks its limits again (``limit_gate``), so a start is never lost.

The cost: one process, once per ``INTERVAL``, reads the slots idle for
``IDLE`` (an index on nothing: the table holds only keys in use) and deletes
them in batches.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from vellum_jobs.core.limit_models import CONCURRENCY, LimitHold, LimitSlot
from vellum_jobs.core.limits import guard
from vellum_jobs.core.models import Job
from vellum_jobs.core.transitions import RUNNING
from vellum_jobs.store import lock_waits, locks, transient_errors

LOCK = "limit_pruning"
INTERVAL = timedelta(minutes=1)
# A slot or hold is pruned only once it has been of no use for this long.
IDLE = timedelta(minutes=5)
BATCH_SIZE = 500

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
    slots = LimitSlot.objects.using(alias)
    rows = list(
        slots.filter(taken_at__lt=cutoff)
        .exclude(next_at__gte=cutoff)
        .values_list("pk", "kind", "period", "taken_at", "job_id", "claim")[: BATCH_SIZE * 4]
    )
    holders = [job_id for _, kind, _, _, job_id, _ in rows if kind == CONCURRENCY and job_id is not None]
    running = set(Job.objects.using(alias).filter(pk__in=holders, state=RUNNING).values_list("pk", "claims"))
    idle = [
        pk
        for pk, kind, period, taken_at, job_id, claim in rows
        if (job_id, claim) not in running
        if kind == CONCURRENCY or _rested(taken_at, period, cutoff)
    ]
    deleted = 0
    for start in range(0, len(idle), BATCH_SIZE):
        deleted += slots.filter(pk__in=idle[start : start + BATCH_SIZE]).delete()[0]
    return deleted


def _rested(taken_at: datetime | None, period: float, cutoff: datetime) -> bool:
    """Whether a rate slot last started a job a whole period (and its guard) before ``cutoff``."""
    return taken_at is None or taken_at + timedelta(seconds=period + guard(period)) < cutoff
