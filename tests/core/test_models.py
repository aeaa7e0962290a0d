from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.utils import timezone

from tests.support.leases import claim_for
from tests.testapp import jobs
from vellum_jobs.core.models import Job

pytestmark = pytest.mark.django_db


def test_stats_counts_every_state_with_zeros():
    assert Job.objects.stats() == {
        "waiting": 0,
        "queued": 0,
        "running": 0,
        "done": 0,
        "failed": 0,
        "cancelled": 0,
    }
    jobs.add.enqueue_many([(1, 2)] * 3)
    Job.objects.create(name="x", state=Job.State.FAILED)
    assert Job.objects.stats() == {
        "waiting": 0,
        "queued": 3,
        "running": 0,
        "done": 0,
        "failed": 1,
        "cancelled": 0,
    }


@pytest.mark.parametrize("state", [Job.State.FAILED, Job.State.CANCELLED])
def test_retry_requeues_a_finished_job_due_now_with_attempts_reset(state):
    job = Job.objects.create(
        name="test.add",
        state=state,
        attempts=5,
        finished_at=timezone.now(),
        run_after=timezone.now() + timezone.timedelta(days=1),
    )
    assert job.retry() is True
    job.refresh_from_db()
    assert (job.state, job.attempts, job.finished_at) == (Job.State.QUEUED, 0, None)
    assert job.run_after <= timezone.now()


@pytest.mark.parametrize("state", [Job.State.QUEUED, Job.State.RUNNING, Job.State.DONE])
def test_retry_refuses_other_states(state):
    job = Job.objects.create(name="test.add", state=state, attempts=1)
    assert job.retry() is False
    job.refresh_from_db()
    assert (job.state, job.attempts) == (state, 1)


def test_cancel_cancels_a_queued_job_and_not_a_finished_one():
    job = jobs.add.enqueue(1, 2)
    assert job.cancel() is True
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED and job.finished_at is not None
    assert job.cancel() is False


def test_cancel_of_a_job_a_worker_took_meanwhile_asks_it_to_stop():
    job = jobs.add.enqueue(1, 2)
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING)
    assert job.cancel() is True
    assert job.state == Job.State.RUNNING
    requested = Job.objects.get(pk=job.pk).cancel_requested_at
    assert requested is not None
    assert job.cancel() is True  # asked already: the request stands, its time too
    assert Job.objects.get(pk=job.pk).cancel_requested_at == requested


def test_cancelling_a_queryset_reaches_a_job_claimed_between_its_two_statements():
    # A worker claims the job right after cancel()'s first statement. Queued
    # jobs go first, so the second statement (running jobs) still asks it to
    # stop; the other order missed it with both.
    job = jobs.add.enqueue(1, 2)
    claimed: list[list[Job]] = []

    def claim_after_the_first_update(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not claimed and sql.lstrip().upper().startswith("UPDATE"):
            claimed.append([])
            claimed[0].extend(claim_for(uuid.uuid4()))
        return result

    with connection.execute_wrapper(claim_after_the_first_update):
        assert Job.objects.filter(pk=job.pk).cancel() == 1
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.CANCELLED or (
        row.state == Job.State.RUNNING and row.cancel_requested_at is not None
    )


def test_cancelling_a_queryset_asks_its_running_jobs_to_stop():
    queued, running = jobs.add.enqueue(1, 2), jobs.add.enqueue(3, 4)
    (claimed,) = claim_for(uuid.uuid4(), limit=1)
    assert claimed.pk == queued.pk
    assert Job.objects.filter(pk__in=[queued.pk, running.pk]).cancel() == 2
    rows = {row.pk: row for row in Job.objects.all()}
    assert rows[running.pk].state == Job.State.CANCELLED
    assert rows[queued.pk].state == Job.State.RUNNING and rows[queued.pk].cancel_requested_at is not None


def test_retry_of_a_cancelled_job_forgets_the_cancellation_request():
    job = jobs.add.enqueue(1, 2)
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.CANCELLED, cancel_requested_at=timezone.now(), finished_at=timezone.now()
    )
    assert job.retry() is True
    assert Job.objects.get(pk=job.pk).cancel_requested_at is None


def test_retry_and_cancel_of_a_job_deleted_meanwhile_say_false():
    job = jobs.add.enqueue(1, 2)
    Job.objects.filter(pk=job.pk).delete()
    assert job.cancel() is False
    job.state = Job.State.FAILED
    assert job.retry() is False


def test_run_now_makes_a_delayed_job_due():
    job = jobs.add.using(delay=3600).enqueue(1, 2)
    assert job.run_now() is True
    job.refresh_from_db()
    assert job.run_after <= timezone.now()


def test_run_now_leaves_an_already_due_job_its_place_in_line():
    due_since = timezone.now() - timezone.timedelta(minutes=5)
    job = jobs.add.using(run_after=due_since).enqueue(1, 2)
    assert job.run_now() is False
    job.refresh_from_db()
    assert job.run_after == due_since


def test_queryset_transitions_change_only_the_jobs_in_a_state_they_apply_to():
    later = timezone.now() + timezone.timedelta(hours=1)
    failed = Job.objects.create(name="x", state=Job.State.FAILED, attempts=3, run_after=later)
    cancelled = Job.objects.create(name="x", state=Job.State.CANCELLED)
    done = Job.objects.create(name="x", state=Job.State.DONE)
    delayed = Job.objects.create(name="x", run_after=later)
    due = Job.objects.create(name="x", run_after=timezone.now() - timezone.timedelta(minutes=1))

    assert Job.objects.filter(pk__in=[failed.pk, cancelled.pk, done.pk]).retry() == 2
    assert Job.objects.filter(pk__in=[delayed.pk, due.pk, done.pk]).run_now() == 1
    assert Job.objects.filter(pk__in=[delayed.pk, done.pk]).cancel() == 1

    states = dict(Job.objects.values_list("pk", "state"))
    assert states == {
        failed.pk: "queued",
        cancelled.pk: "queued",
        done.pk: "done",
        delayed.pk: "cancelled",
        due.pk: "queued",
    }
    failed.refresh_from_db()
    assert failed.attempts == 0 and failed.run_after <= timezone.now()
