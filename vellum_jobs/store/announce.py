"""Telling idle workers that a queue has news: a ``NOTIFY`` on PostgreSQL, nothing elsewhere.

SQLite's workers see any commit (``PRAGMA data_version``) and MariaDB's probe
the table, so only PostgreSQL's need telling (``worker.wakeup`` listens).
"""

from __future__ import annotations

from django.db import connections

from vellum_jobs.store import sql
from vellum_jobs.store.sql.names import channel


def announce(alias: str, queue: str) -> None:
    """Tell listening workers that ``queue`` has a new job (PostgreSQL only)."""
    connection = connections[alias]
    dialect = sql.DIALECTS.get(connection.vendor)
    notify = dialect.notify_sql() if dialect is not None else None
    if notify is not None:
        with connection.cursor() as cursor:
            cursor.execute(notify, [channel(), queue])
