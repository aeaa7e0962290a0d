"""Turning calls of a job function into ``Job`` rows, checked before anything is written."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from vellum_jobs import wakeup
from vellum_jobs.conf import conf, parse_duration
from vellum_jobs.models import Job, reference_of
from vellum_jobs.payload import normalise_call

if TYPE_CHECKING:
    from vellum_jobs.registry import JobFunction


def enqueue_calls(
    function: JobFunction[Any, Any],
    calls: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    *,
    columns: Mapping[str, Any] | None = None,
) -> list[Job]:
    """Insert one queued job per (args, kwargs) call; all are checked before any is written.

    ``columns`` sets further fields on every row (the Tasks backend marks its jobs).
    """
    options = function.options
    now = timezone.now()
    ref_type, ref_id = reference_of(options.ref) if options.ref is not None else (None, "")
    # Every column of the new rows, in model order; only args and kwargs vary per call.
    row = {
        "name": function.name,
        "queue": options.queue,
        "priority": options.priority,
        "state": Job.State.QUEUED,
        "attempts": 0,
        "max_attempts": options.max_attempts or conf.max_attempts,
        "timeout": None if options.timeout is None else parse_duration(options.timeout),
        "run_after": _run_after(options.run_after, options.delay, now),
        "created_at": now,
        "error": "",
        "progress_message": "",
        "ref_type_id": ref_type.pk if ref_type is not None else None,
        "ref_id": ref_id,
        "task_backend": "",
        "task_runs": [],
        **(columns or {}),
    }
    normalised = [normalise_call(function.name, args, kwargs) for args, kwargs in calls]
    if not normalised:
        return []
    varying = [_varying(function, args, kwargs) for args, kwargs in normalised]
    alias = router.db_for_write(Job) or DEFAULT_DB_ALIAS
    ids = insert(connections[alias], row, varying)
    return [_instance(alias, row, pk, values) for pk, values in zip(ids, varying, strict=True)]


def _varying(function: JobFunction[Any, Any], args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The columns that differ from call to call: the arguments and the concurrency key."""
    key, limit = function.concurrency_for(args, kwargs)
    return {"args": args, "kwargs": kwargs, "concurrency_key": key, "concurrency_limit": limit}


def _instance(alias: str, row: dict[str, Any], pk: int, varying: dict[str, Any]) -> Job:
    values = {**row, **varying, "id": pk}
    return Job.from_db(alias, _ATTNAMES, [values.get(name) for name in _ATTNAMES])


_ATTNAMES = [f.attname for f in Job._meta.concrete_fields]
_COLUMNS = {f.attname: str(f.column) for f in Job._meta.concrete_fields}
# Columns an enqueue writes; the nullable rest start NULL.
_INSERTED = [
    "name", "queue", "priority", "args", "kwargs", "state", "attempts", "max_attempts", "timeout",
    "run_after", "created_at", "error", "progress_message", "ref_type_id", "ref_id", "task_backend",
    "task_runs", "concurrency_key", "concurrency_limit",
]  # fmt: skip


def insert(connection: BaseDatabaseWrapper, row: dict[str, Any], calls: list[dict[str, Any]]) -> list[int]:
    """INSERT the rows (``row`` with each call's columns), in as few statements as the
    database's parameter limit allows; returns their ids.

    Raw SQL because the ORM's per-object work cost more than the insert. On
    PostgreSQL the statement also sends the NOTIFY that wakes idle workers;
    sent inside the enqueue's transaction, it is delivered when that commits.
    """
    ops = connection.ops
    prepared = {
        **row,
        "run_after": ops.adapt_datetimefield_value(row["run_after"]),
        "created_at": ops.adapt_datetimefield_value(row["created_at"]),
        "task_runs": ops.adapt_json_value(row["task_runs"], None),
    }
    params_per_row = []
    for call in calls:
        prepared.update(call)
        prepared["args"] = ops.adapt_json_value(call["args"], None)
        prepared["kwargs"] = ops.adapt_json_value(call["kwargs"], None)
        params_per_row.append([prepared[name] for name in _INSERTED])
    queue = str(row["queue"])
    if not connection.features.can_return_rows_from_bulk_insert:
        batches = [[params] for params in params_per_row]  # MySQL: one row per statement, lastrowid
    else:
        size = max(1, _max_params(connection) // len(_INSERTED))
        batches = [params_per_row[i : i + size] for i in range(0, len(params_per_row), size)]
    if len(batches) == 1:
        return _insert_batch(connection, batches[0], queue)
    with transaction.atomic(using=connection.alias, savepoint=False):
        return [pk for batch in batches for pk in _insert_batch(connection, batch, queue)]


def _insert_batch(connection: BaseDatabaseWrapper, rows: list[list[Any]], queue: str) -> list[int]:
    params = [value for row in rows for value in row]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(_statement(connection, len(rows)), [*params, wakeup.channel(), queue])
            return [r[0] for r in cursor.fetchall()]
        cursor.execute(_statement(connection, len(rows)), params)
        if connection.features.can_return_rows_from_bulk_insert:
            return [r[0] for r in cursor.fetchall()]
        return [int(cursor.lastrowid)]


_statements: dict[tuple[str, int], str] = {}


def _statement(connection: BaseDatabaseWrapper, count: int) -> str:
    """The INSERT of ``count`` rows for this vendor, built once."""
    key = (connection.vendor, count)
    if key in _statements:
        return _statements[key]
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    columns = ", ".join(quote(_COLUMNS[name]) for name in _INSERTED)
    one_row = "(" + ", ".join(["%s"] * len(_INSERTED)) + ")"
    sql = f"INSERT INTO {table} ({columns}) VALUES {', '.join([one_row] * count)}"
    pk = quote("id")
    if connection.vendor == "postgresql":
        # One round trip for the rows and the wakeup: the uncorrelated
        # subquery runs pg_notify once, however many rows there are.
        sql = (
            f"WITH inserted AS ({sql} RETURNING {pk}) SELECT inserted.{pk} FROM inserted "
            "CROSS JOIN (SELECT pg_notify(%s, %s)) AS notified"
        )
    elif connection.features.can_return_rows_from_bulk_insert:
        sql = f"{sql} RETURNING {pk}"
    if count <= 16:  # enqueue() and small batches repeat; big ones rarely do
        _statements[key] = sql
    return sql


def _max_params(connection: BaseDatabaseWrapper) -> int:
    """How many parameters one statement may carry."""
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        return int(connection.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))
    return 65535


def _run_after(run_after: datetime | None, delay: float | timedelta | None, now: datetime) -> datetime:
    if delay is not None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        if seconds < 0:
            raise ValueError(f"delay must not be negative, got {delay!r}")
        return now + timedelta(seconds=seconds)
    if run_after is None:
        return now
    if not isinstance(run_after, datetime):
        raise ValueError(f"run_after must be a datetime, got {run_after!r}")
    if conf.use_tz and timezone.is_naive(run_after):
        raise ValueError(
            f"run_after {run_after.isoformat()} is naive but USE_TZ is True: "
            "pass an aware datetime (e.g. timezone.now() + timedelta(...))"
        )
    if not conf.use_tz and timezone.is_aware(run_after):
        return timezone.make_naive(run_after)
    return run_after
