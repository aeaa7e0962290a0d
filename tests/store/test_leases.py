from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from tests.support.leases import ManualClock, beat_past_a_lease, claim_for, recover_lapsed
from tests.testapp import jobs
from vellum_jobs import signals
from vellum_jobs.conf import conf
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.execution import job_signals
from vellum_jobs.maintenance import recovery
from vellum_jobs.store import leases
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

pytestmark = pytest.mark.django_db
ALIAS = "default"
HOUR = 3600


def running_job(worker_id, *, lease_left: float, attempts: int = 1, max_attempts: int = 5) -> Job:
    now = timezone.now()
    return Job.objects.create(
        name="test.add",
        args=[1, 2],
        state=Job.State.RUNNING,
        worker_id=worker_id,
        attempts=attempts,
        max_attempts=max_attempts,
        started_at=now,
        lease_expires_at=now + timedelta(seconds=lease_left),
    )


def test_renew_extends_only_the_leases_this_worker_holds():
    mine, theirs = uuid.uuid4(), uuid.uuid4()
    a = running_job(mine, lease_left=1)
    b = running_job(theirs, lease_left=1)
    until = timezone.now() + timedelta(minutes=5)
    assert leases.renew(ALIAS, mine, [a.pk, b.pk], until) == 1
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.lease_expires_at == until
    assert b.lease_expires_at < until


def test_an_expired_lease_requeues_the_job_and_the_lost_run_counts():
    dead = uuid.uuid4()
    Worker.objects.create(id=dead, host="web-3", pid=4242, threads=4)
    job = running_job(dead, lease_left=-1, attempts=2)
    assert recover_lapsed(ALIAS) == [(job.pk, "queued")]
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED
    assert job.attempts == 2
    assert job.worker_id is None and job.lease_expires_at is None
    assert "worker lost" in job.error and "attempt 2 of 5" in job.error and "web-3:4242" in job.error


def test_an_expired_lease_on_the_last_attempt_fails_the_job_saying_the_worker_was_lost():
    job = running_job(uuid.uuid4(), lease_left=-1, attempts=3, max_attempts=3)
    assert recover_lapsed(ALIAS) == [(job.pk, "failed")]
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert job.finished_at is not None
    assert "worker lost" in job.error and "attempt 3 of 3" in job.error


def test_a_live_lease_is_never_recovered_even_without_a_worker_row():
    job = running_job(uuid.uuid4(), lease_left=30)
    assert recover_lapsed(ALIAS) == []
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING


def test_recovery_does_not_overwrite_a_job_that_finished_meanwhile(monkeypatch):
    worker_id = uuid.uuid4()
    job = running_job(worker_id, lease_left=-1)

    class FinishFirst:
        """Stands in for Worker: the job finishes between recovery's read and its write."""

        class objects:
            @staticmethod
            def using(alias):
                Job.objects.filter(pk=job.pk).update(state=Job.State.DONE, result=7)
                return Worker.objects.using(alias)

    monkeypatch.setattr(recovery, "Worker", FinishFirst)
    assert recover_lapsed(ALIAS) == []
    job.refresh_from_db()
    assert (job.state, job.result, job.error) == (Job.State.DONE, 7, "")


def test_hand_back_requeues_due_now_and_refunds_the_attempt():
    jobs.add.using(delay=0).enqueue(1, 2)
    worker = uuid.uuid4()
    (claimed,) = claim_for(worker)
    attempt = Attempt(claimed, worker)
    assert leases.hand_back(ALIAS, [attempt], "handed back at shutdown") == 1
    row = Job.objects.get(pk=claimed.pk)
    assert (row.state, row.attempts, row.worker_id) == (Job.State.QUEUED, 0, None)
    assert row.error == "handed back at shutdown"
    # A job this worker no longer holds is left alone.
    assert leases.hand_back(ALIAS, [attempt], "again") == 0


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_sends_job_finished_for_the_jobs_it_recovers_from_a_lost_worker():
    failed = running_job(uuid.uuid4(), lease_left=-1, attempts=3, max_attempts=3)
    requeued = running_job(uuid.uuid4(), lease_left=-1, attempts=1)
    running_job(uuid.uuid4(), lease_left=30)  # alive: not reported
    seen = []

    def receive(sender, job, **kwargs):
        seen.append((job.pk, job.state, "worker lost" in job.error))

    signals.job_finished.connect(receive)
    try:
        beat_past_a_lease(WorkerProcess(WorkerOptions(threads=1)).heartbeat)
    finally:
        signals.job_finished.disconnect(receive)
        connections.close_all()
    assert sorted(seen) == sorted([(failed.pk, "failed", True), (requeued.pk, "queued", True)])


@pytest.mark.django_db(transaction=True)
def test_a_recovered_job_claimed_again_before_the_report_is_left_to_its_next_attempt():
    job = running_job(uuid.uuid4(), lease_left=-1, attempts=1)
    recovered = recover_lapsed(ALIAS)
    claim_for(uuid.uuid4())  # another worker takes it first
    seen = []

    def receive(sender, job, **kwargs):
        seen.append(job.pk)

    signals.job_finished.connect(receive)
    try:
        job_signals.report_ended(ALIAS, recovered)
    finally:
        signals.job_finished.disconnect(receive)
    assert recovered == [(job.pk, "queued")]
    assert seen == []


def test_a_lease_renewed_at_every_beat_is_never_recovered_whatever_the_clocks_say():
    """The owner's clock runs an hour behind, the observer's an hour ahead: the lease keeps moving."""
    owner = uuid.uuid4()
    lease = timedelta(seconds=conf.lease)
    job = running_job(owner, lease_left=-HOUR)
    watched = ManualClock()
    watch = recovery.LapseWatch(clock=watched)
    for _ in range(10):
        assert recovery.recover_expired(ALIAS, timezone.now() + timedelta(seconds=HOUR), watch) == []
        watched.at += conf.heartbeat
        assert leases.renew(ALIAS, owner, [job.pk], timezone.now() - timedelta(seconds=HOUR) + lease) == 1
    # Once the owner stops renewing, the lease lapses a lease later, by the observer's stopwatch.
    assert recovery.recover_expired(ALIAS, timezone.now(), watch) == []
    watched.at += conf.lease - 0.01
    assert recovery.recover_expired(ALIAS, timezone.now(), watch) == []
    watched.at += 0.01
    assert recovery.recover_expired(ALIAS, timezone.now(), watch) == [(job.pk, "queued")]


def test_a_lease_whose_end_has_not_passed_is_kept_though_nobody_renewed_it_for_a_lease():
    """A worker configured with a longer lease than the observer's keeps its job until that lease ends."""
    job = running_job(uuid.uuid4(), lease_left=30)
    watched = ManualClock()
    watch = recovery.LapseWatch(clock=watched, lease=1)
    for _ in range(3):
        assert recovery.recover_expired(ALIAS, timezone.now() - timedelta(seconds=29), watch) == []
        watched.at += 10
    assert Job.objects.get(pk=job.pk).state == Job.State.RUNNING
