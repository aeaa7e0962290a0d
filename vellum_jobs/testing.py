"""Helpers for a project's tests: run jobs in the test's thread and transaction, assert what was enqueued.

They work in Django's ``TestCase`` (whose rows are never committed, so a
``runjobs`` process could not see them) as in pytest-django tests; the
``job_queue`` pytest fixture bundles them (see ``vellum_jobs.pytest_plugin``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from vellum_jobs.core import registry
from vellum_jobs.core.models import Job
from vellum_jobs.core.payload import normalise_call
from vellum_jobs.enqueueing.job_function import JobFunction
from vellum_jobs.exceptions import UnknownJob
from vellum_jobs.execution.inline import run_due, run_inline

__all__ = ["assert_enqueued", "enqueued_jobs", "run_inline", "run_jobs"]

JobName = str | JobFunction[Any, Any]


def run_jobs(
    *, queues: Sequence[str] = (), now: datetime | None = None, using: str | None = None
) -> list[Job]:
    """Run the due jobs (and those they enqueue) in this thread, inside the current transaction.

    Returns the jobs that ran, in order, each in the state its run left it.
    ``now`` decides which jobs are due: pass a later time to run delayed ones.
    """
    return run_due(queues=queues, now=now, using=using)


def enqueued_jobs(name: JobName | None = None, *, using: str | None = None) -> list[Job]:
    """The queued jobs (of ``name``, or all), oldest first."""
    rows = Job.objects.using(using).queued().order_by("id")
    if name is not None:
        rows = rows.filter(name=_name(name))
    return list(rows)


def assert_enqueued(name: JobName, /, **kwargs: Any) -> Job:
    """Assert that a job ``name`` is queued with these arguments; returns it.

    Arguments match however the job was called: ``scan.enqueue(3)`` matches
    ``assert_enqueued("scan", library_id=3)``. Arguments left out match anything.
    """
    name = _name(name)
    _, expected = normalise_call(name, (), kwargs)
    queued = enqueued_jobs(name)
    for job in queued:
        called = arguments(job)
        if all(key in called and called[key] == value for key, value in expected.items()):
            return job
    seen = "\n".join(f"  #{job.pk}: {arguments(job)}" for job in queued) or "  (none)"
    raise AssertionError(f"no queued {name!r} job with {expected}; queued {name!r} jobs:\n{seen}")


def arguments(job: Job) -> dict[str, Any]:
    """A job's stored arguments by parameter name (positional ones named by its function's signature)."""
    try:
        signature = registry.for_job(job).signature
        bound = signature.bind_partial(*job.args, **job.kwargs)
    except (UnknownJob, TypeError):
        return {**{str(i): value for i, value in enumerate(job.args)}, **job.kwargs}
    return dict(bound.arguments)


def _name(name: JobName) -> str:
    return name if isinstance(name, str) else name.name
