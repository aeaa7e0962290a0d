"""The INSERT that stores new jobs: one statement per vendor and row count, built once.

Raw SQL because the ORM's per-object work cost more than the insert. On
PostgreSQL the same statement sends the NOTIFY that wakes idle workers
(``pg_notify`` in it): one round trip, and since NOTIFY is transactional
it is delivered when the enqueue's transaction commits, whether that is
the statement's own autocommit or the caller's ``atomic()`` block.

Statements run on the driver's cursor (``db.execute_as_django``): Django's
wrapper cost about as much as the INSERT of one job. Many jobs travel as one parameter
on SQLite and PostgreSQL (``_insert_set``).
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs import db, wakeup
from vellum_jobs.models import Job

Call = tuple[list[Any], dict[str, Any]]

COLUMNS = {f.attname: str(f.column) for f in Job._meta.concrete_fields}
# Columns an enqueue writes; the nullable rest start NULL.
INSERTED = [
    "name", "queue", "priority", "args", "kwargs", "state", "attempts", "max_attempts", "timeout",
    "run_after", "created_at", "error", "progress_message", "ref_type_id", "ref_id", "task_backend",
    "task_runs", "unique_key", "unique_while", "schedule", "scheduled_for", "concurrency_key",
    "concurrency_limit",
]  # fmt: skip
_DATETIMES = ("run_after", "created_at", "scheduled_for")
# The most parameters MySQL and MariaDB take in one statement (the VALUES
# lists of a bulk insert there; SQLite and PostgreSQL send one parameter).
MAX_PARAMS = 65535
_JSON = ("args", "kwargs", "task_runs")


def insert(connection: BaseDatabaseWrapper, row: dict[str, Any], calls: list[Call]) -> list[int]:
    """INSERT the rows (``row`` with each call's arguments); returns their ids in call order."""
    if connection.vendor in ("postgresql", "sqlite"):
        return _insert_set(connection, row, calls)
    # MySQL and MariaDB.
    params_per_row = [_params(connection, row, args, kwargs) for args, kwargs in calls]
    if not connection.features.can_return_rows_from_bulk_insert:
        batches = [[params] for params in params_per_row]  # MySQL: one row per statement, lastrowid
    else:
        size = max(1, MAX_PARAMS // len(INSERTED))
        batches = [params_per_row[i : i + size] for i in range(0, len(params_per_row), size)]
    if len(batches) == 1:
        return _insert_batch(connection, batches[0])
    with transaction.atomic(using=connection.alias, savepoint=False):
        return [pk for batch in batches for pk in _insert_batch(connection, batch)]


def insert_one(connection: BaseDatabaseWrapper, row: dict[str, Any], args: Any, kwargs: Any) -> int:
    """INSERT one job; returns its id. ``args`` and ``kwargs`` may come as JSON text already."""
    params = _params(connection, row, args, kwargs)
    if connection.vendor == "postgresql":
        params += [wakeup.channel(), row["queue"]]
    sql = _statement(connection, 1)
    if connection.vendor == "postgresql":
        return int(db.execute_as_django(connection, sql, params, lambda cursor: cursor.fetchone()[0]))
    return db.execute_as_django(connection, sql, params, lambda cursor: int(cursor.lastrowid))


def _params(connection: BaseDatabaseWrapper, row: dict[str, Any], args: Any, kwargs: Any) -> list[Any]:
    """One row's parameters in ``INSERTED`` order, adapted for ``connection``; JSON as text.

    The JSON columns take text (``json.dumps``, what Django's JSONField writes),
    so an enqueue encodes each value once, having measured it already.
    """
    ops = connection.ops
    values = {**row, "args": args, "kwargs": kwargs}
    for name in _JSON:
        if not isinstance(values[name], str):
            values[name] = json.dumps(values[name])
    adapted = ops.adapt_datetimefield_value(values["created_at"])
    # Usually one instant: adapting a datetime is the dearer part on SQLite and MySQL.
    values["run_after"] = (
        adapted
        if values["run_after"] is values["created_at"]
        else ops.adapt_datetimefield_value(values["run_after"])
    )
    values["created_at"] = adapted
    if values["scheduled_for"] is not None:
        values["scheduled_for"] = ops.adapt_datetimefield_value(values["scheduled_for"])
    return [values[name] for name in INSERTED]


def _insert_batch(connection: BaseDatabaseWrapper, rows: list[list[Any]]) -> list[int]:
    params = [value for row in rows for value in row]
    sql = _statement(connection, len(rows))
    if len(rows) > 1:
        return db.execute_as_django(connection, sql, params, lambda cursor: [r[0] for r in cursor.fetchall()])
    return [db.execute_as_django(connection, sql, params, lambda cursor: int(cursor.lastrowid))]


def _insert_set(connection: BaseDatabaseWrapper, row: dict[str, Any], calls: list[Call]) -> list[int]:
    """The bulk INSERT of SQLite and PostgreSQL: the varying columns in one parameter, the rest once.

    A VALUES list of thousands of rows is tens of thousands of placeholders,
    which the driver parses (and Django rewrites, on SQLite) on every call,
    at more cost than the insert itself. Here the arguments travel as one
    JSON document (SQLite, read with ``json_each``) or two arrays
    (PostgreSQL, read with ``unnest``), however many rows there are.
    """
    ops = connection.ops
    constants = [
        ops.adapt_datetimefield_value(row[name]) if name in _DATETIMES
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


_CONSTANT = [name for name in INSERTED if name not in ("args", "kwargs")]
_set_statements: dict[str, str] = {}


def _set_statement(connection: BaseDatabaseWrapper) -> str:
    if connection.vendor in _set_statements:
        return _set_statements[connection.vendor]
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    columns = ", ".join(quote(COLUMNS[name]) for name in [*_CONSTANT, "args", "kwargs"])
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
    columns = ", ".join(quote(COLUMNS[name]) for name in INSERTED)
    # JSON arrives as text; PostgreSQL's jsonb takes it through a cast.
    json_value = "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"
    one_row = "(" + ", ".join(json_value if name in _JSON else "%s" for name in INSERTED) + ")"
    sql = f"INSERT INTO {table} ({columns}) VALUES {', '.join([one_row] * count)}"
    pk = quote("id")
    if connection.vendor == "postgresql":
        # The wakeup rides in the INSERT: RETURNING runs pg_notify for the
        # one row, no second statement, no CTE for the planner to build.
        assert count == 1, "PostgreSQL inserts many rows with _insert_set"
        sql = f"{sql} RETURNING {pk}, pg_notify(%s, %s)"
    elif count > 1:
        # MariaDB's bulk insert. One row needs no RETURNING: the driver
        # reports its id (lastrowid), which spares SQLite the RETURNING's
        # work table.
        sql = f"{sql} RETURNING {pk}"
    if count <= 16:  # enqueue() and small batches repeat; big ones rarely do
        _statements[key] = sql
    return sql
