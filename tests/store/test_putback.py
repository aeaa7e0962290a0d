"""A unique job put back in the queue keeps its key, or ends superseded by the job that waits with it.

Every way a claimed job goes back to the queue: the claim's own unclaim, a
prefetched job no thread started, a shutdown's hand-back, a handler that
stopped early at shutdown, a recovered lease, a retry after a failed
attempt or ``Retry``; and ``retry()`` of a finished one.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone

from tests.support.leases import claim_for, recover_lapsed
from tests.support.processes import Runjobs, wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.conf import conf
from vellum_jobs.core.attempts import SHUTTING_DOWN, Attempt
from vellum_jobs.core.models import Job
from vellum_jobs.execution import handler_run, outcome_writes, retry_policy
from vellum_jobs.execution.inline import execute
from vellum_jobs.execution.outcome import retry_later
from vellum_jobs.store import claim, leases
from vellum_jobs.store.claim import ClaimRequest
from vellum_jobs.testing import run_jobs
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

pytestmark = pytest.mark.django_db
ALIAS = "default"


def keyed(function=jobs.add, key: str = "k", **options):
    return function.using(unique_key=key, **options)


def claimed(job: Job) -> tuple[Job, uuid.UUID]:
    """``job``, claimed by a new worker (the only due job)."""
    worker = uuid.uuid4()
    (running,) = claim_for(worker)
    assert running.pk == job.pk
    return running, worker


# -- the ways a claimed job goes back to the queue ---------------------------


def unclaimed_by_the_claim(job: Job, worker: uuid.UUID) -> None:
    # What the claim does with a keyed job past its limit (PostgreSQL, MariaDB).
    claim._unclaim([job])


def prefetched_and_unstarted(job: Job, worker: uuid.UUID) -> None:
    # What the dispatcher does with a job that waited too long for a thread, or at shutdown.
    process = WorkerProcess(WorkerOptions(threads=1))
    process.dispatcher._cycle([], 0, unstarted=[Attempt(job, worker)])


def handed_back_at_shutdown(job: Job, worker: uuid.UUID) -> None:
    assert leases.hand_back(ALIAS, [Attempt(job, worker)], "handed back at shutdown") == 1


def stopped_early_at_shutdown(job: Job, worker: uuid.UUID) -> None:
    attempt = Attempt(job, worker)
    attempt.stop_seen = SHUTTING_DOWN  # the handler returned after should_stop() said so
    outcome_writes.record_many(ALIAS, [(attempt, handler_run.settle(attempt, handler_run.returned(job, 3)))])


def recovered_after_its_lease(job: Job, worker: uuid.UUID) -> None:
    recover_lapsed(ALIAS, now=timezone.now() + timedelta(seconds=2 * conf.lease))


def retried_after_a_failed_attempt(job: Job, worker: uuid.UUID) -> None:
    attempt = Attempt(job, worker)
    outcome_writes.record_many(ALIAS, [(attempt, retry_policy.failed_attempt(job, 0, "ValueError: boom"))])


def retried_when_it_raised_retry(job: Job, worker: uuid.UUID) -> None:
    attempt = Attempt(job, worker)
    outcome_writes.record_many(ALIAS, [(attempt, retry_later(60))])


PUT_BACK: list[Callable[[Job, uuid.UUID], None]] = [
    unclaimed_by_the_claim,
    prefetched_and_unstarted,
    handed_back_at_shutdown,
    stopped_early_at_shutdown,
    recovered_after_its_lease,
    retried_after_a_failed_attempt,
    retried_when_it_raised_retry,
]


# -- the key is kept ---------------------------------------------------------


@pytest.mark.parametrize("put_back", PUT_BACK, ids=lambda f: f.__name__)
def test_a_unique_job_put_back_in_the_queue_still_holds_its_key(put_back):
    first = keyed().enqueue(1, 2)
    put_back(*claimed(first))
    assert Job.objects.get(pk=first.pk).state == Job.State.QUEUED
    again = keyed().enqueue(5, 6)
    assert again.pk == first.pk
    assert Job.objects.count() == 1


@pytest.mark.parametrize("put_back", PUT_BACK, ids=lambda f: f.__name__)
def test_a_queued_or_running_job_put_back_keeps_the_key_it_held_while_it_ran(put_back):
    first = keyed(unique_while="queued_or_running").enqueue(1, 2)
    put_back(*claimed(first))
    assert Job.objects.get(pk=first.pk).state == Job.State.QUEUED
    assert keyed(unique_while="queued_or_running").enqueue(5, 6).pk == first.pk
    assert Job.objects.count() == 1


def test_a_job_whose_handler_failed_holds_its_key_while_it_waits_for_the_retry():
    first = keyed(jobs.raise_error).enqueue()
    running, worker = claimed(first)
    outcome = execute(running, worker)
    assert outcome.applied and outcome.state == Job.State.QUEUED
    assert keyed(jobs.raise_error).enqueue().pk == first.pk
    assert Job.objects.count() == 1


def test_a_job_whose_handler_raised_retry_holds_its_key_while_it_waits():
    first = keyed(jobs.retry_me).enqueue(60)
    execute(*claimed(first))
    assert keyed(jobs.retry_me).enqueue(60).pk == first.pk
    assert Job.objects.count() == 1


def test_a_job_the_claim_of_either_kind_took_past_its_limit_holds_its_key():
    sync = keyed(key="sync").enqueue(1, 2)
    coroutine = keyed(jobs.async_add, key="async").enqueue(1, 2)
    now = timezone.now()
    request = ClaimRequest(
        uuid.uuid4(), limit=1, now=now, lease_until=now + timedelta(seconds=conf.lease), is_async=None
    )
    (taken,) = claim.claim(connection, request)
    assert taken.pk == sync.pk
    assert Job.objects.get(pk=coroutine.pk).state == Job.State.QUEUED
    assert keyed(jobs.async_add, key="async").enqueue(3, 4).pk == coroutine.pk


def failed_with_key() -> Job:
    return Job.objects.create(name="test.add", unique_key="k", unique_while="queued", state=Job.State.FAILED)


def test_retry_of_a_failed_job_whose_key_a_put_back_job_holds_does_nothing():
    failed = failed_with_key()
    handed_back_at_shutdown(*claimed(keyed().enqueue(1, 2)))
    assert failed.retry() is False
    assert Job.objects.filter(pk=failed.pk).retry() == 0  # the admin's action and the jobs command
    assert Job.objects.get(pk=failed.pk).state == Job.State.FAILED


def test_a_retried_unique_job_holds_its_key():
    failed = failed_with_key()
    assert Job.objects.filter(pk=failed.pk).retry() == 1
    assert keyed().enqueue(1, 2).pk == failed.pk


# -- another job waits with the key: the one put back yields -----------------


def assert_superseded(job: Job, by: Job) -> None:
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.CANCELLED
    reason = f"superseded: job #{by.pk} waits with its unique key 'k' and runs in its place"
    assert row.error.startswith(reason)
    assert row.finished_at is not None and row.lease_expires_at is None
    assert Job.objects.get(pk=by.pk).state == Job.State.QUEUED


def assert_runs_in_its_place(job: Job, by: Job) -> None:
    assert keyed().enqueue(7, 8).pk == by.pk
    assert [ran.pk for ran in run_jobs()] == [by.pk]
    assert Job.objects.get(pk=by.pk).state == Job.State.DONE
    assert Job.objects.get(pk=job.pk).state == Job.State.CANCELLED


# Committed transactions, as a worker has them: a put-back in the worker's own
# BEGIN ... COMMIT takes a savepoint of its own, not one of Django's atomic().
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("put_back", PUT_BACK, ids=lambda f: f.__name__)
def test_a_unique_job_put_back_while_a_newer_one_waits_with_its_key_is_superseded_by_it(put_back):
    first = keyed().enqueue(1, 2)
    running, worker = claimed(first)
    newer = keyed().enqueue(3, 4)  # the first runs: it holds no "queued" key
    assert newer.pk != first.pk
    put_back(running, worker)
    assert_superseded(first, by=newer)
    assert_runs_in_its_place(first, by=newer)


def test_a_failed_attempt_whose_key_a_newer_job_took_ends_superseded_with_its_history():
    first = keyed(jobs.flaky).enqueue(2)  # its first attempt fails
    running, worker = claimed(first)
    newer = keyed().enqueue(3, 4)
    outcome = execute(running, worker)
    assert outcome.applied and (outcome.state, outcome.label) == (Job.State.CANCELLED, "superseded")
    assert_superseded(first, by=newer)
    row = Job.objects.get(pk=first.pk)
    assert "RuntimeError: attempt 1 fails" in row.error
    (entry,) = row.attempt_errors  # the attempt ended as it did: failed
    assert (entry["attempt"], entry["outcome"]) == (1, "failed")
    assert entry["error"] == "RuntimeError: attempt 1 fails"
    assert row.attempts == 1
    assert_runs_in_its_place(first, by=newer)


@pytest.mark.django_db(transaction=True)
def test_a_superseded_job_in_a_batch_leaves_the_other_outcomes_written():
    # Plain jobs whose writes share a statement (PostgreSQL, SQLite), and two
    # unique ones, one of whose key a newer job took.
    done = [jobs.add.enqueue(1, 1), jobs.add.enqueue(2, 2)]
    retried = [jobs.flaky.enqueue(2), jobs.flaky.enqueue(2)]
    first, other = keyed().enqueue(1, 2), keyed(key="other").enqueue(1, 2)
    worker = uuid.uuid4()
    running = {job.pk: job for job in claim_for(worker)}
    assert len(running) == 6
    newer = keyed().enqueue(3, 4)
    outcomes = [(Attempt(running[job.pk], worker), handler_run.returned(running[job.pk], 2)) for job in done]
    outcomes += [
        (Attempt(running[job.pk], worker), retry_policy.failed_attempt(running[job.pk], 0, "boom"))
        for job in (*retried, first, other)
    ]
    outcome_writes.record_many(ALIAS, outcomes)
    states = dict(Job.objects.values_list("pk", "state"))
    assert states == {
        **{job.pk: Job.State.DONE for job in done},
        **{job.pk: Job.State.QUEUED for job in retried},
        first.pk: Job.State.CANCELLED,
        other.pk: Job.State.QUEUED,
        newer.pk: Job.State.QUEUED,
    }
    assert "refused" not in Job.objects.get(pk=first.pk).error
    assert_superseded(first, by=newer)


@pytest.mark.django_db(transaction=True)
def test_of_two_running_jobs_with_one_key_put_back_together_the_first_keeps_it():
    first = keyed().enqueue(1, 2)
    (a,) = claim_for(uuid.uuid4())
    second = keyed().enqueue(3, 4)
    worker = uuid.uuid4()
    (b,) = claim_for(worker)
    assert (a.pk, b.pk) == (first.pk, second.pk)
    failed = [(Attempt(job, job.worker_id), retry_policy.failed_attempt(job, 0, "boom")) for job in (a, b)]
    outcome_writes.record_many(ALIAS, failed)
    assert_superseded(second, by=first)


def test_a_job_whose_put_back_the_fence_refuses_is_not_superseded():
    first = keyed().enqueue(1, 2)
    running, worker = claimed(first)
    keyed().enqueue(3, 4)
    Job.objects.filter(pk=first.pk).update(claims=running.claims + 1)  # claimed again elsewhere
    assert leases.hand_back(ALIAS, [Attempt(running, worker)], "handed back at shutdown") == 0
    assert Job.objects.get(pk=first.pk).state == Job.State.RUNNING


# -- upgrading ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_migration_leaves_one_waiting_job_per_key_the_one_the_old_index_held():
    call_command("migrate", "vellum_jobs", "0009", verbosity=0)
    # The job table as 0009 left it: the model of today has columns added since.
    Old = (
        MigrationLoader(connection)
        .project_state(("vellum_jobs", "0009_worker_clock_offset"))
        .apps.get_model("vellum_jobs", "Job")
    )
    try:
        before = timezone.now() - timedelta(minutes=1)
        # Under the old index a job that had started held no key.
        retrying = Old.objects.create(name="test.add", unique_key="k", started_at=before, error="boom")
        holder = Old.objects.create(name="test.add", unique_key="k")
        handed_back = [
            Old.objects.create(name="test.add", unique_key="h", started_at=before, priority=priority)
            for priority in (0, 5)
        ]
        alone = Old.objects.create(name="test.add", unique_key="alone", started_at=before)
    finally:
        call_command("migrate", "vellum_jobs", verbosity=0)
    states = dict(Job.objects.values_list("pk", "state"))
    assert states == {
        retrying.pk: Job.State.CANCELLED,
        holder.pk: Job.State.QUEUED,
        handed_back[0].pk: Job.State.CANCELLED,
        handed_back[1].pk: Job.State.QUEUED,  # the first in claim order
        alone.pk: Job.State.QUEUED,
    }
    reason = f"superseded: job #{holder.pk} waits with its unique key 'k' and runs in its place"
    assert Job.objects.get(pk=retrying.pk).error == f"{reason}\n\nboom"
    assert keyed().enqueue(1, 2).pk == holder.pk


# -- a real worker at SIGTERM ------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_job_handed_back_at_sigterm_while_a_newer_one_waits_with_its_key_is_superseded():
    first = keyed(jobs.sleep).enqueue(60)
    worker = Runjobs("--workers", "1", "--grace", "1")
    wait_for(lambda: Execution.objects.filter(job_id=first.pk).exists(), what="the first job's start")
    newer = keyed(jobs.sleep, delay=3600).enqueue(0)  # not due: the worker leaves it alone
    assert newer.pk != first.pk
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert_superseded(first, by=newer)
    assert "handed back at shutdown" in Job.objects.get(pk=first.pk).error
    assert keyed(jobs.sleep).enqueue(1).pk == newer.pk
    assert newer.run_now()
    assert [ran.pk for ran in run_jobs()] == [newer.pk]
    assert Job.objects.get(pk=newer.pk).state == Job.State.DONE
