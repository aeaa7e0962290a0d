"""Every change of a job's state: the columns it writes, the condition it requires, and the one fence.

The claim's SQL, the worker's outcome writes, lease renewal and recovery,
inline runs, the admin's actions and retention all render their writes from
here, and no other module names a state it writes or the fence's columns.
``TRANSITIONS`` lists them for the README's state diagram, which a test
keeps equal to this module.

The fence is the claim counter ``claims``: every claim adds one and nothing
resets it, not even ``retry()``, so a token names one claim of one job for
good. A write after the claim applies only while the job is running under
that very token. A holder whose lease lapsed (the job was recovered,
retried, or claimed again, by another worker or by the same one) updates
nothing, however late it comes back.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import F, Q, Value
from django.db.models.functions import Greatest

from vellum_jobs.core import history

if TYPE_CHECKING:
    from vellum_jobs.core.models import Job


class State(models.TextChoices):
    """A job's states (``Job.State``)."""

    # Waiting for its upstream jobs to end (a workflow's step, a batch's
    # callback); never claimed until released to queued.
    WAITING = "waiting", "waiting"
    # Waiting for its run_after, then for a free worker thread.
    QUEUED = "queued", "queued"
    # Claimed by a worker, which holds it while lease_expires_at is renewed.
    RUNNING = "running", "running"
    # The handler returned; its value is in result.
    DONE = "done", "done"
    # The handler failed on its last attempt or raised Fail; or no live
    # worker has known the job's name for UNKNOWN_NAME_TIMEOUT.
    FAILED = "failed", "failed"
    # Cancelled before it started, or stopped by its handler after a
    # cancellation was requested while it ran (cancel_requested_at).
    CANCELLED = "cancelled", "cancelled"


WAITING, QUEUED, RUNNING = State.WAITING, State.QUEUED, State.RUNNING
DONE, FAILED, CANCELLED = State.DONE, State.FAILED, State.CANCELLED
FINISHED_STATES: tuple[str, ...] = (DONE, FAILED, CANCELLED)
RETRYABLE_STATES: tuple[str, ...] = (FAILED, CANCELLED)


@dataclasses.dataclass(frozen=True)
class Add:
    """A column's new value is its old value plus ``n`` (``attempts`` and ``claims``)."""

    n: int


@dataclasses.dataclass(frozen=True)
class AtLeast:
    """A column's new value is the later of its old value and ``value`` (a released job's due time)."""

    value: datetime


Changes = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Transition:
    """A state change: from which states to which, who makes it, and what it requires."""

    name: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    by: str
    requires: str
    fenced: bool = False


CLAIMED = Transition(
    "claimed", (QUEUED,), (RUNNING,), "a worker's claim, or an inline run",
    "due, its queue not paused, its concurrency key under its limit; claims and attempts grow by one",
)  # fmt: skip
UNCLAIMED = Transition(
    "unclaimed", (RUNNING,), (QUEUED,),
    "the claim itself, before it commits; the worker, for a prefetched job no thread started",
    "the claim's token and no cancellation request; the attempt is not counted", fenced=True,
)  # fmt: skip
HELD_BACK = Transition(
    "held back", (RUNNING,), (QUEUED,),
    "the worker's thread, about to start it: one of its limits has no room (rate, concurrency, a hold)",
    "the claim's token and no cancellation request; the attempt is not counted; due when its next "
    "slot comes, the limit named in its error",
    fenced=True,
)  # fmt: skip
FINISHED = Transition(
    "finished", (RUNNING,), FINISHED_STATES, "the worker, with the handler's outcome",
    "the claim's token", fenced=True,
)  # fmt: skip
RESCHEDULED = Transition(
    "retry scheduled", (RUNNING,), (QUEUED,), "the worker: a failed attempt, a timeout, or Retry",
    "the claim's token and no cancellation request (else it ends cancelled)", fenced=True,
)  # fmt: skip
HANDED_BACK = Transition(
    "handed back", (RUNNING,), (QUEUED, CANCELLED), "the worker, at shutdown after the grace period",
    "the claim's token; the attempt is not counted; cancelled if a cancellation was requested", fenced=True,
)  # fmt: skip
RECOVERED = Transition(
    "recovered", (RUNNING,), (QUEUED, FAILED, CANCELLED), "any worker's heartbeat",
    "the lease lapsed under the token it read; failed when out of attempts", fenced=True,
)  # fmt: skip
SUPERSEDED = Transition(
    "superseded", (RUNNING,), (CANCELLED,),
    "the worker or recovery, instead of putting a unique job back while another waits with its key",
    "the claim's token (recovery's: and the lease it saw); the unique index refused the put-back: "
    "the job waiting with the key runs instead",
    fenced=True,
)  # fmt: skip
RETRIED = Transition(
    "retried", RETRYABLE_STATES, (QUEUED,), "retry(): code, the admin, the jobs command",
    "due now, attempts start over; the claim counter does not",
)  # fmt: skip
CANCELLED_QUEUED = Transition(
    "cancelled", (WAITING, QUEUED), (CANCELLED,),
    "cancel(): code, the admin, the jobs command, a workflow's or batch's cancel()", "waiting or queued",
)  # fmt: skip
RELEASED = Transition(
    "released", (WAITING,), (QUEUED,),
    "the worker that recorded an upstream job's end, after its commit; an enqueue whose upstream "
    "jobs have ended; one worker's heartbeat at a time (the release duty)",
    "no upstream job left to end, and their end states are what run_if asks; due now",
)  # fmt: skip
UPSTREAM_ENDED = Transition(
    "upstream ended", (WAITING,), (CANCELLED,), "as released",
    'run_if "done": an upstream job ended failed or cancelled (at once); run_if "failed": all ended done',
)  # fmt: skip
REOPENED = Transition(
    "reopened", RETRYABLE_STATES, (WAITING,),
    "retry() of an upstream job, for the jobs downstream of it; retry() of the job itself",
    "never started, and waits for others: cancelled because an upstream job ended, or retried itself; "
    "its upstream jobs decide again when it runs",
)  # fmt: skip
NO_HANDLER = Transition(
    "no handler", (QUEUED,), (FAILED,), "one worker's heartbeat at a time (the unknown-name duty)",
    "due, and no live worker has known its name for UNKNOWN_NAME_TIMEOUT (counted while a worker was alive)",
)  # fmt: skip
PRUNED = Transition(
    "pruned", FINISHED_STATES, (), "retention and prunejobs",
    "still finished, and finished before the cutoff, in the DELETE itself; a workflow's jobs together, "
    "once all have ended and the newest end is before each of their states' cutoffs",
)  # fmt: skip

TRANSITIONS = (
    CLAIMED, UNCLAIMED, HELD_BACK, FINISHED, RESCHEDULED, HANDED_BACK, RECOVERED, SUPERSEDED, RETRIED,
    CANCELLED_QUEUED, RELEASED, UPSTREAM_ENDED, REOPENED, NO_HANDLER, PRUNED,
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Step:
    """A transition into one of its target states: where an attempt's outcome takes its job.

    An outcome names its step and its own columns, never the state column:
    ``outcome`` renders the write.
    """

    transition: Transition
    state: str


# The steps of a handler's outcome (``outcome``), and of a prefetched attempt no thread started.
FINISHED_DONE = Step(FINISHED, DONE)
FINISHED_FAILED = Step(FINISHED, FAILED)
FINISHED_CANCELLED = Step(FINISHED, CANCELLED)
RESCHEDULED_QUEUED = Step(RESCHEDULED, QUEUED)
UNCLAIMED_QUEUED = Step(UNCLAIMED, QUEUED)
HELD_BACK_QUEUED = Step(HELD_BACK, QUEUED)


@dataclasses.dataclass(frozen=True)
class Write:
    """The columns one state change writes, and the columns that must still be NULL for it to apply."""

    transition: Transition
    changes: Changes
    nulls: tuple[str, ...] = ()

    @property
    def step(self) -> Step:
        """The transition and the state this write takes its job to."""
        return Step(self.transition, self.changes["state"])

    @property
    def requeues(self) -> bool:
        """Whether this write puts its job back in the queue."""
        return bool(self.changes.get("state") == QUEUED)


# -- the fence ---------------------------------------------------------------

# The columns a fenced write compares, in this order, with ``fence_values``.
FENCE = ("id", "state", "claims")


def fence_values(pk: int, token: int) -> list[Any]:
    return [pk, RUNNING, token]


def held(pk: int, token: int) -> Q:
    """The fence as an ORM condition: the job is running under the claim ``token`` names."""
    return Q(**dict(zip(FENCE, fence_values(pk, token), strict=True)))


# The columns lease renewal compares, with ``renewal_values``: the job is
# running and its latest claim is this worker's.
RENEWAL = ("state", "worker_id")


def renewal_values(worker_id: uuid.UUID) -> list[Any]:
    return [RUNNING, worker_id]


def leased(before: datetime) -> Q:
    """Running jobs whose lease runs out before ``before``: the ones recovery watches."""
    return Q(state=RUNNING, lease_expires_at__lt=before)


def unrenewed(pk: int, token: int, lease: datetime | None) -> Q:
    """The job still runs under the claim ``token``, its lease as recovery last saw it."""
    return held(pk, token) & Q(lease_expires_at=lease)


# -- writes ------------------------------------------------------------------


def claimed(worker_id: uuid.UUID, now: datetime, lease_until: datetime) -> Changes:
    """A claim: running for ``worker_id`` until ``lease_until``, one more attempt, a new token."""
    return {
        "state": RUNNING,
        "attempts": Add(1),
        "claims": Add(1),
        "worker_id": worker_id,
        "lease_expires_at": lease_until,
        "started_at": now,
        "progress_done": None,
        "progress_total": None,
        "progress_message": "",
    }


def unclaimed() -> Write:
    """A claimed job put back as it was, never started: a keyed job a claim took past its key's
    limit, or a prefetched job that waited too long or was still waiting at shutdown.

    A job someone asked to cancel meanwhile is left running, to its lease:
    recovery then cancels it.
    """
    changes = {"state": QUEUED, "attempts": Add(-1), "worker_id": None, "lease_expires_at": None}
    return Write(UNCLAIMED, changes, nulls=("cancel_requested_at",))


def held_back(run_after: datetime, reason: str) -> Write:
    """A claimed job put back before its handler started, as ``unclaimed`` puts it, but due when
    the limit that held it has room, and saying which (``store.limit_gate``)."""
    write = unclaimed()
    return Write(HELD_BACK, {**write.changes, "run_after": run_after, "error": reason}, write.nulls)


def outcome(step: Step, columns: Mapping[str, Any], now: datetime, *, refund_attempt: bool = False) -> Write:
    """The write for a handler's outcome: finished in the state of ``step``, or queued again when
    ``step`` is ``RESCHEDULED_QUEUED``.

    ``columns`` are the outcome's own (result, error, run_after, progress).
    A retry is written only while nobody asked to cancel the job; the worker
    then writes ``cancelled_instead``.
    """
    changes: Changes = {**columns, "state": step.state, "lease_expires_at": None}
    if step.transition is FINISHED:
        changes["finished_at"] = now
        return Write(FINISHED, changes)
    if step.transition is not RESCHEDULED:
        raise ValueError(f"a handler's outcome does not take its job {step.transition.name!r}")
    changes["worker_id"] = None
    if refund_attempt:
        changes["attempts"] = Add(-1)
    return Write(RESCHEDULED, changes, nulls=("cancel_requested_at",))


def cancelled_instead(columns: Mapping[str, Any], now: datetime) -> Write:
    """A retry that a cancellation request overtook: the job ends cancelled, never queued again."""
    error = columns.get("error") or ""
    reason = "cancelled: a cancellation was requested while it ran; it will not be retried"
    changes = {"error": f"{reason}\n\n{error}" if error else reason}
    if "attempt_errors" in columns:  # the retry's entry: the attempt failed all the same
        changes["attempt_errors"] = columns["attempt_errors"]
    return outcome(FINISHED_CANCELLED, changes, now)


def handed_back(
    now: datetime, reason: str, *, cancel_requested: bool, entry: history.Append, due: datetime | None = None
) -> Write:
    """A job still running when the worker shut down: queued again (the attempt not counted), due
    at ``due`` (default now), or cancelled if someone asked it to stop. ``entry`` is the attempt,
    for ``attempt_errors``."""
    if cancel_requested:
        error = f"{reason}; its cancellation had been requested, so it is not run again"
        cancelled: Changes = {
            "state": CANCELLED,
            "lease_expires_at": None,
            "finished_at": now,
            "error": error,
            "attempt_errors": entry,
        }
        return Write(HANDED_BACK, cancelled)
    changes: Changes = {
        "state": QUEUED,
        "worker_id": None,
        "lease_expires_at": None,
        "run_after": now if due is None else due,
        "attempts": Add(-1),
        "error": reason,
        "attempt_errors": entry,
    }
    return Write(HANDED_BACK, changes, nulls=("cancel_requested_at",))


def recovered(
    now: datetime, error: str, *, out_of_attempts: bool, cancel_requested: bool, entry: history.Append
) -> Write:
    """A job whose lease lapsed: queued again, or failed when out of attempts, or cancelled if asked to.
    ``entry`` is the lost attempt, for ``attempt_errors``."""
    changes: Changes = {"lease_expires_at": None, "error": error, "attempt_errors": entry}
    if cancel_requested:
        changes.update(state=CANCELLED, finished_at=now)
    elif out_of_attempts:
        changes.update(state=FAILED, finished_at=now)
    else:
        changes.update(state=QUEUED, run_after=now, worker_id=None)
    return Write(RECOVERED, changes)


def superseded(back: Mapping[str, Any], holder: int, key: str, now: datetime) -> Write:
    """A job that was going back to the queue (``back``, the changes of that write) while job
    ``holder`` waits with its unique ``key``: it ends cancelled, and ``holder`` runs in its place.

    The attempt's entry and whether it counts stay as ``back`` has them: the
    attempt ended as it did, only the job does not run again.
    """
    reason = (
        f"superseded: job #{holder} waits with its unique key {key!r} and runs in its place; "
        "this job will not run again"
    )
    error = back.get("error") or ""
    changes: Changes = {
        "state": CANCELLED,
        "lease_expires_at": None,
        "finished_at": now,
        "error": f"{reason}\n\n{error}" if error else reason,
    }
    kept = ("attempts", "attempt_errors", "progress_done", "progress_total", "progress_message")
    changes.update((name, back[name]) for name in kept if name in back)
    return Write(SUPERSEDED, changes)


def no_handler(now: datetime, error: str, entry: history.Append) -> Changes:
    """A queued job no live worker has known the name of for ``UNKNOWN_NAME_TIMEOUT``: failed, never
    having run. ``entry`` says so in ``attempt_errors``."""
    return {"state": FAILED, "finished_at": now, "error": error, "attempt_errors": entry}


def retried(now: datetime) -> Changes:
    """``retry()``: due now, attempts starting over, the last run forgotten (the claim counter kept)."""
    return {
        "state": QUEUED,
        "run_after": now,
        "attempts": 0,
        "finished_at": None,
        "started_at": None,
        "result": None,
        "worker_id": None,
        "lease_expires_at": None,
        "cancel_requested_at": None,
    }


def cancelled(now: datetime) -> Changes:
    """``cancel()`` of a queued job: the reason replaces an earlier attempt's error."""
    reason = f"cancelled while queued, at {now:%Y-%m-%d %H:%M:%S}; it did not run again"
    return {"state": CANCELLED, "finished_at": now, "error": reason}


def released(now: datetime) -> Changes:
    """A waiting job whose upstream jobs ended as it asked: queued, due now, or later if it was
    enqueued with a later ``run_after`` (a delay counts from the enqueue)."""
    return {"state": QUEUED, "run_after": AtLeast(now)}


def upstream_ended(now: datetime, reason: str) -> Changes:
    """A waiting job that will not run because of how its upstream jobs ended (``reason`` says how)."""
    return {"state": CANCELLED, "finished_at": now, "error": reason}


# The start of the reason ``upstream_ended`` writes: ``reopened`` looks for it.
UPSTREAM_REASON = "upstream: "


def reopened() -> Changes:
    """A job that never ran and waits for others, waiting again: an upstream job is retried, or
    the job itself (queued at once, it would run without its upstream jobs' results)."""
    return {"state": WAITING, "finished_at": None, "error": "", "cancel_requested_at": None}


def waits_again() -> Q:
    """Jobs ``retry()`` makes wait again instead of queueing them: never started, with upstream jobs."""
    return Q(state__in=REOPENED.sources, attempts=0) & ~Q(run_if="")


def reopenable() -> Q:
    """Jobs cancelled by ``upstream_ended``, never started: the ones ``reopened`` waits again."""
    return Q(state=CANCELLED, attempts=0, error__startswith=UPSTREAM_REASON)


def cancel_requested(now: datetime) -> Changes:
    """``cancel()`` of a running job: a request its worker delivers to the handler."""
    return {"cancel_requested_at": now}


def renewed(until: datetime) -> Changes:
    return {"lease_expires_at": until}


# -- conditions of the writes that are not fenced ----------------------------


def retryable() -> Q:
    return Q(state__in=RETRIED.sources)


def cancellable() -> Q:
    return Q(state__in=CANCELLED_QUEUED.sources)


def stoppable() -> Q:
    """Running jobs nobody asked to stop yet."""
    return Q(state=RUNNING, cancel_requested_at=None)


def unrunnable(name: str, now: datetime) -> Q:
    """Due queued jobs of ``name``: the ones ``no_handler`` fails once no live worker knows the name."""
    return Q(state=QUEUED, name=name, run_after__lte=now)


def prunable(state: str, cutoff: datetime) -> Q:
    """Jobs ``state`` (a finished one) that finished before ``cutoff``."""
    if state not in PRUNED.sources:
        raise ValueError(f"only finished jobs are pruned, not {state!r}")
    return Q(state=state, finished_at__lt=cutoff)


# -- applying writes ---------------------------------------------------------


def orm(changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` as keyword arguments for ``QuerySet.update()``."""
    return {name: _orm_value(name, value) for name, value in changes.items()}


def _orm_value(name: str, value: Any) -> Any:
    if isinstance(value, Add):
        return F(name) + value.n
    if isinstance(value, AtLeast):
        return Greatest(F(name), Value(value.value, output_field=models.DateTimeField()))
    if isinstance(value, history.Append):
        return history.Appended(name, value)
    return value


def apply(job: Job, changes: Mapping[str, Any]) -> None:
    """Bring ``job`` in memory up to date with a write that applied to its row."""
    for name, value in changes.items():
        if isinstance(value, history.Append):
            # A claimed job never loaded its entries (a deferred field is not in
            # its __dict__): they load, with this one, when read.
            if name in job.__dict__:
                setattr(job, name, history.appended(getattr(job, name), value))
            continue
        if isinstance(value, AtLeast):
            value = max(getattr(job, name), value.value)
        setattr(job, name, getattr(job, name) + value.n if isinstance(value, Add) else value)


def table() -> str:
    """The transitions as a Markdown table: who makes each and what it requires, as the README shows it."""
    rows = ["| transition | from | to | made by | requires |", "|---|---|---|---|---|"]
    for t in TRANSITIONS:
        requires = ("the fence: " if t.fenced else "") + t.requires
        targets = ", ".join(t.targets) or "deleted"
        rows.append(f"| {t.name} | {', '.join(t.sources)} | {targets} | {t.by} | {requires} |")
    return "\n".join(rows)
