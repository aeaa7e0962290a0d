"""A worker whose link to the database goes silent for good exits for a restart; its job runs elsewhere.

First the watch over the worker's own calls in-process, on a clock the test
drives; then real ``runjobs`` processes behind a proxy. The proxy
(``tests.support.tcpproxy``) stops forwarding while its sockets stay open, and is
never healed: a stuck middlebox. No TCP timeout notices (the proxy's
own kernel acknowledges every byte and answers the keepalives), and a new
connection waits in its listen backlog. So the worker's own calls wait in
reads that nothing interrupts: it asks its handlers to stop when its leases
are about to lapse (as in ``test_partition``, whose link comes back in time),
and exits with status 5 once one of those calls has waited
``MAX_DATABASE_WAIT`` (its default, ``LEASE`` plus two ``HEARTBEAT`` intervals:
4 s with the tests' settings), for its process manager to start it again. The proxy is raw TCP, so
the same test runs on PostgreSQL and on MariaDB.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import threading
from datetime import datetime

import pytest
from django.db import OperationalError, connection
from django.db.models.functions import Now

from tests.support.processes import SHORT_LEASE, Runjobs, children_of, wait_for
from tests.support.tcpproxy import Proxy
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.conf import conf
from vellum_jobs.core.models import Job
from vellum_jobs.worker import silence
from vellum_jobs.worker.process import EXIT_SILENT

VENDOR = os.environ.get("VELLUM_TEST_DB", "sqlite")


# -- the watch, on a clock the test drives ---------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watching(limit: float = 4.0) -> tuple[Clock, silence.Watch, list[tuple[str, float]]]:
    """A watch over calls timed by a driven clock, and what it reported."""
    clock, reported = Clock(), []
    watch = silence.Watch(
        silence.Calls(clock), limit, every=0.5, on_silence=lambda *call: reported.append(call)
    )
    return clock, watch, reported


def test_a_call_that_waits_past_the_limit_is_reported_with_what_it_waits_for():
    clock, watch, reported = watching()
    with watch.calls.waiting("heartbeat"):
        clock.now += 3.9
        assert watch.look(asked=clock.now) == pytest.approx(0.1)  # it looks again at the limit
        assert reported == []
        clock.now += 0.1
        watch.look(asked=clock.now)
    assert reported == [("heartbeat", pytest.approx(4.0))]
    watch.look(asked=clock.now)
    assert len(reported) == 1  # that call is over


def test_a_database_that_is_down_answers_every_call_with_an_error_and_nothing_is_reported():
    clock, watch, reported = watching()
    for _ in range(100):  # a minute of refused connections, retried with backoff
        with contextlib.suppress(OperationalError), watch.calls.waiting("claim"):
            clock.now += 0.1
            raise OperationalError("connection refused")
        clock.now += 0.5
        assert watch.look(asked=clock.now) == 0.5
    assert reported == []


def test_a_mark_within_another_leaves_the_outer_one_standing():
    clock, watch, _ = watching()
    with watch.calls.waiting("record outcomes one at a time"):
        clock.now += 1
        with watch.calls.waiting("claim"):
            clock.now += 1
        assert watch.calls.longest() == ("record outcomes one at a time", 2.0)
    assert watch.calls.longest() is None


def test_time_in_which_the_watch_did_not_run_is_no_call_s_wait():
    clock, watch, reported = watching()
    with watch.calls.waiting("claim"):  # from 100.0
        asked = clock.now + 0.5
        clock.now += 60  # the process was stopped (SIGSTOP) for a minute: the watch wakes late
        watch.look(asked)
        assert watch.calls.longest() == ("claim", pytest.approx(0.5))  # waited until it was stopped
        clock.now += 3.4
        watch.look(asked=clock.now)
        assert reported == []
        clock.now += 0.1
        watch.look(asked=clock.now)
    assert reported == [("claim", pytest.approx(4.0))]


def test_the_watch_thread_reports_a_call_that_never_comes_back():
    answer, reported = threading.Event(), queue.Queue[tuple[str, float]]()
    calls = silence.Calls()
    watch = silence.Watch(calls, 0.2, every=0.05, on_silence=lambda *call: reported.put(call))

    def call() -> None:
        with calls.waiting("claim"):
            answer.wait(60)

    thread = threading.Thread(target=call)
    thread.start()
    watch.start()
    try:
        what, waited = reported.get(timeout=60)
        assert what == "claim" and waited >= 0.2
    finally:
        answer.set()
        thread.join()
        watch.stop()
    assert not watch.thread.is_alive()


# -- real workers behind a proxy that goes silent ---------------------------


# The environment variables of tests/settings.py that point a runjobs at the proxy.
HOST_AND_PORT = {"postgresql": ("PGHOST", "PGPORT"), "mariadb": ("MYSQL_HOST", "MYSQL_PORT")}
DEFAULT_PORT = {"postgresql": 5432, "mariadb": 3306}

EXITED = re.compile(
    r"no answer from the database, exiting for a restart worker_id=\S+ waiting_for='([^']+)' "
    r"waited=([\d.]+)s max_database_wait=([\d.]+)s held=(\d+) exit_code=5"
)
NOTICED = "leases about to lapse, not claiming and asking running jobs to stop"


# The default bound, LEASE plus two HEARTBEATs, for the workers cut off here (tests/settings.py
# gives every other process a minute).
MAX_DATABASE_WAIT = SHORT_LEASE + 2 * conf.heartbeat


def exit_deadline() -> float:
    """How long the test gives a cut-off worker to exit: its bound, and plenty for a loaded machine."""
    return MAX_DATABASE_WAIT + SHORT_LEASE + 60


@pytest.fixture
def proxy():
    settings = connection.settings_dict
    proxy = Proxy((settings["HOST"] or "127.0.0.1", int(settings["PORT"] or DEFAULT_PORT[VENDOR])))
    yield proxy
    proxy.close()


def through(proxy: Proxy) -> dict[str, str]:
    """A runjobs environment whose every connection goes through ``proxy``, its log at INFO."""
    host, port = HOST_AND_PORT[VENDOR]
    return {
        host: "127.0.0.1",
        port: str(proxy.port),
        "VELLUM_LOG_LEVEL": "INFO",
        "VELLUM_TEST_MAX_DATABASE_WAIT": f"{MAX_DATABASE_WAIT:g}s",
    }


def executions(job: Job) -> list[tuple[int, int]]:
    return sorted(Execution.objects.filter(job_id=job.pk).values_list("attempt", "pid"))


def running_behind_the_proxy(job: Job, pid: int) -> None:
    """Wait until ``job`` runs in ``pid`` and a beat has renewed its lease: the heartbeat's
    connection is open, so the cut leaves a beat waiting on it."""
    wait_for(lambda: executions(job) == [(1, pid)], what="the job running behind the proxy")
    claimed = lease_of(job)
    wait_for(lambda: lease_of(job) > claimed, what="a renewal")


def lease_of(job: Job) -> datetime:
    lease = Job.objects.get(pk=job.pk).lease_expires_at
    assert lease is not None
    return lease


def done(job: Job) -> bool:
    return Job.objects.filter(pk=job.pk, state=Job.State.DONE).exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(VENDOR == "sqlite", reason="SQLite is a file: no network link to go silent")
class TestBehindASilentProxy:
    @pytest.mark.parametrize("query", [False, True], ids=["polite-handler", "handler-in-a-query"])
    def test_a_worker_whose_link_goes_silent_for_good_exits_5_and_another_runs_its_job(self, proxy, query):
        cut_off = Runjobs("--workers", "1", env=through(proxy))
        rescuer: Runjobs | None = None
        try:
            job = jobs.until_stopped.enqueue(query)
            running_behind_the_proxy(job, cut_off.pid)
            proxy.cut()

            # A handler stuck in its own query (never hearing the request to stop) keeps no thread
            # from ending with the process.
            assert cut_off.wait(timeout=exit_deadline()) == EXIT_SILENT
            # Its lease had lapsed by then, by the database's clock: the exit cost the job nothing.
            assert Job.objects.filter(pk=job.pk, lease_expires_at__lt=Now()).exists()
            log = cut_off.output()[1]
            (exited,) = EXITED.findall(log)
            _, waited, limit, held = exited
            assert float(limit) == MAX_DATABASE_WAIT
            assert float(waited) >= MAX_DATABASE_WAIT
            assert held == "1"
            # It asked its handler to stop first, when the leases were about to lapse.
            assert log.index(NOTICED) < log.index("no answer from the database")

            rescuer = Runjobs("--workers", "1")
            wait_for(lambda: done(job), what="the job recovered and run by another worker")
            assert executions(job) == [(1, cut_off.pid), (2, rescuer.pid)]
            rescuer.signal(signal.SIGTERM)
            assert rescuer.wait() == 0
        finally:
            cut_off.stop()
            print("cut-off worker:", cut_off.output()[1][-20000:], sep="\n")  # shown if the test fails
            if rescuer is not None:
                rescuer.stop()

    def test_runjobs_processes_starts_a_process_that_exited_for_silence_again(self, proxy):
        # Two processes: with one, runjobs runs no supervisor.
        supervisor = Runjobs("--processes", "2", "--workers", "1", env=through(proxy))
        try:
            wait_for(lambda: len(children_of(supervisor.pid)) == 2, what="two worker processes")
            job = jobs.until_stopped.enqueue(False)
            wait_for(lambda: executions(job), what="the job running in one of them")
            ((_, held_by),) = executions(job)
            running_behind_the_proxy(job, held_by)
            proxy.cut()
            restarting = f"worker process exited, restarting pid={held_by} reason=exit code 5 (no answer"
            wait_for(
                lambda: restarting in supervisor.output()[1], timeout=exit_deadline(), what="the restart"
            )

            # A restart finds a working path (a stuck middlebox forgets the connections it held).
            proxy.heal(reset=True)
            wait_for(lambda: done(job), what="the job recovered and run again")
            ((_, first_run), (_, second_run)) = executions(job)
            children = wait_for(
                lambda: len(children_of(supervisor.pid)) == 2 and children_of(supervisor.pid),
                what="two worker processes again",
            )
            assert first_run == held_by and held_by not in children
            # By the new process, or by the other one if its own calls were answered (with errors) in time.
            assert second_run in children
            supervisor.signal(signal.SIGTERM)
            assert supervisor.wait() == 0
        finally:
            supervisor.stop()
            print("supervisor and workers:", supervisor.output()[1][-20000:], sep="\n")
