"""The per-minute figures behind the dashboard's charts and the metrics: ``QueueMinute`` rows.

A finished job may be pruned within minutes, and counting a day of
finished rows per minute would read millions of them; so each ``runjobs``
process tallies the outcomes it writes in memory, by minute, queue and
outcome, and its heartbeat adds the tally to the minute's rows (an UPDATE
that adds, or an INSERT for a minute's first figures). The same beat
samples the age of each queue's oldest due job once a minute and keeps the
largest sample. A process killed with ``kill -9`` loses at most one
heartbeat's tally; outcomes written outside a worker (a queued job
cancelled in the admin, ``run_jobs()`` in a test) are not counted.
The same beat adds the figures of each job name (``name_rollup``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Min, QuerySet, Sum
from django.db.models.functions import Coalesce, Greatest

from vellum_jobs.core import transitions
from vellum_jobs.core.models import Job, QueueMinute
from vellum_jobs.store import lock_waits, name_rollup
from vellum_jobs.store.minutes import BEGINNING as BEGINNING
from vellum_jobs.store.minutes import CANCELLED as CANCELLED
from vellum_jobs.store.minutes import DONE as DONE
from vellum_jobs.store.minutes import FAILED as FAILED
from vellum_jobs.store.minutes import FAILURES as FAILURES
from vellum_jobs.store.minutes import KEEP as KEEP
from vellum_jobs.store.minutes import LOST as LOST
from vellum_jobs.store.minutes import OUTCOMES as OUTCOMES
from vellum_jobs.store.minutes import RETRIED as RETRIED
from vellum_jobs.store.minutes import SNOOZED as SNOOZED
from vellum_jobs.store.minutes import Bucket as Bucket
from vellum_jobs.store.minutes import minute_of as minute_of
from vellum_jobs.store.minutes import stored as _stored
from vellum_jobs.store.minutes import upsert

# How often a process samples the oldest due jobs.
SAMPLE_EVERY = 60.0

Key = tuple[datetime, str, str]  # (minute, queue, outcome)
# A tally past this many keys drops the minutes older than KEEP.
MAX_KEYS = 10_000

# The state an attempt's write leaves its job in, and the outcome that counts as.
_OUTCOME_OF: dict[str, str] = {
    str(transitions.DONE): DONE,
    str(transitions.FAILED): FAILED,
    str(transitions.CANCELLED): CANCELLED,
    str(transitions.QUEUED): RETRIED,
}


def outcome_of(state: str, started: bool, refunded: bool = False) -> str | None:
    """The outcome an attempt's write to ``state`` counts as; None for a job taken back unstarted.

    A job queued again with its attempt given back (``refunded``: the handler
    raised ``Retry``, or handed the job back) was snoozed, not retried.
    """
    if not started:
        return None
    counted = _OUTCOME_OF.get(str(state))
    return SNOOZED if counted == RETRIED and refunded else counted


class Tally:
    """A process's outcomes not yet added to the table; threads add, the heartbeat takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[Key] = Counter()
        self._sampled_at = 0.0  # monotonic time of the last sample of oldest due jobs

    def add(self, moment: datetime, queue: str, outcome: str, n: int = 1) -> None:
        self.add_all(moment, {(queue, outcome): n})

    def add_all(self, moment: datetime, counts: Mapping[tuple[str, str], int]) -> None:
        """Add ``counts`` by (queue, outcome), all at ``moment``: one lock for a batch of outcomes."""
        minute = minute_of(moment)
        with self._lock:
            for (queue, outcome), n in counts.items():
                self._counts[(minute, queue, outcome)] += n
            if len(self._counts) > MAX_KEYS:  # never flushed (no heartbeat in this process): keep it small
                newest = max(minute for minute, _, _ in self._counts)
                self._counts = Counter({k: v for k, v in self._counts.items() if k[0] > newest - KEEP})

    def take(self) -> Counter[Key]:
        with self._lock:
            counts, self._counts = self._counts, Counter()
        return counts

    def give_back(self, counts: Counter[Key]) -> None:
        """Counts a failed flush took: the next one adds them."""
        with self._lock:
            self._counts.update(counts)

    def sample_due(self) -> bool:
        """Whether this process should sample the oldest due jobs now (once per ``SAMPLE_EVERY``)."""
        with self._lock:
            if time.monotonic() - self._sampled_at < SAMPLE_EVERY and self._sampled_at:
                return False
            self._sampled_at = time.monotonic()
            return True


TALLY = Tally()


def count(
    moment: datetime,
    queue: str,
    outcome: str,
    n: int = 1,
    *,
    name: str = "",
    duration: float | None = None,
    wait: float | None = None,
) -> None:
    """Count ``n`` attempts of ``queue`` that ended as ``outcome`` at ``moment``, in this process;
    and of the job ``name`` too when given, with the attempt's ``duration`` and ``wait`` (seconds
    from due to claim) when known."""
    TALLY.add(moment, queue, outcome, n)
    if name:
        name_rollup.count(moment, name, outcome, n, duration=duration, wait=wait)


# An attempt that ended: its queue, outcome, job name, and the seconds it ran and waited when known.
Ended = tuple[str, str, str, float | None, float | None]


def count_all(moment: datetime, ended: Sequence[Ended]) -> None:
    """Count the attempts of ``ended``, all at ``moment``, by queue and by name: what ``count``
    does for each, with one lock per tally for the whole batch (a worker records outcomes by the
    hundred)."""
    if ended:
        TALLY.add_all(moment, Counter((queue, outcome) for queue, outcome, _, _, _ in ended))
        by_name = [(name, outcome, ran, waited) for _, outcome, name, ran, waited in ended if name]
        name_rollup.TALLY.add_all(moment, by_name)


def count_name(moment: datetime, name: str, outcome: str, n: int = 1) -> None:
    """Count ``n`` attempts of the job ``name`` that ended as ``outcome`` at ``moment``, untimed
    (no handler ran them); their queues counted apart."""
    if n:
        name_rollup.count(moment, name, outcome, n, duration=None, wait=None)


def flush(alias: str, now: datetime) -> None:
    """Add this process's tally to the table, sample the oldest due jobs if due, delete old rows.

    On failure the tally is kept for the next beat and the error raised.
    """
    counts = TALLY.take()
    try:
        add(alias, counts)
    except BaseException:
        TALLY.give_back(counts)
        raise
    name_rollup.flush(alias)
    if TALLY.sample_due():
        record_oldest_due(alias, now)
        fold_old(alias, now)
        name_rollup.fold_old(alias, now)


def add(alias: str, counts: Counter[Key]) -> None:
    """Add ``counts`` to their minutes' rows, creating those that do not exist yet."""
    rows: dict[tuple[datetime, str], dict[str, int]] = {}
    for (minute, queue, outcome), n in counts.items():
        rows.setdefault((minute, queue), {})[outcome] = n
    if not rows:
        return  # no transaction: on SQLite even an empty one would take the write lock
    with lock_waits.bounded(alias), transaction.atomic(using=alias):
        for (minute, queue), added in sorted(rows.items()):
            _upsert(alias, minute, queue, {name: F(name) + n for name, n in added.items()}, added)


def fold_old(alias: str, now: datetime) -> None:
    """Add the counts of minutes older than ``KEEP`` to each queue's ``BEGINNING`` row, and delete them.

    So the totals since the rollup began only grow (Prometheus counters),
    while the table keeps a day of minutes.
    """
    beginning = _stored(BEGINNING)
    old = QueueMinute.objects.using(alias).filter(minute__lt=minute_of(now) - KEEP, minute__gt=beginning)
    if not old.exists():
        return
    with lock_waits.bounded(alias), transaction.atomic(using=alias):
        for queue, added in sorted(_summed(old).items()):
            _upsert(alias, beginning, queue, {o: F(o) + n for o, n in added.items()}, added)
        old.delete()


def record_oldest_due(alias: str, now: datetime) -> None:
    """Keep, in this minute's row of each queue with due jobs, the age of its oldest due job."""
    oldest = (
        Job.objects.using(alias).due(now).order_by().values_list("queue").annotate(oldest=Min("run_after"))
    )
    ages = sorted((queue, max((now - since).total_seconds(), 0.0)) for queue, since in oldest)
    if not ages:
        return
    minute = minute_of(now)
    with lock_waits.bounded(alias), transaction.atomic(using=alias):
        for queue, age in ages:
            growth = {"oldest_due_age": Greatest(Coalesce(F("oldest_due_age"), 0.0), age)}
            _upsert(alias, minute, queue, growth, {"oldest_due_age": age})


def _upsert(alias: str, minute: datetime, queue: str, update: dict[str, Any], insert: dict[str, Any]) -> None:
    upsert(QueueMinute, alias, {"minute": minute, "queue": queue}, update, insert)


# -- reading -------------------------------------------------------------


def series(alias: str | None, since: datetime, until: datetime, step: timedelta) -> list[Bucket]:
    """Per ``step`` from ``since`` to ``until``, summed over queues; every step present."""
    start = minute_of(since)
    steps = int((until - start) / step) + 1
    buckets = [Bucket(start + i * step, dict.fromkeys(OUTCOMES, 0)) for i in range(steps)]
    rows = QueueMinute.objects.using(alias).filter(minute__gte=start, minute__lte=until)
    for row in rows.values("minute", *OUTCOMES, "oldest_due_age"):
        bucket = buckets[min(int((row["minute"] - start) / step), steps - 1)]
        for outcome in OUTCOMES:
            bucket.counts[outcome] += row[outcome]
        age = row["oldest_due_age"]
        if age is not None and (bucket.oldest_due_age is None or age > bucket.oldest_due_age):
            bucket.oldest_due_age = age
    return buckets


def totals(alias: str | None, since: datetime | None = None) -> dict[str, dict[str, int]]:
    """Each queue's outcome counts since ``since``, or since the rollup began (pruned minutes
    included: they are folded into a row at ``BEGINNING``), queues sorted."""
    rows = QueueMinute.objects.using(alias).order_by()
    if since is not None:
        rows = rows.filter(minute__gte=minute_of(since))
    return dict(sorted(_summed(rows).items()))


def _summed(rows: QuerySet[QueueMinute]) -> dict[str, dict[str, int]]:
    """Each queue's outcome counts summed over ``rows``."""
    summed = rows.order_by().values_list("queue").annotate(*(Sum(o) for o in OUTCOMES))
    return {
        str(queue): dict(zip(OUTCOMES, (int(n or 0) for n in sums), strict=True)) for queue, *sums in summed
    }


def queues_seen(alias: str | None, since: datetime) -> set[str]:
    """Queues with figures since ``since``."""
    rows = QueueMinute.objects.using(alias).filter(minute__gte=minute_of(since)).order_by()
    return set(rows.values_list("queue", flat=True).distinct())
