"""Outcomes written beside the claims, on the recorder's own connection (PostgreSQL, MariaDB/MySQL)."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
from django.db import connection

from tests.support.processes import wait_for
from tests.testapp import jobs
from vellum_jobs.core.models import Job
from vellum_jobs.store import sql
from vellum_jobs.worker import recorder
from vellum_jobs.worker.dispatcher import Dispatcher
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess
from vellum_jobs.worker.silence import Calls

records_apart = pytest.mark.skipif(
    not sql.of(connection).records_apart, reason="SQLite writes outcomes with the claim"
)


def test_outcomes_wait_in_order_and_a_dispatcher_that_runs_ahead_waits_for_room(monkeypatch):
    go = threading.Event()
    written: list[list[str]] = []
    told: list[list[str]] = []

    def slow_record(alias, calls, finished):
        assert go.wait(60), "the test never let the recorder write"
        written.append(list(finished))
        return 0

    monkeypatch.setattr(recorder, "record", slow_record)
    writer = recorder.Recorder(
        "default", Calls(), lambda finished, released: told.append(list(finished)), threading.Event(), 2
    )
    writer.start()
    writer.put(["a"])
    wait_for(lambda: writer.writing and not writer.pending, what="the first batch taken")
    writer.put(["b", "c"])  # two wait: no room for more
    room: list[bool] = []
    ahead = threading.Thread(target=lambda: room.append(writer.put(["d"]) is None))
    ahead.start()
    ahead.join(0.2)
    assert ahead.is_alive() and not room  # still waiting for room
    assert not writer.idle()
    go.set()
    ahead.join(60)
    assert room == [True]
    writer.stop()
    assert written == told == [["a"], ["b", "c"], ["d"]]
    assert writer.idle()


@records_apart
@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_runs_a_retry_written_after_a_claim_that_found_nothing(monkeypatch):
    """The first attempt fails and its retry is due at once. Its outcome is written only after the
    next claim found nothing, and its attempt released before the worker looks whether it holds
    anything: a --burst worker that trusted that claim would exit with the retry queued."""
    job = jobs.flaky.enqueue(2)
    came_up_empty = False
    claim, record = Dispatcher._claim, recorder.record

    def claim_then_let_the_recorder_finish(self, limit, is_async):
        nonlocal came_up_empty
        claimed = claim(self, limit, is_async)
        if limit > 0 and not claimed and not is_async and not came_up_empty:
            came_up_empty = True
            wait_for(self.recorder.idle, what="the failed attempt's outcome written and released")
        return claimed

    def record_after_that_claim(alias, calls, finished):
        wait_for(lambda: came_up_empty, what="a claim that found nothing")
        return record(alias, calls, finished)

    monkeypatch.setattr(Dispatcher, "_claim", claim_then_let_the_recorder_finish)
    monkeypatch.setattr(recorder, "record", record_after_that_claim)
    WorkerProcess(WorkerOptions(threads=1, burst=True, prefetch=0)).run()
    job.refresh_from_db()
    assert came_up_empty
    assert (job.state, job.attempts, job.result) == (Job.State.DONE, 2, 2)


@pytest.mark.django_db(transaction=True)
def test_a_job_is_freed_once_its_outcome_is_recorded_without_waiting_for_the_cycle_collector():
    """A job and its attempt refer to each other; left linked, every job of a drain waited for
    the cycle collector, several MiB of a worker's memory at its peak."""
    jobs.add.enqueue_many([(i, i) for i in range(20)])
    ran: list[weakref.ref[Job]] = []
    gc.collect()
    gc.disable()
    try:
        worker = WorkerProcess(
            WorkerOptions(threads=2, burst=True), report=lambda job, outcome: ran.append(weakref.ref(job))
        )
        worker.run()
        alive = [ref() for ref in ran if ref() is not None]
    finally:
        gc.enable()
    assert len(ran) == 20
    assert alive == []


@records_apart
@pytest.mark.django_db(transaction=True)
def test_a_report_that_raises_is_logged_and_later_outcomes_are_still_written(caplog):
    jobs.add.enqueue_many([(i, i) for i in range(5)])

    def report(job, outcome):
        raise RuntimeError("the report broke")

    worker = WorkerProcess(WorkerOptions(threads=1, burst=True, prefetch=0), report=report)
    # On a thread of its own: a recorder that died with the report would leave it waiting for good.
    running = threading.Thread(target=worker.run, daemon=True)
    running.start()
    running.join(60)
    assert not running.is_alive(), "the worker never finished: its recorder stopped writing"
    assert Job.objects.filter(state=Job.State.DONE).count() == 5
    assert "the worker's bookkeeping of them failed" in caplog.text
    assert not Job.objects.filter(state=Job.State.RUNNING).exists()
