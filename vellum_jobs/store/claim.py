"""The claim: one atomic statement per database vendor that hands due jobs to a worker.

Each vendor gets the cheapest statement that cannot give one job to two
workers; its SQL is in that vendor's module of ``vellum_jobs.store.sql``. This
module decides what a claim asks for and turns the rows into jobs. ``now``
is passed in, so the clock is the caller's (and a test's) to choose.

More conditions ride in the same statement, so they cost no extra query.
A job is taken only by a worker that knows its name (or, for a Django task,
runs its ``TASKS`` alias): in a rolling deploy a worker of the old code
leaves a new kind of job to the new workers (``unknown_names`` says what
becomes of a job no live worker knows). A paused queue's jobs are skipped
(a subquery on the small queue table). And a job with a concurrency key is
taken only while fewer than its limit of its key are running and no job of
its key is ahead of it (at most one per key per claim). On SQLite that is
race-free as it stands: the statement holds the write lock while it reads.
PostgreSQL and MySQL read a snapshot, so two claims could each see a free
slot; there a claim that took keyed jobs locks their keys, counts again with
a fresh read and hands back any excess before it commits (``_within_limits``).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import signals as model_signals
from django.db.models.base import ModelState

from vellum_jobs.conf import conf
from vellum_jobs.core import registry, transitions
from vellum_jobs.core.models import Job
from vellum_jobs.store import fence, putback, sql, transactions
from vellum_jobs.store.sql import names

RETURNED = names.RETURNED


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
    # Only jobs whose handler is (True) or is not (False) an ``async def``: a
    # worker claims for its threads and its event loop apart. None: either,
    # one claim per kind (``_either_kind``).
    is_async: bool | None = None
    # Only jobs of these names (a worker's registry: ``Worker.names``), and
    # Django tasks of these ``TASKS`` aliases. None: this process's own.
    names: Sequence[str] | None = None
    task_backends: Sequence[str] | None = None

    def known(self) -> tuple[Sequence[str], Sequence[str]]:
        """The names and the ``TASKS`` aliases of the jobs this claim may take."""
        names = registry.names() if self.names is None else self.names
        aliases = conf.task_backends() if self.task_backends is None else self.task_backends
        return names, aliases


def claim(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Job]:
    """Mark up to ``limit`` due jobs running for ``worker_id`` and return them in claim order.

    Order: highest priority, then earliest ``run_after``, then id. ``attempts``
    grows by one, so a run that dies with its process still counts.
    """
    if request.limit < 1:
        return []
    if request.is_async is None:
        return _either_kind(connection, request)
    if connection.vendor == "sqlite" or not request.limits:
        return _claim_rows(connection, request)
    with transactions.short_transaction(connection):
        return _within_limits(connection, request, _claim_rows(connection, request))


def _either_kind(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Job]:
    """Up to ``limit`` jobs of either kind, in claim order: each kind's best, the excess handed back.

    The claim index leads with the kind, so one scan over both kinds cannot
    follow its order: MariaDB would sort every queued job and lock each one it
    read, leaving none for a concurrent claimer. Each kind's scan is the
    worker's own; what the two took past ``limit`` goes back queued, unseen,
    in the same transaction.
    """
    with transactions.short_transaction(connection):
        jobs = [
            *claim(connection, dataclasses.replace(request, is_async=False)),
            *claim(connection, dataclasses.replace(request, is_async=True)),
        ]
        jobs.sort(key=_claim_order)
        _unclaim(jobs[request.limit :])
        return jobs[: request.limit]


def _claim_rows(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Job]:
    return _jobs(connection, request, sql.of(connection).claim(connection, *_parts(connection, request)))


def _shape(request: ClaimRequest) -> sql.Shape:
    if request.is_async is None:
        raise ValueError("a claim statement takes one kind of job: is_async must be True or False")
    names, aliases = request.known()
    return sql.Shape(len(request.queues), request.limits, len(names), len(aliases))


def _parts(
    connection: BaseDatabaseWrapper, request: ClaimRequest
) -> tuple[sql.Shape, tuple[str, list[Any]], list[Any]]:
    """What a dialect renders a claim from: its shape, SET list and scan parameters."""
    shape = _shape(request)
    sets = (_set_running_sql(connection), fence.set_params(connection, _claimed(request)))
    return shape, sets, _due_params(connection, request)


def _jobs(connection: BaseDatabaseWrapper, request: ClaimRequest, rows: Sequence[Sequence[Any]]) -> list[Job]:
    """The claimed rows as jobs, in claim order."""
    # What the claim wrote, known without asking the database (a deferred
    # field would cost a query on first access); the counters came back.
    claimed = {
        name: value for name, value in _claimed(request).items() if not isinstance(value, transitions.Add)
    }
    convert = _converter(connection)
    plain = not (model_signals.pre_init.has_listeners(Job) or model_signals.post_init.has_listeners(Job))
    jobs = [_instance(connection.alias, convert(row), claimed, plain) for row in rows]
    jobs.sort(key=_claim_order)
    return jobs


def _claim_order(job: Job) -> tuple[int, datetime, int]:
    return -job.priority, job.run_after, job.pk


def candidates(connection: BaseDatabaseWrapper, request: ClaimRequest) -> tuple[str, list[Any]]:
    """The claim's candidate scan as a plain SELECT with ``%s`` placeholders (for EXPLAIN)."""
    return sql.of(connection).scan(connection, _shape(request)), _due_params(connection, request)


def _claimed(request: ClaimRequest) -> dict[str, Any]:
    return transitions.claimed(request.worker_id, request.now, request.lease_until)


def _set_running_sql(connection: BaseDatabaseWrapper) -> str:
    sets = _set_running.get(connection.vendor)
    if sets is None:
        # Only the column names and kinds of change matter to the SQL, so any request will do.
        claimed = transitions.claimed(uuid.UUID(int=0), _EPOCH, _EPOCH)
        sets = _set_running[connection.vendor] = fence.set_sql(connection, claimed)
    return sets


_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_set_running: dict[str, str] = {}


def _claimable_params(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Any]:
    dialect = sql.of(connection)
    now = connection.ops.adapt_datetimefield_value(request.now)
    names, aliases = request.known()
    return [
        transitions.QUEUED,
        now,
        *dialect.queue_params(request.queues),
        *dialect.list_params(names),
        *dialect.list_params(aliases),
    ]


def _due_params(connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[Any]:
    params = [*_claimable_params(connection, request), request.is_async]
    if request.limits:
        params += [transitions.RUNNING, *_claimable_params(connection, request)]
    return [*params, request.limit]


# -- concurrency limits on PostgreSQL and MySQL -------------------------------


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
    dialect = sql.of(connection)
    dialect.lock_keys(connection, keys, request.now)
    running = dialect.running_counts(connection, keys)
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


def _unclaim(jobs: list[Job]) -> None:
    """Put jobs this claim took back as they were: queued, the attempt not counted."""
    write = transitions.unclaimed()
    for job in sorted(jobs, key=lambda job: job.pk):
        putback.if_held(job, job.claims, write)


_converters_cache: dict[tuple[str, bool], Callable[[Sequence[Any]], list[Any]]] = {}


def _converter(connection: BaseDatabaseWrapper) -> Callable[[Sequence[Any]], list[Any]]:
    """A function that applies to a returned row what the ORM applies to a SELECT of its columns."""
    utc_text = _utc_text(connection)
    convert = _converters_cache.get((connection.vendor, utc_text))
    if convert is None:
        steps: list[tuple[int, Callable[[Any], Any]]] = []
        for i, field in enumerate(RETURNED):
            col = field.get_col(Job._meta.db_table)
            found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if not found:
                continue
            if _plain_json(field, found):
                steps.append((i, _json_loads))
            elif utc_text and field.get_internal_type() == "DateTimeField":
                steps.append((i, _utc_datetime))
            else:
                steps.append((i, _chain(found, col, connection)))

        def convert(row: Sequence[Any]) -> list[Any]:
            values = list(row)
            for i, step in steps:
                values[i] = step(values[i])
            return values

        _converters_cache[connection.vendor, utc_text] = convert
    return convert


def _utc_text(connection: BaseDatabaseWrapper) -> bool:
    """Whether datetimes come back in UTC: SQLite with ``USE_TZ`` and no database ``TIME_ZONE``."""
    return connection.vendor == "sqlite" and settings.USE_TZ and connection.timezone is UTC


def _utc_datetime(value: Any) -> Any:
    # SQLite's convert_datetimefield_value for such a connection, less its
    # settings lookups and the regex fallback that ISO text never needs.
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


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
