"""What became of one attempt: the ``Outcome`` type and the outcomes that need no decision.

An outcome names the step its job takes (``transitions.Step``: a transition
into one of its states) and the columns it writes; it never names the state
column. It also says what ended the attempt, as the attempt's history entry
names it, so nothing has to read that from the label for logs.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from vellum_jobs.conf import conf
from vellum_jobs.core import clock, history, registry, transitions
from vellum_jobs.core.models import Job
from vellum_jobs.exceptions import UnknownJob


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


def done(result: Any, problem: str) -> Outcome:
    """A handler that returned: its encoded ``result``, and why it was not stored, if it was not."""
    return Outcome("done", transitions.FINISHED_DONE, {"result": result, "error": problem}, None)


def failed(error: str) -> Outcome:
    return Outcome("failed", transitions.FINISHED_FAILED, {"error": error}, history.FAILED)


def retry_later(delay: float) -> Outcome:
    """The handler raised ``Retry``: queued again ``delay`` seconds from now, the attempt not counted."""
    columns = {"run_after": clock.now() + timedelta(seconds=delay)}
    label = f"retry requested in {delay:.1f}s"
    return Outcome(label, transitions.RESCHEDULED_QUEUED, columns, history.RETRY, refund_attempt=True)


def stopped_at_shutdown() -> Outcome:
    """A handler that returned early because ``should_stop()`` told it of its worker's shutdown:
    queued again, due now, the attempt not counted."""
    reason = "handed back at shutdown: the handler stopped early when should_stop() told it"
    columns = {"run_after": clock.now(), "error": reason}
    label = "handed back (stopped early at shutdown)"
    return Outcome(label, transitions.RESCHEDULED_QUEUED, columns, history.RETRY, refund_attempt=True)


def not_known_here(job: Job, exc: UnknownJob) -> Outcome:
    """The outcome of a job this process cannot run (a Django task whose code is not deployed here;
    a claim takes only names the worker knows): queued again, the attempt not counted, due one
    ``HEARTBEAT`` later, for a worker that knows it. Once no live worker has known its name for
    ``UNKNOWN_NAME_TIMEOUT``, the unknown-name duty fails it (``unknown_names``)."""
    cause = exc.reason if isinstance(exc, registry.Unresolvable) else "no handler registered under it"
    reason = f"handed back by {history.this_process()}, which cannot run {job.name!r}: {cause}"
    columns = {"run_after": clock.now() + timedelta(seconds=conf.heartbeat), "error": reason}
    label = "handed back: not known here"
    return Outcome(label, transitions.RESCHEDULED_QUEUED, columns, history.HANDED_BACK, refund_attempt=True)


def held_back(until: datetime, reason: str) -> Outcome:
    """A job one of whose limits had no room when a thread was about to start it: queued again,
    due ``until``, the attempt not counted, its handler never run (``store.limit_gate``)."""
    columns = {"run_after": until, "error": reason}
    step = transitions.HELD_BACK_QUEUED
    return Outcome("held back by a limit", step, columns, None, refund_attempt=True, started=False)


def throttled(key: str, until: datetime, reason: str) -> Outcome:
    """The handler raised ``Throttled``: its key is held until ``until``, and this job is queued
    again then, the attempt not counted."""
    label = f"throttled: {key!r} held until {until:%H:%M:%S}"
    columns = {"run_after": until, "error": reason}
    return Outcome(label, transitions.RESCHEDULED_QUEUED, columns, history.RETRY, refund_attempt=True)


def unstarted() -> Outcome:
    """The outcome of a prefetched attempt that no thread started: queued again, the attempt not counted."""
    step = transitions.UNCLAIMED_QUEUED
    return Outcome("taken back unstarted", step, {}, None, refund_attempt=True, started=False)
