"""Counting the statements a ``runjobs`` process sends, for the drain figures' statements per job.

Installed by ``benchmarks.settings`` when ``VELLUM_BENCH_STATEMENTS`` names a
directory: every statement on every connection of the process is counted
where the driver runs it (SQLite's trace callback; psycopg's and MySQLdb's
cursor ``execute``, which the worker's hot path calls directly, past Django's
cursor), and at exit the process writes its count to a file named by its pid.
A statement per batch of jobs, so the counting costs nothing measurable.
"""

from __future__ import annotations

import atexit
import itertools
import os
from pathlib import Path
from typing import Any

# next() of a count is atomic under the GIL: threads count at once, and the next
# value at exit is the number of statements counted.
_counter = itertools.count()


def _count(*_: Any) -> None:
    next(_counter)


def install(directory: str) -> None:
    from django.db.backends.signals import connection_created

    def on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
        if connection.vendor == "sqlite":
            connection.connection.set_trace_callback(_count)

    connection_created.connect(on_connection, weak=False)
    _wrap_driver_cursors()
    atexit.register(lambda: (Path(directory) / str(os.getpid())).write_text(str(next(_counter))))


def _wrap_driver_cursors() -> None:
    """Count each ``execute``/``executemany`` of the server drivers' cursors (where installed)."""
    classes: list[Any] = []
    try:
        import psycopg

        classes.append(psycopg.Cursor)
    except ImportError:
        pass
    try:
        import MySQLdb.cursors

        classes.append(MySQLdb.cursors.BaseCursor)
    except ImportError:
        pass
    for cls in classes:
        for name in ("execute", "executemany"):
            setattr(cls, name, _counting(getattr(cls, name)))


def _counting(method: Any) -> Any:
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        _count()
        return method(self, *args, **kwargs)

    return counted


def total(directory: Path) -> int:
    """The statements every process that wrote to ``directory`` counted."""
    return sum(int(path.read_text() or 0) for path in directory.iterdir())
