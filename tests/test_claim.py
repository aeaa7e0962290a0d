from __future__ import annotations

import re
import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from tests.conftest import claim_for
from tests.testapp import jobs
from vellum_jobs.claim import ClaimRequest, candidates
from vellum_jobs.models import Job

pytestmark = pytest.mark.django_db


def test_claim_marks_jobs_running_for_the_worker_and_counts_the_attempt():
    job = jobs.add.enqueue(1, 2)
    worker = uuid.uuid4()
    before = timezone.now()
    (claimed,) = claim_for(worker)
    assert claimed.pk == job.pk
    assert (claimed.name, claimed.args, claimed.kwargs, claimed.attempts) == ("test.add", [1, 2], {}, 1)
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.RUNNING
    assert row.worker_id == worker
    assert row.attempts == 1
    assert row.started_at >= before
    assert row.lease_expires_at > row.started_at


def test_claim_order_is_priority_then_run_after_then_id():
    now = timezone.now()
    low = jobs.add.using(priority=-5).enqueue(0, 0)
    later = jobs.add.using(run_after=now - timedelta(seconds=1)).enqueue(0, 1)
    earlier = jobs.add.using(run_after=now - timedelta(seconds=2)).enqueue(0, 2)
    same_time_a = jobs.add.using(priority=7, run_after=now - timedelta(seconds=3)).enqueue(0, 3)
    same_time_b = jobs.add.using(priority=7, run_after=now - timedelta(seconds=3)).enqueue(0, 4)
    high = jobs.add.using(priority=100).enqueue(0, 5)
    order = [j.pk for j in claim_for(uuid.uuid4(), limit=10)]
    assert order == [high.pk, same_time_a.pk, same_time_b.pk, earlier.pk, later.pk, low.pk]


def test_claim_takes_at_most_limit_in_order():
    created = jobs.add.enqueue_many([(i, i) for i in range(5)])
    first = claim_for(uuid.uuid4(), limit=2)
    second = claim_for(uuid.uuid4(), limit=2)
    assert [j.pk for j in first + second] == [j.pk for j in created[:4]]
    assert claim_for(uuid.uuid4(), limit=0) == []


def test_claim_skips_jobs_that_are_not_due():
    jobs.add.using(delay=60).enqueue(1, 2)
    assert claim_for(uuid.uuid4()) == []
    assert len(claim_for(uuid.uuid4(), now=timezone.now() + timedelta(seconds=61))) == 1


def test_claim_only_serves_the_requested_queues():
    jobs.add.using(queue="a").enqueue(1, 1)
    jobs.add.using(queue="b").enqueue(2, 2)
    jobs.add.using(queue="c").enqueue(3, 3)
    assert sorted(j.queue for j in claim_for(uuid.uuid4(), queues=["a", "c"])) == ["a", "c"]
    assert [j.queue for j in claim_for(uuid.uuid4())] == ["b"]


def test_claim_ignores_jobs_in_other_states():
    for state in (Job.State.RUNNING, Job.State.DONE, Job.State.FAILED, Job.State.CANCELLED):
        Job.objects.create(name="test.add", state=state)
    assert claim_for(uuid.uuid4()) == []


def test_claimed_job_loads_the_fields_it_did_not_return_on_access():
    jobs.add.enqueue(1, 2)
    (claimed,) = claim_for(uuid.uuid4())
    assert claimed.state == Job.State.RUNNING
    assert claimed.error == ""


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_get_the_same_job():
    jobs.add.enqueue_many([(i, i) for i in range(200)])
    claimed: list[int] = []
    lock = threading.Lock()

    def claimer() -> None:
        try:
            while batch := claim_for(uuid.uuid4(), limit=3):
                with lock:
                    claimed.extend(j.pk for j in batch)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claimed) == 200
    assert len(set(claimed)) == 200


# What each vendor's plan says when the claim's scan walks its index in
# claim order (no sort step, no full scan).
PLAN = {
    "sqlite": (r"SEARCH vellum_jobs_job USING (COVERING )?INDEX vellum_job_claim", "TEMP B-TREE"),
    "postgresql": (r"Index (Only )?Scan using vellum_job_claim", "Sort"),
    "mysql": (r"vellum_job_claim", "filesort"),
}


# A transaction test: MySQL's ANALYZE TABLE commits implicitly.
@pytest.mark.django_db(transaction=True)
def test_claim_scan_uses_the_claim_index_on_a_big_table():
    Job.objects.bulk_create(
        Job(name="test.add", state=Job.State.DONE, finished_at=timezone.now()) for _ in range(20_000)
    )
    jobs.add.enqueue_many([(i, i) for i in range(20)])
    with connection.cursor() as cursor:
        cursor.execute(
            {"sqlite": "ANALYZE", "postgresql": "ANALYZE", "mysql": "ANALYZE TABLE vellum_jobs_job"}[
                connection.vendor
            ]
        )
        if connection.vendor == "mysql":
            cursor.fetchall()
        request = ClaimRequest(
            worker_id=uuid.uuid4(), limit=4, now=timezone.now(), lease_until=timezone.now(), queues=()
        )
        sql, params = candidates(connection, request)
        explain = "EXPLAIN QUERY PLAN" if connection.vendor == "sqlite" else "EXPLAIN"
        cursor.execute(f"{explain} {sql}", params)
        plan = "\n".join(" ".join(str(c) for c in row) for row in cursor.fetchall())
    uses_index, sort_step = PLAN[connection.vendor]
    assert re.search(uses_index, plan), plan
    assert sort_step not in plan, plan
