"""The workflow page's buttons: cancel every step not finished, retry the failed and cancelled ones.

Each is the bulk form of the job's own (``JobQuerySet.cancel()`` and
``retry()``) on the workflow's jobs, one statement per state it changes,
whose WHERE clause checks that state; so a step a worker claimed or
finished since the page was drawn is asked to stop or left alone, never
clobbered, and the message says how many changed.

Retry is ``Workflow.retry()``: a step that never ran and waits for other
steps waits again rather than being queued (``transitions.REOPENED``), so it
never runs before them.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.utils.translation import ngettext

from vellum_jobs.core import clock
from vellum_jobs.core.models import Job, JobQuerySet
from vellum_jobs.core.workflow_models import Workflow

# A message: its level and text.
Said = tuple[int, str]


def steps_of(workflow: Workflow) -> JobQuerySet:
    return Job.objects.using(workflow._state.db).filter(workflow_id=workflow.pk)


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
    """``Workflow.retry()``: the failed and cancelled steps that ran are queued again; those that
    never ran wait for their upstream steps again."""
    retried = workflow.retry()
    if not retried:
        return [(messages.WARNING, "Nothing to retry: no step failed or was cancelled.")]
    text = ngettext(
        "Retried {n} failed or cancelled step: queued again if it had run, else waiting for the "
        "steps before it.",
        "Retried {n} failed or cancelled steps: queued again if they had run, else waiting for the "
        "steps before them.",
        retried,
    ).format(n=retried)
    return [(messages.SUCCESS, text)]


ACTIONS: dict[str, Callable[[Workflow], list[Said]]] = {"cancel": cancel, "retry": retry}
