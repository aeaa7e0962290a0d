from __future__ import annotations

import re
import threading
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from tests.support import bigtable
from tests.support.leases import claim_for
from tests.testapp import jobs
from vellum_jobs.core.models import Job
from vellum_jobs.store.claim import ClaimRequest, candidates

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


def test_a_claimed_job_holds_what_the_orm_loads_for_it():
    """The claim converts its returned columns itself (SQLite's datetimes by a shorter way)."""
    whole_second = timezone.now().replace(microsecond=0) - timedelta(seconds=5)
    created = [
        jobs.add.enqueue(1, 2),
        jobs.add.using(run_after=whole_second).enqueue(3, 4),
        jobs.keyed.enqueue(5),
    ]
    claimed = {job.pk: job for job in claim_for(uuid.uuid4())}
    assert set(claimed) == {job.pk for job in created}
    for loaded in Job.objects.filter(pk__in=claimed):
        job = claimed[loaded.pk]
        for name in ("run_after", "args", "kwargs", "priority", "timeout", "concurrency_key", "claims"):
            assert getattr(job, name) == getattr(loaded, name), name
            assert type(getattr(job, name)) is type(getattr(loaded, name)), name
        assert job.run_after.tzinfo is not None


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


def test_a_claim_of_either_kind_takes_both_in_claim_order_and_leaves_the_rest_queued():
    sync_low, sync_high = jobs.add.using(priority=1).enqueue(0, 0), jobs.add.using(priority=9).enqueue(0, 1)
    async_mid = jobs.async_add.using(priority=5).enqueue(0, 2)
    async_low = jobs.async_add.using(priority=0).enqueue(0, 3)
    assert [j.pk for j in claim_for(uuid.uuid4(), limit=2)] == [sync_high.pk, async_mid.pk]
    # The next of each kind were claimed too, and handed back unseen.
    rest = Job.objects.filter(pk__in=[sync_low.pk, async_low.pk])
    assert list(rest.values_list("state", "attempts", "worker_id")) == [("queued", 0, None)] * 2
    assert [j.pk for j in claim_for(uuid.uuid4(), limit=5)] == [sync_low.pk, async_low.pk]


def analyze() -> None:
    """Fresh planner statistics of the jobs table (MySQL's ANALYZE TABLE returns a result set)."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE vellum_jobs_job")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")


def backlog_of_both_kinds() -> tuple[str, ...]:
    # One scan over both kinds could not follow the claim index.
    jobs.add.enqueue_many([(i, i) for i in range(100)])
    jobs.async_add.enqueue_many([(i, i) for i in range(100)])
    return ()


def small_queue_behind_a_big_one() -> tuple[str, ...]:
    # A worker of one small queue: MariaDB's planner, left to itself, reads
    # that queue's jobs by vellum_job_queue and sorts them.
    jobs.add.enqueue_many([(i, i) for i in range(5000)])
    jobs.add.using(queue="small").enqueue_many([(i, i) for i in range(20)])
    analyze()
    return ("small",)


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite's claims run one at a time")
@pytest.mark.parametrize("backlog", [backlog_of_both_kinds, small_queue_behind_a_big_one])
def test_a_claim_leaves_the_jobs_it_does_not_take_to_a_concurrent_claim(backlog):
    # A locking read locks every row it reads: a plan that sorted the due
    # jobs would lock all of them for a claim of one, and a concurrent
    # claim would find none.
    queues = backlog()
    other: list[list[Job]] = []

    def claim_elsewhere() -> None:
        try:
            other.append(claim_for(uuid.uuid4(), limit=1, queues=queues))
        finally:
            connections.close_all()

    with transaction.atomic():
        (first,) = claim_for(uuid.uuid4(), limit=1, queues=queues)
        thread = threading.Thread(target=claim_elsewhere)
        thread.start()
        thread.join(30)
    assert not thread.is_alive()
    (([second],),) = (other,)
    assert second.pk != first.pk
    assert Job.objects.filter(state=Job.State.RUNNING).count() == 2


# What each vendor's plan says when the claim's scan walks its index in
# claim order (no sort step, no full scan).
PLAN = {
    "sqlite": (r"SEARCH vellum_jobs_job USING (COVERING )?INDEX vellum_job_claim", "TEMP B-TREE"),
    "postgresql": (r"Index (Only )?Scan using vellum_job_claim", "Sort"),
    "mysql": (r"vellum_job_claim", "filesort"),
}


def finished_rows(count: int = 20_000) -> None:
    bigtable.fill(count, state=Job.State.DONE, finished_at=timezone.now())


def claim_plan(limits: bool, is_async: bool = False) -> str:
    """The plan of the claim's candidate scan, after ANALYZE, as one string."""
    analyze()
    with connection.cursor() as cursor:
        now = timezone.now()
        # A worker's claim: for its threads or its event loop, one kind at a time.
        request = ClaimRequest(
            worker_id=uuid.uuid4(),
            limit=4,
            now=now,
            lease_until=now,
            queues=(),
            limits=limits,
            is_async=is_async,
        )
        sql, params = candidates(connection, request)
        explain = "EXPLAIN QUERY PLAN" if connection.vendor == "sqlite" else "EXPLAIN"
        cursor.execute(f"{explain} {sql}", params)
        return "\n".join(" ".join(str(c) for c in row) for row in cursor.fetchall())


# A transaction test: MySQL's ANALYZE TABLE commits implicitly. With and
# without the concurrency-key checks (workers with no keyed job skip them).
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("is_async", [False, True])
@pytest.mark.parametrize("limits", [True, False])
def test_claim_scan_uses_the_claim_index_on_a_big_table(limits, is_async):
    finished_rows()
    jobs.add.enqueue_many([(i, i) for i in range(20)])
    jobs.async_add.enqueue_many([(i, i) for i in range(20)])
    plan = claim_plan(limits, is_async)
    uses_index, sort_step = PLAN[connection.vendor]
    if not limits:
        # Asking only for jobs without a key (concurrency_key = ''), a planner
        # may walk vellum_job_key_queued from that key on: the same order.
        uses_index = uses_index.replace("vellum_job_claim", "vellum_job_(claim|key_queued)")
    assert re.search(uses_index, plan), plan
    assert sort_step not in plan, plan


# The keyed claim's checks, per vendor: both use a key index. (On MySQL these
# indexes are full ones; it has no partial indexes.)
KEY_PLAN = {
    "sqlite": (
        r"SEARCH running USING (COVERING )?INDEX vellum_job_key_running",
        r"SEARCH ahead USING (COVERING )?INDEX vellum_job_key_queued",
    ),
    "postgresql": (
        r"using vellum_job_key_running on vellum_jobs_job running",
        r"using vellum_job_key_queued on vellum_jobs_job ahead",
    ),
    "mysql": (r"running\b.*vellum_job_key_running", r"ahead\b.*vellum_job_key_queued"),
}


@pytest.mark.django_db(transaction=True)
def test_the_keyed_claim_s_checks_use_the_key_indexes_on_a_big_table():
    finished_rows()
    jobs.add.enqueue_many([(i, i) for i in range(2_000)])
    jobs.keyed.enqueue_many([(i % 50,) for i in range(200)])
    claim_for(uuid.uuid4(), limit=50)
    plan = claim_plan(limits=True)
    for index in KEY_PLAN[connection.vendor]:
        assert re.search(index, plan), plan


def running_by_key() -> dict[str, int]:
    return dict(
        Counter(Job.objects.running().exclude(concurrency_key="").values_list("concurrency_key", flat=True))
    )


def test_enqueue_stores_the_key_and_limit_from_the_arguments():
    job = jobs.keyed.enqueue(7)
    pair = jobs.keyed_pair.enqueue(account=8, seconds=1)
    assert (job.concurrency_key, job.concurrency_limit) == ("acct:7", 1)
    row = Job.objects.get(pk=pair.pk)
    assert (row.concurrency_key, row.concurrency_limit) == ("pair:8", 2)
    assert Job.objects.get(pk=jobs.add.enqueue(1, 2).pk).concurrency_key == ""


def test_claim_takes_at_most_one_job_per_key_and_never_more_than_its_limit():
    first = jobs.keyed.enqueue_many([(1,), (1,), (2,)])
    pairs = jobs.keyed_pair.enqueue_many([(1,)] * 4)
    plain = jobs.add.enqueue(0, 0)
    claimed = {j.pk for j in claim_for(uuid.uuid4(), limit=10)}
    # One per key per claim: the head of each key, and the job without a key.
    assert claimed == {first[0].pk, first[2].pk, pairs[0].pk, plain.pk}
    claimed = {j.pk for j in claim_for(uuid.uuid4(), limit=10)}
    assert claimed == {pairs[1].pk}  # acct:1 and acct:2 are full; pair:1 has room for one more
    assert claim_for(uuid.uuid4(), limit=10) == []
    assert running_by_key() == {"acct:1": 1, "acct:2": 1, "pair:1": 2}


def test_a_key_frees_a_slot_when_its_running_job_finishes():
    first, second = jobs.keyed.enqueue_many([(1,), (1,)])
    (claimed,) = claim_for(uuid.uuid4())
    assert claimed.pk == first.pk
    assert claim_for(uuid.uuid4()) == []
    Job.objects.filter(pk=first.pk).update(state=Job.State.DONE)
    assert [j.pk for j in claim_for(uuid.uuid4())] == [second.pk]


def test_a_key_s_jobs_start_in_claim_order_but_only_among_claimable_ones():
    later = jobs.keyed.using(priority=50, delay=3600).enqueue(1)  # ahead, but not due
    elsewhere = jobs.keyed.using(priority=40, queue="other").enqueue(1)  # ahead, but another queue
    low = jobs.keyed.using(priority=-1).enqueue(1)
    high = jobs.keyed.using(priority=1).enqueue(1)
    now = timezone.now()
    assert [j.pk for j in claim_for(uuid.uuid4(), queues=["default"], now=now)] == [high.pk]
    assert later.pk and elsewhere.pk and low.pk
    assert claim_for(uuid.uuid4(), now=now) == []  # acct:1 is full everywhere


def test_a_worker_that_registered_no_keyed_job_leaves_keyed_jobs_alone():
    keyed = jobs.keyed.enqueue(1)
    plain = jobs.add.enqueue(1, 1)
    assert [j.pk for j in claim_for(uuid.uuid4(), limits=False)] == [plain.pk]
    assert [j.pk for j in claim_for(uuid.uuid4())] == [keyed.pk]


def test_claim_skips_jobs_of_paused_queues():
    from vellum_jobs import queues

    media = jobs.add.using(queue="media").enqueue(1, 1)
    mail = jobs.add.using(queue="mail").enqueue(2, 2)
    queues.pause("media")
    assert [j.pk for j in claim_for(uuid.uuid4())] == [mail.pk]
    assert claim_for(uuid.uuid4(), queues=["media"]) == []
    queues.resume("media")
    assert [j.pk for j in claim_for(uuid.uuid4(), queues=["media"])] == [media.pk]


def test_claim_never_takes_a_job_whose_name_the_worker_does_not_know():
    # Ahead of the known job in claim order, of both kinds: a rolling deploy's new kinds.
    new = Job.objects.create(name="new.kind", priority=100)
    new_async = Job.objects.create(name="new.kind.async", is_async=True, priority=100)
    known = jobs.add.enqueue(1, 2)
    assert [j.pk for j in claim_for(uuid.uuid4())] == [known.pk]  # the registry's names
    assert claim_for(uuid.uuid4()) == []
    assert claim_for(uuid.uuid4(), names=["test.add"]) == []
    assert claim_for(uuid.uuid4(), names=[]) == []
    rows = Job.objects.filter(pk__in=[new.pk, new_async.pk])
    assert list(rows.values_list("state", "claims", "attempts")) == [("queued", 0, 0)] * 2
    taken = claim_for(uuid.uuid4(), names=["test.add", "new.kind", "new.kind.async"])
    assert [j.pk for j in taken] == [new.pk, new_async.pk]


def test_a_job_of_a_name_the_worker_does_not_know_holds_up_nothing_of_its_key():
    Job.objects.create(name="new.kind", concurrency_key="acct:1", concurrency_limit=1, priority=100)
    mine = jobs.keyed.enqueue(1)
    assert [j.pk for j in claim_for(uuid.uuid4())] == [mine.pk]


def test_a_django_task_is_taken_by_a_worker_that_runs_its_tasks_alias_whatever_its_names():
    task = Job.objects.create(name="tests.testapp.tasks.add", task_backend="default")
    assert claim_for(uuid.uuid4(), task_backends=[]) == []
    assert claim_for(uuid.uuid4(), task_backends=["other"]) == []
    assert [j.pk for j in claim_for(uuid.uuid4(), names=[], task_backends=["other", "default"])] == [task.pk]


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_exceed_a_key_s_limit():
    # Nothing finishes here, so every claim that got past a full key would show.
    jobs.keyed.enqueue_many([(i % 3,) for i in range(60)])
    jobs.keyed_pair.enqueue_many([(i % 3,) for i in range(60)])
    jobs.add.enqueue_many([(i, i) for i in range(60)])
    claimed: list[Job] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def claimer() -> None:
        try:
            start.wait()
            for _ in range(30):
                batch = claim_for(uuid.uuid4(), limit=3)
                with lock:
                    claimed.extend(batch)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    keys = Counter(j.concurrency_key for j in claimed if j.concurrency_key)
    assert keys == {"acct:0": 1, "acct:1": 1, "acct:2": 1, "pair:0": 2, "pair:1": 2, "pair:2": 2}
    assert running_by_key() == dict(keys)
    assert len({j.pk for j in claimed}) == len(claimed) == 9 + 60


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_read_before_another_committed_still_respects_the_limit():
    # Claim A takes acct:1's only job and has not committed when a job of
    # the same key that sorts ahead of it is enqueued. Claim B's read sees
    # that new job first in line and no running job of the key (A's is
    # uncommitted): only a check made after A commits keeps B off it.
    (first,) = jobs.keyed.enqueue_many([(1,)])
    a_claimed = threading.Event()
    a_may_commit = threading.Event()
    results: dict[str, list[int]] = {}

    def claim_a() -> None:
        try:
            with transaction.atomic():
                results["a"] = [j.pk for j in claim_for(uuid.uuid4())]
                a_claimed.set()
                assert a_may_commit.wait(30)
        finally:
            connections.close_all()

    def claim_b() -> None:
        try:
            results["b"] = [j.pk for j in claim_for(uuid.uuid4())]
        finally:
            connections.close_all()

    a = threading.Thread(target=claim_a)
    a.start()
    assert a_claimed.wait(30)
    ahead = jobs.keyed.using(priority=10).enqueue(1) if connection.vendor != "sqlite" else None
    b = threading.Thread(target=claim_b)
    b.start()
    b.join(0.5)  # B waits for A's lock (or, unchecked, claims at once)
    a_may_commit.set()
    a.join(30)
    b.join(30)
    assert results["a"] == [first.pk]
    assert results["b"] == []
    assert running_by_key() == {"acct:1": 1}
    if ahead is not None:
        assert Job.objects.get(pk=ahead.pk).state == Job.State.QUEUED
        assert Job.objects.get(pk=ahead.pk).attempts == 0
