"""Cancelling a running job: telling its handler, and what its outcome becomes.

``Job.cancel()`` on a running job only records ``cancel_requested_at``: a
thread cannot be stopped from outside. The worker's heartbeat reads the
requests for the jobs it holds (one query per beat, none per job) and sets
each job's flag, which ``should_stop()`` reports. A handler that saw it and
returns or raises ends ``cancelled``; one that never looked finishes as it
would have, with the request noted in ``error``. Either way a job whose
cancellation was requested is never queued again.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from vellum_jobs.models import Job

if TYPE_CHECKING:
    from vellum_jobs.executor import Outcome


def requested(alias: str, job_ids: Collection[int]) -> dict[int, object]:
    """Of ``job_ids``, the running jobs someone asked to stop, with when they asked."""
    if not job_ids:
        return {}
    rows = Job.objects.using(alias).running().filter(pk__in=job_ids).exclude(cancel_requested_at=None)
    return dict(rows.values_list("pk", "cancel_requested_at"))


def deliver(jobs: Iterable[Job], requests: dict[int, object]) -> list[Job]:
    """Set the cancel flag of each of ``jobs`` that was asked to stop; returns those newly told."""
    told = []
    for job in jobs:
        if job.pk not in requests or (job._cancel is not None and job._cancel.is_set()):
            continue
        job.cancel_requested_at = requests[job.pk]  # type: ignore[assignment]
        if job._cancel is None:
            job._cancel = threading.Event()
        job._cancel.set()
        told.append(job)
    return told


def settle(job: Job, outcome: Outcome) -> Outcome:
    """The outcome to record for an attempt, given any cancellation request."""
    delivered = job._cancel is not None and job._cancel.is_set()
    if not delivered:
        if outcome.state != Job.State.QUEUED or not _requested_now(job):
            return outcome
        # Asked to stop after the last heartbeat: do not run it again either.
        return _cancelled(
            outcome, "cancelled: a cancellation was requested while it ran; it will not be retried"
        )
    when = f"at {job.cancel_requested_at:%Y-%m-%d %H:%M:%S}" if job.cancel_requested_at else ""
    if job._cancel_seen:
        return _cancelled(outcome, f"cancelled while running: requested {when}; the handler stopped")
    note = f"cancellation requested {when} while running; the handler did not check should_stop()"
    if outcome.state == Job.State.QUEUED:
        return _cancelled(outcome, f"{note}; not retried")
    error = outcome.changes.get("error") or ""
    outcome.changes["error"] = f"{note} and finished ({outcome.label})" + (f"\n\n{error}" if error else "")
    outcome.label = f"{outcome.label} (cancellation ignored)"
    return outcome


def _cancelled(outcome: Outcome, reason: str) -> Outcome:
    changes = {"state": Job.State.CANCELLED, "error": _with(reason, outcome.changes.get("error"))}
    if "result" in outcome.changes:
        changes["result"] = outcome.changes["result"]
    outcome.label, outcome.changes, outcome.refund_attempt = "cancelled", changes, False
    return outcome


def _with(reason: str, error: object) -> str:
    return f"{reason}\n\n{error}" if error else reason


def _requested_now(job: Job) -> bool:
    """One query, only for an attempt that would be queued again (a failure, not the hot path)."""
    return (
        Job.objects.using(job._state.db or "default")
        .filter(pk=job.pk)
        .exclude(cancel_requested_at=None)
        .exists()
    )
