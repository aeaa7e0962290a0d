"""The rules of the limits' gate, apart from the database: which slot a job takes, or why it waits.

``decide`` is plain Python over the slot rows the gate read
(``vellum_jobs.store.limit_gate``), the holds on the job's keys and the
jobs running now, so the rules are tested on their own. Each rate limit's
key has at most N slots; a slot lets a job start a period (and its guard)
after its last start, so no window of the period sees more than N starts.
A concurrency slot is held while the job that took it runs under the same
claim. A job that may not start is told when its next slot comes; jobs
told one after another get later and later times, a period apart per slot.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from datetime import datetime, timedelta

from vellum_jobs.core.limit_models import CONCURRENCY, RATE
from vellum_jobs.core.limits import Limits, guard, period_text

# What the ``error`` of a job held back starts with (``explain()`` reads it).
HELD_PREFIX = "held by "
# A job held back by a full concurrency key comes back after about this long
# (a slot frees when some job ends, which nothing here is told of).
CONCURRENCY_RECHECK = 1.0


@dataclasses.dataclass(frozen=True)
class Held:
    """Why a job may not start yet, and when to look again."""

    until: datetime
    reason: str
    # A rate slot rests within a moment (its guard): the thread waits for it
    # rather than send the job back to the queue (``limit_gate.check``).
    soon: bool = False


@dataclasses.dataclass
class Slot:
    """One ``LimitSlot`` row as the gate reads it (``pk`` None: not made yet)."""

    key: str
    kind: str
    period: float
    slot: int
    taken_at: datetime | None = None
    next_at: datetime | None = None
    job_id: int | None = None
    claim: int = 0
    pk: int | None = None
    # Read with its row's lock (or not made yet): only such a slot may be taken.
    takeable: bool = True


@dataclasses.dataclass
class Plan:
    """What ``decide`` found: the slots to take (all or none), the slots whose ``next_at`` moves on,
    and why the job waits, if it does."""

    take: list[Slot] = dataclasses.field(default_factory=list)
    pushed: list[Slot] = dataclasses.field(default_factory=list)
    held: Held | None = None


def decide(
    limits: Limits,
    slots: Iterable[Slot],
    live: set[tuple[int, int]],
    holds: dict[str, datetime],
    now: datetime,
) -> Plan:
    """Which slots a job under ``limits`` takes ``now``, or why it waits and until when.

    ``slots`` are the rows of its keys, ``live`` the (job id, claims) of the
    jobs running now, ``holds`` the keys held and until when.
    """
    plan = Plan()
    waits: list[Held] = [
        Held(until, f"{HELD_PREFIX}hold on {key!r} (Throttled) until {_when(until)}")
        for key, until in holds.items()
    ]
    by_limit: dict[tuple[str, str, float], list[Slot]] = {}
    for slot in slots:
        by_limit.setdefault((slot.key, slot.kind, slot.period), []).append(slot)
    for key, count, period in limits.rates:
        rows = [s for s in by_limit.get((key, RATE, period), []) if s.slot < count]
        taken = _free_rate(rows, count, key, period, now)
        if taken is not None:
            plan.take.append(taken)
        else:
            waits.append(_rate_wait(rows, key, count, period, now, plan))
    for key, count in limits.concurrency:
        rows = [s for s in by_limit.get((key, CONCURRENCY, 0.0), []) if s.slot < count]
        free = [s for s in rows if s.takeable and (s.job_id is None or (s.job_id, s.claim) not in live)]
        taken = free[0] if free else _new_slot(rows, count, key, CONCURRENCY, 0.0)
        if taken is not None:
            plan.take.append(taken)
        else:
            recheck = CONCURRENCY_RECHECK * (1 + random.random())  # spreads the lookups
            until = now + timedelta(seconds=recheck)
            waits.append(Held(until, f"{HELD_PREFIX}concurrency limit {key!r} ({count} at once): all taken"))
    if waits:
        plan.take = []
        plan.held = max(waits, key=lambda held: held.until)
    for slot in plan.take:
        # A rate slot's next time for a job held back never comes before its last start.
        slot.taken_at, slot.next_at = now, max(slot.next_at or now, now)
    return plan


def _free_rate(rows: list[Slot], count: int, key: str, period: float, now: datetime) -> Slot | None:
    """The rate slot a start ``now`` takes: the longest rested of those rested ``period`` and its
    guard since their last start, else a new one while there are fewer than ``count``."""
    rested = [s for s in rows if s.takeable and _rested(s, period, now)]
    if rested:
        return min(rested, key=lambda s: (s.taken_at is not None, s.taken_at or now, s.slot))
    return _new_slot(rows, count, key, RATE, period)


def _rested(slot: Slot, period: float, now: datetime) -> bool:
    """Whether a rate slot may start a job ``now``: ``period`` and its guard since its last start."""
    return slot.taken_at is None or slot.taken_at + timedelta(seconds=period + guard(period)) <= now


def _rate_wait(rows: list[Slot], key: str, count: int, period: float, now: datetime, plan: Plan) -> Held:
    """When a job held back by a full rate key comes back: the slot that rests soonest, counting the
    jobs held back before it (``next_at``), so a backlog is spread over the windows to come."""
    rest = timedelta(seconds=period + guard(period))
    limit = f"rate limit {key!r} ({count} per {period_text(period)})"
    soonest = min(s.taken_at + rest for s in rows if s.taken_at is not None)
    if soonest - now <= timedelta(seconds=guard(period)):
        # A moment early for a slot (its last start was a moment late, after the time the
        # job was told): come back for it, not at the back of the line, or it idles a period.
        return Held(soonest, f"{HELD_PREFIX}{limit}: next slot at {_when(soonest)}", soon=True)

    def next_time(slot: Slot) -> datetime:
        assert slot.taken_at is not None  # every slot of a full key has started a job
        return slot.taken_at + rest if slot.next_at is None else max(slot.taken_at, slot.next_at) + rest

    slot = min(rows, key=next_time)
    slot.next_at = until = max(next_time(slot), now)
    plan.pushed.append(slot)
    # Due half a guard early: claimed by then, the job waits out the rest in its thread (``soon``).
    due = max(until - timedelta(seconds=guard(period) / 2), now)
    return Held(due, f"{HELD_PREFIX}{limit}: next slot at {_when(until)}")


def _new_slot(rows: list[Slot], count: int, key: str, kind: str, period: float) -> Slot | None:
    """A slot not made yet, while the key has fewer than ``count``: numbered after the highest.

    A key's slots are numbered 0, 1, 2... as they are made, and pruning takes
    all of a key's slots or none, so the highest number tells how many there are.
    """
    number = max((s.slot for s in rows), default=-1) + 1
    return Slot(key, kind, period, number) if number < count else None


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + (" UTC" if moment.utcoffset() is not None else "")
