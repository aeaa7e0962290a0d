"""Turning calls of a job function into ``Job`` rows, checked before anything is written."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, router
from django.utils import timezone

from vellum_jobs import wakeup
from vellum_jobs.conf import conf
from vellum_jobs.models import Job, reference_of
from vellum_jobs.payload import normalise_call

if TYPE_CHECKING:
    from vellum_jobs.registry import JobFunction


def enqueue_calls(
    function: JobFunction[Any, Any],
    calls: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    *,
    columns: Mapping[str, Any] | None = None,
) -> list[Job]:
    """Insert one queued job per (args, kwargs) call; all are checked before any is written.

    ``columns`` sets further fields on every row (the Tasks backend marks its jobs).
    """
    options = function.options
    now = timezone.now()
    run_after = _run_after(options.run_after, options.delay, now)
    ref_type, ref_id = reference_of(options.ref) if options.ref is not None else (None, "")
    max_attempts = options.max_attempts or conf.max_attempts
    jobs = []
    for args, kwargs in calls:
        norm_args, norm_kwargs = normalise_call(function.name, args, kwargs)
        jobs.append(
            Job(
                name=function.name,
                queue=options.queue,
                priority=options.priority,
                args=norm_args,
                kwargs=norm_kwargs,
                max_attempts=max_attempts,
                run_after=run_after,
                created_at=now,
                ref_type=ref_type,
                ref_id=ref_id,
                **(columns or {}),
            )
        )
    if not jobs:
        return []
    alias = router.db_for_write(Job) or DEFAULT_DB_ALIAS
    if len(jobs) == 1:
        jobs[0].save(using=alias, force_insert=True)
    else:
        jobs = Job.objects.using(alias).bulk_create(jobs)
    wakeup.announce(alias, options.queue)
    return jobs


def _run_after(run_after: datetime | None, delay: float | timedelta | None, now: datetime) -> datetime:
    if delay is not None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        if seconds < 0:
            raise ValueError(f"delay must not be negative, got {delay!r}")
        return now + timedelta(seconds=seconds)
    if run_after is None:
        return now
    if not isinstance(run_after, datetime):
        raise ValueError(f"run_after must be a datetime, got {run_after!r}")
    if conf.use_tz and timezone.is_naive(run_after):
        raise ValueError(
            f"run_after {run_after.isoformat()} is naive but USE_TZ is True: "
            "pass an aware datetime (e.g. timezone.now() + timedelta(...))"
        )
    if not conf.use_tz and timezone.is_aware(run_after):
        return timezone.make_naive(run_after)
    return run_after
