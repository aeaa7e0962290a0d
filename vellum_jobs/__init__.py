"""vellum-jobs: a durable job queue in your Django project's own database.

This module is the public surface. It imports nothing that needs the app
registry, so ``from vellum_jobs import job`` works in any ``jobs.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vellum_jobs.enqueueing import job_function as _job_function  # private: not part of the public surface
from vellum_jobs.enqueueing.batches import batch
from vellum_jobs.enqueueing.canvas import chain, group, workflow
from vellum_jobs.enqueueing.job_function import job
from vellum_jobs.exceptions import Fail, JobTimeout, Retry, Throttled, UnknownJob
from vellum_jobs.execution.context import aset_progress, current_job, set_progress, upstream

if TYPE_CHECKING:
    from vellum_jobs.core.models import Job

__all__ = [
    "Fail",
    "JobTimeout",
    "Retry",
    "Throttled",
    "UnknownJob",
    "aenqueue",
    "aset_progress",
    "batch",
    "chain",
    "current_job",
    "enqueue",
    "group",
    "job",
    "set_progress",
    "upstream",
    "workflow",
]
__version__ = "0.1.0"


def enqueue(name: str, *args: Any, **kwargs: Any) -> Job:
    """Enqueue the job registered under ``name``; ``UnknownJob`` if there is none."""
    return _job_function.get(name).enqueue(*args, **kwargs)


async def aenqueue(name: str, *args: Any, **kwargs: Any) -> Job:
    """``enqueue`` for async code; the job commits on its own (see ``JobFunction.aenqueue``)."""
    return await _job_function.get(name).aenqueue(*args, **kwargs)
