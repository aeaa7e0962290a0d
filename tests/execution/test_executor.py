from __future__ import annotations

import logging
import math
import re
import uuid
from datetime import timedelta

import pytest
from django.db import DatabaseError, OperationalError, connection
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

from tests.support.leases import claim_for
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs import Retry, current_job, set_progress, signals
from vellum_jobs.conf import MAX_DURATION, conf
from vellum_jobs.core import registry
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Job
from vellum_jobs.execution import handler_run, outcome_writes, retry_policy
from vellum_jobs.execution.context import running
from vellum_jobs.execution.inline import execute
from vellum_jobs.execution.retry_policy import retry_delay
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

pytestmark = pytest.mark.django_db


def run(job_function, *args, **kwargs) -> Job:
    """Enqueue, claim and execute one job; return its row afterwards."""
    job = job_function.enqueue(*args, **kwargs)
    return run_enqueued(job)


def run_enqueued(job: Job, names: list[str] | None = None) -> Job:
    worker = uuid.uuid4()
    (claimed,) = claim_for(worker, names=names)
    assert claimed.pk == job.pk
    execute(claimed, worker)
    return Job.objects.get(pk=job.pk)


def test_return_value_is_stored_and_the_job_is_done():
    job = run(jobs.add, 2, 3)
    assert (job.state, job.result, job.error, job.attempts) == (Job.State.DONE, 5, "", 1)
    assert job.finished_at >= job.started_at
    assert job.lease_expires_at is None


def test_a_result_that_is_not_json_keeps_the_job_done_and_says_why(caplog):
    with caplog.at_level(logging.WARNING, logger="vellum_jobs"):
        job = run(jobs.nonjson)
    assert job.state == Job.State.DONE
    assert job.result is None
    assert (
        "result not stored: the return value is a builtins.set, which is not JSON serializable" in job.error
    )
    assert "done, but its result was not stored" in caplog.text


@override_settings(VELLUM_JOBS={"BACKOFF_BASE": 100, "BACKOFF_MAX": 1000})
def test_an_exception_requeues_with_backoff_from_the_setting_and_keeps_the_traceback():
    before = timezone.now()
    job = run(jobs.boom)
    assert (job.state, job.attempts) == (Job.State.QUEUED, 1)
    assert "RuntimeError: boom" in job.error and "Traceback" in job.error
    assert before + timedelta(seconds=80) <= job.run_after <= timezone.now() + timedelta(seconds=120)
    assert job.worker_id is None and job.lease_expires_at is None


@override_settings(VELLUM_JOBS={"BACKOFF_BASE": 100, "BACKOFF_MAX": 150})
def test_backoff_is_capped_by_the_max_setting():
    job = jobs.boom.enqueue()
    Job.objects.filter(pk=job.pk).update(attempts=3)
    before = timezone.now()
    job = run_enqueued(job)
    assert job.attempts == 4
    assert job.run_after <= before + timedelta(seconds=151)


def test_a_job_s_own_backoff_overrides_the_setting():
    before = timezone.now()
    job = run(jobs.flaky, 5)  # backoff=0
    assert job.state == Job.State.QUEUED
    assert job.run_after <= before + timedelta(seconds=1)


def test_retry_delay_doubles_with_jitter_and_stops_at_the_cap():
    for attempt, expected in [(1, 30), (2, 60), (3, 120), (4, 240)]:
        delays = [retry_delay(attempt, 30, 3600) for _ in range(200)]
        assert expected * 0.8 <= min(delays) <= max(delays) <= expected * 1.2
        assert max(delays) - min(delays) > 0  # jitter is really there
    assert all(retry_delay(20, 30, 3600) <= 3600 for _ in range(50))
    assert retry_delay(3, 0, 3600) == 0


def test_attempts_exhausted_fail_the_job_with_the_last_traceback():
    job = jobs.raise_error.enqueue("again")  # max_attempts=3, backoff=0
    for expected_state in (Job.State.QUEUED, Job.State.QUEUED, Job.State.FAILED):
        job = run_enqueued(job)
        assert job.state == expected_state
    assert job.attempts == 3
    assert "ValueError: again" in job.error
    assert job.finished_at is not None
    assert Execution.objects.filter(job_id=job.pk).count() == 3


def test_retry_reschedules_without_using_an_attempt():
    before = timezone.now()
    job = run(jobs.retry_me, 60)
    assert job.state == Job.State.QUEUED
    assert job.attempts == 0
    assert before + timedelta(seconds=60) <= job.run_after <= timezone.now() + timedelta(seconds=60)


@pytest.mark.parametrize(
    ("delay", "problem"),
    [
        (math.nan, "nan is not a duration: it is not a number"),
        (math.inf, "inf is not a duration: it is longer than 100 years"),
        (1e12, "1000000000000.0 is not a duration: it is longer than 100 years"),
        (timedelta.max, f"{timedelta.max!r} is not a duration: it is longer than 100 years"),
        (-1, "-1 is not a duration: it is negative"),
    ],
)
def test_a_retry_delay_that_is_not_a_number_or_too_long_is_refused_naming_it(delay, problem):
    with pytest.raises(ValueError, match=rf"^Retry delay: {re.escape(problem)}"):
        Retry(delay)


def test_a_handler_s_retry_too_far_away_fails_its_attempt_with_the_reason():
    job = run(jobs.retry_me, 1e12)
    assert (job.state, job.attempts) == (Job.State.QUEUED, 1)
    assert (
        "ValueError: Retry delay: 1000000000000.0 is not a duration: it is longer than 100 years" in job.error
    )


def test_a_retry_of_the_longest_duration_is_recorded():
    before = timezone.now()
    job = run(jobs.retry_me, MAX_DURATION.total_seconds())
    assert (job.state, job.attempts) == (Job.State.QUEUED, 0)
    assert before + MAX_DURATION <= job.run_after <= timezone.now() + MAX_DURATION


def test_fail_fails_now_despite_attempts_left():
    job = run(jobs.fail_now, "invalid library")
    assert (job.state, job.attempts, job.max_attempts) == (Job.State.FAILED, 1, 5)
    assert "invalid library" in job.error


def test_a_job_this_process_has_no_handler_for_goes_back_to_the_queue_unstarted():
    # A claim takes only names the worker knows; one that took this name
    # anyway (a registry that changed under it) hands the job back, to wait
    # for a worker that knows it (vellum_jobs.maintenance.unknown_names fails it in time).
    before = timezone.now()
    job = run_enqueued(Job.objects.create(name="gone.away", max_attempts=5), names=["gone.away"])
    assert (job.state, job.attempts, job.worker_id, job.finished_at) == (Job.State.QUEUED, 0, None, None)
    assert job.run_after >= before + timedelta(seconds=conf.heartbeat)
    assert "cannot run 'gone.away': no handler registered under it" in job.error
    assert job.attempt_errors[-1]["outcome"] == "handed back"


def test_a_resolver_that_raises_fails_the_attempt_not_the_worker(monkeypatch):
    def broken(job: Job) -> None:
        raise DatabaseError("connection lost")

    monkeypatch.setattr(registry, "_resolvers", [broken])
    job = run_enqueued(Job.objects.create(name="gone.away", max_attempts=5), names=["gone.away"])
    assert (job.state, job.attempts) == (Job.State.QUEUED, 1)
    assert "DatabaseError: connection lost" in job.error


@pytest.mark.parametrize("job_function", [jobs.exit_, jobs.interrupt])
def test_system_exit_and_keyboard_interrupt_in_a_handler_are_its_failures(job_function):
    job = run(job_function)
    assert job.state == Job.State.FAILED
    assert ("SystemExit" in job.error) or ("KeyboardInterrupt" in job.error)


@pytest.mark.parametrize(
    ("args", "kwargs", "problem"),
    [
        ([1], {}, "missing a required argument: 'b'"),
        ([1, 2, 3], {}, "too many positional arguments"),
        ([], {"a": 1, "b": 2, "c": 3}, "unexpected keyword argument 'c'"),
        ({"a": 1}, {}, "args must be a JSON list"),
    ],
)
def test_stored_arguments_that_do_not_fit_fail_permanently_and_keep_the_row(args, kwargs, problem):
    job = Job.objects.create(name="test.add", args=args, kwargs=kwargs)
    job = run_enqueued(job)
    assert job.state == Job.State.FAILED
    assert problem in job.error
    assert job.args == args


def test_outcome_of_a_worker_that_lost_the_job_is_discarded(caplog):
    jobs.add.enqueue(1, 2)
    worker = uuid.uuid4()
    (claimed,) = claim_for(worker)
    # Meanwhile the lease lapsed and another worker took the job over.
    other = uuid.uuid4()
    Job.objects.filter(pk=claimed.pk).update(worker_id=other, attempts=2, claims=F("claims") + 1)
    with caplog.at_level(logging.WARNING, logger="vellum_jobs"):
        outcome = execute(claimed, worker)
    assert outcome.applied is False
    row = Job.objects.get(pk=claimed.pk)
    assert (row.state, row.worker_id, row.result) == (Job.State.RUNNING, other, None)
    assert "stale outcome discarded" in caplog.text


def test_signals_carry_the_job_with_its_outcome():
    seen = []

    def started(sender, job, **kwargs):
        seen.append(("started", sender, job.pk, job.state))

    def finished(sender, job, **kwargs):
        seen.append(("finished", sender, job.pk, job.state, job.result))

    signals.job_started.connect(started)
    signals.job_finished.connect(finished)
    try:
        job = run(jobs.add, 1, 1)
    finally:
        signals.job_started.disconnect(started)
        signals.job_finished.disconnect(finished)
    assert seen == [("started", Job, job.pk, Job.State.RUNNING), ("finished", Job, job.pk, Job.State.DONE, 2)]


def test_current_job_is_the_running_job_and_none_outside():
    assert current_job() is None
    job = run(jobs.record, "x")
    assert Execution.objects.get(job_id=job.pk).attempt == 1
    assert current_job() is None


def test_progress_is_recorded_on_the_row():
    job = run(jobs.progress, 4)
    assert (job.progress_done, job.progress_total, job.progress_message) == (4, 4, "step 4")


def test_outcomes_of_one_shape_share_one_fenced_statement_that_still_fences_each_row():
    jobs.add.enqueue_many([(i, i) for i in range(4)])
    jobs.retry_me.enqueue(60)
    worker = uuid.uuid4()
    claimed = sorted(claim_for(worker), key=lambda job: job.pk)
    # One of the added jobs was taken over by another worker meanwhile.
    stolen = claimed[1]
    Job.objects.filter(pk=stolen.pk).update(worker_id=uuid.uuid4(), attempts=2, claims=F("claims") + 1)
    attempts = [Attempt(job, worker) for job in claimed]
    finished = [(attempt, handler_run.run(attempt)) for attempt in attempts]
    outcomes = outcome_writes.OutcomeWrites(finished)
    # Per vendor: the four "done" outcomes in one UPDATE (one each on
    # MySQL), the refunded retry in its own.
    statements: list[str] = []

    def count(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        outcomes.write()
    assert len(statements) == (2 if connection.vendor != "mysql" else 5), statements
    outcomes.settle()
    assert [outcome.applied for _, outcome in finished] == [True, False, True, True, True]
    rows = {job.pk: job for job in Job.objects.all()}
    assert [rows[job.pk].state for job in claimed] == ["done", "running", "done", "done", "queued"]
    assert [rows[job.pk].result for job in claimed] == [0, None, 4, 6, None]
    assert rows[claimed[4].pk].attempts == 0  # Retry refunds its attempt
    assert all(rows[job.pk].lease_expires_at is None for job in claimed if job is not stolen)


# -- values the database refuses ----------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ((2**70, None), ValueError),
        ((1, 2**64), ValueError),
        ((-(2**63) - 1, None), ValueError),
        (("3", None), TypeError),
        ((1.5, None), TypeError),
        ((True, None), TypeError),
        ((1, "10"), TypeError),
    ],
)
def test_set_progress_refuses_what_its_columns_cannot_hold(value, error):
    with pytest.raises(error, match="set_progress"):
        set_progress(*value)


def test_set_progress_refuses_a_message_with_a_nul_character_and_stores_nothing():
    job = jobs.add.enqueue(1, 2)
    worker = uuid.uuid4()
    (claimed,) = claim_for(worker)
    attempt = Attempt(claimed, worker)
    with running(claimed, attempt.token):
        set_progress(1, 10, "first")
        with pytest.raises(ValueError, match="NUL"):
            set_progress(2, 10, "a\x00b")
        with pytest.raises(ValueError, match="64-bit"):
            set_progress(2**70, 10)
    row = Job.objects.get(pk=job.pk)
    assert (row.progress_done, row.progress_total, row.progress_message) == (1, 10, "first")
    assert (claimed.progress_done, claimed.progress_total, claimed.progress_message) == (1, 10, "first")


@pytest.mark.django_db(transaction=True)
def test_an_outcome_the_database_refuses_fails_only_its_job_and_the_worker_keeps_going():
    # 2**70 fits no database's bigint: the batch's write fails on every vendor.
    bad = jobs.unstorable_progress.enqueue()
    good = [jobs.add.enqueue(i, i) for i in range(5)]
    worker = WorkerProcess(WorkerOptions(threads=3, burst=True))
    assert worker.run() == 0
    row = Job.objects.get(pk=bad.pk)
    assert row.state == Job.State.FAILED
    assert "the database refused it" in row.error and "done" in row.error
    assert row.attempts == 1 and row.lease_expires_at is None  # the attempt counted, never refunded
    assert [Job.objects.get(pk=job.pk).result for job in good] == [0, 2, 4, 6, 8]


def test_a_result_with_a_nul_character_is_not_stored_on_any_database():
    job = run(jobs.nul_result)
    assert (job.state, job.result) == (Job.State.DONE, None)
    assert "NUL character" in job.error


@pytest.mark.django_db(transaction=True)
def test_a_refused_outcome_written_alone_also_fails_its_job():
    bad = jobs.unstorable_progress.enqueue()
    execute(claim_for(uuid.uuid4())[0], uuid.uuid4())
    row = Job.objects.get(pk=bad.pk)
    assert (row.state, row.attempts) == (Job.State.FAILED, 1)
    assert "the database refused it" in row.error


# -- cancellation racing the outcome --------------------------------------------


def test_a_cancellation_requested_after_the_handler_failed_stops_the_retry():
    job = jobs.raise_error.enqueue()
    worker = uuid.uuid4()
    (claimed,) = claim_for(worker)
    attempt = Attempt(claimed, worker)
    outcome = handler_run.run(attempt)
    assert outcome.state == Job.State.QUEUED  # a retry, not yet written
    assert Job.objects.get(pk=job.pk).cancel()  # lands between the handler's return and the write
    outcome_writes.record_many("default", [(attempt, outcome)])
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.CANCELLED
    assert "will not be retried" in row.error and "boom" in row.error
    assert row.lease_expires_at is None and row.finished_at is not None


def test_an_error_over_the_payload_limit_is_stored_cut_in_the_middle_and_the_job_retried():
    enqueued = jobs.ugly_error.enqueue(5000)
    with override_settings(VELLUM_JOBS={"MAX_PAYLOAD_BYTES": 2000}):
        job = run_enqueued(enqueued)
    assert job.state == Job.State.QUEUED  # retried as any failed attempt, not refused
    assert len(job.error.encode()) <= 2000
    assert "characters cut" in job.error
    assert job.error.startswith("Traceback") and job.error.rstrip().endswith("\\x00\\udc80 the end")


def test_a_retry_whose_write_fails_is_left_to_its_lease_not_taken_for_a_cancellation(monkeypatch):
    # write_each() writes outcomes one at a time after a batch was refused; a
    # retry's write that raises was not refused by the fence, and nobody asked
    # to cancel the job: it stays as it is, for its lease to bring back.
    jobs.boom.enqueue()
    worker_id = uuid.uuid4()
    (job,) = claim_for(worker_id)
    attempt = Attempt(job, worker_id)
    outcome = retry_policy.failed_attempt(job, 0, "boom")
    assert outcome.state == Job.State.QUEUED

    def unreachable(alias, attempt, write):
        raise OperationalError("the database went away")

    monkeypatch.setattr(outcome_writes, "_write_alone", unreachable)
    outcomes = outcome_writes.OutcomeWrites([(attempt, outcome)])
    outcomes.write_each(job._state.db or "default")
    stored = Job.objects.get(pk=job.pk)
    assert (stored.state, stored.cancel_requested_at) == (Job.State.RUNNING, None)
    assert not outcome.applied
