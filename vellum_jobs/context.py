"""The job a worker thread is running: ``current_job()`` and ``set_progress()``."""

from __future__ import annotations

import logging
import threading
import time
import uuid
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
    worker_id: uuid.UUID | None = None
    progress_written_at: float = 0.0


_running = _Running()


@contextmanager
def running(job: Job, worker_id: uuid.UUID) -> Iterator[None]:
    """Make ``job`` this thread's current job for the duration of the block."""
    # A job run inline from inside another (vellum_jobs.inline) hands the
    # outer job back when it ends.
    outer = _running.job, _running.worker_id, _running.progress_written_at
    _running.job, _running.worker_id, _running.progress_written_at = job, worker_id, 0.0
    try:
        yield
    finally:
        _running.job, _running.worker_id, _running.progress_written_at = outer


def current_job() -> Job | None:
    """The ``Job`` this thread is running, or None outside a job."""
    return _running.job


def set_progress(done: int, total: int | None = None, message: str = "") -> None:
    """Record progress on the running job (at most once a second; never raises)."""
    job, worker_id = _running.job, _running.worker_id
    if job is None or worker_id is None:
        logger.debug("set_progress called outside a job: ignored")
        return
    job.progress_done, job.progress_total = int(done), total
    job.progress_message = str(message)[:255]
    now = time.monotonic()
    finished = total is not None and done >= total
    if now - _running.progress_written_at < PROGRESS_INTERVAL and not finished:
        return
    _running.progress_written_at = now
    from vellum_jobs.fence import update_if_held

    progress = {
        "progress_done": job.progress_done,
        "progress_total": job.progress_total,
        "progress_message": job.progress_message,
    }
    try:
        update_if_held(job, worker_id, progress)
    except (DatabaseError, ValueError, TypeError) as exc:
        logger.warning("progress not recorded job_id=%s error=%r", job.pk, exc)
