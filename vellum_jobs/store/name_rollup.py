"""The per-minute figures of each job name: ``NameMinute`` rows of outcome counts and histograms.

What ``rollup`` keeps per queue, kept per job name as well: the outcomes its
attempts ended with, tallied in memory by minute and added at each
heartbeat, and two histograms in the fixed buckets of ``HISTOGRAM_BOUNDS``:
how long each attempt ran, and how long it waited from its due time to its
claim. A row is a fixed set of columns however many jobs ran, so the
percentiles of the last hour read at most sixty rows per name, never the
finished jobs; within a bucket they are estimated as Prometheus'
``histogram_quantile`` does, so they are as exact as the buckets are
narrow. Minutes older than ``KEEP`` fold into each name's row at
``BEGINNING``, so the totals (Prometheus' counters and histograms) only
grow. Written in ``lock_waits.bounded()`` transactions, as the queue rollup.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, QuerySet, Sum

from vellum_jobs.core.models import HISTOGRAM_BOUNDS, NameMinute
from vellum_jobs.store import lock_waits
from vellum_jobs.store.minutes import (
    BEGINNING,
    FAILURES,
    KEEP,
    OUTCOMES,
    SNOOZED,
    Bucket,
    minute_of,
    stored,
    upsert,
)

BOUNDS = HISTOGRAM_BOUNDS
DURATIONS = tuple(f"duration_{i}" for i in range(len(BOUNDS)))
WAITS = tuple(f"wait_{i}" for i in range(len(BOUNDS)))
COLUMNS = (*OUTCOMES, "duration_sum", "wait_sum", *DURATIONS, *WAITS)

Key = tuple[datetime, str]  # (minute, name)
# A tally past this many keys drops the minutes older than KEEP.
MAX_KEYS = 10_000


def bucket_of(seconds: float) -> int:
    """The histogram bucket of ``seconds``: the first whose bound is at least it."""
    return bisect.bisect_left(BOUNDS, max(seconds, 0.0))


def quantile(buckets: list[int], q: float) -> float | None:
    """The ``q`` quantile (0 to 1) of the values counted in ``buckets``, interpolated within its
    bucket; the last finite bound for one past it; None when nothing was counted."""
    total = sum(buckets)
    if not total:
        return None
    rank, below = q * total, 0
    for i, n in enumerate(buckets):
        if n and below + n >= rank:
            lower = BOUNDS[i - 1] if i else 0.0
            if BOUNDS[i] == float("inf"):
                return lower
            return lower + (BOUNDS[i] - lower) * (rank - below) / n
        below += n
    return BOUNDS[-2]


@dataclasses.dataclass
class Figures:
    """One name's figures over some minutes: outcome counts, and both histograms' buckets and sums."""

    outcomes: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    durations: list[int] = dataclasses.field(default_factory=lambda: [0] * len(BOUNDS))
    waits: list[int] = dataclasses.field(default_factory=lambda: [0] * len(BOUNDS))
    duration_sum: float = 0.0
    wait_sum: float = 0.0

    @classmethod
    def of(cls, row: Mapping[str, Any], key: str = "{}") -> Figures:
        """The figures of a row of ``COLUMNS`` (as ``key`` names each one)."""
        value = {column: row[key.format(column)] or 0 for column in COLUMNS}
        return cls(
            {o: int(value[o]) for o in OUTCOMES},
            [int(value[c]) for c in DURATIONS],
            [int(value[c]) for c in WAITS],
            float(value["duration_sum"]),
            float(value["wait_sum"]),
        )

    def observe(self, outcome: str, n: int, duration: float | None, wait: float | None) -> None:
        self.outcomes[outcome] += n
        if duration is not None:
            self.durations[bucket_of(duration)] += n
            self.duration_sum += max(duration, 0.0) * n
        if wait is not None:
            self.waits[bucket_of(wait)] += n
            self.wait_sum += max(wait, 0.0) * n

    def add(self, other: Figures) -> None:
        for outcome, n in other.outcomes.items():
            self.outcomes[outcome] += n
        self.durations = [a + b for a, b in zip(self.durations, other.durations, strict=True)]
        self.waits = [a + b for a, b in zip(self.waits, other.waits, strict=True)]
        self.duration_sum += other.duration_sum
        self.wait_sum += other.wait_sum

    def columns(self) -> dict[str, int | float]:
        """The figures by ``NameMinute`` column, those that are not zero."""
        values: dict[str, int | float] = {
            **self.outcomes,
            "duration_sum": self.duration_sum,
            "wait_sum": self.wait_sum,
            **dict(zip(DURATIONS, self.durations, strict=True)),
            **dict(zip(WAITS, self.waits, strict=True)),
        }
        return {column: value for column, value in values.items() if value}

    @property
    def finished(self) -> int:
        """Attempts that ended, snoozed ones included."""
        return sum(self.outcomes.values())

    @property
    def failures(self) -> int:
        """Attempts that failed: for good, to be retried, or lost with their worker."""
        return sum(self.outcomes[o] for o in FAILURES)

    @property
    def failure_rate(self) -> float | None:
        """Failed attempts over those that ended otherwise than snoozed; None when none did."""
        ended = self.finished - self.outcomes[SNOOZED]
        return self.failures / ended if ended else None

    def duration(self, q: float) -> float | None:
        return quantile(self.durations, q)

    def wait(self, q: float) -> float | None:
        return quantile(self.waits, q)


class Tally:
    """A process's figures by name not yet added to the table; threads add, the heartbeat takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._figures: dict[Key, Figures] = {}

    def add(
        self, moment: datetime, name: str, outcome: str, n: int, duration: float | None, wait: float | None
    ) -> None:
        with self._lock:
            key = (minute_of(moment), name)
            self._figures.setdefault(key, Figures()).observe(outcome, n, duration, wait)
            self._keep_small()

    def add_all(self, moment: datetime, ended: Sequence[tuple[str, str, float | None, float | None]]) -> None:
        """Add one attempt per (name, outcome, duration, wait) of ``ended``, all at ``moment``."""
        minute = minute_of(moment)
        with self._lock:
            for name, outcome, duration, wait in ended:
                figures = self._figures.get((minute, name))
                if figures is None:
                    figures = self._figures[(minute, name)] = Figures()
                figures.observe(outcome, 1, duration, wait)
            self._keep_small()

    def _keep_small(self) -> None:
        """Under the lock: drop old minutes past ``MAX_KEYS`` (no heartbeat in this process flushes)."""
        if len(self._figures) > MAX_KEYS:
            newest = max(minute for minute, _ in self._figures)
            self._figures = {k: v for k, v in self._figures.items() if k[0] > newest - KEEP}

    def take(self) -> dict[Key, Figures]:
        with self._lock:
            figures, self._figures = self._figures, {}
        return figures

    def give_back(self, figures: dict[Key, Figures]) -> None:
        """Figures a failed flush took: the next one adds them."""
        with self._lock:
            for key, more in figures.items():
                self._figures.setdefault(key, Figures()).add(more)


TALLY = Tally()


def count(
    moment: datetime, name: str, outcome: str, n: int = 1, *, duration: float | None, wait: float | None
) -> None:
    """Count ``n`` attempts of the job ``name`` that ended as ``outcome`` at ``moment``, with the
    seconds they ran and waited when known."""
    TALLY.add(moment, name, outcome, n, duration, wait)


def flush(alias: str) -> None:
    """Add this process's tally to the table; on failure the tally is kept and the error raised."""
    figures = TALLY.take()
    try:
        add(alias, figures)
    except BaseException:
        TALLY.give_back(figures)
        raise


def add(alias: str, figures: dict[Key, Figures]) -> None:
    """Add ``figures`` to their minutes' rows, creating those that do not exist yet."""
    if not figures:
        return  # no transaction: on SQLite even an empty one would take the write lock
    with lock_waits.bounded(alias), transaction.atomic(using=alias):
        for (minute, name), added in sorted(figures.items(), key=lambda item: item[0]):
            _upsert(alias, minute, name, added.columns())


def fold_old(alias: str, now: datetime) -> None:
    """Add the figures of minutes older than ``KEEP`` to each name's ``BEGINNING`` row, and delete them."""
    beginning = stored(BEGINNING)
    old = NameMinute.objects.using(alias).filter(minute__lt=minute_of(now) - KEEP, minute__gt=beginning)
    if not old.exists():
        return
    with lock_waits.bounded(alias), transaction.atomic(using=alias):
        for name, added in sorted(_summed(old).items()):
            _upsert(alias, beginning, name, added.columns())
        old.delete()


def _upsert(alias: str, minute: datetime, name: str, values: dict[str, int | float]) -> None:
    if values:
        update = {column: F(column) + value for column, value in values.items()}
        upsert(NameMinute, alias, {"minute": minute, "name": name}, update, values)


# -- reading -------------------------------------------------------------


@dataclasses.dataclass
class NameHour:
    """One job name's last hour: its outcomes per minute, and its figures summed."""

    name: str
    minutes: list[Bucket]
    total: Figures


def last_hour(alias: str | None, now: datetime) -> list[NameHour]:
    """Each name with figures in the hour to ``now`` (sixty minutes, every one present), by name."""
    start = minute_of(now) - timedelta(minutes=59)
    rows = NameMinute.objects.using(alias).filter(minute__gte=start, minute__lte=now)
    hours: dict[str, NameHour] = {}
    for row in rows.values("minute", "name", *COLUMNS):
        name = row["name"]
        if name not in hours:
            minutes = [Bucket(start + timedelta(minutes=i), dict.fromkeys(OUTCOMES, 0)) for i in range(60)]
            hours[name] = NameHour(name, minutes, Figures())
        figures = Figures.of(row)
        hours[name].total.add(figures)
        step = min(max(int((row["minute"] - start) / timedelta(minutes=1)), 0), 59)
        for outcome, n in figures.outcomes.items():
            hours[name].minutes[step].counts[outcome] += n
    return [hours[name] for name in sorted(hours)]


def totals(alias: str | None) -> dict[str, Figures]:
    """Each name's figures since the rollup began (folded minutes included), names sorted."""
    return dict(sorted(_summed(NameMinute.objects.using(alias)).items()))


def _summed(rows: QuerySet[NameMinute]) -> dict[str, Figures]:
    summed = rows.order_by().values("name").annotate(**{f"sum_{c}": Sum(c) for c in COLUMNS})
    return {str(row["name"]): Figures.of(row, "sum_{}") for row in summed}
