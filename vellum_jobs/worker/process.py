"""A worker process: slot threads that run handlers, a dispatcher that claims for them
and records their outcomes, a heartbeat that keeps leases alive and recovers
lost jobs (``heartbeat``), a watch that ends the process when one of its
database calls never comes back (``silence``), and graceful shutdown.

The dispatcher (the thread that calls ``run()``) claims for the idle slots
in one statement, and with short jobs claims ahead: up to ``prefetch`` more,
as many as the threads can be expected to start within ``PREFETCH_WINDOW``
at the handlers' recent pace, so nothing is hoarded that another process
could run (a job with a one-second handler is never claimed ahead by a
4-thread worker). A prefetched job still starts in claim order, and one that
waited longer than ``PREFETCH_MAX_WAIT`` goes back to the queue, its attempt
not counted. Slots hand outcomes back, and the dispatcher writes all
outcomes that are waiting in one transaction with the next claim: with
short jobs that turns a commit per job into a commit per batch. Every wait
is on one ``Event`` that a new job, a finished handler or a shutdown sets.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from types import FrameType

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.backends.signals import connection_created

from vellum_jobs.conf import MAX_ASYNC_WORKERS, conf
from vellum_jobs.core import clock
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.enqueueing import registry
from vellum_jobs.execution import tracing
from vellum_jobs.execution.outcome import Outcome
from vellum_jobs.execution.outcome import unstarted as unstarted_outcome
from vellum_jobs.execution.outcome_writes import OutcomeWrites
from vellum_jobs.maintenance import retention, schedules
from vellum_jobs.store import leases, sql, transactions, transient_errors
from vellum_jobs.store.announce import announce
from vellum_jobs.store.claim import ClaimRequest, claim, record_and_claim
from vellum_jobs.worker import connections_held, heartbeat, silence, wakeup
from vellum_jobs.worker.eventloop import LoopSlots
from vellum_jobs.worker.runners import Runners
from vellum_jobs.worker.slots import Slots
from vellum_jobs.worker.timeouts import Watchdog

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

# A job handed back at shutdown while its handler may still run in this
# process (a thread, which nothing can stop, or a task on a blocked loop) is
# due only this long after: ``runjobs`` exits as soon as it has written it,
# so no other worker starts the job while this one's handler can still run.
RELEASE_MARGIN = 2.0

# The status of a process that stopped for its stuck threads (--max-stuck), asking to be restarted.
EXIT_STUCK = 3
# The status of a process that exited because one of its own database calls got no answer for
# MAX_DATABASE_WAIT (see ``silence``), asking to be restarted.
EXIT_SILENT = 5


def default_prefetch(threads: int) -> int:
    """Jobs a worker may claim ahead of its free threads, unless told otherwise.

    With no-op jobs on SQLite 32 per thread ran 10-15% more jobs a second
    than 16, in interleaved runs of the benchmark's drain; ``PREFETCH_WINDOW``
    still keeps jobs of more than a few milliseconds from filling it.
    """
    return 32 * threads


@dataclasses.dataclass
class WorkerOptions:
    threads: int = 4
    queues: Sequence[str] = ()
    burst: bool = False
    max_jobs: int | None = None
    grace: float = 30.0
    max_stuck: int | None = None
    alias: str = DEFAULT_DB_ALIAS
    prefetch: int | None = None  # None: default_prefetch(threads)
    async_workers: int | None = None  # coroutine jobs at once on the event loop; None: ASYNC_WORKERS


def async_capacity(asked: int | None) -> int:
    """How many coroutine jobs the process runs at once: none unless it has coroutine handlers.

    A Django task's function is only known once its job runs, so a project
    whose ``TASKS`` use this app's backend keeps the capacity too.
    """
    capacity = conf.async_workers if asked is None else asked
    if capacity and (registry.has_coroutine_handlers() or conf.task_backends()):
        return capacity
    return 0


class WorkerProcess:
    """One ``runjobs`` process. ``run()`` returns its exit code."""

    def __init__(self, options: WorkerOptions, report: Report | None = None) -> None:
        if options.threads < 1:
            raise ValueError(f"threads must be at least 1, got {options.threads}")
        if options.prefetch is not None and options.prefetch < 0:
            raise ValueError(f"prefetch must not be negative, got {options.prefetch}")
        if options.async_workers is not None and not 0 <= options.async_workers <= MAX_ASYNC_WORKERS:
            raise ValueError(f"async_workers must be 0 to {MAX_ASYNC_WORKERS}, got {options.async_workers}")
        self.options = options
        self.prefetch = default_prefetch(options.threads) if options.prefetch is None else options.prefetch
        self.pace: float | None = None  # running average of handler durations, seconds
        self.report = report
        self.id = uuid.uuid4()
        self.wake = threading.Event()
        self.tick_due = threading.Event()  # a scheduled instant came: the dispatcher ticks
        self.stopping = threading.Event()  # stop claiming
        self.stopped = threading.Event()  # stop the heartbeat and the watcher
        capacity = async_capacity(options.async_workers)
        self.loop = LoopSlots(capacity, self.id, self.stopping, self._finished) if capacity else None
        self.slots = Runners(Slots(options.threads, self.id, self.stopping, self._finished), self.loop)
        self.loop_claimed_at = 0.0  # when the loop's own claim last ran
        self.came_up_short = False  # the last cycle's claims found fewer jobs than they asked for
        self.claimed = 0
        self.signals_received = 0
        self.signal_pipe = -1  # written by the signal handler (install_signal_handlers)
        self.handed_back: list[Attempt] = []
        self.watchdog = Watchdog(options.grace)
        self.exit_code = 0
        self.wakeup_method = "polling"
        # Jobs with a concurrency key are left to workers that registered one.
        self.limits = registry.has_concurrency_limits()
        self.row = Worker(
            id=self.id,
            host=heartbeat.hostname(),
            pid=os.getpid(),
            queues=list(options.queues),
            threads=options.threads,
            async_workers=capacity,
            # What it claims: jobs of these names, and Django tasks of these aliases.
            names=registry.names(),
            task_backends=conf.task_backends(),
            unknown_tasks=[],
        )
        self.calls = silence.Calls()  # the dispatcher's and the heartbeat's, while they wait on the database
        self.heartbeat = heartbeat.Heartbeat(
            options.alias, self.row, self.slots, self.wake, self.stopped, self.calls
        )

    @property
    def alias(self) -> str:
        return self.options.alias

    @property
    def abandoned_threads(self) -> bool:
        """Whether slot threads are still inside handlers of handed-back or timed-out jobs."""
        return bool(self.handed_back or self.watchdog.timed_out)

    # -- lifecycle -------------------------------------------------------

    def run(self) -> int:
        connection_created.connect(sql.prepare_worker_connection)
        connection_created.connect(connections_held.on_connection_created)
        connections_held.remember(connections[self.alias])  # the dispatcher's, perhaps opened before
        self._prepare_tracing()
        watch = self._watch_silence()
        try:
            return self._run()
        finally:
            if watch is not None:
                watch.stop()

    def _run(self) -> int:
        if not self._register():
            logger.warning("worker stopped before it started worker_id=%s: no answer to record it", self.id)
            return self.exit_code
        self.wakeup_method = wakeup.start_watcher(self.alias, self.wake, self.stopped)
        self.heartbeat.start()
        scheduler = self._start(self._schedule, "vellum-scheduler") if self._tick() else None
        self.slots.start()
        logger.info(
            "worker started worker_id=%s threads=%d async_workers=%d queues=%s wakeup=%s",
            self.id,
            self.options.threads,
            self.slots.async_capacity,
            ",".join(self.options.queues) or "*",
            self.wakeup_method,
        )
        try:
            self._dispatch()
        finally:
            self._drain()
            self._stop_threads(scheduler)
            self._unregister()
            # Last: once the loop's tasks were cancelled and waited for, a
            # job handed back here has no handler left in this process but
            # those nothing can stop, and the process exits right after.
            if self.handed_back:
                self._hand_back(self.handed_back)
            connections.close_all()
            connection_created.disconnect(sql.prepare_worker_connection)
            connection_created.disconnect(connections_held.on_connection_created)
        logger.info(
            "worker stopped worker_id=%s jobs=%d handed_back=%d", self.id, self.claimed, len(self.handed_back)
        )
        return self.exit_code

    def _prepare_tracing(self) -> None:
        """Import OpenTelemetry here, before the slot threads and the event loop's thread start:
        two threads importing its modules for the first time at once can fail with Python's
        import deadlock error, which would fail a job, or stop the event loop's thread."""
        try:
            tracing.prepare()
        except Exception:  # an optional extra: jobs run without spans rather than not at all
            logger.exception("OpenTelemetry not prepared: attempts may not be traced")

    def _watch_silence(self) -> silence.Watch | None:
        """Start the thread that exits the process once a call of its own got no answer for
        ``MAX_DATABASE_WAIT``; none on SQLite, a file whose waits end with its busy timeout."""
        if connections[self.alias].vendor == "sqlite":
            return None
        watch = silence.Watch(self.calls, conf.max_database_wait, conf.heartbeat, self._silent)
        watch.start()
        return watch

    def _silent(self, what: str, waited: float) -> None:
        """Exit at once: a thread waits in a read that nothing in the process can interrupt, and the
        leases it may have renewed have lapsed (another worker may be running the jobs already)."""
        logger.error(
            "no answer from the database, exiting for a restart worker_id=%s waiting_for=%r waited=%.1fs "
            "max_database_wait=%gs held=%d exit_code=%d",
            self.id,
            what,
            waited,
            conf.max_database_wait,
            len(self.slots.held_attempts()),
            EXIT_SILENT,
        )
        silence.exit_now(EXIT_SILENT)

    def _finished(self) -> None:
        """A slot handed an outcome back. The dispatcher clears ``wake`` before it collects outcomes,
        so one already set will see this one: setting it again would only cost a lock."""
        if not self.wake.is_set():
            self.wake.set()

    def request_stop(self) -> None:
        """Stop claiming and shut down gracefully (what the first SIGTERM does)."""
        self.stopping.set()
        self.wake.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the worker gracefully; a second one stops it at once.

        Python runs a signal handler in the main thread between two
        bytecodes, perhaps while the dispatcher there holds the lock inside
        ``wake``; a handler that set that Event would wait for itself forever.
        So the handler takes no lock: it writes the signal to a pipe, and a
        thread of its own turns that into the stop request.
        """
        read_fd, self.signal_pipe = os.pipe()
        self._start(lambda: self._relay_signal(read_fd), "vellum-signals")
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals_received += 1
        if self.signals_received > 1:
            # The second signal means now: running jobs are left to their
            # leases, which another worker recovers once they lapse.
            os.write(2, b"vellum-jobs: second signal, exiting at once\n")
            os._exit(1)
        os.write(self.signal_pipe, bytes([signum]))

    def _relay_signal(self, read_fd: int) -> None:
        signum = os.read(read_fd, 1)[0]
        logger.info(
            "shutdown requested signal=%s grace=%.0fs", signal.Signals(signum).name, self.options.grace
        )
        self.request_stop()

    def _start(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    def _stop_threads(self, scheduler: threading.Thread | None) -> None:
        self.slots.stop(wait=not self.abandoned_threads)
        self.stopped.set()
        self.wake.set()
        self.heartbeat.join(timeout=5)
        if scheduler is not None:
            scheduler.join(timeout=5)

    # -- dispatcher ------------------------------------------------------

    def _dispatch(self) -> None:
        while True:
            self.wake.clear()
            self._tick_if_due()
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
            self.wake.wait(self._wait_time(self.came_up_short))

    def _burst_done(self, limit: int, jobs: list[Job], nothing_held: bool) -> bool:
        """Whether a ``--burst`` worker may exit: nothing held, no handler running, and the
        threads' claim asked for jobs and found none.

        A handler still running may be one whose timeout was recorded before
        it came back: its retry, due at once, is for the thread it frees, and
        the event loop's claim (of coroutine jobs only) would not see it.
        """
        return nothing_held and not self.slots.busy() and limit > 0 and not jobs

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

    def _collect(self) -> tuple[list[tuple[Attempt, Outcome]], int, int]:
        """The outcomes to record this cycle (handed back, then timed out), the idle slots and the
        tasks the event loop may still start."""
        finished, idle, free = self._take_finished()
        finished += self._expire(returned={attempt for attempt, _ in finished})
        return finished, idle, free

    def _take_finished(self) -> tuple[list[tuple[Attempt, Outcome]], int, int]:
        """Outcomes handed back by the slots and the loop, the idle slots and the loop's free capacity."""
        batch, idle, free = self.slots.take_finished()
        for attempt, outcome in batch:
            outcome.late = self.watchdog.returned(attempt)
            if attempt.on_loop:  # the pace is the threads': it decides what they claim ahead
                continue
            self.pace = (
                outcome.duration
                if self.pace is None
                else (self.pace + PACE_WEIGHT * (outcome.duration - self.pace))
            )
        return batch, idle, free

    def _expire(self, returned: set[Attempt]) -> list[tuple[Attempt, Outcome]]:
        """Timed-out outcomes for attempts past their deadline; acts on stuck slots.

        Jobs in ``returned`` are held still, but their handlers came back with
        an outcome this very cycle records: that one is the attempt's outcome.
        """
        now = time.monotonic()
        running = [attempt for attempt in self.slots.held_attempts() if attempt not in returned]
        expired = self.watchdog.expire(running, now)
        stuck = self.watchdog.stuck(now)
        self.row.stuck = len(stuck)
        limit = self.options.max_stuck
        if limit is not None and len(stuck) >= limit and not self.stopping.is_set():
            logger.error(
                "too many stuck slots, exiting for a restart stuck=%d max_stuck=%d", len(stuck), limit
            )
            self.exit_code = EXIT_STUCK
            self.request_stop()
        return expired

    def _wait_time(self, idle: bool) -> float:
        """How long the dispatcher may sleep: until a poll, a delayed job or a deadline."""
        timeout = self._idle_timeout() if idle else conf.poll_interval
        deadline = self.watchdog.next_deadline(self.slots.held_attempts())
        if deadline is not None:
            timeout = max(0.0, min(timeout, deadline - time.monotonic()))
        return timeout

    def _cycle(
        self,
        finished: list[tuple[Attempt, Outcome]],
        limit: int,
        unstarted: Sequence[Attempt] = (),
        loop_limit: int = 0,
    ) -> list[Job]:
        """Record ``finished`` outcomes, put ``unstarted`` (prefetched) attempts back in the queue and
        claim up to ``limit`` jobs for the threads, in one transaction; then up to ``loop_limit``
        coroutine jobs for the event loop. Returns the jobs claimed.

        Nothing here stops the worker. Outcomes the database refuses are
        written one at a time (the job with the offending value fails), and
        then the claim runs on its own.
        """
        finished = finished + [(attempt, unstarted_outcome()) for attempt in unstarted]
        outcomes = OutcomeWrites(finished)

        # A finished job with a concurrency key frees a slot that a job
        # another process serves may be waiting for (PostgreSQL: a NOTIFY,
        # delivered on commit; SQLite wakes on any write anyway).
        freed = sorted({a.job.queue for a, _ in finished if a.job.concurrency_key})

        def write_and_claim() -> list[Job]:
            connection = connections[self.alias]
            if not outcomes:
                return claim(connection, self._request(limit, is_async=False))
            if sql.of(connection).records_with_claim and not (freed or outcomes.requeue()):
                # One statement: one round trip a cycle. Its claim sees the
                # table as it was before the outcomes, so a cycle whose
                # outcomes free a concurrency slot or put a job back in the
                # queue writes them first (the claim may take that job).
                return outcomes.write_with(
                    lambda writes: record_and_claim(connection, self._request(limit, is_async=False), writes)
                )
            with transactions.short_transaction(connection):
                outcomes.write()
                for queue in freed:
                    announce(self.alias, queue)
                return claim(connection, self._request(limit, is_async=False))

        try:
            # Unwritten outcomes are worth a lease of retrying (after that the
            # jobs are recovered anyway); a bare claim retries until shutdown.
            jobs = transient_errors.retry(
                self.calls.timed("record outcomes and claim", write_and_claim),
                what="record outcomes and claim",
                alias=self.alias,
                give_up_after=conf.lease if outcomes else None,
                stop=None if outcomes else self.stopping,
            )
        except transient_errors.TRANSIENT:
            logger.exception("outcomes not recorded count=%d", len(outcomes))
            jobs = []
        except Exception:
            if not outcomes:
                logger.exception("claim failed, trying again after the poll interval")
                jobs = []
            else:
                logger.exception(
                    "outcomes refused together, writing them one at a time count=%d", len(outcomes)
                )
                with self.calls.waiting("record outcomes one at a time"):
                    outcomes.write_each(self.alias)
                jobs = self._claim(limit, is_async=False)
        else:
            outcomes.settle()
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
        self.slots.release([attempt for attempt, _ in finished])
        self.slots.submit(jobs, coroutines)
        # Jobs put back unstarted do not count towards --max-jobs.
        self.claimed += len(jobs) + len(coroutines) - len(unstarted)
        self._report(finished)
        return jobs + coroutines

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
        except Exception:
            logger.exception("claim failed, trying again after the poll interval")
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
            worker_id=self.id,
            limit=0 if self.heartbeat.in_trouble() else limit,
            now=now,
            lease_until=now + timedelta(seconds=conf.lease),
            queues=self.options.queues,
            limits=self.limits,
            is_async=is_async,
            names=self.row.names,
            task_backends=self.row.task_backends,
        )

    def _report(self, finished: list[tuple[Attempt, Outcome]]) -> None:
        # A log line's arguments cost as much as the rest of a no-op job's
        # bookkeeping: with INFO off and no report callback, nothing to do.
        if self.report is None and not logger.isEnabledFor(logging.INFO):
            return
        for attempt, outcome in finished:
            if not outcome.started:
                continue
            job = attempt.job
            logger.info(
                "job finished job_id=%s name=%s outcome=%s duration=%.3fs",
                job.id,
                job.name,
                outcome.label if outcome.applied else "discarded",
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
            logger.warning("could not look up the next delayed job error=%r", exc)
            transient_errors.reset_connection(self.alias)
            return None

    # -- schedules -------------------------------------------------------

    def _tick(self) -> bool:
        """Enqueue the schedules' due instants (a missed one included); False when there are no schedules.

        Runs once before the first claim, so a ``--burst`` worker catches up too.
        """
        if not schedules.declared():
            return False
        try:
            with self.calls.waiting("schedule tick"):
                ticked = schedules.tick(self.alias)
            if ticked:
                self.wake.set()
        except Exception:  # a schedule must never stop the worker; the next instant tries again
            logger.exception("schedule tick failed")
            transient_errors.reset_connection(self.alias)
        return True

    def _tick_if_due(self) -> None:
        if self.tick_due.is_set():
            self.tick_due.clear()
            self._tick()

    def _schedule(self) -> None:
        """Have the dispatcher tick at each scheduled instant, until shutdown starts.

        This thread only keeps time. The tick runs on the dispatcher's
        connection: a few statements a minute are not worth one more
        connection per process (see ``connections_held``).
        """
        while True:
            wait = schedules.seconds_until_next()
            if wait is None or self.stopping.wait(wait):
                return
            self.tick_due.set()
            self.wake.set()

    # -- shutdown --------------------------------------------------------

    def _drain(self) -> None:
        """Wait for running jobs (up to the grace period after a stop request); hand back the rest."""
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
        # A handler that came back gives up its attempt: should its outcome
        # not be recorded, the lease brings the job back, the attempt counted.
        # The others are handed back once the threads and the loop are stopped.
        self.handed_back = [attempt for attempt in self.slots.held_attempts() if not attempt.returned]

    def _hand_back(self, unfinished: list[Attempt]) -> None:
        """Release the jobs of ``unfinished``: due now if their handler has come back (a coroutine
        cancelled at shutdown), ``RELEASE_MARGIN`` from now if it may still run (a thread, or a task
        on a blocked loop), which is after this process has exited."""
        reason = f"handed back at shutdown: still running after the {self.options.grace:g}s grace period"
        now = clock.now()
        later = now + timedelta(seconds=RELEASE_MARGIN)
        try:
            handed = transient_errors.retry(
                self.calls.timed(
                    "hand back jobs",
                    lambda: leases.hand_back(
                        self.alias, unfinished, reason, due=lambda attempt: now if attempt.returned else later
                    ),
                ),
                what="hand back jobs",
                alias=self.alias,
                give_up_after=10,
            )
        except Exception as exc:  # noqa: BLE001 - the leases bring the jobs back
            logger.error("jobs not handed back; their leases will lapse error=%r", exc)
            handed = 0
        ids = [attempt.job.pk for attempt in unfinished]
        logger.warning("jobs handed back at shutdown count=%d ids=%s", handed, ids)

    def _register(self) -> bool:
        """Record the worker row, past transient trouble; any other error a third time running
        stops the start. False when the process is told to stop before the row is recorded: it
        holds nothing yet, so it stops cleanly rather than with the database's error."""
        attempt = 0
        while True:
            attempt += 1
            try:
                transient_errors.retry(
                    self.calls.timed("register worker", lambda: heartbeat.register(self.alias, self.row)),
                    what="register worker",
                    stop=self.stopping,
                )
                return True
            except DatabaseError as exc:
                if self.stopping.is_set():
                    return False
                if attempt == 3:
                    raise
                logger.warning("worker row not recorded, trying again error=%r", exc)
                transient_errors.reset_connection(self.alias)
                time.sleep(transient_errors.backoff(attempt))

    def _unregister(self) -> None:
        with self.calls.waiting("release the retention lock"):
            retention.let_go(self.alias, self.id, clock.now())
        try:
            transient_errors.retry(
                self.calls.timed("unregister worker", lambda: heartbeat.unregister(self.alias, self.id)),
                what="unregister worker",
                alias=self.alias,
                give_up_after=5,
            )
        except Exception as exc:  # noqa: BLE001 - shutdown goes on; the row shows as stale
            logger.warning("worker row not removed; it will show as stale error=%r", exc)
