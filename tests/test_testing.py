"""The test helpers projects use: run_jobs, inline running, assertions, the job_queue fixture."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import TestCase, override_settings
from django.utils import timezone

from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.core.models import Job
from vellum_jobs.testing import assert_enqueued, enqueued_jobs, run_inline, run_jobs


class RunJobsInATestCase(TestCase):
    """Django's TestCase never commits: a runjobs process would see nothing."""

    def test_run_jobs_runs_due_jobs_in_the_test_s_transaction_and_returns_them(self):
        first = jobs.add.enqueue(1, 2)
        second = jobs.record.enqueue("x")
        ran = run_jobs()
        assert [job.pk for job in ran] == [first.pk, second.pk]
        assert [(job.state, job.result) for job in ran] == [("done", 3), ("done", "x")]
        assert Execution.objects.filter(job_id=second.pk, finished=True).exists()
        assert run_jobs() == []

    def test_jobs_that_jobs_enqueue_run_too(self):
        jobs.chain.enqueue(2, 3)
        ran = run_jobs()
        assert [(job.name, job.state) for job in ran] == [("test.chain", "done"), ("test.add", "done")]
        assert ran[1].result == 5

    def test_delayed_jobs_wait_unless_now_is_later(self):
        delayed = jobs.add.using(delay=timedelta(hours=1)).enqueue(1, 1)
        assert run_jobs() == []
        [ran] = run_jobs(now=timezone.now() + timedelta(hours=2))
        assert ran.pk == delayed.pk

    def test_a_failing_job_is_recorded_as_a_worker_records_it(self):
        jobs.boom.enqueue()
        [ran] = run_jobs()
        assert ran.state == Job.State.QUEUED
        assert "RuntimeError: boom" in ran.error
        assert ran.run_after > timezone.now()

    def test_run_jobs_can_take_only_some_queues(self):
        jobs.add.using(queue="slow").enqueue(1, 1)
        fast = jobs.add.enqueue(2, 2)
        assert [job.pk for job in run_jobs(queues=["default"])] == [fast.pk]

    def test_run_inline_runs_each_job_as_it_is_enqueued(self):
        with run_inline():
            job = jobs.add.enqueue(2, 5)
            assert (job.state, job.result) == ("done", 7)
            chained = jobs.chain.enqueue(1, 1)
        assert chained.state == "done"
        assert Job.objects.filter(name="test.add", state="done").count() == 2
        assert jobs.add.enqueue(1, 1).state == "queued"

    def test_the_run_inline_setting_runs_jobs_at_enqueue(self):
        with override_settings(VELLUM_JOBS={"RUN_INLINE": True}):
            assert jobs.add.enqueue(2, 2).result == 4
            with run_inline(False):
                assert jobs.add.enqueue(2, 2).state == "queued"

    def test_inline_unique_jobs_run_only_when_new(self):
        with run_inline():
            first = jobs.scan.enqueue(1)
            assert first.state == "done"
            second = jobs.scan.enqueue(1)
        assert second.pk != first.pk  # the first finished: its key is free again
        assert Execution.objects.count() == 2

    def test_assert_enqueued_matches_arguments_however_they_were_passed(self):
        job = jobs.scan.enqueue(3)
        assert assert_enqueued("test.scan", library_id=3) == job
        assert assert_enqueued(jobs.scan) == job
        with pytest.raises(AssertionError, match=r"no queued 'test.scan' job with \{'library_id': 4\}"):
            assert_enqueued(jobs.scan, library_id=4)

    def test_assert_enqueued_lists_what_is_queued_when_it_fails(self):
        jobs.add.enqueue(1, 2)
        with pytest.raises(AssertionError) as failure:
            assert_enqueued("test.add", a=5)
        assert "{'a': 1, 'b': 2}" in str(failure.value)

    def test_a_job_that_ran_is_no_longer_enqueued(self):
        jobs.add.enqueue(1, 2)
        run_jobs()
        with pytest.raises(AssertionError):
            assert_enqueued("test.add")

    def test_enqueued_jobs_lists_queued_jobs_by_name_oldest_first(self):
        a = jobs.add.enqueue(1, 2)
        r = jobs.record.enqueue()
        b = jobs.add.enqueue(3, 4)
        assert enqueued_jobs("test.add") == [a, b]
        assert enqueued_jobs() == [a, r, b]


def test_the_job_queue_fixture_runs_and_inspects_jobs(job_queue):
    jobs.add.enqueue(1, 2)
    assert job_queue.assert_enqueued("test.add", a=1).args == [1, 2]
    assert [job.result for job in job_queue.run()] == [3]
    assert job_queue.enqueued() == []
    with job_queue.inline():
        assert jobs.add.enqueue(4, 4).result == 8


@pytest.mark.django_db(transaction=True)
def test_run_jobs_works_outside_a_transaction_too():
    jobs.chain.enqueue(1, 2)
    assert [job.state for job in run_jobs()] == ["done", "done"]
