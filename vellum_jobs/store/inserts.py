"""The INSERT that stores new jobs: which columns an enqueue writes, and their values.

Raw SQL because the ORM's per-object work cost more than the insert. The
statements are the dialect's (``vellum_jobs.store.sql``), built once: on
PostgreSQL the INSERT also sends the NOTIFY that wakes idle workers (one
round trip, delivered when the enqueue's transaction commits, whether that
is the statement's own autocommit or the caller's ``atomic()`` block); many
jobs travel as one parameter on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs.store import sql

Call = tuple[list[Any], dict[str, Any]]

# Columns an enqueue writes, by attname (the dialect quotes their names
# from the model's _meta); the nullable rest start NULL.
INSERTED = (
    "name", "queue", "priority", "args", "kwargs", "state", "attempts", "max_attempts", "timeout",
    "run_after", "created_at", "error", "progress_message", "ref_type_id", "ref_id", "task_backend",
    "task_runs", "unique_key", "unique_while", "schedule", "scheduled_for", "concurrency_key",
    "concurrency_limit", "is_async", "attempt_errors", "trace_context", "workflow_id", "run_if",
    "upstream_arg", "limits", "fair_key", "fair_at",
)  # fmt: skip
_DATETIMES = ("run_after", "created_at", "scheduled_for", "fair_at")
_JSON = ("args", "kwargs", "task_runs", "attempt_errors")
# What a bulk enqueue's jobs share: all but each call's arguments.
_CONSTANT = tuple(name for name in INSERTED if name not in ("args", "kwargs"))


def insert(connection: BaseDatabaseWrapper, row: dict[str, Any], calls: list[Call]) -> list[int]:
    """INSERT the rows (``row`` with each call's arguments); returns their ids in call order."""
    dialect = sql.of(connection)
    queue = str(row["queue"])
    if dialect.calls_as_one_parameter:
        return dialect.insert_calls(connection, _CONSTANT, _constants(connection, row), calls, queue)
    rows = [_params(connection, row, args, kwargs) for args, kwargs in calls]
    return dialect.insert_rows(connection, INSERTED, rows, queue)


def insert_one(connection: BaseDatabaseWrapper, row: dict[str, Any], args: Any, kwargs: Any) -> int:
    """INSERT one job; returns its id. ``args`` and ``kwargs`` may come as JSON text already."""
    params = _params(connection, row, args, kwargs)
    return sql.of(connection).insert_one(connection, INSERTED, params, row["queue"])


def _params(connection: BaseDatabaseWrapper, row: dict[str, Any], args: Any, kwargs: Any) -> list[Any]:
    """One row's parameters in ``INSERTED`` order, adapted for ``connection``; JSON as text.

    The JSON columns take text (``json.dumps``, what Django's JSONField writes),
    so an enqueue encodes each value once, having measured it already.
    """
    ops = connection.ops
    values = {**row, "args": args, "kwargs": kwargs}
    for name in _JSON:
        value = values[name]
        if not isinstance(value, str):
            values[name] = "[]" if value == [] else json.dumps(value)  # task_runs: [] but for a task
    adapted = ops.adapt_datetimefield_value(values["created_at"])
    # Usually one instant: adapting a datetime is the dearer part on SQLite and MySQL.
    values["run_after"] = (
        adapted
        if values["run_after"] is values["created_at"]
        else ops.adapt_datetimefield_value(values["run_after"])
    )
    values["created_at"] = adapted
    for name in ("scheduled_for", "fair_at"):
        if values[name] is not None:
            values[name] = ops.adapt_datetimefield_value(values[name])
    return [values[name] for name in INSERTED]


def _constants(connection: BaseDatabaseWrapper, row: dict[str, Any]) -> list[Any]:
    """The values ``_CONSTANT`` names, adapted for ``connection``, for a bulk enqueue's every job."""
    ops = connection.ops
    return [
        ops.adapt_datetimefield_value(row[name]) if name in _DATETIMES
        else ops.adapt_json_value(row[name], None) if name in ("task_runs", "attempt_errors")
        else row[name]
        for name in _CONSTANT
    ]  # fmt: skip
