"""The Prometheus metrics: the queue's figures per queue, read cheaply at each scrape, as text.

A scrape must stay cheap on a table of millions of finished jobs, so jobs
are counted per queue and state as the admin counts them (``figures``):
exact up to ``COUNT_LIMIT``, then the planner's estimate or that lower
bound; a queue with fewer jobs than that is counted exactly. (MariaDB's
estimate is that of the one index it would read, the state's or the
queue's, so it can be well above the queue's share.)

Queues are names on jobs, not rows, and listing the distinct names of a
big table reads all of it; so the queues reported are those something
else knows: the registered jobs' queues, the workers' queues, the
``Queue`` rows (paused, or listed in the admin), the queues with outcomes
in the rollup, and every queue with a running or a due job (found by the
busy-slot and oldest-due queries, which read those rows anyway). A queue
that has only delayed or finished jobs and none of these is left out.

Each job name gets its figures too, from the per-name rollup
(``name_rollup``): outcome counters, duration and wait histograms, and the
last hour's failure ratio, percentiles and finishes per minute. A label
per name would grow without bound if names did (a Django task per
customer, say), so the ``name`` label is bounded: every name registered in
this process has its own, and so do the first ``MAX_OTHER_NAMES`` others
with figures (by name); the rest are added up under ``other``. A deploy
that registers or drops names can move a name's counts between its label
and ``other``, which Prometheus reads as a counter reset of each.

On a million jobs in three queues (``benchmarks/admin_changelist.py``'s
table) a scrape takes about 0.1 s on SQLite, 0.15 s on PostgreSQL and
0.45 s on MariaDB, in some twenty queries.

The limit keys in use (``observe.limits``) have their use, their jobs
waiting and their holds, under a bounded ``key`` label (``limit_metrics``).

``prometheus_client`` is an optional extra: it is imported when a scrape
renders, never when this module is imported.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import DEFAULT_DB_ALIAS, router
from django.db.models import QuerySet

from vellum_jobs.core import clock, registry
from vellum_jobs.core.models import Job, Queue, Worker
from vellum_jobs.observe import figures, limit_metrics, limits
from vellum_jobs.observe.figures import StateCount
from vellum_jobs.store import name_rollup, rollup

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

INSTALL = 'pip install "vellum-jobs[prometheus]"'

# How a slot's kind shows in the busy and slot metrics: threads run sync jobs, the event loop async ones.
THREADS, ASYNC = "threads", "async"

JOBS_HELP = (
    "Jobs in the table by queue and state, counted at the scrape. Exact up to {limit:,}; above that, "
    "the planner's estimate (PostgreSQL, MariaDB/MySQL) or the lower bound {limit:,} (SQLite). "
    "Queues: those of registered jobs, workers, Queue rows and outcomes, and with running or due jobs."
)
OLDEST_HELP = (
    "Seconds the queue's longest-waiting due job has been due (since its run_after), at the scrape; "
    "0 when none is due. Delayed jobs do not count."
)
WORKERS_HELP = (
    "runjobs processes by liveness: alive has a heartbeat within LEASE, stale stopped without "
    "removing its row (live workers delete it an hour after its last heartbeat)."
)
SLOTS_HELP = "Jobs the live workers run at once: threads for sync jobs, async for the event loops."
BUSY_HELP = (
    "Running jobs held by live workers, by slot kind, at the scrape; a job claimed ahead counts from "
    "its claim, so threads may exceed the thread slots by the prefetch."
)
STUCK_HELP = "Thread slots of live workers held by handlers that outlived their timeout, at last heartbeat."
OUTCOMES_HELP = (
    "Attempts that ended, by queue and outcome (done, failed, cancelled, retried, lost, snoozed: "
    "queued again by Retry or handed back, not a failure), since the rollup began. Workers count "
    "what they write and add it at each heartbeat: up to one heartbeat late, a killed worker's last "
    "heartbeat of counts lost, outcomes written outside a worker not counted."
)
NAME_LABEL = " The name label: registered names, plus at most {most} others, the rest added up as other."
JOB_OUTCOMES_HELP = (
    "Attempts that ended, by job name and outcome, since the rollup began; as vellum_jobs_outcomes."
)
DURATION_HELP = "Seconds each attempt's handler ran, by job name, since the rollup began."
WAIT_HELP = "Seconds each attempt waited from its due time (run_after) to its claim, by job name."
FAILURE_HELP = (
    "Failed attempts (failed, retried, lost) over the attempts that ended (snoozed ones left out), "
    "by job name, in the last hour; names with none left out."
)
FINISHED_HELP = "Attempts that ended per minute, by job name and outcome, averaged over the last hour."
LAST_HOUR_HELP = (
    "The {what} quantiles (0.5, 0.95) by job name over the last hour, in seconds, estimated within "
    "the histogram's buckets."
)

# The label that adds up the names past the bound, and the bound.
OTHER = "other"
MAX_OTHER_NAMES = 20
PAUSED_HELP = "1 while the queue is paused (its jobs stay queued and no worker claims them), else 0."
KEY_LABEL = " The key label: the {most} keys with the most jobs waiting, the rest added up as (other)."
LIMIT_IN_USE_HELP = (
    "Use of each limit key in use, by kind: rate, its starts in the last period (of two rates, the "
    "one nearer its limit); concurrency, its running jobs."
)
LIMIT_WAITING_HELP = (
    "Queued jobs that start under each limit key, by kind; of at most {read:,} queued jobs with "
    "limits read (past that, lower bounds)."
)
LIMIT_HELD_HELP = "1 while a handler's Throttled holds the key (the count of held keys for (other)), else 0."
LIMIT_KEYS_HELP = (
    "Limit keys in use: a rate slot taken in its period, a running holder, a hold, or jobs waiting."
)


@dataclasses.dataclass(frozen=True)
class Figures:
    """What a scrape reports; every mapping is by queue unless it says otherwise."""

    jobs: dict[str, list[StateCount]]
    oldest_due_age: dict[str, float]
    workers: dict[str, int]  # by liveness: alive, stale
    slots: dict[str, int]  # by kind: threads, async
    busy: dict[str, int]  # by kind
    stuck: int
    outcomes: dict[str, dict[str, int]]  # by queue, then outcome
    paused: dict[str, bool]
    names: dict[str, name_rollup.Figures] = dataclasses.field(default_factory=dict)  # by name label
    last_hour: dict[str, name_rollup.Figures] = dataclasses.field(default_factory=dict)  # by name label
    limits: limit_metrics.LimitFigures = dataclasses.field(default_factory=limit_metrics.LimitFigures.none)


def read(alias: str | None = None, now: datetime | None = None) -> Figures:
    """The figures of the jobs on ``alias`` (the ``Job`` model's database when None), at ``now``."""
    now = now or clock.of(alias or router.db_for_read(Job) or DEFAULT_DB_ALIAS)
    workers = list(Worker.objects.using(alias).order_by())
    live = [worker for worker in workers if worker.is_alive]
    paused = dict(Queue.objects.using(alias).order_by().values_list("name", "paused_at"))
    outcomes = rollup.totals(alias)
    oldest = figures.oldest_due_ages(alias, now)
    running = figures.running_jobs(alias)
    seen = {*paused, *outcomes, *oldest, *(queue for queue, *_ in running)}
    names = sorted(figures.registered_queues() | figures.worker_queues(workers) | seen)
    by_name = name_rollup.totals(alias)
    hour = {h.name: h.total for h in name_rollup.last_hour(alias, now)}
    labels = name_labels({*by_name, *hour}, set(registry.names()))
    return Figures(
        jobs={name: queue_counts(Job.objects.using(alias).filter(queue=name)) for name in names},
        oldest_due_age={name: oldest.get(name, 0.0) for name in names},
        workers={"alive": len(live), "stale": len(workers) - len(live)},
        slots={THREADS: sum(w.threads for w in live), ASYNC: sum(w.async_workers for w in live)},
        busy=busy_slots(running, live),
        stuck=sum(worker.stuck for worker in live),
        outcomes=outcomes,
        paused={name: paused.get(name) is not None for name in names},
        names=labelled(by_name, labels, set(labels.values())),
        last_hour=labelled(hour, labels),
        limits=limit_metrics.figures(
            limits.overview(alias or router.db_for_read(Job) or DEFAULT_DB_ALIAS, now)
        ),
    )


def name_labels(names: set[str], registered: set[str]) -> dict[str, str]:
    """The ``name`` label of each name (registered ones included): its own for the registered names
    and the first ``MAX_OTHER_NAMES`` others, ``OTHER`` for the rest."""
    others = sorted(names - registered)
    own = registered | set(others[:MAX_OTHER_NAMES])
    return {name: name if name in own else OTHER for name in sorted(names | registered)}


def labelled(
    by_name: dict[str, name_rollup.Figures], labels: dict[str, str], every: Iterable[str] = ()
) -> dict[str, name_rollup.Figures]:
    """``by_name`` added up by label, with an empty entry for each label of ``every`` lacking one."""
    summed = {label: name_rollup.Figures() for label in every}
    for name, found in by_name.items():
        summed.setdefault(labels.get(name, OTHER), name_rollup.Figures()).add(found)
    return dict(sorted(summed.items()))


def queue_counts(jobs: QuerySet[Job]) -> list[StateCount]:
    """One queue's jobs by state, as ``figures.by_state``; a queue within the limit is counted exactly.

    A small queue's rows are read on the queue index and their states
    counted here. Counting in SQL, per state or grouped by state, lets the
    planner walk the state index instead, through every finished job of the
    other queues: SQLite does, as it keeps only average counts per index.
    """
    if jobs.order_by()[: figures.COUNT_LIMIT + 1].count() > figures.COUNT_LIMIT:
        return figures.by_state(jobs)
    found = Counter(jobs.order_by().values_list("state", flat=True))
    return [StateCount(state, found[state]) for state in Job.State.values]


def busy_slots(running: figures.Running, live: list[Worker]) -> dict[str, int]:
    """The running jobs the ``live`` workers hold, by slot kind."""
    ids = {worker.pk for worker in live}
    busy = {THREADS: 0, ASYNC: 0}
    for _, worker_id, is_async, n in running:
        if worker_id in ids:
            busy[ASYNC if is_async else THREADS] += n
    return busy


# -- rendering -------------------------------------------------------------


def available() -> bool:
    """Whether prometheus_client can be imported (the ``prometheus`` extra)."""
    try:
        importlib.import_module("prometheus_client")
    except ImportError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Family:
    """One metric before rendering: its samples are (label values, value) pairs."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...]
    samples: list[tuple[tuple[str, ...], float]]


@dataclasses.dataclass(frozen=True)
class Histogram:
    """One histogram before rendering: per label values, the bucket counts (not cumulative) of
    ``name_rollup.BOUNDS`` and the sum."""

    name: str
    help: str
    labels: tuple[str, ...]
    samples: list[tuple[tuple[str, ...], list[int], float]]


def histograms(f: Figures) -> list[Histogram]:
    """The duration and wait histograms of each name label."""
    bound = NAME_LABEL.format(most=MAX_OTHER_NAMES)
    return [
        Histogram(
            "vellum_jobs_job_duration_seconds",
            DURATION_HELP + bound,
            ("name",),
            [((name,), found.durations, found.duration_sum) for name, found in f.names.items()],
        ),
        Histogram(
            "vellum_jobs_job_wait_seconds",
            WAIT_HELP + bound,
            ("name",),
            [((name,), found.waits, found.wait_sum) for name, found in f.names.items()],
        ),
    ]


def name_families(f: Figures) -> list[Family]:
    """The figures of each name label, but the histograms."""
    bound = NAME_LABEL.format(most=MAX_OTHER_NAMES)
    hour = f.last_hour
    quantiles = (("0.5", 0.5), ("0.95", 0.95))
    return [
        Family(
            "vellum_jobs_job_outcomes",  # exposed as vellum_jobs_job_outcomes_total
            "counter",
            JOB_OUTCOMES_HELP + bound,
            ("name", "outcome"),
            [((name, o), n) for name, found in f.names.items() for o, n in found.outcomes.items()],
        ),
        Family(
            "vellum_jobs_job_finished_per_minute",
            "gauge",
            FINISHED_HELP + bound,
            ("name", "outcome"),
            [((name, o), n / 60) for name, found in hour.items() for o, n in found.outcomes.items()],
        ),
        Family(
            "vellum_jobs_job_failure_ratio",
            "gauge",
            FAILURE_HELP + bound,
            ("name",),
            [((name,), rate) for name, found in hour.items() if (rate := found.failure_rate) is not None],
        ),
        Family(
            "vellum_jobs_job_last_hour_duration_seconds",
            "gauge",
            LAST_HOUR_HELP.format(what="duration") + bound,
            ("name", "quantile"),
            [
                ((name, label), seconds)
                for name, found in hour.items()
                for label, q in quantiles
                if (seconds := found.duration(q)) is not None
            ],
        ),
        Family(
            "vellum_jobs_job_last_hour_wait_seconds",
            "gauge",
            LAST_HOUR_HELP.format(what="wait") + bound,
            ("name", "quantile"),
            [
                ((name, label), seconds)
                for name, found in hour.items()
                for label, q in quantiles
                if (seconds := found.wait(q)) is not None
            ],
        ),
    ]


def families(f: Figures) -> list[Family]:
    """The metrics of ``f``, every name prefixed ``vellum_jobs_``."""
    kinds = (THREADS, ASYNC)
    return [
        Family(
            "vellum_jobs_jobs",
            "gauge",
            JOBS_HELP.format(limit=figures.COUNT_LIMIT),
            ("queue", "state"),
            [((queue, c.state), c.count) for queue, states in f.jobs.items() for c in states],
        ),
        Family(
            "vellum_jobs_oldest_due_age_seconds",
            "gauge",
            OLDEST_HELP,
            ("queue",),
            [((queue,), age) for queue, age in f.oldest_due_age.items()],
        ),
        Family(
            "vellum_jobs_workers",
            "gauge",
            WORKERS_HELP,
            ("state",),
            [((s,), n) for s, n in f.workers.items()],
        ),
        Family(
            "vellum_jobs_worker_slots", "gauge", SLOTS_HELP, ("kind",), [((k,), f.slots[k]) for k in kinds]
        ),
        Family(
            "vellum_jobs_worker_busy_slots", "gauge", BUSY_HELP, ("kind",), [((k,), f.busy[k]) for k in kinds]
        ),
        Family("vellum_jobs_worker_stuck_slots", "gauge", STUCK_HELP, (), [((), f.stuck)]),
        Family(
            "vellum_jobs_outcomes",  # exposed as vellum_jobs_outcomes_total
            "counter",
            OUTCOMES_HELP,
            ("queue", "outcome"),
            [((queue, o), n) for queue, by_outcome in f.outcomes.items() for o, n in by_outcome.items()],
        ),
        Family(
            "vellum_jobs_queue_paused",
            "gauge",
            PAUSED_HELP,
            ("queue",),
            [((queue,), int(is_paused)) for queue, is_paused in f.paused.items()],
        ),
        *name_families(f),
        *limit_families(f.limits),
    ]


def limit_families(f: limit_metrics.LimitFigures) -> list[Family]:
    """The limit keys' use, jobs waiting and holds, under the bounded key label."""
    bound = KEY_LABEL.format(most=limit_metrics.LIMIT_KEYS_SHOWN)
    waiting_help = LIMIT_WAITING_HELP.format(read=limits.WAITING_READ)
    return [
        Family("vellum_jobs_limit_keys", "gauge", LIMIT_KEYS_HELP, (), [((), f.keys)]),
        Family(
            "vellum_jobs_limit_in_use",
            "gauge",
            LIMIT_IN_USE_HELP + bound,
            ("key", "kind"),
            list(f.in_use.items()),
        ),
        Family(
            "vellum_jobs_limit_waiting",
            "gauge",
            waiting_help + bound,
            ("key", "kind"),
            list(f.waiting.items()),
        ),
        Family(
            "vellum_jobs_limit_held",
            "gauge",
            LIMIT_HELD_HELP + bound,
            ("key",),
            [((k,), n) for k, n in f.held.items()],
        ),
    ]


def exposition(figures: Figures) -> tuple[bytes, str]:
    """``figures`` in Prometheus' text format, and its content type.

    Raises ``ImportError`` when prometheus_client is not installed.
    """
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    # A registry of its own: the process's default one holds the project's
    # metrics, and these figures belong to this response only.
    registry = CollectorRegistry()
    registry.register(FiguresCollector(figures))
    return generate_latest(registry), CONTENT_TYPE_LATEST


class FiguresCollector:
    """Collects figures already read, so that a database error comes before any rendering."""

    def __init__(self, figures: Figures) -> None:
        self.figures = figures

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        for family in families(self.figures):
            kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = kind(family.name, family.help, labels=family.labels)
            for values, value in family.samples:
                metric.add_metric(values, value)
            yield metric
        bounds = ["+Inf" if bound == float("inf") else repr(float(bound)) for bound in name_rollup.BOUNDS]
        for histogram in histograms(self.figures):
            rendered = HistogramMetricFamily(histogram.name, histogram.help, labels=histogram.labels)
            for values, counts, total in histogram.samples:
                cumulative = list(itertools.accumulate(counts))
                rendered.add_metric(values, list(zip(bounds, cumulative, strict=True)), total)
            yield rendered
