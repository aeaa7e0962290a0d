"""Jobs under rate and concurrency limits (tests/limits): each handler notes its start in ``Span``."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tests.testapp.models import Span
from vellum_jobs import Throttled, job

if TYPE_CHECKING:
    from vellum_jobs.core.models import Job


def _current() -> Job:
    """The job this handler runs."""
    from vellum_jobs.execution.context import current_job

    running = current_job()
    assert running is not None
    return running


def _running() -> int:
    """The id of the job this handler runs."""
    return _current().pk


def _started(key: str) -> Span:
    return Span.objects.create(key=key, job_id=_running(), pid=os.getpid(), started=time.monotonic())


@contextmanager
def _spanned(key: str) -> Iterator[None]:
    """Note the handler's start and, as its last line, its end."""
    span = _started(key)
    try:
        yield
    finally:
        Span.objects.filter(pk=span.pk).update(ended=time.monotonic())


@job("test.limits.call_api", rate=("3/2s", "api:{account}"))
def call_api(account: str) -> None:
    _started(f"api:{account}")


@job("test.limits.render", concurrency={"customer:{customer}": 2, "gpu": 1})
def render(customer: str, seconds: float = 0.0) -> None:
    _started(f"render:{customer}")
    time.sleep(seconds)


@job("test.limits.charge", rate=[("5/s", "payments"), ("100/h", "customer:{customer}")])
def charge(customer: str) -> None:
    _started(f"charge:{customer}")


@job("test.limits.fetch", rate=("1000/s", "partner"))
def fetch(page: int, throttle_for: float = 0.0) -> None:
    if throttle_for:
        raise Throttled("partner", seconds=throttle_for, reason="429 Too Many Requests")
    _started("partner")


# -- for the tests with runjobs processes (tests/limits/test_limits_processes.py) --


@job("test.limits.quota_call", rate=("10/5s", "quota:{account}"))
def quota_call(account: str) -> None:
    """Note its start, and how long after its rate slot's stamp it came (the gate's guard is kept
    only by starts that come within it)."""
    from vellum_jobs.core import clock
    from vellum_jobs.core.limit_models import RATE, LimitSlot

    started, now = time.monotonic(), clock.now()
    running = _current()
    slot = LimitSlot.objects.get(job_id=running.pk, claim=running.claims, kind=RATE)
    assert slot.taken_at is not None  # stamped by the gate it passed
    late = (now - slot.taken_at).total_seconds()
    key = f"quota:{account}"
    Span.objects.create(key=key, job_id=running.pk, pid=os.getpid(), started=started, late=late)


@job("test.limits.render_for", concurrency={"customer:{customer}": 2, "gpu": 1})
def render_for(customer: str, seconds: float) -> None:
    with _spanned(f"render:{customer}"):
        time.sleep(seconds)


@job("test.limits.export", concurrency={"customer:{customer}": 2})
def export(customer: str, seconds: float) -> None:
    with _spanned(f"export:{customer}"):
        time.sleep(seconds)


# The Span key of a throttling handler's start: not a key of the hold, so not counted as one of its starts.
THROTTLING = "partner (throttling)"
# The Span key of the moment a hold on "partner" was committed (``note_holds_written``).
HOLD_WRITTEN = "partner (hold written)"


def note_holds_written() -> None:
    """Note, as a ``Span``, the moment each hold this process makes is committed: the start of the
    time no job under its key may pass the gate. (A hold made anew; one lengthened by an UPDATE
    sends no signal, and the test that uses this makes just one.)"""
    from django.db import transaction
    from django.db.models.signals import post_save

    from vellum_jobs.core.limit_models import LimitHold

    def made(instance: LimitHold, created: bool, using: str, **kwargs: object) -> None:
        def committed() -> None:
            now, job_id = time.monotonic(), instance.job_id or 0
            Span.objects.using(using).create(
                key=f"{instance.key} (hold written)", job_id=job_id, pid=os.getpid(), started=now
            )

        if created:
            transaction.on_commit(committed, using=using)

    post_save.connect(made, sender=LimitHold, weak=False)


@job("test.limits.fetch_throttled_once", rate=("1000/s", "partner"))
def fetch_throttled_once(page: int, seconds: float) -> None:
    """Told to slow down on its first run (noted as ``THROTTLING``), a plain fetch on its next."""
    if not Span.objects.filter(key=THROTTLING, job_id=_running()).exists():
        _started(THROTTLING)
        raise Throttled("partner", seconds=seconds, reason="429 Too Many Requests")
    _started("partner")


@job("test.limits.afetch", rate=("1000/s", "partner"))
async def afetch(page: int, throttle_for: float = 0.0) -> None:
    if throttle_for:
        raise Throttled("partner", seconds=throttle_for, reason="429 Too Many Requests")
