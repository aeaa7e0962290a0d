"""The workflow page's buttons: cancel every step not finished, retry the failed and cancelled ones.

Each is the bulk form of the job's own (``JobQuerySet.cancel()`` and
``retry()``) on the workflow's jobs, one statement per state it changes,
whose WHERE clause checks that state; so a step a worker claimed or
finished since the page was drawn is asked to stop or left alone, never
clobbered, and the message says how many changed.

Retry leaves alone a step that was cancelled before it ran and waits for
other steps: queued now, it would run before them. One that an upstream
job's end cancelled waits again when that job is retried
(``transitions.REOPENED``); one a person cancelled stays cancelled.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.db.models import Q
from django.utils.translation import ngettext

from vellum_jobs.core import clock
from vellum_jobs.core.models import Job, JobQuerySet
from vellum_jobs.core.workflow_models import Workflow

# A message: its level and text.
Said = tuple[int, str]


def steps_of(workflow: Workflow) -> JobQuerySet:
    return Job.objects.using(workflow._state.db).filter(workflow_id=workflow.pk)


def never_ran_behind_upstream() -> Q:
    """Steps cancelled before they ran that wait for others: retrying them alone would skip those."""
    return Q(state=Job.State.CANCELLED, attempts=0) & ~Q(run_if="")


def cancel(workflow: Workflow) -> list[Said]:
    """Cancel the waiting and queued steps, ask the running ones to stop, and note when."""
    now = clock.of(workflow._state.db or "default")
    Workflow.objects.using(workflow._state.db).filter(pk=workflow.pk, cancelled_at=None).update(
        cancelled_at=now
    )
    steps = steps_of(workflow)
    # Waiting and queued first: a step claimed between the two statements is then asked to stop.
    cancelled = steps.filter(state__in=(Job.State.WAITING, Job.State.QUEUED)).cancel()
    asked = steps.running().cancel()
    said: list[Said] = []
    if cancelled:
        text = ngettext("Cancelled {n} step.", "Cancelled {n} steps.", cancelled).format(n=cancelled)
        said.append((messages.SUCCESS, text))
    if asked:
        text = ngettext(
            "Asked {n} running step to stop: its handler sees should_stop() within a heartbeat.",
            "Asked {n} running steps to stop: their handlers see should_stop() within a heartbeat.",
            asked,
        ).format(n=asked)
        said.append((messages.SUCCESS, text))
    if not (cancelled or asked):
        said.append((messages.WARNING, "Nothing to cancel: every step has finished or was asked to stop."))
    return said


def retry(workflow: Workflow) -> list[Said]:
    """Queue the failed and cancelled steps again, due now, but those that never ran behind others."""
    steps = steps_of(workflow)
    retried = steps.exclude(never_ran_behind_upstream()).retry()
    left = steps.filter(never_ran_behind_upstream()).count()
    said: list[Said] = []
    if retried:
        text = ngettext(
            "Retried {n} failed or cancelled step: queued again, due now.",
            "Retried {n} failed or cancelled steps: queued again, due now.",
            retried,
        ).format(n=retried)
        said.append((messages.SUCCESS, text))
    if left:
        text = ngettext(
            "Left {n} step cancelled before it ran as it is: it waits for other steps, and queued now it "
            "would run before them.",
            "Left {n} steps cancelled before they ran as they are: they wait for other steps, and queued "
            "now they would run before them.",
            left,
        ).format(n=left)
        said.append((messages.INFO, text))
    if not (retried or left):
        said.append((messages.WARNING, "Nothing to retry: no step failed or was cancelled."))
    return said


ACTIONS: dict[str, Callable[[Workflow], list[Said]]] = {"cancel": cancel, "retry": retry}
