"""Asking a worker to stop gracefully through its row, as the admin does, and what a worker does about it.

Someone (the admin's "Stop gracefully") sets ``Worker.stop_requested_at``
and ``stop_requested_by``; the worker's heartbeat, which writes the row
anyway, sees it at its next beat, and the process stops as on SIGTERM:
it claims nothing more, lets running jobs finish within ``--grace``, hands
back the rest and exits 0.

A process that ``runjobs --processes N`` started stops its whole set: it
sends its supervisor the SIGTERM a process manager would, and the
supervisor forwards it to every process and exits 0. A supervisor
restarts a process that exits on its own; stopping one would only restart
it. The supervisor's pid is in the environment (``SUPERVISOR``), taken out
so that the processes a handler starts do not inherit it, and checked
against the parent's: a supervisor that died is never mistaken for another
process.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterable

from django.db import DEFAULT_DB_ALIAS, router
from django.utils import timezone

from vellum_jobs.core.models import Worker

# In a child's environment: the pid of the supervisor that started it.
SUPERVISOR = "VELLUM_JOBS_SUPERVISOR"


def ask(worker_ids: Iterable[uuid.UUID], *, by: str, using: str | None = None) -> int:
    """Ask these workers to stop gracefully at their next heartbeat; how many had not been asked yet."""
    alias = using or router.db_for_write(Worker) or DEFAULT_DB_ALIAS
    rows = Worker.objects.using(alias).filter(pk__in=list(worker_ids), stop_requested_at=None)
    return rows.update(stop_requested_at=timezone.now(), stop_requested_by=by[:255])


def take_supervisor() -> int | None:
    """The pid of the supervisor that started this process, if one did (taken out of the environment)."""
    pid = os.environ.pop(SUPERVISOR, None)
    return int(pid) if pid and pid.isdigit() else None


def stop_supervisor(pid: int | None) -> bool:
    """Send SIGTERM to supervisor ``pid`` if it is still this process's parent; whether it was sent."""
    if pid is None or os.getppid() != pid:
        return False
    os.kill(pid, signal.SIGTERM)
    return True
