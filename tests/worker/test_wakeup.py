"""How an idle worker hears of new jobs: the watcher ``start_watcher`` picks, by vendor and setting."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import override_settings

from vellum_jobs.worker import wakeup


@pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN_DATABASE is PostgreSQL's")
@pytest.mark.parametrize(
    ("listen_database", "how"),
    [(None, "LISTEN/NOTIFY"), ("default", "LISTEN/NOTIFY"), (False, "polling")],
)
def test_listen_database_false_makes_a_postgresql_worker_poll(listen_database, how):
    wake, stop = threading.Event(), threading.Event()
    with override_settings(VELLUM_JOBS={"LISTEN_DATABASE": listen_database}):
        started = wakeup.start_watcher("default", wake, stop)
    try:
        assert started == how
        if how != "polling":
            assert wake.wait(10), "the listener did not connect"  # it wakes the worker once listening
    finally:
        stop.set()
        for thread in threading.enumerate():
            if thread.name == "vellum-wakeup":
                thread.join(10)


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "sqlite", reason="the data_version watcher is SQLite's")
def test_a_write_seen_while_the_worker_is_awake_still_wakes_it_once_it_sleeps(monkeypatch):
    """A busy worker's watcher leaves the version unread while ``wake`` is set; the write it put
    off must wake the dispatcher as soon as it clears ``wake`` to sleep, not at the watcher's
    next look for writes inotify missed (put off here past the test's deadline)."""
    from tests.testapp import jobs

    monkeypatch.setattr(wakeup, "SQLITE_LOOK_EVERY", 60.0)
    wake, stop = threading.Event(), threading.Event()
    assert wakeup.start_watcher("default", wake, stop) == "PRAGMA data_version"
    try:
        jobs.add.enqueue(1, 2)  # a commit on another connection: the watcher is up once it wakes
        assert wake.wait(10), "the watcher did not see a commit"
        # The dispatcher is busy (wake set) when the next job is enqueued ...
        jobs.add.enqueue(3, 4)
        # ... for a while: the watcher meets the write with wake set (were it slower than
        # this, the test would take the plain path, and still pass).
        stop.wait(0.3)
        wake.clear()  # ... and then sleeps: the job enqueued meanwhile wakes it
        assert wake.wait(10), "a write seen while awake was lost"
    finally:
        stop.set()
        for thread in threading.enumerate():
            if thread.name == "vellum-wakeup":
                thread.join(10)
