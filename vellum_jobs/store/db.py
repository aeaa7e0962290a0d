"""Database plumbing: hot-path statements on the driver's own cursor.

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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.asyncio import async_unsafe

if TYPE_CHECKING:
    pass

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
