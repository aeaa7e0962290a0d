"""Rows of the limit tables as the gate leaves them: rate starts, concurrency holders, holds, and
queued jobs under limits; for tests of what the read side shows."""

from __future__ import annotations

from datetime import datetime, timedelta

from vellum_jobs.core.limit_models import CONCURRENCY, RATE, LimitHold, LimitSlot
from vellum_jobs.core.limits import Limits
from vellum_jobs.core.models import Job


def limits(rates=(), concurrency=()) -> str:
    """The ``Job.limits`` text of these rates ((key, count, period)) and concurrency ((key, count))."""
    return Limits(tuple(rates), tuple(concurrency)).encode()


def queued(text: str, n: int = 1, **fields) -> list[Job]:
    """``n`` queued jobs under the limits ``text``."""
    fields.setdefault("name", "test.add")
    return Job.objects.bulk_create([Job(state=Job.State.QUEUED, limits=text, **fields) for _ in range(n)])


def started(text: str, now: datetime, **fields) -> Job:
    """A running job under the limits ``text``, claimed once, started at ``now``."""
    fields = {"name": "test.add", "claims": 1, "started_at": now, **fields}
    return Job.objects.create(state=Job.State.RUNNING, limits=text, **fields)


def rate_starts(key: str, period: float, *moments: datetime, job: Job | None = None) -> None:
    """Slots 0, 1, ... of rate ``key`` of ``period`` seconds, each taken at one of ``moments``."""
    LimitSlot.objects.bulk_create(
        LimitSlot(key=key, kind=RATE, period=period, slot=n, taken_at=at, job_id=job.pk if job else None)
        for n, at in enumerate(moments)
    )


def holder(key: str, slot: int, job: Job, claims: int | None = None) -> LimitSlot:
    """Concurrency slot ``slot`` of ``key`` taken by ``job`` under ``claims`` (its own by default)."""
    return LimitSlot.objects.create(
        key=key,
        kind=CONCURRENCY,
        period=0,
        slot=slot,
        taken_at=job.started_at,
        job_id=job.pk,
        claim=job.claims if claims is None else claims,
    )


def hold(key: str, now: datetime, seconds: float, reason: str = "") -> LimitHold:
    """A hold on ``key`` set at ``now`` for ``seconds`` (negative: one that has ended)."""
    until = now + timedelta(seconds=seconds)
    return LimitHold.objects.create(key=key, until=until, reason=reason, set_at=now)


def ago(now: datetime, *seconds: float) -> list[datetime]:
    return [now - timedelta(seconds=s) for s in seconds]
