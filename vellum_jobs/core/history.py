"""A job's attempts that did not succeed: one entry each, newest last, at most ``LIMIT``.

An entry is appended by the write that records the attempt's end (a failed,
timed-out, retried, cancelled, lost or handed-back attempt), in that same
statement: the SQL appends to the column on the database, so no claim has to
read the list and a successful attempt writes nothing here. The vendor's
JSON functions drop the oldest entry once there are ``LIMIT``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import uuid
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Expression, F, JSONField
from django.db.models.sql.compiler import SQLCompiler

# Entries kept on a job; the oldest goes first.
LIMIT = 20
# Characters of a traceback an entry keeps: its end, where the exception is.
TRACEBACK_CHARS = 4000
# Characters of the one-line summary (the traceback's last line).
SUMMARY_CHARS = 500

# What ended the attempt, as entries name it.
FAILED, TIMED_OUT, RETRY, CANCELLED, LOST, HANDED_BACK = (
    "failed", "timed out", "retry requested", "cancelled", "worker lost", "handed back",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Append:
    """A change of ``attempt_errors``: this entry appended, the oldest dropped past ``LIMIT``."""

    entry: dict[str, Any]

    def json(self) -> str:
        return json.dumps(self.entry)


def entry(
    *,
    attempt: int,
    claim: int | None,
    outcome: str,
    error: str,
    worker_id: uuid.UUID | None,
    worker: str,
    started_at: datetime | None,
    ended_at: datetime,
) -> Append:
    """The entry for one attempt that ended without a result; ``claim`` is its claim's token
    (``Job.claims`` after that claim), which names the run for good: attempts start over at
    ``retry()``, the claim counter never does; None for a job failed without a run."""
    duration = (ended_at - started_at).total_seconds() if started_at is not None else None
    return Append(
        {
            "attempt": attempt,
            "claim": claim,
            "outcome": outcome,
            "error": summary(error),
            "traceback": error[-TRACEBACK_CHARS:],
            "worker_id": str(worker_id) if worker_id else None,
            "worker": worker,
            "started_at": started_at.isoformat() if started_at is not None else None,
            "ended_at": ended_at.isoformat(),
            "duration": duration,
        }
    )


def this_process() -> str:
    """This process as its worker's row names it: host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def summary(error: str) -> str:
    """The last non-empty line of an error text (a traceback's exception), cut short."""
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:SUMMARY_CHARS]


def appended(entries: list[dict[str, Any]], change: Append) -> list[dict[str, Any]]:
    """``entries`` as the database has them after ``change``."""
    return [*entries, change.entry][-LIMIT:]


def append_sql(connection: BaseDatabaseWrapper, column: str, value: str) -> str:
    """SQL for ``column`` with the JSON text ``value`` (a placeholder) appended, ``LIMIT`` kept."""
    full = f"{_length(connection)}({column}) >= {LIMIT}"
    if connection.vendor == "postgresql":
        kept = f"CASE WHEN {full} THEN {column} - 0 ELSE {column} END"
        return f"({kept}) || jsonb_build_array(CAST({value} AS jsonb))"
    if connection.vendor == "mysql":
        kept = f"CASE WHEN {full} THEN JSON_REMOVE({column}, '$[0]') ELSE {column} END"
        mariadb = getattr(connection, "mysql_is_mariadb", False)
        parsed = f"JSON_EXTRACT({value}, '$')" if mariadb else f"CAST({value} AS JSON)"
        return f"JSON_ARRAY_APPEND({kept}, '$', {parsed})"
    kept = f"CASE WHEN {full} THEN json_remove({column}, '$[0]') ELSE {column} END"
    return f"json_insert({kept}, '$[#]', json({value}))"


def _length(connection: BaseDatabaseWrapper) -> str:
    lengths = {"postgresql": "jsonb_array_length", "mysql": "JSON_LENGTH"}
    return lengths.get(connection.vendor, "json_array_length")


class Appended(Expression):
    """``append_sql`` as an ORM expression, for ``QuerySet.update(attempt_errors=...)``."""

    output_field = JSONField()

    def __init__(self, name: str, change: Append) -> None:
        super().__init__()
        self.column: Any = F(name)
        self.change = change

    def resolve_expression(self, *args: Any, **kwargs: Any) -> Appended:
        resolved = self.copy()
        resolved.column = self.column.resolve_expression(*args, **kwargs)
        return resolved

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> Any:
        column, params = compiler.compile(self.column)
        assert not params, "a column reference has no parameters"  # it appears three times below
        return append_sql(connection, column, "%s"), [self.change.json()]
