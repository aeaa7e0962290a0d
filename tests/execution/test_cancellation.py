"""Cancelling a running job: the heartbeat tells the handler, and the outcome says what happened."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.support.leases import recover_lapsed
from tests.support.processes import wait_for
from tests.support.workers import Background
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.core.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def started(job: Job) -> bool:
    return Execution.objects.filter(job_id=job.pk).exists()


def delivered(worker: Background, job: Job) -> bool:
    held = {attempt.job.pk: attempt for attempt in worker.worker.slots.held_attempts()}
    return job.pk in held and held[job.pk].cancel.is_set()


def test_a_handler_that_checks_should_stop_ends_cancelled():
    worker = Background(threads=1)
    job = jobs.polite.enqueue(60)
    wait_for(lambda: started(job), what="handler start")
    assert job.cancel() is True
    wait_for(lambda: state(job) == Job.State.CANCELLED, what="cancelled")
    worker.stop()
    row = Job.objects.get(pk=job.pk)
    assert row.result == "stopped early"  # what the handler returned is kept
    assert row.error.startswith("cancelled while running: requested at ")
    assert "the handler stopped" in row.error
    assert row.cancel_requested_at is not None and row.finished_at >= row.cancel_requested_at
    assert row.attempts == 1


def test_a_handler_that_ignores_the_request_finishes_and_the_request_is_noted(tmp_path):
    release = tmp_path / "release"
    worker = Background(threads=1)
    job = jobs.sleep.enqueue(60, "slept", str(release))
    wait_for(lambda: started(job), what="handler start")
    job.cancel()
    wait_for(lambda: delivered(worker, job), what="the heartbeat to deliver the request")
    release.touch()
    wait_for(lambda: state(job) == Job.State.DONE, what="done")
    worker.stop()
    row = Job.objects.get(pk=job.pk)
    assert row.result == "slept"
    assert "cancellation requested at " in row.error
    assert "the handler did not check should_stop() and finished (done)" in row.error
    assert row.cancel_requested_at is not None


def test_a_failing_attempt_of_a_job_asked_to_stop_is_not_retried(tmp_path):
    release = tmp_path / "release"
    worker = Background(threads=1)
    job = jobs.wait_then_fail.enqueue(str(release))
    wait_for(lambda: started(job), what="handler start")
    job.cancel()
    wait_for(lambda: delivered(worker, job), what="the heartbeat to deliver the request")
    release.touch()
    wait_for(lambda: state(job) == Job.State.CANCELLED, what="cancelled")
    worker.stop()
    row = Job.objects.get(pk=job.pk)
    assert "did not check should_stop(); not retried" in row.error
    assert "RuntimeError: failed after the wait" in row.error
    assert Execution.objects.filter(job_id=job.pk).count() == 1


def test_a_request_the_heartbeat_has_not_delivered_yet_still_stops_a_retry(tmp_path):
    release = tmp_path / "release"
    worker = Background(threads=1)
    job = jobs.wait_then_fail.enqueue(str(release))
    wait_for(lambda: started(job), what="handler start")
    # Asked to stop, and failing at once: the heartbeat (every 0.5 s) has most
    # likely not told the handler; the outcome looks at the row itself.
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now())
    release.touch()
    wait_for(lambda: state(job) not in (Job.State.QUEUED, Job.State.RUNNING), what="an outcome")
    worker.stop()
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.CANCELLED
    assert "not be retried" in row.error or "not retried" in row.error
    assert Execution.objects.filter(job_id=job.pk).count() == 1


def test_a_job_asked_to_stop_whose_worker_died_is_cancelled_not_requeued():
    job = jobs.add.enqueue(1, 2)
    lapsed = timezone.now() - timedelta(seconds=1)
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.RUNNING, attempts=1, lease_expires_at=lapsed, cancel_requested_at=lapsed
    )
    assert recover_lapsed("default") == [(job.pk, "cancelled")]
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.CANCELLED
    assert "its cancellation had been requested" in row.error


def test_shutdown_does_not_hand_back_a_job_asked_to_stop(tmp_path):
    release = tmp_path / "release"
    worker = Background(threads=1, grace=0.2)
    job = jobs.sleep.enqueue(60, "slept", str(release))
    wait_for(lambda: started(job), what="handler start")
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now())
    worker.stop()
    release.touch()
    worker.join_slot_threads()
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.CANCELLED
    assert "handed back at shutdown" in row.error
