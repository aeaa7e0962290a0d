"""PostgreSQL's hot path: SKIP LOCKED claims, typed VALUES joins for outcomes, advisory locks on keys."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs import db
from vellum_jobs.sql.base import Dialect, Rows
from vellum_jobs.sql.names import RETURNED, Names, names

# The advisory lock space of vellum-jobs ("vell"); the second key is a hash
# of the concurrency key (a collision only serialises two keys).
ADVISORY_LOCK_CLASS = 0x76656C6C


class PostgreSQL(Dialect):
    vendor = "postgresql"

    def in_queues(self, column: str, count: int) -> str:
        return f"{column} = ANY(%s)"

    def queue_params(self, queues: Sequence[str]) -> list[Any]:
        return [list(queues)] if queues else []

    # Outcomes and the claim go in one statement (``record_and_claim``).
    records_with_claim = True

    def claim(
        self, connection: BaseDatabaseWrapper, shape: tuple[int, bool], sets: tuple[str, list[Any]],
        due_params: list[Any],
    ) -> Rows:  # fmt: skip
        statement, params = self.claim_statement(connection, shape, sets, due_params)
        with connection.wrap_database_errors:
            return list(db.execute(connection, statement, params).fetchall())

    def claim_statement(
        self, connection: BaseDatabaseWrapper, shape: tuple[int, bool], sets: tuple[str, list[Any]],
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
                f"WITH claimable AS MATERIALIZED (SELECT {n['id']} FROM {n['table']} "
                f"{self.due(connection, *shape)} FOR NO KEY UPDATE SKIP LOCKED) "
                f"UPDATE {n['table']} SET {sets[0]} FROM claimable "
                f"WHERE {n['table']}.{n['id']} = claimable.{n['id']} RETURNING {returned}"
            )

        return self.statement(connection, ("claim", *shape), build), [*due_params, *sets[1]]

    def record_and_claim(
        self, connection: BaseDatabaseWrapper, writes: Sequence[tuple[str, list[Any]]],
        claim: tuple[str, list[Any]],
    ) -> tuple[list[set[int]], Rows]:  # fmt: skip
        """Run ``writes`` (UPDATEs that return the ids they changed) and ``claim`` as one statement.

        Returns the ids each write changed, and the claimed rows. One round
        trip and one commit instead of BEGIN, the writes, the claim and
        COMMIT: the statement is its own transaction (or part of the
        caller's). Its parts see one snapshot, so the claim cannot take a
        job a write puts back: the snapshot has it running.
        """
        n = names(connection)

        def build() -> str:
            parts = [f"w{i} AS ({sql})" for i, (sql, _) in enumerate(writes)]
            parts.append(f"claimed AS ({claim[0]})")
            # The claimed rows come first: their columns type the NULLs below.
            padding = ", NULL" * (len(RETURNED) - 1)
            rows = ["SELECT -1, claimed.* FROM claimed"]
            rows += [f"SELECT {i}, {n['id']}{padding} FROM w{i}" for i in range(len(writes))]
            return f"WITH {', '.join(parts)} {' UNION ALL '.join(rows)}"

        key = ("record_and_claim", claim[0], *(sql for sql, _ in writes))
        params = [param for _, write_params in writes for param in write_params] + claim[1]
        with connection.wrap_database_errors:
            rows = db.execute(connection, self.statement(connection, key, build), params).fetchall()
        applied: list[set[int]] = [set() for _ in writes]
        claimed = []
        for row in rows:
            if row[0] < 0:
                claimed.append(row[1:])
            else:
                applied[row[0]].add(row[1])
        return applied, claimed

    def update_joined(self, n: Names, sets: list[str], value_types: list[str], rows: int) -> str:
        # Typed, or PostgreSQL takes the VALUES columns for text.
        one_row = "(" + ", ".join(f"CAST(%s AS {t})" for t in value_types) + ")"
        names_ = ", ".join(["fence_id", "fence_token", *(f"new_{i}" for i in range(len(value_types) - 2))])
        values = f"(VALUES {', '.join([one_row] * rows)}) AS v({names_})"
        return f"UPDATE {n['table']} SET {', '.join(sets)} FROM {values}"

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


DIALECT = PostgreSQL()
