"""A session cut off in the middle of a transaction keeps its row locks on the server; the upkeep
other workers do (maintenance locks, recovery, the rollup) waits for them only so long.

The cut-off session is played by a thread of the test process that opens a
transaction, writes or locks rows, and neither commits nor closes until the
test lets it go: to the server, just like a worker whose network path went
silent between two statements of one transaction.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

from tests.support.leases import claim_for, recover_lapsed
from tests.support.processes import Runjobs, beats, wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.conf import conf
from vellum_jobs.core.models import Job, MaintenanceLock, QueueMinute, Worker
from vellum_jobs.maintenance import schedules, unknown_names
from vellum_jobs.store import lock_waits, locks, rollup

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        os.environ.get("VELLUM_TEST_DB", "sqlite") == "sqlite",
        reason="SQLite has no row locks: its busy timeout bounds every wait for its one write lock",
    ),
]

# How long the cut-off session holds its rows unless the test lets go first:
# a wait that is not bounded ends there, and the test then fails.
HOLD = 60.0


@contextmanager
def cut_off_session(write: Callable[[], object]) -> Iterator[threading.Event]:
    """A session that runs ``write`` in a transaction and then holds it open (until the block ends,
    or ``HOLD`` seconds); yields an event that is set while it still holds its rows."""
    holding, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                write()
                holding.set()
                release.wait(HOLD)
                holding.clear()
                transaction.set_rollback(True)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            failures.append(exc)
        finally:
            holding.clear()
            connection.close()

    thread = threading.Thread(target=hold, name="cut-off session")
    thread.start()
    try:
        wait_for(lambda: holding.is_set() or bool(failures), what="the cut-off session's rows")
        assert not failures, failures
        yield holding
    finally:
        release.set()
        thread.join(HOLD + 10)


def lock_row_inserted(name: str) -> Callable[[], object]:
    """The first take of maintenance lock ``name``, not committed: its INSERT holds the key."""
    return lambda: MaintenanceLock.objects.create(name=name, holder="cut off", locked_until=timezone.now())


def job_rows_locked(*pks: int) -> Callable[[], object]:
    """A write to these jobs begun and not committed (an outcome write cut off): their rows locked."""
    return lambda: list(Job.objects.select_for_update().filter(pk__in=pks))


def test_taking_a_maintenance_lock_whose_first_insert_a_cut_off_session_holds_fails_after_the_bound():
    with cut_off_session(lock_row_inserted("unknown_names")) as holding:
        with pytest.raises(OperationalError) as raised:
            locks.acquire("default", "unknown_names", "me", timezone.now(), timezone.now())
        assert lock_waits.timed_out("default", raised.value)
        assert holding.is_set(), "the wait ended only when the cut-off session let go"
    # And the connection is as good as before: the lock is taken once the row is free.
    assert locks.acquire("default", "unknown_names", "me", timezone.now(), timezone.now())


def test_the_unknown_name_check_logs_a_lock_wait_that_ran_out_as_a_warning_and_goes_on(caplog):
    caplog.set_level(logging.WARNING, logger="vellum_jobs")
    holder = uuid.uuid4()
    with cut_off_session(lock_row_inserted(unknown_names.LOCK)) as holding:
        assert unknown_names.run_if_due("default", holder, timezone.now()) is None
        assert holding.is_set()
    (record,) = [r for r in caplog.records if "unknown-name check failed" in r.getMessage()]
    assert (record.levelname, record.exc_info) == ("WARNING", None)
    assert "OperationalError" in record.getMessage()


def test_recovery_leaves_a_job_whose_row_a_cut_off_session_holds_and_recovers_the_others(caplog):
    caplog.set_level(logging.WARNING, logger="vellum_jobs")
    held, free = jobs.add.enqueue_many([(1, 1), (2, 2)])
    claim_for(uuid.uuid4())  # a worker that is gone: nobody renews these leases
    later = timezone.now() + timedelta(seconds=2 * conf.lease)

    with cut_off_session(job_rows_locked(held.pk)) as holding:
        assert recover_lapsed(now=later) == [(free.pk, "queued")]
        assert holding.is_set(), "recovery returned while the row was still held"
    assert Job.objects.get(pk=held.pk).state == "running"
    assert any(
        f"job #{held.pk} not recovered yet: another session holds its row" in r.getMessage()
        for r in caplog.records
    )

    # Once the session lets go, a later beat recovers it.
    assert recover_lapsed(now=later) == [(held.pk, "queued")]


def test_a_flush_of_the_figures_whose_minute_a_cut_off_session_holds_fails_and_keeps_its_tally():
    now = timezone.now()
    rollup.TALLY.take()  # what in-process runs of other tests counted
    rollup.add("default", Counter({(rollup.minute_of(now), "default", rollup.DONE): 1}))
    minute = QueueMinute.objects.filter(queue="default")

    with cut_off_session(lambda: minute.update(done=F("done") + 10)) as holding:
        rollup.count(now, "default", rollup.DONE, 2)
        with pytest.raises(OperationalError) as raised:
            rollup.flush("default", now)
        assert lock_waits.timed_out("default", raised.value)
        assert holding.is_set()
    rollup.flush("default", now)  # the next beat's
    assert minute.get().done == 3


def test_a_schedule_tick_whose_instant_a_cut_off_session_is_enqueueing_fails_and_a_later_one_enqueues_it():
    daily = {"job": "test.add", "cron": "0 3 * * *", "args": [1, 2], "timezone": "UTC"}
    first_seen, instant = datetime(2026, 1, 5, 12, tzinfo=UTC), datetime(2026, 1, 6, 3, tzinfo=UTC)
    # The test settings' HEARTBEAT kept, so the tick waits one of them, not the default ten seconds.
    with override_settings(VELLUM_JOBS={**settings.VELLUM_JOBS, "SCHEDULES": {"daily": daily}}):
        schedules.tick("default", first_seen)
        # Another worker's tick of the instant, cut off before it committed: the instant's job
        # and the schedule's row are its.
        with cut_off_session(lambda: schedules.tick("default", instant)) as holding:
            with pytest.raises(OperationalError) as raised:
                schedules.tick("default", instant + timedelta(seconds=1))
            assert lock_waits.timed_out("default", raised.value)
            assert holding.is_set()
        # The server ended that session: a later tick enqueues the instant.
        [job] = schedules.tick("default", instant + timedelta(seconds=2))
    assert job.scheduled_for == instant


@pytest.mark.runjobs
def test_a_worker_keeps_beating_recovering_and_running_jobs_while_a_cut_off_session_holds_rows():
    # The cut-off session took the unknown-name lock for the first time, and was writing the
    # outcome of a job of a worker that is now gone, when its path went silent.
    stuck, lapsed = jobs.record.enqueue_many([("stuck",), ("lapsed",)])
    claim_for(uuid.uuid4())
    Job.objects.filter(pk__in=[stuck.pk, lapsed.pk]).update(lease_expires_at=timezone.now())  # it is gone

    def cut_off() -> None:
        lock_row_inserted(unknown_names.LOCK)()
        job_rows_locked(stuck.pk)()

    worker = None
    try:
        with cut_off_session(cut_off) as holding:
            worker = Runjobs("--workers", "2", env={"VELLUM_LOG_LEVEL": "INFO"})
            wait_for(lambda: Worker.objects.filter(pid=worker.pid).exists(), what="the worker's row")
            beats(worker, 3)
            fresh = jobs.record.enqueue("fresh")
            wait_for(
                lambda: Job.objects.filter(pk__in=[lapsed.pk, fresh.pk], state="done").count() == 2,
                what="the lapsed job recovered and run, and a new job run",
            )
            log = worker.output()[1]
            assert f"job #{stuck.pk} not recovered yet: another session holds its row" in log
            assert "unknown-name check failed" in log
            assert holding.is_set(), "the worker got on only once the cut-off session let go"

        # Let go (the server ended the session), its job is recovered too, and run once.
        wait_for(lambda: Job.objects.get(pk=stuck.pk).state == "done", what="the stuck job recovered and run")
        assert Execution.objects.filter(job_id=stuck.pk).count() == 1
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
    finally:
        if worker is not None:
            worker.stop()
            print("worker:", worker.output()[1][-8000:], sep="\n")  # shown if the test fails
