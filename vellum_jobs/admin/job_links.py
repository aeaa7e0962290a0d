"""The job page's links along a workflow: the workflow or batch the job belongs to, the jobs it waits
for and the jobs that wait for it, each with its state; and a waiting job's headline.

A few queries whatever the numbers: a batch's callback waits for thousands
of jobs, so each side shows its first ``SHOWN`` jobs and counts the rest by
state (``observe.dependencies``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.contrib.admin.utils import quote
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from vellum_jobs.admin import display
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Workflow
from vellum_jobs.observe import dependencies, workflows

# Jobs listed on each side before "and N more".
SHOWN = 10

# When a job with upstream jobs runs, by its run_if.
RUNS_IF = {
    "done": "runs when they have all ended done; cancelled as soon as one ends failed or cancelled",
    "finished": "runs once they have all ended, whatever they ended as",
    "failed": "runs only if one of them did not end done; cancelled if they all did",
}
# What it is handed first, by its upstream_arg.
HANDED = {
    "result": "handed its upstream job's result as its first argument",
    "results": "handed their results as its first argument, a list in this order",
    "counts": "handed their counts by outcome as its first argument",
}


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of the job's edges, ready to show: its first jobs, and how many more by state."""

    jobs: list[SafeString]
    more: int
    more_by_state: list[tuple[str, int]]


def job_url(site: str, pk: int) -> str:
    return reverse(f"{site}:vellum_jobs_job_change", args=[quote(pk)])


def workflow_url(site: str, pk: int) -> str | None:
    try:
        return reverse(f"{site}:vellum_jobs_workflow_change", args=[quote(pk)])
    except NoReverseMatch:  # a site without the Workflow admin
        return None


def _side(links: dependencies.Links, site: str) -> Side:
    shown = [_linked(job, site) for job in links.shown]
    return Side(shown, links.more, [(state, n) for state, n in links.by_state.items() if n])


def _linked(job: dependencies.Linked, site: str) -> SafeString:
    if job.deleted:
        ended = f", ended {job.ended_as}" if job.ended_as else ""
        return format_html('#{} <span class="vellum-quiet">(deleted{})</span>', job.id, ended)
    return format_html(
        '<a href="{}">#{} {}</a> {}',
        job_url(site, job.id),
        job.id,
        job.name,
        display.badge(job.state, job.state),
    )


def context(job: Job, site: str) -> dict[str, Any] | None:
    """The links of ``job``'s page; None for a job in no workflow that waits for none and none for it."""
    downstream = dependencies.downstream_of(job, SHOWN)
    upstream = dependencies.upstream_of(job, SHOWN) if job.run_if else None
    if job.workflow_id is None and not downstream.total and not (upstream and upstream.total):
        return None
    workflow, progress = None, None
    if job.workflow_id is not None:
        workflow = Workflow.objects.using(job._state.db).filter(pk=job.workflow_id).first()
    if workflow is not None:
        progress = workflows.progress([workflow.pk], job._state.db)[workflow.pk]
    return {
        "workflow": workflow,
        "workflow_id": job.workflow_id,
        "workflow_url": workflow_url(site, job.workflow_id) if job.workflow_id else None,
        "progress": progress,
        "upstream": _side(upstream, site) if upstream and upstream.total else None,
        "runs_if": RUNS_IF.get(job.run_if, f"run_if {job.run_if!r}"),
        "handed": HANDED.get(job.upstream_arg, ""),
        "downstream": _side(downstream, site) if downstream.total else None,
    }


def waiting_headline(job: Job, site: str) -> SafeString:
    """``waiting for #12 and #13``, each linked; or that they have all ended and its release is due."""
    found = dependencies.waiting_for([job]).get(job.pk)
    if found is None:
        return format_html(
            "{}", "waiting: its upstream jobs have all ended, so it is about to be queued or cancelled"
        )
    ids = format_html_join(", ", '<a href="{}">#{}</a>', ((job_url(site, pk), pk) for pk in found.ids[:-1]))
    last = format_html('<a href="{}">#{}</a>', job_url(site, found.ids[-1]), found.ids[-1])
    if found.total > len(found.ids):
        listed = format_html(
            "{}{}{} and {} more", ids, ", " if ids else "", last, found.total - len(found.ids)
        )
    elif ids:
        listed = format_html("{} and {}", ids, last)
    else:
        listed = last
    return format_html("waiting for {}", listed)
