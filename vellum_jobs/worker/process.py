"""A worker process: its lifecycle, and the parts it wires together.

Slot threads (and an event loop, for coroutine jobs) run handlers
(``runners``); a dispatcher claims for them and records their outcomes
(``dispatcher``); a heartbeat keeps leases alive and performs the queue's
duties (``heartbeat``); a timer keeps time for the schedules
(``schedule_timer``); a watch ends the process when one of its database
calls never comes back (``silence``). ``run()`` records the worker row,
starts the parts, dispatches until shutdown, then drains the runners, hands
back what they still hold (``hand_back``) and removes the row.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.backends.signals import connection_created

from vellum_jobs.conf import MAX_ASYNC_WORKERS, conf
from vellum_jobs.core import clock, registry
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Worker
from vellum_jobs.execution import tracing
from vellum_jobs.maintenance.duties import Duties
from vellum_jobs.store import sql, transient_errors
from vellum_jobs.worker import connections_held, heartbeat, silence, stop_request, wakeup
from vellum_jobs.worker.dispatcher import Dispatcher, Report
from vellum_jobs.worker.event_loop import EventLoop
from vellum_jobs.worker.hand_back import hand_back
from vellum_jobs.worker.runners import Runners
from vellum_jobs.worker.schedule_timer import ScheduleTimer
from vellum_jobs.worker.slots import Slots
from vellum_jobs.worker.stop_signals import StopSignals
from vellum_jobs.worker.watchdog import Watchdog

logger = logging.getLogger("vellum_jobs")

# The status of a process that stopped for its stuck threads (--max-stuck), asking to be restarted.
EXIT_STUCK = 3
# The status of a process that exited because one of its own database calls got no answer for
# MAX_DATABASE_WAIT (see ``silence``), asking to be restarted.
EXIT_SILENT = 5


def default_prefetch(threads: int) -> int:
    """Jobs a worker may claim ahead of its free threads, unless told otherwise.

    With no-op jobs on SQLite 32 per thread ran 10-15% more jobs a second
    than 16, in interleaved runs of the benchmark's drain;
    ``dispatcher.PREFETCH_WINDOW`` still keeps jobs of more than a few
    milliseconds from filling it.
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

    def check(self) -> None:
        """Raise ``ValueError`` for options no process can run with."""
        if self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        if self.prefetch is not None and self.prefetch < 0:
            raise ValueError(f"prefetch must not be negative, got {self.prefetch}")
        if self.async_workers is not None and not 0 <= self.async_workers <= MAX_ASYNC_WORKERS:
            raise ValueError(f"async_workers must be 0 to {MAX_ASYNC_WORKERS}, got {self.async_workers}")


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
        options.check()
        self.options = options
        self.id = uuid.uuid4()
        self.wake = threading.Event()
        self.stopping = threading.Event()  # stop claiming
        self.stopped = threading.Event()  # stop the heartbeat and the watcher
        capacity = async_capacity(options.async_workers)
        self.loop = EventLoop(capacity, self.id, self.stopping, self._finished) if capacity else None
        self.slots = Runners(Slots(options.threads, self.id, self.stopping, self._finished), self.loop)
        self.handed_back: list[Attempt] = []
        self.watchdog = Watchdog(options.grace)
        self.exit_code = 0
        self.wakeup_method = "polling"
        self.row = self._row(capacity)
        self.calls = silence.Calls()  # the dispatcher's and the heartbeat's, while they wait on the database
        self.duties = Duties(options.alias, self.id, recovered=self.wake.set)
        # The pid of the runjobs --processes that started this one, if one did.
        self.supervisor = stop_request.take_supervisor()
        self.heartbeat = heartbeat.Heartbeat(
            options.alias,
            self.row,
            self.slots,
            self.wake,
            self.stopped,
            self.calls,
            self.duties,
            on_stop_requested=self._stop_requested,
        )
        self.schedule = ScheduleTimer(options.alias, self.calls, self.wake, self.stopping)
        self.dispatcher = Dispatcher(
            options,
            prefetch=default_prefetch(options.threads) if options.prefetch is None else options.prefetch,
            row=self.row,
            slots=self.slots,
            heartbeat=self.heartbeat,
            schedule=self.schedule,
            watchdog=self.watchdog,
            calls=self.calls,
            wake=self.wake,
            stopping=self.stopping,
            on_stuck=self._stuck,
            report=report,
        )
        self.signals = StopSignals(self.request_stop, options.grace)

    def _row(self, async_workers: int) -> Worker:
        """The worker row this process records, and its heartbeat keeps fresh."""
        return Worker(
            id=self.id,
            host=heartbeat.hostname(),
            pid=os.getpid(),
            queues=list(self.options.queues),
            threads=self.options.threads,
            async_workers=async_workers,
            # What it claims: jobs of these names, and Django tasks of these aliases.
            names=registry.names(),
            task_backends=conf.task_backends(),
            unknown_tasks=[],
        )

    @property
    def alias(self) -> str:
        return self.options.alias

    @property
    def abandoned_threads(self) -> bool:
        """Whether slot threads are still inside handlers of handed-back or timed-out jobs."""
        return bool(self.handed_back or self.watchdog.timed_out)

    def request_stop(self) -> None:
        """Stop claiming and shut down gracefully (what the first SIGTERM does)."""
        self.stopping.set()
        self.wake.set()

    def _stop_requested(self, by: str) -> None:
        """Someone asked for a graceful stop through the worker row (the admin): stop as on SIGTERM.
        Under ``runjobs --processes`` the supervisor is asked to stop its whole set, since it would
        restart a process that stopped alone (``stop_request``)."""
        supervisor = stop_request.stop_supervisor(self.supervisor)
        logger.warning(
            "%s asked this worker to stop: it stops gracefully, as on SIGTERM"
            " worker_id=%s by=%r grace=%.0fs%s",
            by or "someone",
            self.id,
            by,
            self.options.grace,
            f" supervisor_pid={self.supervisor} (its processes stop too)" if supervisor else "",
        )
        self.request_stop()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the worker gracefully; a second one stops it at once (``stop_signals``)."""
        self.signals.install()

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
            logger.warning(
                "worker stopped before it started: the database did not answer to record it worker_id=%s",
                self.id,
            )
            return self.exit_code
        self.wakeup_method = wakeup.start_watcher(self.alias, self.wake, self.stopped)
        self.heartbeat.start()
        self.schedule.start()
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
            self.dispatcher.run()
        finally:
            self.handed_back = self.dispatcher.drain()
            self._stop_threads()
            self._unregister()
            # Last: once the loop's tasks were cancelled and waited for, a
            # job handed back here has no handler left in this process but
            # those nothing can stop, and the process exits right after.
            if self.handed_back:
                hand_back(self.alias, self.handed_back, self.options.grace, self.calls)
            connections.close_all()
            connection_created.disconnect(sql.prepare_worker_connection)
            connection_created.disconnect(connections_held.on_connection_created)
        logger.info(
            "worker stopped after claiming %d jobs, %d handed back worker_id=%s jobs=%d handed_back=%d",
            self.dispatcher.claimed,
            len(self.handed_back),
            self.id,
            self.dispatcher.claimed,
            len(self.handed_back),
        )
        return self.exit_code

    def _prepare_tracing(self) -> None:
        """Import OpenTelemetry here, before the slot threads and the event loop's thread start:
        two threads importing its modules for the first time at once can fail with Python's
        import deadlock error, which would fail a job, or stop the event loop's thread."""
        try:
            tracing.prepare()
        except Exception:  # an optional extra: jobs run without spans rather than not at all
            logger.exception("OpenTelemetry not prepared; attempts may not be traced")

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

    def _stuck(self, stuck: int) -> None:
        """Stop for a restart: ``stuck`` slots, ``--max-stuck`` or more, are in handlers that outlived
        their timeout and its grace period."""
        logger.error(
            "too many stuck slots (%d, --max-stuck %d), exiting for a restart stuck=%d max_stuck=%d",
            stuck,
            self.options.max_stuck,
            stuck,
            self.options.max_stuck,
        )
        self.exit_code = EXIT_STUCK
        self.request_stop()

    def _stop_threads(self) -> None:
        self.slots.stop(wait=not self.abandoned_threads)
        self.stopped.set()
        self.wake.set()
        self.heartbeat.join(timeout=5)
        self.schedule.join(timeout=5)

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
            self.duties.let_go(clock.now())
        try:
            transient_errors.retry(
                self.calls.timed("unregister worker", lambda: heartbeat.unregister(self.alias, self.id)),
                what="unregister worker",
                alias=self.alias,
                give_up_after=5,
            )
        except Exception as exc:  # noqa: BLE001 - shutdown goes on; the row shows as stale
            logger.warning("worker row not removed at exit; it shows as stale until pruned error=%r", exc)
