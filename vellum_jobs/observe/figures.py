"""The queue's figures, read cheaply on a big table: counts by state, what waits, the workers.

One read model behind ``jobstats``, the health view, the dashboard and the
metrics. Counts by state stay cheap however big the table grows: each state
is counted through the ``vellum_job_state`` index, reading at most
``COUNT_LIMIT + 1`` entries (ten thousand); a state with more rows than that
is shown as the database planner's estimate ("about 950,000", from the
statistics ANALYZE keeps on PostgreSQL and MariaDB/MySQL), or as "more than
10,000" where there is none (SQLite). (``Job.objects.stats()`` counts every
row, which on a million finished jobs takes longer than the rest of a page.)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, TypedDict

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, router
from django.db.models import Count, Min, QuerySet
from django.utils.formats import number_format

from vellum_jobs.conf import conf, describe_duration
from vellum_jobs.core import clock, registry
from vellum_jobs.core.models import Job, Queue, Worker
from vellum_jobs.maintenance import schedules

logger = logging.getLogger("vellum_jobs")

# Index entries read per state before the count becomes an estimate.
COUNT_LIMIT = 10_000


@dataclasses.dataclass(frozen=True)
class StateCount:
    state: str
    count: int
    # "exact", "about" (a planner estimate) or "more than" (a lower bound).
    precision: str = "exact"

    @property
    def text(self) -> str:
        number = number_format(self.count, force_grouping=True)
        return number if self.precision == "exact" else f"{self.precision} {number}"


def by_state(jobs: QuerySet[Job], limit: int = COUNT_LIMIT) -> list[StateCount]:
    """One ``StateCount`` per state, in the order of ``Job.State``."""
    counts = []
    for state in Job.State.values:
        rows = jobs.filter(state=state).order_by()
        n = rows[: limit + 1].count()
        if n <= limit:
            counts.append(StateCount(state, n))
            continue
        estimate = planner_estimate(rows)
        if estimate is not None and estimate > limit:
            counts.append(StateCount(state, estimate, "about"))
        else:
            counts.append(StateCount(state, limit, "more than"))
    return counts


def planner_estimate(rows: QuerySet[Job]) -> int | None:
    """The number of rows the database expects ``rows`` to have, from its statistics; None if unknown."""
    vendor = connections[rows.db].vendor
    try:
        if vendor == "postgresql":
            plan = json.loads(rows.explain(format="json"))
            return int(plan[0]["Plan"]["Plan Rows"])
        if vendor == "mysql":
            return _mysql_rows(json.loads(rows.explain(format="json")))
    except (DatabaseError, ValueError, KeyError, IndexError, TypeError) as exc:
        logger.debug("no row estimate from the planner; the figures count instead error=%r", exc)
    return None


def _mysql_rows(plan: Any) -> int | None:
    # MySQL says "rows_examined_per_scan", MariaDB "rows"; both under the table
    # node. Through mysqlclient the plan can arrive as JSON inside a string.
    if isinstance(plan, str):
        return _mysql_rows(json.loads(plan))
    if isinstance(plan, dict):
        table = plan.get("table")
        if isinstance(table, dict):
            for key in ("rows_examined_per_scan", "rows"):
                if key in table:
                    return int(table[key])
        for value in plan.values():
            found = _mysql_rows(value)
            if found is not None:
                return found
    elif isinstance(plan, list):
        for value in plan:
            found = _mysql_rows(value)
            if found is not None:
                return found
    return None


class Workers(TypedDict):
    alive: int
    stale: int
    # Live workers whose host's clock is off the database's past ``clock.WARN_OFFSET``, in words.
    clocks_off: list[str]


class Figures(TypedDict):
    """What ``jobstats --json`` prints; its keys and shapes are a stable interface."""

    states: dict[str, int]
    names: dict[str, dict[str, int]]
    oldest_queued_age: float | None
    workers: Workers


def collect(alias: str | None = None, now: datetime | None = None) -> Figures:
    """The figures of the jobs on ``alias`` (the ``Job`` model's database when None), at ``now``."""
    now = now or clock.of(alias or router.db_for_read(Job) or DEFAULT_DB_ALIAS)
    return {
        "states": Job.objects.using(alias).stats(),
        "names": counts_by_name(alias),
        "oldest_queued_age": oldest_queued_age(alias, now),
        "workers": workers(alias, now),
    }


def counts_by_name(alias: str | None = None) -> dict[str, dict[str, int]]:
    """Job counts by name, then by state (every state present), names sorted."""
    names: dict[str, dict[str, int]] = {}
    rows = Job.objects.using(alias).order_by().values_list("name", "state").annotate(n=Count("id"))
    for name, state, n in rows:
        names.setdefault(name, dict.fromkeys(Job.State.values, 0))[state] = n
    return dict(sorted(names.items()))


def oldest_queued_age(alias: str | None, now: datetime) -> float | None:
    """Seconds the longest-waiting due job has been due at ``now``, paused queues left out (their
    jobs wait on purpose); None when no job is due."""
    paused = Queue.objects.using(alias).filter(paused_at__isnull=False).values("name")
    waiting = Job.objects.using(alias).due(now).exclude(queue__in=paused)
    oldest = waiting.aggregate(oldest=Min("run_after"))["oldest"]
    if not isinstance(oldest, datetime):
        return None
    return round(max((now - oldest).total_seconds(), 0.0), 3)


def workers(alias: str | None, now: datetime) -> Workers:
    """Worker processes whose heartbeat is within ``LEASE`` (alive, as ``Worker.is_alive``) and older."""
    alive_since = now - timedelta(seconds=conf.lease)
    rows = Worker.objects.using(alias).only("host", "pid", "last_heartbeat", "clock_offset")
    alive = [worker for worker in rows if worker.last_heartbeat >= alive_since]
    clocks_off = [f"{worker}: {worker.clock_warning}" for worker in alive if worker.clock_warning]
    return {"alive": len(alive), "stale": len(rows) - len(alive), "clocks_off": clocks_off}


def registered_queues() -> set[str]:
    """The default queue and each registered job's own."""
    return {str(Job._meta.get_field("queue").default), *(h.options.queue for h in registry.registered())}


def worker_queues(workers: Iterable[Worker]) -> set[str]:
    # A worker's row lists no queue when it serves them all.
    return {queue for worker in workers for queue in worker.queues or () if isinstance(queue, str)}


def oldest_due_ages(alias: str | None, now: datetime) -> dict[str, float]:
    """Seconds each queue's oldest due job has been due at ``now``, for the queues with one."""
    rows = Job.objects.using(alias).due(now).order_by().values_list("queue").annotate(oldest=Min("run_after"))
    return {queue: round(max((now - oldest).total_seconds(), 0.0), 3) for queue, oldest in rows}


@dataclasses.dataclass(frozen=True)
class OldestDue:
    """The job that has waited longest since it became due, in a queue that is not paused."""

    queue: str
    job_id: int
    name: str
    age: float  # seconds since its run_after

    def __str__(self) -> str:
        return f"queue {self.queue}: job #{self.job_id} {self.name} has waited {describe_duration(self.age)}"


def paused_queues(alias: str | None) -> set[str]:
    return set(Queue.objects.using(alias).filter(paused_at__isnull=False).values_list("name", flat=True))


def oldest_due_job(
    alias: str | None = None,
    now: datetime | None = None,
    ages: dict[str, float] | None = None,
    paused: set[str] | None = None,
) -> OldestDue | None:
    """The oldest due job of the queues not paused (``ages`` and ``paused`` as read already, else
    read here); None when none is due."""
    now = now or clock.of(alias or router.db_for_read(Job) or DEFAULT_DB_ALIAS)
    ages = oldest_due_ages(alias, now) if ages is None else ages
    paused = paused_queues(alias) if paused is None else paused
    waiting = {queue: age for queue, age in ages.items() if queue not in paused}
    if not waiting:
        return None
    queue = max(waiting, key=lambda q: (waiting[q], q))
    rows = Job.objects.using(alias).due(now).filter(queue=queue).order_by("run_after", "pk")
    row = rows.values_list("pk", "name", "run_after").first()
    if row is None:  # claimed since
        return None
    pk, name, since = row
    return OldestDue(queue, pk, name, round(max((now - since).total_seconds(), 0.0), 3))


# Running jobs counted by (queue, worker id, is_async).
Running = list[tuple[str, uuid.UUID | None, bool, int]]


def running_jobs(alias: str | None) -> Running:
    """The running jobs, counted by queue, worker and kind: few rows, read on the lease index."""
    rows = Job.objects.using(alias).running().order_by().values_list("queue", "worker_id", "is_async")
    return list(rows.annotate(n=Count("pk")))


class ScheduleFigures(TypedDict):
    job: str
    cron: str
    timezone: str
    last_run: str | None
    last_job_id: int | None
    next_run: str


def schedule_figures(alias: str | None = None, now: datetime | None = None) -> dict[str, ScheduleFigures]:
    """Each declared schedule (sorted by name) with its last run (ISO 8601 or None) and next run."""
    rows = schedules.overview(alias, now)
    return {
        row["name"]: {
            "job": row["job"],
            "cron": row["cron"],
            "timezone": row["timezone"],
            "last_run": row["last_run"].isoformat() if row["last_run"] else None,
            "last_job_id": row["last_job_id"],
            "next_run": row["next_run"].isoformat(),
        }
        for row in rows
    }
