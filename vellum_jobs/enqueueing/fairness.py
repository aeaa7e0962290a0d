"""Fair shares: jobs with a ``fair_key`` take turns with the other keys' jobs of their queue.

The claim is not changed, and knows nothing of keys: it takes jobs by
priority, then ``run_after``, then id. Fairness is decided at enqueue
instead, by the ``run_after`` a job gets. A job of a function with a fair
key that is due at once gets a *turn*, ``fair_at``, and its ``run_after``
is set to it::

    turn = max(its key's last turn among the queue's queued jobs,
               the queue's first turn among its queued jobs that are due, or now if none)
           + spacing / fair_weight

so a key with a backlog of 100,000 jobs has 100,000 turns ahead, and a key
that enqueues 10 jobs behind it gets turns just after the queue's head:
its jobs interleave with the backlog's next ones instead of waiting for
all of them. The jobs of one ``enqueue_many`` with
one key get successive turns. One query per key and enqueue call finds
both values, through the partial indexes ``vellum_job_fair_key`` and
``vellum_job_fair_turn`` (only queued jobs with a turn are in them; each
query states their condition so that the database can use them).

What it costs: nothing for a job without a fair key (the enqueue's fast
path does not come here, and the claim is unchanged). A job with one is
inserted on its own (one INSERT per job, like a unique job), after one
query per key of the call. On MySQL and MariaDB, which have no partial
indexes, the two indexes hold every row, finished ones too, and the
query for the queue's first turn reads past the finished fair jobs of the
queue that are still in the table.

A caveat: turns may lie in the past (a new key's turns follow the queue's
first due turn), so at the same priority in the same queue, a backlog of
fair jobs whose turns have come goes ahead of jobs without a fair key
enqueued after them. Give fair jobs a queue of their own, or give every
job of that queue a fair key.

A job that is not due at once (``run_after`` or ``delay`` given, or one
that waits for other jobs) keeps its key but gets no turn (``fair_at``
NULL): it runs when it is due, in order with the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs.core import limits
from vellum_jobs.core.models import Job

if TYPE_CHECKING:
    from vellum_jobs.core.registry import Handler

# The distance between two turns of a key of weight 1, in microseconds (the
# resolution of a datetime column on every database). A key of weight w
# steps SPACING / w, rounded, at least 1 us: 60 divides exactly by the
# weights 1-6, 10, 12, 15, 20, 30 and 60, nearly by the others up to 20
# (7 takes 6.7 turns to 1, 9 takes 8.6), coarsely from 21 to 40 (2 us, as
# 30), and every weight from 41 up steps 1 us, as 60 does. Small, so that a
# backlog's turns stay close to when it was enqueued: a key of weight 1 has
# at most 16,666 turns a second. One process enqueues fair jobs (an INSERT
# each) at about that rate on SQLite and far slower on the others, so a lone
# key's turns run at most a fraction of a second ahead of the clock.
SPACING = 60

QUEUED = str(Job.State.QUEUED.value)
# The turn query's SQL by vendor, built once: the ORM took three times the query's own time
# to build it for each enqueue.
_STATEMENTS: dict[str, str] = {}


def step(weight: int) -> timedelta:
    """The distance between two turns of a key of ``weight`` (``SPACING`` / weight, at least 1 us)."""
    return timedelta(microseconds=max(1, round(SPACING / weight)))


def keys(function: Handler[Any, Any], calls: Sequence[tuple[list[Any], dict[str, Any]]]) -> list[str]:
    """Each call's fair key; ``ValueError`` naming a key that cannot be made (before anything is written)."""
    template = function.options.fair_key
    assert template is not None
    return [
        limits.render_key(function.name, "fair_key", template, function.signature, args, kwargs)
        for args, kwargs in calls
    ]


def rows(
    alias: str, function: Handler[Any, Any], row: Mapping[str, Any], fair_keys: Sequence[str], now: datetime
) -> list[dict[str, Any]]:
    """One row per call: ``row`` with its ``fair_key`` and, if it is due at once, its turn as
    ``fair_at`` and ``run_after``.

    Run it in the enqueue's transaction, just before the INSERTs, so that its
    reads and the rows they place are as close together as they can be.
    """
    options = function.options
    due_at_once = options.run_after is None and options.delay is None and row["state"] == Job.State.QUEUED
    if not due_at_once:
        return [{**row, "fair_key": key} for key in fair_keys]
    connection = connections[alias]
    queue = str(row["queue"])
    distance = step(options.fair_weight)
    after: dict[str, datetime] = {}  # each key's latest turn so far
    for key in dict.fromkeys(fair_keys):
        last, first = _ends(connection, queue, key, now)
        after[key] = max(last, first) if last is not None else first
    placed = []
    for key in fair_keys:
        turn = after[key] = after[key] + distance
        placed.append({**row, "fair_key": key, "fair_at": turn, "run_after": turn})
    return placed


def _ends(
    connection: BaseDatabaseWrapper, queue: str, key: str, now: datetime
) -> tuple[datetime | None, datetime]:
    """(``key``'s last turn among ``queue``'s queued jobs or None, the queue's first turn among its
    queued jobs that are due, else ``now``), in one statement."""
    sql, params = ends_statement(connection, queue, key, now)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        last, first = cursor.fetchone()
    return _datetime(connection, last), _datetime(connection, first) or now


def ends_statement(
    connection: BaseDatabaseWrapper, queue: str, key: str, now: datetime
) -> tuple[str, tuple[Any, ...]]:
    """The SELECT of ``_ends``, with its parameters (the tests EXPLAIN it)."""
    sql = _STATEMENTS.get(connection.vendor)
    if sql is None:
        sql = _STATEMENTS[connection.vendor] = _statement(connection)
    due = connection.ops.adapt_datetimefield_value(now)
    return sql, (QUEUED, key, queue, QUEUED, queue, due)


def _statement(connection: BaseDatabaseWrapper) -> str:
    """Two scalar subqueries side by side; each states the fair indexes' condition (``FAIR``) so
    that the database walks one of them from one end and stops at its first row.

    ``ORDER BY ... LIMIT 1``, not MIN/MAX, so that MySQL and MariaDB, whose
    indexes hold every row, finished ones too, stop at the first queued row:
    for the key's last turn at once, for the queue's first after the queue's
    finished fair jobs still in the table. The first turn asks for due jobs:
    a job put back with a later ``run_after`` (a retry) keeps its turn but is
    not the queue's head.
    """
    quote = connection.ops.quote_name
    n = {f.attname: quote(str(f.column)) for f in Job._meta.concrete_fields}
    table, turn = quote(Job._meta.db_table), n["fair_at"]
    fair = f"{n['state']} = %s AND {turn} IS NOT NULL"
    last = f"SELECT {turn} FROM {table} WHERE {fair} AND {n['fair_key']} = %s AND {n['queue']} = %s"
    first = f"SELECT {turn} FROM {table} WHERE {fair} AND {n['queue']} = %s AND {n['run_after']} <= %s"
    return f"SELECT ({last} ORDER BY {turn} DESC LIMIT 1), ({first} ORDER BY {turn} LIMIT 1)"


def _datetime(connection: BaseDatabaseWrapper, value: Any) -> datetime | None:
    """A ``fair_at`` value as the ORM would load it (SQLite returns text, MySQL naive UTC)."""
    if value is None:
        return None
    field = Job._meta.get_field("fair_at")
    column = field.get_col(Job._meta.db_table)
    for convert in connection.ops.get_db_converters(column) + field.get_db_converters(connection):
        value = convert(value, column, connection)
    assert isinstance(value, datetime)
    return value
