"""MariaDB/MySQL's hot path: no UPDATE ... RETURNING, so a claim is three statements in one transaction.

A bulk enqueue is VALUES lists in batches; the wakeup probes the highest id.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs.store import db
from vellum_jobs.store.sql.base import Dialect, Rows, Shape
from vellum_jobs.store.sql.names import names

# The MaintenanceLock row whose row lock serialises the concurrency-key
# checks: MySQL has no transaction-scoped advisory locks.
LOCK_ROW = "vellum_jobs.concurrency"
# The most parameters MySQL and MariaDB take in one statement: a bulk
# insert's VALUES lists are cut into batches under it.
MAX_PARAMS = 65535


class MySQL(Dialect):
    vendor = "mysql"
    # An UPDATE cannot say which rows it changed, and its row locks must be
    # taken in id order: every outcome is its own statement.
    returning = False
    records_apart = True
    # A locking read locks every row it reads. Left to itself, the planner
    # may read the queued jobs by another index, or all of the table, and
    # sort them: LIMIT 1 then locks every queued job, and concurrent claims
    # find none. On the claim index the scan reads in claim order and stops.
    claim_index_hint = " FORCE INDEX (vellum_job_claim)"

    def claim(
        self, connection: BaseDatabaseWrapper, shape: Shape, sets: tuple[str, list[Any]],
        due_params: list[Any],
    ) -> Rows:  # fmt: skip
        # Lock the candidates with SKIP LOCKED, mark them, read them back,
        # all in one short transaction. The candidate scan runs on the claim
        # index, so only the scanned rows are locked.
        # (This dialect names no BEGIN: its short transaction is Django's atomic().)
        n = names(connection)
        with transaction.atomic(using=connection.alias, savepoint=False):
            select = f"{self.scan(connection, shape)} FOR UPDATE SKIP LOCKED"
            ids = [row[0] for row in db.execute(connection, select, due_params).fetchall()]
            if not ids:
                return []
            marks = ", ".join(["%s"] * len(ids))
            db.execute(
                connection,
                f"UPDATE {n['table']} SET {sets[0]} WHERE {n['id']} IN ({marks})",
                [*sets[1], *ids],
            )
            cursor = db.execute(
                connection, f"SELECT {n['returned']} FROM {n['table']} WHERE {n['id']} IN ({marks})", ids
            )
            return list(cursor.fetchall())

    def renew(
        self, connection: BaseDatabaseWrapper, job_ids: list[int], sets: str, held: str
    ) -> tuple[str, list[Any]]:
        # Row locks in id order, the order outcomes are written in: no deadlock.
        sql, params = super().renew(connection, job_ids, sets, held)
        return f"{sql} ORDER BY {names(connection)['id']}", params

    def lock_keys(self, connection: BaseDatabaseWrapper, keys: list[str], now: datetime) -> None:
        # An upsert takes an exclusive lock on the row it finds, until commit.
        n = names(connection)
        db.execute(
            connection,
            f"INSERT INTO {n['lock_table']} ({n['lock_name']}, holder, locked_until) VALUES (%s, '', %s) "
            f"ON DUPLICATE KEY UPDATE {n['lock_name']} = {n['lock_name']}",
            [LOCK_ROW, connection.ops.adapt_datetimefield_value(now)],
        )

    # -- the enqueue's INSERT ------------------------------------------------

    # A bulk enqueue writes VALUES lists, in batches under MAX_PARAMS.
    calls_as_one_parameter = False

    def insert_rows(
        self, connection: BaseDatabaseWrapper, columns: tuple[str, ...], rows: list[list[Any]], queue: str
    ) -> list[int]:
        if not connection.features.can_return_rows_from_bulk_insert:
            batches = [[row] for row in rows]  # MySQL: one row per statement, lastrowid
        else:
            size = max(1, MAX_PARAMS // len(columns))
            batches = [rows[i : i + size] for i in range(0, len(rows), size)]
        if len(batches) == 1:
            return self._insert_batch(connection, columns, batches[0], queue)
        with transaction.atomic(using=connection.alias, savepoint=False):
            return [pk for batch in batches for pk in self._insert_batch(connection, columns, batch, queue)]

    def _insert_batch(
        self, connection: BaseDatabaseWrapper, columns: tuple[str, ...], rows: list[list[Any]], queue: str
    ) -> list[int]:
        if len(rows) == 1:
            return [self.insert_one(connection, columns, rows[0], queue)]
        # MariaDB's bulk insert.
        count = len(rows)

        def build() -> str:
            return f"{self.insert_sql(connection, columns, count)} RETURNING {names(connection)['id']}"

        # enqueue_many() of a few jobs repeats; big batches rarely do.
        sql = self.template(("insert", columns, count), build) if count <= 16 else build()
        params = [value for row in rows for value in row]
        return db.execute_as_django(connection, sql, params, _ids)

    # -- waking idle workers: the probe (MySQL has no LISTEN) ----------------

    def probe_sql(self, connection: BaseDatabaseWrapper) -> tuple[str, str]:
        """The highest job id, and how many jobs lie in a range of ids; both read from the primary key."""
        n = names(connection)
        return (
            f"SELECT MAX({n['id']}) FROM {n['table']}",
            f"SELECT COUNT(*) FROM {n['table']} WHERE {n['id']} > %s AND {n['id']} <= %s",
        )

    # -- the short transaction, and bounded lock waits -----------------------

    begin = None

    def bound_lock_waits(self, connection: BaseDatabaseWrapper, seconds: float) -> Callable[[], None] | None:
        # Whole seconds, and a session setting (there is no transaction's
        # own): the caller's value comes back after the block.
        (before,) = db.execute(connection, "SELECT @@SESSION.innodb_lock_wait_timeout", []).fetchone()
        db.execute(connection, "SET SESSION innodb_lock_wait_timeout = %s", [max(1, math.ceil(seconds))])

        def restore() -> None:
            db.execute(connection, "SET SESSION innodb_lock_wait_timeout = %s", [before])

        return restore

    def lock_wait_ran_out(self, error: Exception) -> bool:
        return bool(error.args) and error.args[0] == 1205  # ER_LOCK_WAIT_TIMEOUT


def _ids(cursor: Any) -> list[int]:
    return [row[0] for row in cursor.fetchall()]


DIALECT = MySQL()
