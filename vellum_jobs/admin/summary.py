"""The head of the job page: its state, what became of it (error, result, progress, why it waits),
the buttons its state allows and its links along a workflow, above the fields."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString

from vellum_jobs.admin import display, explanations, job_links, progress
from vellum_jobs.core import clock, history
from vellum_jobs.core.models import Job


@dataclasses.dataclass(frozen=True)
class Button:
    action: str  # a key of actions.ON_ONE
    label: str
    help: str


def buttons(job: Job, now: datetime) -> list[Button]:
    """The actions ``job``'s state allows, as the job page's buttons."""
    found = []
    if job.state in Job.RETRYABLE_STATES and job.attempts == 0 and job.run_if:
        # Never ran, behind jobs it waits for: retry() makes it wait for them again.
        found.append(Button("retry", "Retry", "wait again for the jobs before it, then run as they allow"))
    elif job.state in Job.RETRYABLE_STATES:
        found.append(Button("retry", "Retry now", "queue it again, due now, its attempts starting over"))
    if job.state == Job.State.QUEUED and job.run_after > now:
        found.append(Button("run_now", "Run now", "make it due now instead of at its later time"))
    if job.state in (Job.State.WAITING, Job.State.QUEUED):
        found.append(Button("cancel", "Cancel", "it will not run"))
    if job.state == Job.State.RUNNING and job.cancel_requested_at is None:
        found.append(
            Button(
                "cancel",
                "Ask to stop",
                "its handler sees should_stop() within a heartbeat, then it ends cancelled",
            )
        )
    return found


def headline(job: Job, now: datetime, site: str = "admin") -> SafeString:
    """One line: the attempt and what the job is doing or how it ended, and when; what a waiting
    job waits for."""
    if job.state == Job.State.WAITING:
        return job_links.waiting_headline(job, site)
    attempt = f"attempt {job.attempts} of {job.max_attempts}"
    if job.state == Job.State.RUNNING:
        return format_html("{}, running for {}", attempt, _since(job.started_at, now))
    if job.state == Job.State.QUEUED:
        if job.run_after > now:
            return format_html("{} so far, due in {}", attempt, _since(now, job.run_after))
        return format_html("{} so far, due since {} ago", attempt, _since(job.run_after, now))
    took = f" after running {display.duration(job.duration)}" if job.duration is not None else ""
    ago = _since(job.finished_at, now) if job.finished_at else "?"
    return format_html("{}, {} {} ago{}", attempt, job.get_state_display(), ago, took)


def _since(start: datetime | None, end: datetime) -> str:
    if start is None:
        return "?"
    return display.duration(max(end - start, timedelta(0)))


def context(job: Job, can_change: bool, site: str = "admin") -> dict[str, Any]:
    """What the head of ``job``'s page shows, for its template; links point into the admin ``site``."""
    now = clock.of(job._state.db or "default")
    error = job.error.strip()
    return {
        "job": job,
        "badge": display.badge(job.state, job.get_state_display()),
        "headline": headline(job, now, site),
        "error_line": history.summary(error),
        "error": display.preformatted(error) if error else None,
        "result": display.pretty_json(job.result) if job.result is not None else None,
        "reasons": explanations.full(job) if job.state == Job.State.QUEUED else None,
        "progress": progress.figures(job, now) if job.state == Job.State.RUNNING else None,
        "poll_every": progress.POLL_EVERY,
        "buttons": buttons(job, now) if can_change else [],
        "links": job_links.context(job, site),
    }
