"""What the three vendors' hot-path SQL shares: the claim's candidate scan, the statement cache, the
enqueue's INSERT ... VALUES and the short transaction's statements.

A ``Dialect`` renders and runs one vendor's statements; ``sql.of(connection)``
picks it. Values are always parameters; identifiers come from ``names``.
Statements are written once in the driver's parameter style and run on the
driver's cursor (``db.execute``); an enqueue's keep ``%s`` (``template``), as
they run on a caller's connection (``db.execute_as_django``, Django's cursor).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.db.backends.base.base import BaseDatabaseWrapper

from vellum_jobs.core.transitions import RUNNING
from vellum_jobs.store import db
from vellum_jobs.store.sql.names import Names, names

Rows = list[tuple[Any, ...]]


class Shape(NamedTuple):
    """What a claim statement's text depends on (its cache key); the values themselves are parameters.

    It takes one kind of handler (``is_async``, a parameter): the claim index
    leads with the kind, so a scan of both kinds could not follow its order.
    """

    queues: int  # how many queues it names (0: every queue)
    limits: bool  # whether it takes jobs with a concurrency key
    names: int  # how many job names the worker knows
    task_backends: int  # how many TASKS aliases the worker runs Django tasks of


# ``models.KEYED``, the condition of the key indexes, for the claim's SQL:
# a literal, which PostgreSQL's generic plans can match too.
KEYED = "> ''"


class Dialect:
    """One vendor's statements. Subclasses override what their database does differently."""

    vendor = ""
    # Whether an UPDATE can say which rows it changed (RETURNING): outcomes
    # of a batch are then written in one statement.
    returning = True
    # Whether the worker writes outcomes on a connection of their own, beside
    # the claims (``worker.recorder``): a server runs both writers at once.
    records_apart = False

    def __init__(self) -> None:
        self._statements: dict[tuple[Any, ...], str] = {}

    def statement(
        self, connection: BaseDatabaseWrapper, key: tuple[Any, ...], build: Callable[[], str]
    ) -> str:
        """The statement ``key`` names, built (and put in the driver's style) on first use."""
        sql = self._statements.get(key)
        if sql is None:
            sql = self._statements[key] = db.driver_sql(connection, build())
        return sql

    # -- the claim's candidate scan (served by the vellum_job_claim index) --

    # What follows the table's name in the scan's FROM: an index hint, where the planner needs one.
    claim_index_hint = ""

    def scan(self, connection: BaseDatabaseWrapper, shape: Shape) -> str:
        """The candidate scan: the ids of the jobs to claim, in claim order, with ``%s`` placeholders."""
        n = names(connection)
        due = self.due(connection, shape)
        return f"SELECT {n['id']} FROM {n['table']}{self.claim_index_hint} {due}"

    def due(self, connection: BaseDatabaseWrapper, shape: Shape) -> str:
        """The WHERE, ORDER BY and LIMIT of the candidate scan, with ``%s`` placeholders."""
        n = names(connection)
        where = f"{self.claimable(n, shape, n['table'])} AND {n['table']}.{n['is_async']} = %s"
        if shape.limits:
            where += f" AND ({self._key(n, shape)})"
        else:
            where += f" AND {n['table']}.{n['concurrency_key']} = ''"
        order = f"{n['priority']} DESC, {n['run_after']}, {n['id']}"
        return f"WHERE {where} ORDER BY {order} LIMIT %s"

    def claimable(self, n: Names, shape: Shape, table: str) -> str:
        """Queued, due, in the requested queues, not in a paused one, and of a name the worker knows:
        for rows of ``table``."""
        where = f"{table}.{n['state']} = %s AND {self.run_after(table, n)} <= %s"
        if shape.queues:
            where += f" AND {self.in_queues(f'{table}.' + n['queue'], shape.queues)}"
        return (
            f"{where} AND {table}.{n['queue']} NOT IN (SELECT {n['queue_name']} FROM {n['queue_table']} "
            f"WHERE {n['queue_paused_at']} IS NOT NULL) AND {self.known(n, shape, table)}"
        )

    def known(self, n: Names, shape: Shape, table: str) -> str:
        """A job the worker can run: of one of its names, or a Django task of one of its ``TASKS`` aliases.

        Neither column is in the claim index: like the queue, each is a
        filter on the rows the scan reads in claim order, never a way in.
        """
        known = self.in_list(f"{table}.{n['name']}", shape.names)
        if shape.task_backends:
            known = f"({known} OR {self.in_list(f'{table}.' + n['task_backend'], shape.task_backends)})"
        return known

    def in_list(self, column: str, count: int) -> str:
        """``column`` is one of ``count`` values (``list_params``); false for none."""
        if not count:
            return "1 = 0"
        return f"{column} IN ({', '.join(['%s'] * count)})"

    def list_params(self, values: Sequence[str]) -> list[Any]:
        """The parameters of ``in_list`` for ``values``."""
        return list(values)

    def run_after(self, table: str, n: Names) -> str:
        return f"{table}.{n['run_after']}"

    def in_queues(self, column: str, count: int) -> str:
        return f"{column} IN ({', '.join(['%s'] * count)})"

    def queue_params(self, queues: Sequence[str]) -> list[Any]:
        return list(queues)

    def _key(self, n: Names, shape: Shape) -> str:
        """No concurrency key; or fewer than its limit running and none of its key ahead of it.

        "Ahead" is the claim's own order among the rows this claim could take,
        so a job of the key in another queue, in a paused queue, not yet due or
        of a name the worker does not know holds nothing up.
        (``vellum_job_key_running`` and ``vellum_job_key_queued``.)
        """
        t, key = n["table"], n["concurrency_key"]
        running = (
            f"(SELECT COUNT(*) FROM {t} AS running WHERE running.{key} = {t}.{key} "
            f"AND running.{key} {KEYED} AND running.{n['state']} = %s) < {t}.{n['concurrency_limit']}"
        )
        pri, after, pk = n["priority"], n["run_after"], n["id"]
        ahead = (
            f"ahead.{pri} > {t}.{pri} OR (ahead.{pri} = {t}.{pri} AND (ahead.{after} < {t}.{after} "
            f"OR (ahead.{after} = {t}.{after} AND ahead.{pk} < {t}.{pk})))"
        )
        first = (
            f"NOT EXISTS (SELECT 1 FROM {t} AS ahead WHERE ahead.{key} = {t}.{key} AND ahead.{key} {KEYED} "
            f"AND {self.claimable(n, shape, 'ahead')} AND ({ahead}))"
        )
        return f"{t}.{key} = '' OR ({running} AND {first})"

    # -- statements each vendor writes its own way --------------------------

    def claim(
        self, connection: BaseDatabaseWrapper, shape: Shape, sets: tuple[str, list[Any]],
        due_params: list[Any],
    ) -> Rows:  # fmt: skip
        """Mark the candidates ``due_params`` select with ``sets`` (SQL, params); return their columns."""
        raise NotImplementedError

    def claim_in_one(
        self, connection: BaseDatabaseWrapper, shape: Shape, build: Callable[[], str],
        params: list[Any],
    ) -> Rows:  # fmt: skip
        """Run a claim that is one statement (cached by ``shape``) and return the rows it marked."""
        cursor = db.execute(connection, self.statement(connection, ("claim", *shape), build), params)
        with connection.wrap_database_errors:
            return list(cursor.fetchall())

    # Whether ``update_joined`` takes a parameter per column (an array of every row's values)
    # rather than one per value, row after row.
    joins_columns = False

    def update_joined(self, n: Names, sets: list[str], value_types: list[str], rows: int) -> str:
        """An UPDATE of ``rows`` rows joined to a list ``v(fence_id, fence_token, new_0, ...)``."""
        raise NotImplementedError

    def renew(
        self, connection: BaseDatabaseWrapper, job_ids: list[int], sets: str, held: str
    ) -> tuple[str, list[Any]]:
        """Lease renewal's SQL for ``job_ids`` (``sets`` the new lease, ``held`` its condition), and
        its id parameters, which come after the SET's."""
        marks = ", ".join(["%s"] * len(job_ids))
        n = names(connection)
        sql = f"UPDATE {n['table']} SET {sets} WHERE {n['id']} IN ({marks}) AND {held}"
        return sql, list(job_ids)

    def lock_keys(self, connection: BaseDatabaseWrapper, keys: list[str], now: datetime) -> None:
        """Lock the concurrency ``keys`` until the transaction ends (PostgreSQL and MySQL)."""
        raise NotImplementedError

    def running_counts(self, connection: BaseDatabaseWrapper, keys: list[str]) -> Counter[str]:
        """Running jobs by key, this transaction's claims included (a fresh read in READ COMMITTED)."""
        n = names(connection)
        match = self.in_keys(n["concurrency_key"], len(keys))
        cursor = db.execute(
            connection,
            f"SELECT {n['concurrency_key']}, COUNT(*) FROM {n['table']} "
            f"WHERE {n['state']} = %s AND {match} AND {n['concurrency_key']} {KEYED} "
            f"GROUP BY {n['concurrency_key']}",
            [RUNNING, *self.key_params(keys)],
        )
        return Counter({str(key): int(count) for key, count in cursor.fetchall()})

    def in_keys(self, column: str, count: int) -> str:
        return self.in_queues(column, count)

    def key_params(self, keys: list[str]) -> list[Any]:
        return list(keys)

    # -- the enqueue's INSERT (``inserts`` decides the columns and values) --

    # Whether a bulk enqueue sends its calls' arguments as one parameter
    # (``insert_calls``) rather than a VALUES list (``insert_rows``).
    calls_as_one_parameter = True

    def template(self, key: tuple[Any, ...], build: Callable[[], str]) -> str:
        """The statement ``key`` names, built once; ``%s`` placeholders kept, for ``db.execute_as_django``."""
        key = ("%s", *key)
        sql = self._statements.get(key)
        if sql is None:
            sql = self._statements[key] = build()
        return sql

    def insert_sql(self, connection: BaseDatabaseWrapper, columns: tuple[str, ...], count: int) -> str:
        """``INSERT ... VALUES`` of ``count`` rows of ``columns`` (attnames)."""
        n = names(connection)
        one_row = "(" + ", ".join(self.value(connection, name) for name in columns) + ")"
        return (
            f"INSERT INTO {n['table']} ({', '.join(n[name] for name in columns)}) "
            f"VALUES {', '.join([one_row] * count)}"
        )

    def value(self, connection: BaseDatabaseWrapper, name: str) -> str:
        """The placeholder of column ``name`` in a VALUES list; JSON arrives as text."""
        return "%s"

    def insert_one(
        self, connection: BaseDatabaseWrapper, columns: tuple[str, ...], params: list[Any], queue: str
    ) -> int:
        """INSERT one job (``params`` for ``columns``) on a caller's connection; returns its id.

        ``queue`` is the job's, for a database whose INSERT also wakes idle workers.
        """
        # No RETURNING: the driver reports the id (lastrowid), which spares
        # SQLite the RETURNING's work table. On the driver's cursor: Django's
        # wrapper cost about as much as the INSERT of one job.
        sql = self.template(("insert", columns, 1), lambda: self.insert_sql(connection, columns, 1))
        return db.execute_as_django(connection, sql, params, _lastrowid)

    def insert_calls(
        self, connection: BaseDatabaseWrapper, columns: tuple[str, ...], constants: list[Any],
        calls: Sequence[tuple[Any, Any]], queue: str,
    ) -> list[int]:  # fmt: skip
        """INSERT a job per (args, kwargs) of ``calls``, ``constants`` for ``columns`` in each; their ids.

        A VALUES list of thousands of rows is tens of thousands of placeholders,
        which the driver parses (and Django rewrites, on SQLite) on every call,
        at more cost than the insert itself. Here the arguments travel as one
        parameter, however many rows there are. SQLite and PostgreSQL.
        """
        raise NotImplementedError

    def insert_rows(
        self, connection: BaseDatabaseWrapper, columns: tuple[str, ...], rows: list[list[Any]], queue: str
    ) -> list[int]:
        """INSERT ``rows`` (each ``params`` for ``columns``) as VALUES lists; their ids, in order."""
        raise NotImplementedError

    def inserted_ids(self, connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> list[int]:
        """Run the one statement of ``insert_calls``; the ids it returns, in the order of the calls."""
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            # One statement takes its ids in the order it inserts, which its
            # ORDER BY makes the order of the calls.
            return sorted(r[0] for r in cursor.fetchall())

    # -- waking idle workers (``wakeup`` runs the threads and decides) -------

    def notify_sql(self) -> str | None:
        """A statement that wakes the workers listening (parameters: channel, queue); None if none can."""
        return None

    def listen_sql(self, connection: BaseDatabaseWrapper) -> str:
        """The statement that makes a connection hear ``notify_sql`` (PostgreSQL)."""
        raise NotImplementedError

    # -- the short transaction (``transactions.short_transaction`` runs it) --

    # The statement that opens it; None: Django's atomic() does.
    begin: str | None = "BEGIN"
    commit = "COMMIT"
    rollback = "ROLLBACK"

    # -- bounded lock waits (``lock_waits.bounded`` runs them) ---------------

    # Whether a session can wait on another's row locks. SQLite's one write
    # lock is waited for no longer than its busy timeout.
    row_locks = True
    # Whether the bound holds for a transaction alone, which must be opened for it.
    bounds_transactions = False

    def bound_lock_waits(self, connection: BaseDatabaseWrapper, seconds: float) -> Callable[[], None] | None:
        """Make statements wait at most ``seconds`` for a lock another session holds, then fail: the
        open transaction's (``bounds_transactions``), or the session's until the returned call undoes it."""
        raise NotImplementedError

    def lock_wait_ran_out(self, error: Exception) -> bool:
        """Whether ``error`` (Django's, raised from the driver's) is a bounded lock wait that ran out."""
        return False


def _lastrowid(cursor: Any) -> int:
    return int(cursor.lastrowid)
