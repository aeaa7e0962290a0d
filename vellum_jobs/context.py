"""The job a worker thread is running: ``current_job()`` and ``set_progress()``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from django.db import DatabaseError

if TYPE_CHECKING:
    from vellum_jobs.models import Job

logger = logging.getLogger("vellum_jobs")

# Progress is for humans watching the admin: a write a second is plenty, and
# a handler calling set_progress in a tight loop must not hammer the database.
PROGRESS_INTERVAL = 1.0


class _Running(threading.local):
    job: Job | None = None
    token: int = 0
    progress_written_at: float = 0.0


_running = _Running()

# The range of the progress columns (64-bit signed integers on every database).
BIGINT = (-(2**63), 2**63 - 1)


@contextmanager
def running(job: Job, token: int) -> Iterator[None]:
    """Make ``job``, held by the claim ``token``, this thread's current job for the duration of the block."""
    # A job run inline from inside another (vellum_jobs.inline) hands the
    # outer job back when it ends.
    outer = _running.job, _running.token, _running.progress_written_at
    _running.job, _running.token, _running.progress_written_at = job, token, 0.0
    try:
        yield
    finally:
        _running.job, _running.token, _running.progress_written_at = outer


def current_job() -> Job | None:
    """The ``Job`` this thread is running, or None outside a job."""
    return _running.job


def set_progress(done: int, total: int | None = None, message: str = "") -> None:
    """Record progress on the running job (at most once a second).

    A value the progress columns cannot hold raises ``TypeError`` or
    ``ValueError`` here, and nothing is stored; a database hiccup is logged.
    """
    done, total, message = _checked(done, total, message)
    job = _running.job
    if job is None:
        logger.debug("set_progress called outside a job: ignored")
        return
    job.progress_done, job.progress_total, job.progress_message = done, total, message
    now = time.monotonic()
    finished = total is not None and done >= total
    if now - _running.progress_written_at < PROGRESS_INTERVAL and not finished:
        return
    _running.progress_written_at = now
    from vellum_jobs.fence import update_if_held

    progress = {"progress_done": done, "progress_total": total, "progress_message": message}
    try:
        update_if_held(job, _running.token, progress)
    except DatabaseError as exc:
        logger.warning("progress not recorded job_id=%s error=%r", job.pk, exc)


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
