"""The release duty: waiting jobs the eager release missed, released within a few seconds.

The worker that records a workflow step's end releases the jobs waiting for
it as soon as the end commits (``vellum_jobs.core.dependencies``). Some ends
come another way: recovery fails a job whose worker died, an operator
cancels one, a worker of an older version records one without its edges, a
process dies between its commit and its release. Whichever process takes
the maintenance lock at its heartbeat, once per ``INTERVAL``, looks at the
waiting jobs and finishes what they missed.

The cost: one scan of the waiting jobs' unended edges, and an index probe per
waiting job, once per ``INTERVAL`` by one process.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from vellum_jobs.core import dependencies
from vellum_jobs.store import lock_waits, locks, transient_errors

LOCK = "releases"
INTERVAL = timedelta(seconds=5)

_turns = locks.Turns(LOCK, INTERVAL)


def run_if_due(alias: str, holder: uuid.UUID | str, now: datetime) -> int | None:
    """Release what the eager path missed if it is this process's turn; how many jobs moved, or
    None if it did not look. Never raises: a failure is logged and tried again next interval."""
    try:
        if not _turns.take(alias, holder, now):
            return None
        with lock_waits.bounded(alias):
            return dependencies.sweep(alias)
    except Exception as exc:  # noqa: BLE001 - the duty must never stop the heartbeat that runs it
        transient_errors.log_failure("release duty failed; trying again next interval holder=%s", exc, holder)
        transient_errors.reset_connection(alias)
        return None
