"""A workflow's or batch's figures: its jobs by state, its progress, and the steps and edges to draw.

Progress is counted, never kept: a counter row that every finishing job of
a batch updates would serialize the workers on it. The counts read the
``vellum_job_workflow`` index (workflow, state), one grouped query for a
whole page of workflows; a batch of 100,000 jobs costs a walk of its index
entries, so the list of workflows shows a page of fifty.

The steps drawn are at most ``limit`` of them, the first by id (the order
they were enqueued in), and the edges read are those between them: what a
page draws costs two queries whatever the workflow's size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from django.db.models import Count

from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Dependency, Workflow


@dataclasses.dataclass(frozen=True)
class Progress:
    """A workflow's jobs by state (every state present)."""

    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def finished(self) -> int:
        return sum(self.counts[state] for state in Job.FINISHED_STATES)

    @property
    def text(self) -> str:
        """``3 of 8 finished``."""
        return f"{self.finished:,} of {self.total:,} finished"

    @property
    def is_finished(self) -> bool:
        return self.finished == self.total

    @property
    def present(self) -> list[tuple[str, int]]:
        """The states it has jobs in, with their counts, in the order of ``Job.State``."""
        return [(state, n) for state, n in self.counts.items() if n]


def progress(workflow_ids: Iterable[int], alias: str | None = None) -> dict[int, Progress]:
    """The progress of each of ``workflow_ids`` (one without jobs has all zeros), in one query."""
    ids = list(workflow_ids)
    counts = {pk: dict.fromkeys(Job.State.values, 0) for pk in ids}
    if ids:
        rows = (
            Job.objects.using(alias)
            .filter(workflow_id__in=ids)
            .order_by()
            .values_list("workflow_id", "state")
            .annotate(n=Count("pk"))
        )
        for pk, state, n in rows:
            counts[pk][state] = n
    return {pk: Progress(found) for pk, found in counts.items()}


@dataclasses.dataclass(frozen=True)
class Step:
    id: int
    name: str
    state: str


@dataclasses.dataclass(frozen=True)
class Edge:
    upstream: int
    job: int
    upstream_state: str  # as the edge recorded it: '' until the upstream job ended


def steps(workflow: Workflow, limit: int) -> tuple[list[Step], list[Edge]]:
    """The first ``limit`` jobs of ``workflow`` by id, and the edges between them."""
    alias = workflow._state.db
    rows = (
        Job.objects.using(alias)
        .filter(workflow_id=workflow.pk)
        .order_by("pk")
        .values_list("pk", "name", "state")[:limit]
    )
    found = [Step(*row) for row in rows]
    ids = [step.id for step in found]
    if not ids:
        return [], []
    # Both ends among the drawn ones; a job's edges are read through the (job, upstream_state) index.
    edges = (
        Dependency.objects.using(alias)
        .filter(job_id__in=ids, upstream_id__in=ids)
        .order_by("job_id", "position", "upstream_id")
        .values_list("upstream_id", "job_id", "upstream_state")
    )
    return found, [Edge(*edge) for edge in edges]
