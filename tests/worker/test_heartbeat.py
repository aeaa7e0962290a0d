"""The heartbeat: beats that fail or hang, the lease watch, trouble, and the worker row."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import OperationalError, ProgrammingError, connections
from django.utils import timezone

from tests.support.processes import wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.conf import conf
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.execution.outcome import Outcome
from vellum_jobs.store import leases
from vellum_jobs.worker import connections_held, heartbeat, memory, stop_request
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess
from vellum_jobs.worker.runners import Runners
from vellum_jobs.worker.slots import Slots

pytestmark = pytest.mark.django_db(transaction=True)
ALIAS = "default"


class Running:
    """A WorkerProcess running in a thread of the test process, its outcomes collected."""

    def __init__(self, threads: int = 2) -> None:
        self.outcomes: dict[int, Outcome] = {}
        self.worker = WorkerProcess(WorkerOptions(threads=threads), report=self._report)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)
        self.thread.start()
        wait_for(lambda: Worker.objects.filter(pk=self.worker.id).exists(), what="worker row")

    def _report(self, job: Job, outcome: Outcome) -> None:
        self.outcomes.setdefault(job.pk, outcome)

    @property
    def heartbeat(self) -> heartbeat.Heartbeat:
        return self.worker.heartbeat

    def row(self) -> Worker:
        return Worker.objects.get(pk=self.worker.id)

    def stop(self) -> None:
        self.worker.request_stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "worker did not stop"


def started(job: Job) -> bool:
    return Execution.objects.filter(job_id=job.pk).exists()


def events() -> tuple[threading.Event, threading.Event]:
    """A heartbeat's wake and stopped events, for one driven by ``beat()``."""
    return threading.Event(), threading.Event()


def heartbeat_failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("heartbeat failed")]


# -- a beat that fails -------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [ValueError("a bug"), ProgrammingError("permission denied for table vellum_jobs_job")],
    ids=["bug", "database-error"],
)
def test_a_beat_that_raises_is_logged_and_the_next_beat_renews_the_leases(monkeypatch, caplog, error):
    job = jobs.polite.enqueue(30)
    running = Running(threads=1)
    try:
        wait_for(lambda: started(job), what="job start")
        renew, raised = leases.renew, threading.Event()

        def fail_once(*args):
            if not raised.is_set():
                raised.set()
                raise error
            return renew(*args)

        monkeypatch.setattr(leases, "renew", fail_once)
        wait_for(raised.is_set, what="the failing beat")
        lease = Job.objects.get(pk=job.pk).lease_expires_at
        wait_for(lambda: Job.objects.get(pk=job.pk).lease_expires_at > lease, what="a renewal after it")
        assert all(thread.is_alive() for thread in running.heartbeat.threads)
    finally:
        running.stop()
    (failure,) = heartbeat_failures(caplog)
    assert failure.levelno == logging.ERROR
    assert failure.exc_info is not None and failure.exc_info[1] is error  # with its traceback


def test_a_failing_renewal_still_records_the_worker_row_unless_the_database_is_out_of_reach(monkeypatch):
    worker = WorkerProcess(WorkerOptions(threads=1))
    now = timezone.now()

    def renew(error: Exception):
        def failing(*args):
            raise error

        monkeypatch.setattr(leases, "renew", failing)

    try:
        renew(OperationalError("server closed the connection unexpectedly"))
        worker.heartbeat.beat(now)  # never raises
        assert not Worker.objects.filter(pk=worker.id).exists()
        renew(ValueError("a bug"))
        worker.heartbeat.beat(now)
        assert Worker.objects.get(pk=worker.id).last_heartbeat == now
    finally:
        connections.close_all()


# -- the lease watch and trouble ---------------------------------------------------


def test_a_worker_whose_beats_fail_past_the_lease_stops_claiming_until_a_beat_renews_again(
    monkeypatch, caplog, short_lease
):
    # LEASE is 3 s here and HEARTBEAT 0.5 s: trouble 2.5 s after the last renewal.
    polite = jobs.polite.enqueue(30)
    running = Running(threads=2)
    try:
        wait_for(lambda: started(polite), what="job start")
        renew, broken = leases.renew, threading.Event()

        def renew_unless_broken(*args):
            if broken.is_set():
                raise ValueError("renewal is broken")
            return renew(*args)

        monkeypatch.setattr(leases, "renew", renew_unless_broken)
        broken.set()
        row = wait_for(lambda: running.row().trouble and running.row(), what="trouble recorded")
        assert row.trouble.startswith("leases not renewed for ")
        assert "renewal is broken" in row.trouble
        # Its running handler was asked to stop (and did, long before its 30 s).
        wait_for(lambda: polite.pk in running.outcomes, what="the polite job's outcome")
        # It stopped early at a lost lease: not done, queued again as recovery would queue it.
        assert running.outcomes[polite.pk].label == "lease lost, queued again"

        waiting = jobs.record.enqueue("after the trouble")
        decisions = dispatcher_decisions(running, monkeypatch)
        wait_for(lambda: len(decisions) >= 3, what="the dispatcher deciding not to claim")
        assert all(decisions)
        assert Job.objects.get(pk=waiting.pk).state == Job.State.QUEUED

        broken.clear()
        wait_for(
            lambda: Job.objects.get(pk=waiting.pk).state == Job.State.DONE, what="the claim after the trouble"
        )
        wait_for(lambda: running.row().trouble == "", what="trouble cleared")
    finally:
        running.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("leases about to lapse, not claiming") for m in messages)
    assert any(m.startswith("leases renewed again, claiming resumes") for m in messages)


def dispatcher_decisions(running: Running, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What ``in_trouble()`` tells the dispatcher from now on (the other threads ask too)."""
    decisions: list[bool] = []
    in_trouble = running.heartbeat.in_trouble

    def watched() -> bool:
        answer = in_trouble()
        if threading.current_thread() is running.thread:
            decisions.append(answer)
        return answer

    monkeypatch.setattr(running.heartbeat, "in_trouble", watched)
    return decisions


def beat_waited(running: Running) -> float:
    """How long the beat in progress has run (0 between beats)."""
    started = running.heartbeat.beat_started
    return 0.0 if started is None else time.monotonic() - started


def test_a_beat_stuck_in_the_database_does_not_keep_the_worker_claiming(monkeypatch, short_lease, settings):
    """The beat's thread cannot notice its own hang: the lease watch does, with a clock."""
    # The beat gets through after more than a lease; not after MAX_DATABASE_WAIT, which would end
    # the process (this test's).
    settings.VELLUM_JOBS = {**settings.VELLUM_JOBS, "MAX_DATABASE_WAIT": "10m"}
    polite = jobs.polite.enqueue(30)
    running = Running(threads=2)
    try:
        wait_for(lambda: started(polite), what="job start")
        renew, permits = leases.renew, threading.Semaphore(0)

        def renew_when_let_through(*args):
            permits.acquire()  # a statement that waits on a dead connection
            return renew(*args)

        monkeypatch.setattr(leases, "renew", renew_when_let_through)
        wait_for(lambda: running.heartbeat.trouble, what="trouble while the beat hangs")
        assert "for the database" in running.heartbeat.trouble
        wait_for(lambda: polite.pk in running.outcomes, what="the polite job's outcome")
        # It stopped early at a lost lease: not done, queued again as recovery would queue it.
        assert running.outcomes[polite.pk].label == "lease lost, queued again"
        waiting = jobs.record.enqueue("after the hang")
        decisions = dispatcher_decisions(running, monkeypatch)
        wait_for(lambda: len(decisions) >= 3, what="the dispatcher deciding not to claim")
        assert all(decisions)

        # The hung beat gets through at last: too late to count as a renewal
        # (it started longer ago than the lease watch allows), but the worker
        # row now says why the worker is not claiming.
        wait_for(lambda: beat_waited(running) > conf.lease, what="the hung beat to be too late to renew")
        permits.release()
        row = wait_for(lambda: running.row().trouble and running.row(), what="trouble recorded late")
        assert "for the database" in row.trouble
        assert Job.objects.get(pk=waiting.pk).state == Job.State.QUEUED

        monkeypatch.setattr(leases, "renew", renew)
        permits.release()  # the beat that waits now
        wait_for(
            lambda: Job.objects.get(pk=waiting.pk).state == Job.State.DONE, what="the claim after the hang"
        )
        wait_for(lambda: running.row().trouble == "", what="trouble cleared")
    finally:
        running.stop()


def test_trouble_asks_held_handlers_to_stop_and_a_timely_renewal_ends_it():
    """On the test process's minute-long lease: a beat that a loaded host slows by seconds is
    still timely, so the test is about the rule, not the host's speed."""
    worker = WorkerProcess(WorkerOptions(threads=1))
    beat = worker.heartbeat
    (attempt,) = worker.slots.submit([Job(pk=1, name="test.polite")])  # held; no slot runs it
    try:
        beat.check()
        assert not beat.in_trouble() and not attempt.stop.is_set()

        overdue = conf.lease + 30  # no renewal for longer than LEASE - HEARTBEAT
        beat.renewed_at = time.monotonic() - overdue
        beat.check()
        assert beat.in_trouble() and beat.trouble.startswith(f"leases not renewed for {overdue:.0f}.")
        assert attempt.should_stop()

        beat.beat(timezone.now())  # renews (nothing: the job is not in the table) in time
        assert not beat.in_trouble() and beat.trouble == ""
        assert worker.wake.is_set()  # the dispatcher claims again at once
    finally:
        connections.close_all()


# -- the worker row ----------------------------------------------------------------


def test_record_recreates_a_missing_worker_row_and_forgets_long_dead_workers():
    now = timezone.now()
    gone = Worker.objects.create(
        id=uuid.uuid4(), host="old", pid=1, threads=1, last_heartbeat=now - timedelta(hours=2)
    )
    me = Worker(id=uuid.uuid4(), host="here", pid=2, threads=4, trouble="leases not renewed for 50.0s")
    heartbeat.record(ALIAS, me, now)
    row = Worker.objects.get(pk=me.pk)
    assert (row.last_heartbeat, row.trouble) == (now, "leases not renewed for 50.0s")
    assert not Worker.objects.filter(pk=gone.pk).exists()
    me.trouble = ""
    heartbeat.record(ALIAS, me, now + timedelta(seconds=10))
    assert Worker.objects.get(pk=me.pk).trouble == ""


def test_registration_and_every_beat_record_the_connections_the_process_holds(monkeypatch):
    held = iter([1, 5, 3])
    monkeypatch.setattr(connections_held, "held", lambda alias: next(held))
    me = Worker(id=uuid.uuid4(), host="here", pid=2, threads=2)
    heartbeat.register(ALIAS, me)
    assert Worker.objects.get(pk=me.pk).connections == 1
    slots = Runners(Slots(2, me.id, threading.Event(), lambda: None), None)
    beating = heartbeat.Heartbeat(ALIAS, me, slots, *events())
    for expected in (5, 3):
        beating.beat(timezone.now())
        assert Worker.objects.get(pk=me.pk).connections == expected


def test_each_beat_records_the_attempts_finished_and_the_memory_the_process_holds():
    running = Running()
    try:
        assert running.row().jobs_run == 0
        for n in range(3):
            jobs.add.enqueue(n, n)
        wait_for(lambda: running.row().jobs_run == 3, what="three attempts counted at a beat")
        held = running.row().memory
        assert held is not None and 10 * 2**20 < held < 2**40  # a Django process: megabytes, not nothing
    finally:
        running.stop()


def test_the_resident_set_size_is_read_from_proc_on_linux():
    with open("/proc/self/status") as status:
        kilobytes = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    assert abs(memory.resident_set_size() - kilobytes * 1024) < 50 * 2**20


def test_record_says_who_asked_the_worker_to_stop_and_still_records_the_beat():
    me = Worker(id=uuid.uuid4(), host="here", pid=2, threads=4)
    heartbeat.register(ALIAS, me)
    assert heartbeat.record(ALIAS, me, timezone.now()) is None
    assert stop_request.ask([me.pk], by="admin: ann") == 1
    assert stop_request.ask([me.pk], by="admin: bob") == 0  # the first request stands
    me.jobs_run = 7
    later = timezone.now() + timedelta(seconds=1)
    assert heartbeat.record(ALIAS, me, later) == "admin: ann"
    row = Worker.objects.get(pk=me.pk)
    assert (row.last_heartbeat, row.jobs_run) == (later, 7)


def test_a_stop_asked_for_in_the_row_stops_the_worker_as_sigterm_would(caplog, tmp_path):
    caplog.set_level(logging.WARNING, logger="vellum_jobs")
    release = tmp_path / "release"
    job = jobs.sleep.enqueue(60, release_file=str(release))
    waiting = jobs.record.enqueue("waiting")
    running = Running(threads=1)
    wait_for(lambda: started(job), what="the job to start")
    stop_request.ask([running.worker.id], by="admin: ann")
    wait_for(running.worker.stopping.is_set, what="a beat to see the request")
    release.touch()  # the job finishes after the worker stopped claiming
    running.thread.join(30)
    assert not running.thread.is_alive(), "worker did not stop"
    assert running.worker.exit_code == 0
    assert Job.objects.get(pk=job.pk).state == Job.State.DONE  # finished within the grace period
    assert Job.objects.get(pk=waiting.pk).attempts == 0
    assert not Worker.objects.filter(pk=running.worker.id).exists()
    [line] = [r.getMessage() for r in caplog.records if "asked this worker to stop" in r.getMessage()]
    assert (
        line.startswith("admin: ann asked")
        and f"worker_id={running.worker.id} by='admin: ann'" in line
        and "supervisor" not in line
    )
