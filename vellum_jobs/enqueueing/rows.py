"""Turning calls of a job function into ``Job`` rows, checked before anything is written.

``enqueue()`` is the hot path of a web request that queues work, so a plain
job (no unique key, no limits, no fair key) takes the short way: its arguments
are encoded once, for the size check and the INSERT, the INSERT is one
statement (``vellum_jobs.store.inserts``), and the returned ``Job`` is built
without ``Model.__init__``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, connections, router, transaction
from django.db.models import signals
from django.db.models.base import ModelState
from django.utils import timezone

from vellum_jobs.conf import conf, parse_duration
from vellum_jobs.core import clock
from vellum_jobs.core.models import Job, reference_of
from vellum_jobs.core.options import seconds
from vellum_jobs.core.payload import check_sizes, encode_call, normalise_call
from vellum_jobs.enqueueing import batches, fairness, uniqueness
from vellum_jobs.execution import inline, tracing
from vellum_jobs.store import inserts

if TYPE_CHECKING:
    from vellum_jobs.core.registry import Handler


# The state as a plain str: a driver adapts a str subclass (the enum) by a slower way.
QUEUED = str(Job.State.QUEUED.value)


def enqueue_calls(
    function: Handler[Any, Any],
    calls: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    *,
    columns: Mapping[str, Any] | None = None,
) -> list[Job]:
    """Insert one queued job per (args, kwargs) call; all are checked before any is written.

    ``columns`` sets further fields on every row (the Tasks backend marks its jobs,
    schedules theirs). A unique job whose key another job holds is not inserted:
    that job is returned in its place (see ``vellum_jobs.enqueueing.uniqueness``).
    """
    options = function.options
    alias = router.db_for_write(Job) or DEFAULT_DB_ALIAS
    now = clock.of(alias)
    ref_type, ref_id = reference_of(options.ref) if options.ref is not None else (None, "")
    # Every column of the new rows, in model order; only args and kwargs vary per call.
    row = {
        "name": function.name,
        "is_async": function.is_async,
        "queue": options.queue,
        "priority": options.priority,
        "state": QUEUED,
        "attempts": 0,
        "claims": 0,  # not inserted: the column's database default, here for the returned instances
        "max_attempts": options.max_attempts or conf.max_attempts,
        "timeout": None if options.timeout is None else parse_duration(options.timeout),
        "run_after": _run_after(options.run_after, options.delay, now),
        "created_at": now,
        "error": "",
        "progress_message": "",
        "ref_type_id": ref_type.pk if ref_type is not None else None,
        "ref_id": ref_id,
        "task_backend": "",
        "task_runs": [],
        "attempt_errors": [],
        "trace_context": "",
        "unique_key": None,
        "unique_while": "",
        "schedule": "",
        "scheduled_for": None,
        "concurrency_key": "",
        "concurrency_limit": 0,
        "workflow_id": batches.current_id(),
        "run_if": "",
        "upstream_arg": "",
        "limits": "",
        "fair_key": "",
        "fair_at": None,
        **(columns or {}),
    }
    normalised = [normalise_call(function.name, args, kwargs) for args, kwargs in calls]
    if not normalised:
        return []
    if tracing.enabled and (tracer := tracing.tracer()) is not None:
        with tracing.enqueueing(tracer, function.name, options.queue, len(normalised)) as span:
            row["trace_context"] = tracing.injected()
            jobs, new = _insert(alias, function, row, calls, normalised)
            tracing.enqueued(span, jobs)
    else:
        jobs, new = _insert(alias, function, row, calls, normalised)
    if inline.enabled():
        inline.run_now(new)
    return jobs


def _insert(
    alias: str,
    function: Handler[Any, Any],
    row: dict[str, Any],
    calls: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    normalised: list[tuple[list[Any], dict[str, Any]]],
) -> tuple[list[Job], list[Job]]:
    """INSERT a job per call; returns the jobs, and those of them that are new (not a unique key's holder)."""
    options = function.options
    plain = options.unique_key is None and not (options.limited or options.gated) and options.fair_key is None
    if plain and len(normalised) == 1:
        (args, kwargs) = normalised[0]
        pk = inserts.insert_one(connections[alias], row, *encode_call(function.name, args, kwargs))
        jobs = _instances(alias, row, [pk], normalised)
        return jobs, jobs
    check_sizes(function.name, normalised)
    if plain:
        jobs = _instances(alias, row, inserts.insert(connections[alias], row, normalised), normalised)
        return jobs, jobs
    if options.unique_key is None and options.fair_key is None and len(normalised) > 1:
        jobs = _insert_by_limits(alias, function, row, normalised)
        return jobs, jobs
    # Columns that depend on each call's arguments: one INSERT per call.
    fair_keys = fairness.keys(function, normalised) if options.fair_key is not None else None
    with transaction.atomic(using=alias) if len(calls) > 1 else nullcontext():
        rows = [row] * len(calls)
        if fair_keys is not None:
            rows = fairness.rows(alias, function, row, fair_keys, row["created_at"])
        pairs = [
            _enqueue_one(alias, one, function, raw, call)
            for one, raw, call in zip(rows, calls, normalised, strict=True)
        ]
    return [job for job, _ in pairs], [job for job, created in pairs if created]


def _insert_by_limits(
    alias: str,
    function: Handler[Any, Any],
    row: dict[str, Any],
    calls: list[tuple[list[Any], dict[str, Any]]],
) -> list[Job]:
    """Calls of a job with a concurrency key or limits, in one bulk INSERT per distinct key and limits
    (one for all when the keys are fixed strings); the jobs in the order of the calls."""
    groups: dict[tuple[str, int, str], list[int]] = {}
    for i, (args, kwargs) in enumerate(calls):  # every key made before anything is written
        key, limit = function.concurrency_for(args, kwargs)
        groups.setdefault((key, limit, function.limits_for(args, kwargs).encode()), []).append(i)
    jobs: list[Job] = [None] * len(calls)  # type: ignore[list-item] # each filled below
    with transaction.atomic(using=alias) if len(groups) > 1 else nullcontext():
        for (key, limit, text), indexes in groups.items():
            keyed = {**row, "concurrency_key": key, "concurrency_limit": limit, "limits": text}
            group = [calls[i] for i in indexes]
            ids = inserts.insert(connections[alias], keyed, group)
            for i, job in zip(indexes, _instances(alias, keyed, ids, group), strict=True):
                jobs[i] = job
    return jobs


def _enqueue_one(
    alias: str,
    row: dict[str, Any],
    function: Handler[Any, Any],
    raw: tuple[Sequence[Any], Mapping[str, Any]],
    call: tuple[list[Any], dict[str, Any]],
) -> tuple[Job, bool]:
    """One call of a job with a unique key or limits: inserted, or the job that holds its unique key."""
    options = function.options
    args, kwargs = call
    concurrency_key, limit = function.concurrency_for(args, kwargs)
    row = {
        **row,
        "concurrency_key": concurrency_key,
        "concurrency_limit": limit,
        "limits": function.limits_for(args, kwargs).encode(),
    }
    key = uniqueness.key_for(options, *raw) if options.unique_key is not None else None
    if key is None:  # not unique, or the key function opted this call out
        return _insert_one(alias, row, args, kwargs), True
    keyed = {**row, "unique_key": key, "unique_while": options.unique_while}

    def insert_one() -> Job:
        return _insert_one(alias, keyed, args, kwargs)

    return uniqueness.enqueue(
        alias, insert_one, key=key, options=options, args=args, kwargs=kwargs, run_after=row["run_after"]
    )


def _insert_one(alias: str, row: dict[str, Any], args: list[Any], kwargs: dict[str, Any]) -> Job:
    """INSERT one job whose row depends on its arguments (a key); returns it as ``Job.from_db`` would."""
    return _instance(alias, row, inserts.insert_one(connections[alias], row, args, kwargs), args, kwargs)


def _instance(alias: str, row: dict[str, Any], pk: int, args: list[Any], kwargs: dict[str, Any]) -> Job:
    values = {**row, "id": pk, "args": args, "kwargs": kwargs}
    return Job.from_db(alias, _ATTNAMES, [values.get(name) for name in _ATTNAMES])


def _instances(
    alias: str, row: dict[str, Any], ids: list[int], calls: list[tuple[list[Any], dict[str, Any]]]
) -> list[Job]:
    """What ``Job.from_db`` would build, without ``Model.__init__``'s per-field work.

    For ``enqueue_many`` of many jobs, building instances field by field cost
    more than inserting the rows. Only used when no ``pre_init``/``post_init``
    receiver listens for Job, the one thing ``__init__`` adds here.
    """
    if signals.pre_init.has_listeners(Job) or signals.post_init.has_listeners(Job):
        return [
            _instance(alias, row, pk, args, kwargs) for pk, (args, kwargs) in zip(ids, calls, strict=True)
        ]
    base = {**_NULLS, **row}  # every row key is a field's attname
    jobs = []
    for pk, (args, kwargs) in zip(ids, calls, strict=True):
        state = ModelState()
        state.adding = False
        state.db = alias
        job = Job.__new__(Job)
        job.__dict__ = {**base, "id": pk, "args": args, "kwargs": kwargs, "_state": state}
        jobs.append(job)
    return jobs


_ATTNAMES = [f.attname for f in Job._meta.concrete_fields]
# What a new job holds in the columns an enqueue leaves alone.
_NULLS = dict.fromkeys(_ATTNAMES)


def _run_after(run_after: datetime | None, delay: float | timedelta | None, now: datetime) -> datetime:
    if delay is not None:
        return now + timedelta(seconds=seconds("delay", delay))
    if run_after is None:
        return now
    if not isinstance(run_after, datetime):
        raise ValueError(f"run_after must be a datetime, got {run_after!r}")
    if conf.use_tz and timezone.is_naive(run_after):
        raise ValueError(
            f"run_after {run_after.isoformat()} is naive but USE_TZ is True: "
            "pass an aware datetime (e.g. timezone.now() + timedelta(...))"
        )
    if not conf.use_tz and timezone.is_aware(run_after):
        return timezone.make_naive(run_after)
    return run_after
