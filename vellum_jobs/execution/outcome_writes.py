"""Recording the outcomes of attempts: fenced UPDATEs, batched in one transaction.

Every write after the claim is fenced on the claim's token (see
``transitions``). A worker whose lease expired (the job was requeued and
maybe claimed again) updates nothing: its late outcome is dropped with a
warning instead of overwriting the new owner's. An outcome the database
refuses (a number past 64 bits, a NUL character, an oversized value) ends
its own job ``failed`` with the reason and touches no other.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import connections

from vellum_jobs import signals
from vellum_jobs.conf import conf
from vellum_jobs.core import clock, dependencies, history, transitions
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.payload import bounded_error
from vellum_jobs.execution.job_signals import send
from vellum_jobs.execution.outcome import Outcome, failed
from vellum_jobs.store import fence, putback, rollup, sql, transactions, transient_errors
from vellum_jobs.store.announce import announce
from vellum_jobs.store.fence import update_all_if_held, update_if_held

T = TypeVar("T")

logger = logging.getLogger("vellum_jobs")


def record_many(alias: str, finished: list[tuple[Attempt, Outcome]]) -> None:
    """Write each outcome whose job its claim still holds, all in one transaction."""
    outcomes = OutcomeWrites(finished)

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
        logger.exception(
            "%d outcomes refused together; writing them one at a time count=%d", len(outcomes), len(outcomes)
        )
        outcomes.write_each(alias)
        return
    outcomes.settle()


# One pending outcome write: the attempt, its outcome, and the write it renders to.
Pending = tuple[Attempt, Outcome, transitions.Write]


class OutcomeWrites:
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
        # Waiting jobs that ``settle()`` released or cancelled (workflow steps).
        self.released = 0
        # Whether the steps' ends are on their edges (``write()`` marks them in its transaction).
        self.marked = False

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
        self._mark_ends()

    def _mark_ends(self) -> None:
        """The steps' ends on their edges, in the outcomes' own transaction: one commit for both
        (PostgreSQL and MariaDB flush each commit to disk), and the release after it sees them."""
        ended = self._ends()
        if ended:
            dependencies.mark(self.writes[0][0].job._state.db or "default", ended)
        self.marked = True

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
        self.marked = False  # with the transaction that failed; settle() marks them
        for i, (attempt, outcome, _) in enumerate(self.writes):
            outcome.applied = False
            try:
                self._write_one(alias, i)
            except Exception as exc:  # noqa: BLE001 - this job's trouble, never the worker's
                unwritten.add(i)
                logger.error(
                    "%s #%s: outcome not recorded; recovery queues the job again once its lease lapses "
                    "job_id=%s error=%r",
                    attempt.job.name,
                    attempt.job.pk,
                    attempt.job.pk,
                    exc,
                )
        try:
            self._cancel_overtaken_retries(frozenset(unwritten))
        except Exception:  # those jobs stay as they are, their cancellation requested
            logger.exception(
                "cancellations that overtook retries not recorded; those jobs stay asked to stop"
            )
        self.settle()

    def _write_one(self, alias: str, i: int) -> None:
        attempt, outcome, write = self.writes[i]
        try:
            self._applied(i, _write_alone(alias, attempt, write))
        except transient_errors.TRANSIENT:
            raise
        except Exception as exc:  # noqa: BLE001 - the database refused this outcome's values
            logger.error(
                "%s #%s: the database refused its outcome; recording it as failed with the reason "
                "job_id=%s error=%r",
                attempt.job.name,
                attempt.job.pk,
                attempt.job.pk,
                exc,
            )
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
        ended: list[rollup.Ended] = []
        for attempt, outcome, write in self.writes:
            job = attempt.job
            if not outcome.applied:
                log = logger.info if outcome.late else logger.warning
                log(
                    "%s #%s: stale outcome discarded, as this claim no longer holds the job "
                    "job_id=%s name=%s attempt=%d outcome=%s",
                    job.name,
                    job.pk,
                    job.pk,
                    job.name,
                    job.attempts,
                    outcome.label,
                )
                continue
            counted = rollup.outcome_of(
                str(write.changes.get("state", "")), outcome.started, outcome.refund_attempt
            )
            if counted:  # before the write is applied: the job's due and claim times are this attempt's
                waited = (job.started_at - job.run_after).total_seconds() if job.started_at else None
                ended.append((job.queue, counted, job.name, outcome.duration, waited))
            transitions.apply(job, write.changes)
            if outcome.started:
                send(signals.job_finished, job)
        rollup.count_all(now, ended)
        self._release_downstream()

    def _ends(self) -> dict[int, str]:
        """The workflow steps whose outcome ended them: id, end state."""
        return {
            attempt.job.pk: str(write.changes["state"])
            for attempt, outcome, write in self.writes
            # Not a deferred load: a job whose workflow was not claimed with it is the duty's.
            if outcome.applied
            and attempt.job.__dict__.get("workflow_id") is not None
            and write.changes.get("state") in transitions.FINISHED_STATES
        }

    def _release_downstream(self) -> None:
        """Once the outcomes committed: release the jobs that waited for the steps they ended (see
        ``vellum_jobs.core.dependencies``). Ends that ``write()`` did not mark (they were written
        one at a time, or with the claim) are marked first, in a transaction of their own. Trouble
        here is the release duty's to mend."""
        ended = self._ends()
        if not ended:
            return
        alias = self.writes[0][0].job._state.db or "default"
        try:
            if not self.marked:
                dependencies.mark(alias, ended)
            self.released = dependencies.release_after(alias, ended)
            if self.released:
                announce(alias, "")  # other processes' idle workers: jobs are due
        except Exception as exc:  # noqa: BLE001 - the release duty releases them within a beat or two
            transient_errors.log_failure(
                "jobs waiting for %d ended jobs not released; the release duty will count=%d",
                exc,
                len(ended),
                len(ended),
            )


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
        if outcome.step == transitions.HELD_BACK_QUEUED:
            return transitions.held_back(
                outcome.columns["run_after"], _storable_text(outcome.columns["error"])
            )
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
