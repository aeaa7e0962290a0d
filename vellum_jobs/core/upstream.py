"""What a waiting job learns of its upstream jobs once it runs: their outcomes (``upstream()``), and
what it is handed as its first argument (``Job.upstream_arg``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.db.models import Count

from vellum_jobs.core import transitions
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Dependency

# What a batch's callback is handed: the counts of its jobs by how they ended.
COUNTS = "counts"


class Upstream(NamedTuple):
    """One upstream job's outcome, as ``upstream()`` hands it to a handler."""

    id: int
    name: str
    state: str
    result: Any
    error: str


def upstream_of(job: Job) -> list[Upstream]:
    """The jobs ``job`` waited for, in their order (a pruned one is left out)."""
    rows = (
        Job.objects.using(job._state.db)
        .filter(downstream_links__job_id=job.pk)
        .order_by("downstream_links__position", "pk")
        .values_list("pk", "name", "state", "result", "error")
    )
    return [Upstream(*row) for row in rows]


def handed(job: Job) -> Any:
    """What ``job`` gets as its first argument (``Job.upstream_arg``): its upstream job's result, their
    results in order, or a batch's counts by outcome."""
    if job.upstream_arg == COUNTS:
        counts = dict.fromkeys(("total", *transitions.FINISHED_STATES), 0)
        edges = Dependency.objects.using(job._state.db).filter(job_id=job.pk)
        for state, n in edges.values_list("upstream_state").annotate(n=Count("pk")).order_by():
            counts[state] = counts.get(state, 0) + n
            counts["total"] += n
        return counts
    results = [up.result for up in upstream_of(job)]
    if job.upstream_arg == "result":
        return results[0] if results else None
    return results
