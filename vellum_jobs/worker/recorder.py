"""The thread that records outcomes on a connection of its own while the dispatcher claims.

On PostgreSQL and MariaDB (``Dialect.records_apart``) a worker process has
two connections to the hot path, not one: the dispatcher claims on its own,
and this thread writes the outcomes the dispatcher hands it, in one
transaction for all that are waiting. The server runs the two at once, so
the server's work for one overlaps the worker's Python for the other; in
one thread each waited for the other (a no-op drain on PostgreSQL ran at
0.69x the claim-10 loop instead of 0.49x, measured in one run).

SQLite lets one writer in at a time: there the two would queue for its lock,
and the dispatcher writes the outcomes with its next claim instead.

An attempt stays held (its lease renewed) until its outcome is written;
then ``on_recorded`` runs, on this thread, to let it go.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

from vellum_jobs.conf import conf
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.execution.outcome import Outcome
from vellum_jobs.execution.outcome_writes import OutcomeWrites
from vellum_jobs.store import transactions, transient_errors
from vellum_jobs.store.announce import announce
from vellum_jobs.worker.silence import Calls

logger = logging.getLogger("vellum_jobs")

Finished = list[tuple[Attempt, Outcome]]


class Recorder:
    """Writes the outcomes ``put()`` hands it, in the order they come, on its own thread.

    At most ``max_waiting`` outcomes wait while a batch is being written: a
    dispatcher that runs jobs faster than their outcomes are written (on
    MariaDB each outcome is a statement of its own) then keeps their pace,
    rather than piling up held attempts and the memory they take.
    """

    def __init__(
        self,
        alias: str,
        calls: Calls,
        on_recorded: Callable[[Finished, int], None],
        wake: threading.Event,
        max_waiting: int,
    ) -> None:
        self.alias = alias
        self.calls = calls
        self.max_waiting = max(1, max_waiting)
        # Told, on this thread, the outcomes just recorded (or given up on)
        # and how many waiting jobs their ends released.
        self.on_recorded = on_recorded
        # Set once they are: released jobs are due, a --burst worker may be done.
        self.wake = wake
        self.changed = threading.Condition()
        self.pending: Finished = []  # under ``changed``: handed over, not yet being written
        self.writing = False  # under ``changed``: a batch is being written
        self.closing = False
        self.thread = threading.Thread(target=self._serve, name="vellum-recorder", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def put(self, finished: Finished) -> None:
        """Hand ``finished`` over, once fewer than ``max_waiting`` outcomes wait."""
        if not finished:
            return
        with self.changed:
            while len(self.pending) >= self.max_waiting:
                self.changed.wait()
            self.pending += finished
            self.changed.notify_all()

    def idle(self) -> bool:
        """Whether every outcome handed over is written (or given up on)."""
        with self.changed:
            return not self.pending and not self.writing

    def flush(self) -> None:
        """Wait until every outcome handed over is written (or given up on, after a lease)."""
        with self.changed:
            while self.pending or self.writing:
                self.changed.wait()

    def stop(self) -> None:
        """Write what is waiting, then end the thread (if it ever started)."""
        with self.changed:
            self.closing = True
            self.changed.notify_all()
        if self.thread.ident is not None:
            self.thread.join()

    def _serve(self) -> None:
        try:
            while batch := self._next():
                released = self._record(batch)
                try:
                    self.on_recorded(batch, released)
                except Exception:  # the thread goes on: later outcomes still need writing
                    logger.exception(
                        "%d outcomes recorded, but the worker's bookkeeping of them failed count=%d",
                        len(batch),
                        len(batch),
                    )
                with self.changed:
                    self.writing = False
                    self.changed.notify_all()
                self.wake.set()
        finally:
            connections.close_all()

    def _record(self, batch: Finished) -> int:
        """``record(batch)``, whatever it raises: the thread goes on, later outcomes still need writing."""
        try:
            return record(self.alias, self.calls, batch)
        except Exception as exc:
            logger.exception(
                "%d outcomes not recorded; recovery queues their jobs again once their leases lapse"
                " count=%d error=%r",
                len(batch),
                len(batch),
                exc,
            )
            return 0

    def _next(self) -> Finished:
        """Every outcome waiting, once there is one; none once closing with nothing left."""
        with self.changed:
            while not self.pending and not self.closing:
                self.changed.wait()
            batch, self.pending = self.pending, []
            self.writing = bool(batch)
            return batch


def record(alias: str, calls: Calls, finished: Finished) -> int:
    """Write ``finished`` outcomes in one transaction, past transient trouble for a lease; how many
    waiting jobs their ends released.

    Nothing here raises. Outcomes the database refuses are written one at a
    time (the job with the offending value fails); outcomes that cannot be
    written for a lease are left to it: recovery queues their jobs again.
    """
    outcomes = OutcomeWrites(finished)
    try:
        transient_errors.retry(
            calls.timed("record outcomes", lambda: _write(alias, outcomes)),
            what="record outcomes",
            alias=alias,
            give_up_after=conf.lease,
        )
    except Exception as exc:  # noqa: BLE001 - reported here; the worker goes on
        not_recorded(alias, calls, outcomes, exc)
        return outcomes.released
    outcomes.settle()
    return outcomes.released


def _write(alias: str, outcomes: OutcomeWrites) -> None:
    with transactions.short_transaction(connections[alias]):
        outcomes.write()
        for queue in freed_queues(outcomes):
            announce(alias, queue)


def freed_queues(outcomes: OutcomeWrites) -> list[str]:
    """The queues whose jobs these outcomes free a concurrency slot of: a job another process serves
    may be waiting for it (PostgreSQL: a NOTIFY, delivered on commit; SQLite wakes on any write)."""
    return sorted({attempt.job.queue for attempt, _, _ in outcomes.writes if attempt.job.concurrency_key})


def not_recorded(alias: str, calls: Calls, outcomes: OutcomeWrites, exc: Exception) -> None:
    """The outcomes' transaction failed for good with ``exc``: after a lease of database trouble they
    are left to their leases; refused values, they are written one at a time."""
    if isinstance(exc, transient_errors.TRANSIENT):
        # A lease of database trouble: its traceback says nothing more.
        logger.error(
            "%d outcomes not recorded; recovery queues their jobs again once their leases lapse"
            " count=%d error=%r",
            len(outcomes),
            len(outcomes),
            exc,
        )
        return
    logger.exception(
        "%d outcomes refused together; writing them one at a time count=%d", len(outcomes), len(outcomes)
    )
    with calls.waiting("record outcomes one at a time"):
        outcomes.write_each(alias)
