"""The dashboard: is the queue keeping up, what is failing, which workers are alive, on one page.

Every figure is cheap on a table of millions of jobs. Counts of queued jobs
read at most ``figures.COUNT_LIMIT`` rows per queue and become the planner's
estimate past it (as the counts above the job list do); running jobs are
few and counted exactly; failures in the last hour and the charts come from
the per-minute rows the workers' heartbeats keep (``rollup``), and so do
the figures of each job name, percentiles included (``name_rollup``);
the oldest due job is one MIN over the queued jobs of each queue, paused
queues left out of the headline (their jobs wait on purpose). The limit keys
that hold jobs back (held, or full with jobs waiting) come from
``observe.limits``, as on the Limits page. Jobs waiting
for other jobs (a workflow's steps, a batch's callback) are counted apart
from the queued ones: no worker could take them yet. The page
asks for its own body again every few seconds and swaps it in, without a
reload.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import django
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from vellum_jobs.admin import charts, display
from vellum_jobs.conf import conf
from vellum_jobs.core.models import Job, Queue, Worker
from vellum_jobs.observe import figures, limits
from vellum_jobs.store import name_rollup, rollup

# How often the page refreshes its figures, in seconds.
REFRESH = 5
# The labels of the charts' two ends.
HOUR, DAY = ("60 min ago", "now"), ("24 h ago", "now")
# The throttled limit keys listed at most (the Limits page lists them all).
THROTTLED_SHOWN = 10
# Django 6 styles the breadcrumbs as a list (``ol.breadcrumbs``), 5.2 as a ``div``.
LIST_BREADCRUMBS = django.VERSION >= (6, 0)


@dataclasses.dataclass
class QueueFigures:
    name: str
    due: figures.StateCount
    delayed: figures.StateCount
    running: int
    failed_last_hour: int
    oldest_due_age: float | None
    paused: bool

    @property
    def oldest_due_text(self) -> str:
        return _waited(self.oldest_due_age)


@dataclasses.dataclass
class WorkerFigures:
    worker: Worker
    alive: bool
    busy_threads: int  # sync jobs it holds running (prefetched ones included)
    busy_async: int  # coroutine jobs its event loop runs
    heartbeat_age: str  # since its last heartbeat, in words

    @property
    def threads(self) -> int:
        return self.worker.threads

    @property
    def async_slots(self) -> int:
        return self.worker.async_workers


@dataclasses.dataclass
class NameFigures:
    """One job name's last hour: outcomes per minute, failure rate, duration and wait percentiles."""

    name: str
    minutes: list[rollup.Bucket]
    total: name_rollup.Figures
    chart: str = ""

    @property
    def failure_rate_text(self) -> str:
        rate = self.total.failure_rate
        if rate is None:
            return ""
        return "<1%" if 0 < rate < 0.01 else f"{rate:.0%}"

    def _text(self, seconds: float | None) -> str:
        return "" if seconds is None else display.duration(timedelta(seconds=seconds))

    @property
    def duration_p50(self) -> str:
        return self._text(self.total.duration(0.5))

    @property
    def duration_p95(self) -> str:
        return self._text(self.total.duration(0.95))

    @property
    def wait_p50(self) -> str:
        return self._text(self.total.wait(0.5))

    @property
    def wait_p95(self) -> str:
        return self._text(self.total.wait(0.95))


# How the table of job names can be sorted: its key, and the link's words.
SORTS: dict[str, tuple[str, Callable[[NameFigures], tuple[float, ...]]]] = {
    "failing": (
        "most failing",
        lambda n: (-n.total.failures, -(n.total.failure_rate or 0.0)),
    ),
    "slowest": ("slowest", lambda n: (-(n.total.duration(0.95) or 0.0), -(n.total.duration(0.5) or 0.0))),
    "name": ("name", lambda n: ()),
}


def name_figures(alias: str, now: datetime, sort: str) -> list[NameFigures]:
    """Each job name with figures in the last hour, sorted by ``sort`` (a key of ``SORTS``), then name."""
    rows = [NameFigures(h.name, h.minutes, h.total) for h in name_rollup.last_hour(alias, now)]
    key = SORTS.get(sort, SORTS["failing"])[1]
    rows.sort(key=lambda n: (*key(n), n.name))
    for row in rows:
        row.chart = charts.spark(row.minutes, f"{row.name}: finished per minute, last hour")
    return rows


def queue_figures(alias: str, now: datetime, running: figures.Running) -> list[QueueFigures]:
    """A row per queue that has jobs running or due, a switch, a registered job, or figures in the
    last day, by name."""
    switches = dict(Queue.objects.using(alias).order_by().values_list("name", "paused_at"))
    running_in: Counter[str] = Counter()
    for queue, _, _, n in running:
        running_in[queue] += n
    oldest = figures.oldest_due_ages(alias, now)
    last_hour = rollup.totals(alias, now - timedelta(hours=1))
    names = (
        {*switches, *running_in, *oldest}
        | rollup.queues_seen(alias, now - timedelta(days=1))
        | figures.registered_queues()
    )
    queued = Job.objects.using(alias).filter(state=Job.State.QUEUED)
    return [
        QueueFigures(
            name=name,
            due=_count(queued.filter(queue=name, run_after__lte=now)),
            delayed=_count(queued.filter(queue=name, run_after__gt=now)),
            running=running_in[name],
            failed_last_hour=last_hour.get(name, {}).get(rollup.FAILED, 0),
            oldest_due_age=oldest.get(name),
            paused=switches.get(name) is not None,
        )
        for name in sorted(names)
    ]


def worker_figures(alias: str, now: datetime, running: figures.Running) -> list[WorkerFigures]:
    held: Counter[tuple[uuid.UUID | None, bool]] = Counter()
    for _, worker_id, is_async, n in running:
        held[worker_id, is_async] += n
    alive_since = now - timedelta(seconds=conf.lease)
    return [
        WorkerFigures(
            w,
            w.last_heartbeat >= alive_since,
            held[w.pk, False],
            held[w.pk, True],
            display.duration(now - w.last_heartbeat),
        )
        for w in Worker.objects.using(alias).order_by("host", "pid")
    ]


def _count(rows: QuerySet[Job]) -> figures.StateCount:
    n = rows.order_by()[: figures.COUNT_LIMIT + 1].count()
    if n <= figures.COUNT_LIMIT:
        return figures.StateCount("", n)
    estimate = figures.planner_estimate(rows.order_by())
    if estimate is not None and estimate > figures.COUNT_LIMIT:
        return figures.StateCount("", estimate, "about")
    return figures.StateCount("", figures.COUNT_LIMIT, "more than")


def _waited(age: float | None) -> str:
    return "none due" if age is None else display.duration(timedelta(seconds=age))


def context(alias: str, now: datetime, sort: str = "failing") -> dict[str, Any]:
    """What the dashboard's template shows; the job names sorted by ``sort`` (a key of ``SORTS``)."""
    running = figures.running_jobs(alias)
    queues = queue_figures(alias, now, running)
    workers = worker_figures(alias, now, running)
    hour = rollup.series(alias, now - timedelta(minutes=59), now, timedelta(minutes=1))
    day = rollup.series(alias, now - timedelta(hours=24), now, timedelta(minutes=10))
    ages = {q.name: q.oldest_due_age for q in queues if q.oldest_due_age is not None}
    paused = {q.name for q in queues if q.paused}
    oldest = figures.oldest_due_job(alias, now, ages, paused)
    sort = sort if sort in SORTS else "failing"
    in_use = limits.overview(alias, now)
    states = figures.by_state(Job.objects.using(alias))
    return {
        "now": now,
        "refresh": REFRESH,
        "state_counts": states,
        # Apart from the queued ones: they wait for other jobs, not for a worker.
        "waiting": next(count for count in states if count.state == Job.State.WAITING),
        "oldest_due": oldest,
        "oldest_due_age": oldest.age if oldest else None,
        "oldest_due_text": _waited(oldest.age if oldest else None),
        "paused_waiting": sorted(paused & set(ages)),
        "queues": queues,
        "workers": workers,
        "alive": sum(w.alive for w in workers),
        "stale": sum(not w.alive for w in workers),
        "hour_chart": charts.bars(hour, "jobs finished per minute, last hour", HOUR),
        "day_chart": charts.bars(day, "jobs finished per 10 minutes, last 24 hours", DAY),
        "hour_age_chart": charts.line(hour, "oldest due job's age, last hour", HOUR),
        "day_age_chart": charts.line(day, "oldest due job's age, last 24 hours", DAY),
        "legend": charts.legend(),
        "finished_last_hour": sum(sum(b.counts.values()) for b in hour),
        "names": name_figures(alias, now, sort),
        "sort": sort,
        "sorts": [(key, words) for key, (words, _) in SORTS.items()],
        "list_breadcrumbs": LIST_BREADCRUMBS,
        "limit_keys": len(in_use.keys),
        "throttled": [_throttled(key, now) for key in in_use.throttled[:THROTTLED_SHOWN]],
        "throttled_more": max(0, len(in_use.throttled) - THROTTLED_SHOWN),
        "waiting_at_least": in_use.at_least,
    }


def _throttled(key: limits.KeyView, now: datetime) -> tuple[limits.KeyView, str]:
    """A throttled key, and why in words: its hold, or its full limits and their next slots."""
    if key.hold is not None:
        until = f"held until {display.moment(key.hold.until)} (in {display.duration(key.hold.until - now)})"
        return key, f"{until}: {key.hold.reason}" if key.hold.reason else until
    full = [limit for limit in key.limits if limit.full]
    words = [f"{limit.kind} {limit.use_text}" for limit in full]
    words += [f"next slot at {display.moment(limit.next_free)}" for limit in full if limit.next_free]
    return key, "full: " + ", ".join(words)


def view(request: HttpRequest, admin_context: dict[str, Any], alias: str) -> HttpResponse:
    """The page, or only its figures (``?body=1``, what the page's script asks for); ``?sort=``
    sorts the job names (``failing``, ``slowest`` or ``name``)."""
    figures = context(alias, timezone.now(), request.GET.get("sort", "failing"))
    if request.GET.get("body"):
        return TemplateResponse(request, "admin/vellum_jobs/dashboard_body.html", figures)
    return TemplateResponse(
        request, "admin/vellum_jobs/dashboard.html", {**admin_context, **figures, "title": "Queue dashboard"}
    )
