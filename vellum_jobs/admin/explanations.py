"""Why queued and waiting jobs wait, for the job list's column and the job page: worked out once per page."""

from __future__ import annotations

from collections.abc import Iterable

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from vellum_jobs.admin import display
from vellum_jobs.core.models import Job
from vellum_jobs.observe.explain import Reason, explain

# Where ``attach`` leaves a job's reasons for the list's column to read.
_ATTRIBUTE = "_vellum_reasons"
# The states whose jobs have not started and have reasons for it.
NOT_STARTED = (Job.State.QUEUED, Job.State.WAITING)


def attach(jobs: Iterable[Job]) -> None:
    """Work out the reasons of the queued and waiting ones among ``jobs`` with a few queries for them all."""
    waiting = [job for job in jobs if job.state in NOT_STARTED]
    reasons = explain(waiting)
    for job in waiting:
        setattr(job, _ATTRIBUTE, reasons[job.pk])


def reasons_of(job: Job) -> list[Reason]:
    found: list[Reason] | None = getattr(job, _ATTRIBUTE, None)
    if found is None:
        found = job.explain()
        setattr(job, _ATTRIBUTE, found)
    return found


def short(job: Job) -> SafeString | str:
    """The list's column: the first reason of a queued or waiting job."""
    if job.state not in NOT_STARTED:
        return display.EMPTY
    first = reasons_of(job)[0]
    return format_html(
        '<span class="vellum-cut vellum-why vellum-why-{}" title="{}">{}</span>',
        first.code,
        first.text,
        first.text,
    )


def full(job: Job) -> SafeString:
    """The job page's field: every reason."""
    return format_html(
        '<ul class="vellum-why-list">{}</ul>',
        format_html_join("", "<li>{}</li>", ((reason.text,) for reason in reasons_of(job))),
    )
