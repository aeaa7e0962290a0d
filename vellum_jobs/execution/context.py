"""The job a worker thread or coroutine is running: ``current_job()``, ``set_progress()`` and its async twin.

The running job is a ``contextvars`` value: each thread starts with a
context of its own, and each coroutine job's task with a copy of the loop's,
so a slot thread and a hundred coroutine jobs on one event loop each see
their own job.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError

if TYPE_CHECKING:
    from vellum_jobs.core.models import Job
    from vellum_jobs.core.upstream import Upstream

logger = logging.getLogger("vellum_jobs")

# Progress is for humans watching the admin: a write a second is plenty, and
# a handler calling set_progress in a tight loop must not hammer the database.
PROGRESS_INTERVAL = 1.0


@dataclasses.dataclass
class _Running:
    job: Job
    token: int
    progress_written_at: float = 0.0


_running: contextvars.ContextVar[_Running | None] = contextvars.ContextVar("vellum_running", default=None)
# Progress writes a coroutine job's set_progress() started and nobody awaits (kept from the collector).
_pending_writes: set[asyncio.Future[Any]] = set()

# The range of the progress columns (64-bit signed integers on every database).
BIGINT = (-(2**63), 2**63 - 1)


@contextmanager
def running(job: Job, token: int) -> Iterator[None]:
    """Make ``job``, held by the claim ``token``, the current job for the duration of the block."""
    # A job run inline from inside another (vellum_jobs.execution.inline) hands the
    # outer job back when it ends.
    reset = _running.set(_Running(job, token))
    try:
        yield
    finally:
        _running.reset(reset)


def current_job() -> Job | None:
    """The ``Job`` this thread or coroutine is running, or None outside a job."""
    state = _running.get()
    return None if state is None else state.job


def upstream() -> list[Upstream]:
    """The jobs the running job waited for (``after=``, a chain's or group's earlier steps, a
    batch's jobs for its callback), in order, with how each ended; [] outside a job."""
    from vellum_jobs.core import (
        upstream as upstream_jobs,  # reads the models: not at import (see vellum_jobs)
    )

    job = current_job()
    return [] if job is None else upstream_jobs.upstream_of(job)


def set_progress(done: int, total: int | None = None, message: str = "") -> None:
    """Record progress on the running job (at most once a second).

    A value the progress columns cannot hold raises ``TypeError`` or
    ``ValueError`` here, and nothing is stored; a database hiccup is logged.
    In a coroutine job the write is handed to Django's thread for sync code
    and not waited for (``aset_progress`` waits for it).
    """
    write = _progress(done, total, message)
    if write is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        write()
        return
    future = asyncio.ensure_future(sync_to_async(write)(), loop=loop)
    _pending_writes.add(future)
    future.add_done_callback(_pending_writes.discard)


async def aset_progress(done: int, total: int | None = None, message: str = "") -> None:
    """``set_progress`` for coroutine jobs: awaits the write, which runs off the event loop."""
    write = _progress(done, total, message)
    if write is not None:
        await sync_to_async(write)()


def _progress(done: int, total: int | None, message: str) -> Any:
    """Note the progress on the running job; the write to run now, or None (outside a job, or too soon)."""
    done, total, message = _checked(done, total, message)
    state = _running.get()
    if state is None:
        logger.debug("set_progress() called outside a job: ignored")
        return None
    job = state.job
    job.progress_done, job.progress_total, job.progress_message = done, total, message
    now = time.monotonic()
    finished = total is not None and done >= total
    if now - state.progress_written_at < PROGRESS_INTERVAL and not finished:
        return None
    state.progress_written_at = now
    progress = {"progress_done": done, "progress_total": total, "progress_message": message}
    token = state.token

    def write() -> None:
        # `from vellum_jobs import set_progress` comes before the models can load; the fence needs them.
        from vellum_jobs.store.fence import update_if_held

        try:
            update_if_held(job, token, progress)
        except DatabaseError as exc:
            logger.warning(
                "%s #%s: progress not recorded; the job goes on job_id=%s error=%r",
                job.name,
                job.pk,
                job.pk,
                exc,
            )

    return write


def _checked(done: object, total: object, message: object) -> tuple[int, int | None, str]:
    """The progress values as the columns store them, or the error that says why they cannot be."""
    for name, value in (("done", done), ("total", total)):
        if value is None and name == "total":
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"set_progress: {name} must be an integer, got {type(value).__qualname__}")
        if not BIGINT[0] <= value <= BIGINT[1]:
            raise ValueError(f"set_progress: {name}={value} does not fit in a 64-bit integer")
    if not isinstance(message, str):
        raise TypeError(f"set_progress: message must be a string, got {type(message).__qualname__}")
    if "\x00" in message:
        raise ValueError("set_progress: message must not contain the NUL character")
    assert isinstance(done, int)
    return done, total if isinstance(total, int) else None, message[:255]
