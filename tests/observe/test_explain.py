"""``Job.explain()``: each reason a queued job can have for waiting, and what other jobs say."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.support.leases import claim_for
from tests.support.workers import Background
from tests.testapp import jobs
from vellum_jobs import queues
from vellum_jobs.core import registry
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.observe.explain import explain

pytestmark = pytest.mark.django_db


def live_worker(queues: list[str] | None = None, names: list[str] | None = None, **fields) -> Worker:
    """A worker row as ``runjobs`` writes it (serving all queues, every registered name)."""
    fields.setdefault("last_heartbeat", timezone.now())
    return Worker.objects.create(
        id=uuid.uuid4(),
        host="test",
        pid=1,
        threads=1,
        queues=queues or [],
        names=registry.names() if names is None else names,
        **fields,
    )


def codes(job: Job) -> list[str]:
    return [reason.code for reason in job.explain()]


def test_a_due_job_with_a_live_worker_waits_for_a_free_thread():
    live_worker()
    job = jobs.add.enqueue(1, 2)
    (reason,) = job.explain()
    assert (reason.code, str(reason)) == ("ready", "due now: waiting for a free worker thread to claim it")


@pytest.mark.parametrize(
    ("delay", "words"),
    [(30, "30 s"), (120, "2 min"), (3184, "53 min"), (7500, "2 h 5 min"), (3 * 86400 + 4 * 3600, "3 d 4 h")],
)
def test_a_delayed_job_says_when_it_is_due_in_words(delay, words):
    live_worker()
    # Half a second more: the wait is read a moment after the enqueue, never a whole second later.
    job = jobs.add.using(delay=delay + 0.5).enqueue(1, 2)
    (reason,) = job.explain()
    assert reason.code == "delayed"
    assert reason.text.startswith(f"due in {words} (at ")


def test_a_failed_attempt_waits_out_its_retry_backoff():
    live_worker()
    job = jobs.add.enqueue(1, 2)
    until = timezone.now() + timedelta(minutes=5)
    error = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom\n'
    Job.objects.filter(pk=job.pk).update(attempts=2, max_attempts=5, run_after=until, error=error)
    (reason,) = Job.objects.get(pk=job.pk).explain()
    assert reason.code == "backoff"
    assert reason.text.startswith("retry backoff until ")
    assert "(in 5 min) after failed attempt" in reason.text
    assert "after failed attempt 2 of 5: ValueError: boom" in reason.text


def test_a_job_of_a_paused_queue_says_so():
    live_worker()
    queues.pause("media", by="ops")
    job = jobs.add.using(queue="media").enqueue(1, 2)
    (reason,) = job.explain()
    assert reason.code == "paused"
    assert reason.text.startswith("its queue 'media' is paused (since ")
    assert reason.text.endswith(" by ops)")


def test_without_a_live_worker_nothing_runs():
    live_worker(last_heartbeat=timezone.now() - timedelta(hours=1))  # stale
    job = jobs.add.enqueue(1, 2)
    assert codes(job) == ["no_worker"]
    assert "no live worker" in str(job.explain()[0])


@pytest.mark.django_db(transaction=True)
def test_no_live_worker_serves_its_queue():
    worker = Background(threads=1, queues=["mail", "media"])
    try:
        job = jobs.add.using(queue="reports").enqueue(1, 2)
        (reason,) = job.explain()
        assert reason.code == "no_worker"
        assert reason.text == "no live worker serves its queue 'reports' (they serve mail, media)"
    finally:
        worker.stop()


def test_a_coroutine_job_waits_for_a_place_on_an_event_loop():
    live_worker(async_workers=100)
    job = jobs.async_add.enqueue(1, 2)
    (reason,) = job.explain()
    assert reason.code == "ready"
    assert str(reason) == "due now: waiting for a free place on a worker's event loop"


def test_a_coroutine_job_says_when_no_live_worker_runs_coroutine_jobs():
    live_worker(async_workers=0)
    live_worker(queues=["other"], async_workers=100)
    job = jobs.async_add.enqueue(1, 2)
    (reason,) = job.explain()
    assert reason.code == "no_loop"
    assert str(reason).startswith("no live worker serving queue 'default' runs coroutine jobs (async def)")
    assert codes(jobs.add.enqueue(1, 2)) == ["ready"]  # a sync job is not held up by it


@pytest.mark.django_db(transaction=True)
def test_no_live_worker_has_its_name_registered():
    # A real worker records the names it can run; this job's name is not among them.
    worker = Background(threads=1, queues=["elsewhere"])
    Worker.objects.filter(pk=worker.worker.id).update(queues=[])
    try:
        job = jobs.add.enqueue(1, 2)
        Job.objects.filter(pk=job.pk).update(name="billing.charge")
        (reason,) = Job.objects.get(pk=job.pk).explain()
        assert reason.code == "no_handler"
        assert reason.text.startswith("no live worker serving queue 'default' has 'billing.charge' regist")
        assert "test.add" in Worker.objects.get(pk=worker.worker.id).names
    finally:
        worker.stop()


def test_a_full_concurrency_key_names_the_jobs_holding_it():
    live_worker()
    holder, waiting = jobs.keyed.enqueue_many([(1,), (1,)])
    claim_for(uuid.uuid4())
    (reason,) = waiting.explain()
    assert reason.code == "key_full"
    assert reason.text == f"its concurrency key 'acct:1' is full: 1 of 1 running (#{holder.pk})"
    assert reason.job_ids == (holder.pk,)


def test_a_job_behind_another_of_its_key_names_it():
    live_worker()
    first, second = jobs.keyed_pair.enqueue_many([(1,), (1,)])
    (reason,) = second.explain()
    assert reason.code == "key_behind"
    assert reason.job_ids == (first.pk,)
    assert codes(first) == ["ready"]


def test_a_page_of_jobs_behind_their_keys_is_explained_in_queries_per_key_not_per_job():
    live_worker()
    keyed = jobs.keyed_pair.enqueue_many([(key,) for key in (1, 2) for _ in range(10)])
    page = list(Job.objects.order_by("pk"))
    with CaptureQueriesContext(connection) as queries:
        reasons = explain(page)
    firsts = {keyed[0].pk, keyed[10].pk}
    assert [[r.code for r in reasons[pk]] for pk in sorted(firsts)] == [["ready"], ["ready"]]
    behind = [rs[0].job_ids for pk, rs in reasons.items() if pk not in firsts]
    assert behind == [(keyed[0].pk,)] * 9 + [(keyed[10].pk,)] * 9
    # Paused queues, live workers and running jobs by key; then each key's first due jobs.
    assert len(queries) == 3 + 2, [q["sql"] for q in queries.captured_queries]


# What a vendor's plan says when a query reads one of the concurrency-key indexes.
KEY_INDEX = {
    "sqlite": r"USING (COVERING )?INDEX vellum_job_key_(queued|running)",
    "postgresql": r"vellum_job_key_(queued|running)",
    "mysql": r"vellum_job_key_(queued|running)",
}


@pytest.mark.django_db(transaction=True)  # MySQL's ANALYZE TABLE commits
def test_the_key_queries_of_explain_read_the_key_indexes_on_a_big_table():
    """The key indexes hold only keyed jobs: a query that does not say so would scan the backlog."""
    jobs.add.enqueue_many([(i, i) for i in range(5_000)])
    first, waiting = jobs.keyed.enqueue_many([(1,), (1,)])
    with connection.cursor() as cursor:
        cursor.execute({"mysql": "ANALYZE TABLE vellum_jobs_job"}.get(connection.vendor, "ANALYZE"))
        if connection.vendor == "mysql":
            cursor.fetchall()
    # After the slow part: a heartbeat older than a lease is a dead worker's.
    live_worker()
    assert [r.job_ids for r in waiting.explain()] == [(first.pk,)]  # behind the first of its key
    with CaptureQueriesContext(connection) as queries:
        explain([Job.objects.get(pk=waiting.pk)])
    keyed = [q["sql"] for q in queries.captured_queries if re.search(r"concurrency_key\W* (IN|=) ", q["sql"])]
    assert len(keyed) == 2, [q["sql"] for q in queries.captured_queries]  # who holds the key, who is first
    explain_sql = "EXPLAIN QUERY PLAN" if connection.vendor == "sqlite" else "EXPLAIN"
    with connection.cursor() as cursor:
        for sql in keyed:
            cursor.execute(f"{explain_sql} {sql}")
            plan = "\n".join(" ".join(str(c) for c in row) for row in cursor.fetchall())
            assert re.search(KEY_INDEX[connection.vendor], plan), (sql, plan)


def test_every_reason_that_holds_is_given_most_telling_first():
    queues.pause("media")
    job = jobs.keyed.using(queue="media", delay=60).enqueue(1)
    assert codes(job) == ["delayed", "paused", "no_worker"]


def test_jobs_that_are_not_queued_say_what_they_are_doing():
    job = jobs.add.enqueue(1, 2)
    (claimed,) = claim_for(uuid.uuid4())
    claimed.cancel()
    (reason,) = Job.objects.get(pk=job.pk).explain()
    assert reason.code == "running"
    assert "not waiting: running since " in reason.text and "cancellation requested at " in reason.text
    Job.objects.filter(pk=job.pk).update(state=Job.State.DONE, finished_at=timezone.now())
    assert codes(Job.objects.get(pk=job.pk)) == ["done"]
