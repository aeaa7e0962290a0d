"""Job timeouts: cooperative handlers stop, stubborn ones are recorded, fenced out and reported."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.support.leases import claim_for
from tests.support.processes import Runjobs, wait_for
from tests.support.workers import Background
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs import JobTimeout
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.execution.handler_run import run
from vellum_jobs.execution.outcome_writes import record_many
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True)


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def test_a_cooperative_handler_is_stopped_at_its_timeout_and_retried():
    job = jobs.cooperative.enqueue()  # timeout 0.5 s, 2 attempts
    background = Background(threads=1)
    try:
        wait_for(lambda: state(job) == Job.State.FAILED, what="both attempts timed out")
        # The handlers come back by themselves (check_timeout raised): no slot stays stuck.
        wait_for(lambda: not background.worker.watchdog.timed_out, what="handlers back")
    finally:
        background.stop()
    job.refresh_from_db()
    assert job.attempts == 2
    assert "timed out" in job.error
    assert Execution.objects.filter(job_id=job.pk).count() == 2


def test_a_stubborn_handler_is_recorded_as_timed_out_and_its_late_result_is_fenced_out(tmp_path):
    release = tmp_path / "release"
    job = jobs.stubborn.using(timeout=0.5).enqueue(release_file=str(release))
    background = Background(threads=2, grace=0.5)
    try:
        wait_for(lambda: state(job) == Job.State.FAILED, what="timeout recorded")
        row = Job.objects.get(pk=job.pk)
        assert "timed out after 0.5s" in row.error
        assert row.lease_expires_at is None
        assert not Execution.objects.get(job_id=job.pk).finished  # the handler is still in there
        # Past deadline + grace the slot counts as stuck, in the worker row too.
        wait_for(lambda: Worker.objects.get(pk=background.worker.id).stuck == 1, what="stuck slot reported")
        # The other slot keeps working meanwhile.
        other = jobs.add.enqueue(2, 3)
        wait_for(lambda: state(other) == Job.State.DONE, what="other job")
        release.touch()
        wait_for(lambda: Execution.objects.get(job_id=job.pk).finished, what="late return")
        wait_for(lambda: not background.worker.watchdog.timed_out, what="late outcome handled")
    finally:
        background.stop()
    row = Job.objects.get(pk=job.pk)
    assert (row.state, row.result) == (Job.State.FAILED, None)  # "late" never got in


def test_a_handler_that_stops_early_at_shutdown_is_queued_again_with_its_attempt_refunded():
    """The documented pattern (return when should_stop() says so) never records partial work as done."""
    job = jobs.polite.enqueue(30)
    background = Background(threads=1, grace=10)
    wait_for(lambda: Execution.objects.filter(job_id=job.pk).exists(), what="job start")
    started = time.monotonic()
    background.stop()
    assert time.monotonic() - started < 5
    job.refresh_from_db()
    assert (job.state, job.result, job.attempts) == (Job.State.QUEUED, None, 0)
    assert "handed back at shutdown: the handler stopped early" in job.error
    assert Execution.objects.get(job_id=job.pk).note == "stopped: shutting down"


def test_a_handler_that_stops_early_at_its_timeout_fails_that_attempt_as_timed_out():
    job = jobs.polite.using(timeout=0.3).enqueue(30)  # two attempts, no backoff
    background = Background(threads=1)
    try:
        wait_for(lambda: state(job) == Job.State.FAILED, what="both attempts timed out")
    finally:
        background.stop()
    job.refresh_from_db()
    assert (job.attempts, job.result) == (2, None)
    assert "timed out after 0.3s" in job.error

    def notes() -> set[str]:
        return set(Execution.objects.filter(job_id=job.pk).values_list("note", flat=True))

    # The timeout is recorded at the deadline; the handler notes why it stopped a moment later,
    # in its own thread, which the worker's stop does not wait for (it timed out).
    wait_for(lambda: "" not in notes(), what="both handlers to note why they stopped")
    assert notes() == {"stopped: timed out"}


@pytest.mark.parametrize("attempts", [1, 2], ids=["attempts left", "out of attempts"])
def test_a_handler_that_stops_early_when_its_lease_is_lost_is_not_recorded_done(attempts):
    """The heartbeat could not renew the leases (``Heartbeat.check`` sets each attempt's stop flag):
    the handler's early return ends the job as recovery of the lapsed lease would."""
    job = jobs.polite.enqueue(30)  # two attempts
    Job.objects.filter(pk=job.pk).update(attempts=attempts - 1)
    worker = uuid.uuid4()
    (claimed,) = claim_for(worker)
    attempt = Attempt(claimed, worker)
    attempt.stop.set()
    record_many("default", [(attempt, run(attempt))])
    job.refresh_from_db()
    expected = Job.State.QUEUED if attempts == 1 else Job.State.FAILED
    assert (job.state, job.result, job.attempts) == (expected, None, attempts)
    assert job.error.startswith(f"lease lost during attempt {attempts} of 2")
    assert [entry["outcome"] for entry in job.attempt_errors] == ["worker lost"]
    assert Execution.objects.get(job_id=job.pk).note == "stopped: lease lost"


def test_a_handler_that_stops_early_for_a_cancellation_ends_cancelled():
    job = jobs.polite.enqueue(30)
    background = Background(threads=1)
    try:
        wait_for(lambda: Execution.objects.filter(job_id=job.pk).exists(), what="job start")
        assert Job.objects.get(pk=job.pk).cancel()
        wait_for(lambda: state(job) == Job.State.CANCELLED, what="the job cancelled")
    finally:
        background.stop()
    assert Execution.objects.get(job_id=job.pk).note == "stopped: cancelled"


def test_stop_reason_is_none_outside_a_worker_and_while_a_handler_may_go_on():
    job = jobs.add.enqueue(1, 2)
    assert job.stop_reason is None and not job.should_stop()


@pytest.mark.runjobs
def test_max_stuck_makes_runjobs_exit_non_zero():
    job = jobs.stubborn.using(timeout=0.5).enqueue()
    worker = Runjobs("--workers", "2", "--grace", "0.5", "--max-stuck", "1")
    try:
        assert worker.wait(30) == 3
    finally:
        worker.stop()
    _, err = worker.output()
    assert "slot stuck" in err and "too many stuck slots" in err
    assert state(job) == Job.State.FAILED


@pytest.mark.runjobs
def test_runjobs_refuses_a_max_stuck_below_one():
    worker = Runjobs("--max-stuck", "0")
    assert worker.wait() != 0
    assert "--max-stuck must be at least 1" in worker.output()[1]


@pytest.mark.parametrize("timeout", [0, -1, "soon"])
def test_bad_timeouts_are_refused_at_enqueue(timeout):
    with pytest.raises(ValueError, match="timeout"):
        jobs.add.using(timeout=timeout).enqueue(1, 2)
    assert not Job.objects.exists()


def test_check_timeout_and_time_remaining_after_a_run():
    job = jobs.add.using(timeout=0.2).enqueue(1, 2)
    job.refresh_from_db()
    run(Attempt(job, uuid.uuid4()))
    assert job.time_remaining is not None and job.time_remaining <= 0.2
    time.sleep(0.25)  # past the deadline, by the clock check_timeout reads
    with pytest.raises(JobTimeout, match=r"timed out after 0\.2s"):
        job.check_timeout()
    assert job.should_stop()


def test_a_handler_back_at_its_deadline_is_recorded_once_not_also_as_timed_out():
    # The slot hands its outcome back just as the deadline passes, before the
    # dispatcher looked at the deadline: that outcome is the attempt's.
    job = jobs.add.using(timeout=0.5).enqueue(1, 2)
    worker = WorkerProcess(WorkerOptions(threads=1))
    (claimed,) = claim_for(worker.id)
    (attempt,) = worker.slots.submit([claimed])  # held by the dispatcher; no slot thread started
    outcome = run(attempt)
    attempt.deadline = time.monotonic() - 0.1
    worker.slots.threads.running += 1  # as if a slot thread had started it
    worker.slots.threads.hand_back(attempt, outcome)
    finished, _, _ = worker.dispatcher._collect()
    assert [(a.job.pk, o.state) for a, o in finished] == [(job.pk, Job.State.DONE)]
    assert not worker.watchdog.timed_out


def test_a_handler_back_in_time_is_not_timed_out_while_its_outcome_waits_to_be_written():
    # Where outcomes are written apart (the recorder), an attempt stays held after
    # its handler came back, until its outcome is written: that outcome is the
    # attempt's, whatever the deadline does meanwhile.
    jobs.add.using(timeout=0.5).enqueue(1, 2)
    worker = WorkerProcess(WorkerOptions(threads=1))
    (claimed,) = claim_for(worker.id)
    (attempt,) = worker.slots.submit([claimed])  # held by the dispatcher; no slot thread started
    worker.slots.threads.running += 1  # as if a slot thread had started it
    worker.slots.threads.hand_back(attempt, run(attempt))
    finished, _, _ = worker.dispatcher._collect()
    assert [a for a, _ in finished] == [attempt]
    assert attempt in worker.slots.held_attempts()  # not yet released: its outcome is not written
    attempt.deadline = time.monotonic() - 0.1
    assert worker.dispatcher._collect()[0] == []
    assert not worker.watchdog.timed_out
    assert worker.dispatcher._wait_time(idle=False) > 0  # no deadline to look at: no busy loop
