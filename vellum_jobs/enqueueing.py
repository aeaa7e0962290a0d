"""Turning calls of a job function into ``Job`` rows, checked before anything is written."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import signals
from django.db.models.base import ModelState
from django.utils import timezone

from vellum_jobs import inline, uniqueness, wakeup
from vellum_jobs.conf import conf, parse_duration
from vellum_jobs.models import Job, reference_of
from vellum_jobs.payload import check_sizes, normalise_call

if TYPE_CHECKING:
    from vellum_jobs.handlers import Handler


def enqueue_calls(
    function: Handler[Any, Any],
    calls: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    *,
    columns: Mapping[str, Any] | None = None,
) -> list[Job]:
    """Insert one queued job per (args, kwargs) call; all are checked before any is written.

    ``columns`` sets further fields on every row (the Tasks backend marks its jobs,
    schedules theirs). A unique job whose key another job holds is not inserted:
    that job is returned in its place (see ``vellum_jobs.uniqueness``).
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
        "claims": 0,  # not inserted: the column's database default, here for the returned instances
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
        "unique_key": None,
        "unique_while": "",
        "schedule": "",
        "scheduled_for": None,
        "concurrency_key": "",
        "concurrency_limit": 0,
        **(columns or {}),
    }
    normalised = [normalise_call(function.name, args, kwargs) for args, kwargs in calls]
    if not normalised:
        return []
    check_sizes(function.name, normalised)
    alias = router.db_for_write(Job) or DEFAULT_DB_ALIAS
    if options.unique_key is None and not options.limited:
        jobs = _instances(alias, row, insert(connections[alias], row, normalised), normalised)
        new = jobs
    else:
        # Columns that depend on each call's arguments: one INSERT per call.
        with transaction.atomic(using=alias) if len(calls) > 1 else nullcontext():
            pairs = [
                _enqueue_one(alias, row, function, raw, call)
                for raw, call in zip(calls, normalised, strict=True)
            ]
        jobs = [job for job, _ in pairs]
        new = [job for job, created in pairs if created]
    if inline.enabled():
        inline.run_now(new)
    return jobs


def _enqueue_one(
    alias: str,
    row: dict[str, Any],
    function: Handler[Any, Any],
    raw: tuple[Sequence[Any], Mapping[str, Any]],
    call: tuple[list[Any], dict[str, Any]],
) -> tuple[Job, bool]:
    """One call of a job with a unique or concurrency key: inserted, or the job that holds its unique key."""
    options = function.options
    args, kwargs = call
    concurrency_key, limit = function.concurrency_for(args, kwargs)
    row = {**row, "concurrency_key": concurrency_key, "concurrency_limit": limit}
    key = uniqueness.key_for(options, *raw) if options.unique_key is not None else None
    if key is None:  # not unique, or the key function opted this call out
        return _instance(alias, row, insert(connections[alias], row, [call])[0], args, kwargs), True
    keyed = {**row, "unique_key": key, "unique_while": options.unique_while}

    def insert_one() -> Job:
        return _instance(alias, keyed, insert(connections[alias], keyed, [call])[0], args, kwargs)

    return uniqueness.enqueue(
        alias, insert_one, key=key, options=options, args=args, kwargs=kwargs, run_after=row["run_after"]
    )


def _instance(alias: str, row: dict[str, Any], pk: int, args: list[Any], kwargs: dict[str, Any]) -> Job:
    values = {**row, "id": pk, "args": args, "kwargs": kwargs}
    return Job.from_db(alias, _ATTNAMES, [values.get(name) for name in _ATTNAMES])


def _instances(
    alias: str, row: dict[str, Any], ids: list[int], calls: list[tuple[list[Any], dict[str, Any]]]
) -> list[Job]:
    """What ``Job.from_db`` would build, without ``Model.__init__``'s per-field work.

    For ``enqueue_many`` of many jobs, building instances field by field cost
    more than inserting the rows. Only used when no ``pre_init``/``post_init``
    receiver listens for Job, the one thing ``__init__`` adds here.
    """
    if signals.pre_init.has_listeners(Job) or signals.post_init.has_listeners(Job):
        return [
            _instance(alias, row, pk, args, kwargs) for pk, (args, kwargs) in zip(ids, calls, strict=True)
        ]
    base = {name: row.get(name) for name in _ATTNAMES}
    jobs = []
    for pk, (args, kwargs) in zip(ids, calls, strict=True):
        state = ModelState()
        state.adding = False
        state.db = alias
        job = Job.__new__(Job)
        job.__dict__ = {**base, "id": pk, "args": args, "kwargs": kwargs, "_state": state}
        jobs.append(job)
    return jobs


_ATTNAMES = [f.attname for f in Job._meta.concrete_fields]
_COLUMNS = {f.attname: str(f.column) for f in Job._meta.concrete_fields}
# Columns an enqueue writes; the nullable rest start NULL.
_INSERTED = [
    "name", "queue", "priority", "args", "kwargs", "state", "attempts", "max_attempts", "timeout",
    "run_after", "created_at", "error", "progress_message", "ref_type_id", "ref_id", "task_backend",
    "task_runs", "unique_key", "unique_while", "schedule", "scheduled_for", "concurrency_key",
    "concurrency_limit",
]  # fmt: skip


def insert(
    connection: BaseDatabaseWrapper, row: dict[str, Any], calls: list[tuple[list[Any], dict[str, Any]]]
) -> list[int]:
    """INSERT the rows (``row`` with each call's arguments); returns their ids.

    Raw SQL because the ORM's per-object work cost more than the insert. On
    PostgreSQL the statement also sends the NOTIFY that wakes idle workers;
    sent inside the enqueue's transaction, it is delivered when that commits.
    """
    if connection.vendor in ("postgresql", "sqlite") and len(calls) > 1:
        return _insert_set(connection, row, calls)
    ops = connection.ops
    prepared = {
        **row,
        "run_after": ops.adapt_datetimefield_value(row["run_after"]),
        "created_at": ops.adapt_datetimefield_value(row["created_at"]),
        "scheduled_for": ops.adapt_datetimefield_value(row["scheduled_for"]),
        "task_runs": ops.adapt_json_value(row["task_runs"], None),
    }
    params_per_row = []
    for args, kwargs in calls:
        prepared["args"] = ops.adapt_json_value(args, None)
        prepared["kwargs"] = ops.adapt_json_value(kwargs, None)
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


def _insert_set(
    connection: BaseDatabaseWrapper, row: dict[str, Any], calls: list[tuple[list[Any], dict[str, Any]]]
) -> list[int]:
    """The bulk INSERT of SQLite and PostgreSQL: the varying columns in one parameter, the rest once.

    A VALUES list of thousands of rows is tens of thousands of placeholders,
    which the driver parses (and Django rewrites, on SQLite) on every call,
    at more cost than the insert itself. Here the arguments travel as one
    JSON document (SQLite, read with ``json_each``) or two arrays
    (PostgreSQL, read with ``unnest``), however many rows there are.
    """
    ops = connection.ops
    constants = [
        ops.adapt_datetimefield_value(row[name]) if name in ("run_after", "created_at", "scheduled_for")
        else ops.adapt_json_value(row[name], None) if name == "task_runs"
        else row[name]
        for name in _CONSTANT
    ]  # fmt: skip
    if connection.vendor == "postgresql":
        args = [json.dumps(call_args) for call_args, _ in calls]
        kwargs = [json.dumps(call_kwargs) for _, call_kwargs in calls]
        params = [*constants, args, kwargs, wakeup.channel(), str(row["queue"])]
    else:
        params = [*constants, json.dumps(calls)]
    with connection.cursor() as cursor:
        cursor.execute(_set_statement(connection), params)
        # One statement takes its ids in the order it inserts, which its
        # ORDER BY makes the order of the calls.
        return sorted(r[0] for r in cursor.fetchall())


_CONSTANT = [name for name in _INSERTED if name not in ("args", "kwargs")]
_set_statements: dict[str, str] = {}


def _set_statement(connection: BaseDatabaseWrapper) -> str:
    if connection.vendor in _set_statements:
        return _set_statements[connection.vendor]
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    columns = ", ".join(quote(_COLUMNS[name]) for name in [*_CONSTANT, "args", "kwargs"])
    pk = quote("id")
    if connection.vendor == "postgresql":
        fields = {f.attname: f for f in Job._meta.concrete_fields}
        # Typed: a bare parameter in a SELECT list would be text, which an
        # integer or timestamp column refuses.
        constants = ", ".join(f"CAST(%s AS {fields[name].db_type(connection)})" for name in _CONSTANT)
        sql = (
            f"WITH inserted AS (INSERT INTO {table} ({columns}) "
            f"SELECT {constants}, u.args::jsonb, u.kwargs::jsonb "
            "FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS u(args, kwargs, n) ORDER BY u.n "
            f"RETURNING {pk}) SELECT inserted.{pk} FROM inserted "
            "CROSS JOIN (SELECT pg_notify(%s, %s)) AS notified"
        )
    else:
        constants = ", ".join(["%s"] * len(_CONSTANT))
        # Each element of the document is one call's [args, kwargs]; an array
        # or object comes out of json_extract as JSON text, the column's form.
        sql = (
            f"INSERT INTO {table} ({columns}) "
            f"SELECT {constants}, json_extract(value, '$[0]'), json_extract(value, '$[1]') "
            f"FROM json_each(%s) ORDER BY key RETURNING {pk}"
        )
    _set_statements[connection.vendor] = sql
    return sql


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
