"""Running a task's job in a worker: resolving it by module path, its context, its signals.

The app installs its hooks on Django 6 (``VellumJobsConfig.ready``,
``hooks``), so a ``runjobs`` process runs tasks from modules it never
imported: the registry's resolver hook hands ``handler_run`` a function
that imports the task when it runs. A task whose module path does not import here, or whose
``TASKS`` alias this process lacks, is code this worker does not have yet
(a rolling deploy): the job goes back to the queue unstarted, for a worker
that has it, and fails only once no live worker has known it for
``UNKNOWN_NAME_TIMEOUT`` (``unknown_names``). Whatever else goes wrong in
loading the task (its module raises, the stored arguments do not fit)
fails the job at once with ``Fail``, the cause in its traceback, and is
recorded as the run's exception for ``TaskResult.errors``.

Retries are vellum-jobs' own (the Tasks framework has none): a task that
raises runs again with backoff until its ``max_attempts`` (the backend's
``MAX_ATTEMPTS``), and its ``TaskResult`` is ``READY`` in between. ``task_started`` is sent before
each run, ``task_finished`` once, when the task is ``SUCCESSFUL`` or
``FAILED``: for a task whose last run raised, from inside a handler of
that exception, so that Django's log line of the failed task carries its
traceback (its receiver reads ``sys.exc_info()``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError
from django.tasks import Task, TaskContext, task_backends
from django.tasks.signals import task_finished, task_started
from django.utils.module_loading import import_string

from vellum_jobs.backends.backend import send
from vellum_jobs.backends.results import fail_run, load_task, start_run, task_result
from vellum_jobs.conf import conf
from vellum_jobs.core import registry
from vellum_jobs.core.models import Job
from vellum_jobs.core.options import Options
from vellum_jobs.core.payload import normalise
from vellum_jobs.core.registry import Handler
from vellum_jobs.exceptions import Fail, Retry
from vellum_jobs.store.fence import update_if_held

logger = logging.getLogger("vellum_jobs")

# The claim loads only what every job needs; a task's own columns come with
# one more query, paid by tasks and by names nobody registered.
TASK_FIELDS = ["task_backend", "task_runs", "created_at", "finished_at"]


def resolve(job: Job) -> Handler[Any, Any] | None:
    """The function that runs ``job`` if it is a task, else None.

    ``Unresolvable`` if the task's code or its ``TASKS`` alias is not in this
    process (a worker of an older deploy): the job goes back to the queue
    for a worker that has them, not failed.
    """
    if job.get_deferred_fields() & set(TASK_FIELDS):
        job.refresh_from_db(fields=TASK_FIELDS)
    if not job.task_backend:
        return None
    missing = not_here(job)
    if missing:
        raise registry.Unresolvable(job.name, missing)
    return Handler(job.name, _runner(job), Options(backoff=_backoff(job.task_backend)))


def not_here(job: Job) -> str:
    """Why this process cannot run ``job``'s task (its alias or its code is missing), or "" if it can."""
    if job.task_backend not in conf.task_backends():
        return f"TASKS has no alias {job.task_backend!r} with vellum-jobs' backend here"
    try:
        found = import_string(job.name)
    except ImportError as exc:
        return f"the task does not import here: {exc}"
    except Exception:  # noqa: BLE001 - code that is here but broken: running it fails the task with the cause
        return ""
    if not isinstance(found, Task):
        return f"{job.name!r} is a {type(found).__qualname__} here, not a Django task"
    return ""


def _backoff(alias: str) -> float | None:
    # An alias that is gone fails the job when it runs; here it only loses its backoff.
    try:
        backend = task_backends[alias]
    except Exception:  # noqa: BLE001 - InvalidTaskBackend, or any error its constructor raises
        return None
    backoff = getattr(backend, "backoff", None)
    return backoff if isinstance(backoff, float) else None


def _runner(job: Job) -> Callable[..., Any]:
    # The claim said whether the task's function is an async def (recorded at
    # enqueue): the worker's event loop runs those, a thread the others.
    if job.is_async:

        async def arun_task(*args: Any, **kwargs: Any) -> Any:
            return await arun(job, args, kwargs)

        return arun_task

    def run_task(*args: Any, **kwargs: Any) -> Any:
        return run(job, args, kwargs)

    return run_task


def run(job: Job, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``job``'s task in this worker thread and return its JSON return value."""
    task, result = _begin(job, args, kwargs)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
    except Retry:
        raise  # not an error: the run is refunded and its entry replaced
    except BaseException as exc:
        _save_runs(job, fail_run(job, exc))
        raise
    return _returned(job, value)


async def arun(job: Job, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``run`` on the worker's event loop: the bookkeeping, ORM code, runs off the loop."""
    task, result = await sync_to_async(_begin)(job, args, kwargs)
    try:
        if task.takes_context:
            value = await task.acall(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = await task.acall(*args, **kwargs)
    except Retry:
        raise
    except BaseException as exc:  # a timeout's or a cancellation's CancelledError is this run's end too
        await sync_to_async(_save_runs)(job, fail_run(job, exc))
        raise
    return await sync_to_async(_returned)(job, value)


def _begin(job: Job, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Task[Any, Any], Any]:
    """Record the run's start, load the task and send ``task_started``; its task and ``TaskResult``."""
    _save_runs(job, start_run(job))
    try:
        task = load_task(job)
        _check_arguments(task, args, kwargs)
    except Exception as exc:  # whatever stops the task from loading ends it
        _save_runs(job, fail_run(job, exc))
        raise Fail(f"cannot run task {job.name!r}: {type(exc).__name__}: {exc}") from exc
    result = task_result(job, task)
    send(task_started, type(task.get_backend()), result)
    return task, result


def _returned(job: Job, value: Any) -> Any:
    """The task's return value as JSON; a value JSON cannot hold fails the task."""
    try:
        return normalise(value, "the return value")
    except TypeError as exc:
        # As in Django's ImmediateBackend: a return value JSON cannot hold fails the task.
        _save_runs(job, fail_run(job, exc))
        raise Fail(f"task {job.name!r} returned a value that is not JSON serializable: {exc}") from exc


def _check_arguments(task: Task[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    signature = inspect.signature(task.func)
    if task.takes_context:
        signature.bind(None, *args, **kwargs)
    else:
        signature.bind(*args, **kwargs)


def _save_runs(job: Job, runs: list[dict[str, Any]]) -> None:
    """Record ``runs`` while this worker holds the job; bookkeeping never fails the task."""
    job.task_runs = runs
    if job._attempt is None:  # not run by a worker: nothing holds it, nothing to fence
        return
    try:
        update_if_held(job, job._attempt.token, {"task_runs": runs})
    except DatabaseError as exc:
        logger.warning(
            "%s #%s: its task runs were not recorded; the task goes on job_id=%s error=%r",
            job.name,
            job.pk,
            job.pk,
            exc,
        )


def finish(sender: Any, job: Job, **kwargs: Any) -> None:
    """Send ``task_finished`` once a task's job is done or failed (not between its retries)."""
    # Read from __dict__: a deferred column is absent there (not a task as far
    # as the worker knew), and this runs for every job a worker finishes.
    if not job.__dict__.get("task_backend"):
        return
    if job.state not in (Job.State.DONE, Job.State.FAILED):
        return
    try:
        task = load_task(job)
    except Exception:  # noqa: BLE001 - a task that cannot be loaded has no TaskResult to report
        logger.debug(
            "%s #%s: task_finished not sent, as its task cannot be loaded here job_id=%s name=%s",
            job.name,
            job.pk,
            job.pk,
            job.name,
        )
        return
    backend, result = type(task.get_backend()), task_result(job, task)
    error = job._attempt.exception if job._attempt is not None and job.state == Job.State.FAILED else None
    if error is None:
        send(task_finished, backend, result)
        return
    # Django's receiver logs sys.exc_info() with a failed task's line, as its own
    # backends send the signal inside their exception handler: so is this one.
    try:
        raise error
    except BaseException:  # noqa: BLE001 - the task's exception, raised again only to be handled here
        send(task_finished, backend, result)
