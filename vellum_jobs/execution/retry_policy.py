"""What an attempt that did not succeed becomes: queued again after a backoff, or failed once
``max_attempts`` are used; a timed-out attempt, and one whose lease was lost, likewise."""

from __future__ import annotations

import random
from datetime import timedelta

from vellum_jobs.conf import conf, parse_duration
from vellum_jobs.core import clock, history, registry, transitions
from vellum_jobs.core.models import Job
from vellum_jobs.exceptions import UnknownJob
from vellum_jobs.execution.outcome import Outcome, failed


def failed_attempt(job: Job, backoff: float | timedelta | None, error: str) -> Outcome:
    """A failed attempt: queued again after a backoff, or failed when attempts are used up."""
    if job.attempts >= job.max_attempts:
        return failed(error)
    base = conf.backoff_base if backoff is None else parse_duration(backoff)
    delay = retry_delay(job.attempts, base, conf.backoff_max)
    columns = {"run_after": clock.now() + timedelta(seconds=delay), "error": error}
    return Outcome(f"retry in {delay:.1f}s", transitions.RESCHEDULED_QUEUED, columns, history.FAILED)


def timed_out(job: Job, how: str = "") -> Outcome:
    """The outcome the worker records for an attempt that ran past its timeout; ``how`` the
    handler ended (by default it is still running)."""
    try:
        backoff = registry.get(job.name).options.backoff
    except UnknownJob:
        backoff = None
    how = how or "the handler was still running; whatever it returns later is discarded"
    error = f"timed out after {job.timeout:g}s: {how}"
    outcome = failed_attempt(job, backoff, error)
    outcome.label, outcome.ending = f"timed out, {outcome.label}", history.TIMED_OUT
    return outcome


def lease_lost(job: Job) -> Outcome:
    """The outcome of a handler that stopped early because its worker could not renew its lease.

    Recovery would soon find the lease lapsed and queue the job again, the
    run counted, or fail it when out of attempts: this is that outcome, for
    when the worker's write gets in first. Usually it does not (the lease
    lapsed, the fence refuses it), and recovery's stands.
    """
    error = (
        f"lease lost during attempt {job.attempts} of {job.max_attempts}: its worker could not renew "
        "the lease, and the handler stopped early when should_stop() told it"
    )
    if job.attempts >= job.max_attempts:
        return Outcome("lease lost, failed", transitions.FINISHED_FAILED, {"error": error}, history.LOST)
    columns = {"run_after": clock.now(), "error": error}
    return Outcome("lease lost, queued again", transitions.RESCHEDULED_QUEUED, columns, history.LOST)


def retry_delay(attempt: int, base: float, cap: float) -> float:
    """``base`` doubled for each attempt after the first, with +-20% jitter, at most ``cap``."""
    delay: float = base * 2.0 ** min(attempt - 1, 62)
    return min(delay * random.uniform(0.8, 1.2), cap)
