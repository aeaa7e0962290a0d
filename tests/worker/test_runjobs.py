"""``manage.py runjobs`` as real processes: signals, kill -9, several processes racing."""

from __future__ import annotations

import re
import signal
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from tests.support.processes import Runjobs, wait_for
from tests.support.serverlock import RESTART, restart_server
from tests.support.tcpproxy import Proxy, free_port
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs import batch
from vellum_jobs.core.models import Job, QueueMinute, Worker

# The signal and start-up tests run in every cell (signal handling is the
# interpreter's); the ones that wait out leases or drain thousands of jobs
# across processes are `slow`: once per database (tests/conftest.py, SLOW_IN_OLDEST_PAIR).
pytestmark = pytest.mark.django_db(transaction=True)


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def started(job: Job) -> bool:
    return Execution.objects.filter(job_id=job.pk).exists()


@pytest.mark.runjobs
def test_banner_and_a_line_per_finished_job_at_verbosity_2():
    first = jobs.add.enqueue(1, 2)
    second = jobs.boom.enqueue()
    worker = Runjobs("--burst", "-v", "2", "--workers", "2", "--queue", "default")
    assert worker.wait() == 0
    out, _ = worker.output()
    assert f"database: {connection.vendor}" in out
    assert "queues:   default" in out
    assert "threads:  2" in out
    assert "test.add, test.async_add" in out and "test.boom" in out
    assert "async:    up to 100 coroutine jobs at once on an event loop" in out
    assert re.search(rf"^test\.add #{first.pk} done on attempt 1 of 5 after \d+\.\d s$", out, re.M)
    failed = rf"^test\.boom #{second.pk} failed on attempt 1 of 5 after \d+\.\d s, retry in (\d+\.\d) s$"
    (delay,) = re.findall(failed, out, re.M)
    assert 20 <= float(delay) <= 36  # the first backoff: BACKOFF_BASE, 30 s, +-20%
    assert out.rstrip().endswith("Ran 2 jobs: test.add 1 done; test.boom 1 failed and due again later.")


@pytest.mark.runjobs
def test_burst_and_max_jobs_print_what_they_ran_by_name_and_outcome_when_they_exit():
    jobs.add.enqueue_many([(1, 1), (2, 2), (3, 3)])
    jobs.raise_error.enqueue("no")
    jobs.retry_me.enqueue(600)
    worker = Runjobs("--burst", "--workers", "2")
    assert worker.wait() == 0
    out, _ = worker.output()
    summary = (
        "Ran 7 jobs: test.add 3 done; test.raise 2 failed and due again later, 1 failed;"
        " test.retry 1 snoozed (Retry)."
    )
    assert out.rstrip().splitlines()[-1] == summary
    assert "done on attempt" not in out  # a line per job only at verbosity 2
    jobs.add.enqueue_many([(1, 1), (2, 2), (3, 3)])
    worker = Runjobs("--max-jobs", "2", "--workers", "1")
    assert worker.wait() == 0
    assert worker.output()[0].rstrip().splitlines()[-1] == "Ran 2 jobs: test.add 2 done."


@pytest.mark.runjobs
def test_a_burst_worker_runs_the_callback_its_last_outcomes_released_before_it_exits():
    with batch(on_done=jobs.counts.s(label="all")) as b:
        jobs.add.enqueue_many([(1, 1), (2, 2), (3, 3)])
    worker = Runjobs("--burst", "--workers", "2")
    assert worker.wait() == 0
    callback = Job.objects.get(workflow=b, name="wf.counts")
    assert (callback.state, callback.attempts) == (Job.State.DONE, 1)
    assert callback.result == {"label": "all", "total": 3, "done": 3, "failed": 0, "cancelled": 0}


@pytest.mark.runjobs
def test_a_queue_no_job_has_used_is_warned_of_and_served_anyway():
    jobs.add.using(queue="media").enqueue(1, 1)
    worker = Runjobs("--burst", "--queue", "media", "--queue", "meida")
    assert worker.wait() == 0
    out, err = worker.output()
    assert "Warning: no job has ever used queue 'meida' (a typo?). This worker serves it anyway" in err
    assert "'media'" not in err
    assert "queues:   media, meida" in out and out.rstrip().endswith("Ran 1 job: test.add 1 done.")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"workers": 0}, "--workers must be at least 1"),
        ({"max_jobs": 0}, "--max-jobs must be at least 1"),
        ({"grace": -1}, "--grace must be a number of seconds from 0 to"),
        ({"grace": float("nan")}, "--grace must be a number of seconds from 0 to .*, got nan"),
        ({"grace": float("inf")}, "--grace must be a number of seconds from 0 to .*, got inf"),
        ({"async_workers": -1}, "--async-workers must be 0 to 10000, got -1"),
        ({"async_workers": 10_001}, "--async-workers must be 0 to 10000, got 10001"),
        ({"database": "nope"}, "'nope' is not in DATABASES"),
    ],
)
def test_bad_options_are_command_errors(options, message):
    with pytest.raises(CommandError, match=message):
        call_command("runjobs", **options)


@pytest.mark.slow
def test_handler_failures_do_not_stop_the_process():
    outcomes = {
        jobs.boom.enqueue().pk: Job.State.QUEUED,
        jobs.nonjson.enqueue().pk: Job.State.DONE,
        jobs.exit_.enqueue().pk: Job.State.FAILED,
        jobs.add.enqueue(2, 2).pk: Job.State.DONE,
    }
    worker = Runjobs("--burst", "--workers", "1")
    assert worker.wait() == 0
    assert {pk: Job.objects.get(pk=pk).state for pk in outcomes} == outcomes


@pytest.mark.slow
def test_kill_9_mid_job_another_process_finishes_it_once_after_the_lease():
    job = jobs.sleep.enqueue(1.5)
    first = Runjobs("--workers", "1")
    try:
        wait_for(lambda: started(job), what="first run")
        lease_at_kill = Job.objects.get(pk=job.pk).lease_expires_at
        first.kill()
        killed_at = timezone.now()
        second = Runjobs("--workers", "1")
        try:
            wait_for(lambda: state(job) == Job.State.DONE, what="job done by the second process")
        finally:
            second.signal(signal.SIGTERM)
            assert second.wait() == 0
    finally:
        first.stop()
    job.refresh_from_db()
    runs = list(Execution.objects.filter(job_id=job.pk).order_by("attempt"))
    assert [(r.attempt, r.finished) for r in runs] == [(1, False), (2, True)]
    assert runs[0].pid == first.pid and runs[1].pid == second.pid
    assert job.attempts == 2
    # Recovered through its lease, not before it lapsed.
    assert job.started_at >= lease_at_kill >= killed_at - timezone.timedelta(seconds=4)
    # The lost attempt is in the job's history, with the killed process as its worker.
    (lost,) = job.attempt_errors
    assert lost["attempt"] == 1 and lost["outcome"] == "worker lost"
    assert lost["worker"].endswith(f":{first.pid}") and lost["started_at"] is not None
    assert "worker lost" in lost["error"]
    # The second process counted the lost attempt and the run it finished.
    minutes = QueueMinute.objects.filter(queue=job.queue)
    assert (sum(m.lost for m in minutes), sum(m.done for m in minutes)) == (1, 1)


@pytest.mark.runjobs
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_lets_a_job_within_the_grace_period_finish(signum):
    job = jobs.sleep.enqueue(1)
    waiting = jobs.record.enqueue("waiting")
    worker = Runjobs("--workers", "1", "--grace", "10")
    wait_for(lambda: started(job), what="job start")
    worker.signal(signum)
    assert worker.wait() == 0
    assert state(job) == Job.State.DONE
    assert Job.objects.get(pk=waiting.pk).attempts == 0  # nothing claimed after the signal
    assert not Worker.objects.exists()


@pytest.mark.runjobs
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_job_that_outlives_the_grace_period_is_handed_back(signum):
    job = jobs.sleep.enqueue(60)
    worker = Runjobs("--workers", "1", "--grace", "1")
    wait_for(lambda: started(job), what="job start")
    signalled = time.monotonic()
    worker.signal(signum)
    assert worker.wait() == 0
    assert time.monotonic() - signalled < 6
    job.refresh_from_db()
    assert (job.state, job.attempts, job.worker_id, job.lease_expires_at) == (Job.State.QUEUED, 0, None, None)
    assert "handed back at shutdown" in job.error


@pytest.mark.slow
def test_a_second_signal_exits_at_once_and_the_lease_recovers_the_job():
    job = jobs.sleep.enqueue(60)
    worker = Runjobs("--workers", "1", "--grace", "60", env={"VELLUM_LOG_LEVEL": "INFO"})
    wait_for(lambda: started(job), what="job start")
    worker.signal(signal.SIGTERM)
    # Two signals sent at once may arrive as one: let the first be taken first.
    wait_for(lambda: "shutdown requested" in worker.output()[1], what="the first signal to be taken")
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 1
    assert time.monotonic() - signalled < 20  # at once: far below the 60 s grace, on a busy machine too
    assert state(job) == Job.State.RUNNING  # left to its lease
    Job.objects.filter(pk=job.pk).update(args=[0.1])  # make the rerun short
    rescuer = Runjobs("--workers", "1")
    try:
        wait_for(lambda: state(job) == Job.State.DONE, what="recovery")
    finally:
        rescuer.signal(signal.SIGTERM)
        rescuer.wait()
    assert Job.objects.get(pk=job.pk).attempts == 2


@pytest.mark.slow
def test_starting_and_stopping_other_processes_never_steals_a_live_job():
    job = jobs.sleep.enqueue(6)
    owner = Runjobs("--workers", "1")
    try:
        wait_for(lambda: started(job), what="job start")
        holder = Job.objects.get(pk=job.pk).worker_id
        for _ in range(5):
            other = Runjobs("--workers", "2")
            try:
                wait_for(lambda: Worker.objects.count() == 2, what="second worker up")
                other.signal(signal.SIGTERM)
                assert other.wait() == 0
            finally:
                other.kill()  # a process this test failed to stop must not serve later tests
            assert Job.objects.get(pk=job.pk).worker_id == holder
        wait_for(lambda: state(job) == Job.State.DONE, what="job done")
    finally:
        owner.signal(signal.SIGTERM)
        owner.wait()
    assert Execution.objects.filter(job_id=job.pk).count() == 1
    assert Job.objects.get(pk=job.pk).attempts == 1


@pytest.mark.slow
@pytest.mark.restarts_server
def test_a_database_server_restart_does_not_stop_the_worker():
    if connection.vendor not in RESTART:
        pytest.skip(f"{connection.vendor} has no server to restart")
    before = jobs.record.enqueue("before")
    worker = Runjobs("--workers", "2")
    try:
        wait_for(lambda: state(before) == Job.State.DONE, what="job before the restart")
        restart_server()
        after = jobs.record.enqueue("after")
        wait_for(lambda: state(after) == Job.State.DONE, what="job after the restart")
        assert worker.process.poll() is None
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0


# The environment variable that sets the test database's port (tests/settings.py).
PORT_VARIABLE = {"postgresql": "PGPORT", "mysql": "MYSQL_PORT"}


@pytest.mark.runjobs
def test_a_worker_started_while_the_database_is_down_waits_for_it():
    """A process manager may start runjobs during an outage; it must not exit (or crash-loop).

    On MariaDB Django's system checks ask the server for its version before
    any of the worker's own code runs.
    """
    if connection.vendor not in PORT_VARIABLE:
        pytest.skip(f"{connection.vendor} has no server to be down")
    job = jobs.record.enqueue("after the outage")
    port = free_port()  # nothing listens there yet: every connection is refused
    worker = Runjobs("--workers", "1", env={PORT_VARIABLE[connection.vendor]: str(port)})
    proxy = None
    try:
        wait_for(
            lambda: "database trouble during" in worker.output()[1] or worker.process.poll() is not None,
            timeout=60,  # a loaded machine takes seconds to start a Django process
            what="the worker to wait, or exit",
        )
        assert worker.process.poll() is None, worker.output()[1][-3000:]
        settings = connection.settings_dict
        proxy = Proxy((settings["HOST"] or "127.0.0.1", int(settings["PORT"])), port=port)
        wait_for(lambda: state(job) == Job.State.DONE, what="the job, once the database answers")
    finally:
        worker.signal(signal.SIGTERM)
        code = worker.wait()
        if proxy is not None:
            proxy.close()
    assert code == 0, worker.output()[1][-3000:]


@pytest.mark.runjobs
def test_a_worker_told_to_stop_while_the_database_is_down_stops_cleanly():
    """It holds nothing before its row is recorded, so SIGTERM ends it with status 0, not with
    the database's error (a deploy during an outage, or a server restart, must not read as a
    crash). On PostgreSQL it waits to record its row; on MariaDB, in Django's system checks."""
    if connection.vendor not in PORT_VARIABLE:
        pytest.skip(f"{connection.vendor} has no server to be down")
    port = free_port()  # nothing listens there: every connection is refused
    worker = Runjobs("--workers", "1", env={PORT_VARIABLE[connection.vendor]: str(port)})
    try:
        wait_for(
            lambda: "database trouble during" in worker.output()[1] or worker.process.poll() is not None,
            timeout=60,
            what="the worker to wait for the database, or exit",
        )
        assert worker.process.poll() is None, worker.output()[1][-3000:]
    finally:
        worker.signal(signal.SIGTERM)
        code = worker.wait()
    err = worker.output()[1]
    assert code == 0, err[-3000:]
    assert "stopped before it started" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
