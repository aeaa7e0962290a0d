"""The worker process in-process: slots, claims, leases, heartbeat, shutdown, wakeup."""

from __future__ import annotations

import signal
import statistics
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, connections
from django.db.backends.signals import connection_created
from django.test import override_settings
from django.utils import timezone

from tests.support.processes import wait_for
from tests.support.workers import Background, burst
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True)


# With the poll interval far away, only a real wakeup makes an idle worker fast.
WAKEUP = {"POLL_INTERVAL": 10}


def test_burst_runs_a_retry_that_came_due_while_its_thread_was_still_busy():
    """The timeout is recorded (the retry due at once) before the handler is back in its thread;
    with the event loop idle, the only claim that runs finds no coroutine job: --burst must wait
    for the thread, then run the retry."""
    job = jobs.slow_to_stop.enqueue()
    worker = burst(threads=1, async_workers=10)
    assert worker.slots.async_capacity == 10
    job.refresh_from_db()
    assert (job.state, job.result, job.attempts) == (Job.State.DONE, "attempt 2", 2)


def test_burst_runs_every_due_job_once_and_exits():
    created = jobs.record.enqueue_many([(i,) for i in range(40)])
    jobs.record.using(delay=3600).enqueue("later")
    burst(threads=4)
    assert Job.objects.filter(state=Job.State.DONE).count() == 40
    assert sorted(Execution.objects.values_list("job_id", flat=True)) == sorted(j.pk for j in created)
    assert Job.objects.get(args=["later"]).state == Job.State.QUEUED
    assert not Worker.objects.exists()


def test_max_jobs_stops_after_that_many():
    jobs.record.enqueue_many([(i,) for i in range(10)])
    worker = WorkerProcess(WorkerOptions(threads=2, max_jobs=3))
    assert worker.run() == 0
    assert Job.objects.filter(state=Job.State.DONE).count() == 3
    assert Job.objects.filter(state=Job.State.QUEUED).count() == 7


def test_queue_option_limits_what_is_claimed():
    jobs.record.using(queue="media").enqueue("m")
    jobs.record.using(queue="mail").enqueue("x")
    burst(threads=1, queues=["media"])
    assert Job.objects.get(queue="media").state == Job.State.DONE
    assert Job.objects.get(queue="mail").state == Job.State.QUEUED


def test_each_slot_thread_has_its_own_connection_closed_when_it_ends():
    opened: list[tuple[str, object]] = []

    def record_connection(sender, connection, **kwargs):
        opened.append((threading.current_thread().name, connection))

    jobs.sleep.enqueue_many([(0.2,)] * 8)
    connection_created.connect(record_connection)
    try:
        burst(threads=4)
    finally:
        connection_created.disconnect(record_connection)
    slots = {name: conn for name, conn in opened if name.startswith("vellum-slot-")}
    assert len(slots) == 4
    assert len({id(conn) for conn in slots.values()}) == 4
    assert all(conn.connection is None for conn in slots.values())


def test_a_handler_failure_never_kills_a_slot():
    failing = [jobs.boom.enqueue(), jobs.nonjson.enqueue(), jobs.exit_.enqueue(), jobs.interrupt.enqueue()]
    after = jobs.add.enqueue_many([(i, i) for i in range(4)])
    burst(threads=1)
    states = {j.pk: Job.objects.get(pk=j.pk).state for j in failing}
    assert states == {
        failing[0].pk: Job.State.QUEUED,  # retried later with backoff
        failing[1].pk: Job.State.DONE,
        failing[2].pk: Job.State.FAILED,
        failing[3].pk: Job.State.FAILED,
    }
    assert [Job.objects.get(pk=j.pk).result for j in after] == [0, 2, 4, 6]


def test_a_delayed_job_starts_at_its_run_after():
    # The worker is idle when the job arrives: it must learn of it (wakeup) and
    # then sleep until its run_after, not until the next poll, a minute away.
    # A loaded machine may start it seconds late; the poll would be a minute.
    with override_settings(VELLUM_JOBS={"LEASE": 3, "HEARTBEAT": 0.5, "POLL_INTERVAL": 60}):
        background = Background(threads=1)
        try:
            run_after = timezone.now() + timedelta(seconds=1)
            job = jobs.record.using(run_after=run_after).enqueue("x")
            wait_for(lambda: Job.objects.get(pk=job.pk).state == Job.State.DONE, what="delayed job")
        finally:
            background.stop()
    job.refresh_from_db()
    assert run_after <= job.started_at <= run_after + timedelta(seconds=20)


@pytest.mark.slow
def test_heartbeat_keeps_a_long_job_s_lease_alive(short_lease):
    # LEASE is 3 s here; the job runs for 5.
    job = jobs.sleep.enqueue(5)
    background = Background(threads=1)
    try:
        wait_for(lambda: Job.objects.get(pk=job.pk).state == Job.State.RUNNING, what="job start")
        first_lease = Job.objects.get(pk=job.pk).lease_expires_at
        wait_for(lambda: Job.objects.get(pk=job.pk).lease_expires_at > first_lease, what="lease renewal")
        wait_for(lambda: Job.objects.get(pk=job.pk).state == Job.State.DONE, what="job end")
    finally:
        background.stop()
    assert Execution.objects.filter(job_id=job.pk).count() == 1
    assert Job.objects.get(pk=job.pk).attempts == 1


def test_a_job_whose_worker_died_is_recovered_and_run_again(short_lease):
    now = timezone.now()
    job = Job.objects.create(
        name="test.record",
        args=["again"],
        state=Job.State.RUNNING,
        attempts=1,
        worker_id=uuid.uuid4(),
        started_at=now - timedelta(seconds=10),
        lease_expires_at=now - timedelta(seconds=1),
    )
    background = Background(threads=1)
    try:
        wait_for(lambda: Job.objects.get(pk=job.pk).state == Job.State.DONE, what="recovered job done")
    finally:
        background.stop()
    job.refresh_from_db()
    assert job.attempts == 2
    assert job.result == "again"


def test_stop_lets_a_job_within_the_grace_period_finish():
    job = jobs.sleep.enqueue(1)
    background = Background(threads=1, grace=10)
    wait_for(lambda: Execution.objects.filter(job_id=job.pk).exists(), what="job start")
    assert background.stop() == 0
    job.refresh_from_db()
    assert job.state == Job.State.DONE


def test_stop_hands_back_a_job_that_outlives_the_grace_period(tmp_path):
    release = tmp_path / "release"
    job = jobs.sleep.enqueue(30, release_file=str(release))
    other = jobs.record.enqueue("not started")
    background = Background(threads=1, grace=0.5)
    wait_for(lambda: Execution.objects.filter(job_id=job.pk).exists(), what="job start")
    started = time.monotonic()
    assert background.stop() == 0
    assert time.monotonic() - started < 5
    assert background.worker.abandoned_threads
    job.refresh_from_db()
    assert (job.state, job.attempts, job.worker_id) == (Job.State.QUEUED, 0, None)
    assert "handed back at shutdown" in job.error
    assert Job.objects.get(pk=other.pk).attempts == 0
    # The abandoned thread finishes later; the fence keeps its outcome out.
    release.touch()
    wait_for(lambda: Execution.objects.filter(job_id=job.pk, finished=True).exists(), what="thread end")
    time.sleep(0.2)
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED


def test_an_idle_worker_starts_a_new_job_quickly():
    settings = {"LEASE": 3, "HEARTBEAT": 0.5, **WAKEUP}
    latencies = []
    with override_settings(VELLUM_JOBS=settings):
        background = Background(threads=1)
        try:
            for i in range(20):
                time.sleep(0.05)  # let the worker go idle
                job = jobs.record.enqueue(i)
                wait_for(
                    lambda pk=job.pk: Job.objects.get(pk=pk).state == Job.State.DONE, timeout=5, what="pickup"
                )
                job.refresh_from_db()
                latencies.append((job.started_at - job.created_at).total_seconds())
        finally:
            background.stop()
    assert statistics.median(latencies) < 1.0, latencies


def disrupt(vendor: str) -> None:
    """Make the database unusable for the worker for a moment, the way each vendor fails."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            if vendor == "sqlite":
                cursor.execute("BEGIN IMMEDIATE")  # hold the write lock: "database is locked"
                time.sleep(1.5)
                cursor.execute("COMMIT")
            elif vendor == "postgresql":
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            else:
                cursor.execute(
                    "SELECT id FROM information_schema.processlist "
                    "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
                )
                for (thread_id,) in cursor.fetchall():
                    try:
                        cursor.execute(f"KILL {int(thread_id)}")
                    except OperationalError as error:
                        if error.args[0] != UNKNOWN_THREAD:  # it closed since the listing: cut already
                            raise
    finally:
        other.close()
        connection.close()  # the test's own connection was cut too: reconnect


# MariaDB/MySQL's error for a KILL of a connection that is gone.
UNKNOWN_THREAD = 1094


def all_done() -> bool:
    """Whether the 40 jobs are done, as the test's own connection can tell: the trouble cut it
    too, and on a loaded host its reconnection may time out (asked again at the next poll)."""
    try:
        return Job.objects.filter(state=Job.State.DONE).count() == 40
    except OperationalError:
        connection.close()
        return False


@override_settings(VELLUM_JOBS={"LEASE": 3, "HEARTBEAT": 0.5, "POLL_INTERVAL": 0.5, "BACKOFF_BASE": 0})
def test_the_worker_rides_out_database_trouble():
    # A handler whose own query hits the cut connection fails that attempt
    # (and is retried at once here); the worker itself must carry on.
    created = jobs.sleep.enqueue_many([(0.05,)] * 40)
    background = Background(threads=4)
    try:
        wait_for(lambda: Execution.objects.exists(), what="first job")
        disrupt(connection.vendor)
        wait_for(all_done, what="all done")
        assert [slot.is_alive() for slot in background.worker.slots.threads.threads] == [True] * 4
    finally:
        background.stop()
    assert Execution.objects.filter(finished=True).count() >= len(created)


def test_an_idle_worker_does_not_spin_on_due_jobs_it_may_not_claim():
    from tests.support.leases import claim_for
    from vellum_jobs import queues

    queues.pause("media")
    jobs.record.using(queue="media").enqueue("paused")
    jobs.keyed.enqueue_many([(1, 60), (1, 0)])
    claim_for(uuid.uuid4(), limit=1)  # another process holds acct:1
    statements: list[str] = []

    def count(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    def watch(sender, connection, **kwargs):
        connection.execute_wrappers.append(count)

    connection_created.connect(watch)
    try:
        worker = Background(threads=2)
        time.sleep(1.5)  # a rate needs a window: a spinning worker makes thousands of claims in it
        worker.stop()
    finally:
        connection_created.disconnect(watch)
    claims = [sql for sql in statements if "SKIP LOCKED" in sql or "RETURNING" in sql]
    # A claim per poll (0.5 s) and per wakeup, not a loop.
    assert len(claims) < 20, len(claims)
    assert Job.objects.filter(state=Job.State.QUEUED).count() == 2


def test_a_signal_while_the_dispatcher_holds_the_wake_lock_still_stops_the_worker():
    """A handler runs in the main thread, maybe mid ``wake.clear()``: it must take no lock there."""
    worker = WorkerProcess(WorkerOptions(threads=1))
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)
    previous = {signum: signal.getsignal(signum) for signum in handled}

    def deadlocked(signum: int, frame: object) -> None:
        raise AssertionError("the signal handler is waiting on a lock its own thread holds")

    # A lock wait is interrupted by a signal: an alarm ends a deadlock with a failure.
    signal.signal(signal.SIGALRM, deadlocked)
    signal.setitimer(signal.ITIMER_REAL, 5)
    try:
        worker.install_signal_handlers()
        with worker.wake._cond, worker.stopping._cond:
            signal.raise_signal(signal.SIGTERM)
            assert worker.signals.received == 1  # the handler ran, with both locks held
        signal.setitimer(signal.ITIMER_REAL, 0)
        wait_for(worker.stopping.is_set, what="the stop request")
        assert worker.wake.is_set()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
