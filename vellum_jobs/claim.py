"""The claim: one atomic statement per database vendor that hands due jobs to a worker.

Each vendor gets the cheapest statement that cannot give one job to two
workers. Values are always parameters; identifiers come from the model's
``_meta`` and are quoted by the connection. ``now`` is passed in, so the
clock is the caller's (and a test's) to choose. Statements are built once
per vendor, queue count and mode, and run on the driver's cursor (see ``db``).

Two more conditions ride in the same statement, so they cost no extra query:
a paused queue's jobs are skipped (a subquery on the small queue table), and
a job with a concurrency key is taken only while fewer than its limit of its
key are running and no job of its key is ahead of it (at most one per key
per claim). On SQLite that is race-free as it stands: the statement holds
the write lock while it reads. PostgreSQL and MySQL read a snapshot, so two
claims could each see a free slot; there a claim that took keyed jobs locks
their keys, counts again with a fresh read and hands back any excess before
it commits (``_within_limits``).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import signals as model_signals
from django.db.models.base import ModelState

from vellum_jobs import db, fence, transitions
from vellum_jobs.models import Job, MaintenanceLock, Queue

# The columns a worker needs to run a job, in model order (``Job.from_db``
# wants them that way). The claim's own values (state, worker, lease, start)
# are filled in from the request; the rest load lazily if a handler asks.
RETURNED = [
    f
    for f in Job._meta.concrete_fields
    if f.attname
    in {"id", "name", "queue", "priority", "args", "kwargs", "attempts", "max_attempts", "timeout",
        "run_after", "ref_type_id", "ref_id", "concurrency_key", "concurrency_limit", "claims"}
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ClaimRequest:
    worker_id: uuid.UUID
    limit: int
    now: datetime
    lease_until: datetime
    queues: Sequence[str] = ()
    # Whether to take jobs with a concurrency key. A worker that registered
    # none leaves them out, which spares PostgreSQL the claim's transaction.
    limits: bool = True


def claim(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Job]:
    """Mark up to ``limit`` due jobs running for ``worker_id`` and return them in claim order.

    Order: highest priority, then earliest ``run_after``, then id. ``attempts``
    grows by one, so a run that dies with its process still counts.
    """
    if request.limit < 1:
        return []
    if connection.vendor == "sqlite" or not request.limits:
        return _claim_rows(connection, request)
    with db.short_transaction(connection):
        return _within_limits(connection, request, _claim_rows(connection, request))


def _claim_rows(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Job]:
    rows = _CLAIMS[connection.vendor](connection, request)
    # What the claim wrote, known without asking the database (a deferred
    # field would cost a query on first access); the counters came back.
    claimed = {
        name: value for name, value in _claimed(request).items() if not isinstance(value, transitions.Add)
    }
    convert = _converter(connection)
    plain = not (model_signals.pre_init.has_listeners(Job) or model_signals.post_init.has_listeners(Job))
    jobs = [_instance(connection.alias, convert(row), claimed, plain) for row in rows]
    jobs.sort(key=lambda j: (-j.priority, j.run_after, j.pk))
    return jobs


def candidates(connection: BaseDatabaseWrapper, request: ClaimRequest) -> tuple[str, list[Any]]:
    """The claim's candidate scan as a plain SELECT with ``%s`` placeholders (for EXPLAIN)."""
    n = _names(connection)
    due = _due_sql(connection, len(request.queues), request.limits)
    return f"SELECT {n['id']} FROM {n['table']} {due}", _due_params(connection, request)


@lru_cache(maxsize=8)
def _quoted_names(vendor: str, quote: Callable[[str], str]) -> dict[str, str]:
    names = {f.attname: quote(str(f.column)) for f in Job._meta.concrete_fields}
    names["table"] = quote(Job._meta.db_table)
    names["returned"] = ", ".join(quote(str(f.column)) for f in RETURNED)
    names["queue_table"] = quote(Queue._meta.db_table)
    names["queue_name"] = quote(str(Queue._meta.get_field("name").column))
    names["queue_paused_at"] = quote(str(Queue._meta.get_field("paused_at").column))
    names["lock_table"] = quote(MaintenanceLock._meta.db_table)
    names["lock_name"] = quote(str(MaintenanceLock._meta.get_field("name").column))
    return names


def _names(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """Quoted column names by attname, plus the table and the returned column list."""
    return _quoted_names(connection.vendor, connection.ops.quote_name)


def _claimed(request: ClaimRequest) -> dict[str, Any]:
    return transitions.claimed(request.worker_id, request.now, request.lease_until)


def _set_running_sql(connection: BaseDatabaseWrapper) -> str:
    # Only the column names and kinds of change matter to the SQL, so any request will do.
    return fence.set_sql(connection, transitions.claimed(uuid.UUID(int=0), _EPOCH, _EPOCH))


def _set_running_params(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Any]:
    return fence.set_params(connection, _claimed(request))


_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def _due_sql(connection: BaseDatabaseWrapper, queue_count: int, limits: bool) -> str:
    """The WHERE, ORDER BY and LIMIT of the candidate scan (served by ``vellum_job_claim``)."""
    n = _names(connection)
    where = _claimable_sql(connection, queue_count, n["table"])
    if limits:
        where += f" AND ({_key_sql(connection, queue_count)})"
    else:
        where += f" AND {n['table']}.{n['concurrency_key']} = ''"
    order = f"{n['priority']} DESC, {n['run_after']}, {n['id']}"
    return f"WHERE {where} ORDER BY {order} LIMIT %s"


def _claimable_sql(connection: BaseDatabaseWrapper, queue_count: int, table: str) -> str:
    """Queued, due, in the requested queues, and not in a paused one: for rows of ``table``."""
    n = _names(connection)
    # SQLite's planner may choose to range-scan run_after inside the claim
    # index (skipping over state and priority) and then sort every due job;
    # a unary + keeps it on the index's order. (+ would change the value's
    # type on the other databases, whose planners need no such hint.)
    plus = "+" if connection.vendor == "sqlite" else ""
    where = f"{table}.{n['state']} = %s AND {plus}{table}.{n['run_after']} <= %s"
    if queue_count and connection.vendor == "postgresql":
        where += f" AND {table}.{n['queue']} = ANY(%s)"
    elif queue_count:
        where += f" AND {table}.{n['queue']} IN ({', '.join(['%s'] * queue_count)})"
    return (
        f"{where} AND {table}.{n['queue']} NOT IN (SELECT {n['queue_name']} FROM {n['queue_table']} "
        f"WHERE {n['queue_paused_at']} IS NOT NULL)"
    )


def _key_sql(connection: BaseDatabaseWrapper, queue_count: int) -> str:
    """No concurrency key; or fewer than its limit running and none of its key ahead of it.

    "Ahead" is the claim's own order among the rows this claim could take,
    so a job of the key in another queue, in a paused queue or not yet due
    holds nothing up. (``vellum_job_key_running`` and ``vellum_job_key_queued``.)
    """
    n = _names(connection)
    t, key = n["table"], n["concurrency_key"]
    running = (
        f"(SELECT COUNT(*) FROM {t} AS running WHERE running.{key} = {t}.{key} "
        f"AND running.{n['state']} = %s) < {t}.{n['concurrency_limit']}"
    )
    pri, after, pk = n["priority"], n["run_after"], n["id"]
    ahead = (
        f"ahead.{pri} > {t}.{pri} OR (ahead.{pri} = {t}.{pri} AND (ahead.{after} < {t}.{after} "
        f"OR (ahead.{after} = {t}.{after} AND ahead.{pk} < {t}.{pk})))"
    )
    first = (
        f"NOT EXISTS (SELECT 1 FROM {t} AS ahead WHERE ahead.{key} = {t}.{key} "
        f"AND {_claimable_sql(connection, queue_count, 'ahead')} AND ({ahead}))"
    )
    return f"{t}.{key} = '' OR ({running} AND {first})"


def _claimable_params(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Any]:
    params: list[Any] = [transitions.QUEUED, connection.ops.adapt_datetimefield_value(request.now)]
    if request.queues and connection.vendor == "postgresql":
        params.append(list(request.queues))
    else:
        params.extend(request.queues)
    return params


def _due_params(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Any]:
    params = _claimable_params(connection, request)
    if request.limits:
        params += [transitions.RUNNING, *_claimable_params(connection, request)]
    return [*params, request.limit]


_statements: dict[tuple[str, int, bool], str] = {}


def _statement(
    connection: BaseDatabaseWrapper,
    request: ClaimRequest,
    build: Callable[[BaseDatabaseWrapper, int, bool], str],
) -> str:
    """The claim statement for this vendor, number of queues and mode, built on first use."""
    key = (connection.vendor, len(request.queues), request.limits)
    if key not in _statements:
        _statements[key] = db.driver_sql(connection, build(connection, *key[1:]))
    return _statements[key]


def _sqlite_statement(connection: BaseDatabaseWrapper, queue_count: int, limits: bool) -> str:
    n = _names(connection)
    return (
        f"UPDATE {n['table']} SET {_set_running_sql(connection)} WHERE {n['id']} IN "
        f"(SELECT {n['id']} FROM {n['table']} {_due_sql(connection, queue_count, limits)}) "
        f"RETURNING {n['returned']}"
    )


def _claim_sqlite(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[tuple[Any, ...]]:
    # One autocommit statement: SQLite takes the write lock before it reads,
    # so the busy timeout applies and no other writer can interleave. (A
    # read-then-write transaction would get SQLITE_BUSY with no waiting.)
    params = [*_set_running_params(connection, request), *_due_params(connection, request)]
    cursor = db.execute(connection, _statement(connection, request, _sqlite_statement), params)
    with connection.wrap_database_errors:
        return list(cursor.fetchall())


def _postgresql_statement(connection: BaseDatabaseWrapper, queue_count: int, limits: bool) -> str:
    # SKIP LOCKED lets concurrent claimers pass over each other's rows instead
    # of queueing behind them. MATERIALIZED keeps the LIMIT a fence: inlined,
    # the planner may re-run the subquery and update more rows than asked.
    # FOR NO KEY UPDATE does not block inserts of rows that reference the job.
    n = _names(connection)
    returned = ", ".join(f"{n['table']}.{column.strip()}" for column in n["returned"].split(","))
    return (
        f"WITH claimable AS MATERIALIZED (SELECT {n['id']} FROM {n['table']} "
        f"{_due_sql(connection, queue_count, limits)} FOR NO KEY UPDATE SKIP LOCKED) "
        f"UPDATE {n['table']} SET {_set_running_sql(connection)} FROM claimable "
        f"WHERE {n['table']}.{n['id']} = claimable.{n['id']} RETURNING {returned}"
    )


def _claim_postgresql(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[tuple[Any, ...]]:
    params = [*_due_params(connection, request), *_set_running_params(connection, request)]
    cursor = db.execute(connection, _statement(connection, request, _postgresql_statement), params)
    with connection.wrap_database_errors:
        return list(cursor.fetchall())


def _claim_mysql(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[tuple[Any, ...]]:
    # No UPDATE ... RETURNING: lock the candidates with SKIP LOCKED, mark them,
    # read them back, all in one short transaction. The candidate scan runs
    # on the claim index, so only the scanned rows are locked.
    n = _names(connection)
    with db.short_transaction(connection):
        cursor = db.execute(
            connection,
            f"SELECT {n['id']} FROM {n['table']} "
            f"{_due_sql(connection, len(request.queues), request.limits)} FOR UPDATE SKIP LOCKED",
            _due_params(connection, request),
        )
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return []
        marks = ", ".join(["%s"] * len(ids))
        db.execute(
            connection,
            f"UPDATE {n['table']} SET {_set_running_sql(connection)} WHERE {n['id']} IN ({marks})",
            [*_set_running_params(connection, request), *ids],
        )
        cursor = db.execute(
            connection, f"SELECT {n['returned']} FROM {n['table']} WHERE {n['id']} IN ({marks})", ids
        )
        return list(cursor.fetchall())


# -- concurrency limits on PostgreSQL and MySQL -------------------------------

# The PostgreSQL advisory lock space of vellum-jobs ("vell"); the second key
# is a hash of the concurrency key (a collision only serialises two keys).
ADVISORY_LOCK_CLASS = 0x76656C6C
# The MaintenanceLock row whose row lock serialises these checks on MySQL,
# which has no transaction-scoped advisory locks.
MYSQL_LOCK_ROW = "vellum_jobs.concurrency"


def _within_limits(connection: BaseDatabaseWrapper, request: ClaimRequest, jobs: list[Job]) -> list[Job]:
    """Hand back, before the claim commits, keyed jobs that would exceed their limit.

    The claim's own check read a snapshot that may predate another worker's
    uncommitted claim of the same key. Under a lock on the keys, held until
    commit, a fresh read sees every claim that committed before, and the
    next claimer of these keys waits for this one.
    """
    keyed = [job for job in jobs if job.concurrency_key]
    if not keyed:
        return jobs
    keys = sorted({key for job in keyed if (key := job.concurrency_key)})
    _lock_keys(connection, keys, request.now)
    running = _running_counts(connection, keys)
    ours = Counter(job.concurrency_key for job in keyed)
    kept: Counter[str | None] = Counter()
    excess = []
    for job in keyed:
        key = job.concurrency_key
        others = running[str(key)] - ours[key]
        if others + kept[key] < job.concurrency_limit:
            kept[key] += 1
        else:
            excess.append(job)
    if not excess:
        return jobs
    _unclaim(excess)
    gone = {job.pk for job in excess}
    return [job for job in jobs if job.pk not in gone]


def _lock_keys(connection: BaseDatabaseWrapper, keys: list[str], now: datetime) -> None:
    n = _names(connection)
    if connection.vendor == "postgresql":
        # In hash order, so two claims never wait on each other's keys in a cycle.
        db.execute(
            connection,
            "SELECT pg_advisory_xact_lock(%s, h) FROM "
            "(SELECT DISTINCT hashtext(k) AS h FROM unnest(%s::text[]) AS k ORDER BY h) AS keys",
            [ADVISORY_LOCK_CLASS, keys],
        ).fetchall()
        return
    # An upsert takes an exclusive lock on the row it finds, until commit.
    db.execute(
        connection,
        f"INSERT INTO {n['lock_table']} ({n['lock_name']}, holder, locked_until) VALUES (%s, '', %s) "
        f"ON DUPLICATE KEY UPDATE {n['lock_name']} = {n['lock_name']}",
        [MYSQL_LOCK_ROW, connection.ops.adapt_datetimefield_value(now)],
    )


def _running_counts(connection: BaseDatabaseWrapper, keys: list[str]) -> Counter[str]:
    """Running jobs by key, this transaction's claims included (a fresh read in READ COMMITTED)."""
    n = _names(connection)
    params: list[Any]
    if connection.vendor == "postgresql":
        match, params = f"{n['concurrency_key']} = ANY(%s)", [keys]
    else:
        match, params = f"{n['concurrency_key']} IN ({', '.join(['%s'] * len(keys))})", list(keys)
    cursor = db.execute(
        connection,
        f"SELECT {n['concurrency_key']}, COUNT(*) FROM {n['table']} "
        f"WHERE {n['state']} = %s AND {match} GROUP BY {n['concurrency_key']}",
        [transitions.RUNNING, *params],
    )
    return Counter({str(key): int(count) for key, count in cursor.fetchall()})


def _unclaim(jobs: list[Job]) -> None:
    """Put jobs this claim took back as they were: queued, the attempt not counted."""
    write = transitions.unclaimed()
    for job in sorted(jobs, key=lambda job: job.pk):
        fence.update_if_held(job, job.claims, write.changes, write.nulls)


_CLAIMS: dict[str, Callable[[BaseDatabaseWrapper, ClaimRequest], list[tuple[Any, ...]]]] = {
    "sqlite": _claim_sqlite,
    "postgresql": _claim_postgresql,
    "mysql": _claim_mysql,
}

_converters_cache: dict[str, Callable[[Sequence[Any]], list[Any]]] = {}


def _converter(connection: BaseDatabaseWrapper) -> Callable[[Sequence[Any]], list[Any]]:
    """A function that applies to a returned row what the ORM applies to a SELECT of its columns."""
    convert = _converters_cache.get(connection.vendor)
    if convert is None:
        steps = []
        for i, field in enumerate(RETURNED):
            col = field.get_col(Job._meta.db_table)
            found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if found:
                steps.append(
                    (i, _json_loads if _plain_json(field, found) else _chain(found, col, connection))
                )

        def convert(row: Sequence[Any]) -> list[Any]:
            values = list(row)
            for i, step in steps:
                values[i] = step(values[i])
            return values

        _converters_cache[connection.vendor] = convert
    return convert


def _plain_json(field: Any, converters: list[Callable[..., Any]]) -> bool:
    """A JSONField the driver hands over as text, decoded by ``json.loads`` alone."""
    return (
        field.get_internal_type() == "JSONField"
        and field.decoder is None
        and len(converters) == 1
        and getattr(converters[0], "__func__", None) is type(field).from_db_value
    )


def _json_loads(value: Any) -> Any:
    # JSONField.from_db_value, less its handling of key transforms the claim never selects.
    if value == "{}":  # kwargs, most of the time
        return {}
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _chain(
    converters: list[Callable[..., Any]], col: Any, connection: BaseDatabaseWrapper
) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        for step in converters:
            value = step(value, col, connection)
        return value

    return convert


_RETURNED_NAMES = [f.attname for f in RETURNED]


def _instance(alias: str, values: list[Any], claimed: dict[str, Any], plain: bool) -> Job:
    """``Job.from_db(alias, _RETURNED_NAMES, values)``, without ``Model.__init__``'s per-field work.

    It ran once per claimed job and cost the dispatcher more than the claim
    statement. The columns not returned stay deferred, as with ``from_db``.
    ``__init__`` is still used when a ``pre_init``/``post_init`` receiver
    listens for Job (``plain`` is False), the one thing it adds here.
    """
    if not plain:
        job = Job.from_db(alias, _RETURNED_NAMES, values)
    else:
        job = Job.__new__(Job)
        job.__dict__.update(zip(_RETURNED_NAMES, values, strict=True))
        job._state = ModelState()
        job._state.adding = False
        job._state.db = alias
    job.__dict__.update(claimed)
    return job
