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
