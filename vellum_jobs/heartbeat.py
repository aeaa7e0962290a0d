"""The heartbeat of a worker process: its leases renewed, its row kept fresh, lost jobs recovered.

Every ``HEARTBEAT`` a thread renews the leases of the jobs the process
holds, delivers cancellation requests to their handlers, records the worker
row, requeues any worker's jobs whose lease lapsed, and runs retention.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from datetime import datetime, timedelta

from django.db import connections
from django.utils import timezone

from vellum_jobs import cancellation, executor, leases, retention, transient, wakeup
from vellum_jobs.conf import conf
from vellum_jobs.models import Worker
from vellum_jobs.slots import Slots

logger = logging.getLogger("vellum_jobs")

# Rows of workers gone this long are deleted; until then the admin and
# jobstats show them as stale, which is how a crash gets noticed.
FORGET_WORKERS_AFTER = timedelta(hours=1)


class Heartbeat:
    """Keeps the leases of the jobs in ``slots`` alive."""

    def __init__(
        self, alias: str, row: Worker, slots: Slots, wake: threading.Event, stopped: threading.Event
    ) -> None:
        self.alias = alias
        self.row = row
        self.slots = slots
        self.wake = wake  # set when the dispatcher has something to claim: recovered jobs
        self.stopped = stopped
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        thread = threading.Thread(target=self._beat_until_stopped, name="vellum-heartbeat", daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self, timeout: float) -> None:
        for thread in self.threads:
            thread.join(timeout)

    def beat(self, now: datetime) -> None:
        """Renew the leases, deliver cancellations, record the row, recover lapsed leases, prune."""
        attempts = self.slots.held_attempts()
        held = [attempt.job.pk for attempt in attempts]
        try:
            leases.renew(self.alias, self.row.id, held, now + timedelta(seconds=conf.lease))
            for attempt in cancellation.deliver(attempts, cancellation.requested(self.alias, held)):
                logger.info("cancellation requested job_id=%s name=%s", attempt.job.pk, attempt.job.name)
            record(self.alias, self.row, now)
            self._recover(now)
            retention.run_if_due(self.alias, self.row.id, now)
        except transient.TRANSIENT as exc:
            logger.warning("heartbeat failed, retrying next beat error=%r", exc)
            transient.reset_connection(self.alias)

    def _beat_until_stopped(self) -> None:
        try:
            while not self.stopped.wait(conf.heartbeat):
                self.beat(timezone.now())
        finally:
            connections.close_all()

    def _recover(self, now: datetime) -> None:
        recovered = leases.recover_expired(self.alias, now)
        if recovered:
            self.wake.set()
            # Recovered jobs, and the concurrency slots they held, are free for other processes too.
            wakeup.announce(self.alias, "")
            executor.report_lost(self.alias, recovered)


# -- the worker row ------------------------------------------------------


def register(alias: str, worker: Worker) -> None:
    worker.save(using=alias, force_insert=True)


def record(alias: str, worker: Worker, now: datetime) -> None:
    """Record that ``worker`` is alive (recreating its row if something deleted it)."""
    worker.last_heartbeat = now
    if not Worker.objects.using(alias).filter(pk=worker.pk).update(last_heartbeat=now, stuck=worker.stuck):
        worker.save(using=alias, force_insert=True)
    Worker.objects.using(alias).filter(last_heartbeat__lt=now - FORGET_WORKERS_AFTER).delete()


def unregister(alias: str, worker_id: uuid.UUID) -> None:
    Worker.objects.using(alias).filter(pk=worker_id).delete()


def hostname() -> str:
    return socket.gethostname()
