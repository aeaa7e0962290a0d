"""Running one claimed job and recording its outcome with a fenced UPDATE.

Every write after the claim filters on the job's id, state ``running``, the
owning worker and the attempt number. A worker whose lease expired (the job
was requeued and maybe claimed again) updates nothing: its late outcome is
dropped with a warning instead of overwriting the new owner's.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db import connections
from django.dispatch import Signal
from django.utils import timezone

from vellum_jobs import cancellation, db, handlers, signals, transient
from vellum_jobs.conf import conf, parse_duration
from vellum_jobs.context import running
from vellum_jobs.exceptions import Fail, Retry, UnknownJob
from vellum_jobs.fence import update_all_if_held, update_if_held
from vellum_jobs.models import Job
from vellum_jobs.payload import encode_result

logger = logging.getLogger("vellum_jobs")


@dataclasses.dataclass
class Outcome:
    """What became of one attempt: the label for logs and the columns to write."""

    label: str
    changes: dict[str, Any]
    refund_attempt: bool = False
    applied: bool = False
    # The late outcome of an attempt already recorded as timed out: the fence
    # is expected to refuse it.
    late: bool = False
    duration: float = 0.0

    @property
    def state(self) -> str:
        return str(self.changes["state"])


def execute(job: Job, worker_id: uuid.UUID) -> Outcome:
    """Run ``job``'s handler, then record the outcome if this worker still owns the job."""
    outcome = run(job, worker_id)
    record_many(job._state.db or "default", worker_id, [(job, outcome)])
    return outcome


def run(job: Job, worker_id: uuid.UUID, shutdown: threading.Event | None = None) -> Outcome:
    """Run ``job``'s handler as ``worker_id`` and return the outcome, not yet recorded.

    ``shutdown`` is the worker's stop signal, which ``job.should_stop()`` reports,
    as it does a cancellation the heartbeat delivers.
    """
    started = time.monotonic()
    job._deadline = started + job.timeout if job.timeout else None
    job._stop = threading.Event()
    job._shutdown = shutdown
    if job._cancel is None:
        job._cancel = threading.Event()
    _send(signals.job_started, job)
    with running(job, worker_id):
        outcome = cancellation.settle(job, run_handler(job))
    outcome.duration = time.monotonic() - started
    return outcome


def _send(signal: Signal, job: Job) -> None:
    """Send a job signal; a failing receiver is logged, it does not fail the job or the worker."""
    for receiver, response in signal.send_robust(sender=Job, job=job):
        if isinstance(response, Exception):
            logger.error("signal receiver failed receiver=%r job_id=%s", receiver, job.pk, exc_info=response)


def report_lost(alias: str, recovered: Sequence[tuple[int, str]]) -> None:
    """Send ``job_finished`` for attempts the reaper ended because their worker was lost.

    ``recovered`` pairs a job id with the state the reaper left it in. A job
    that has left that state since (requeued and claimed again) is not
    reported: its next attempt's outcome is.
    """
    if not recovered or not signals.job_finished.has_listeners(Job):
        return
    states = dict(recovered)
    for job in Job.objects.using(alias).filter(pk__in=states):
        if job.state == states[job.pk]:
            _send(signals.job_finished, job)


def run_handler(job: Job) -> Outcome:
    """Call the job's function and turn whatever happens into an ``Outcome``."""
    try:
        function = handlers.for_job(job)
    except UnknownJob:
        return failed(f"no handler registered for {job.name!r}")
    # A resolver may read the database (a task's backend column is not
    # claimed); its trouble is this attempt's failure, never the worker's.
    except Exception:  # noqa: BLE001
        return failed_attempt(job, None, traceback.format_exc())
    problem = arguments_problem(function, job.args, job.kwargs)
    if problem:
        return failed(f"cannot call {job.name!r} with the stored arguments: {problem}")
    try:
        value = function.func(*job.args, **job.kwargs)
    except Retry as exc:
        return retry_later(exc.delay)
    except Fail as exc:
        return failed(f"failed by the handler: {exc.reason}\n\n{traceback.format_exc()}")
    # A handler's SystemExit or KeyboardInterrupt is its failure, not the worker's.
    except BaseException:  # noqa: BLE001
        return failed_attempt(job, function.options.backoff, traceback.format_exc())
    result, problem = encode_result(value)
    if problem:
        logger.warning("job result not stored job_id=%s name=%s reason=%r", job.pk, job.name, problem)
    return Outcome("done", {"state": Job.State.DONE, "result": result, "error": problem})


def arguments_problem(function: handlers.Handler[Any, Any], args: Any, kwargs: Any) -> str:
    """Why the stored arguments cannot be passed to the function, or "" if they can."""
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return f"args must be a JSON list and kwargs a JSON object, got {args!r} and {kwargs!r}"
    try:
        function.signature.bind(*args, **kwargs)
    except TypeError as exc:
        return f"{exc} (signature {function.name}{function.signature})"
    return ""


def failed(error: str) -> Outcome:
    return Outcome("failed", {"state": Job.State.FAILED, "error": error})


def retry_later(delay: float) -> Outcome:
    changes = {"state": Job.State.QUEUED, "run_after": timezone.now() + timedelta(seconds=delay)}
    return Outcome(f"retry requested in {delay:.1f}s", changes, refund_attempt=True)


def failed_attempt(job: Job, backoff: float | timedelta | None, error: str) -> Outcome:
    """A failed attempt: queued again after a backoff, or failed when attempts are used up."""
    if job.attempts >= job.max_attempts:
        return failed(error)
    base = conf.backoff_base if backoff is None else parse_duration(backoff)
    delay = retry_delay(job.attempts, base, conf.backoff_max)
    changes = {
        "state": Job.State.QUEUED,
        "run_after": timezone.now() + timedelta(seconds=delay),
        "error": error,
    }
    return Outcome(f"retry in {delay:.1f}s", changes)


def timed_out(job: Job) -> Outcome:
    """The outcome the worker records for an attempt that ran past its timeout."""
    try:
        backoff = handlers.get(job.name).options.backoff
    except UnknownJob:
        backoff = None
    error = (
        f"timed out after {job.timeout:g}s: the handler was still running; "
        "whatever it returns later is discarded"
    )
    outcome = failed_attempt(job, backoff, error)
    outcome.label = f"timed out, {outcome.label}"
    return outcome


def retry_delay(attempt: int, base: float, cap: float) -> float:
    """``base`` doubled for each attempt after the first, with +-20% jitter, at most ``cap``."""
    delay: float = base * 2.0 ** min(attempt - 1, 62)
    return min(delay * random.uniform(0.8, 1.2), cap)


def record_many(alias: str, worker_id: uuid.UUID, finished: list[tuple[Job, Outcome]]) -> None:
    """Write each outcome whose job this worker still holds, all in one transaction."""
    outcomes = Outcomes(worker_id, finished)

    def write() -> None:
        with db.short_transaction(connections[alias]):
            outcomes.write()

    # Past the lease the reaper may have handed the jobs to someone else;
    # retrying longer is pointless, the fence would refuse the writes anyway.
    transient.retry(write, what=f"record {len(finished)} outcome(s)", alias=alias, give_up_after=conf.lease)
    outcomes.settle()


class Outcomes:
    """Outcomes of finished handlers, written together: ``write()`` in the caller's
    transaction, then ``settle()`` once it committed.

    One commit for many outcomes is what lets a worker finish thousands of
    short jobs a second; each write is still its own fenced UPDATE.
    """

    def __init__(self, worker_id: uuid.UUID, finished: list[tuple[Job, Outcome]]) -> None:
        self.worker_id = worker_id
        # In id order: the heartbeat renews leases in that order too, so the
        # two never wait on each other's row locks in a cycle (a deadlock).
        ordered = sorted(finished, key=lambda pair: pair[0].pk)
        self.writes = [(job, outcome, _columns(job, outcome)) for job, outcome in ordered]

    def __len__(self) -> int:
        return len(self.writes)

    def write(self) -> None:
        for group in self._groups():
            job, outcome, columns = group[0]
            if len(group) == 1:
                outcome.applied = update_if_held(
                    job, self.worker_id, columns, refund_attempt=outcome.refund_attempt
                )
                continue
            applied = update_all_if_held(
                [job for job, _, _ in group],
                self.worker_id,
                [columns for _, _, columns in group],
                refund_attempt=outcome.refund_attempt,
            )
            for job, outcome, _ in group:
                outcome.applied = job.pk in applied

    def _groups(self) -> list[list[tuple[Job, Outcome, dict[str, Any]]]]:
        """The writes that can share one statement (same columns), each group in id order.

        On MySQL every write is its own group: an UPDATE there cannot say
        which rows it changed, and its row locks must come in id order.
        """
        if not self.writes or connections[self.writes[0][0]._state.db or "default"].vendor == "mysql":
            return [[write] for write in self.writes]
        groups: dict[tuple[Any, ...], list[tuple[Job, Outcome, dict[str, Any]]]] = {}
        for write in self.writes:
            _, outcome, columns = write
            groups.setdefault((tuple(columns), outcome.refund_attempt), []).append(write)
        return list(groups.values())

    def settle(self) -> None:
        """Bring the jobs in memory up to date and send ``job_finished`` for those written."""
        for job, outcome, columns in self.writes:
            if not outcome.applied:
                log = logger.info if outcome.late else logger.warning
                log(
                    "stale outcome discarded: job no longer held by this worker "
                    "job_id=%s name=%s attempt=%d outcome=%s",
                    job.pk,
                    job.name,
                    job.attempts,
                    outcome.label,
                )
                continue
            for field, value in columns.items():
                setattr(job, field, value)
            if outcome.refund_attempt:
                job.attempts -= 1
            _send(signals.job_finished, job)


def _columns(job: Job, outcome: Outcome) -> dict[str, Any]:
    """Every column the outcome writes, the lease release included."""
    columns = dict(outcome.changes)
    columns["lease_expires_at"] = None
    if outcome.state == Job.State.QUEUED:
        columns["worker_id"] = None
    else:
        columns["finished_at"] = timezone.now()
    if job.progress_done is not None:
        columns.update(
            progress_done=job.progress_done,
            progress_total=job.progress_total,
            progress_message=job.progress_message,
        )
    return columns
