"""Django tasks the tests enqueue through ``VellumTaskBackend`` (Django 6 only).

Nothing imports this module at startup: a worker finds these tasks by
their module path.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.dispatch import receiver
from django.tasks import TaskContext, TaskResult, task
from django.tasks.signals import task_finished, task_started

from tests.testapp.models import Execution
from vellum_jobs import Retry, set_progress


class TaskBoom(Exception):
    pass


def _record(context: TaskContext[Any, Any], note: str = "") -> None:
    result = context.task_result
    Execution.objects.create(
        job_id=int(result.id),
        attempt=context.attempt,
        pid=os.getpid(),
        note=note or ",".join(result.worker_ids),
    )


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails", priority=10)
def send_mail(to: str) -> str:
    return f"sent to {to}"


@task(takes_context=True)
def record(context: TaskContext[Any, Any], label: str) -> str:
    _record(context, label)
    return label


@task(takes_context=True)
def flaky(context: TaskContext[Any, Any], succeed_on: int) -> int:
    """Raises until its attempt number reaches ``succeed_on``."""
    _record(context)
    if context.attempt < succeed_on:
        raise TaskBoom(f"attempt {context.attempt} fails")
    return context.attempt


@task(takes_context=True)
def retries_once(context: TaskContext[Any, Any]) -> int:
    """Raises vellum-jobs' ``Retry`` on its first run, a run that does not count as an attempt."""
    first = not Execution.objects.filter(job_id=int(context.task_result.id)).exists()
    _record(context)
    if first:
        raise Retry(0)
    return context.attempt


@task
def always_fails() -> None:
    raise TaskBoom("always")


@task
async def async_always_fails() -> None:
    await asyncio.sleep(0)
    raise TaskBoom("always")


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True)
async def async_where(context: TaskContext[Any, Any], seconds: float = 0.0) -> dict[str, object]:
    """Where it ran: the thread (the worker's event loop) and how many of it ran at once."""
    await sync_to_async(_record)(context)
    await asyncio.sleep(seconds)
    return {"thread": threading.current_thread().name, "attempt": context.attempt}


@task(takes_context=True)
def wait_for_file(context: TaskContext[Any, Any], path: str, timeout: float = 20) -> str:
    _record(context)
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.02)
    return "released"


@task
def returns_a_set() -> object:
    return {1, 2}


@task
def reports_progress(total: int) -> int:
    for i in range(1, total + 1):
        set_progress(i, total, f"step {i}")
    return total


def _not_under_its_own_name() -> None:
    pass


# A task a worker cannot find again: its module path names the plain function.
renamed = task(_not_under_its_own_name)


if os.environ.get("VELLUM_TEST_RECORD_TASK_SIGNALS"):
    # A runjobs process started by a test records the task signals it sends,
    # so the test can see them fire in the worker process.

    @receiver(task_started)
    @receiver(task_finished)
    def _record_signal(
        sender: object, task_result: TaskResult[Any, Any], signal: object, **kwargs: Any
    ) -> None:
        name = "started" if signal is task_started else "finished"
        Execution.objects.create(
            job_id=int(task_result.id),
            attempt=task_result.attempts,
            pid=os.getpid(),
            note=f"{name}:{task_result.status}",
        )
