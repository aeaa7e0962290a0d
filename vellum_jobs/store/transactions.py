"""Short transactions around a few hot-path statements, and savepoints within them.

Each dialect names the statements that open and end one (``sql``); Django's
``atomic()`` does where a dialect names none (MySQL) and inside an
``atomic()`` block.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs.store import sql
from vellum_jobs.store.db import execute

# Connections inside a BEGIN of ``short_transaction`` (Django's atomic() does
# not know of it, so ``in_atomic_block`` stays False there).
_open: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()


@contextmanager
def short_transaction(connection: BaseDatabaseWrapper) -> Iterator[None]:
    """A transaction around a few hot-path statements.

    Opened by the statement the connection's dialect names (``begin``: on
    SQLite ``BEGIN IMMEDIATE``, on PostgreSQL a plain BEGIN). Inside an
    ``atomic()`` block, or where the dialect names none (MySQL), it is
    Django's ``atomic()``.
    """
    connection = connections[connection.alias]  # the wrapper itself, not a proxy to it
    if connection in _open:
        yield  # nested in another of ours: it commits or rolls back the lot
        return
    dialect = None if connection.in_atomic_block else sql.DIALECTS.get(connection.vendor)
    if dialect is None or dialect.begin is None:
        # Nested in another of ours (the claim inside the dispatcher's cycle),
        # a savepoint would only cost statements: a failure undoes it all anyway.
        with transaction.atomic(using=connection.alias, savepoint=False):
            yield
        return
    _open.add(connection)
    try:
        execute(connection, dialect.begin, ())
        yield
        execute(connection, dialect.commit, ())
    except BaseException:
        # Whatever failed, BEGIN and COMMIT included, leave no transaction
        # open: on SQLite it would keep the write lock from every other
        # process. (A broken connection cannot roll back; closing it does.)
        with suppress(DatabaseError):
            execute(connection, dialect.rollback, ())
        raise
    finally:
        _open.discard(connection)


@contextmanager
def savepoint(connection: BaseDatabaseWrapper, name: str) -> Iterator[None]:
    """A savepoint in the open transaction, rolled back to if the block raises, so that the
    transaction goes on (PostgreSQL aborts it at any failed statement otherwise).

    In Django's ``atomic()`` it is Django's, which also forgets the error the
    ORM noted for the block. In a ``short_transaction``, whose BEGIN Django
    knows nothing of, it is raw statements (``name``). Outside a transaction
    it does nothing: a statement that fails there undoes only itself.
    """
    connection = connections[connection.alias]
    if connection.in_atomic_block:
        with transaction.atomic(using=connection.alias):
            yield
        return
    if connection not in _open and connection.get_autocommit():
        yield
        return
    execute(connection, f"SAVEPOINT {name}", ())
    try:
        yield
    except BaseException:
        # A deadlock on MySQL rolls back the whole transaction, the savepoint with it.
        with suppress(DatabaseError):
            execute(connection, f"ROLLBACK TO SAVEPOINT {name}", ())
        raise
    execute(connection, f"RELEASE SAVEPOINT {name}", ())
