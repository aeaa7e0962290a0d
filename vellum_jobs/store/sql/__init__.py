"""The raw SQL of the hot path, one module per database vendor.

A vendor's whole hot path reads in one file: ``sqlite``, ``postgresql``,
``mysql`` (MariaDB and MySQL). What they share, the claim's candidate scan
and the statement cache, is in ``base``; the identifiers, taken from the
models' ``_meta``, in ``names``. The modules that decide what to write
(``claim``, ``fence``, ``inserts``) and those that run the threads and
transactions around it (``transactions``, the worker's wakeup) ask ``of(connection)``
for the dialect that renders and runs it.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs.store.sql import mysql, postgresql, sqlite
from vellum_jobs.store.sql.base import Dialect, Shape

__all__ = ["DIALECTS", "Dialect", "Shape", "of", "prepare_worker_connection"]

DIALECTS: dict[str, Dialect] = {
    "sqlite": sqlite.DIALECT,
    "postgresql": postgresql.DIALECT,
    "mysql": mysql.DIALECT,
}


def of(connection: BaseDatabaseWrapper) -> Dialect:
    """The dialect of ``connection``'s database."""
    try:
        return DIALECTS[connection.vendor]
    except KeyError:
        raise NotImplementedError(
            f"vellum-jobs does not support the {connection.vendor!r} database"
        ) from None


# Busy timeout for a worker's SQLite connections: a claim or an outcome
# write waits this long for another writer before "database is locked".
SQLITE_BUSY_TIMEOUT_MS = 20_000


def prepare_worker_connection(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Give a worker's SQLite connection WAL and a busy timeout that outlasts other writers
    (a receiver of ``connection_created``)."""
    if connection.vendor != "sqlite" or connection.is_in_memory_db():  # type: ignore[attr-defined]
        return
    configured = float(connection.settings_dict.get("OPTIONS", {}).get("timeout", 5)) * 1000
    sqlite.DIALECT.prepare_worker_connection(connection, int(max(configured, SQLITE_BUSY_TIMEOUT_MS)))
