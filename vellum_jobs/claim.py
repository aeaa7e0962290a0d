"""The claim: one atomic statement per database vendor that hands due jobs to a worker.

Each vendor gets the cheapest statement that cannot give one job to two
workers. Values are always parameters; identifiers come from the model's
``_meta`` and are quoted by the connection. ``now`` is passed in, so the
clock is the caller's (and a test's) to choose.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs.models import Job

# The columns a worker needs to run a job, in model order (``Job.from_db``
# wants them that way); the rest load lazily if a handler asks for them.
RETURNED = [
    f
    for f in Job._meta.concrete_fields
    if f.attname
    in {
        "id",
        "name",
        "queue",
        "priority",
        "args",
        "kwargs",
        "attempts",
        "max_attempts",
        "run_after",
        "created_at",
        "started_at",
        "worker_id",
        "lease_expires_at",
        "ref_type_id",
        "ref_id",
    }
]


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
    statement = _CLAIMS[connection.vendor]
    rows = statement(connection, request)
    jobs = [_job_from_row(connection, row) for row in rows]
    jobs.sort(key=lambda j: (-j.priority, j.run_after, j.pk))
    return jobs


@lru_cache(maxsize=8)
def _quoted_names(vendor: str, quote: Callable[[str], str]) -> dict[str, str]:
    names = {f.attname: quote(str(f.column)) for f in Job._meta.concrete_fields}
    names["table"] = quote(Job._meta.db_table)
    names["returned"] = ", ".join(quote(str(f.column)) for f in RETURNED)
    return names


def _names(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """Quoted column names by attname, plus the table and the returned column list."""
    return _quoted_names(connection.vendor, connection.ops.quote_name)


def _set_running(connection: BaseDatabaseWrapper, request: ClaimRequest) -> tuple[str, list[Any]]:
    n = _names(connection)
    worker_id = Job._meta.get_field("worker_id").get_db_prep_value(request.worker_id, connection)
    adapt = connection.ops.adapt_datetimefield_value
    sql = (
        f"{n['state']} = %s, {n['attempts']} = {n['attempts']} + 1, "
        f"{n['worker_id']} = %s, {n['lease_expires_at']} = %s, {n['started_at']} = %s, "
        f"{n['progress_done']} = NULL, {n['progress_total']} = NULL, {n['progress_message']} = ''"
    )
    return sql, [Job.State.RUNNING, worker_id, adapt(request.lease_until), adapt(request.now)]


def candidates(connection: BaseDatabaseWrapper, request: ClaimRequest) -> tuple[str, list[Any]]:
    """The claim's candidate scan as a plain SELECT (for EXPLAIN in tests and benchmarks)."""
    n = _names(connection)
    due_sql, due_params = _due(connection, request, array=connection.vendor == "postgresql")
    return f"SELECT {n['id']} FROM {n['table']} {due_sql}", due_params


def _due(
    connection: BaseDatabaseWrapper, request: ClaimRequest, *, array: bool = False
) -> tuple[str, list[Any]]:
    """The WHERE, ORDER BY and LIMIT of the candidate scan (served by ``vellum_job_claim``)."""
    n = _names(connection)
    where = f"{n['state']} = %s AND {n['run_after']} <= %s"
    params: list[Any] = [Job.State.QUEUED, connection.ops.adapt_datetimefield_value(request.now)]
    if request.queues and array:
        where += f" AND {n['queue']} = ANY(%s)"
        params.append(list(request.queues))
    elif request.queues:
        where += f" AND {n['queue']} IN ({', '.join(['%s'] * len(request.queues))})"
        params.extend(request.queues)
    order = f"{n['priority']} DESC, {n['run_after']}, {n['id']}"
    return f"WHERE {where} ORDER BY {order} LIMIT %s", [*params, request.limit]


def _claim_sqlite(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[tuple[Any, ...]]:
    # One autocommit statement: SQLite takes the write lock before it reads,
    # so the busy timeout applies and no other writer can interleave. (A
    # read-then-write transaction would get SQLITE_BUSY with no waiting.)
    n = _names(connection)
    set_sql, set_params = _set_running(connection, request)
    due_sql, due_params = _due(connection, request)
    sql = (
        f"UPDATE {n['table']} SET {set_sql} WHERE {n['id']} IN "
        f"(SELECT {n['id']} FROM {n['table']} {due_sql}) RETURNING {n['returned']}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*set_params, *due_params])
        return list(cursor.fetchall())


def _claim_postgresql(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[tuple[Any, ...]]:
    # SKIP LOCKED lets concurrent claimers pass over each other's rows instead
    # of queueing behind them. MATERIALIZED keeps the LIMIT a fence: inlined,
    # the planner may re-run the subquery and update more rows than asked.
    # FOR NO KEY UPDATE does not block inserts of rows that reference the job.
    n = _names(connection)
    set_sql, set_params = _set_running(connection, request)
    due_sql, due_params = _due(connection, request, array=True)
    returned = ", ".join(f"{n['table']}.{c.strip()}" for c in n["returned"].split(","))
    sql = (
        f"WITH claimable AS MATERIALIZED (SELECT {n['id']} FROM {n['table']} {due_sql} "
        f"FOR NO KEY UPDATE SKIP LOCKED) "
        f"UPDATE {n['table']} SET {set_sql} FROM claimable "
        f"WHERE {n['table']}.{n['id']} = claimable.{n['id']} RETURNING {returned}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*due_params, *set_params])
        return list(cursor.fetchall())


def _claim_mysql(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[tuple[Any, ...]]:
    # No UPDATE ... RETURNING: lock the candidates with SKIP LOCKED, mark them,
    # read them back, all in one short transaction. The candidate scan runs
    # on the claim index, so only the scanned rows are locked.
    n = _names(connection)
    set_sql, set_params = _set_running(connection, request)
    due_sql, due_params = _due(connection, request)
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute(f"SELECT {n['id']} FROM {n['table']} {due_sql} FOR UPDATE SKIP LOCKED", due_params)
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return []
        marks = ", ".join(["%s"] * len(ids))
        cursor.execute(f"UPDATE {n['table']} SET {set_sql} WHERE {n['id']} IN ({marks})", [*set_params, *ids])
        cursor.execute(f"SELECT {n['returned']} FROM {n['table']} WHERE {n['id']} IN ({marks})", ids)
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


def _job_from_row(connection: BaseDatabaseWrapper, row: Sequence[Any]) -> Job:
    values = []
    for value, (col, converters) in zip(row, _converters(connection), strict=True):
        for convert in converters:
            value = convert(value, col, connection)
        values.append(value)
    job = Job.from_db(connection.alias, [f.attname for f in RETURNED], values)
    # Known after the claim without asking the database (and a deferred
    # field would cost a query on first access).
    job.state = Job.State.RUNNING
    job.progress_done = job.progress_total = None
    job.progress_message = ""
    return job
