"""The fenced write: one conditional UPDATE that applies only while a worker still holds a job.

Every write after the claim goes through here. The WHERE clause names the
job, state ``running``, the owning worker and the attempt number; a worker
whose lease lapsed (and whose job another worker may now be running)
updates zero rows. The statement is raw SQL because it runs once per job:
building it through the ORM cost more than running it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs import db
from vellum_jobs.models import Job


def update_if_held(
    job: Job, worker_id: uuid.UUID, changes: Mapping[str, Any], *, refund_attempt: bool = False
) -> bool:
    """Apply ``changes`` to ``job``'s row if ``worker_id`` still holds this attempt; True if it did."""
    connection = connections[job._state.db or "default"]
    fields = tuple(changes)
    key = (connection.vendor, fields, refund_attempt)
    sql = _statements.get(key) or _statements.setdefault(key, _statement(connection, fields, refund_attempt))
    params = [_prep(connection, name, changes[name]) for name in fields]
    params += [job.pk, Job.State.RUNNING, _prep(connection, "worker_id", worker_id), job.attempts]
    return bool(db.execute(connection, sql, params).rowcount)


def _prep(connection: BaseDatabaseWrapper, name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in _DATETIMES:
        # What get_db_prep_save ends in, without its checks for expressions
        # and naive values: the worker only writes timezone.now() here.
        return connection.ops.adapt_datetimefield_value(value)
    return _FIELDS[name].get_db_prep_save(value, connection)


_FIELDS = {f.attname: f for f in Job._meta.concrete_fields}
_DATETIMES = {name for name, f in _FIELDS.items() if f.get_internal_type() == "DateTimeField"}
_statements: dict[tuple[Any, ...], str] = {}


def _statement(connection: BaseDatabaseWrapper, fields: tuple[str, ...], refund_attempt: bool) -> str:
    quote = connection.ops.quote_name
    column = {name: quote(str(f.column)) for name, f in _FIELDS.items()}
    sets = [f"{column[name]} = %s" for name in fields]
    if refund_attempt:
        sets.append(f"{column['attempts']} = {column['attempts']} - 1")
    return db.driver_sql(
        connection,
        f"UPDATE {quote(Job._meta.db_table)} SET {', '.join(sets)} "
        f"WHERE {column['id']} = %s AND {column['state']} = %s "
        f"AND {column['worker_id']} = %s AND {column['attempts']} = %s",
    )


def update_all_if_held(
    jobs: list[Job], worker_id: uuid.UUID, changes: list[Mapping[str, Any]], *, refund_attempt: bool = False
) -> set[int]:
    """``update_if_held`` for several jobs whose changes name the same columns, in one statement.

    Returns the ids of the rows it updated; each row is fenced on its own
    attempt, exactly as ``update_if_held`` would. The statement joins the
    table to a VALUES list of (id, attempt, new values...): one round trip
    instead of one per job, the larger part of a short job's cost on
    PostgreSQL. SQLite and PostgreSQL only (MySQL cannot say which rows an
    UPDATE touched).
    """
    connection = connections[jobs[0]._state.db or "default"]
    fields = tuple(changes[0])
    key = (connection.vendor, fields, refund_attempt, len(jobs))
    sql = _statements.get(key) or _statements.setdefault(
        key, _joined(connection, fields, refund_attempt, len(jobs))
    )
    params: list[Any] = []
    for job, values in zip(jobs, changes, strict=True):
        params += [job.pk, job.attempts, *(_prep(connection, name, values[name]) for name in fields)]
    params += [Job.State.RUNNING, _prep(connection, "worker_id", worker_id)]
    return {row[0] for row in db.execute(connection, sql, params).fetchall()}


def _joined(connection: BaseDatabaseWrapper, fields: tuple[str, ...], refund_attempt: bool, rows: int) -> str:
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    column = {name: f"{table}.{quote(str(f.column))}" for name, f in _FIELDS.items()}
    names = ["fence_id", "fence_attempts", *(f"new_{i}" for i in range(len(fields)))]
    sets = [f"{quote(str(_FIELDS[name].column))} = v.new_{i}" for i, name in enumerate(fields)]
    if refund_attempt:
        sets.append(f"{quote('attempts')} = {column['attempts']} - 1")
    if connection.vendor == "postgresql":
        # Typed, or PostgreSQL takes the VALUES columns for text.
        types = [_FIELDS[name].db_type(connection) for name in ("id", "attempts", *fields)]
        one_row = "(" + ", ".join(f"CAST(%s AS {t})" for t in types) + ")"
        values = f"(VALUES {', '.join([one_row] * rows)}) AS v({', '.join(names)})"
        head = f"UPDATE {table} SET {', '.join(sets)} FROM {values}"
    else:
        one_row = "(" + ", ".join(["%s"] * len(names)) + ")"
        head = (
            f"WITH v({', '.join(names)}) AS (VALUES {', '.join([one_row] * rows)}) "
            f"UPDATE {table} SET {', '.join(sets)} FROM v"
        )
    return db.driver_sql(
        connection,
        f"{head} WHERE {column['id']} = v.fence_id AND {column['state']} = %s "
        f"AND {column['worker_id']} = %s AND {column['attempts']} = v.fence_attempts "
        f"RETURNING {column['id']}",
    )


def renew_leases(
    connection: BaseDatabaseWrapper, worker_id: uuid.UUID, job_ids: list[int], until: Any
) -> int:
    """Extend the leases ``worker_id`` still holds on ``job_ids``; returns how many it extended.

    The dispatcher may be writing some of these rows' outcomes at this very
    moment. Waiting for those row locks invites a deadlock (two multi-row
    writers locking in different orders), and they need no renewal anyway:
    PostgreSQL skips locked rows; MySQL takes its locks in id order, the
    order outcomes are written in.
    """
    quote = connection.ops.quote_name
    column = {name: quote(str(f.column)) for name, f in _FIELDS.items()}
    table = quote(Job._meta.db_table)
    held = f"{column['state']} = %s AND {column['worker_id']} = %s"
    params: list[Any] = [Job.State.RUNNING, _prep(connection, "worker_id", worker_id)]
    until_value = _prep(connection, "lease_expires_at", until)
    if connection.vendor == "postgresql":
        sql = (
            f"UPDATE {table} SET {column['lease_expires_at']} = %s WHERE {column['id']} IN "
            f"(SELECT {column['id']} FROM {table} WHERE {column['id']} = ANY(%s) AND {held} "
            "FOR NO KEY UPDATE SKIP LOCKED)"
        )
        params = [until_value, list(job_ids), *params]
    else:
        marks = ", ".join(["%s"] * len(job_ids))
        order = f" ORDER BY {column['id']}" if connection.vendor == "mysql" else ""
        sql = (
            f"UPDATE {table} SET {column['lease_expires_at']} = %s "
            f"WHERE {column['id']} IN ({marks}) AND {held}{order}"
        )
        params = [until_value, *job_ids, *params]
    return int(db.execute(connection, db.driver_sql(connection, sql), params).rowcount)
