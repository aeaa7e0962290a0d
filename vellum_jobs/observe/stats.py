"""The queue's figures, shared by ``jobstats`` and the health view: counts, waiting, workers.

Each figure is one query: counts by state through ``Job.objects.stats()``,
counts by name and state in one GROUP BY, the oldest due job as
``MIN(run_after)`` over queued rows (the claim index holds just those), and
live and stale workers (and clocks that are off) in one read of the small ``Worker`` table.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TypedDict

from django.db import DEFAULT_DB_ALIAS, router
from django.db.models import Count, Min

from vellum_jobs.conf import conf
from vellum_jobs.core import clock, handlers
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.maintenance import schedules


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
    """Seconds the longest-waiting due job has been due at ``now``; None when no job is due."""
    oldest = Job.objects.using(alias).due(now).aggregate(oldest=Min("run_after"))["oldest"]
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
    return {str(Job._meta.get_field("queue").default), *(h.options.queue for h in handlers.registered())}


def worker_queues(workers: Iterable[Worker]) -> set[str]:
    # A worker's row lists no queue when it serves them all.
    return {queue for worker in workers for queue in worker.queues or () if isinstance(queue, str)}


def oldest_due_ages(alias: str | None, now: datetime) -> dict[str, float]:
    """Seconds each queue's oldest due job has been due at ``now``, for the queues with one."""
    rows = Job.objects.using(alias).due(now).order_by().values_list("queue").annotate(oldest=Min("run_after"))
    return {queue: round(max((now - oldest).total_seconds(), 0.0), 3) for queue, oldest in rows}


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
