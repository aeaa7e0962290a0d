"""Database plumbing: hot-path statements on the driver's own cursor, short
transactions and their savepoints, and the setup of a worker's SQLite connections.

A worker runs a claim and a fenced UPDATE for every job, and a web request
an INSERT for every enqueue. Django's cursor wrapper (query logging hooks,
and on SQLite a regex that rewrites ``%s`` to ``?`` on every call) costs
more than SQLite takes to run the statement, so these statements are
written once in the driver's parameter style and run directly, with
Django's error translation kept: a driver error still surfaces as
``django.db.OperationalError`` and friends.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.asyncio import async_unsafe

if TYPE_CHECKING:
    from vellum_jobs.sql.base import Dialect

T = TypeVar("T")


def driver_sql(connection: BaseDatabaseWrapper, sql: str) -> str:
    """``sql`` written with ``%s`` placeholders, in the driver's parameter style."""
    return _driver_sql(connection.vendor, sql)


@functools.lru_cache(maxsize=256)
def _driver_sql(vendor: str, sql: str) -> str:
    return sql.replace("%s", "?") if vendor == "sqlite" else sql


def execute(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> Any:
    """Run a statement already in the driver's style; returns the driver cursor.

    Wrappers installed with ``connection.execute_wrapper()`` (query counters,
    instrumentation) see these statements as they see the ORM's.
    """
    connection.ensure_connection()
    with connection.wrap_database_errors:
        cursor = connection.connection.cursor()
        _execute(connection, cursor, sql, params)
        return cursor


def _execute(connection: BaseDatabaseWrapper, cursor: Any, sql: str, params: Sequence[Any]) -> None:
    if not connection.execute_wrappers:
        cursor.execute(sql, params)
        return

    def run(sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        return cursor.execute(sql, params)

    for wrapper in reversed(connection.execute_wrappers):
        run = functools.partial(wrapper, run)
    run(sql, params, False, {"connection": connection, "cursor": cursor})


@async_unsafe
def execute_as_django(
    connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any], read: Callable[[Any], T]
) -> T:
    """Run a statement (``%s`` placeholders) on a caller's connection; returns ``read(cursor)``.

    For statements a project's own code runs, such as an enqueue in a web
    request: Django's checks come first, as its cursor makes them (the
    thread that owns the connection, an ``atomic()`` block broken by an
    earlier error, ``CONN_HEALTH_CHECKS``; not from async code), then the
    driver's cursor. While Django logs queries (``DEBUG``, ``assertNumQueries``,
    a debug toolbar), the statement goes through Django's cursor and is logged.
    """
    if connection.queries_logged:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return read(cursor)
    if not isinstance(connection, BaseDatabaseWrapper):
        connection = connections[connection.alias]  # the wrapper itself, not ``django.db.connection``
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    raw = connection.connection
    # A cursor kept for the next statement: a new psycopg cursor looks up its
    # parameters' adapters afresh, which cost more than an enqueue's own
    # Python. Taken out while in use, so a statement run meanwhile (by an
    # execute wrapper) gets a cursor of its own.
    kept = _cursors.pop(connection, None)
    cursor = kept[1] if kept is not None and kept[0] is raw else _new_cursor(connection)
    with connection.wrap_database_errors:
        _execute(connection, cursor, driver_sql(connection, sql), params)
        result = read(cursor)
    _cursors[connection] = (raw, cursor)
    return result


def _new_cursor(connection: BaseDatabaseWrapper) -> Any:
    """A driver cursor; on psycopg 3 one that binds parameters on the server.

    Django's default cursor writes each parameter into the statement's text
    (client-side binding), which for the two dozen of an INSERT cost more
    than sending them apart, here and in the server's parser. The values
    stored are the same. Statements are prepared only if the project set
    ``prepare_threshold`` (Django leaves it off, for connection poolers).
    """
    if connection.vendor != "postgresql":
        # Django's PostgreSQL module imports psycopg (or psycopg2) when
        # imported: on the other vendors the driver may not be installed.
        return connection.connection.cursor()
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if is_psycopg3:
        import psycopg

        return psycopg.Cursor(connection.connection)
    return connection.connection.cursor()


# The driver cursor ``execute_as_django`` keeps per connection, with the
# driver connection it belongs to (a reconnect makes a new one).
_cursors: weakref.WeakKeyDictionary[BaseDatabaseWrapper, tuple[Any, Any]] = weakref.WeakKeyDictionary()


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
    dialect = None if connection.in_atomic_block else _dialect(connection)
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


def _dialect(connection: BaseDatabaseWrapper) -> Dialect | None:
    """The connection's dialect; None for a database vellum-jobs has none for."""
    # Imported when called: the dialects run their statements through this module.
    from vellum_jobs import sql

    return sql.DIALECTS.get(connection.vendor)


# Connections inside a BEGIN of ``short_transaction`` (Django's atomic() does
# not know of it, so ``in_atomic_block`` stays False there).
_open: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()


# Busy timeout for a worker's SQLite connections: a claim or an outcome
# write waits this long for another writer before "database is locked".
SQLITE_BUSY_TIMEOUT_MS = 20_000


def prepare_sqlite_connection(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Give a worker's SQLite connection WAL and a busy timeout that outlasts other writers."""
    if connection.vendor != "sqlite" or connection.is_in_memory_db():  # type: ignore[attr-defined]
        return
    from vellum_jobs import sql  # as in _dialect

    configured = float(connection.settings_dict.get("OPTIONS", {}).get("timeout", 5)) * 1000
    sql.sqlite.DIALECT.prepare_worker_connection(connection, int(max(configured, SQLITE_BUSY_TIMEOUT_MS)))
