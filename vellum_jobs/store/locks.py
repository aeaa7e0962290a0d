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

import uuid
from datetime import datetime, timedelta

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


class Turns:
    """A duty that one process at a time performs, once per ``interval``, under lock ``name``.

    Each process asks ``take()`` at every heartbeat. It tries the lock at most
    once per ``interval``, and not before the lock is free when another
    process holds it, so an idle fleet does not write the lock row each beat.
    """

    def __init__(self, name: str, interval: timedelta) -> None:
        self.name = name
        self.interval = interval
        self._next_try: dict[tuple[str, str], datetime] = {}

    def take(self, alias: str, holder: uuid.UUID | str, now: datetime) -> bool:
        """Whether it is ``holder``'s turn now: the lock taken until one interval from ``now``."""
        key = (alias, str(holder))
        due = self._next_try.get(key)
        if due is not None and now < due:
            return False
        self._next_try[key] = now + self.interval
        if acquire(alias, self.name, str(holder), now, now + self.interval):
            return True
        free = free_at(alias, self.name)
        if free is not None and free > now:
            self._next_try[key] = free
        return False
