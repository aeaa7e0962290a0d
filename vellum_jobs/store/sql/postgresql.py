"""PostgreSQL's hot path: SKIP LOCKED claims, typed VALUES joins for outcomes, advisory locks on keys.

An enqueue's INSERT sends the NOTIFY that wakes the workers LISTENing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs.core.models import Job
from vellum_jobs.store import db
from vellum_jobs.store.sql.base import Dialect, Rows, Shape
from vellum_jobs.store.sql.names import Names, channel, names

# The advisory lock space of vellum-jobs ("vell"); the second key is a hash
# of the concurrency key (a collision only serialises two keys).
ADVISORY_LOCK_CLASS = 0x76656C6C
# Wakes the workers LISTENing on the channel (``names.channel()``), with the
# new job's queue as payload; delivered when the transaction commits.
NOTIFY = "pg_notify(%s, %s)"


class PostgreSQL(Dialect):
    vendor = "postgresql"

    def in_queues(self, column: str, count: int) -> str:
        return f"{column} = ANY(%s)"

    def queue_params(self, queues: Sequence[str]) -> list[Any]:
        return [list(queues)] if queues else []

    # A list is one array parameter: the statement is the same for any number of names.
    def in_list(self, column: str, count: int) -> str:
        return f"{column} = ANY(%s)" if count else "1 = 0"

    def list_params(self, values: Sequence[str]) -> list[Any]:
        return [list(values)] if values else []

    records_apart = True

    def claim(
        self, connection: BaseDatabaseWrapper, shape: Shape, sets: tuple[str, list[Any]],
        due_params: list[Any],
    ) -> Rows:  # fmt: skip
        statement, params = self.claim_statement(connection, shape, sets, due_params)
        with connection.wrap_database_errors:
            return list(db.execute(connection, statement, params).fetchall())

    def claim_statement(
        self, connection: BaseDatabaseWrapper, shape: Shape, sets: tuple[str, list[Any]],
        due_params: list[Any],
    ) -> tuple[str, list[Any]]:  # fmt: skip
        """The claim as one statement, and its parameters."""
        # SKIP LOCKED lets concurrent claimers pass over each other's rows
        # instead of queueing behind them. MATERIALIZED keeps the LIMIT a
        # fence: inlined, the planner may re-run the subquery and update
        # more rows than asked. FOR NO KEY UPDATE does not block inserts of
        # rows that reference the job.
        n = names(connection)

        def build() -> str:
            returned = ", ".join(f"{n['table']}.{column.strip()}" for column in n["returned"].split(","))
            return (
                f"WITH claimable AS MATERIALIZED "
                f"({self.scan(connection, shape)} FOR NO KEY UPDATE SKIP LOCKED) "
                f"UPDATE {n['table']} SET {sets[0]} FROM claimable "
                f"WHERE {n['table']}.{n['id']} = claimable.{n['id']} RETURNING {returned}"
            )

        return self.statement(connection, ("claim", *shape), build), [*due_params, *sets[1]]

    # A column of values per parameter, whatever the number of rows: one short statement text,
    # which the driver parses once (a VALUES row per job made a text of hundreds of
    # placeholders for each batch size, parsed afresh each time: a fifth of a drain's CPU).
    joins_columns = True

    def update_joined(self, n: Names, sets: list[str], value_types: list[str], rows: int) -> str:
        # Typed, or PostgreSQL takes the arrays for text[].
        arrays = ", ".join(f"CAST(%s AS {t}[])" for t in value_types)
        names_ = ", ".join(["fence_id", "fence_token", *(f"new_{i}" for i in range(len(value_types) - 2))])
        return f"UPDATE {n['table']} SET {', '.join(sets)} FROM unnest({arrays}) AS v({names_})"

    def renew(
        self, connection: BaseDatabaseWrapper, job_ids: list[int], sets: str, held: str
    ) -> tuple[str, list[Any]]:
        # Rows the dispatcher is writing outcomes to right now need no
        # renewal: skip them rather than wait for their locks.
        n = names(connection)
        sql = (
            f"UPDATE {n['table']} SET {sets} WHERE {n['id']} IN "
            f"(SELECT {n['id']} FROM {n['table']} WHERE {n['id']} = ANY(%s) AND {held} "
            "FOR NO KEY UPDATE SKIP LOCKED)"
        )
        return sql, [list(job_ids)]

    bounds_transactions = True

    def bound_lock_waits(self, connection: BaseDatabaseWrapper, seconds: float) -> Callable[[], None] | None:
        # Local to the transaction: through PgBouncer's transaction pooling a
        # session setting would outlive it on a server connection others use.
        db.execute(connection, "SELECT set_config('lock_timeout', %s, true)", [f"{round(seconds * 1000)}ms"])
        return None

    def lock_wait_ran_out(self, error: Exception) -> bool:
        return getattr(error.__cause__, "sqlstate", None) == "55P03"  # lock_not_available

    def lock_keys(self, connection: BaseDatabaseWrapper, keys: list[str], now: datetime) -> None:
        # In hash order, so two claims never wait on each other's keys in a cycle.
        db.execute(
            connection,
            "SELECT pg_advisory_xact_lock(%s, h) FROM "
            "(SELECT DISTINCT hashtext(k) AS h FROM unnest(%s::text[]) AS k ORDER BY h) AS keys",
            [ADVISORY_LOCK_CLASS, keys],
        ).fetchall()

    def in_keys(self, column: str, count: int) -> str:
        return f"{column} = ANY(%s)"

    def key_params(self, keys: list[str]) -> list[Any]:
        return [list(keys)]

    # -- the enqueue's INSERT, which wakes idle workers itself ---------------

    def value(self, connection: BaseDatabaseWrapper, name: str) -> str:
        # JSON arrives as text; jsonb takes it through a cast.
        field = Job._meta.get_field(name)
        if field.get_internal_type() == "JSONField":
            return f"CAST(%s AS {field.db_type(connection)})"
        return "%s"

    def insert_one(
        self, connection: BaseDatabaseWrapper, columns: tuple[str, ...], params: list[Any], queue: str
    ) -> int:
        # The wakeup rides in the INSERT: RETURNING runs pg_notify for the
        # one row, no second statement, no CTE for the planner to build.
        def build() -> str:
            return f"{self.insert_sql(connection, columns, 1)} RETURNING {names(connection)['id']}, {NOTIFY}"

        sql = self.template(("insert", columns, 1), build)
        return int(db.execute_as_django(connection, sql, [*params, channel(), queue], _first))

    def insert_calls(
        self, connection: BaseDatabaseWrapper, columns: tuple[str, ...], constants: list[Any],
        calls: Sequence[tuple[Any, Any]], queue: str,
    ) -> list[int]:  # fmt: skip
        # The calls as one JSON array of [args, kwargs] pairs, read element by
        # element: one encoding of them all (a text per call, and a text array
        # for the driver to quote, cost more than the server's work).
        def build() -> str:
            n = names(connection)
            inserted = ", ".join(n[name] for name in (*columns, "args", "kwargs"))
            # Typed: a bare parameter in a SELECT list would be text, which an
            # integer or timestamp column refuses.
            types = [Job._meta.get_field(name).db_type(connection) for name in columns]
            typed = ", ".join(f"CAST(%s AS {t})" for t in types)
            return (
                f"WITH inserted AS (INSERT INTO {n['table']} ({inserted}) "
                f"SELECT {typed}, u.call -> 0, u.call -> 1 "
                "FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS u(call, n) ORDER BY u.n "
                f"RETURNING {n['id']}) SELECT inserted.{n['id']} FROM inserted "
                f"CROSS JOIN (SELECT {NOTIFY}) AS notified"
            )

        sql = self.template(("insert_calls", columns), build)
        return self.inserted_ids(connection, sql, [*constants, json.dumps(calls), channel(), queue])

    # -- waking idle workers -------------------------------------------------

    def notify_sql(self) -> str | None:
        return f"SELECT {NOTIFY}"

    def listen_sql(self, connection: BaseDatabaseWrapper) -> str:
        return f"LISTEN {connection.ops.quote_name(channel())}"


def _first(cursor: Any) -> Any:
    return cursor.fetchone()[0]


DIALECT = PostgreSQL()
