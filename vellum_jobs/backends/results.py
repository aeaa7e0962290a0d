"""A ``Job`` row seen as Django's ``TaskResult``, and the ``Task`` found again from its name.

A task's job is named after the task's module path, so any process can
import it back. Statuses map one to one, except that a cancelled job is
``FAILED``: Django's Tasks framework has no cancelled state, and a
cancelled task is one that was "unable to start". What a ``TaskResult``
reports per run (its worker, its start, the exception it raised) lives in
``Job.task_runs``; only the first ``attempts`` entries count, because a run
that vellum-jobs refunded (``Retry``, a hand-back at shutdown) is not an
attempt and its entry is overwritten by the next run. A run that raised
nothing but still failed (lost with its worker, past its timeout) is in
``errors`` too, from the job's attempt history.
"""

from __future__ import annotations

import traceback
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.utils import timezone
from django.utils.module_loading import import_string

from vellum_jobs.core import history

if TYPE_CHECKING:
    from vellum_jobs.core.models import Job

# The exception a run that raised nothing is listed under in ``TaskResult.errors``, by how it ended.
ENDINGS = {
    history.LOST: "vellum_jobs.exceptions.WorkerLost",
    history.TIMED_OUT: "vellum_jobs.exceptions.JobTimeout",
}

STATUSES = {
    "queued": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


def load_task(job: Job) -> Task[Any, Any]:
    """The ``Task`` that ``job`` runs, as it was enqueued (backend, queue, priority, run_after).

    Raises ``ImportError`` when its module no longer imports or no longer
    defines it, and Django's ``InvalidTaskBackend``/``InvalidTask`` when the
    ``TASKS`` setting no longer accepts it.
    """
    found = import_string(job.name)
    if not isinstance(found, Task):
        raise ImportError(f"{job.name!r} is a {type(found).__qualname__}, not a Django task")
    # A run_after later than the enqueue is a deferral (or a retry's backoff);
    # otherwise the task was not deferred.
    run_after = job.run_after if job.run_after > job.created_at else None
    return found.using(
        priority=job.priority, queue_name=job.queue, backend=job.task_backend, run_after=run_after
    )


def task_result(job: Job, task: Task[Any, Any]) -> TaskResult[Any, Any]:
    """``job`` as a ``TaskResult`` of ``task``."""
    runs = counted_runs(job)
    status = STATUSES[job.state]
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=str(job.pk),
        status=status,
        enqueued_at=job.created_at,
        started_at=_started_at(runs[0]) if runs else job.started_at,
        last_attempted_at=_started_at(runs[-1]) if runs else job.started_at,
        finished_at=job.finished_at,
        args=job.args,
        kwargs=job.kwargs,
        backend=job.task_backend,
        errors=errors(job, runs),
        worker_ids=[run["worker_id"] for run in runs],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        # TaskResult is frozen and keeps its return value private; Django's own
        # backends set it the same way.
        object.__setattr__(result, "_return_value", job.result)
    return result


def errors(job: Job, runs: list[dict[str, Any]]) -> list[TaskError]:
    """A ``TaskError`` per failed run: what it raised, or, for a run that raised nothing (its
    worker lost, its timeout passed), what its ``Job.attempt_errors`` entry says it ended as."""
    entries = {e.get("attempt"): e for e in job.attempt_errors if isinstance(e, dict)}
    found = []
    for attempt, run in enumerate(runs, start=1):
        entry = entries.get(attempt) or {}
        if "exception_class_path" in run:
            found.append(
                TaskError(exception_class_path=run["exception_class_path"], traceback=run["traceback"])
            )
        elif entry.get("outcome") in ENDINGS:
            found.append(
                TaskError(exception_class_path=ENDINGS[entry["outcome"]], traceback=entry["traceback"])
            )
    return found


def counted_runs(job: Job) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = job.task_runs[: job.attempts]
    return runs


def start_run(job: Job) -> list[dict[str, Any]]:
    """``job.task_runs`` with an entry for the run this worker just claimed."""
    started_at = job.started_at or timezone.now()
    runs = list(job.task_runs[: max(job.attempts - 1, 0)])
    runs.append({"worker_id": str(job.worker_id), "started_at": started_at.isoformat()})
    return runs


def fail_run(job: Job, exc: BaseException) -> list[dict[str, Any]]:
    """``job.task_runs`` with ``exc`` recorded on the current run, as Django's ``TaskError`` has it."""
    runs = list(job.task_runs)
    kind = type(exc)
    runs[-1] = {
        **runs[-1],
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        "traceback": "".join(traceback.format_exception(exc)),
    }
    return runs


def _started_at(run: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(run["started_at"])
