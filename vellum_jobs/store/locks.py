"""Named maintenance locks: one process at a time runs a task, on whichever host it is.

A lock is a row that its holder owns until ``locked_until``. Taking a free
lock is one conditional UPDATE (free means ``locked_until`` has passed), or
the first time an INSERT, whose primary key lets one of two racing processes
in. A holder that dies simply stops renewing: the lock is free again once
``locked_until`` passes, and nothing has to clean up after it.

A lock's row may be held by a holder cut off mid-transaction: each of
these writes waits for it no longer than ``lock_waits.lock_wait()``.
"""

from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction

from vellum_jobs.core.models import MaintenanceLock
from vellum_jobs.store import lock_waits


def acquire(alias: str, name: str, holder: str, now: datetime, until: datetime) -> bool:
    """Take lock ``name`` for ``holder`` until ``until`` if it is free at ``now``."""
    locks = MaintenanceLock.objects.using(alias)
    with lock_waits.bounded(alias):
        if locks.filter(name=name, locked_until__lte=now).update(holder=holder, locked_until=until):
            return True
        if locks.filter(name=name).exists():
            return False
        try:
            # A savepoint, so a lost race does not break the transaction.
            with transaction.atomic(using=alias):
                locks.create(name=name, holder=holder, locked_until=until)
        except IntegrityError:
            return False
        return True


def renew(alias: str, name: str, holder: str, now: datetime, until: datetime) -> bool:
    """Extend a lock ``holder`` still holds at ``now``; False if it lapsed or is someone else's."""
    locks = MaintenanceLock.objects.using(alias)
    with lock_waits.bounded(alias):
        return bool(locks.filter(name=name, holder=holder, locked_until__gt=now).update(locked_until=until))


def release(alias: str, name: str, holder: str, until: datetime) -> bool:
    """Let ``holder``'s lock go; nobody takes it before ``until`` (``now`` frees it at once)."""
    locks = MaintenanceLock.objects.using(alias)
    with lock_waits.bounded(alias):
        return bool(locks.filter(name=name, holder=holder).update(locked_until=until))


def free_at(alias: str, name: str) -> datetime | None:
    """When lock ``name`` is free (None if it was never taken)."""
    return (
        MaintenanceLock.objects.using(alias).filter(name=name).values_list("locked_until", flat=True).first()
    )
