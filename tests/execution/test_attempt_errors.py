"""``Job.attempt_errors``: each attempt that ended without a result, appended by the write that ends it."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.leases import claim_for, recover_lapsed
from tests.testapp import jobs
from vellum_jobs.core import history
from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Job
from vellum_jobs.store import leases
from vellum_jobs.testing import run_jobs
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

pytestmark = pytest.mark.django_db
ALIAS = "default"


def test_a_job_that_fails_twice_then_succeeds_keeps_both_failures():
    job = jobs.flaky.enqueue(3)
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.result, job.attempts) == (Job.State.DONE, 3, 3)
    first, second = job.attempt_errors
    assert [e["attempt"] for e in (first, second)] == [1, 2]
    assert [e["outcome"] for e in (first, second)] == [history.FAILED] * 2
    assert first["error"] == "RuntimeError: attempt 1 fails"
    assert second["error"] == "RuntimeError: attempt 2 fails"
    assert "Traceback (most recent call last)" in first["traceback"]
    assert first["worker"] == history.this_process()
    assert first["worker_id"] is not None
    started, ended = (datetime.fromisoformat(first[k]) for k in ("started_at", "ended_at"))
    assert job.created_at <= started <= ended <= job.finished_at
    assert first["duration"] == pytest.approx((ended - started).total_seconds())


def test_each_entry_names_the_claim_of_its_attempt():
    # The claim counter is the attempt's fencing token: with it an entry says
    # which run of the job it was, even across a retry() that starts the
    # attempts over (the claim counter never resets).
    job = jobs.raise_error.enqueue()  # three attempts, no backoff
    run_jobs()
    assert job.retry()
    run_jobs()
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert [(e["attempt"], e["claim"]) for e in job.attempt_errors] == [
        (1, 1), (2, 2), (3, 3), (1, 4), (2, 5), (3, 6)
    ]  # fmt: skip


def test_the_last_failure_is_kept_with_the_others():
    job = jobs.raise_error.enqueue("nope")
    run_jobs()
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert [(e["attempt"], e["error"]) for e in job.attempt_errors] == [
        (n, "ValueError: nope") for n in (1, 2, 3)
    ]


def test_the_list_keeps_the_newest_entries_up_to_its_limit():
    job = jobs.flaky.enqueue(history.LIMIT + 6)
    Job.objects.filter(pk=job.pk).update(max_attempts=history.LIMIT + 6)
    run_jobs()
    job.refresh_from_db()
    assert job.state == Job.State.DONE
    assert len(job.attempt_errors) == history.LIMIT
    assert [e["attempt"] for e in job.attempt_errors] == list(range(6, history.LIMIT + 6))


def test_a_retry_requested_by_the_handler_and_a_success_are_told_apart():
    job = jobs.retry_me.enqueue(60)
    run_jobs()
    job.refresh_from_db()
    (entry,) = job.attempt_errors
    assert (entry["outcome"], entry["error"]) == (history.RETRY, "retry requested in 60.0s")
    done = jobs.add.enqueue(1, 2)
    run_jobs()
    done.refresh_from_db()
    assert done.attempt_errors == []


def test_a_lost_attempt_is_kept_with_its_worker():
    jobs.add.enqueue(1, 2)
    worker = uuid.uuid4()
    (claimed,) = claim_for(worker)
    Job.objects.filter(pk=claimed.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert recover_lapsed(ALIAS) == [(claimed.pk, "queued")]
    (entry,) = Job.objects.get(pk=claimed.pk).attempt_errors
    assert (entry["attempt"], entry["outcome"], entry["worker_id"]) == (1, history.LOST, str(worker))
    assert entry["claim"] == claimed.claims == 1
    assert entry["error"].startswith("worker lost: its lease expired during attempt 1")


def test_a_handed_back_attempt_is_kept():
    jobs.add.enqueue(1, 2)
    worker = uuid.uuid4()
    (claimed,) = claim_for(worker)
    assert leases.hand_back(ALIAS, [Attempt(claimed, worker)], "handed back at shutdown") == 1
    (entry,) = Job.objects.get(pk=claimed.pk).attempt_errors
    assert entry["claim"] == claimed.claims == 1
    assert (entry["outcome"], entry["error"], entry["worker"]) == (
        history.HANDED_BACK,
        "handed back at shutdown",
        history.this_process(),
    )


def test_a_claimed_job_does_not_read_the_list():
    jobs.raise_error.enqueue()
    (claimed,) = claim_for(uuid.uuid4())
    assert "attempt_errors" in claimed.get_deferred_fields()


@pytest.mark.django_db(transaction=True)
def test_a_worker_s_batched_outcome_writes_append_to_each_job_its_own_entries():
    # Outcomes of one kind go out in one statement (a VALUES list on SQLite
    # and PostgreSQL): each row gets its own entry, of its own attempt.
    created = jobs.raise_error.enqueue_many([(f"job {i}",) for i in range(12)])
    created += jobs.async_fail.enqueue_many([("raise",) for _ in range(4)])
    WorkerProcess(WorkerOptions(threads=4, burst=True)).run()
    for job in Job.objects.filter(pk__in=[j.pk for j in created]):
        assert job.state == Job.State.FAILED
        assert [e["attempt"] for e in job.attempt_errors] == list(range(1, job.max_attempts + 1))
        message = job.args[0] if job.name == "test.raise" else None
        if message is not None:
            assert {e["error"] for e in job.attempt_errors} == {f"ValueError: {message}"}


def test_the_job_page_lists_the_attempts_newest_first(admin_client):
    job = jobs.flaky.enqueue(3)
    run_jobs()
    html = admin_client.get(reverse("admin:vellum_jobs_job_change", args=[job.pk])).content.decode()
    table = html[html.index('<table class="vellum-attempts">') :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 3  # the head and two attempts
    assert table.index("RuntimeError: attempt 2 fails") < table.index("RuntimeError: attempt 1 fails")
    assert f"<td>{history.this_process()}</td>" in table
    assert "Traceback (most recent call last)" in table
