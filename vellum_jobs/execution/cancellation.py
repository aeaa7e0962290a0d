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

from collections.abc import Collection, Iterable

from vellum_jobs.core import history, transitions
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Job
from vellum_jobs.execution.outcome import Outcome


def requested(alias: str, job_ids: Collection[int]) -> dict[int, object]:
    """Of ``job_ids``, the running jobs someone asked to stop, with when they asked."""
    if not job_ids:
        return {}
    rows = Job.objects.using(alias).running().filter(pk__in=job_ids).exclude(cancel_requested_at=None)
    return dict(rows.values_list("pk", "cancel_requested_at"))


def deliver(attempts: Iterable[Attempt], requests: dict[int, object]) -> list[Attempt]:
    """Set the cancel flag of each attempt whose job was asked to stop; returns those newly told."""
    told = []
    for attempt in attempts:
        if attempt.job.pk not in requests or attempt.cancel.is_set():
            continue
        attempt.job.cancel_requested_at = requests[attempt.job.pk]  # type: ignore[assignment]
        attempt.cancel.set()
        told.append(attempt)
    return told


def settle(attempt: Attempt, outcome: Outcome) -> Outcome:
    """The outcome to record for an attempt, given a cancellation request its worker delivered.

    A request the worker had not delivered yet is still honoured: the write
    of a retry requires that nobody asked (``transitions.outcome``).
    """
    if not attempt.cancel.is_set():
        return outcome
    requested_at = attempt.job.cancel_requested_at
    when = f"at {requested_at:%Y-%m-%d %H:%M:%S}" if requested_at else ""
    if attempt.cancel_seen:
        return _cancelled(outcome, f"cancelled while running: requested {when}; the handler stopped")
    note = f"cancellation requested {when} while running; the handler did not check should_stop()"
    if outcome.step.transition is transitions.RESCHEDULED:
        return _cancelled(outcome, f"{note}; not retried")
    error = outcome.columns.get("error") or ""
    outcome.columns["error"] = f"{note} and finished ({outcome.label})" + (f"\n\n{error}" if error else "")
    outcome.label = f"{outcome.label} (cancellation ignored)"
    return outcome


def _cancelled(outcome: Outcome, reason: str) -> Outcome:
    columns = {"error": _with(reason, outcome.columns.get("error"))}
    if "result" in outcome.columns:
        columns["result"] = outcome.columns["result"]
    outcome.become(Outcome("cancelled", transitions.FINISHED_CANCELLED, columns, history.CANCELLED))
    return outcome


def _with(reason: str, error: object) -> str:
    return f"{reason}\n\n{error}" if error else reason
