"""What the app installs for the Tasks backend: a resolver of tasks' jobs and the ``task_finished`` receiver.

They import ``execution`` (and with it ``django.tasks``) when a job turns
out to be a task: a worker whose jobs are all ``@job`` functions never
loads the backend's modules.
"""

from __future__ import annotations

from typing import Any

from vellum_jobs import signals
from vellum_jobs.core import registry
from vellum_jobs.core.models import Job
from vellum_jobs.core.registry import Handler


def install() -> None:
    registry.add_resolver(resolve)
    signals.job_finished.connect(finish, sender=Job, dispatch_uid="vellum_jobs.backends.finish")


def resolve(job: Job) -> Handler[Any, Any] | None:
    """``execution.resolve``: asked only for a job whose name no ``@job`` registered."""
    from vellum_jobs.backends import execution

    return execution.resolve(job)


def finish(sender: Any, job: Job, **kwargs: Any) -> None:
    """``execution.finish`` for a task's job; it runs for every job a worker finishes."""
    # As execution.finish reads it: a deferred column is absent from __dict__.
    if not job.__dict__.get("task_backend"):
        return
    from vellum_jobs.backends import execution

    execution.finish(sender, job, **kwargs)
