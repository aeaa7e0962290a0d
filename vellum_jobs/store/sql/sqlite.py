"""SQLite's hot path: one autocommit statement claims, one joined UPDATE writes a batch of outcomes.

A bulk enqueue reads its calls from one JSON document; transactions take
the write lock at BEGIN; ``PRAGMA data_version`` tells the wakeup of commits.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs.store.sql.base import Dialect, Rows, Shape
from vellum_jobs.store.sql.names import Names, names


class SQLite(Dialect):
    vendor = "sqlite"

    def run_after(self, table: str, n: Names) -> str:
        # The planner may choose to range-scan run_after inside the claim
        # index (skipping over state and priority) and then sort every due
        # job; a unary + keeps it on the index's order. (+ would change the
        # value's type on the other databases, whose planners need no hint.)
        return f"+{table}.{n['run_after']}"

    def in_list(self, column: str, count: int) -> str:
        # A list is one JSON array parameter, however many names. The unary +
        # keeps the planner off the name index, whose rows are not in claim order.
        return f"+{column} IN (SELECT value FROM json_each(%s))" if count else "1 = 0"

    def list_params(self, values: Sequence[str]) -> list[Any]:
        return [json.dumps(list(values))] if values else []

    def claim(
        self, connection: BaseDatabaseWrapper, shape: Shape, sets: tuple[str, list[Any]],
        due_params: list[Any],
    ) -> Rows:  # fmt: skip
        # One autocommit statement: SQLite takes the write lock before it
        # reads, so the busy timeout applies and no other writer can
        # interleave. (A read-then-write transaction would get SQLITE_BUSY
        # with no waiting.)
        n = names(connection)

        def build() -> str:
            return (
                f"UPDATE {n['table']} SET {sets[0]} WHERE {n['id']} IN "
                f"({self.scan(connection, shape)}) "
                f"RETURNING {n['returned']}"
            )

        return self.claim_in_one(connection, shape, build, [*sets[1], *due_params])

    def update_joined(self, n: Names, sets: list[str], value_types: list[str], rows: int) -> str:
        one_row = "(" + ", ".join(["%s"] * len(value_types)) + ")"
        names_ = ", ".join(["fence_id", "fence_token", *(f"new_{i}" for i in range(len(value_types) - 2))])
        return (
            f"WITH v({names_}) AS (VALUES {', '.join([one_row] * rows)}) "
            f"UPDATE {n['table']} SET {', '.join(sets)} FROM v"
        )

    # -- the enqueue's INSERT ------------------------------------------------

    def insert_calls(
        self, connection: BaseDatabaseWrapper, columns: tuple[str, ...], constants: list[Any],
        calls: Sequence[tuple[Any, Any]], queue: str,
    ) -> list[int]:  # fmt: skip
        # The calls as one JSON document, read with json_each. Each element
        # is one call's [args, kwargs]; an array or object comes out of
        # json_extract as JSON text, the column's form.
        def build() -> str:
            n = names(connection)
            inserted = ", ".join(n[name] for name in (*columns, "args", "kwargs"))
            return (
                f"INSERT INTO {n['table']} ({inserted}) "
                f"SELECT {', '.join(['%s'] * len(columns))}, json_extract(value, '$[0]'), "
                f"json_extract(value, '$[1]') FROM json_each(%s) ORDER BY key RETURNING {n['id']}"
            )

        sql = self.template(("insert_calls", columns), build)
        return self.inserted_ids(connection, sql, [*constants, json.dumps(calls)])

    # -- waking idle workers -------------------------------------------------

    def data_version(self, cursor: sqlite3.Cursor) -> int:
        """The database's ``data_version``, which changes whenever another connection commits."""
        version: int = cursor.execute("PRAGMA data_version").fetchone()[0]
        return version

    # -- the short transaction and a worker's connection ---------------------

    # The write lock up front, so the busy timeout applies: a deferred
    # transaction that reads before it writes gets "database is locked" at once.
    begin = "BEGIN IMMEDIATE"
    row_locks = False

    def prepare_worker_connection(self, connection: BaseDatabaseWrapper, busy_timeout_ms: int) -> None:
        """Give ``connection`` a busy timeout of ``busy_timeout_ms`` and its database WAL, if not yet."""
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA journal_mode")
            if cursor.fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode = WAL")


DIALECT = SQLite()
