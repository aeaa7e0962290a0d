"""Attempts, not job ids: a timed-out handler and its job's retry running in one worker."""

from __future__ import annotations

import pytest

from tests.support.processes import wait_for
from tests.support.workers import Background
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.core.models import Job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def runs(job: Job) -> int:
    return Execution.objects.filter(job_id=job.pk).count()


def test_a_retry_claimed_while_its_timed_out_attempt_still_runs_keeps_its_own_deadline_and_lease(tmp_path):
    # Attempt 1 ignores its 0.5 s timeout until attempt 2 (claimed by the same
    # worker, on its other slot) lets it return; attempt 2 then ignores its own
    # timeout for 4 s, more than a lease (3 s in the tests). Attempt 2 must be
    # timed out on its own deadline, and stay held and renewed after attempt
    # 1's late return: not recovered as lost, not run a third time.
    job = jobs.stuck_first.enqueue(str(tmp_path / "release"))
    background = Background(threads=2, grace=30)
    try:
        wait_for(lambda: runs(job) == 2, what="the retry starting beside the timed-out attempt")
        row = wait_for(
            lambda: (r := Job.objects.get(pk=job.pk)).state == Job.State.FAILED and r,
            timeout=10,
            what="the second attempt timing out",
        )
        assert "timed out after 0.5s" in row.error and "worker lost" not in row.error
        assert row.attempts == 2 and row.result is None
        # Both handlers come back late; neither outcome is recorded.
        wait_for(lambda: Execution.objects.filter(job_id=job.pk, finished=True).count() == 2, timeout=10)
        assert background.worker.slots.held_attempts() == []
    finally:
        background.stop()
    assert runs(job) == 2
    row = Job.objects.get(pk=job.pk)
    assert (row.state, row.attempts, row.result) == (Job.State.FAILED, 2, None)
