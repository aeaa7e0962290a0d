"""The limits in use, read from their tables: each key's use, its hold, and the jobs waiting on it.

One read model behind the admin's Limits page, the dashboard's throttled
keys, the metrics and ``explain()``. A key is *in use* when a rate slot of
it let a job start within its period, a running job holds a concurrency
slot of it, a hold on it (``Throttled``) has not ended, or a queued job
starts under it. Its figures follow the gate's rules
(``vellum_jobs.store.limit_gate``):

- a rate limit's use is the starts of its last period (slots taken since
  ``now - period``); it is full while ``count`` slots rest from a start
  (``taken_at + period + guard(period) > now``), and its next slot comes
  when the first of them is free;
- a concurrency limit's use is its slots whose job is running under the
  claim it started with; a slot whose job ended is free.

The reads stay few and bounded whatever the tables hold: one grouped
query per rate period in use, the running jobs (as many as the workers'
threads) and their keys' slots, the holds not ended, and the ``limits``
of at most ``WAITING_READ`` queued jobs. Past that bound the waiting
counts are lower bounds (``Overview.complete`` is False: "at least"). No
index covers the queued jobs' limits, so that read walks the queued jobs
(on the claim's index) until it has found as many; the slot queries read
the slot table, one row per slot of a key ever used.

A limit's size (its N) is not in the slot table: it comes from the jobs
that start under it, the queued ones or the last one a slot let start;
when none of them is left it is unknown (``count`` None).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, router
from django.db.models import Count, Max, Min, Q

from vellum_jobs.core import clock, limit_rules
from vellum_jobs.core.limit_models import CONCURRENCY, RATE, LimitHold, LimitSlot
from vellum_jobs.core.limits import Limits, Rate, guard
from vellum_jobs.core.models import Job

# The queued jobs whose limits are read for the waiting counts.
WAITING_READ = 50_000
# The keys each grouped query returns at most (the busiest first).
KEYS_READ = 1_000
# What the worker writes at the start of a job's error when a limit held it back.
HELD_PREFIX = limit_rules.HELD_PREFIX

# One limit of a key: (key, kind, period); the period is 0 for a concurrency limit.
Ident = tuple[str, str, float]


@dataclasses.dataclass
class KeyLimit:
    """One rate or concurrency limit of a key, as it stands."""

    key: str
    kind: str  # RATE or CONCURRENCY
    period: float  # seconds; 0 for a concurrency limit
    count: int | None = None  # the limit's N; None when no job left says it
    in_use: int = 0  # rate: starts in the last period; concurrency: running holders
    resting: int = 0  # rate: slots not free yet (started within the last period and its guard)
    first_start: datetime | None = None  # rate: the earliest start among the resting slots
    holders: tuple[int, ...] = ()  # a concurrency limit: the running jobs that hold it
    waiting: int = 0  # queued jobs under this limit
    sample_job: int | None = None  # a job a slot let start, to learn the count from

    @property
    def full(self) -> bool:
        if self.count is None:
            return False
        taken = self.resting if self.kind == RATE else self.in_use
        return taken >= self.count

    @property
    def next_free(self) -> datetime | None:
        """A full rate limit's next slot: when the first of its resting slots frees."""
        if self.kind != RATE or self.first_start is None or not self.full:
            return None
        return self.first_start + timedelta(seconds=self.period + guard(self.period))

    @property
    def limit_text(self) -> str:
        """The limit in words: "100 per minute", "2 at once", or "?" when unknown."""
        if self.count is None:
            return "?"
        if self.kind == RATE:
            return Rate(self.count, self.period, self.key).describe()
        return f"{self.count} at once"

    @property
    def use_text(self) -> str:
        """The use in words: "3 of 100 per minute used", "1 of 2 running"."""
        of = "?" if self.count is None else self.count
        if self.kind == RATE:
            return f"{self.in_use} of {of} per {_per(self.period)} used"
        return f"{self.in_use} of {of} running"


def _per(period: float) -> str:
    """A period as a rate says it: "minute", "5m", "30s"."""
    return Rate(1, period, "").describe().partition(" per ")[2]


@dataclasses.dataclass(frozen=True)
class Hold:
    """A key no job starts under until ``until`` (a handler raised ``Throttled``)."""

    key: str
    until: datetime
    reason: str
    job_id: int | None


@dataclasses.dataclass
class KeyView:
    """A key in use: its limits, its hold, and the queued jobs that start under it."""

    key: str
    limits: list[KeyLimit] = dataclasses.field(default_factory=list)
    hold: Hold | None = None
    waiting: int = 0

    @property
    def full(self) -> bool:
        return any(limit.full for limit in self.limits)

    @property
    def throttled(self) -> bool:
        """Held, or full with jobs waiting on it."""
        return self.hold is not None or (self.full and self.waiting > 0)


@dataclasses.dataclass
class Overview:
    now: datetime
    keys: list[KeyView]  # throttled first, then most waiting, then by key
    complete: bool = True  # False: the waiting counts are lower bounds
    waiting_read: int = 0  # queued jobs with limits read

    @property
    def throttled(self) -> list[KeyView]:
        return [key for key in self.keys if key.throttled]

    @property
    def at_least(self) -> str:
        """The waiting counts' qualifier: "at least " when they are lower bounds, else ""."""
        return "" if self.complete else "at least "


def overview(alias: str | None = None, now: datetime | None = None) -> Overview:
    """Every key in use on ``alias`` (the ``Job`` model's database when None), at ``now``."""
    alias = alias or router.db_for_read(Job) or DEFAULT_DB_ALIAS
    now = now or clock.of(alias)
    waiting = read_waiting(alias)
    found: dict[Ident, KeyLimit] = {}
    for ident, n in waiting.by_limit.items():
        _limit(found, ident).waiting = n
    _use(alias, now, found, rate_periods(alias), None)
    _sizes(alias, found, waiting.counts)
    keys = _by_key(found.values(), active_holds(alias, now), waiting.by_key)
    return Overview(now, keys, complete=waiting.read < WAITING_READ, waiting_read=waiting.read)


def of_jobs(
    alias: str, now: datetime, limits: Iterable[Limits]
) -> tuple[dict[Ident, KeyLimit], dict[str, Hold]]:
    """The limits of some jobs (``explain()``) as they stand, and the holds on their keys; only
    their keys are read, and no waiting counts."""
    found: dict[Ident, KeyLimit] = {}
    for ident, count in _counts(limits).items():
        _limit(found, ident).count = count
    keys = {key for key, _, _ in found}
    _use(alias, now, found, {period for _, kind, period in found if kind == RATE}, keys)
    return found, active_holds(alias, now, keys)


def _counts(limits: Iterable[Limits]) -> dict[Ident, int]:
    """Each limit's N; the largest where jobs disagree (a deploy changed it)."""
    counts: dict[Ident, int] = {}
    for job_limits in limits:
        pairs = [((k, RATE, p), n) for k, n, p in job_limits.rates]
        pairs += [((k, CONCURRENCY, 0.0), n) for k, n in job_limits.concurrency]
        for ident, n in pairs:
            counts[ident] = max(n, counts.get(ident, 0))
    return counts


def _limit(found: dict[Ident, KeyLimit], ident: Ident) -> KeyLimit:
    if ident not in found:
        found[ident] = KeyLimit(*ident)
    return found[ident]


def _use(
    alias: str, now: datetime, found: dict[Ident, KeyLimit], periods: Collection[float],
    keys: Collection[str] | None,
) -> None:  # fmt: skip
    """Add the rate slots' and the running holders' use to ``found``."""
    for period in periods:
        for key, resting, used, first, job in rate_slots(alias, now, period, keys):
            limit = _limit(found, (key, RATE, period))
            limit.in_use, limit.resting, limit.first_start, limit.sample_job = used, resting, first, job
    for key, holders in concurrency_holders(alias, keys).items():
        limit = _limit(found, (key, CONCURRENCY, 0.0))
        limit.holders = tuple(sorted(holders))
        limit.in_use, limit.sample_job = len(holders), limit.holders[0]


# -- the queries -------------------------------------------------------------


def rate_periods(alias: str) -> list[float]:
    """The periods of the rate limits that have slots."""
    rows = LimitSlot.objects.using(alias).filter(kind=RATE).order_by()
    return sorted(rows.values_list("period", flat=True).distinct())


# A rate key's slots: (key, resting, used, first start among the resting, a job one let start).
RateRow = tuple[str, int, int, datetime, int | None]


def rate_slots(alias: str, now: datetime, period: float, keys: Collection[str] | None) -> list[RateRow]:
    """Per key with a rate limit of ``period``: its slots resting, its starts in the last period,
    the first start among the resting slots, and a job a slot let start.

    The busiest ``KEYS_READ`` keys; none whose slots all rest no more.
    """
    rows = LimitSlot.objects.using(alias).filter(
        kind=RATE, period=period, taken_at__gt=now - timedelta(seconds=period + guard(period))
    )
    if keys is not None:
        rows = rows.filter(key__in=keys)
    since = now - timedelta(seconds=period)
    grouped = rows.order_by().values("key").annotate(
        resting=Count("pk"), used=Count("pk", filter=Q(taken_at__gt=since)),
        first=Min("taken_at"), job=Max("job_id"),
    )  # fmt: skip
    busiest = grouped.order_by("-resting", "key").values_list("key", "resting", "used", "first", "job")
    return list(busiest[:KEYS_READ])


def concurrency_holders(alias: str, keys: Collection[str] | None = None) -> dict[str, list[int]]:
    """The running jobs that hold each concurrency key's slots (under the claim they started with).

    Read from the running jobs, as many as the workers' threads: only their
    keys can have a slot held.
    """
    running = Job.objects.using(alias).running().exclude(limits="").order_by()
    claims: dict[int, int] = {}
    wanted: set[str] = set()
    for pk, claim, text in running.values_list("pk", "claims", "limits"):
        held = {key for key, _ in Limits.decode(text).concurrency}
        if keys is not None:
            held &= set(keys)
        if held:
            claims[pk] = claim
            wanted |= held
    holders: dict[str, list[int]] = defaultdict(list)
    if not wanted:
        return holders
    slots = LimitSlot.objects.using(alias).filter(kind=CONCURRENCY, key__in=wanted, job_id__in=claims)
    for key, job_id, claim in slots.values_list("key", "job_id", "claim"):
        if job_id is not None and claims.get(job_id) == claim:
            holders[key].append(job_id)
    return holders


def active_holds(alias: str, now: datetime, keys: Collection[str] | None = None) -> dict[str, Hold]:
    """The holds not ended at ``now``, by key."""
    rows = LimitHold.objects.using(alias).filter(until__gt=now)
    if keys is not None:
        rows = rows.filter(key__in=keys)
    values = rows.order_by("key").values_list("key", "until", "reason", "job_id")[:KEYS_READ]
    return {key: Hold(key, until, reason, job_id) for key, until, reason, job_id in values}


@dataclasses.dataclass
class Waiting:
    counts: dict[Ident, int]  # each limit's N, as the queued jobs say
    by_limit: Counter[Ident]  # queued jobs under each limit
    by_key: Counter[str]  # queued jobs under each key (a job counted once per key)
    read: int  # queued jobs with limits read


def read_waiting(alias: str) -> Waiting:
    """The limits of at most ``WAITING_READ`` queued jobs, counted (grouped by their text first:
    jobs of one key share it)."""
    rows = Job.objects.using(alias).queued().exclude(limits="").order_by()
    texts = Counter(rows.values_list("limits", flat=True)[:WAITING_READ])
    decoded = {text: Limits.decode(text) for text in texts}
    by_limit: Counter[Ident] = Counter()
    by_key: Counter[str] = Counter()
    for text, n in texts.items():
        for ident in _counts([decoded[text]]):
            by_limit[ident] += n
        job_keys = decoded[text].keys()
        by_key.update(dict.fromkeys(job_keys, n))
    return Waiting(_counts(decoded.values()), by_limit, by_key, sum(texts.values()))


def _sizes(alias: str, found: dict[Ident, KeyLimit], counts: dict[Ident, int]) -> None:
    """Each limit's N: from the queued jobs, else from the last job one of its slots let start."""
    for ident, count in counts.items():
        if ident in found:
            found[ident].count = count
    unknown = {limit.sample_job for limit in found.values() if limit.count is None and limit.sample_job}
    if not unknown:
        return
    rows = Job.objects.using(alias).filter(pk__in=unknown).values_list("limits", flat=True)
    for ident, count in _counts(Limits.decode(text) for text in rows).items():
        if ident in found and found[ident].count is None:
            found[ident].count = count


def _by_key(limits: Iterable[KeyLimit], holds: dict[str, Hold], waiting: Counter[str]) -> list[KeyView]:
    keys: dict[str, KeyView] = {}
    for limit in sorted(limits, key=lambda limit: (limit.kind != RATE, limit.period)):
        keys.setdefault(limit.key, KeyView(limit.key)).limits.append(limit)
    for key, hold in holds.items():
        keys.setdefault(key, KeyView(key)).hold = hold
    for view in keys.values():
        view.waiting = waiting[view.key]
    in_use = [view for view in keys.values() if _in_use(view)]
    return sorted(in_use, key=lambda v: (not v.throttled, -v.waiting, -_used(v), v.key))


def _in_use(view: KeyView) -> bool:
    return view.hold is not None or view.waiting > 0 or _used(view) > 0


def _used(view: KeyView) -> int:
    return sum(limit.in_use + limit.resting for limit in view.limits)
