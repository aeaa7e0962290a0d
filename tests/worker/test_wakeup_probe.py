"""The MariaDB/MySQL wakeup probe: what counts as news, and a real idle ``runjobs`` woken by it."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, connections, transaction

from tests.support.processes import Runjobs, wait_for
from tests.testapp import jobs
from vellum_jobs.core.models import Job
from vellum_jobs.worker.wakeup_probe import HOLE_PATIENCE, HOLE_SPAN, Sighting

# -- what counts as news (no database) -----------------------------------


def sighting(top: int = 10) -> Sighting:
    return Sighting(floor=top, top=top)


def test_nothing_new_is_no_news():
    seen = sighting()
    assert [seen.news(10, 0, now=t) for t in range(3)] == [False, False, False]
    assert not seen.missing


def test_a_new_job_is_news_once():
    seen = sighting()
    assert seen.news(11, 1, now=0) is True
    assert (seen.floor, seen.missing) == (11, False)
    assert seen.news(11, 0, now=1) is False


def test_a_job_committed_after_a_later_numbered_one_is_news_when_it_lands():
    seen = sighting()
    assert seen.news(12, 1, now=0) is True  # 12 committed, 11 still in its transaction
    assert (seen.floor, seen.missing) == (10, True)
    assert seen.news(12, 1, now=1) is False
    assert seen.news(12, 2, now=2) is True  # 11 committed
    assert (seen.floor, seen.missing) == (12, False)


def test_a_missing_id_is_given_up_after_its_patience():
    seen = sighting()
    seen.news(12, 1, now=0)
    seen.news(12, 1, now=HOLE_PATIENCE + 1)  # 11 was rolled back
    assert (seen.floor, seen.missing) == (12, False)
    assert seen.news(12, 0, now=HOLE_PATIENCE + 2) is False


def test_a_missing_id_is_given_up_when_too_many_ids_lie_above_it():
    seen = sighting()
    seen.news(12, 1, now=0)
    seen.news(12 + HOLE_SPAN, HOLE_SPAN, now=1)
    assert (seen.floor, seen.missing) == (12 + HOLE_SPAN, False)


def test_deleted_newest_jobs_start_the_count_again_lower():
    seen = sighting(top=500)
    assert seen.news(0, 0, now=0) is True
    assert seen.floor == 0
    assert seen.news(1, 1, now=1) is True
    assert seen.floor == 1


# -- a real runjobs on MariaDB/MySQL -------------------------------------

mysql_only = pytest.mark.skipif(
    connection.vendor != "mysql", reason="the probe is the MariaDB/MySQL wakeup; others have theirs"
)

# A poll far away: a job started within seconds was woken by the probe.
ENV = {"VELLUM_TEST_POLL": "30s", "VELLUM_LOG_LEVEL": "INFO"}
PICKUP = 3.0
CONNECTED = re.compile(r"wakeup probe connected connection_id=(\d+)")


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def probe_connections(worker: Runjobs) -> list[int]:
    return [int(found) for found in CONNECTED.findall(worker.output()[1])]


def settle(worker: Runjobs) -> None:
    """Let the worker run a job and go idle: once its outcome is written, its claim came up empty."""
    first = jobs.record.enqueue("first")
    wait_for(lambda: state(first) == Job.State.DONE, timeout=PICKUP + 30, what="the first job")


@contextmanager
def probed_worker() -> Iterator[Runjobs]:
    """A ``runjobs`` of two threads whose probe has connected, stopped on the way out."""
    worker = Runjobs("--workers", "2", env=ENV)
    try:
        wait_for(lambda: probe_connections(worker), what="the probe to connect")
        yield worker
    finally:
        worker.stop()


def assert_woken(worker: Runjobs) -> None:
    settle(worker)
    job = jobs.record.enqueue("woken")
    wait_for(lambda: state(job) == Job.State.DONE, timeout=PICKUP, what="the probe to wake the worker")


@pytest.mark.runjobs
@mysql_only
@pytest.mark.django_db(transaction=True)
def test_an_idle_worker_picks_up_a_new_job_long_before_its_poll():
    with probed_worker() as worker:
        for _ in range(3):
            assert_woken(worker)


@pytest.mark.runjobs
@mysql_only
@pytest.mark.django_db(transaction=True)
def test_a_job_whose_transaction_commits_late_is_picked_up_when_it_commits():
    with probed_worker() as worker:
        settle(worker)
        with transaction.atomic():
            late = jobs.record.enqueue("late")  # a lower id, not yet visible
            early = enqueue_elsewhere("early")
            # READ COMMITTED: this transaction sees the early job's commit and outcome.
            wait_for(lambda: state(early) == Job.State.DONE, timeout=PICKUP, what="the early job")
        wait_for(lambda: state(late) == Job.State.DONE, timeout=PICKUP, what="the late job")
        assert late.pk < early.pk


@pytest.mark.runjobs
@mysql_only
@pytest.mark.django_db(transaction=True)
def test_the_probe_reconnects_after_its_connection_is_killed_and_still_wakes_the_worker():
    with probed_worker() as worker:
        [killed] = probe_connections(worker)
        with connection.cursor() as cursor:
            cursor.execute(f"KILL {int(killed)}")
        wait_for(lambda: len(probe_connections(worker)) == 2, what="the probe to reconnect")
        assert "wakeup probe lost its connection" in worker.output()[1]
        assert probe_connections(worker)[1] != killed
        assert_woken(worker)
        assert worker.process.poll() is None


def enqueue_elsewhere(value: str) -> Job:
    """Enqueue on another connection, committed at once (the test's own is inside a transaction)."""
    result = []

    def run() -> None:
        try:
            result.append(jobs.record.enqueue(value))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return result[0]
