"""The job list's actions: retry, cancel, run now, and pausing or resuming the jobs' queues.

Each action changes only the selected jobs that are in a state it applies
to, in one statement whose WHERE clause checks that state (the bulk form of
``Job.retry()``, ``cancel()`` and ``run_now()``). A job a worker claimed
between the page load and the click is therefore skipped, never clobbered,
and the message says how many were changed and how many skipped.

The job page offers retry, cancel and run now as buttons (``on_one``), which
run these same functions on that one job. Deleting running jobs is refused
(``delete_selected``): a deleted row does not stop its handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.translation import ngettext

from vellum_jobs import queues
from vellum_jobs.core.models import Job, JobQuerySet

if TYPE_CHECKING:
    from vellum_jobs.admin.jobs import JobAdmin

Action = Callable[["JobAdmin", HttpRequest, QuerySet[Job]], None]


def _action(description: str) -> Callable[[Action], Action]:
    """An action of the list that needs the change permission."""
    decorate: Callable[[Action], Action] = admin.action(permissions=["change"], description=description)
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


@_action("Retry selected failed or cancelled jobs now")
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


@_action("Cancel selected waiting, queued or running jobs")
def cancel(model_admin: JobAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
    selected, jobs = queryset.count(), _jobs(queryset)
    cancelled = jobs.filter(state__in=(Job.State.WAITING, Job.State.QUEUED)).cancel()
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


@_action("Pause the queues of selected jobs")
def pause_queues(model_admin: JobAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
    names = _queues(queryset)
    paused = [name for name in names if queues.pause(name, by=f"admin: {request.user}")]
    text = f"Paused {', '.join(paused) or 'nothing'}"
    if len(paused) < len(names):
        text += f" (already paused: {', '.join(sorted(set(names) - set(paused)))})"
    model_admin.message_user(request, f"{text}. Running jobs finish; no new ones start.", messages.SUCCESS)


@_action("Resume the queues of selected jobs")
def resume_queues(model_admin: JobAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
    names = _queues(queryset)
    resumed = [name for name in names if queues.resume(name)]
    text = f"Resumed {', '.join(resumed) or 'nothing'}"
    if len(resumed) < len(names):
        text += f" (not paused: {', '.join(sorted(set(names) - set(resumed)))})"
    model_admin.message_user(request, f"{text}.", messages.SUCCESS)


@_action("Run selected delayed jobs now")
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


# The job page's buttons: the actions a job's state allows, by name.
ON_ONE: dict[str, Action] = {"retry": retry, "cancel": cancel, "run_now": run_now}


def on_one(model_admin: JobAdmin, request: HttpRequest, job: Job, name: str) -> None:
    """Run the action ``name`` on ``job`` alone, as the list runs it on a selection."""
    ON_ONE[name](model_admin, request, Job.objects.using(job._state.db).filter(pk=job.pk))


@admin.action(permissions=["delete"], description="Delete selected jobs (refused if one is running)")
def delete_selected(
    model_admin: JobAdmin, request: HttpRequest, queryset: QuerySet[Job]
) -> HttpResponse | None:
    """Django's bulk delete, refused whole while a selected job runs: deleting its row would not
    stop its handler, which would go on for minutes with nothing left to show for it."""
    running = queryset.filter(state=Job.State.RUNNING).count()
    if running:
        text = ngettext(
            "Deleted nothing: {n} selected job is running. Cancel it and delete it once it has stopped.",
            "Deleted nothing: {n} selected jobs are running. Cancel them and delete them once they have "
            "stopped.",
            running,
        ).format(n=running)
        model_admin.message_user(request, text, messages.ERROR)
        return None
    response: HttpResponse | None = django_delete_selected(model_admin, request, queryset)
    return response
