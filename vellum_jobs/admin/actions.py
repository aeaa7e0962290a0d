"""The job list's actions: retry, cancel, run now, and pausing or resuming the jobs' queues.

Each action changes only the selected jobs that are in a state it applies
to, in one statement whose WHERE clause checks that state (the bulk form of
``Job.retry()``, ``cancel()`` and ``run_now()``). A job a worker claimed
between the page load and the click is therefore skipped, never clobbered,
and the message says how many were changed and how many skipped.

On Django 6.1 and later the actions are offered on a job's own page too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import django
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import ngettext

from vellum_jobs import queues
from vellum_jobs.core.models import Job, JobQuerySet

if TYPE_CHECKING:
    from vellum_jobs.admin.jobs import JobAdmin

Action = Callable[["JobAdmin", HttpRequest, QuerySet[Job]], None]


def _action(one: str, many: str) -> Callable[[Action], Action]:
    """An action needing the change permission, described for one job (its page) and for many (the list)."""
    options: dict[str, Any] = {"permissions": ["change"], "description": many}
    if django.VERSION >= (6, 1):
        options.update(
            description=one,
            description_plural=many,
            location=[admin.ActionLocation.CHANGE_LIST, admin.ActionLocation.CHANGE_FORM],
        )
    decorate: Callable[[Action], Action] = admin.action(**options)
    return decorate


def _jobs(queryset: QuerySet[Job]) -> JobQuerySet:
    if isinstance(queryset, JobQuerySet):
        return queryset
    return Job.objects.filter(pk__in=queryset.values("pk"))


def report(
    model_admin: JobAdmin, request: HttpRequest, changed: int, selected: int, *, done: str, skipped: str
) -> None:
    """Tell the user how many jobs the action changed, and how many it skipped and why.

    ``done`` and ``skipped`` are formats with ``{n}`` and ``{jobs}``.
    """
    if changed:
        text = done.format(n=changed, jobs=ngettext("job", "jobs", changed))
        model_admin.message_user(request, text, messages.SUCCESS)
    rest = max(0, selected - changed)
    if rest or not changed:
        text = skipped.format(n=rest, jobs=ngettext("job", "jobs", rest))
        model_admin.message_user(request, text, messages.WARNING)


@_action("Retry this job now", "Retry selected failed or cancelled jobs now")
def retry(model_admin: JobAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
    selected, jobs = queryset.count(), _jobs(queryset)
    report(
        model_admin,
        request,
        jobs.retry(),
        selected,
        done="Retried {n} {jobs}: queued again, due now.",
        skipped="Skipped {n} {jobs} that were not failed or cancelled.",
    )


@_action("Cancel this job", "Cancel selected queued or running jobs")
def cancel(model_admin: JobAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
    selected, jobs = queryset.count(), _jobs(queryset)
    cancelled = jobs.queued().cancel()
    asked = jobs.running().cancel()
    if cancelled:
        text = ngettext("Cancelled {n} job.", "Cancelled {n} jobs.", cancelled).format(n=cancelled)
        model_admin.message_user(request, text, messages.SUCCESS)
    if asked:
        text = ngettext(
            "Asked {n} running job to stop: its handler sees should_stop() within a heartbeat.",
            "Asked {n} running jobs to stop: their handlers see should_stop() within a heartbeat.",
            asked,
        ).format(n=asked)
        model_admin.message_user(request, text, messages.SUCCESS)
    rest = max(0, selected - cancelled - asked)
    if rest or not (cancelled or asked):
        text = ngettext(
            "Skipped {n} job that was finished or already asked to stop.",
            "Skipped {n} jobs that were finished or already asked to stop.",
            rest,
        ).format(n=rest)
        model_admin.message_user(request, text, messages.WARNING)


def _queues(queryset: QuerySet[Job]) -> list[str]:
    return sorted(set(queryset.order_by().values_list("queue", flat=True).distinct()))


@_action("Pause this job's queue", "Pause the queues of selected jobs")
def pause_queues(model_admin: JobAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
    names = _queues(queryset)
    paused = [name for name in names if queues.pause(name, by=f"admin: {request.user}")]
    text = f"Paused {', '.join(paused) or 'nothing'}"
    if len(paused) < len(names):
        text += f" (already paused: {', '.join(sorted(set(names) - set(paused)))})"
    model_admin.message_user(request, f"{text}. Running jobs finish; no new ones start.", messages.SUCCESS)


@_action("Resume this job's queue", "Resume the queues of selected jobs")
def resume_queues(model_admin: JobAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
    names = _queues(queryset)
    resumed = [name for name in names if queues.resume(name)]
    text = f"Resumed {', '.join(resumed) or 'nothing'}"
    if len(resumed) < len(names):
        text += f" (not paused: {', '.join(sorted(set(names) - set(resumed)))})"
    model_admin.message_user(request, f"{text}.", messages.SUCCESS)


@_action("Run this job now", "Run selected delayed jobs now")
def run_now(model_admin: JobAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
    selected, jobs = queryset.count(), _jobs(queryset)
    report(
        model_admin,
        request,
        jobs.run_now(),
        selected,
        done="Made {n} {jobs} due now.",
        skipped="Skipped {n} {jobs} that were not waiting for a later time.",
    )
