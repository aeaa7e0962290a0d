"""The dispatcher of a worker process: it claims for the idle runners and records their outcomes.

The dispatcher (the thread that calls ``WorkerProcess.run()``) claims for
the idle slots in one statement, and with short jobs claims ahead: up to
``prefetch`` more, as many as the threads can be expected to start within
``PREFETCH_WINDOW`` at the handlers' recent pace, so nothing is hoarded
that another process could run (a job with a one-second handler is never
claimed ahead by a 4-thread worker). A prefetched job still starts in claim
order, and one that waited longer than ``PREFETCH_MAX_WAIT`` goes back to
the queue, its attempt not counted. Slots hand outcomes back, and all
outcomes that are waiting are written in one transaction: with short jobs
that turns a commit per job into a commit per batch. On SQLite the
dispatcher writes them with its next claim; on PostgreSQL and MariaDB the
recorder writes them on its own connection while the dispatcher claims
(``recorder``). Every wait is on one ``Event`` that a new job, a finished
handler, a write of outcomes or a shutdown sets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import connections

from vellum_jobs.conf import conf
from vellum_jobs.core import clock, registry
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.execution import outcome_text
from vellum_jobs.execution.outcome import Outcome
from vellum_jobs.execution.outcome import unstarted as unstarted_outcome
from vellum_jobs.execution.outcome_writes import OutcomeWrites
from vellum_jobs.store import sql, transactions, transient_errors
from vellum_jobs.store.announce import announce
from vellum_jobs.store.claim import ClaimRequest, claim
from vellum_jobs.worker.heartbeat import Heartbeat
from vellum_jobs.worker.recorder import Recorder, freed_queues, not_recorded
from vellum_jobs.worker.runners import Runners
from vellum_jobs.worker.schedule_timer import ScheduleTimer
from vellum_jobs.worker.silence import Calls
from vellum_jobs.worker.watchdog import Watchdog

if TYPE_CHECKING:
    from vellum_jobs.worker.process import WorkerOptions

logger = logging.getLogger("vellum_jobs")

# How long the dispatcher waits for more handlers to finish before it
# records outcomes: short jobs then share a commit, long ones lose 0.2 ms.
GATHER = 0.0002

# A prefetched job is claimed only if the threads should start it within
# this many seconds at the handlers' recent pace...
PREFETCH_WINDOW = 0.05
# ...and one that waited this long anyway goes back to the queue for others.
PREFETCH_MAX_WAIT = 0.5
# The weight of the newest handler duration in the running average.
PACE_WEIGHT = 0.1
# While the threads are busy (running jobs, or their claims bring some)
# and the event loop is idle, the loop's own claim (of coroutine jobs only)
# comes at most this often: in a drain of other jobs it would find nothing
# nearly every cycle.
LOOP_CLAIM_EVERY = 0.05

Report = Callable[[Job, Outcome], None]
Finished = list[tuple[Attempt, Outcome]]


class Dispatcher:
    """Claims for the runners of one process and records their outcomes, cycle after cycle.

    ``on_stuck`` is told how many slots are stuck once they reach ``--max-stuck``.
    """

    def __init__(
        self,
        options: WorkerOptions,
        *,
        prefetch: int,
        row: Worker,
        slots: Runners,
        heartbeat: Heartbeat,
        schedule: ScheduleTimer,
        watchdog: Watchdog,
        calls: Calls,
        wake: threading.Event,
        stopping: threading.Event,
        on_stuck: Callable[[int], None],
        report: Report | None = None,
    ) -> None:
        self.options = options
        self.prefetch = prefetch
        self.row = row  # its id and names claim; it shows how many slots are stuck
        self.slots = slots
        self.heartbeat = heartbeat  # asked before each claim whether the leases may lapse
        self.schedule = schedule
        self.watchdog = watchdog
        self.calls = calls
        self.wake = wake
        self.stopping = stopping
        self.on_stuck = on_stuck
        self.report = report
        self.pace: float | None = None  # running average of handler durations, seconds
        self.loop_claimed_at = 0.0  # when the loop's own claim last ran
        self.came_up_short = False  # the last cycle's claims found fewer jobs than they asked for
        # Jobs the last cycle's outcomes released (workflow steps that waited for
        # them): queued after that cycle's claim, so not claimed yet.
        self.released = 0
        self.claimed = 0
        # Jobs with a concurrency key are left to workers that registered one.
        self.limits = registry.has_concurrency_limits()
        # While ``run()`` runs, where the database serves two writers at once:
        # outcomes are written beside the claims, on a thread and connection
        # of their own. Without it they are written with the next claim.
        self.recorder: Recorder | None = None
        # Whether every outcome handed over was written when the last claim began:
        # a claim that found nothing then saw every job those outcomes put back.
        self.settled_at_claim = True

    @property
    def alias(self) -> str:
        return self.options.alias

    def run(self) -> None:
        """Claim and record until a stop request, ``--max-jobs`` jobs, or a ``--burst`` with nothing left."""
        if sql.of(connections[self.alias]).records_apart:
            # As many outcomes may wait as one cycle can claim jobs.
            most = self.options.threads + self.prefetch + self.slots.async_capacity
            self.recorder = Recorder(self.alias, self.calls, self._recorded, self.wake, max_waiting=most)
            self.recorder.start()
        while True:
            self.wake.clear()
            self.schedule.tick_if_due()
            self._gather()
            finished, idle, free = self._collect()
            if self.stopping.is_set():
                self._cycle(finished, 0, self.slots.take_waiting())
                return
            # Prefetched jobs that waited too long, or all of them when the
            # leases may lapse (no thread should start a job it may not hold).
            trouble = self.heartbeat.in_trouble()
            stale = self.slots.take_waiting(None if trouble else time.monotonic() - PREFETCH_MAX_WAIT)
            limit = 0 if trouble else max(0, idle + self._ahead())
            loop_limit = 0 if trouble else free
            if self.options.max_jobs is not None:
                limit = min(limit, self.options.max_jobs - self.claimed)
                loop_limit = min(loop_limit, self.options.max_jobs - self.claimed - limit)
            jobs = self._cycle(finished, limit, stale, loop_limit)
            nothing_held = not self.slots.held_attempts()
            if self.options.max_jobs is not None and self.claimed >= self.options.max_jobs and nothing_held:
                return
            if self.options.burst and self._burst_done(limit, jobs, nothing_held):
                return
            if not self.released:  # else they are due now: claim them without a wait
                # Outcomes being written may put jobs back: the recorder wakes this
                # thread once they are, so no look for the next delayed job till then.
                self.wake.wait(self._wait_time(self.came_up_short and self.settled_at_claim))

    def drain(self) -> list[Attempt]:
        """Wait for running jobs (up to the grace period after a stop request), recording their
        outcomes; the attempts left to hand back."""
        deadline = time.monotonic() + self.options.grace if self.stopping.is_set() else None
        while True:
            self._cycle(self._collect()[0], 0)
            # Slots stuck in timed-out handlers will not come back; don't wait for them.
            if self.slots.busy() <= len(self.watchdog.timed_out):
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            self.wake.wait(0.05)
            self.wake.clear()
        self._cycle(self._take_finished()[0], 0)
        if self.recorder is not None:
            self.recorder.stop()  # once every outcome handed over is written
        # A handler that came back gives up its attempt: should its outcome
        # not be recorded, the lease brings the job back, the attempt counted.
        # The others are handed back once the threads and the loop are stopped.
        return [attempt for attempt in self.slots.held_attempts() if not attempt.returned]

    def _burst_done(self, limit: int, jobs: list[Job], nothing_held: bool) -> bool:
        """Whether a ``--burst`` worker may exit: nothing held, no handler running, and the
        threads' claim asked for jobs and found none, with every outcome
        handed over written before it began (a retry due at once is queued
        by then).

        A handler still running may be one whose timeout was recorded before
        it came back: its retry, due at once, is for the thread it frees, and
        the event loop's claim (of coroutine jobs only) would not see it. Jobs
        the last outcomes released (a batch's callback) were queued after the
        claim: the next cycle claims them.
        """
        return (
            nothing_held
            and self.settled_at_claim
            and not self.slots.busy()
            and limit > 0
            and not jobs
            and not self.released
        )

    def _ahead(self) -> int:
        """How many jobs may wait for a thread: as many as the threads should start within
        ``PREFETCH_WINDOW`` at the handlers' recent pace, at most ``prefetch``."""
        if not self.prefetch or self.pace is None:
            return 0
        # A handler running longer than the average is a sign the pace has
        # changed before any outcome shows it.
        pace = max(self.pace, self.slots.longest_run(time.monotonic()))
        expected = int(self.options.threads * PREFETCH_WINDOW / max(pace, 1e-6))
        return min(self.prefetch, expected)

    def _gather(self) -> None:
        """Give slots that are about to finish a moment to do so, to write their outcomes together."""
        if self.slots.busy() and self.slots.has_finished():
            time.sleep(GATHER)

    def _collect(self) -> tuple[Finished, int, int]:
        """The outcomes to record this cycle (handed back, then timed out), the idle slots and the
        tasks the event loop may still start."""
        finished, idle, free = self._take_finished()
        finished += self._expire()
        return finished, idle, free

    def _take_finished(self) -> tuple[Finished, int, int]:
        """Outcomes handed back by the slots and the loop, the idle slots and the loop's free capacity."""
        batch, idle, free = self.slots.take_finished()
        for attempt, outcome in batch:
            outcome.late = self.watchdog.returned(attempt)
            # The pace is of the threads' handlers: it decides what they claim ahead. A job
            # taken back or held back by its limits ran no handler.
            if attempt.on_loop or not outcome.started:
                continue
            self.pace = (
                outcome.duration
                if self.pace is None
                else (self.pace + PACE_WEIGHT * (outcome.duration - self.pace))
            )
        return batch, idle, free

    def _running(self) -> list[Attempt]:
        """The held attempts whose handlers have not come back (or not started).

        An attempt whose handler came back is held still until its outcome is
        written: that outcome is the attempt's, whatever its deadline.
        """
        return [attempt for attempt in self.slots.held_attempts() if not attempt.returned]

    def _expire(self) -> Finished:
        """Timed-out outcomes for attempts past their deadline; acts on stuck slots."""
        now = time.monotonic()
        expired = self.watchdog.expire(self._running(), now)
        stuck = self.watchdog.stuck(now)
        self.row.stuck = len(stuck)
        limit = self.options.max_stuck
        if limit is not None and len(stuck) >= limit and not self.stopping.is_set():
            self.on_stuck(len(stuck))
        return expired

    def _wait_time(self, idle: bool) -> float:
        """How long the dispatcher may sleep: until a poll, a delayed job or a deadline."""
        timeout = self._idle_timeout() if idle else conf.poll_interval
        deadline = self.watchdog.next_deadline(self._running())
        if deadline is not None:
            timeout = max(0.0, min(timeout, deadline - time.monotonic()))
        return timeout

    def _cycle(
        self,
        finished: Finished,
        limit: int,
        unstarted: Sequence[Attempt] = (),
        loop_limit: int = 0,
    ) -> list[Job]:
        """Record ``finished`` outcomes, put ``unstarted`` (prefetched) attempts back in the queue and
        claim up to ``limit`` jobs for the threads: in one transaction, or beside the recorder's;
        then up to ``loop_limit`` coroutine jobs for the event loop. Returns the jobs claimed."""
        finished = finished + [(attempt, unstarted_outcome()) for attempt in unstarted]
        if self.recorder is None or self._few_for_the_recorder(finished):
            jobs = self._record_and_claim(finished, limit)
            self._recorded(finished, 0)  # released: counted by _record_and_claim
            self.settled_at_claim = True
        else:
            self.recorder.put(finished)
            if self.came_up_short or any(attempt.job.concurrency_key for attempt, _ in finished):
                # The claim must see what the outcomes being written put back
                # when the last claim found the queue short (they may be all
                # there is), and the concurrency slots they free: else it finds
                # nothing, and claims again at every wake until they are written.
                self.recorder.flush()
            self.released = 0  # the recorder's releases from here on are for the next claim
            self.settled_at_claim = self.recorder.idle()
            jobs = self._claim(limit, is_async=False)
        threads_busy = bool(jobs) or limit < 1 or self.slots.threads.busy() > 0
        loop_claims = self._loop_claims(loop_limit, threads_busy)
        coroutines = self._claim(loop_limit, is_async=True) if loop_claims else []
        # Short of jobs: every claim that ran found fewer than it asked for.
        claims = [
            (n, len(got))
            for n, got, ran in ((limit, jobs, limit > 0), (loop_limit, coroutines, loop_claims))
            if ran
        ]
        self.came_up_short = bool(claims) and all(got < n for n, got in claims)
        self.slots.submit(jobs, coroutines)
        # Jobs put back unstarted do not count towards --max-jobs.
        self.claimed += len(jobs) + len(coroutines) - len(unstarted)
        return jobs + coroutines

    def _few_for_the_recorder(self, finished: Finished) -> bool:
        """Whether this cycle's outcomes are best written with its claim, though there is a recorder:
        fewer than the threads, and none of the recorder's still being written.

        At a steady rate well below the worker's most, a cycle brings an
        outcome or two: handed to the recorder they cost a commit of their
        own and two hand-overs between threads, where one transaction with
        the claim costs neither (a quarter of the worker's CPU at a million
        jobs an hour). The recorder pays where outcomes come in batches, as
        when a backlog drains; it must be idle, so that outcomes are still
        written in the order they came.
        """
        recorder = self.recorder
        return recorder is not None and 0 < len(finished) < self.options.threads and recorder.idle()

    def _recorded(self, finished: Finished, released: int) -> None:
        """``finished`` outcomes are written (or given up on), ``released`` waiting jobs with them: let
        their attempts go (on the recorder's thread, where there is one)."""
        self.slots.release([attempt for attempt, _ in finished])
        for attempt, _ in finished:
            attempt.recorded()
        self.released += released
        # Shown in the worker row at the next heartbeat (only one thread writes it).
        self.row.jobs_run += sum(1 for _, outcome in finished if outcome.started)
        self._report(finished)  # last: a report callback may raise

    def _record_and_claim(self, finished: Finished, limit: int) -> list[Job]:
        """Record ``finished`` outcomes and claim up to ``limit`` jobs for the threads, in one
        transaction; the jobs claimed.

        Nothing here stops the worker. Outcomes the database refuses are
        written one at a time (the job with the offending value fails), and
        then the claim runs on its own.
        """
        outcomes = OutcomeWrites(finished)
        self.released = 0
        freed = freed_queues(outcomes)
        try:
            # Unwritten outcomes are worth a lease of retrying (after that the
            # jobs are recovered anyway); a bare claim retries until shutdown.
            jobs = transient_errors.retry(
                self.calls.timed(
                    "record outcomes and claim", lambda: self._write_and_claim(outcomes, freed, limit)
                ),
                what="record outcomes and claim",
                alias=self.alias,
                give_up_after=conf.lease if outcomes else None,
                stop=None if outcomes else self.stopping,
            )
        except Exception as exc:  # noqa: BLE001 - reported below, and the worker goes on
            if not outcomes:
                transient_errors.log_failure("claim failed, trying again after the poll interval", exc)
                return []
            not_recorded(self.alias, self.calls, outcomes, exc)
            if isinstance(exc, transient_errors.TRANSIENT):
                return []
            self.released = outcomes.released
            return self._claim(limit, is_async=False)
        outcomes.settle()
        self.released = outcomes.released
        return jobs

    def _write_and_claim(self, outcomes: OutcomeWrites, freed: list[str], limit: int) -> list[Job]:
        """One try of ``_record_and_claim``: the outcomes written, the queues they ``freed`` told."""
        connection = connections[self.alias]
        if not outcomes:
            return claim(connection, self._request(limit, is_async=False))
        # First the outcomes, then the claim: it may take a job they put back, or a slot they free.
        with transactions.short_transaction(connection):
            outcomes.write()
            for queue in freed:
                announce(self.alias, queue)
            return claim(connection, self._request(limit, is_async=False))

    def _loop_claims(self, loop_limit: int, threads_busy: bool) -> bool:
        """Whether the event loop claims this cycle (see ``LOOP_CLAIM_EVERY``); ``threads_busy``: the
        threads' claim brought jobs, or they are running some, or had no room to ask for any."""
        if loop_limit < 1:
            return False
        now = time.monotonic()
        if threads_busy and not self.slots.async_busy() and now - self.loop_claimed_at < LOOP_CLAIM_EVERY:
            return False
        self.loop_claimed_at = now
        return True

    def _claim(self, limit: int, is_async: bool) -> list[Job]:
        """A claim on its own (after outcomes were written apart, or the loop's); nothing it raises
        stops the worker."""
        if limit < 1:
            return []
        try:
            return transient_errors.retry(
                self.calls.timed(
                    "claim", lambda: claim(connections[self.alias], self._request(limit, is_async))
                ),
                what="claim",
                alias=self.alias,
                stop=self.stopping,
            )
        except Exception as exc:  # noqa: BLE001 - the next poll claims again
            # Database trouble gets here only once the worker is stopping:
            # a warning, not a traceback.
            transient_errors.log_failure("claim failed, trying again after the poll interval", exc)
            return []

    def _request(self, limit: int, is_async: bool) -> ClaimRequest:
        """A claim of up to ``limit`` jobs, coroutine jobs or others (``is_async``), leased from now;
        of none while the leases may lapse.

        Made when the statement is sent, not before: a claim retried after
        database trouble must not hand out leases that are already short,
        nor claim once the heartbeat has fallen behind.
        """
        now = clock.now()
        return ClaimRequest(
            worker_id=self.row.id,
            limit=0 if self.heartbeat.in_trouble() else limit,
            now=now,
            lease_until=now + timedelta(seconds=conf.lease),
            queues=self.options.queues,
            limits=self.limits,
            is_async=is_async,
            names=self.row.names,
            task_backends=self.row.task_backends,
        )

    def _report(self, finished: Finished) -> None:
        # A log line's arguments cost as much as the rest of a no-op job's
        # bookkeeping: with INFO off and no report callback, nothing to do.
        logged = logger.isEnabledFor(logging.INFO)
        if self.report is None and not logged:
            return
        for attempt, outcome in finished:
            if not outcome.started:
                continue
            job = attempt.job
            if logged:
                logger.info(
                    "%s job_id=%s name=%s outcome=%s duration=%.3fs",
                    outcome_text.sentence(job, outcome),
                    job.id,
                    job.name,
                    outcome_text.kind(outcome),
                    outcome.duration,
                )
            if self.report is not None:
                self.report(job, outcome)

    def _idle_timeout(self) -> float:
        """Sleep until the poll interval, or the next delayed job, whichever comes first."""
        timeout = conf.poll_interval
        next_due = self._next_run_after()
        if next_due is not None:
            until_due = (next_due - clock.now()).total_seconds()
            timeout = max(0.0, min(timeout, until_due))
        return timeout

    def _next_run_after(self) -> datetime | None:
        try:
            with self.calls.waiting("look up the next delayed job"):
                return Job.objects.using(self.alias).next_run_after(self.options.queues)
        except Exception as exc:  # noqa: BLE001 - the poll interval stands in for it
            logger.warning("could not look up the next delayed job; polling instead error=%r", exc)
            transient_errors.reset_connection(self.alias)
            return None
