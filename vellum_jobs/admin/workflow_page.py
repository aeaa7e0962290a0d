"""A workflow's or batch's page: its progress, its jobs by state, its graph (or, for a big batch, its
callbacks), and the cancel and retry buttons its state allows.

The page costs the same few queries however big the workflow: its counts
by state (one grouped query), the first ``MAX_NODES`` jobs by id and the
edges between them. A workflow with more jobs draws those and says how many
are left out; a batch with more draws nothing (thousands of jobs side by
side and one callback say nothing a count does not) and lists its
callbacks, the jobs of it that wait for others.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import urlencode

from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.safestring import SafeString

from vellum_jobs.admin import display, workflow_graph
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Workflow
from vellum_jobs.observe import workflows

# The most jobs a graph draws.
MAX_NODES = 150
# A big batch's callbacks listed.
CALLBACKS = 10


@dataclasses.dataclass(frozen=True)
class StateLink:
    state: str
    count: int
    url: str  # the job list, filtered to this workflow's jobs in this state

    @property
    def badge(self) -> SafeString:
        return display.badge(self.state, self.state)


@dataclasses.dataclass(frozen=True)
class Button:
    action: str  # a key of workflow_actions.ACTIONS
    label: str
    help: str


def buttons(progress: workflows.Progress) -> list[Button]:
    """Cancel while a step has not finished; retry while a step failed or was cancelled."""
    found = []
    if progress.finished < progress.total:
        found.append(Button("cancel", "Cancel", "cancel every step not finished; ask running ones to stop"))
    if progress.counts[Job.State.FAILED] or progress.counts[Job.State.CANCELLED]:
        found.append(Button("retry", "Retry", "queue the failed and cancelled steps again, due now"))
    return found


def context(workflow: Workflow, site: str, can_act: bool) -> dict[str, Any]:
    """What the page shows of ``workflow``; links point into the admin ``site``."""
    alias = workflow._state.db
    progress = workflows.progress([workflow.pk], alias)[workflow.pk]
    job_list = reverse(f"{site}:vellum_jobs_job_changelist")
    its_jobs = f"{job_list}?{urlencode({'workflow': workflow.pk})}"
    states = [
        StateLink(state, n, f"{job_list}?{urlencode({'workflow': workflow.pk, 'state__exact': state})}")
        for state, n in progress.counts.items()
    ]
    big_batch = workflow.kind == Workflow.Kind.BATCH and progress.total > MAX_NODES
    graph = None
    drawn = 0
    callbacks: list[workflows.Step] = []
    if big_batch:
        callbacks = _callbacks(workflow)
    elif progress.total:
        steps, edges = workflows.steps(workflow, MAX_NODES)
        urls = {step.id: reverse(f"{site}:vellum_jobs_job_change", args=[quote(step.id)]) for step in steps}
        graph = workflow_graph.svg(
            steps, edges, urls, f"{workflow}: {len(steps)} jobs and their dependencies"
        )
        drawn = len(steps)
    return {
        "workflow": workflow,
        "progress": progress,
        "percent": round(100 * progress.finished / progress.total) if progress.total else 100,
        "states": states,
        "its_jobs": its_jobs,
        "graph": graph,
        "drawn": drawn,
        "left_out": progress.total - drawn if graph is not None else 0,
        "big_batch": big_batch,
        "max_nodes": MAX_NODES,
        "callbacks": [
            (step, reverse(f"{site}:vellum_jobs_job_change", args=[quote(step.id)])) for step in callbacks
        ],
        "buttons": buttons(progress) if can_act else [],
        "act_url": reverse(f"{site}:vellum_jobs_workflow_act", args=[quote(workflow.pk)]),
    }


def _callbacks(workflow: Workflow) -> list[workflows.Step]:
    """The first jobs of ``workflow`` that wait for others (a batch's callbacks), by id."""
    rows = (
        Job.objects.using(workflow._state.db)
        .filter(workflow_id=workflow.pk)
        .exclude(run_if="")
        .order_by("pk")
        .values_list("pk", "name", "state")[:CALLBACKS]
    )
    return [workflows.Step(*row) for row in rows]
