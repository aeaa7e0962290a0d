"""The number of SQL statements a job costs a worker, and an enqueue its caller, pinned per vendor.

A change that adds a query per job (a SELECT to reload the row, a second
UPDATE) fails here without timing anything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import nullcontext

import pytest
from django.db import connection, transaction
from django.db.backends.signals import connection_created
from django.test.utils import CaptureQueriesContext

from tests.testapp import jobs
from vellum_jobs.core import registry
from vellum_jobs.core.models import Job
from vellum_jobs.enqueueing import job_function
from vellum_jobs.worker import dispatcher
from vellum_jobs.worker.dispatcher import Dispatcher
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 20

# With one slot and nothing claimed ahead (--prefetch 0), each job is one
# dispatcher cycle. On SQLite it writes the previous job's outcome and claims
# the next, in one transaction. On PostgreSQL and MySQL it claims the next,
# and the recorder writes the outcome on a connection of its own meanwhile.
PER_JOB = {
    "sqlite": 4,  # BEGIN IMMEDIATE, UPDATE (outcome), UPDATE ... RETURNING (claim), COMMIT
    "postgresql": 1,  # UPDATE ... RETURNING (claim)
    "mysql": 3,  # SELECT ... FOR UPDATE SKIP LOCKED, UPDATE, SELECT (claim)
}
# Outside the per-job loop: register and remove the worker row (Django's
# delete opens its transaction with a statement on SQLite), the first claim,
# and the last cycle's claim, which finds nothing (on SQLite with the last
# outcome). On PostgreSQL and MySQL the registration also reads the
# server's clock (``clock.measure``).
FIXED = {"sqlite": 1 + 2 + 1 + 4, "postgresql": 1 + 1 + 1 + 1 + 1, "mysql": 1 + 1 + 3 + 1 + 1}
# Where outcomes are written apart, a --burst worker exits after a claim that
# began with every outcome written (they may put jobs back): the claim that
# finds nothing may run once more, after the last outcomes are written.
EMPTY_CLAIM = {"sqlite": 0, "postgresql": 1, "mysql": 1}
# The recorder's statements for one transaction of outcomes (BEGIN, UPDATE,
# COMMIT; Django sends no BEGIN or COMMIT statement on MySQL): at most one
# transaction per job, fewer as outcomes wait together.
PER_RECORDING = {"sqlite": 0, "postgresql": 3, "mysql": 1}

# Once a project registers a job with a concurrency key, a PostgreSQL cycle
# that claims runs in a transaction (BEGIN, COMMIT): a claim of keyed jobs
# must check its keys again before it commits.
PER_JOB_WITH_LIMITS = {**PER_JOB, "postgresql": PER_JOB["postgresql"] + 2}
FIXED_WITH_LIMITS = {**FIXED, "postgresql": FIXED["postgresql"] + 2 + 2}
EMPTY_CLAIM_WITH_LIMITS = {**EMPTY_CLAIM, "postgresql": EMPTY_CLAIM["postgresql"] + 2}
# A keyed job's outcome is written before the next claim (which must see the
# slot it freed): on SQLite in the cycle's transaction, elsewhere the
# dispatcher waits for the recorder, so the claim that follows never comes
# up short and nothing is claimed twice. The claim takes the lock on its
# key and counts its key's running jobs afresh (on MySQL the lock is a
# row's); on PostgreSQL the recorder also sends the NOTIFY that a slot is free.
PER_KEYED_JOB = {"sqlite": 4, "postgresql": PER_JOB_WITH_LIMITS["postgresql"] + 2, "mysql": 3 + 2}
# The first claim locks and counts too.
KEYED_EXTRA = {"sqlite": 0, "postgresql": 2, "mysql": 2}
PER_KEYED_RECORDING = {**PER_RECORDING, "postgresql": PER_RECORDING["postgresql"] + 1}


@pytest.fixture
def no_limits_registered():
    """A project without concurrency keys: the keyed test jobs leave the registry for the test."""
    limited = {function.name: function for function in job_function.functions() if function.options.limited}
    for name in limited:
        job_function.unregister(name)
    yield
    for name, function in limited.items():
        options = function.options
        job_function.register(
            name,
            function.func,
            queue=options.queue,
            priority=options.priority,
            max_attempts=options.max_attempts,
            backoff=options.backoff,
            timeout=options.timeout,
            concurrency_key=options.concurrency_key,
            concurrency=options.concurrency,
        )


def run_counting_statements(
    threads: int = 1, prefetch: int | None = 0, jobs: int = JOBS, async_workers: int = 0
) -> list[str]:
    """The statements the dispatcher sent (this thread's connection); the recorder's go in
    ``RECORDED``."""
    statements: list[str] = []
    RECORDED.clear()

    def count(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    # By default no event loop: its own claims (of coroutine jobs) are the loop's cost, not these jobs'.
    worker = WorkerProcess(
        WorkerOptions(threads=threads, burst=True, prefetch=prefetch, async_workers=async_workers)
    )
    connection_created.connect(count_the_recorder_s)
    try:
        with connection.execute_wrapper(count):
            worker.run()
    finally:
        connection_created.disconnect(count_the_recorder_s)
    assert Job.objects.filter(state=Job.State.DONE).count() == jobs
    return statements


RECORDED: list[str] = []


def count_the_recorder_s(sender, connection, **kwargs):
    """Count the statements on the connection the recorder's thread opens."""
    if threading.current_thread().name != "vellum-recorder":
        return

    def count(execute, sql, params, many, context):
        RECORDED.append(sql)
        return execute(sql, params, many, context)

    connection.execute_wrappers.append(count)


def test_claiming_ahead_takes_several_jobs_per_claim_and_writes_several_outcomes_per_statement(
    no_limits_registered,
):
    """With the default prefetch, short jobs are claimed in batches larger than the threads, and
    their outcomes written together: far fewer statements than jobs."""
    count = 400
    jobs.add.enqueue_many([(i, i) for i in range(count)])
    statements = run_counting_statements(threads=2, prefetch=None, jobs=count)
    claims = [sql for sql in statements if is_claim(sql)]
    outcomes = [sql for sql in statements + RECORDED if is_outcome(sql)]
    # Two threads claiming only for themselves would need at least 200 claims.
    assert len(claims) < count / 4, f"{len(claims)} claims for {count} jobs"
    if connection.vendor != "mysql":  # where every outcome is a statement of its own (store.sql.mysql)
        assert len(outcomes) < count / 4, f"{len(outcomes)} outcome writes for {count} jobs"


def test_a_cycle_of_fewer_outcomes_than_threads_writes_them_with_its_claim(no_limits_registered):
    """At a rate well below the worker's most a cycle brings an outcome or two: written in the
    transaction of the claim that follows, not handed to the recorder (a commit of its own and two
    hand-overs between threads)."""
    jobs.add.enqueue(1, 1)
    statements = run_counting_statements(threads=2, jobs=1)
    assert RECORDED == []
    outcomes = [i for i, sql in enumerate(statements) if is_outcome(sql)]
    assert len(outcomes) == 1, "\n".join(statements)
    after = statements[outcomes[0] + 1 :]
    claim_after = next(i for i, sql in enumerate(after) if is_claim(sql))
    assert "COMMIT" not in after[:claim_after], "\n".join(statements)


def is_outcome(sql: str) -> bool:
    return sql.startswith("UPDATE") and "finished_at" in sql and "LIMIT" not in sql


def is_claim(sql: str) -> bool:
    return sql.lstrip().startswith(("UPDATE", "WITH", "SELECT")) and "LIMIT" in sql


def assert_counts(statements: list[str], expected: int, empty_claim: int, per_recording: int) -> None:
    """The dispatcher sent ``expected`` statements, plus at most one claim of ``empty_claim`` at the
    end; the recorder, where there is one, at most ``per_recording`` for each job."""
    assert expected <= len(statements) <= expected + empty_claim, "\n".join(statements)
    assert len(RECORDED) <= per_recording * JOBS, "\n".join(RECORDED)
    assert bool(RECORDED) == bool(per_recording), "\n".join(RECORDED)


def test_statements_per_job_on_the_dispatcher_s_connection(no_limits_registered):
    jobs.add.enqueue_many([(i, i) for i in range(JOBS)])
    statements = run_counting_statements()
    vendor = connection.vendor
    expected = FIXED[vendor] + PER_JOB[vendor] * (JOBS - 1)
    assert_counts(statements, expected, EMPTY_CLAIM[vendor], PER_RECORDING[vendor])


def test_jobs_without_a_key_cost_a_transaction_more_when_the_project_has_keyed_jobs():
    assert registry.has_concurrency_limits()
    jobs.add.enqueue_many([(i, i) for i in range(JOBS)])
    statements = run_counting_statements()
    vendor = connection.vendor
    expected = FIXED_WITH_LIMITS[vendor] + PER_JOB_WITH_LIMITS[vendor] * (JOBS - 1)
    assert_counts(statements, expected, EMPTY_CLAIM_WITH_LIMITS[vendor], PER_RECORDING[vendor])


def test_statements_per_keyed_job():
    jobs.keyed.using(queue="default").enqueue_many([(1, 0)] * JOBS)
    statements = run_counting_statements()
    vendor = connection.vendor
    expected = FIXED_WITH_LIMITS[vendor] + KEYED_EXTRA[vendor] + PER_KEYED_JOB[vendor] * (JOBS - 1)
    assert_counts(statements, expected, 0, PER_KEYED_RECORDING[vendor])


# -- enqueueing ---------------------------------------------------------------

# Statements one enqueue sends, counted as Django logs them: BEGIN, COMMIT
# and SAVEPOINT included, so each is a round trip. The same on every
# vendor; on PostgreSQL the NOTIFY that wakes idle workers rides in the
# INSERT. (on its own, inside the caller's atomic() block)
#
# A unique job on its own tries its INSERT alone; if its key is taken it
# then finds the holder (keep: one SELECT) or locks and changes it
# (debounce: BEGIN, SELECT ... FOR UPDATE, UPDATE, COMMIT). Inside the
# caller's transaction its INSERT takes a savepoint, in another around
# the whole (a failed INSERT must not abort the caller's transaction).
ENQUEUE_STATEMENTS: dict[str, tuple[Callable[[], object], int, int]] = {
    "enqueue": (lambda: jobs.add.enqueue(1, 2), 1, 1),
    "enqueue_many": (lambda: jobs.add.enqueue_many([(1, 2), (3, 4)]), 1, 1),
    "a job with a concurrency key": (lambda: jobs.keyed.enqueue(1), 1, 1),
    "a unique job, its key free": (lambda: jobs.scan.enqueue(1), 1, 2 + 1 + 2),
    "a unique job, its key taken (keep)": (lambda: jobs.scan.enqueue(2), 1 + 1, 2 + 1 + 2 + 1 + 1),
    "a unique job, its key taken (debounce)": (
        lambda: jobs.scan.using(on_conflict="debounce", delay=60).enqueue(2),
        1 + 4,
        2 + 1 + 2 + 1 + 1 + 1,
    ),
}


@pytest.mark.parametrize("in_transaction", [False, True], ids=["alone", "in atomic()"])
@pytest.mark.parametrize("case", ENQUEUE_STATEMENTS)
def test_statements_per_enqueue(case, in_transaction):
    jobs.scan.enqueue(2)  # holds the key of the "taken" cases
    call, alone, in_atomic = ENQUEUE_STATEMENTS[case]
    with (
        transaction.atomic() if in_transaction else nullcontext(),
        CaptureQueriesContext(connection) as captured,
    ):
        call()
    statements = [str(query["sql"]) for query in captured.captured_queries]
    assert len(statements) == (in_atomic if in_transaction else alone), "\n".join(statements)


def test_an_idle_event_loop_costs_a_drain_of_other_jobs_a_claim_every_50_ms_at_most(
    no_limits_registered, monkeypatch
):
    count = 2000
    jobs.add.enqueue_many([(i, i) for i in range(count)])
    loop_claims = []
    claim = Dispatcher._claim

    def counted(self, limit, is_async):
        if is_async and limit > 0:
            loop_claims.append(time.monotonic())
        return claim(self, limit, is_async)

    monkeypatch.setattr(Dispatcher, "_claim", counted)
    began = time.monotonic()
    statements = run_counting_statements(threads=4, prefetch=None, jobs=count, async_workers=100)
    took = time.monotonic() - began
    # The loop's claim at the start and at the end (where outcomes are written
    # apart, a cycle more there: see EMPTY_CLAIM), and one per
    # LOOP_CLAIM_EVERY while the threads run jobs; never one per cycle.
    end = 3 + EMPTY_CLAIM[connection.vendor]
    assert len(loop_claims) <= end + took / dispatcher.LOOP_CLAIM_EVERY, f"{len(loop_claims)} in {took:.2f}s"
    # An idle worker looks up its next delayed job (MIN(run_after)) after a
    # cycle whose claims all came up short. A cycle whose threads got their
    # fill is not one, whatever the loop found: at most the loop's own claims
    # in cycles where the threads had no room to ask, and the drain's end.
    lookups = sum("MIN(" in sql for sql in statements)
    assert lookups <= 2 + len(loop_claims), f"{lookups} lookups, {len(loop_claims)} loop claims"
