"""Running one attempt's handler into an ``Outcome``, not yet recorded: in a slot thread (``run``)
or on the event loop (``arun``, cancelled at its timeout).

The handler is looked up and its stored arguments checked (``prepare``);
what it returned or raised becomes the outcome (``returned``, ``raised``);
a cancellation, or a timeout, shutdown or lost lease it stopped early for,
settles it (``settle``). ``job_started`` is sent before it runs, and a
traced attempt runs in a span that notes how it ended.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync, sync_to_async

from vellum_jobs import signals
from vellum_jobs.core import clock, history, limit_rules, registry, upstream
from vellum_jobs.core.attempts import LEASE_LOST, SHUTTING_DOWN, TIMED_OUT, Attempt
from vellum_jobs.core.models import Job
from vellum_jobs.core.payload import encode_result
from vellum_jobs.core.transitions import FINISHED_DONE
from vellum_jobs.exceptions import Fail, Retry, Throttled, UnknownJob
from vellum_jobs.execution import cancellation, tracing
from vellum_jobs.execution.context import running
from vellum_jobs.execution.job_signals import send
from vellum_jobs.execution.outcome import (
    Outcome,
    done,
    failed,
    held_back,
    not_known_here,
    retry_later,
    stopped_at_shutdown,
    throttled,
)
from vellum_jobs.execution.retry_policy import failed_attempt, lease_lost, timed_out
from vellum_jobs.store import limit_gate

if TYPE_CHECKING:
    from opentelemetry.trace import Span

logger = logging.getLogger("vellum_jobs")

# How a traced attempt whose handler returned ended, on its span (it leaves no history entry),
# and one that its limits held back before its handler started.
RETURNED = "done"
HELD_BACK = "held_back"


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
    if job.__dict__.get("limits") and (held := limit_gate.check(job)) is not None:
        return held_back(held.until, held.reason)
    started = attempt.start()
    send(signals.job_started, job)
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
    if job.__dict__.get("limits"):
        held, returned_at = await sync_to_async(limit_gate.check_returning_when)(job)
        held = held or limit_gate.resumed_late(job, returned_at)
        if held is not None:
            return held_back(held.until, held.reason)
    started = attempt.start()
    if signals.job_started.receivers:  # receivers are sync code, maybe ORM code: off the loop
        await sync_to_async(send)(signals.job_started, job)
    with running(job, attempt.token):
        outcome = settle(attempt, await _within_timeout(attempt))
    outcome.duration = time.monotonic() - started
    return outcome


def _trace(span: Span, attempt: Attempt, outcome: Outcome) -> None:
    """Note the outcome on the attempt's span.

    A thread's handler that ran past its timeout comes back after the worker
    recorded the attempt timed out (``worker.watchdog``): that is its outcome.
    """
    if attempt.stop.is_set() and attempt.past_deadline(time.monotonic()):
        outcome = timed_out(attempt.job)
    ending = outcome.ending or (RETURNED if outcome.started else HELD_BACK)
    tracing.ended(span, ending, outcome.state, history.summary(str(outcome.columns.get("error") or "")))


async def _within_timeout(attempt: Attempt) -> Outcome:
    """The coroutine's outcome; timed out if it ran past its timeout, which cancels it there."""
    job = attempt.job
    try:
        async with asyncio.timeout(attempt.time_remaining) as scope:
            outcome = await arun_handler(job)
    except TimeoutError:  # the scope's: one the handler raised is its outcome already
        logger.warning(
            "%s #%s timed out after %gs; its coroutine was cancelled job_id=%s name=%s timeout=%gs",
            job.name,
            job.pk,
            job.timeout,
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
    known = registry.is_registered(job.name)
    function = prepare(job) if known and not job.upstream_arg else await sync_to_async(prepare)(job)
    if isinstance(function, Outcome):
        return function
    try:
        if function.is_async:
            value = await function.func(*job.args, **job.kwargs)
        else:
            value = await sync_to_async(function.func)(*job.args, **job.kwargs)
    except asyncio.CancelledError:
        raise
    except Throttled as exc:  # its hold is written to the database: off the loop
        return await sync_to_async(raised)(job, function, exc)
    except BaseException as exc:  # noqa: BLE001 - as in run_handler
        return raised(job, function, exc)
    return returned(job, value)


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


def prepare(job: Job) -> registry.Handler[Any, Any] | Outcome:
    """The handler to call with the job's arguments, or the outcome of a job that cannot be called."""
    try:
        function = registry.for_job(job)
    except UnknownJob as exc:
        return not_known_here(job, exc)
    # A resolver may read the database (a task's backend column is not
    # claimed); its trouble is this attempt's failure, never the worker's.
    except Exception:  # noqa: BLE001
        return failed_attempt(job, None, traceback.format_exc())
    if not isinstance(job.args, list) or not isinstance(job.kwargs, dict):
        return failed(_arguments_failure(job, arguments_problem(function, job.args, job.kwargs)))
    if job.upstream_arg:
        # A workflow's step: its upstream jobs' results (or a batch's counts) come first.
        try:
            job.args = [upstream.handed(job), *job.args]
        except Exception:  # noqa: BLE001 - reading them failed: this attempt fails, as a resolver's would
            return failed_attempt(job, None, traceback.format_exc())
    return function


def raised(job: Job, function: registry.Handler[Any, Any], exc: BaseException) -> Outcome:
    """The outcome of a handler that raised ``exc``."""
    if job._attempt is not None:
        job._attempt.exception = exc
    text = "".join(traceback.format_exception(exc))
    if isinstance(exc, Retry):
        return retry_later(exc.delay)
    if isinstance(exc, Throttled):
        return _throttled(job, exc)
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


def _throttled(job: Job, exc: Throttled) -> Outcome:
    """Hold the key the handler named, on every worker, and queue this job again when it lifts.

    Should the hold not be written (database trouble), this job still waits
    out the time the handler asked for.
    """
    reason = f"{limit_rules.HELD_PREFIX}hold on {exc.key!r} asked for by its handler (Throttled): {exc}"
    try:
        until = limit_gate.hold(job._state.db or "default", exc.key, exc.seconds, str(exc), job.pk)
    except Exception as error:  # noqa: BLE001 - the job itself still waits
        logger.warning(
            "%s #%s: could not hold %r for %gs; only this job waits job_id=%s error=%r",
            job.name,
            job.pk,
            exc.key,
            exc.seconds,
            job.pk,
            error,
        )
        until = clock.now() + timedelta(seconds=exc.seconds)
    return throttled(exc.key, until, reason)


def returned(job: Job, value: Any) -> Outcome:
    """The outcome of a handler that returned ``value``."""
    result, problem = encode_result(value)
    if problem:
        logger.warning(
            "%s #%s done, but its result was not stored job_id=%s name=%s reason=%r",
            job.name,
            job.pk,
            job.pk,
            job.name,
            problem,
        )
    return done(result, problem)


def _arguments_failure(job: Job, problem: str) -> str:
    return f"cannot call {job.name!r} with the stored arguments: {problem}"


def arguments_problem(function: registry.Handler[Any, Any], args: Any, kwargs: Any) -> str:
    """Why the stored arguments cannot be passed to the function, or "" if they can."""
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return f"args must be a JSON list and kwargs a JSON object, got {args!r} and {kwargs!r}"
    try:
        function.signature.bind(*args, **kwargs)
    except TypeError as exc:
        return f"{exc} (signature {function.name}{function.signature})"
    return ""
