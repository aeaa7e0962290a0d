"""The connections a worker process holds: counted in every thread, and at most workers + 4."""

from __future__ import annotations

import json
import signal
import threading
import uuid
import weakref
from collections.abc import Iterator

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.signals import connection_created

from tests.support.processes import Runjobs, wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.worker import connections_held

pytestmark = pytest.mark.django_db(transaction=True)


def listeners() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "vellum-wakeup"]


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Remember connections as a worker process does while it runs, from none."""
    # An in-process worker of an earlier test leaves its wakeup listener to notice the stop
    # within a second, and it counts its connection till then.
    wait_for(lambda: not listeners(), what="earlier tests' wakeup listeners to end")
    monkeypatch.setattr(connections_held, "_wrappers", weakref.WeakSet())
    connection_created.connect(connections_held.on_connection_created)
    yield
    connection_created.disconnect(connections_held.on_connection_created)


def test_a_thread_s_connection_counts_while_it_is_open(counting):
    opened, release = threading.Event(), threading.Event()
    before = connections_held.held(DEFAULT_DB_ALIAS)  # what the wakeup listener of another test may hold

    def use_the_database() -> None:
        try:
            Job.objects.exists()
            opened.set()
            release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=use_the_database)
    thread.start()
    try:
        assert opened.wait(10)
        assert connections_held.held(DEFAULT_DB_ALIAS) == before + 1
        assert connections_held.held("another alias") == 0
    finally:
        release.set()
        thread.join(10)
    assert connections_held.held(DEFAULT_DB_ALIAS) == before


def test_a_connection_opened_outside_django_counts_for_its_alias_while_it_is_held():
    before = connections_held.held(DEFAULT_DB_ALIAS)
    with connections_held.holding(DEFAULT_DB_ALIAS):
        assert connections_held.held(DEFAULT_DB_ALIAS) == before + 1
        assert connections_held.held("another alias") == 0
    assert connections_held.held(DEFAULT_DB_ALIAS) == before


def test_the_budget_is_a_connection_per_slot_and_four_more():
    assert [connections_held.budget(threads) for threads in (1, 2, 16)] == [5, 6, 20]


# A schedule that ticks every second: its ticks must not cost a connection of their own.
EVERY_SECOND = {"ticker": {"job": "test.add", "cron": "* * * * * *", "args": [1, 1], "timezone": "UTC"}}


def backends(application_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name]
        )
        return int(cursor.fetchone()[0])


@pytest.mark.runjobs
@pytest.mark.skipif(connection.vendor != "postgresql", reason="counts backends in pg_stat_activity")
def test_a_busy_runjobs_process_holds_as_many_backends_as_its_row_shows_at_most_workers_plus_4(tmp_path):
    release = tmp_path / "release"
    # Jobs that end first, in cycles of more outcomes than threads now and then (200 short jobs
    # on two threads): the recorder opens its connection for those (a cycle of fewer outcomes
    # writes them with its claim).
    first = jobs.add.enqueue_many([(1, 1)] * 200)[-1]
    held = [jobs.sleep.enqueue(60, release_file=str(release)) for _ in range(2)]
    name = f"vellum-connections-{uuid.uuid4().hex[:12]}"
    worker = Runjobs(
        "--workers",
        "2",
        env={"VELLUM_TEST_APPLICATION_NAME": name, "VELLUM_TEST_SCHEDULES": json.dumps(EVERY_SECOND)},
    )
    try:
        # Both slots inside handlers that used the database, and the schedule ticking.
        wait_for(lambda: Job.objects.get(pk=first.pk).state == Job.State.DONE, what="the short jobs' end")
        wait_for(
            lambda: Execution.objects.filter(job_id__in=[j.pk for j in held]).count() == 2, what="slots busy"
        )
        wait_for(lambda: Job.objects.filter(name="test.add").count() >= 2, what="two ticks")

        def row_and_server_agree() -> tuple[int, int] | None:
            row = Worker.objects.filter(pid=worker.pid).first()
            seen = backends(name)
            return (row.connections, seen) if row is not None and row.connections == seen else None

        shown, seen = wait_for(row_and_server_agree, what="the worker row to show the backends it holds")
        # Two slots, the dispatcher, the recorder, the heartbeat and the LISTEN connection.
        assert shown == seen == connections_held.budget(2) == 2 + 4
    finally:
        release.touch()
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()[1][-3000:]
    wait_for(lambda: backends(name) == 0, what="the backends to end with the process")
