"""Enqueueing jobs that wait for others: checked, linked and, where their upstream jobs have
ended already, released, all in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, router, transaction

from vellum_jobs.core import dependencies, links, transitions
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Workflow
from vellum_jobs.enqueueing import batches
from vellum_jobs.enqueueing.rows import enqueue_calls
from vellum_jobs.execution import inline

if TYPE_CHECKING:
    from vellum_jobs.core.registry import Handler

# Upstream jobs are looked up this many at a time (a statement's parameters are limited).
CHUNK = 1000


def enqueue_after(
    function: Handler[Any, Any],
    calls: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    *,
    after: Sequence[int],
    run_if: str,
    upstream_arg: str = "",
    workflow_id: int | None = None,
) -> list[Job]:
    """Insert one waiting job per call, each waiting for the jobs ``after`` (ids).

    ``ValueError`` names an upstream job that does not exist, and nothing is
    written. The jobs join ``workflow_id``, else the open batch, else the
    first upstream job's workflow, else a new one, which the upstream jobs
    without one join too.
    """
    if function.options.unique_key is not None:
        # A waiting job does not hold its key: two could wait with one.
        raise ValueError(f"{function.name} is a unique job: it cannot wait for others")
    alias = router.db_for_write(Job) or DEFAULT_DB_ALIAS
    with transaction.atomic(using=alias):
        upstream = _upstream(alias, after)
        workflow_id = workflow_id or batches.current_id() or _workflow_of(alias, upstream)
        loose = [pk for pk, (_, workflow) in upstream.items() if workflow is None]
        Job.objects.using(alias).filter(pk__in=loose).update(workflow_id=workflow_id)
        columns = {"state": transitions.WAITING, "workflow_id": workflow_id, "run_if": run_if}
        jobs = enqueue_calls(function, calls, columns={**columns, "upstream_arg": upstream_arg})
        ids = [job.pk for job in jobs]
        links.link(alias, ids, {pk: state for pk, (state, _) in upstream.items()})
        if dependencies.release(alias, ids):
            _refresh(alias, jobs)
    if inline.enabled():
        inline.run_now([job for job in jobs if job.state == transitions.QUEUED])
    return jobs


def _upstream(alias: str, after: Sequence[int]) -> dict[int, tuple[str, int | None]]:
    """The jobs ``after``, in its order: (state, workflow), locked until the enqueue commits, so
    none records its end unseen by the new edges."""
    found: dict[int, tuple[str, int | None]] = {}
    for start in range(0, len(after), CHUNK):
        rows = Job.objects.using(alias).select_for_update().filter(pk__in=after[start : start + CHUNK])
        found.update((pk, (state, wf)) for pk, state, wf in rows.values_list("pk", "state", "workflow_id"))
    missing = [pk for pk in after if pk not in found]
    if missing:
        shown = ", ".join(f"#{pk}" for pk in missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise ValueError(f"after: no job {shown}; a job can only wait for jobs that exist")
    return {pk: found[pk] for pk in after}


def _workflow_of(alias: str, upstream: Mapping[int, tuple[str, int | None]]) -> int:
    for _, workflow in upstream.values():
        if workflow is not None:
            return workflow
    return int(Workflow.objects.using(alias).create().pk)


def _refresh(alias: str, jobs: list[Job]) -> None:
    """Bring the jobs' states up to date after the release moved some."""
    rows = Job.objects.using(alias).filter(pk__in=[j.pk for j in jobs])
    now = {
        pk: (state, due, error)
        for pk, state, due, error in rows.values_list("pk", "state", "run_after", "error")
    }
    for job in jobs:
        job.state, job.run_after, job.error = now.get(job.pk, (job.state, job.run_after, job.error))
