"""Workflows written straight with the ORM, for the tests of what reads them (the admin, explain)."""

from __future__ import annotations

from collections.abc import Sequence

from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Dependency, Workflow


def workflow(kind: str = Workflow.Kind.WORKFLOW, name: str = "") -> Workflow:
    return Workflow.objects.create(kind=kind, name=name)


def step(
    of: Workflow | None,
    name: str = "test.add",
    state: str = Job.State.QUEUED,
    after: Sequence[Job] = (),
    run_if: str = "done",
    **fields: object,
) -> Job:
    """A job of ``of`` that waits for ``after`` (in that order); each edge records its upstream job's
    state if that job has ended."""
    job = Job.objects.create(name=name, state=state, workflow=of, run_if=run_if if after else "", **fields)
    for position, upstream in enumerate(after):
        ended = upstream.state if upstream.state in Job.FINISHED_STATES else ""
        Dependency.objects.create(job=job, upstream=upstream, position=position, upstream_state=ended)
    return job


def chain(of: Workflow, n: int, state: str = Job.State.DONE) -> list[Job]:
    """``n`` jobs of ``of``, each waiting for the one before."""
    jobs: list[Job] = []
    for i in range(n):
        jobs.append(step(of, f"step.{i}", state, after=jobs[-1:]))
    return jobs


def batch_of(of: Workflow, n: int, state: str = Job.State.DONE) -> list[Job]:
    """``n`` jobs of ``of`` that wait for nothing, written in one statement."""
    return Job.objects.bulk_create([Job(name="scan", state=state, workflow=of) for _ in range(n)])
