"""The database's clock, as a worker process reckons it: its own clock plus a measured offset.

Hosts disagree about the time (NTP off, a VM resumed from suspend), and a
worker that judged due times by its own clock would start delayed jobs
early, or late, by its error. On PostgreSQL and MariaDB every heartbeat
asks the server for its time and keeps the difference; ``now()`` is this
process's clock corrected by it, so a worker judges due times, leases and
retries by the database's clock, to within half a round trip. SQLite has
no clock of its own (its ``now`` is the asking process's), so there the
offset is unknown and ``now()`` is the process's own time.

A process that is not a worker (a web server enqueueing, the admin) has no
heartbeat: ``of(alias)`` measures the offset on first use and again once
the last measurement is ``REFRESH`` seconds old, one statement a minute at
most, so a job enqueued "now" on a host whose clock runs an hour ahead is
due now, not in an hour.

No lease is ever judged lapsed by a clock, corrected or not: see
``recovery.LapseWatch``. The offset only keeps due times right, and each
worker row records it so the admin, ``jobstats`` and the health view can
warn of a host whose clock is off by more than ``WARN_OFFSET``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from django.db import connections
from django.utils import timezone

# A host whose clock is off the database's by more than this many seconds
# is shown with a warning: its enqueues' due times are off by as much.
WARN_OFFSET = 2.0

# The server's time now, as an aware or naive UTC datetime, by vendor.
SERVER_NOW = {
    "postgresql": "SELECT clock_timestamp()",
    "mysql": "SELECT UTC_TIMESTAMP(6)",
}

# How long a measured offset serves a process that has no heartbeat (``of``).
REFRESH = 60.0

_offset: float | None = None  # the database's clock minus this process's, in seconds
_measured_at: float | None = None  # when, by this process's monotonic clock


def now() -> datetime:
    """The database's time as this process reckons it (its own, until an offset was measured)."""
    if _offset is None:
        return timezone.now()
    return timezone.now() + timedelta(seconds=_offset)


def of(alias: str) -> datetime:
    """The database's time now, measuring the offset first if it is unknown or ``REFRESH`` old."""
    if connections[alias].vendor in SERVER_NOW and (
        _measured_at is None or time.monotonic() - _measured_at > REFRESH
    ):
        measure(alias)
    return now()


def offset() -> float | None:
    """The last measured offset of the database's clock from this process's, in seconds."""
    return _offset


def measure(alias: str) -> float | None:
    """Ask the database for its time and keep the offset; None where it has no clock (SQLite)."""
    global _offset, _measured_at
    connection = connections[alias]
    query = SERVER_NOW.get(connection.vendor)
    if query is None:
        return None
    with connection.cursor() as cursor:
        sent = time.time()
        cursor.execute(query)
        (server,) = cursor.fetchone()
        received = time.time()
    if server.tzinfo is None:
        server = server.replace(tzinfo=UTC)
    offset = server.timestamp() - (sent + received) / 2
    # The server read its clock somewhere within the round trip (its reading
    # truncated to the microsecond): an offset within half of it is no
    # offset that can be told, and zero keeps processes on one host in step.
    _offset = 0.0 if abs(offset) <= (received - sent) / 2 + 1e-6 else offset
    _measured_at = time.monotonic()
    return _offset


def forget() -> None:
    """Back to the process's own clock (a test, or a process that moves to another database)."""
    global _offset, _measured_at
    _offset = _measured_at = None


def is_off(seconds: float | None) -> bool:
    """Whether a recorded offset is past the bound the admin and ``jobstats`` warn at."""
    return seconds is not None and abs(seconds) > WARN_OFFSET


def describe(seconds: float) -> str:
    """A recorded offset in words: "clock 3600.2s ahead of the database"."""
    way = "behind" if seconds > 0 else "ahead of"
    return f"clock {abs(seconds):.1f}s {way} the database"
