"""Pruning finished jobs in batches, and the automatic retention ``runjobs`` applies."""

from __future__ import annotations

import re
import threading
from datetime import datetime, timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from vellum_jobs import retention
from vellum_jobs.models import Job, JobQuerySet

ALIAS = "default"
DAY = timedelta(days=1)


def finished_jobs(count: int, state: str = "done", ago: timedelta = 2 * DAY) -> list[int]:
    at = timezone.now() - ago
    Job.objects.bulk_create(Job(name="test.add", state=state, finished_at=at) for _ in range(count))
    return list(Job.objects.filter(state=state, finished_at=at).values_list("pk", flat=True))


def cutoffs(*states: str, age: timedelta = DAY) -> dict[str, datetime]:
    return dict.fromkeys(states, timezone.now() - age)


@pytest.mark.django_db
def test_prune_deletes_in_batches_of_the_batch_size():
    finished_jobs(7)
    with CaptureQueriesContext(connection) as queries:
        pruned = retention.prune(ALIAS, cutoffs("done"), batch_size=3)
    assert (pruned.counts, pruned.complete) == ({"done": 7}, True)
    deletes = [q["sql"] for q in queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_each_batch_commits_on_its_own(monkeypatch):
    finished_jobs(7)
    seen_by_another_connection = []

    def count_from_another_thread():
        # A thread has its own connection: it sees only committed rows.
        def count():
            seen_by_another_connection.append(Job.objects.count())
            connections.close_all()

        thread = threading.Thread(target=count)
        thread.start()
        thread.join()

    original = retention._delete_batch

    def delete_then_look(rows, batch_size):
        result = original(rows, batch_size)
        count_from_another_thread()
        return result

    monkeypatch.setattr(retention, "_delete_batch", delete_then_look)
    retention.prune(ALIAS, cutoffs("done"), batch_size=3)
    assert seen_by_another_connection == [4, 1, 0]


@pytest.mark.django_db
def test_prune_keeps_jobs_younger_than_their_state_s_cutoff():
    old_done = finished_jobs(2, "done", ago=10 * DAY)
    young_done = finished_jobs(2, "done", ago=3 * DAY)
    old_failed = finished_jobs(2, "failed", ago=10 * DAY)
    cancelled = finished_jobs(2, "cancelled", ago=10 * DAY)
    now = timezone.now()
    pruned = retention.prune(ALIAS, {"done": now - 7 * DAY, "failed": now - 30 * DAY})
    assert pruned.counts == {"done": 2, "failed": 0}
    remaining = set(Job.objects.values_list("pk", flat=True))
    assert remaining == {*young_done, *old_failed, *cancelled}
    assert not remaining & set(old_done)


@pytest.mark.django_db
def test_a_dry_run_counts_without_deleting():
    finished_jobs(5, "failed")
    pruned = retention.prune(ALIAS, cutoffs("failed", "done"), dry_run=True)
    assert pruned.counts == {"failed": 5, "done": 0}
    assert Job.objects.count() == 5


@pytest.mark.django_db
def test_a_passed_deadline_stops_before_the_next_batch_and_reports_rows_left():
    finished_jobs(5)
    pruned = retention.prune(ALIAS, cutoffs("done"), batch_size=2, deadline=0)
    assert (pruned.counts, pruned.complete) == ({"done": 0}, False)
    assert Job.objects.count() == 5


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["queued", "running", "nope"])
def test_prune_refuses_states_that_are_not_finished(state):
    finished_jobs(1, state)
    with pytest.raises(ValueError, match=f"'{state}' jobs cannot be pruned"):
        retention.prune(ALIAS, cutoffs(state))
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_a_job_retried_between_finding_and_deleting_it_is_not_deleted(monkeypatch):
    ids = finished_jobs(3, "failed")
    retried = ids[1]
    original = JobQuerySet.delete

    def retry_first(self):
        # Another process retries a job after prune picked its id.
        Job.objects.get(pk=retried).retry()
        return original(self)

    monkeypatch.setattr(JobQuerySet, "delete", retry_first)
    pruned = retention.prune(ALIAS, cutoffs("failed"))
    assert pruned.counts == {"failed": 2}
    assert list(Job.objects.values_list("pk", "state")) == [(retried, "queued")]


# What each vendor's plan says when pruning's scan walks the finished index in
# finished_at order (no sort step, no full scan).
PLAN = {
    "sqlite": (r"SEARCH vellum_jobs_job USING (COVERING )?INDEX vellum_job_finished", "TEMP B-TREE"),
    "postgresql": (r"Index (Only )?Scan using vellum_job_finished", "Sort"),
    "mysql": (r"vellum_job_finished \d+ ", "filesort"),  # the chosen key and its length
}


# A transaction test: MySQL's ANALYZE TABLE commits implicitly.
@pytest.mark.django_db(transaction=True)
def test_pruning_s_scan_uses_the_finished_index_on_a_big_table():
    now = timezone.now()
    Job.objects.bulk_create(
        Job(name="test.add", state=state, finished_at=now - timedelta(minutes=i))
        for i in range(6000)
        for state in ("done", "failed")
    )
    Job.objects.bulk_create(Job(name="test.add") for _ in range(2000))
    with connection.cursor() as cursor:
        cursor.execute(
            {"sqlite": "ANALYZE", "postgresql": "ANALYZE", "mysql": "ANALYZE TABLE vellum_jobs_job"}[
                connection.vendor
            ]
        )
        if connection.vendor == "mysql":
            cursor.fetchall()
        rows = retention.expired(ALIAS, "failed", now - timedelta(days=3))
        sql, params = rows.order_by("finished_at").values_list("pk", flat=True)[:500].query.sql_with_params()
        explain = "EXPLAIN QUERY PLAN" if connection.vendor == "sqlite" else "EXPLAIN"
        cursor.execute(f"{explain} {sql}", params)
        plan = "\n".join(" ".join(str(c) for c in row) for row in cursor.fetchall())
    uses_index, sort_step = PLAN[connection.vendor]
    assert re.search(uses_index, plan), plan
    assert sort_step not in plan, plan
