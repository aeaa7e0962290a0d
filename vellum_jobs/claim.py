"""The claim: one atomic statement per database vendor that hands due jobs to a worker.

Each vendor gets the cheapest statement that cannot give one job to two
workers. Values are always parameters; identifiers come from the model's
``_meta`` and are quoted by the connection. ``now`` is passed in, so the
clock is the caller's (and a test's) to choose. Statements are built once
per vendor and queue count, and run on the driver's cursor (see ``db``).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import signals as model_signals
from django.db.models.base import ModelState

from vellum_jobs import db
from vellum_jobs.models import Job

# The columns a worker needs to run a job, in model order (``Job.from_db``
# wants them that way). The claim's own values (state, worker, lease, start)
# are filled in from the request; the rest load lazily if a handler asks.
RETURNED = [
    f
    for f in Job._meta.concrete_fields
    if f.attname
    in {"id", "name", "queue", "priority", "args", "kwargs", "attempts", "max_attempts", "timeout",
        "run_after", "ref_type_id", "ref_id"}
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ClaimRequest:
    worker_id: uuid.UUID
    limit: int
    now: datetime
    lease_until: datetime
    queues: Sequence[str] = ()


def claim(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Job]:
    """Mark up to ``limit`` due jobs running for ``worker_id`` and return them in claim order.

    Order: highest priority, then earliest ``run_after``, then id. ``attempts``
    grows by one, so a run that dies with its process still counts.
    """
    if request.limit < 1:
        return []
    rows = _CLAIMS[connection.vendor](connection, request)
    jobs = [_job_from_row(connection, row, request) for row in rows]
    jobs.sort(key=lambda j: (-j.priority, j.run_after, j.pk))
    return jobs


def candidates(connection: BaseDatabaseWrapper, request: ClaimRequest) -> tuple[str, list[Any]]:
    """The claim's candidate scan as a plain SELECT with ``%s`` placeholders (for EXPLAIN)."""
    n = _names(connection)
    return f"SELECT {n['id']} FROM {n['table']} {_due_sql(connection, len(request.queues))}", _due_params(
        connection, request
    )


@lru_cache(maxsize=8)
def _quoted_names(vendor: str, quote: Callable[[str], str]) -> dict[str, str]:
    names = {f.attname: quote(str(f.column)) for f in Job._meta.concrete_fields}
    names["table"] = quote(Job._meta.db_table)
    names["returned"] = ", ".join(quote(str(f.column)) for f in RETURNED)
    return names


def _names(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """Quoted column names by attname, plus the table and the returned column list."""
    return _quoted_names(connection.vendor, connection.ops.quote_name)


def _set_running_sql(connection: BaseDatabaseWrapper) -> str:
    n = _names(connection)
    return (
        f"{n['state']} = %s, {n['attempts']} = {n['attempts']} + 1, "
        f"{n['worker_id']} = %s, {n['lease_expires_at']} = %s, {n['started_at']} = %s, "
        f"{n['progress_done']} = NULL, {n['progress_total']} = NULL, {n['progress_message']} = ''"
    )


def _set_running_params(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Any]:
    worker_id = Job._meta.get_field("worker_id").get_db_prep_value(request.worker_id, connection)
    adapt = connection.ops.adapt_datetimefield_value
    return [Job.State.RUNNING, worker_id, adapt(request.lease_until), adapt(request.now)]


def _due_sql(connection: BaseDatabaseWrapper, queue_count: int) -> str:
    """The WHERE, ORDER BY and LIMIT of the candidate scan (served by ``vellum_job_claim``)."""
    n = _names(connection)
    where = f"{n['state']} = %s AND {n['run_after']} <= %s"
    if queue_count and connection.vendor == "postgresql":
        where += f" AND {n['queue']} = ANY(%s)"
    elif queue_count:
        where += f" AND {n['queue']} IN ({', '.join(['%s'] * queue_count)})"
    order = f"{n['priority']} DESC, {n['run_after']}, {n['id']}"
    return f"WHERE {where} ORDER BY {order} LIMIT %s"


def _due_params(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Any]:
    params: list[Any] = [Job.State.QUEUED, connection.ops.adapt_datetimefield_value(request.now)]
    if request.queues and connection.vendor == "postgresql":
        params.append(list(request.queues))
    else:
        params.extend(request.queues)
    return [*params, request.limit]


_statements: dict[tuple[str, int], str] = {}


def _statement(
    connection: BaseDatabaseWrapper, queue_count: int, build: Callable[[BaseDatabaseWrapper, int], str]
) -> str:
    """The claim statement for this vendor and number of queues, built on first use."""
    key = (connection.vendor, queue_count)
    if key not in _statements:
        _statements[key] = db.driver_sql(connection, build(connection, queue_count))
    return _statements[key]


def _sqlite_statement(connection: BaseDatabaseWrapper, queue_count: int) -> str:
    n = _names(connection)
    return (
        f"UPDATE {n['table']} SET {_set_running_sql(connection)} WHERE {n['id']} IN "
        f"(SELECT {n['id']} FROM {n['table']} {_due_sql(connection, queue_count)}) "
        f"RETURNING {n['returned']}"
    )


def _claim_sqlite(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[tuple[Any, ...]]:
    # One autocommit statement: SQLite takes the write lock before it reads,
    # so the busy timeout applies and no other writer can interleave. (A
    # read-then-write transaction would get SQLITE_BUSY with no waiting.)
    params = [*_set_running_params(connection, request), *_due_params(connection, request)]
    cursor = db.execute(connection, _statement(connection, len(request.queues), _sqlite_statement), params)
    with connection.wrap_database_errors:
        return list(cursor.fetchall())


def _postgresql_statement(connection: BaseDatabaseWrapper, queue_count: int) -> str:
    # SKIP LOCKED lets concurrent claimers pass over each other's rows instead
    # of queueing behind them. MATERIALIZED keeps the LIMIT a fence: inlined,
    # the planner may re-run the subquery and update more rows than asked.
    # FOR NO KEY UPDATE does not block inserts of rows that reference the job.
    n = _names(connection)
    returned = ", ".join(f"{n['table']}.{column.strip()}" for column in n["returned"].split(","))
    return (
        f"WITH claimable AS MATERIALIZED (SELECT {n['id']} FROM {n['table']} "
        f"{_due_sql(connection, queue_count)} FOR NO KEY UPDATE SKIP LOCKED) "
        f"UPDATE {n['table']} SET {_set_running_sql(connection)} FROM claimable "
        f"WHERE {n['table']}.{n['id']} = claimable.{n['id']} RETURNING {returned}"
    )


def _claim_postgresql(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[tuple[Any, ...]]:
    params = [*_due_params(connection, request), *_set_running_params(connection, request)]
    cursor = db.execute(
        connection, _statement(connection, len(request.queues), _postgresql_statement), params
    )
    with connection.wrap_database_errors:
        return list(cursor.fetchall())


def _claim_mysql(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[tuple[Any, ...]]:
    # No UPDATE ... RETURNING: lock the candidates with SKIP LOCKED, mark them,
    # read them back, all in one short transaction. The candidate scan runs
    # on the claim index, so only the scanned rows are locked.
    n = _names(connection)
    with db.short_transaction(connection):
        cursor = db.execute(
            connection,
            f"SELECT {n['id']} FROM {n['table']} {_due_sql(connection, len(request.queues))} "
            "FOR UPDATE SKIP LOCKED",
            _due_params(connection, request),
        )
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return []
        marks = ", ".join(["%s"] * len(ids))
        db.execute(
            connection,
            f"UPDATE {n['table']} SET {_set_running_sql(connection)} WHERE {n['id']} IN ({marks})",
            [*_set_running_params(connection, request), *ids],
        )
        cursor = db.execute(
            connection, f"SELECT {n['returned']} FROM {n['table']} WHERE {n['id']} IN ({marks})", ids
        )
        return list(cursor.fetchall())


_CLAIMS: dict[str, Callable[[BaseDatabaseWrapper, ClaimRequest], list[tuple[Any, ...]]]] = {
    "sqlite": _claim_sqlite,
    "postgresql": _claim_postgresql,
    "mysql": _claim_mysql,
}

_converters_cache: dict[str, list[tuple[Any, list[Callable[..., Any]]]]] = {}


def _converters(connection: BaseDatabaseWrapper) -> list[tuple[Any, list[Callable[..., Any]]]]:
    """The same converters the ORM applies to a SELECT of the returned columns."""
    converters = _converters_cache.get(connection.vendor)
    if converters is None:
        converters = []
        for field in RETURNED:
            col = field.get_col(Job._meta.db_table)
            found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            converters.append((col, found))
        _converters_cache[connection.vendor] = converters
    return converters


_RETURNED_NAMES = [f.attname for f in RETURNED]


def _job_from_row(connection: BaseDatabaseWrapper, row: Sequence[Any], request: ClaimRequest) -> Job:
    values = []
    for value, (col, converters) in zip(row, _converters(connection), strict=True):
        for convert in converters:
            value = convert(value, col, connection)
        values.append(value)
    job = _instance(connection.alias, values)
    # What the claim wrote, known without asking the database (a deferred
    # field would cost a query on first access).
    job.state = Job.State.RUNNING
    job.worker_id = request.worker_id
    job.started_at = request.now
    job.lease_expires_at = request.lease_until
    job.progress_done = job.progress_total = None
    job.progress_message = ""
    return job


def _instance(alias: str, values: list[Any]) -> Job:
    """``Job.from_db(alias, _RETURNED_NAMES, values)``, without ``Model.__init__``'s per-field work.

    It ran once per claimed job and cost the dispatcher more than the claim
    statement. The columns not returned stay deferred, as with ``from_db``.
    ``__init__`` is still used when a ``pre_init``/``post_init`` receiver
    listens for Job, the one thing it adds here.
    """
    if model_signals.pre_init.has_listeners(Job) or model_signals.post_init.has_listeners(Job):
        return Job.from_db(alias, _RETURNED_NAMES, values)
    job = Job.__new__(Job)
    job.__dict__.update(zip(_RETURNED_NAMES, values, strict=True))
    job._state = ModelState()
    job._state.adding = False
    job._state.db = alias
    return job
