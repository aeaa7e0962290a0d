"""The gate a job with limits passes just before its handler starts: its rate and concurrency slots.

A worker's thread (or its event loop) asks ``check(job)`` right before the
handler runs, after the claim: a job claimed ahead counts against its limits
only once it starts, so claiming ahead never lets a burst through. All of a
job's limits are checked together, in one short transaction, and either
every limit gives it a slot or none does. A slot is taken under its row's
lock (``SKIP LOCKED`` on PostgreSQL and MariaDB/MySQL: two gates take two
slots of a key side by side, never one; SQLite's transaction holds its one
write lock), and a new slot is made under the key's unique index.

A job that may not start yet is not failed and uses no attempt: it goes back
to the queue (``transitions.held_back``), due when its next slot comes, with
the reason in its ``error``. Which slot, and when, is decided by
``core.limit_rules`` over the rows read here, apart from the database. The
common case, a job under one rate limit whose key has a rested slot, is one
statement on PostgreSQL and SQLite (``_at_once``).

A handler that raises ``Throttled(key, seconds=30)`` holds its key
(``LimitHold``): no job under that key starts, on any worker, until then.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta

from django.db import IntegrityError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, Q, QuerySet

from vellum_jobs.core import clock
from vellum_jobs.core.limit_models import CONCURRENCY, RATE, LimitHold, LimitSlot
from vellum_jobs.core.limit_rules import CONCURRENCY_RECHECK, HELD_PREFIX, Held, Plan, Slot, decide
from vellum_jobs.core.limits import Limits, guard
from vellum_jobs.core.models import Job
from vellum_jobs.core.transitions import RUNNING
from vellum_jobs.store import db

logger = logging.getLogger("vellum_jobs")

# A slot row's columns, in ``Slot``'s order.
_FIELDS = [f.name for f in dataclasses.fields(Slot) if f.name not in ("pk", "takeable")]


# How many times a thread waits for a rate slot that rests in a moment (``Held.soon``).
WAITS_FOR_A_SLOT = 2
# After database trouble in the gate itself, the job comes back this much later.
TROUBLE_RECHECK = 1.0


# The time limits are judged at: a test's ``run_jobs(now=...)``, else the clock.
_judged_at: ContextVar[datetime | None] = ContextVar("vellum_limits_judged_at", default=None)


@contextmanager
def judged_at(now: datetime | None) -> Iterator[None]:
    """Judge limits at ``now`` (None: the clock) in this block: ``run_jobs(now=...)`` runs jobs as at
    that time, so jobs held back until then may start."""
    token = _judged_at.set(now)
    try:
        yield
    finally:
        _judged_at.reset(token)


def _now() -> datetime:
    return _judged_at.get() or clock.now()


def check(job: Job) -> Held | None:
    """Take a slot of each of ``job``'s limits for this start, or say why it waits (None: it starts).

    Database trouble holds the job back a moment rather than fail it: the
    attempt is not counted either way.
    """
    limits = Limits.decode(job.__dict__.get("limits") or "")
    if not limits:
        return None
    alias = job._state.db or "default"
    try:
        held = _check(alias, job, limits)
        for _ in range(WAITS_FOR_A_SLOT):
            if held is None or not held.soon or _judged_at.get() is not None:
                break
            # A slot rests in a moment: wait for it here, rather than queue the job again
            # and claim it again (which would leave the slot idle as long).
            time.sleep(max(0.0, (held.until - clock.now()).total_seconds()))
            held = _check(alias, job, limits)
        return held
    except Exception as exc:  # noqa: BLE001 - the job comes back; its handler never ran
        logger.warning(
            "%s #%s: could not check its limits; it goes back to the queue for a moment job_id=%s error=%r",
            job.name,
            job.pk,
            job.pk,
            exc,
        )
        return Held(_now() + timedelta(seconds=TROUBLE_RECHECK), f"{HELD_PREFIX}database trouble: {exc!r}")


def check_returning_when(job: Job) -> tuple[Held | None, datetime]:
    """``check``, and when it returned: for a coroutine job, which resumes on its loop after the
    gate ran in a thread (``resumed_late``)."""
    return check(job), clock.now()


def resumed_late(job: Job, returned_at: datetime) -> Held | None:
    """A coroutine job whose loop resumed it too long after its gate passed, or None.

    The gate stamps a rate slot at most half its guard before it returns; a
    loop that another coroutine keeps busy may resume the job later than the
    other half. Its handler must not start then: its start would come less
    than a period before the slot's next. The slot stays spent (a start that
    did not happen: the limit is under-used, never exceeded), and the job
    goes back to the queue, due at once, its attempt not counted.
    """
    limits = Limits.decode(job.__dict__.get("limits") or "")
    if not limits.rates or _judged_at.get() is not None:
        return None
    now = clock.now()
    late = (now - returned_at).total_seconds()
    if late <= min(guard(period) for _, _, period in limits.rates) / 2:
        return None
    return Held(now, f"{HELD_PREFIX}its event loop, busy, resumed it {late:.3f}s after its gate")


class _SlotGone(Exception):
    """A slot the gate read was pruned before it took it (``maintenance.limit_pruning``), or one it
    would make was made by another gate first."""


def _check(alias: str, job: Job, limits: Limits) -> Held | None:
    for _ in range(LOOKS):
        try:
            return _check_once(alias, job, limits)
        except _SlotGone:
            continue  # rolled back: read the key's slots again
    # Other gates kept making the slots this one would: a key coming into use on many
    # threads at once. Each look saw more of them; the job comes back in a moment.
    return Held(
        _now() + timedelta(seconds=CONCURRENCY_RECHECK / 10), f"{HELD_PREFIX}a key's slots being made"
    )


# How many times a gate reads a key's slots again when another gate made or pruned one first.
LOOKS = 10


def _check_once(alias: str, job: Job, limits: Limits) -> Held | None:
    if (stamped := _at_once(alias, job, limits)) is not None:
        return _stamp_late_start(alias, job, limits, stamped)
    with transaction.atomic(using=alias):
        now = _now()
        holds = dict(
            LimitHold.objects.using(alias)
            .filter(key__in=limits.keys(), until__gt=now)
            .values_list("key", "until")
        )
        slots = [] if holds else _slots(alias, limits, now)
        plan = decide(limits, slots, _live(alias, slots), holds, now)
        new = [slot for slot in plan.take if slot.pk is None and slot.kind == RATE]
        if not new:
            _write(alias, plan, job)
    if new:
        _make_spares(alias, new, limits, now)
        raise _SlotGone  # look again: the new slots are there, rested, for whichever gate comes
    if plan.held is not None:
        return plan.held
    return _stamp_late_start(alias, job, limits, now)


# A rate key's slots are made this many at a time, as it comes into use.
SPARES = 32


def _make_spares(alias: str, new: list[Slot], limits: Limits, now: datetime) -> None:
    """Make up to ``SPARES`` slots of each rate limit that ``new`` would start, numbered on from it,
    rested (never started a job: their last start lies a period and more before ``now``).

    Many gates of a key coming into use make its slots at once: each makes a run of numbers
    from the highest it saw, and a number already made is left as it is, so the numbers stay
    dense and no gate fails for another's.
    """
    counts = {(key, period): count for key, count, period in limits.rates}
    rows = []
    for slot in new:
        count = counts[slot.key, slot.period]
        long_ago = now - timedelta(seconds=slot.period + guard(slot.period), days=1)
        rows += [
            LimitSlot(
                key=slot.key, kind=RATE, period=slot.period, slot=number, taken_at=long_ago, next_at=long_ago
            )
            for number in range(slot.slot, min(slot.slot + SPARES, count))
        ]
    LimitSlot.objects.using(alias).bulk_create(rows, ignore_conflicts=True)


def _at_once(alias: str, job: Job, limits: Limits) -> datetime | None:
    """The common case in one statement, where the database can: a job under one rate limit takes
    the key's longest-rested slot if one has rested and no hold is on the key, and the time it was
    stamped with is returned. None: the full gate decides (no rested slot, a new slot to make, a
    hold, a job to tell when to come back)."""
    connection = connections[alias]
    if len(limits.rates) != 1 or limits.concurrency or _judged_at.get() is not None:
        return None
    if connection.vendor not in _AT_ONCE_VENDORS:
        return None
    statement = _at_once_statements.get(connection.vendor)
    if statement is None:
        statement = _at_once_statements[connection.vendor] = db.driver_sql(
            connection, _at_once_sql(connection)
        )
    key, count, period = limits.rates[0]
    ops = connection.ops
    connection.ensure_connection()  # a new connection's setup is not part of the start
    now = clock.now()
    cutoff = ops.adapt_datetimefield_value(now - timedelta(seconds=period + guard(period)))
    stamp = ops.adapt_datetimefield_value(now)
    params = [stamp, stamp, stamp, job.pk, job.claims, key, RATE, period, count, cutoff, key, stamp]
    if db.execute(connection, statement, params).fetchone() is None:
        return None
    return now


# Where ``_at_once`` runs: an UPDATE may select its row from its own table and return it
# (MySQL allows neither; there the full gate decides every start).
_AT_ONCE_VENDORS = ("postgresql", "sqlite")
_at_once_statements: dict[str, str] = {}


def _at_once_sql(connection: BaseDatabaseWrapper) -> str:
    """The one-statement take of ``_at_once``: UPDATE the longest-rested slot, found and locked
    (PostgreSQL: ``SKIP LOCKED``; SQLite: the statement holds the write lock) by a subquery.
    A key's slots always have a ``taken_at``: a slot is made by a start."""
    slot, hold = LimitSlot._meta, LimitHold._meta
    quote = connection.ops.quote_name
    c = {f.attname: quote(str(f.column)) for f in slot.concrete_fields}
    h = {f.attname: quote(str(f.column)) for f in hold.concrete_fields}
    later = "GREATEST" if connection.vendor == "postgresql" else "MAX"
    lock = " FOR UPDATE SKIP LOCKED" if connection.vendor == "postgresql" else ""
    return (
        f"UPDATE {quote(slot.db_table)} SET {c['taken_at']} = %s, "
        f"{c['next_at']} = {later}(COALESCE({c['next_at']}, %s), %s), {c['job_id']} = %s, {c['claim']} = %s "
        f"WHERE {c['id']} = (SELECT {c['id']} FROM {quote(slot.db_table)} "
        f"WHERE {c['key']} = %s AND {c['kind']} = %s AND {c['period']} = %s AND {c['slot']} < %s "
        f"AND {c['taken_at']} <= %s AND NOT EXISTS (SELECT 1 FROM {quote(hold.db_table)} "
        f"WHERE {h['key']} = %s AND {h['until']} > %s) "
        f"ORDER BY {c['taken_at']} LIMIT 1{lock}) RETURNING {c['id']}"
    )


# How many times a slow gate stamps its rate slots again (``_stamp_late_start``), and how the
# reason of a job held back when every stamp came back late begins.
RESTAMPS = 3
SLOW_STAMPS = f"{HELD_PREFIX}a slow database: "


def _stamp_late_start(alias: str, job: Job, limits: Limits, stamped: datetime) -> Held | None:
    """Stamp the rate slots a job took with the time it really starts, if the gate was slow; hold
    the job back, its slots spent, if even the stamps come back too late.

    A slot counts a start from the time the gate read before its statements;
    the handler starts after the commit. Should that take longer than half
    the guard (a loaded host, a slow disk, a lock another gate's scan holds
    for a moment), the next start of the slot would come less than a period
    after this one's first line: so the slots are stamped again. A stamp
    takes a statement, and its time is read before it is sent, so each is
    the time the statement should come back by, going by how long the last
    one took: on a database whose every commit takes longer than half the
    guard, the second stamp is on time. A stamp ahead of the start delays
    the slot's next start by as much, never brings it forward. No other gate
    can take the slots meanwhile, a period being far longer than a commit.

    A database that gets slower with each of ``RESTAMPS`` stamps leaves no
    stamp the handler's start keeps to: the job goes back to the queue, due
    at once, its attempt not counted, and its slots stay spent (the limit
    under-used, never exceeded).
    """
    if not limits.rates or _judged_at.get() is not None:
        return None
    allowed = timedelta(seconds=min(guard(period) for _, _, period in limits.rates) / 2)
    took = timedelta(0)  # how long the last stamp's statement took
    for restamps in range(RESTAMPS + 1):
        now = clock.now()
        if now - stamped <= allowed:
            return None
        if restamps == RESTAMPS:
            break
        stamped = now + took
        slots = LimitSlot.objects.using(alias).filter(job_id=job.pk, claim=job.claims, kind=RATE)
        slots.update(taken_at=stamped)
        took = clock.now() - now
    late = (now - stamped).total_seconds()
    return Held(now, f"{SLOW_STAMPS}its rate slots' last stamp came back {late:.3f}s late; they stay spent")


def _slots(alias: str, limits: Limits, now: datetime) -> list[Slot]:
    """The slot rows ``decide`` needs, those it may take locked (``SKIP LOCKED``: a slot another
    gate is taking is passed over, not waited for).

    Of each rate limit: the longest-rested slot if it has rested, else the
    highest numbered (a new slot is numbered after it) and the one whose
    next time comes soonest; a few index probes however many slots the key
    has. Of each concurrency key: its slots whose job no longer runs, and the
    highest numbered.
    """
    slots: list[Slot] = []
    for key, count, period in limits.rates:
        rows = _rows(alias, key, RATE, period, count)
        cutoff = now - timedelta(seconds=period + guard(period))
        rested = rows.filter(Q(taken_at__isnull=True) | Q(taken_at__lte=cutoff))
        oldest = _first(_locked(alias, rested).order_by(F("taken_at").asc(nulls_first=True)))
        if oldest is not None:
            slots.append(oldest)
            continue
        # Read to number a new slot and to tell a job when to come back, never taken: the
        # highest numbered, the one that rests first, the one whose next time comes first.
        seen = (_first(rows.order_by(order)) for order in ("-slot", "taken_at", "next_at"))
        slots += [_seen(row) for row in seen if row is not None]
    for key, count in limits.concurrency:
        rows = _rows(alias, key, CONCURRENCY, 0.0, count)
        every = [Slot(*row) for row in rows.values_list(*_FIELDS, "pk")]
        live = _live(alias, every)
        ended = [slot.pk or 0 for slot in every if (slot.job_id, slot.claim) not in live]
        # Locked, then judged again as they are now: another gate may have taken one meanwhile.
        slots += [Slot(*row) for row in _locked(alias, rows.filter(pk__in=ended)).values_list(*_FIELDS, "pk")]
        slots += [_seen(slot) for slot in every if slot.pk not in ended]
    return slots


def _seen(slot: Slot) -> Slot:
    slot.takeable = False
    return slot


def _rows(alias: str, key: str, kind: str, period: float, count: int) -> QuerySet[LimitSlot]:
    return LimitSlot.objects.using(alias).filter(key=key, kind=kind, period=period, slot__lt=count)


def _locked(alias: str, rows: QuerySet[LimitSlot]) -> QuerySet[LimitSlot]:
    """``rows`` read with a lock until commit, skipping those another transaction has locked
    (SQLite: its transaction holds the database's one write lock)."""
    if connections[alias].vendor == "sqlite":
        return rows
    return rows.select_for_update(skip_locked=True)


def _first(rows: QuerySet[LimitSlot]) -> Slot | None:
    row = rows.values_list(*_FIELDS, "pk")[:1]
    return Slot(*row[0]) if row else None


def _live(alias: str, slots: list[Slot]) -> set[tuple[int, int]]:
    """(id, claims) of the concurrency slots' jobs that are running: the holders still holding."""
    job_ids = [slot.job_id for slot in slots if slot.kind == CONCURRENCY and slot.job_id is not None]
    if not job_ids:
        return set()
    running = Job.objects.using(alias).filter(pk__in=job_ids, state=RUNNING).values_list("pk", "claims")
    return set(running)


def _write(alias: str, plan: Plan, job: Job) -> None:
    manager = LimitSlot.objects.using(alias)
    for slot in plan.take:
        slot.job_id, slot.claim = job.pk, job.claims
        if slot.pk is None:
            try:
                with transaction.atomic(using=alias):
                    slot.pk = manager.create(**_columns(slot)).pk
            except IntegrityError:
                raise _SlotGone from None  # another gate made it first: look again
        elif not manager.filter(pk=slot.pk).update(
            taken_at=slot.taken_at, next_at=slot.next_at, job_id=job.pk, claim=job.claims
        ):
            raise _SlotGone
    for slot in plan.pushed:  # rows of a full key: all made
        manager.filter(pk=slot.pk or 0).update(next_at=slot.next_at)


def _columns(slot: Slot) -> dict[str, object]:
    return {name: getattr(slot, name) for name in _FIELDS}


# -- holds: a handler that was told to slow down ------------------------------


def hold(alias: str, key: str, seconds: float, reason: str, job_id: int | None) -> datetime:
    """Hold ``key`` for ``seconds`` from now (or keep a longer hold already there); until when."""
    now = _now()
    until = now + timedelta(seconds=seconds)
    fields = {"until": until, "reason": reason, "set_at": now, "job_id": job_id}
    manager = LimitHold.objects.using(alias)
    for _ in range(3):
        with transaction.atomic(using=alias):
            if manager.filter(key=key, until__lt=until).update(**fields):
                return until
            current = manager.filter(key=key).values_list("until", flat=True).first()
            if current is not None:
                return current  # a longer hold stands
        try:
            with transaction.atomic(using=alias):
                manager.create(key=key, **fields)
            return until
        except IntegrityError:
            continue  # another worker made it first: compare with theirs
    return until
