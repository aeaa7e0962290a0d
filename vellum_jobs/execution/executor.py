"""Running one attempt of a claimed job and recording its outcome with a fenced UPDATE.

Every write after the claim is fenced on the claim's token (see
``transitions``). A worker whose lease expired (the job was requeued and
maybe claimed again) updates nothing: its late outcome is dropped with a
warning instead of overwriting the new owner's. An outcome the database
refuses (a number past 64 bits, a NUL character, an oversized value) ends
its own job ``failed`` with the reason and touches no other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import async_to_sync, sync_to_async
from django.db import connections
from django.dispatch import Signal

from vellum_jobs import signals
from vellum_jobs.conf import conf, parse_duration
from vellum_jobs.core import clock, handlers, history, transitions
from vellum_jobs.core.attempts import LEASE_LOST, SHUTTING_DOWN, TIMED_OUT, Attempt
from vellum_jobs.core.models import Job
from vellum_jobs.core.payload import bounded_error, encode_result
from vellum_jobs.core.transitions import FINISHED_DONE
from vellum_jobs.exceptions import Fail, Retry, UnknownJob
from vellum_jobs.execution import cancellation, tracing
from vellum_jobs.execution.context import running
from vellum_jobs.store import fence, putback, rollup, sql, transactions, transient_errors
from vellum_jobs.store.fence import update_all_if_held, update_if_held

if TYPE_CHECKING:
    from opentelemetry.trace import Span

T = TypeVar("T")

logger = logging.getLogger("vellum_jobs")


@dataclasses.dataclass
class Outcome:
    """What became of one attempt: the label for logs, the step its job takes with the columns to
    write, and what ended the attempt."""

    label: str
    step: transitions.Step
    columns: dict[str, Any]
    # What ended the attempt, as its ``attempt_errors`` entry names it (``history.FAILED``,
    # ``history.TIMED_OUT``, ...); None when it leaves no entry: the handler returned, or no
    # thread started it.
    ending: str | None
    refund_attempt: bool = False
    applied: bool = False
    # The late outcome of an attempt already recorded as timed out: the fence
    # is expected to refuse it.
    late: bool = False
    duration: float = 0.0
    # False for a prefetched attempt the worker took back before a thread
    # started it: the job goes back to the queue as if never claimed.
    started: bool = True

    @property
    def state(self) -> str:
        """The state the outcome leaves its job in."""
        return str(self.step.state)

    def become(self, other: Outcome) -> None:
        """Take ``other``'s label, step, columns, ending and refund: what this attempt's outcome
        became (a cancellation, a value the database refused)."""
        self.label, self.step, self.columns = other.label, other.step, other.columns
        self.ending, self.refund_attempt = other.ending, other.refund_attempt


def execute(job: Job, worker_id: uuid.UUID) -> Outcome:
    """Run ``job``'s handler, then record the outcome if this claim still holds the job."""
    attempt = Attempt(job, worker_id)
    outcome = run(attempt)
    record_many(job._state.db or "default", [(attempt, outcome)])
    return outcome


# How a traced attempt whose handler returned ended, on its span (it leaves no history entry).
RETURNED = "done"


def run(attempt: Attempt) -> Outcome:
    """Run the attempt's handler and return the outcome, not yet recorded; in a span if traced."""
    if tracing.enabled and (tracer := tracing.tracer()) is not None:
        with tracing.attempt(tracer, attempt.job) as span:
            outcome = _run(attempt)
            _trace(span, attempt, outcome)
        return outcome
    return _run(attempt)


def _run(attempt: Attempt) -> Outcome:
    job = attempt.job
    started = attempt.start()
    _send(signals.job_started, job)
    with running(job, attempt.token):
        outcome = settle(attempt, run_handler(job))
    outcome.duration = time.monotonic() - started
    return outcome


async def arun(attempt: Attempt) -> Outcome:
    """``run`` on an event loop: await the attempt's coroutine, cancelled at its timeout."""
    if tracing.enabled and (tracer := tracing.tracer()) is not None:
        with tracing.attempt(tracer, attempt.job) as span:
            outcome = await _arun(attempt)
            _trace(span, attempt, outcome)
        return outcome
    return await _arun(attempt)


async def _arun(attempt: Attempt) -> Outcome:
    job = attempt.job
    started = attempt.start()
    if signals.job_started.receivers:  # receivers are sync code, maybe ORM code: off the loop
        await sync_to_async(_send)(signals.job_started, job)
    with running(job, attempt.token):
        outcome = settle(attempt, await _within_timeout(attempt))
    outcome.duration = time.monotonic() - started
    return outcome


def _trace(span: Span, attempt: Attempt, outcome: Outcome) -> None:
    """Note the outcome on the attempt's span.

    A thread's handler that ran past its timeout comes back after the worker
    recorded the attempt timed out (``timeouts``): that is its outcome.
    """
    if attempt.stop.is_set() and attempt.past_deadline(time.monotonic()):
        outcome = timed_out(attempt.job)
    ending = outcome.ending or RETURNED
    tracing.ended(span, ending, outcome.state, history.summary(str(outcome.columns.get("error") or "")))


async def _within_timeout(attempt: Attempt) -> Outcome:
    """The coroutine's outcome; timed out if it ran past its timeout, which cancels it there."""
    job = attempt.job
    try:
        async with asyncio.timeout(attempt.time_remaining) as scope:
            outcome = await arun_handler(job)
    except TimeoutError:  # the scope's: one the handler raised is its outcome already
        logger.warning(
            "job timed out, its coroutine cancelled job_id=%s name=%s timeout=%gs",
            job.pk,
            job.name,
            job.timeout,
        )
        return timed_out(job)
    except asyncio.CancelledError:
        if attempt.cancel.is_set():
            attempt.cancel_seen = True  # stopped by the request: settle() ends it cancelled
            return failed("")
        if attempt.shutdown is not None and attempt.shutdown.is_set():
            # Cancelled at shutdown, after the worker handed the job back: nothing records this.
            return failed_attempt(job, None, "cancelled at shutdown after the grace period")
        return failed_attempt(job, None, "".join(traceback.format_exc()))
    if scope.expired():  # it swallowed the cancellation and returned late
        return timed_out(job)
    return outcome


async def arun_handler(job: Job) -> Outcome:
    """Await the job's coroutine function and turn whatever happens into an ``Outcome``.

    ``CancelledError`` is not an outcome: it propagates, for the caller to
    tell a timeout from a cancellation. A handler that is not a coroutine
    function (registered as one when the job was enqueued, changed since)
    runs in the thread for sync code.
    """
    # A registered name is a dictionary lookup; a resolver may read the database, off the loop.
    known = handlers.is_registered(job.name)
    function = prepare(job) if known else await sync_to_async(prepare)(job)
    if isinstance(function, Outcome):
        return function
    try:
        if function.is_async:
            value = await function.func(*job.args, **job.kwargs)
        else:
            value = await sync_to_async(function.func)(*job.args, **job.kwargs)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001 - as in run_handler
        return raised(job, function, exc)
    return returned(job, value)


def _send(signal: Signal, job: Job) -> None:
    """Send a job signal; a failing receiver is logged, it does not fail the job or the worker."""
    if not signal.receivers:  # the usual case, and it is asked twice per job
        return
    for receiver, response in signal.send_robust(sender=Job, job=job):
        if isinstance(response, Exception):
            logger.error("signal receiver failed receiver=%r job_id=%s", receiver, job.pk, exc_info=response)


def settle(attempt: Attempt, outcome: Outcome) -> Outcome:
    """The outcome to record, given what the handler was asked: a cancellation
    (``cancellation.settle``), or a timeout or a shutdown it stopped early for."""
    return stopped_early(attempt, cancellation.settle(attempt, outcome))


def stopped_early(attempt: Attempt, outcome: Outcome) -> Outcome:
    """A handler that returned after ``should_stop()`` told it of its timeout, its worker's
    shutdown or its lost lease did not finish its work: its value is not recorded as ``done``.

    At the timeout the attempt fails as timed out (retried while attempts
    last); at a shutdown the job is queued again, due now, its attempt not
    counted: the handler has returned, so nothing of it still runs here.
    When the lease was lost the job ends as recovery would end it.
    """
    if outcome.step != FINISHED_DONE or attempt.stop_seen not in (TIMED_OUT, SHUTTING_DOWN, LEASE_LOST):
        return outcome
    job = attempt.job
    if attempt.stop_seen == TIMED_OUT:
        early = timed_out(job, "the handler stopped early when should_stop() told it")
        early.duration = outcome.duration
        return early
    if attempt.stop_seen == LEASE_LOST:
        return lease_lost(job)
    return stopped_at_shutdown()


def stopped_at_shutdown() -> Outcome:
    """A handler that returned early because ``should_stop()`` told it of its worker's shutdown:
    queued again, due now, the attempt not counted."""
    reason = "handed back at shutdown: the handler stopped early when should_stop() told it"
    columns = {"run_after": clock.now(), "error": reason}
    label = "handed back (stopped early at shutdown)"
    return Outcome(label, transitions.RESCHEDULED_QUEUED, columns, history.RETRY, refund_attempt=True)


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


def report_ended(alias: str, ended: Sequence[tuple[int, str]]) -> None:
    """Send ``job_finished`` for jobs a maintenance duty ended: attempts the reaper ended because
    their worker was lost, jobs failed because no live worker knew their name.

    ``ended`` pairs a job id with the state the duty left it in. A job
    that has left that state since (requeued and claimed again) is not
    reported: its next attempt's outcome is.
    """
    if not ended or not signals.job_finished.has_listeners(Job):
        return
    states = dict(ended)
    for job in Job.objects.using(alias).filter(pk__in=states):
        if job.state == states[job.pk]:
            _send(signals.job_finished, job)


def run_handler(job: Job) -> Outcome:
    """Call the job's function and turn whatever happens into an ``Outcome``.

    A coroutine function runs to its end on an event loop of its own
    (``async_to_sync``): how a thread runs one, inline and in tests too.
    """
    function = prepare(job)
    if isinstance(function, Outcome):
        return function
    try:
        if function.is_async:
            value = async_to_sync(function.func)(*job.args, **job.kwargs)
        else:
            value = function.func(*job.args, **job.kwargs)
    # A handler's SystemExit or KeyboardInterrupt is its failure, not the worker's.
    except BaseException as exc:  # noqa: BLE001
        return raised(job, function, exc)
    return returned(job, value)


def prepare(job: Job) -> handlers.Handler[Any, Any] | Outcome:
    """The handler to call with the job's arguments, or the outcome of a job that cannot be called."""
    try:
        function = handlers.for_job(job)
    except UnknownJob as exc:
        return not_known_here(job, exc)
    # A resolver may read the database (a task's backend column is not
    # claimed); its trouble is this attempt's failure, never the worker's.
    except Exception:  # noqa: BLE001
        return failed_attempt(job, None, traceback.format_exc())
    if not isinstance(job.args, list) or not isinstance(job.kwargs, dict):
        return failed(_arguments_failure(job, arguments_problem(function, job.args, job.kwargs)))
    return function


def raised(job: Job, function: handlers.Handler[Any, Any], exc: BaseException) -> Outcome:
    """The outcome of a handler that raised ``exc``."""
    if job._attempt is not None:
        job._attempt.exception = exc
    text = "".join(traceback.format_exception(exc))
    if isinstance(exc, Retry):
        return retry_later(exc.delay)
    if tracing.enabled:
        tracing.record_exception(exc)
    if isinstance(exc, Fail):
        return failed(f"failed by the handler: {exc.reason}\n\n{text}")
    # The arguments are checked against the signature only when the call
    # fails: a TypeError from the call itself is a permanent failure.
    problem = arguments_problem(function, job.args, job.kwargs) if isinstance(exc, TypeError) else ""
    if problem:
        return failed(_arguments_failure(job, problem))
    return failed_attempt(job, function.options.backoff, text)


def returned(job: Job, value: Any) -> Outcome:
    """The outcome of a handler that returned ``value``."""
    result, problem = encode_result(value)
    if problem:
        logger.warning("job result not stored job_id=%s name=%s reason=%r", job.pk, job.name, problem)
    return done(result, problem)


def done(result: Any, problem: str) -> Outcome:
    """A handler that returned: its encoded ``result``, and why it was not stored, if it was not."""
    return Outcome("done", transitions.FINISHED_DONE, {"result": result, "error": problem}, None)


def _arguments_failure(job: Job, problem: str) -> str:
    return f"cannot call {job.name!r} with the stored arguments: {problem}"


def arguments_problem(function: handlers.Handler[Any, Any], args: Any, kwargs: Any) -> str:
    """Why the stored arguments cannot be passed to the function, or "" if they can."""
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return f"args must be a JSON list and kwargs a JSON object, got {args!r} and {kwargs!r}"
    try:
        function.signature.bind(*args, **kwargs)
    except TypeError as exc:
        return f"{exc} (signature {function.name}{function.signature})"
    return ""


def not_known_here(job: Job, exc: UnknownJob) -> Outcome:
    """The outcome of a job this process cannot run (a Django task whose code is not deployed here;
    a claim takes only names the worker knows): queued again, the attempt not counted, due one
    ``HEARTBEAT`` later, for a worker that knows it. Once no live worker has known its name for
    ``UNKNOWN_NAME_TIMEOUT``, the unknown-name duty fails it (``unknown_names``)."""
    cause = exc.reason if isinstance(exc, handlers.Unresolvable) else "no handler registered under it"
    reason = f"handed back by {history.this_process()}, which cannot run {job.name!r}: {cause}"
    columns = {"run_after": clock.now() + timedelta(seconds=conf.heartbeat), "error": reason}
    label = "handed back: not known here"
    return Outcome(label, transitions.RESCHEDULED_QUEUED, columns, history.HANDED_BACK, refund_attempt=True)


def unstarted() -> Outcome:
    """The outcome of a prefetched attempt that no thread started: queued again, the attempt not counted."""
    step = transitions.UNCLAIMED_QUEUED
    return Outcome("taken back unstarted", step, {}, None, refund_attempt=True, started=False)


def failed(error: str) -> Outcome:
    return Outcome("failed", transitions.FINISHED_FAILED, {"error": error}, history.FAILED)


def retry_later(delay: float) -> Outcome:
    """The handler raised ``Retry``: queued again ``delay`` seconds from now, the attempt not counted."""
    columns = {"run_after": clock.now() + timedelta(seconds=delay)}
    label = f"retry requested in {delay:.1f}s"
    return Outcome(label, transitions.RESCHEDULED_QUEUED, columns, history.RETRY, refund_attempt=True)


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
        backoff = handlers.get(job.name).options.backoff
    except UnknownJob:
        backoff = None
    how = how or "the handler was still running; whatever it returns later is discarded"
    error = f"timed out after {job.timeout:g}s: {how}"
    outcome = failed_attempt(job, backoff, error)
    outcome.label, outcome.ending = f"timed out, {outcome.label}", history.TIMED_OUT
    return outcome


def retry_delay(attempt: int, base: float, cap: float) -> float:
    """``base`` doubled for each attempt after the first, with +-20% jitter, at most ``cap``."""
    delay: float = base * 2.0 ** min(attempt - 1, 62)
    return min(delay * random.uniform(0.8, 1.2), cap)


def record_many(alias: str, finished: list[tuple[Attempt, Outcome]]) -> None:
    """Write each outcome whose job its claim still holds, all in one transaction."""
    outcomes = Outcomes(finished)

    def write() -> None:
        with transactions.short_transaction(connections[alias]):
            outcomes.write()

    # Past the lease the reaper may have handed the jobs to someone else;
    # retrying longer is pointless, the fence would refuse the writes anyway.
    try:
        transient_errors.retry(
            write, what=f"record {len(finished)} outcome(s)", alias=alias, give_up_after=conf.lease
        )
    except transient_errors.TRANSIENT:
        raise
    except Exception:
        logger.exception("outcomes refused together, writing them one at a time count=%d", len(outcomes))
        outcomes.write_each(alias)
        return
    outcomes.settle()


# One pending outcome write: the attempt, its outcome, and the write it renders to.
Pending = tuple[Attempt, Outcome, transitions.Write]


class Outcomes:
    """Outcomes of finished handlers, written together: ``write()`` in the caller's
    transaction, then ``settle()`` once it committed.

    One commit for many outcomes is what lets a worker finish thousands of
    short jobs a second; each write is still its own fenced UPDATE. If the
    database refuses one of them, the caller rolls back and calls
    ``write_each()``, which records the rest and fails that one job. A unique
    job put back in the queue while another waits with its key is no such
    refusal: it is written superseded, in a savepoint of its own (``putback``).
    """

    def __init__(self, finished: list[tuple[Attempt, Outcome]]) -> None:
        now = clock.now()
        # In id order: the heartbeat renews leases in that order too, so the
        # two never wait on each other's row locks in a cycle (a deadlock).
        ordered = sorted(finished, key=lambda pair: (pair[0].job.id, pair[0].token))
        self.writes: list[Pending] = [(a, o, _write(a, o, now)) for a, o in ordered]

    def __len__(self) -> int:
        return len(self.writes)

    def write(self) -> None:
        for group in self._groups():
            if len(group) == 1:
                self._write_held(group[0])
                continue
            pending = [self.writes[i] for i in group]
            held = [(a.job, a.token) for a, _, _ in pending]
            applied = update_all_if_held(held, [w.changes for _, _, w in pending], pending[0][2].nulls)
            for attempt, outcome, _ in pending:
                outcome.applied = attempt.job.id in applied
        self._cancel_overtaken_retries()

    def _write_held(self, i: int) -> None:
        """Write ``self.writes[i]`` on its own: superseded instead if it puts a unique job back while
        another waits with its key (``putback``)."""
        attempt, _, write = self.writes[i]
        self._applied(i, putback.if_held(attempt.job, attempt.token, write))

    def _applied(self, i: int, applied: transitions.Write | None) -> None:
        """Note what became of ``self.writes[i]``: ``applied`` is the write that applied, if any."""
        attempt, outcome, write = self.writes[i]
        outcome.applied = applied is not None
        if applied is not None and applied is not write:
            _took(outcome, applied.transition.name, applied)
            self.writes[i] = (attempt, outcome, applied)

    def requeue(self) -> bool:
        """Whether a write puts its job back in the queue (a retry, a job taken back unstarted)."""
        return any(write.requeues for _, _, write in self.writes)

    def write_with(self, run: Callable[[list[tuple[str, list[Any]]]], tuple[list[set[int]], T]]) -> T:
        """Hand each group's fenced write, rendered but unrun, to ``run``, which runs them (with the
        claim, in one statement) and returns the ids each changed, and its own result.

        Not for a unique job put back in the queue: the index may refuse its
        write, which needs a savepoint of its own (``putback``), and one
        statement fails whole. (The worker writes no put-back with its claim.)
        """
        if any(putback.may_collide(attempt.job.unique_key, write) for attempt, _, write in self.writes):
            raise ValueError("a unique job put back in the queue is written apart from the claim")
        groups = [[self.writes[i] for i in group] for group in self._groups()]
        writes = [_rendered(group) for group in groups]
        applied, result = run(writes)
        for group, ids in zip(groups, applied, strict=True):
            for attempt, outcome, _ in group:
                outcome.applied = attempt.job.id in ids
        self._cancel_overtaken_retries()
        return result

    def _cancel_overtaken_retries(self, unwritten: frozenset[int] = frozenset()) -> None:
        """A retry refused because a cancellation was requested after the handler returned ends cancelled.

        Not one in ``unwritten`` (indexes of writes that raised): the fence
        did not refuse it, nothing said a cancellation was requested.
        """
        for i, (attempt, outcome, write) in enumerate(self.writes):
            if outcome.applied or write.transition is not transitions.RESCHEDULED or i in unwritten:
                continue
            cancelled = transitions.cancelled_instead(write.changes, clock.now())
            if update_if_held(attempt.job, attempt.token, cancelled.changes, cancelled.nulls):
                outcome.applied = True
                _took(outcome, "cancelled", cancelled)
                self.writes[i] = (attempt, outcome, cancelled)

    def _groups(self) -> list[list[int]]:
        """The writes (indexes in ``self.writes``) that can share one statement (same columns), each
        group in id order.

        On MySQL every write is its own group: an UPDATE there cannot say
        which rows it changed, and its row locks must come in id order. So
        are two attempts of one job (a timed-out one and its retry), and a
        unique job put back in the queue, which the index may refuse.
        """
        if not self.writes or not sql.of(connections[self.writes[0][0].job._state.db or "default"]).returning:
            return [[i] for i in range(len(self.writes))]
        groups: dict[tuple[Any, ...], list[int]] = {}
        seen: set[int] = set()
        for i, (attempt, _, write) in enumerate(self.writes):
            key: tuple[Any, ...] = (tuple(write.changes), fence.kinds(write.changes), write.nulls)
            if putback.may_collide(attempt.job.unique_key, write):
                key = (*key, "alone", i)
            elif attempt.job.id in seen:  # a job's second attempt: never in one statement with its first
                key = (*key, attempt.token)
            seen.add(attempt.job.id)
            groups.setdefault(key, []).append(i)
        return list(groups.values())

    def write_each(self, alias: str) -> None:
        """Write the outcomes one at a time, each in its own transaction, and settle them.

        For after ``write()`` failed on a value the database refused: that
        job ends ``failed`` with the reason, and the others are recorded as
        they were. A job whose outcome cannot be written at all is left to
        its lease.
        """
        unwritten = set()
        for i, (attempt, outcome, _) in enumerate(self.writes):
            outcome.applied = False
            try:
                self._write_one(alias, i)
            except Exception as exc:  # noqa: BLE001 - this job's trouble, never the worker's
                unwritten.add(i)
                logger.error(
                    "outcome not recorded; the lease will recover the job job_id=%s error=%r",
                    attempt.job.pk,
                    exc,
                )
        try:
            self._cancel_overtaken_retries(frozenset(unwritten))
        except Exception:  # those jobs stay as they are, their cancellation requested
            logger.exception("cancelled outcomes not recorded")
        self.settle()

    def _write_one(self, alias: str, i: int) -> None:
        attempt, outcome, write = self.writes[i]
        try:
            self._applied(i, _write_alone(alias, attempt, write))
        except transient_errors.TRANSIENT:
            raise
        except Exception as exc:  # noqa: BLE001 - the database refused this outcome's values
            logger.error("outcome refused by the database job_id=%s error=%r", attempt.job.pk, exc)
            refused = failed(
                f"the outcome could not be stored, the database refused it: {exc!r} "
                f"(the handler's outcome was: {outcome.label})"
            )
            outcome.become(refused)
            write = transitions.outcome(refused.step, refused.columns, clock.now())
            self.writes[i] = (attempt, outcome, write)
            self._applied(i, _write_alone(alias, attempt, write))

    def settle(self) -> None:
        """Bring the jobs in memory up to date, count the outcomes written, send ``job_finished``."""
        now = clock.now()
        for attempt, outcome, write in self.writes:
            job = attempt.job
            if not outcome.applied:
                log = logger.info if outcome.late else logger.warning
                log(
                    "stale outcome discarded: job no longer held by this claim "
                    "job_id=%s name=%s attempt=%d outcome=%s",
                    job.pk,
                    job.name,
                    job.attempts,
                    outcome.label,
                )
                continue
            transitions.apply(job, write.changes)
            counted = rollup.outcome_of(str(write.changes.get("state", "")), outcome.started)
            if counted:
                rollup.count(now, job.queue, counted)
            if outcome.started:
                _send(signals.job_finished, job)


def _write_alone(alias: str, attempt: Attempt, write: transitions.Write) -> transitions.Write | None:
    """One fenced write in a transaction of its own, retried past transient trouble for a lease;
    the write that applied (``write``, or the job superseded: ``putback``), or None."""

    def one() -> transitions.Write | None:
        with transactions.short_transaction(connections[alias]):
            return putback.if_held(attempt.job, attempt.token, write)

    what = f"record the outcome of job {attempt.job.pk}"
    return transient_errors.retry(one, what=what, alias=alias, give_up_after=conf.lease)


def _rendered(group: list[Pending]) -> tuple[str, list[Any]]:
    """A group's fenced write, returning the ids it changes, rendered but unrun."""
    nulls = group[0][2].nulls
    return fence.joined([(a.job, a.token) for a, _, _ in group], [w.changes for _, _, w in group], nulls)


def _write(attempt: Attempt, outcome: Outcome, now: datetime) -> transitions.Write:
    """The write that records ``outcome``: its columns, the job's last progress, the lease released."""
    if not outcome.started:
        return transitions.unclaimed()
    job = attempt.job
    columns = dict(outcome.columns)
    if "error" in columns:
        columns["error"] = _storable_text(columns["error"])
    if outcome.ending is not None:  # an attempt that did not succeed: its entry
        error = columns.get("error") or outcome.label
        columns["attempt_errors"] = _entry(attempt, outcome.ending, error, outcome.duration, now)
    if job.progress_done is not None:
        columns.update(
            progress_done=job.progress_done,
            progress_total=job.progress_total,
            progress_message=job.progress_message,
        )
    return transitions.outcome(outcome.step, columns, now, refund_attempt=outcome.refund_attempt)


def _entry(attempt: Attempt, ending: str, error: str, duration: float, now: datetime) -> history.Append:
    """The attempt as ``Job.attempt_errors`` keeps it: ``ending`` ended it ``now``, after ``duration``."""
    started_at = now - timedelta(seconds=duration) if duration else attempt.job.started_at
    return attempt.history_entry(ending, error, started_at, now)


def _took(outcome: Outcome, label: str, applied: transitions.Write) -> None:
    """Note on ``outcome`` the write that applied in place of its own (a retry that ends cancelled,
    a job superseded): its step and error. The attempt ended as it did: its ending stays."""
    outcome.label, outcome.step = label, applied.step
    outcome.columns = {name: value for name, value in applied.changes.items() if name == "error"}


def _storable_text(text: str | None) -> str:
    """An error text every database stores, within ``MAX_PAYLOAD_BYTES`` (its start and end kept).

    PostgreSQL refuses the NUL character in text, and no database takes a
    lone surrogate: both are written out as escapes.
    """
    if not text:
        return ""
    text = (text or "").replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return bounded_error(text)
