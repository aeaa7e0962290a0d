"""``VellumTaskBackend``: Django's ``@task`` enqueued as vellum-jobs ``Job`` rows.

The backend is created when the first ``@task`` is decorated, which can be
while apps are still loading, so models are imported inside the methods
that use them. Running the tasks is the worker's side (``execution``).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from django.apps import apps
from django.core import checks
from django.tasks import Task, TaskResult
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.module_loading import import_string

from vellum_jobs.backends.results import load_task, task_result
from vellum_jobs.conf import parse_duration
from vellum_jobs.core import registry
from vellum_jobs.core.options import Options
from vellum_jobs.core.registry import Handler

logger = logging.getLogger("vellum_jobs")

OPTIONS = ("MAX_ATTEMPTS", "BACKOFF_BASE")

# Job.name and Job.queue column sizes.
MAX_PATH, MAX_QUEUE = 200, 100

# A Job id: a positive bigint, written in plain digits.
_RESULT_ID = re.compile(r"[1-9][0-9]{0,18}")
MAX_ID = 2**63 - 1


class VellumTaskBackend(BaseTaskBackend):
    """Stores each enqueued task as a ``Job`` that ``manage.py runjobs`` runs.

    ``OPTIONS``: ``MAX_ATTEMPTS`` (runs before a raising task is ``FAILED``;
    default ``VELLUM_JOBS["MAX_ATTEMPTS"]``) and ``BACKOFF_BASE`` (the first
    retry delay, doubled per attempt; default ``VELLUM_JOBS["BACKOFF_BASE"]``).
    """

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        problems = option_problems(self.options)
        if problems:
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']: {'; '.join(problems)}")

    @property
    def max_attempts(self) -> int | None:
        value = self.options.get("MAX_ATTEMPTS")
        return None if value is None else int(value)

    @property
    def backoff(self) -> float | None:
        value = self.options.get("BACKOFF_BASE")
        return None if value is None else parse_duration(value)

    def validate_task(self, task: Task[..., Any]) -> None:
        super().validate_task(task)
        if len(task.module_path) > MAX_PATH:
            raise InvalidTask(
                f"the task's module path {task.module_path!r} is longer than {MAX_PATH} characters, "
                "the size of a job name"
            )
        if not task.queue_name or len(task.queue_name) > MAX_QUEUE:
            raise InvalidTask(f"queue_name must be 1 to {MAX_QUEUE} characters, got {task.queue_name!r}")

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """Insert the task's ``Job`` in the current transaction; returns its ``READY`` result."""
        from vellum_jobs.enqueueing.rows import enqueue_calls

        self.validate_task(task)
        check_importable(task)
        function = Handler(
            task.module_path,
            task.func,
            Options(
                queue=task.queue_name,
                priority=task.priority,
                max_attempts=self.max_attempts,
                run_after=task.run_after,
            ),
        )
        (job,) = enqueue_calls(function, [(args, kwargs)], columns={"task_backend": self.alias})
        result = task_result(job, task)
        send(task_enqueued, type(self), result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """The result of the task whose ``Job`` id is ``result_id``; ``TaskResultDoesNotExist`` if none.

        Raises ``ImportError`` if the task's module no longer imports here.
        """
        from vellum_jobs.core.models import Job

        text = str(result_id)
        if not _RESULT_ID.fullmatch(text) or int(text) > MAX_ID:
            raise TaskResultDoesNotExist(result_id)
        try:
            job = Job.objects.exclude(task_backend="").get(pk=int(text))
        except Job.DoesNotExist:
            raise TaskResultDoesNotExist(result_id) from None
        try:
            task = load_task(job)
        except ImportError as exc:
            raise ImportError(f"the task of result {text} ({job.name!r}) cannot be imported: {exc}") from exc
        return task_result(job, task)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        errors: list[checks.CheckMessage] = []
        if not apps.is_installed("vellum_jobs"):
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses VellumTaskBackend, but vellum_jobs is not in INSTALLED_APPS",
                    hint="add 'vellum_jobs' to INSTALLED_APPS (its Job table holds the tasks)",
                    id="vellum_jobs.E008",
                )
            )
        return errors


def option_problems(options: dict[str, Any]) -> list[str]:
    """What is wrong with a backend's ``OPTIONS``, one sentence each."""
    problems = [
        f"unknown key {key!r} (known: {', '.join(OPTIONS)})" for key in sorted(set(options) - set(OPTIONS))
    ]
    attempts = options.get("MAX_ATTEMPTS")
    if attempts is not None and (not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1):
        problems.append(f"MAX_ATTEMPTS is {attempts!r}; it must be an integer >= 1")
    if options.get("BACKOFF_BASE") is not None:
        try:
            parse_duration(options["BACKOFF_BASE"])
        except ValueError as exc:
            problems.append(f"BACKOFF_BASE is invalid: {exc}")
    return problems


def check_importable(task: Task[Any, Any]) -> None:
    """Refuse a task that a worker could not find again by its module path."""
    path = task.module_path
    if task.func.__module__ == "__main__":
        raise InvalidTask(f"task {path!r} is defined in __main__, which a worker cannot import")
    try:
        found = import_string(path)
    except ImportError:
        found = None
    if not isinstance(found, Task) or found.func is not task.func:
        raise InvalidTask(
            f"a worker finds a task by its module path, and {path!r} is not this task: "
            "define it with @task at module level, under its function's own name"
        )
    try:
        registry.get(path)
    except LookupError:
        return
    raise InvalidTask(f"{path!r} is also the name of a @job, which a worker would run instead")


def send(signal: Any, sender: type[BaseTaskBackend], result: TaskResult[Any, Any]) -> None:
    """Send a ``django.tasks`` signal; a failing receiver is logged, never the caller's failure."""
    for receiver, response in signal.send_robust(sender=sender, task_result=result):
        if isinstance(response, Exception):
            logger.error(
                "task signal receiver raised; the task's outcome stands receiver=%r task_id=%s",
                receiver,
                result.id,
                exc_info=response,
            )
