"""Fair shares (``vellum_jobs.enqueueing.fairness``): jobs with a fair key take turns with the
other keys' jobs of their queue, by the turns they get at enqueue; the claim is unchanged.

Most tests read the order in which the real claim takes the jobs. A backlog there is made to
have waited (its turns moved an hour back), as a backlog in a busy queue has: the order is then
decided by the turns alone, not by how fast the test ran.
"""

from __future__ import annotations

import re
import signal
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.support import bigtable
from tests.support.leases import claim_for
from tests.support.processes import REAL_LEASE, Runjobs, wait_for
from tests.support.workers import burst
from tests.testapp import jobs
from tests.testapp.fair_jobs import fair
from tests.testapp.models import Execution
from vellum_jobs import chain
from vellum_jobs.core.models import Job
from vellum_jobs.enqueueing import fairness

pytestmark = pytest.mark.django_db

QUEUE = "fair"
HOUR = timedelta(hours=1)


def waited(tenant: str, by: timedelta = HOUR) -> None:
    """Move ``tenant``'s queued turns back, as if its backlog had waited that long."""
    rows = Job.objects.filter(fair_key=f"tenant:{tenant}", state=Job.State.QUEUED)
    rows.update(fair_at=F("fair_at") - by, run_after=F("run_after") - by)


def claim_order(count: int = 1000) -> list[str]:
    """The jobs of the fair queue as the claim takes them: "A1" for tenant A's job 1."""
    claimed = claim_for(uuid.uuid4(), limit=count, queues=(QUEUE,), now=timezone.now() + HOUR)
    return [f"{job.args[0]}{job.args[1]}" for job in claimed]


def test_a_new_key_s_jobs_take_turns_with_a_backlog_and_the_backlog_s_key_queues_behind_its_own():
    fair.enqueue_many([("A", i) for i in range(1, 6)])
    waited("A")
    fair.enqueue_many([("B", i) for i in range(1, 4)])
    fair.enqueue("A", 6)
    # B's turns follow the queue's first (A1's), one spacing apart, as A's do; a tie goes to the
    # older job. A's new job comes after A's backlog.
    assert claim_order() == ["A1", "A2", "B1", "A3", "B2", "A4", "B3", "A5", "A6"]


def test_a_job_s_turn_is_its_run_after_and_in_an_empty_queue_follows_now():
    (job,) = fair.enqueue_many([("A", 1)])
    row = Job.objects.get(pk=job.pk)
    assert (row.fair_key, row.fair_at, row.run_after) == ("tenant:A", job.fair_at, job.fair_at)
    assert row.fair_at == row.created_at + fairness.step(1)


def test_the_jobs_of_one_enqueue_get_successive_turns_per_key_whatever_their_order():
    created = fair.enqueue_many([("A", 1), ("B", 1), ("A", 2), ("A", 3), ("B", 2)])
    turns = {
        f"{job.args[0]}{job.args[1]}": job.fair_at
        for job in Job.objects.filter(pk__in=[j.pk for j in created])
    }
    step = fairness.step(1)
    assert turns["A2"] - turns["A1"] == turns["A3"] - turns["A2"] == step
    assert turns["B2"] - turns["B1"] == step
    assert turns["A1"] == turns["B1"]  # both keys start at the queue's head


def test_one_query_per_key_finds_an_enqueue_s_turns():
    fair.enqueue_many([("A", i) for i in range(20)])
    with CaptureQueriesContext(connection) as queries:
        fair.enqueue_many([(tenant, i) for i in range(10) for tenant in "ABC"])
    turn_queries = [
        q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT") and "fair_at" in q["sql"]
    ]
    assert len(turn_queries) == 3, turn_queries


def test_a_heavier_key_takes_as_many_turns_as_its_weight_to_a_lighter_one_s():
    fair.enqueue_many([("A", i) for i in range(60)])
    waited("A")
    fair.using(fair_weight=3).enqueue_many([("C", i) for i in range(90)])
    taken = Counter(name[0] for name in claim_order()[:80])
    # Both keys' turns from A's first on: 60 us apart for A, 20 us for C.
    assert 18 <= taken["A"] <= 22, taken
    assert taken["C"] == 80 - taken["A"]


def test_turns_are_per_queue():
    fair.enqueue_many([("A", i) for i in range(5)])
    waited("A", by=-HOUR)  # turns an hour ahead
    (elsewhere,) = fair.using(queue="other").enqueue_many([("A", 99)])
    # Not behind A's backlog of the fair queue: the other queue has none.
    assert elsewhere.fair_at == elsewhere.created_at + fairness.step(1)


def test_a_job_put_back_to_run_later_keeps_its_turn_but_is_not_the_queue_s_head():
    fair.enqueue_many([("A", i) for i in range(1, 6)])
    waited("A")
    # As a retry leaves it: its turn, and a run_after in the future.
    Job.objects.filter(args=["A", 1]).update(run_after=timezone.now() + HOUR / 2)
    fair.enqueue_many([("B", i) for i in range(1, 4)])
    assert claim_order() == ["A2", "A3", "B1", "A4", "B2", "A5", "B3", "A1"]


def test_a_delayed_or_waiting_job_keeps_its_key_but_gets_no_turn():
    delayed = fair.using(delay=60).enqueue("A", 1)
    later = fair.using(run_after=timezone.now() + HOUR).enqueue("A", 2)
    upstream = jobs.add.enqueue(1, 2)
    waiting = fair.using(after=[upstream]).enqueue("A", 3)
    rows = Job.objects.filter(pk__in=[delayed.pk, later.pk, waiting.pk]).order_by("pk")
    assert [(row.fair_key, row.fair_at) for row in rows] == [("tenant:A", None)] * 3
    assert [row.state for row in rows] == [Job.State.QUEUED, Job.State.QUEUED, Job.State.WAITING]
    assert rows[0].run_after >= rows[0].created_at + timedelta(seconds=60)
    # None of them is a turn that the key's next job must queue behind.
    now = fair.enqueue("A", 4)
    assert now.fair_at == now.created_at + fairness.step(1)


@pytest.mark.django_db(transaction=True)
def test_a_chain_of_fair_jobs_runs_its_first_step_in_turn_and_the_next_when_released():
    flow = chain(fair.si("A", 1), fair.si("A", 2)).enqueue()
    first, second = flow.steps().order_by("pk")
    assert (first.state, first.fair_key, first.fair_at == first.run_after) == ("queued", "tenant:A", True)
    assert (second.state, second.fair_key, second.fair_at) == ("waiting", "tenant:A", None)
    burst(threads=1)
    assert [step.state for step in flow.steps()] == [Job.State.DONE] * 2
    assert Counter(Execution.objects.values_list("note", flat=True)) == {"A:1": 1, "A:2": 1}


def test_a_key_that_cannot_be_made_is_refused_and_nothing_is_written():
    with pytest.raises(
        ValueError, match=r"fair_key key 'tenant:\{customer\}' of job 'test.fair': .*'customer'"
    ):
        fair.using(fair_key="tenant:{customer}").enqueue_many([("A", 1), ("B", 2)])
    # The first call's key was good: the last one's is too long.
    with pytest.raises(ValueError, match=r"fair_key key of job 'test.fair' must .* up to 255 characters"):
        fair.using(fair_key=lambda tenant: tenant).enqueue_many([("A", 1), ("x" * 256, 2)])
    with pytest.raises(ValueError, match="fair_key"):
        fair.using(fair_key=lambda tenant: "").enqueue("A", 1)
    assert not Job.objects.exists()


def test_jobs_without_a_fair_key_get_no_turn_and_are_due_when_enqueued():
    created = [jobs.add.enqueue(1, 2), *jobs.add.enqueue_many([(1, 2), (3, 4)])]
    created.append(jobs.keyed.enqueue(1))  # the per-call path
    rows = Job.objects.filter(pk__in=[job.pk for job in created])
    assert [(row.fair_key, row.fair_at, row.run_after == row.created_at) for row in rows] == [
        ("", None, True)
    ] * 4


# What each vendor's plan names when the two halves of the turn query walk the fair indexes.
PLAN = {
    "sqlite": (
        r"USING (COVERING )?INDEX vellum_job_fair_key\b",
        r"USING (COVERING )?INDEX vellum_job_fair_turn\b",
    ),
    "postgresql": (r"vellum_job_fair_key\b", r"vellum_job_fair_turn\b"),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor not in PLAN, reason="MySQL and MariaDB have no partial indexes")
def test_the_turn_query_walks_the_fair_indexes_on_a_big_table():
    # Finished fair jobs keep their key and turn; a partial index holds none of them.
    bigtable.fill(20_000, name="test.fair", queue=QUEUE, state=Job.State.DONE, fair_key="tenant:A",
                  fair_at=timezone.now() - HOUR, finished_at=timezone.now())  # fmt: skip
    fair.enqueue_many([("A", i) for i in range(500)])
    fair.enqueue_many([("B", i) for i in range(10)])
    jobs.add.using(queue=QUEUE).enqueue_many([(i, i) for i in range(500)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        sql, params = fairness.ends_statement(connection, QUEUE, "tenant:B", timezone.now())
        explain = "EXPLAIN QUERY PLAN" if connection.vendor == "sqlite" else "EXPLAIN"
        cursor.execute(f"{explain} {sql}", params)
        plan = "\n".join(" ".join(str(c) for c in row) for row in cursor.fetchall())
    for index in PLAN[connection.vendor]:
        assert re.search(index, plan), plan


# -- the test: a backlog of 10,000 does not hold up another tenant's 10 -----------------

BACKLOG, FEW, WITHIN = 10_000, 10, 200
PROCESSES = 2


def starts(after: int) -> list[str]:
    """The fair job's handler starts since the ``Execution`` ``after``, in the order the handlers
    wrote them (each in its own autocommit INSERT as it began): "A:12" for tenant A's job 12."""
    return list(Execution.objects.filter(pk__gt=after).order_by("pk").values_list("note", flat=True))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_tenant_s_few_jobs_start_before_200_more_of_another_s_backlog_of_10000():
    fair.enqueue_many([("A", i) for i in range(BACKLOG)])
    workers = [Runjobs("--workers", "4", "--queue", QUEUE, env=REAL_LEASE) for _ in range(PROCESSES)]
    try:
        # B comes while A's backlog is being worked through. A's jobs that start from here on count
        # as after B's, though some of them start before B's enqueue commits.
        wait_for(lambda: Execution.objects.count() >= 500, what="500 of A's jobs to start")
        mark = Execution.objects.order_by("-pk").values_list("pk", flat=True)[0]
        fair.enqueue_many([("B", i) for i in range(FEW)])

        def seen() -> bool:
            notes = starts(after=mark)
            return (
                sum(n.startswith("B:") for n in notes) == FEW
                and sum(n.startswith("A:") for n in notes) >= WITHIN
            )

        wait_for(seen, timeout=180, what=f"B's {FEW} jobs and {WITHIN} of A's to start")
    finally:
        for worker in workers:
            worker.signal(signal.SIGTERM)
        codes = [worker.wait(60) for worker in workers]
    assert codes == [0] * PROCESSES, [worker.output()[1][-3000:] for worker in workers]
    notes = starts(after=mark)
    a_starts = [i for i, note in enumerate(notes) if note.startswith("A:")]
    b_starts = [i for i, note in enumerate(notes) if note.startswith("B:")]
    assert sorted(int(notes[i][2:]) for i in b_starts) == list(range(FEW))
    # Every one of B's jobs started before A's 200th job after B was enqueued.
    ahead = sum(i < max(b_starts) for i in a_starts)
    assert ahead < WITHIN, f"{ahead} of A's jobs started before B's last"
