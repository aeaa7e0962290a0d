"""The sentence a finished attempt is logged and printed as, for each kind of outcome."""

from __future__ import annotations

import pytest

from tests.testapp import jobs
from vellum_jobs.core.models import Job
from vellum_jobs.execution import outcome, outcome_text, retry_policy
from vellum_jobs.execution.outcome import Outcome

pytestmark = pytest.mark.django_db


def claimed(attempt: int, max_attempts: int = 4) -> Job:
    job = jobs.add.enqueue(1, 1)
    job.name, job.attempts, job.max_attempts, job.timeout = "mail.send", attempt, max_attempts, 30.0
    return job


def finished(job: Job, result: Outcome, duration: float, applied: bool = True) -> str:
    result.duration, result.applied = duration, applied
    if applied and result.refund_attempt:
        job.attempts -= 1  # as the write that applied left it
    return outcome_text.sentence(job, result)


def test_each_outcome_reads_as_a_sentence_with_the_job_attempt_duration_and_what_comes_next():
    job = claimed(2)
    line = finished(job, retry_policy.failed_attempt(job, 1.0, "boom"), 3.04)
    assert line.startswith(f"mail.send #{job.pk} failed on attempt 2 of 4 after 3.0 s, retry in ")
    assert line.endswith(" s") and "ms" not in line
    job = claimed(2)
    line = finished(job, retry_policy.timed_out(job), 30.0)
    assert line.startswith(f"mail.send #{job.pk} timed out on attempt 2 of 4 after 30.0 s, retry in ")
    job = claimed(4)
    assert finished(job, retry_policy.timed_out(job), 30.0).endswith("after 30.0 s, no attempt left: failed")
    job = claimed(1)
    line = finished(job, outcome.failed("Fail('bad input')"), 0.25)
    assert line == f"mail.send #{job.pk} failed on attempt 1 of 4 after 0.2 s, not retried: failed"
    job = claimed(1)
    assert (
        finished(job, outcome.done(3, ""), 1.0) == f"mail.send #{job.pk} done on attempt 1 of 4 after 1.0 s"
    )
    job = claimed(3)
    line = finished(job, outcome.retry_later(60), 0.5)
    assert line.startswith(f"mail.send #{job.pk} asked to retry on attempt 3 of 4 after 0.5 s: due again in ")
    job = claimed(3)
    line = finished(job, outcome.stopped_at_shutdown(), 2.0)
    assert line == (
        f"mail.send #{job.pk} stopped early at shutdown on attempt 3 of 4 after 2.0 s:"
        " handed back, due now, not counted"
    )
    job = claimed(2)
    line = finished(job, outcome.done(3, ""), 1.0, applied=False)
    assert line == (
        f"mail.send #{job.pk} ended attempt 2 of 4 after 1.0 s, but its outcome (done) was discarded:"
        " the job is no longer held by this claim"
    )


def test_the_kind_of_each_outcome_names_it_in_one_word():
    job = claimed(1)
    cases = {
        outcome_text.DONE: outcome.done(1, ""),
        outcome_text.FAILED: outcome.failed("x"),
        outcome_text.RETRY: retry_policy.failed_attempt(job, 1.0, "x"),
        outcome_text.SNOOZED: outcome.retry_later(5),
        outcome_text.HANDED_BACK: outcome.stopped_at_shutdown(),
    }
    for kind, result in cases.items():
        result.applied = True
        assert outcome_text.kind(result) == kind
        assert " " not in kind
    cases[outcome_text.DONE].applied = False
    assert outcome_text.kind(cases[outcome_text.DONE]) == outcome_text.DISCARDED
