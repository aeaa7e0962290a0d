"""The gate a job with limits passes before its handler starts (``store.limit_gate``): its rules on
their own (``decide``), then jobs run on the test database (``run_due``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.testapp import limit_jobs
from tests.testapp.models import Span
from vellum_jobs import Throttled
from vellum_jobs.core import clock, limits
from vellum_jobs.core.limit_models import CONCURRENCY, RATE, LimitHold, LimitSlot
from vellum_jobs.core.limit_rules import HELD_PREFIX, Slot, decide
from vellum_jobs.core.limits import Limits, guard
from vellum_jobs.core.models import Job
from vellum_jobs.execution.inline import run_due

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Table:
    """The slot rows of ``decide``'s plans applied in memory, as the gate writes them."""

    def __init__(self) -> None:
        self.slots: list[Slot] = []
        self.live: set[tuple[int, int]] = set()
        self.holds: dict[str, datetime] = {}
        self.starts: list[datetime] = []

    def gate(self, job_limits: Limits, now: datetime, job_id: int = 1):
        plan = decide(job_limits, [Slot(**vars(s)) for s in self.slots], self.live, self.holds, now)
        for slot in plan.pushed:
            self._row(slot).next_at = slot.next_at
        for slot in plan.take:
            slot.job_id, slot.claim = job_id, 1
            if slot.pk is None:
                slot.pk = len(self.slots) + 1
                self.slots.append(slot)
            else:
                row = self._row(slot)
                row.taken_at, row.next_at, row.job_id, row.claim = slot.taken_at, slot.next_at, job_id, 1
        if plan.held is None:
            self.starts.append(now)
        return plan

    def _row(self, slot: Slot) -> Slot:
        return next(row for row in self.slots if row.pk == slot.pk)


RATE_3_PER_2S = Limits(rates=(("api", 3, 2.0),))


def test_a_rate_key_starts_its_count_then_holds_the_next_until_a_slot_has_rested_its_period():
    table = Table()
    for i in range(3):
        assert table.gate(RATE_3_PER_2S, at(i * 0.1)).held is None
    plan = table.gate(RATE_3_PER_2S, at(0.5))
    assert plan.held is not None
    # The oldest slot started at 0.0: free again a period and its guard later; the job is due half
    # a guard before, to be claimed by then.
    assert plan.held.until == at(2.0 + guard(2.0) / 2)
    assert plan.held.reason.startswith(f"{HELD_PREFIX}rate limit 'api' (3 per 2s): next slot at ")
    assert table.gate(RATE_3_PER_2S, at(2.0)).held is not None  # the guard is not over
    assert table.gate(RATE_3_PER_2S, at(2.0 + guard(2.0))).held is None


def test_jobs_held_back_by_a_full_rate_key_are_told_later_and_later_times_not_one_for_all():
    table = Table()
    for i in range(3):
        table.gate(RATE_3_PER_2S, at(i * 0.1))
    lead = timedelta(seconds=guard(2.0) / 2)
    times = [table.gate(RATE_3_PER_2S, at(0.5)).held.until + lead for _ in range(7)]
    rest = 2.0 + guard(2.0)
    expected = [at(0.0 + rest), at(0.1 + rest), at(0.2 + rest)]
    expected += [at(0.0 + 2 * rest), at(0.1 + 2 * rest), at(0.2 + 2 * rest), at(0.0 + 3 * rest)]
    assert times == expected


def test_a_job_a_moment_early_for_a_slot_is_told_that_slot_not_the_back_of_the_line():
    table = Table()
    for i in range(3):
        table.gate(RATE_3_PER_2S, at(i * 0.1))
    rest = 2.0 + guard(2.0)
    plan = table.gate(RATE_3_PER_2S, at(rest - guard(2.0) / 2))
    assert plan.held is not None and plan.held.until == at(rest) and plan.held.soon
    assert not plan.pushed  # the line behind the key's slots is left as it was


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(1, 5),
    period=st.sampled_from([0.5, 1.0, 2.0, 60.0]),
    gaps=st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=60),
)
def test_no_window_of_a_period_ever_sees_more_starts_than_the_count(count, period, gaps):
    table = Table()
    job_limits = Limits(rates=(("k", count, period),))
    now = 0.0
    for gap in gaps:
        now += gap * period
        table.gate(job_limits, at(now))
    starts = table.starts
    for i, first in enumerate(starts):
        within = [s for s in starts[i:] if s < first + timedelta(seconds=period)]
        assert len(within) <= count


def test_a_concurrency_slot_is_held_while_its_job_runs_under_that_claim_and_free_after():
    table = Table()
    gpu = Limits(concurrency=(("gpu", 1),))
    assert table.gate(gpu, at(0), job_id=7).held is None
    table.live = {(7, 1)}
    plan = table.gate(gpu, at(1), job_id=8)
    assert (
        plan.held is not None
        and plan.held.reason == f"{HELD_PREFIX}concurrency limit 'gpu' (1 at once): all taken"
    )
    assert at(2) <= plan.held.until <= at(3)
    table.live = {(7, 2)}  # job 7 runs again, under a later claim: its old slot is free
    assert table.gate(gpu, at(2), job_id=8).held is None


def test_a_job_takes_a_slot_of_every_limit_or_of_none():
    table = Table()
    both = Limits(rates=(("payments", 5, 1.0),), concurrency=(("gpu", 1),))
    table.gate(Limits(concurrency=(("gpu", 1),)), at(0), job_id=1)
    table.live = {(1, 1)}
    assert table.gate(both, at(0.1), job_id=2).held is not None
    assert [s.key for s in table.slots] == ["gpu"]  # no rate slot was taken


def test_a_hold_keeps_every_job_under_its_key_back_until_it_lifts():
    table = Table()
    table.holds = {"api": at(30)}
    plan = table.gate(RATE_3_PER_2S, at(1))
    assert plan.held is not None and plan.held.until == at(30)
    assert "hold on 'api'" in plan.held.reason
    assert not table.slots


def test_rates_read_as_counts_per_period_and_bad_ones_are_refused_by_name():
    assert limits.parse_rate("100/m") == (100, 60)
    assert limits.parse_rate("10/5s") == (10, 5)
    assert limits.parse_rate("3/h") == (3, 3600)
    assert limits.parse_rate((7, "90s")) == (7, 90)
    for bad in ("100", "0/m", "5/fortnight", (0, 1), (3, -1)):
        with pytest.raises(ValueError, match="rate"):
            limits.parse_rate(bad)
    with pytest.raises(ValueError, match="concurrency: the limit of 'gpu'"):
        limits.concurrency({"gpu": 0})


# -- on the database -----------------------------------------------------------

pytestmark_db = pytest.mark.django_db


@pytestmark_db
def test_keys_come_from_the_arguments_and_a_template_naming_no_argument_writes_nothing():
    job = limit_jobs.call_api.enqueue("acme")
    assert Limits.decode(job.limits) == Limits(rates=(("api:acme", 3, 2.0),))
    assert (
        Limits.decode(limit_jobs.call_api.using(rate_key="shared").enqueue("x").limits).rates[0][0]
        == "shared"
    )
    bad = limit_jobs.call_api.using(rate=("1/s", "api:{tenant}"))
    before = Job.objects.count()
    with pytest.raises(ValueError, match="has no argument 'tenant'"):
        bad.enqueue("acme")
    assert Job.objects.count() == before


@pytestmark_db
def test_jobs_over_a_rate_limit_wait_queued_without_using_an_attempt():
    jobs = [limit_jobs.call_api.enqueue("acme") for _ in range(5)]
    other = limit_jobs.call_api.enqueue("globex")
    # Judged at one instant: however slow the host, no slot rests while the batch runs.
    now = clock.now()
    assert [job.state for job in run_due(now=now)].count(Job.State.DONE) == 4
    held = Job.objects.filter(pk__in=[j.pk for j in jobs], state=Job.State.QUEUED)
    assert held.count() == 2
    for job in held:
        assert job.attempts == 0 and job.attempt_errors == []
        assert job.error.startswith(f"{HELD_PREFIX}rate limit 'api:acme' (3 per 2s): next slot at ")
        assert now < job.run_after <= now + timedelta(seconds=2 + guard(2))
    assert Span.objects.filter(key="api:acme").count() == 3
    # Another key has room of its own.
    other.refresh_from_db()
    assert other.state == Job.State.DONE
    run_due(now=now + timedelta(seconds=3))
    assert {job.state for job in Job.objects.filter(pk__in=[j.pk for j in jobs])} == {Job.State.DONE}
    assert Span.objects.filter(key="api:acme").count() == 5


@pytestmark_db
def test_a_job_under_two_rates_waits_for_the_fuller_one():
    for _ in range(6):
        limit_jobs.charge.enqueue("c1")
    # Judged at one instant: however slow the host, no slot rests while the batch runs.
    assert [job.state for job in run_due(now=clock.now())].count(Job.State.DONE) == 5
    started = LimitSlot.objects.filter(kind=RATE, job_id__isnull=False)
    assert started.filter(key="payments").count() == 5
    assert started.filter(key="customer:c1").count() == 5


@pytestmark_db
def test_a_concurrency_key_of_the_dict_holds_a_job_while_another_of_its_key_runs():
    running = limit_jobs.render.enqueue("c1")
    Job.objects.filter(pk=running.pk).update(state=Job.State.RUNNING, claims=4)
    LimitSlot.objects.create(
        key="gpu", kind=CONCURRENCY, slot=0, taken_at=clock.now(), job_id=running.pk, claim=4
    )
    waiting = limit_jobs.render.enqueue("c2")
    assert [job.state for job in run_due()] == [Job.State.QUEUED]
    waiting.refresh_from_db()
    assert waiting.state == Job.State.QUEUED and waiting.attempts == 0
    assert "concurrency limit 'gpu' (1 at once)" in waiting.error
    Job.objects.filter(pk=running.pk).update(state=Job.State.DONE)
    assert [(j.pk, j.state) for j in run_due(now=clock.now() + timedelta(seconds=3))] == [
        (waiting.pk, Job.State.DONE)
    ]


@pytestmark_db
def test_a_handler_that_raises_throttled_holds_its_key_for_every_job_under_it():
    first = limit_jobs.fetch.enqueue(1, throttle_for=30)
    other = limit_jobs.fetch.enqueue(2)
    before = clock.now()
    run_due()
    first.refresh_from_db()
    other.refresh_from_db()
    hold = LimitHold.objects.get(key="partner")
    assert before + timedelta(seconds=29) < hold.until <= clock.now() + timedelta(seconds=30)
    assert hold.job_id == first.pk and "429 Too Many Requests" in hold.reason
    assert first.state == Job.State.QUEUED and first.attempts == 0 and first.run_after == hold.until
    assert other.state == Job.State.QUEUED and other.attempts == 0 and other.run_after == hold.until
    assert "hold on 'partner'" in other.error
    assert not Span.objects.filter(key="partner").exists()
    Job.objects.filter(pk=first.pk).update(kwargs={})  # it will not be told to slow down again
    run_due(now=hold.until + timedelta(seconds=1))
    assert Span.objects.filter(key="partner").count() == 2


def test_throttled_refuses_a_bad_key_or_duration_by_name():
    with pytest.raises(ValueError, match="Throttled key"):
        Throttled("")
    with pytest.raises(ValueError, match="Throttled seconds"):
        Throttled("k", seconds=-1)


@pytestmark_db
def test_pruning_deletes_slots_and_holds_of_no_use_and_keeps_the_rest():
    from vellum_jobs.maintenance import limit_pruning

    now = clock.now()
    old = now - limit_pruning.IDLE - timedelta(minutes=1)
    running = limit_jobs.render.enqueue("c1")
    Job.objects.filter(pk=running.pk).update(state=Job.State.RUNNING, claims=2)
    keep = [
        LimitSlot.objects.create(key="recent", kind=RATE, period=1.0, slot=0, taken_at=now),
        LimitSlot.objects.create(key="daily", kind=RATE, period=86400.0, slot=0, taken_at=old),
        LimitSlot.objects.create(
            key="gpu", kind=CONCURRENCY, slot=0, taken_at=old, job_id=running.pk, claim=2
        ),
    ]
    LimitSlot.objects.create(key="idle", kind=RATE, period=1.0, slot=0, taken_at=old)
    # Kept too: the key's other slot holds a running job, and a key's slots go together.
    keep.append(
        LimitSlot.objects.create(
            key="gpu", kind=CONCURRENCY, slot=1, taken_at=old, job_id=running.pk, claim=1
        )
    )
    LimitHold.objects.create(key="lifted", until=old, set_at=old)
    LimitHold.objects.create(key="held", until=now + timedelta(seconds=30), set_at=now)
    assert limit_pruning.prune("default", now) == 2
    assert sorted(LimitSlot.objects.values_list("pk", flat=True)) == sorted(s.pk for s in keep)
    assert list(LimitHold.objects.values_list("key", flat=True)) == ["held"]


@pytestmark_db
def test_a_slot_pruned_between_the_gates_read_and_its_write_is_read_again_not_lost(monkeypatch):
    from vellum_jobs.store import limit_gate

    job = limit_jobs.call_api.enqueue("acme")
    real = limit_gate._slots
    reads = []

    def read(alias, job_limits, now):
        # The first read finds a slot another process's pruning deletes before the gate writes it.
        reads.append(now)
        if len(reads) == 1:
            return [Slot("api:acme", RATE, 2.0, 0, pk=10**9)]
        return real(alias, job_limits, now)

    monkeypatch.setattr(limit_gate, "_slots", read)
    assert [j.state for j in run_due()] == [Job.State.DONE]
    assert len(reads) >= 2
    assert LimitSlot.objects.filter(job_id=job.pk).count() == 1


@pytestmark_db
def test_enqueue_many_of_jobs_with_limits_keeps_the_calls_order_and_writes_nothing_for_a_bad_key():
    jobs = limit_jobs.call_api.enqueue_many([("a",), ("b",), ("a",)])
    assert [Limits.decode(job.limits).rates[0][0] for job in jobs] == ["api:a", "api:b", "api:a"]
    assert {job.pk: job.args for job in Job.objects.all()} == {job.pk: job.args for job in jobs}
    with pytest.raises(TypeError, match="missing a required argument: 'account'"):
        limit_jobs.call_api.enqueue_many([("c",), {"other": 1}])
    with pytest.raises(ValueError, match="has no argument 'tenant'"):
        limit_jobs.call_api.using(rate=[("9/s", "all"), ("1/s", "api:{tenant}")]).enqueue_many(
            [("c",), ("d",)]
        )
    assert Job.objects.count() == 3


@pytestmark_db
def test_a_slow_gate_stamps_its_rate_slot_with_the_time_the_job_really_starts(monkeypatch):
    from vellum_jobs.store import db, limit_gate

    # A minute's guard, the largest: its restamps, quick, come well within half of it on a busy host.
    job = limit_jobs.call_api.using(rate=("3/min", "api:{account}")).enqueue("slow")
    real_execute, real_write = db.execute, limit_gate._write
    slow = limit_gate.guard(60.0)  # the gate outlasts half the guard: a loaded host

    def execute_slowly(connection, sql, params):
        cursor = real_execute(connection, sql, params)
        if LimitSlot._meta.db_table in sql:
            time.sleep(slow)  # the fault under test: a statement that comes back late
        return cursor

    def write_slowly(alias, plan, job):
        real_write(alias, plan, job)
        time.sleep(slow)

    monkeypatch.setattr(db, "execute", execute_slowly)
    monkeypatch.setattr(limit_gate, "_write", write_slowly)
    before = clock.now()
    assert [j.state for j in run_due()] == [Job.State.DONE]
    slot = LimitSlot.objects.get(key="api:slow", job_id=job.pk)
    assert slot.taken_at >= before + timedelta(seconds=slow)


# A rate whose slot rests a minute: far longer than these tests, however slow the host. Its guard
# is the largest (a quarter second): a stamp may come back an eighth of a second late.
ONE_A_MINUTE = ("1/min", "api:{account}")


def run_one_with_slot_updates_taking(seconds: Callable[[int], float]):
    """Claim and run one ``call_api`` job under ``ONE_A_MINUTE`` with the n-th UPDATE of a rate slot
    taking ``seconds(n)`` more (n from 1): the gate's own, then its stamps. The job and the outcome."""
    import uuid

    from django.db import connection

    from vellum_jobs.core.attempts import Attempt
    from vellum_jobs.execution import handler_run
    from vellum_jobs.store.claim import ClaimRequest, claim

    job = limit_jobs.call_api.using(rate=ONE_A_MINUTE).enqueue("slower")
    now, worker = clock.now(), uuid.uuid4()
    (claimed,) = claim(connection, ClaimRequest(worker, 1, now, now + timedelta(minutes=5)))
    assert claimed.pk == job.pk
    updates = 0

    def slot_updates_slowly(execute, sql, params, many, context):
        nonlocal updates
        result = execute(sql, params, many, context)
        if sql.startswith("UPDATE") and LimitSlot._meta.db_table in sql:
            updates += 1
            time.sleep(seconds(updates))  # the fault under test: a statement that comes back late
        return result

    with connection.execute_wrapper(slot_updates_slowly):
        outcome = handler_run.run(Attempt(claimed, worker))
    return claimed, outcome


@pytestmark_db
def test_on_a_database_whose_every_commit_is_slow_the_second_stamp_is_on_time_and_the_job_starts():
    from vellum_jobs.store import limit_gate

    slow = limit_gate.guard(60.0)  # each UPDATE outlasts half the guard
    before = clock.now()
    job, outcome = run_one_with_slot_updates_taking(lambda n: slow)
    assert outcome.started and Span.objects.filter(job_id=job.pk).exists()
    # The gate's UPDATE and a first stamp came back late; the second was stamped with the time it
    # would come back by (a statement's time on), and was on time.
    slot = LimitSlot.objects.get(key="api:slower", job_id=job.pk, claim=job.claims)
    assert slot.taken_at >= before + timedelta(seconds=3 * slow)


@pytestmark_db
def test_a_gate_whose_database_gets_slower_with_every_stamp_holds_its_job_back_with_its_slot_spent():
    from vellum_jobs.store import limit_gate

    slow = limit_gate.guard(60.0)  # each UPDATE two guards slower than the last: far past half of one
    job, outcome = run_one_with_slot_updates_taking(lambda n: 2 * slow * n)
    assert not outcome.started and outcome.refund_attempt
    assert outcome.columns["error"].startswith(limit_gate.SLOW_STAMPS)
    assert not Span.objects.exists()  # its handler never started
    spent = LimitSlot.objects.get(key="api:slower", job_id=job.pk, claim=job.claims)
    assert spent.taken_at <= outcome.columns["run_after"]
    # The slot stays spent: another job of the key, with the database quick again, waits for it.
    other = limit_jobs.call_api.using(rate=ONE_A_MINUTE).enqueue("slower")
    assert [j.state for j in run_due()] == [Job.State.QUEUED]  # (the first was not recorded)
    other.refresh_from_db()
    assert other.attempts == 0 and other.error.startswith(f"{HELD_PREFIX}rate limit 'api:slower'")
    assert not Span.objects.exists()


@pytest.mark.django_db(transaction=True)  # the hold is written from another thread's connection
def test_a_coroutine_that_raises_throttled_holds_its_key_for_every_job_under_it():
    import asyncio
    import uuid

    from asgiref.sync import sync_to_async
    from django.db import connection, connections

    from vellum_jobs.core.attempts import Attempt
    from vellum_jobs.execution import handler_run
    from vellum_jobs.store.claim import ClaimRequest, claim

    first = limit_jobs.afetch.enqueue(1, throttle_for=30)
    now, worker = clock.now(), uuid.uuid4()
    (claimed,) = claim(connection, ClaimRequest(worker, 1, now, now + timedelta(minutes=5)))
    assert claimed.pk == first.pk

    async def run():
        outcome = await handler_run.arun(Attempt(claimed, worker))
        await sync_to_async(connections.close_all)()  # the gate's thread's, for the database to go
        return outcome

    outcome = asyncio.run(run())
    hold = LimitHold.objects.get(key="partner")
    assert hold.job_id == first.pk and outcome.columns["run_after"] == hold.until


@pytestmark_db
def test_a_coroutine_its_loop_resumes_long_after_its_gate_goes_back_with_its_slot_spent():
    from vellum_jobs.store import limit_gate

    job = limit_jobs.call_api.enqueue("loop")
    job.refresh_from_db()
    returned_at = clock.now() - timedelta(seconds=guard(2.0))  # the loop resumed it a guard late
    held = limit_gate.resumed_late(job, returned_at)
    assert held is not None and held.reason.startswith(f"{HELD_PREFIX}its event loop, busy, resumed it")
    assert limit_gate.resumed_late(job, clock.now()) is None
