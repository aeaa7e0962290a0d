"""How long the queue's upkeep writes wait for a row lock another session holds.

A worker cut off from the database in the middle of a transaction (a network
partition, a stuck proxy) leaves that transaction open on the server, with
its row locks, until the server notices the session is gone: on a path that
still acknowledges every byte, never. Every other worker's heartbeat that
writes one of those rows (the maintenance locks, the rollup's minutes, the
cut-off worker's lapsed jobs) would wait behind it, stop renewing its own
leases, and the whole fleet would stop with the one worker. So the
heartbeat's upkeep writes run in ``bounded()`` transactions: a lock wait
longer than ``lock_wait()`` fails with a transient error, the beat goes on,
and a later beat tries the write again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TypeVar

from django.db import DatabaseError, connections, transaction

from vellum_jobs.conf import conf
from vellum_jobs.store import sql, transient_errors

T = TypeVar("T")

# The shortest wait allowed: a live holder's transaction is short, but a
# loaded machine can keep it from committing for a moment.
MIN_WAIT = 1.0


def lock_wait() -> float:
    """Seconds an upkeep write waits for another session's lock: one ``HEARTBEAT``, at least ``MIN_WAIT``."""
    return max(conf.heartbeat, MIN_WAIT)


@contextmanager
def bounded(alias: str) -> Iterator[None]:
    """Statements that wait at most ``lock_wait()`` for a lock, then fail (``OperationalError``:
    transient).

    On PostgreSQL the block is a transaction, the bound its own
    (``SET LOCAL``). On MariaDB/MySQL the bound is the session's, put back
    after the block, whose statements commit as they would without it: a
    transaction there would read from one snapshot, and a ``get_or_create``
    that lost a race could not see the row that won. Inside a caller's
    ``atomic()`` block it is only that block: the caller chose its
    transaction, and its waits. On SQLite, whose busy timeout bounds every
    wait, it is nothing.
    """
    connection = connections[alias]
    dialect = sql.of(connection)
    if connection.in_atomic_block or not dialect.row_locks:
        yield
        return
    if dialect.bounds_transactions:
        with transaction.atomic(using=alias):
            dialect.bound_lock_waits(connection, lock_wait())
            yield
        return
    undo = dialect.bound_lock_waits(connection, lock_wait())
    try:
        yield
    finally:
        if undo is not None:
            with suppress(DatabaseError):  # a broken connection is closed, and its setting with it
                undo()


def timed_out(alias: str, error: Exception) -> bool:
    """Whether ``error`` is a lock wait that ``bounded()`` cut short (another session holds the row)."""
    return sql.of(connections[alias]).lock_wait_ran_out(error)


def short_transaction(alias: str, work: Callable[[], T], *, what: str, give_up_after: float = 10) -> T:
    """``work`` in a transaction of its own whose lock waits are ``bounded()``, tried again past
    transient errors (a deadlock, a lock wait that ran out) for up to ``give_up_after`` seconds.

    Inside a caller's ``atomic()`` block it runs once, in a savepoint: a deadlock
    rolls the caller's transaction back, and retrying is the caller's.
    """

    def attempt() -> T:
        # A row a session cut off mid-transaction holds makes the work fail, not wait.
        with bounded(alias), transaction.atomic(using=alias):
            return work()

    if connections[alias].in_atomic_block:
        return attempt()
    return transient_errors.retry(attempt, what=what, alias=alias, give_up_after=give_up_after)
