"""A running job's progress as the job page polls it: done and total, its rate, and the time left.

The rate is the average since the attempt started (``progress_done`` over
the time since ``started_at``, by the database's clock): a job keeps no
history of its progress, and one row read per poll is all this costs.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.http import JsonResponse

from vellum_jobs.admin import display
from vellum_jobs.core import clock
from vellum_jobs.core.models import Job

# Seconds between the page's polls.
POLL_EVERY = 3
# The columns a poll reads.
COLUMNS = (
    "state",
    "started_at",
    "progress_done",
    "progress_total",
    "progress_message",
    "cancel_requested_at",
)


def figures(job: Job, now: datetime) -> dict[str, Any]:
    """What the page shows of ``job``'s progress at ``now``; rate and time left are None when unknown."""
    done, total = job.progress_done, job.progress_total
    elapsed = (now - job.started_at).total_seconds() if job.started_at else None
    rate = done / elapsed if done and elapsed and elapsed > 0 else None
    remaining = (total - done) / rate if rate and total and done is not None and total >= done else None
    percent = max(0, min(100, round(100 * done / total))) if total and done is not None else None
    return {
        "state": job.state,
        "running": job.state == Job.State.RUNNING,
        "done": done,
        "total": total,
        "percent": percent,
        "message": job.progress_message,
        "elapsed": elapsed,
        "rate": rate,
        "remaining": remaining,
        "text": _text(done, total, percent),
        "rate_text": _rate_text(rate),
        "remaining_text": _remaining_text(remaining, total),
        "elapsed_text": display.duration(timedelta(seconds=elapsed))
        if elapsed is not None
        else display.EMPTY,
        "stop_requested": job.cancel_requested_at is not None,
    }


def _text(done: int | None, total: int | None, percent: int | None) -> str:
    if done is None:
        return "no progress reported yet"
    if total:
        return f"{done:,} of {total:,} ({percent}%)"
    return f"{done:,} so far (no total given)"


def _rate_text(rate: float | None) -> str:
    if rate is None:
        return "rate unknown"
    if rate >= 1:
        return f"{rate:,.1f} per second"
    if rate * 60 >= 1:
        return f"{rate * 60:,.1f} per minute"
    return f"{rate * 3600:,.1f} per hour"


def _remaining_text(remaining: float | None, total: int | None) -> str:
    if not total:
        return "time left unknown without a total"
    if remaining is None:
        return "time left unknown"
    return f"about {display.duration(timedelta(seconds=remaining))} left at this rate"


def response(job_id: int, rows: Any) -> JsonResponse:
    """The poll's answer: ``figures`` of the job ``job_id`` among ``rows``, or 404 once it is gone."""
    job = rows.filter(pk=job_id).only(*COLUMNS).first()
    if job is None:
        return JsonResponse({"state": None, "running": False, "gone": True}, status=404)
    return JsonResponse(figures(job, clock.of(job._state.db or "default")))
