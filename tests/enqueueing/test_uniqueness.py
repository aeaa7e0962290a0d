"""Unique jobs: one job per key while it waits (or runs), enforced by the database, under races."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from tests.support.enqueue_race import ENQUEUES, THREADS
from tests.support.leases import claim_for
from tests.support.processes import ROOT
from tests.testapp import jobs
from vellum_jobs.core.models import Job
from vellum_jobs.execution.inline import execute

pytestmark = pytest.mark.django_db


def keyed(key: str = "k", **options):
    return jobs.add.using(unique_key=key, **options)


def test_enqueueing_a_key_that_a_queued_job_holds_returns_that_job():
    first = keyed().enqueue(1, 2)
    second = keyed().enqueue(3, 4)
    assert second.pk == first.pk
    assert second.args == [1, 2]
    assert Job.objects.count() == 1


def test_different_keys_and_jobs_without_a_key_are_independent():
    a = keyed("a").enqueue(1, 2)
    b = keyed("b").enqueue(1, 2)
    plain = [jobs.add.enqueue(1, 2), jobs.add.enqueue(1, 2)]
    assert len({a.pk, b.pk, *(j.pk for j in plain)}) == 4
    assert plain[0].unique_key is None


def test_the_decorator_s_key_function_is_called_with_the_job_s_arguments():
    first = jobs.scan.enqueue(3)
    assert first.unique_key == "scan:3"
    assert jobs.scan.enqueue(library_id=3, note="again").pk == first.pk
    assert jobs.scan.enqueue(4).pk != first.pk


def test_a_key_function_that_returns_none_enqueues_without_a_key():
    function = jobs.add.using(unique_key=lambda a, b: None)
    assert function.enqueue(1, 2).pk != function.enqueue(1, 2).pk


def test_a_started_job_no_longer_holds_a_queued_key():
    first = keyed().enqueue(1, 2)
    claim_for(uuid.uuid4())
    second = keyed().enqueue(1, 2)
    assert second.pk != first.pk
    assert second.state == Job.State.QUEUED


def test_queued_or_running_holds_the_key_until_the_job_finishes():
    first = keyed(unique_while="queued_or_running").enqueue(1, 2)
    worker = uuid.uuid4()
    [running] = claim_for(worker)
    returned = keyed(unique_while="queued_or_running").enqueue(5, 6)
    assert returned.pk == first.pk
    assert returned.state == Job.State.RUNNING
    execute(running, worker)
    assert keyed(unique_while="queued_or_running").enqueue(1, 2).pk != first.pk


def test_a_finished_or_cancelled_job_holds_no_key():
    first = keyed().enqueue(1, 2)
    first.cancel()
    assert keyed().enqueue(1, 2).pk != first.pk


def test_replace_gives_the_queued_job_the_new_arguments():
    first = keyed(on_conflict="replace").enqueue(1, 2)
    returned = keyed(on_conflict="replace").enqueue(b=20, a=10)
    assert returned.pk == first.pk
    assert (returned.args, returned.kwargs) == ([], {"a": 10, "b": 20})
    first.refresh_from_db()
    assert (first.args, first.kwargs) == ([], {"a": 10, "b": 20})


def test_replace_leaves_a_running_job_alone():
    keyed(on_conflict="replace", unique_while="queued_or_running").enqueue(1, 2)
    [running] = claim_for(uuid.uuid4())
    returned = keyed(on_conflict="replace", unique_while="queued_or_running").enqueue(7, 8)
    assert returned.pk == running.pk
    assert Job.objects.get(pk=running.pk).args == [1, 2]


def test_debounce_pushes_run_after_later_and_never_earlier():
    first = keyed(on_conflict="debounce", delay=60).enqueue(1, 2)
    later = keyed(on_conflict="debounce", delay=600).enqueue(1, 2)
    assert later.pk == first.pk
    stored = Job.objects.get(pk=first.pk).run_after
    assert stored == later.run_after
    assert timedelta(seconds=590) < stored - timezone.now() <= timedelta(seconds=600)
    keyed(on_conflict="debounce", delay=5).enqueue(1, 2)
    assert Job.objects.get(pk=first.pk).run_after == stored


def test_keep_is_the_default_and_changes_nothing():
    first = keyed(delay=60).enqueue(1, 2)
    keyed(delay=600).enqueue(9, 9)
    stored = Job.objects.get(pk=first.pk)
    assert (stored.args, stored.run_after) == ([1, 2], first.run_after)


def test_the_database_refuses_a_second_waiting_job_with_the_key():
    Job.objects.create(name="x", unique_key="k", unique_while="queued")
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(name="y", unique_key="k", unique_while="queued")


def test_the_database_refuses_a_queued_job_beside_a_running_queued_or_running_one():
    Job.objects.create(name="x", unique_key="k", unique_while="queued_or_running", state=Job.State.RUNNING)
    Job.objects.create(name="y", unique_key="k", unique_while="queued")  # a "queued" key: allowed
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(name="z", unique_key="k", unique_while="queued_or_running")


def test_a_failed_attempt_whose_key_a_newer_job_took_yields_to_it():
    first = jobs.raise_error.using(unique_key="r").enqueue()
    worker = uuid.uuid4()
    [running] = claim_for(worker)
    second = jobs.raise_error.using(unique_key="r").enqueue()
    assert second.pk != first.pk
    outcome = execute(running, worker)
    assert outcome.applied and outcome.state == Job.State.CANCELLED
    assert list(Job.objects.filter(unique_key="r", state=Job.State.QUEUED)) == [second]


def test_retrying_a_failed_unique_job_whose_key_is_taken_does_nothing():
    failed = Job.objects.create(
        name="test.add", unique_key="k", unique_while="queued", state=Job.State.FAILED
    )
    keyed().enqueue(1, 2)
    assert failed.retry() is False
    assert failed.state == Job.State.FAILED
    assert Job.objects.filter(pk=failed.pk).retry() == 0
    Job.objects.filter(state=Job.State.QUEUED).cancel()
    assert Job.objects.filter(pk=failed.pk).retry() == 1


def test_a_unique_enqueue_rolled_back_with_its_transaction_leaves_the_key_free():
    with pytest.raises(RuntimeError), transaction.atomic():
        keyed().enqueue(1, 2)
        raise RuntimeError("rollback")
    assert not Job.objects.exists()
    assert keyed().enqueue(1, 2).pk


def test_enqueue_many_returns_one_job_per_call_and_one_row_per_key():
    created = jobs.scan.enqueue_many([{"library_id": 1}, {"library_id": 2}, {"library_id": 1}])
    assert created[0].pk == created[2].pk != created[1].pk
    assert Job.objects.count() == 2


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"unique_key": ""}, "unique_key must be a string of 1 to 255"),
        ({"unique_key": 42}, "unique_key must be a string of 1 to 255"),
        ({"unique_key": "k", "unique_while": "running"}, "unique_while must be one of"),
        ({"unique_key": "k", "on_conflict": "merge"}, "on_conflict must be one of"),
    ],
)
def test_bad_unique_options_are_rejected(options, words):
    with pytest.raises(ValueError, match=words):
        jobs.add.using(**options)


def test_a_key_function_that_returns_a_non_string_is_rejected_and_nothing_is_written():
    with pytest.raises(ValueError, match="unique_key must give a string"):
        jobs.add.using(unique_key=lambda a, b: a + b).enqueue(1, 2)
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("on_conflict", ["keep", "debounce"])
def test_a_holder_that_starts_between_the_failed_insert_and_the_lookup_leaves_the_key_to_the_new_job(
    on_conflict,
):
    holder = keyed().enqueue(1, 2)
    started = []

    def start_the_holder_once_the_insert_failed(execute, sql, params, many, context):
        try:
            return execute(sql, params, many, context)
        except Exception:
            if not started and sql.startswith("INSERT"):
                started.append(True)
                now = timezone.now()
                Job.objects.filter(pk=holder.pk).update(state=Job.State.RUNNING, started_at=now)
            raise

    with connection.execute_wrapper(start_the_holder_once_the_insert_failed):
        job = keyed(on_conflict=on_conflict).enqueue(3, 4)
    assert started
    assert job.pk != holder.pk
    assert Job.objects.get(pk=job.pk).args == [3, 4]


def test_a_job_without_a_key_is_still_one_statement(measured_clock):
    statements = []
    with connection.execute_wrapper(
        lambda execute, sql, *rest: statements.append(sql) or execute(sql, *rest)
    ):
        jobs.add.enqueue(1, 2)
    assert len(statements) == 1, statements


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_8_threads_in_4_processes_enqueueing_one_key_make_one_job():
    key = f"race:{uuid.uuid4()}"
    start = time.time() + 3  # time for all four processes to import Django
    env = {**os.environ, "VELLUM_TEST_DB_NAME": str(connection.settings_dict["NAME"])}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.enqueue_race", key, str(start)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [p.communicate(timeout=120) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0, 0], [err for _, err in results]
    ids = [pk for out, _ in results for pk in json.loads(out)]
    assert len(ids) == 4 * THREADS * ENQUEUES
    assert Job.objects.filter(unique_key=key).count() == 1
    assert set(ids) == {Job.objects.get(unique_key=key).pk}
