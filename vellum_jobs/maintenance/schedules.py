"""Recurring jobs: the schedules declared in code and settings, and the tick that enqueues them.

Every ``runjobs`` process ticks at each scheduled instant; no process is
elected to do it. The database makes the outcome the same as if one had:
a job carries its schedule and instant, and a unique key on the two lets
exactly one of any number of concurrent inserts in. The ``Schedule`` row
remembers the latest instant dealt with, so an instant is never enqueued
twice, even after its job was pruned.

An instant enqueued more than ``ON_TIME`` late was missed (every worker was
down). Only the latest missed instant counts: by default it runs once, as
soon as a worker is back; a schedule with ``"missed": "skip"`` waits for
its next instant instead. Either way, never a burst of every missed run.
Cron expressions are croniter's, read in the schedule's time zone; croniter
(and dateutil, which it brings) is imported by the first schedule that
reads one, so a project without schedules never loads it.

An operator can disable a schedule (``Schedule.disabled_at``): every tick
then records its instants as dealt with, without a job, so enabling it
again fires nothing for the time it was off; ``enable`` also moves its
latest instant dealt with up to now, for the instants that fell while no
worker ticked. ``run_now`` enqueues one run by hand, outside the instants:
its job names the schedule but no instant, so it neither takes nor skips
one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from vellum_jobs.conf import conf
from vellum_jobs.core.models import Job, Schedule
from vellum_jobs.enqueueing import job_function
from vellum_jobs.enqueueing.rows import enqueue_calls
from vellum_jobs.store import lock_waits

logger = logging.getLogger("vellum_jobs")

# What a SCHEDULES entry (or @job's schedule dict, without "job") may say.
KEYS = ("job", "cron", "args", "kwargs", "timezone", "missed", "queue", "priority")
MISSED = ("run_once", "skip")

# How late an instant may be enqueued and still be on time, not missed.
ON_TIME = timedelta(minutes=1)

# A process re-reads the clock at least this often while it waits for an instant.
MAX_WAIT = 60.0


@dataclasses.dataclass(frozen=True)
class Definition:
    """One schedule: run ``job`` with these arguments at each instant of ``cron``."""

    name: str
    job: str
    cron: str
    timezone: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    missed: str = "run_once"
    queue: str | None = None
    priority: int | None = None

    @property
    def zone(self) -> tzinfo:
        return ZoneInfo(self.timezone)

    def previous(self, now: datetime) -> datetime:
        """The latest instant at or before ``now``."""
        from croniter import croniter

        local = _aware(now).astimezone(self.zone)
        # croniter's get_prev is strictly before its start: start a microsecond later.
        instant = croniter(self.cron, local + timedelta(microseconds=1)).get_prev(datetime)
        return _stored(instant)

    def next(self, now: datetime) -> datetime:
        """The first instant after ``now``."""
        from croniter import croniter

        local = _aware(now).astimezone(self.zone)
        return _stored(croniter(self.cron, local).get_next(datetime))


def valid_cron(cron: str) -> bool:
    """Whether croniter reads ``cron`` as a cron expression."""
    from croniter import croniter

    return bool(croniter.is_valid(cron))


def _aware(value: datetime) -> datetime:
    return value if timezone.is_aware(value) else timezone.make_aware(value)


def _stored(value: datetime) -> datetime:
    """``value`` as Django stores datetimes: aware UTC with USE_TZ, else naive local time."""
    if conf.use_tz:
        return value.astimezone(ZoneInfo("UTC"))
    return timezone.make_naive(value)


def declared() -> dict[str, dict[str, Any]]:
    """Every schedule entry as written, by name: ``@job(schedule=...)`` ones, then ``SCHEDULES``.

    A decorator's schedule is named after its job. Entries are not checked
    here; the system checks do that (``vellum_jobs.checks``).
    """
    entries: dict[str, dict[str, Any]] = {}
    for function in job_function.functions():
        if function.schedule is None:
            continue
        given = function.schedule
        entry = {"cron": given} if isinstance(given, str) else dict(given)
        entries[function.name] = {**entry, "job": function.name}
    for name, entry in conf.schedules.items():
        entries.setdefault(str(name), entry if isinstance(entry, dict) else {})
    return entries


def definitions() -> list[Definition]:
    """The declared schedules, by name (the system checks have vouched for them)."""
    return [_definition(name, entry) for name, entry in sorted(declared().items())]


def find(name: str) -> Definition | None:
    """The declared schedule ``name``; None if none is declared by that name."""
    entry = declared().get(name)
    return None if entry is None else _definition(name, entry)


def _definition(name: str, entry: Mapping[str, Any]) -> Definition:
    return Definition(
        name=name,
        job=entry["job"],
        cron=entry["cron"],
        timezone=entry.get("timezone") or conf.time_zone,
        args=tuple(entry.get("args") or ()),
        kwargs=dict(entry.get("kwargs") or {}),
        missed=entry.get("missed", "run_once"),
        queue=entry.get("queue"),
        priority=entry.get("priority"),
    )


def tick(alias: str, now: datetime | None = None) -> list[Job]:
    """Enqueue every schedule's latest instant that is due and not yet dealt with; returns the new jobs."""
    now = now or timezone.now()
    enqueued = []
    for definition in definitions():
        # A session cut off while it dealt with this instant holds its rows: fail, not wait.
        with lock_waits.bounded(alias):
            job = tick_one(alias, definition, now)
        if job is not None:
            enqueued.append(job)
    return enqueued


def tick_one(alias: str, definition: Definition, now: datetime) -> Job | None:
    """Deal with ``definition``'s latest instant at ``now``: enqueue it, skip it, or find it done."""
    state = _state(alias, definition.name, now)
    instant = definition.previous(now)
    if instant <= (state.last_instant or state.first_seen):
        return None
    if state.disabled_at is not None:
        _advance(alias, definition.name, instant)
        logger.info(
            "schedule %s is disabled: its %s run is skipped schedule=%s instant=%s",
            definition.name,
            instant.isoformat(),
            definition.name,
            instant.isoformat(),
        )
        return None
    late = now - instant > ON_TIME
    if late and definition.missed == "skip":
        _advance(alias, definition.name, instant)
        logger.info(
            "schedule %s missed its %s run; skipped, as its missed= policy says schedule=%s instant=%s",
            definition.name,
            instant.isoformat(),
            definition.name,
            instant.isoformat(),
        )
        return None
    job = _enqueue(alias, definition, instant)
    if job is None:
        return None
    logger.info(
        "schedule %s enqueued %s #%s for its %s run schedule=%s instant=%s job_id=%s catch_up=%s",
        definition.name,
        job.name,
        job.pk,
        instant.isoformat(),
        definition.name,
        instant.isoformat(),
        job.pk,
        late,
    )
    return job


def run_now(alias: str, definition: Definition) -> Job:
    """Enqueue one run of ``definition`` now, as its tick would but for no instant; it becomes the
    schedule's last run."""
    job = _enqueue_job(definition, columns={"schedule": definition.name})
    _state(alias, definition.name, timezone.now())
    Schedule.objects.using(alias).filter(name=definition.name).update(
        last_run_at=job.created_at, last_job_id=job.pk
    )
    logger.info(
        "schedule %s run now by hand: enqueued %s #%s schedule=%s job_id=%s",
        definition.name,
        job.name,
        job.pk,
        definition.name,
        job.pk,
    )
    return job


def disable(alias: str, name: str, *, by: str = "", now: datetime | None = None) -> bool:
    """Stop every worker from enqueueing schedule ``name``'s instants; False if it was disabled already."""
    now = now or timezone.now()
    _state(alias, name, now)
    rows = Schedule.objects.using(alias).filter(name=name, disabled_at=None)
    return bool(rows.update(disabled_at=now, disabled_by=by[:255]))


def enable(alias: str, definition: Definition, now: datetime | None = None) -> bool:
    """Let workers enqueue ``definition``'s instants again, from its next one (the instants that fell
    while it was disabled are skipped, whatever its ``missed``); False if it was not disabled."""
    now = now or timezone.now()
    with transaction.atomic(using=alias):
        enabled = bool(
            Schedule.objects.using(alias)
            .filter(name=definition.name)
            .exclude(disabled_at=None)
            .update(disabled_at=None, disabled_by="")
        )
        if enabled:
            _advance(alias, definition.name, definition.previous(now))
    return enabled


def _state(alias: str, name: str, now: datetime) -> Schedule:
    """The schedule's row; created (first seen now, so no past instant runs) the first time."""
    state, _ = Schedule.objects.using(alias).get_or_create(name=name, defaults={"first_seen": now})
    return state


def _enqueue(alias: str, definition: Definition, instant: datetime) -> Job | None:
    """Insert the job for ``instant`` unless another process did; None if it did."""
    try:
        with transaction.atomic(using=alias):
            job = _enqueue_job(definition, columns={"schedule": definition.name, "scheduled_for": instant})
            _advance(alias, definition.name, instant, job)
    except IntegrityError:
        # The unique key on (schedule, scheduled_for): another process enqueued it.
        return None
    return job


def _enqueue_job(definition: Definition, columns: Mapping[str, Any]) -> Job:
    """Insert ``definition``'s job, on its queue and priority if it names them, with ``columns``."""
    function = job_function.get(definition.job)
    changes: dict[str, Any] = {}
    if definition.queue is not None:
        changes["queue"] = definition.queue
    if definition.priority is not None:
        changes["priority"] = definition.priority
    if changes:
        function = function.using(**changes)
    return enqueue_calls(function, [(definition.args, definition.kwargs)], columns=columns)[0]


def _advance(alias: str, name: str, instant: datetime, job: Job | None = None) -> None:
    """Record ``instant`` as dealt with (never moving backwards), and its job if it got one."""
    changes: dict[str, Any] = {"last_instant": instant}
    if job is not None:
        changes.update(last_run_at=instant, last_job_id=job.pk)
    earlier = Q(last_instant__isnull=True) | Q(last_instant__lt=instant)
    Schedule.objects.using(alias).filter(earlier, name=name).update(**changes)


def seconds_until_next(now: datetime | None = None) -> float | None:
    """Seconds from ``now`` to the next instant of any schedule, at most ``MAX_WAIT``; None without any."""
    now = now or timezone.now()
    found = [definition.next(now) for definition in definitions()]
    if not found:
        return None
    return max(0.0, min(MAX_WAIT, (min(found) - now).total_seconds()))


def overview(alias: str | None = None, now: datetime | None = None) -> list[dict[str, Any]]:
    """Each declared schedule with its last and next run, for ``jobstats`` and the admin."""
    now = now or timezone.now()
    states = {state.name: state for state in Schedule.objects.using(alias).all()}
    rows = []
    for definition in definitions():
        state = states.get(definition.name)
        rows.append(
            {
                "name": definition.name,
                "job": definition.job,
                "cron": definition.cron,
                "timezone": definition.timezone,
                "missed": definition.missed,
                "last_run": state.last_run_at if state else None,
                "last_job_id": state.last_job_id if state else None,
                "next_run": definition.next(now),
            }
        )
    return rows
