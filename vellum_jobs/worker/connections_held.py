"""How many database connections a worker process holds: counted where they live, not estimated.

Django opens a connection per thread and alias, lazily, and closes it when
that thread says so (with the default ``CONN_MAX_AGE = 0`` a slot's closes
after each job). PostgreSQL's wakeup listener opens its own, outside Django.
So every Django connection wrapper created in the process is remembered,
weakly (``connection_created``), and those of the queue's alias whose driver
connection is open are counted; the listener says while it holds one, and
to which alias (``holding(alias)``). SQLite's wakeup watcher holds an open
file, no server connection, and is not counted. A look at another thread's
wrapper reads one attribute and may be a moment stale: the heartbeat counts
afresh at every beat.

A process holds at most ``budget(threads)`` connections: one per slot (for
its handlers), the dispatcher's, the recorder's (PostgreSQL and MariaDB:
outcomes are written beside the claims), the heartbeat's and the wakeup
watcher's.
Everything else a worker does (the schedules' ticks included) runs on one
of those.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

# Beyond one per slot: the dispatcher, the recorder, the heartbeat and the wakeup watcher.
BEYOND_SLOTS = 4

_lock = threading.Lock()  # over both below: threads open connections while the heartbeat counts
_wrappers: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()
_outside_django: Counter[str] = Counter()  # by alias


def budget(threads: int) -> int:
    """The most connections a worker process with ``threads`` slots holds to its database."""
    return threads + BEYOND_SLOTS


def remember(connection: BaseDatabaseWrapper) -> None:
    """Count ``connection`` (a thread's wrapper for one alias) whenever it is open."""
    with _lock:
        _wrappers.add(connection)


def on_connection_created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """A ``connection_created`` receiver: every connection the process opens is remembered."""
    remember(connection)


@contextmanager
def holding(alias: str) -> Iterator[None]:
    """Count one connection to ``alias`` opened outside Django (the wakeup watcher's) while the
    block runs."""
    with _lock:
        _outside_django[alias] += 1
    try:
        yield
    finally:
        with _lock:
            _outside_django[alias] -= 1


def held(alias: str) -> int:
    """Connections to ``alias`` open now: Django's in every thread, and those opened outside Django."""
    with _lock:
        wrappers = list(_wrappers)
        outside = _outside_django[alias]
    return outside + sum(
        1 for wrapper in wrappers if wrapper.alias == alias and wrapper.connection is not None
    )
