"""The raw SQL of the hot path, one module per database vendor.

A vendor's whole hot path reads in one file: ``sqlite``, ``postgresql``,
``mysql`` (MariaDB and MySQL). What they share, the claim's candidate scan
and the statement cache, is in ``base``; the identifiers, taken from the
models' ``_meta``, in ``names``. The modules that decide what to write
(``claim``, ``fence``, ``inserts``) and those that run the threads and
transactions around it (``wakeup``, ``probe``, ``db``) ask ``of(connection)``
for the dialect that renders and runs it.
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs.sql import mysql, postgresql, sqlite
from vellum_jobs.sql.base import Dialect, Shape

__all__ = ["DIALECTS", "Dialect", "Shape", "of"]

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
