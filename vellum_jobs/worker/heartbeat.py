"""The heartbeat of a worker process: its leases renewed, its row kept fresh, the duties scheduled.

Every ``HEARTBEAT`` a thread renews the leases of the jobs the process
holds, delivers cancellation requests to their handlers, records the worker
row (with the attempts finished and the memory held), learns from it
whether someone asked the process to stop (``stop_request``), and
performs the duties every process shares for the whole queue
(``maintenance.duties``: recovering any worker's lapsed leases, the outcome
figures, retention, unknown names). A beat that fails, for any reason,
is logged and tried again at the next one.

The trick is the lease watch. Once no beat has renewed the leases for
``LEASE`` minus one ``HEARTBEAT``, they are about to lapse and another worker
may take the jobs over: the process must claim nothing more and ask its
handlers to stop. The heartbeat thread cannot be the one to notice, since it
may be stuck in a statement on a dead connection; so the check reads a clock
and nothing else. The dispatcher asks ``in_trouble()`` before it claims, and
a second thread, which never touches the database, asks the handlers to stop.
The cost: beats that are only slow (a lock held longer than a lease) stop
the process claiming too, until a beat gets through. A beat that never gets
through (a network path gone silent) ends the process once it has waited
``MAX_DATABASE_WAIT`` (``silence``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import IntegrityError, connections

from vellum_jobs.conf import conf
from vellum_jobs.core import clock, registry
from vellum_jobs.core.models import Worker
from vellum_jobs.execution import cancellation
from vellum_jobs.maintenance.duties import Duties
from vellum_jobs.store import leases, transient_errors
from vellum_jobs.worker import connections_held, memory
from vellum_jobs.worker.runners import Runners
from vellum_jobs.worker.silence import Calls

logger = logging.getLogger("vellum_jobs")

# Rows of workers gone this long are deleted; until then the admin and
# jobstats show them as stale, which is how a crash gets noticed.
FORGET_WORKERS_AFTER = timedelta(hours=1)


class Heartbeat:
    """Keeps the leases of the jobs in ``slots`` alive, and says when they may lapse."""

    def __init__(
        self,
        alias: str,
        row: Worker,
        slots: Runners,
        wake: threading.Event,
        stopped: threading.Event,
        calls: Calls | None = None,
        duties: Duties | None = None,
        on_stop_requested: Callable[[str], None] | None = None,
    ) -> None:
        self.alias = alias
        self.row = row
        self.slots = slots
        self.wake = wake  # set when the dispatcher has something to claim: recovered jobs, or trouble over
        self.stopped = stopped
        self.calls = calls or Calls()  # its calls while they wait, for the silence watch
        self.lock = threading.Lock()  # over renewed_at and trouble, which two threads change
        self.renewed_at = time.monotonic()  # when the last beat that renewed the leases started
        self.trouble = ""  # why the process stopped claiming; "" while it claims
        self.beat_started: float | None = None  # while a beat runs
        self.last_error = ""
        self.threads: list[threading.Thread] = []
        # What it does for the whole queue; recovered jobs wake the dispatcher.
        self.duties = duties or Duties(alias, row.id, recovered=wake.set)
        # Told once, with who asked, when the row says someone asked the process to stop.
        self.on_stop_requested = on_stop_requested
        self.stop_requested_by: str | None = None

    def start(self) -> None:
        """Start beating, and watching that the beats keep the leases alive."""
        self.renewed_at = time.monotonic()
        for target, name in (
            (self._beat_until_stopped, "vellum-heartbeat"),
            (self._watch, "vellum-lease-watch"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self.threads.append(thread)

    def join(self, timeout: float) -> None:
        for thread in self.threads:
            thread.join(timeout)

    def in_trouble(self) -> bool:
        """Whether the leases may lapse before a beat renews them; the process then claims nothing."""
        return time.monotonic() - self.renewed_at > conf.lease - conf.heartbeat

    def beat(self, now: datetime) -> None:
        """Renew the leases, deliver cancellations, record the row, perform the queue's duties.

        Never raises. When the renewal fails because the database is out of
        reach, the rest waits for the next beat; any other failure still lets
        the worker row, and so its trouble, be recorded.
        """
        self.beat_started = started = time.monotonic()
        try:
            with self.calls.waiting("heartbeat"):
                self._beat(now, started)
        finally:
            self.beat_started = None

    def check(self) -> None:
        """Go into trouble once the leases are about to lapse; while in it, ask the handlers to stop.

        Asked again at every check, for attempts claimed just before.
        """
        with self.lock:
            if not self.in_trouble():
                return
            overdue = time.monotonic() - self.renewed_at
            entered, cause = not self.trouble, self._cause()
            if entered:
                self.trouble = f"leases not renewed for {overdue:.1f}s ({cause})"[:255]
        if entered:
            logger.error(
                "leases about to lapse, not claiming and asking running jobs to stop: not renewed for %.1fs "
                "of a %gs lease worker_id=%s renewed_ago=%.1fs lease=%gs held=%d cause=%s",
                overdue,
                conf.lease,
                self.row.id,
                overdue,
                conf.lease,
                len(self.slots.held_attempts()),
                cause,
            )
        self.slots.ask_to_stop()

    # -- threads ---------------------------------------------------------

    def _beat_until_stopped(self) -> None:
        try:
            while not self.stopped.wait(conf.heartbeat):
                self.beat(clock.now())
            self._last_figures()
        finally:
            connections.close_all()

    def _last_figures(self) -> None:
        """Add the outcomes written since the last beat: the worker stops once its outcomes are written."""
        try:
            with self.calls.waiting("heartbeat"):
                self.duties.last_figures(clock.now())
        except Exception as exc:  # noqa: BLE001 - the process stops all the same, without them
            logger.warning(
                "last outcome figures not recorded at shutdown; the dashboard misses them error=%r", exc
            )

    def _watch(self) -> None:
        while not self.stopped.wait(self._until_next_check()):
            self.check()

    def _until_next_check(self) -> float:
        if self.trouble:
            return conf.heartbeat
        until_trouble = self.renewed_at + conf.lease - conf.heartbeat - time.monotonic()
        return max(0.01, min(conf.heartbeat, until_trouble + 0.01))

    # -- one beat --------------------------------------------------------

    def _beat(self, now: datetime, started: float) -> None:
        attempts = self.slots.held_attempts()
        held = [attempt.job.pk for attempt in attempts]
        try:
            leases.renew(self.alias, self.row.id, held, now + timedelta(seconds=conf.lease))
            self._renewed(started)
        except Exception as exc:  # noqa: BLE001 - a heartbeat must outlive any failure
            self._failed(exc)
            if isinstance(exc, transient_errors.TRANSIENT):
                return  # the database is out of reach: the rest would fail, or wait, too
        try:
            told = cancellation.deliver(attempts, cancellation.requested(self.alias, held))
            for attempt in told:
                logger.info(
                    "%s #%s asked to cancel; its handler sees should_stop() job_id=%s name=%s",
                    attempt.job.name,
                    attempt.job.pk,
                    attempt.job.pk,
                    attempt.job.name,
                )
            self.slots.cancel(told)
            self.row.trouble = self.trouble
            self.row.async_running = self.slots.async_busy()
            self.row.connections = connections_held.held(self.alias)
            self.row.prefetched = self.slots.waiting_ids()
            self.row.clock_offset = clock.measure(self.alias)
            self.row.unknown_tasks = registry.unresolved()
            self.row.memory = memory.resident_set_size()
            asked_by = record(self.alias, self.row, now)
            if asked_by is not None and self.stop_requested_by is None:
                self.stop_requested_by = asked_by
                if self.on_stop_requested is not None:
                    self.on_stop_requested(asked_by)
            self.duties.perform(now)
        except Exception as exc:  # noqa: BLE001 - a heartbeat must outlive any failure
            self._failed(exc)

    def _renewed(self, started: float) -> None:
        """Leases renewed by the beat that ``started``: trouble ends if that was recent enough."""
        with self.lock:
            self.renewed_at = max(self.renewed_at, started)
            self.last_error = ""
            if not self.trouble or self.in_trouble():
                return
            ended, self.trouble = self.trouble, ""
        logger.warning("leases renewed again, claiming resumes worker_id=%s was=%r", self.row.id, ended)
        self.wake.set()

    def _failed(self, exc: Exception) -> None:
        self.last_error = repr(exc)
        transient_errors.log_failure("heartbeat failed, retrying next beat", exc)
        transient_errors.reset_connection(self.alias)

    def _cause(self) -> str:
        started = self.beat_started
        if started is not None and time.monotonic() - started > conf.heartbeat:
            return f"a beat has waited {time.monotonic() - started:.1f}s for the database"
        return f"beats fail: {self.last_error}" if self.last_error else "no beat got through"


# -- the worker row ------------------------------------------------------


def register(alias: str, worker: Worker) -> None:
    """Insert the worker row; a row an earlier try inserted (whose reply was lost) is as good."""
    connections[alias].ensure_connection()  # counted in the row, as it will be at every beat
    worker.connections = connections_held.held(alias)
    worker.clock_offset = clock.measure(alias)  # before the first claim judges what is due
    worker.started_at = worker.last_heartbeat = clock.now()
    try:
        worker.save(using=alias, force_insert=True)
    except IntegrityError:
        if not Worker.objects.using(alias).filter(pk=worker.pk).exists():
            raise


def record(alias: str, worker: Worker, now: datetime) -> str | None:
    """Record that ``worker`` is alive, and its trouble (recreating its row if something deleted it);
    who asked it to stop, if someone did.

    A row with no stop request is written by one UPDATE that says so; only
    a row with one costs a second statement and a read.
    """
    worker.last_heartbeat = now
    alive = Worker.objects.using(alias).filter(pk=worker.pk)
    changes = {
        "stuck": worker.stuck,
        "trouble": worker.trouble,
        "connections": worker.connections,
        "prefetched": worker.prefetched or [],
        "async_running": worker.async_running,
        "clock_offset": worker.clock_offset,
        "unknown_tasks": worker.unknown_tasks or [],
        "jobs_run": worker.jobs_run,
        "memory": worker.memory,
    }
    asked_by = None
    if not alive.filter(stop_requested_at=None).update(last_heartbeat=now, **changes):
        if alive.update(last_heartbeat=now, **changes):
            asked_by = alive.values_list("stop_requested_by", flat=True).first()
        else:
            worker.save(using=alias, force_insert=True)
    Worker.objects.using(alias).filter(last_heartbeat__lt=now - FORGET_WORKERS_AFTER).delete()
    return asked_by


def unregister(alias: str, worker_id: uuid.UUID) -> None:
    Worker.objects.using(alias).filter(pk=worker_id).delete()


def hostname() -> str:
    return socket.gethostname()
