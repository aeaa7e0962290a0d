from __future__ import annotations

import asyncio
import datetime
import math
import os
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import django
import pytest
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connection, transaction
from django.db.models import signals
from django.db.transaction import TransactionManagementError
from django.test import override_settings
from django.utils import timezone

from tests.support import bigtable
from tests.testapp import jobs
from tests.testapp.models import Document, Library
from vellum_jobs import UnknownJob, enqueue
from vellum_jobs.conf import MAX_DURATION
from vellum_jobs.core.models import Job
from vellum_jobs.store.sql.names import channel

pytestmark = pytest.mark.django_db


def test_enqueue_stores_a_queued_job_due_now():
    before = timezone.now()
    job = jobs.add.enqueue(1, b=2)
    job.refresh_from_db()
    assert job.name == "test.add"
    assert job.state == Job.State.QUEUED
    assert (job.args, job.kwargs) == ([1], {"b": 2})
    assert (job.queue, job.priority, job.attempts, job.max_attempts) == ("default", 0, 0, 5)
    assert before <= job.run_after <= timezone.now()


def test_enqueue_by_name_is_the_same_as_through_the_function():
    job = enqueue("test.add", 1, 2)
    assert (job.name, job.args) == ("test.add", [1, 2])


def test_arguments_are_stored_as_json_stores_them():
    job = jobs.record.enqueue({"pair": (1, 2), 3: "three"})
    job.refresh_from_db()
    assert job.args == [{"pair": [1, 2], "3": "three"}]


def test_using_sets_queue_priority_delay_and_ref():
    library = Library.objects.create(name="films")
    before = timezone.now()
    job = jobs.add.using(queue="slow", priority=10, delay=timedelta(minutes=5), ref=library).enqueue(1, 2)
    job.refresh_from_db()
    assert (job.queue, job.priority) == ("slow", 10)
    assert job.run_after >= before + timedelta(minutes=5)
    assert job.ref == library


def test_delay_in_seconds_and_run_after_datetime():
    at = timezone.now() + timedelta(hours=1)
    assert jobs.add.using(run_after=at).enqueue(1, 2).run_after == at
    job = jobs.add.using(delay=30).enqueue(1, 2)
    assert job.run_after - job.created_at == timedelta(seconds=30)


@override_settings(VELLUM_JOBS={"MAX_ATTEMPTS": 9})
def test_max_attempts_defaults_to_the_setting_and_the_decorator_wins():
    assert jobs.add.enqueue(1, 2).max_attempts == 9
    assert jobs.raise_error.enqueue().max_attempts == 3


def test_enqueue_many_is_one_insert(django_assert_num_queries, measured_clock):
    # On PostgreSQL the same statement sends the NOTIFY that wakes idle workers.
    with django_assert_num_queries(1):
        created = jobs.add.enqueue_many([{"a": i, "b": i} for i in range(39)] + [(1, 2)])
    assert len(created) == 40
    assert all(j.pk for j in created)
    assert Job.objects.filter(name="test.add").count() == 40
    assert Job.objects.get(pk=created[-1].pk).args == [1, 2]


def test_enqueue_is_one_statement(django_assert_num_queries, measured_clock):
    with django_assert_num_queries(1):
        job = jobs.add.enqueue(1, 2)
    assert Job.objects.get(pk=job.pk).args == [1, 2]


def test_enqueue_many_of_thousands_inserts_every_job():
    created = jobs.add.enqueue_many([(i, -i) for i in range(3000)])
    assert Job.objects.count() == 3000
    assert len({j.pk for j in created}) == 3000
    # Each returned job is the row holding its own call's arguments.
    stored = dict(Job.objects.values_list("pk", "args"))
    assert [stored[job.pk] for job in created] == [[i, -i] for i in range(3000)]
    assert [job.args for job in created] == [[i, -i] for i in range(3000)]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: jobs.record.enqueue(datetime.date(2026, 1, 1)), TypeError, r"args\[0\] is a datetime.date"),
        (lambda: jobs.record.enqueue(value={1}), TypeError, "value is a builtins.set"),
        (lambda: enqueue("no.such.job"), UnknownJob, "no.such.job"),
        (lambda: jobs.add.using(priority=101).enqueue(1, 2), ValueError, "between -100 and 100"),
        (lambda: jobs.add.using(priority=-101).enqueue(1, 2), ValueError, "between -100 and 100"),
        (
            lambda: jobs.add.using(run_after=datetime.datetime(2026, 1, 1)).enqueue(1, 2),
            ValueError,
            "naive",
        ),
        (lambda: jobs.add.using(delay=-1).enqueue(1, 2), ValueError, "negative"),
        (lambda: jobs.add.using(ref=Library(name="unsaved")).enqueue(1, 2), ValueError, "not saved"),
        (lambda: jobs.add.enqueue_many([{"a": 1, "b": 2}, {"a": object()}]), TypeError, "builtins.object"),
        (lambda: jobs.add.enqueue_many(["nope"]), TypeError, "call 0"),
    ],
)
def test_bad_input_raises_a_clear_error_and_writes_nothing(call, error, message):
    with pytest.raises(error, match=message):
        call()
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("delay", math.nan, "delay: nan is not a duration: it is not a number"),
        ("delay", math.inf, "delay: inf is not a duration: it is longer than 100 years"),
        ("delay", timedelta.max, f"delay: {timedelta.max!r} is not a duration: it is longer than 100 years"),
        ("delay", 1e12, "delay: 1000000000000.0 is not a duration: it is longer than 100 years"),
        ("timeout", math.nan, "timeout: nan is not a duration: it is not a number"),
        ("timeout", math.inf, "timeout: inf is not a duration: it is longer than 100 years"),
        ("timeout", "36526d", "timeout: '36526d' is not a duration: it is longer than 100 years"),
    ],
)
def test_a_delay_or_timeout_that_is_not_a_number_or_too_long_is_refused_by_using_naming_it(
    option, value, problem
):
    with pytest.raises(ValueError, match=f"^{re.escape(problem)}"):
        jobs.add.using(**{option: value})
    assert Job.objects.count() == 0


def test_a_delay_of_the_longest_duration_is_stored_and_read_back():
    before = timezone.now()
    job = jobs.add.using(delay=MAX_DURATION).enqueue(1, 2)
    job.refresh_from_db()
    assert before + MAX_DURATION <= job.run_after <= timezone.now() + MAX_DURATION


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_a_rolled_back_transaction_leaves_no_job():
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        jobs.add.enqueue(1, 2)
        assert Job.objects.count() == 1
        raise Abort
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_a_committed_transaction_keeps_the_job_with_the_data():
    with transaction.atomic():
        library = Library.objects.create(name="books")
        job = jobs.add.using(ref=library).enqueue(1, 2)
    assert Job.objects.get(pk=job.pk).ref == library


def test_refs_with_integer_and_uuid_primary_keys():
    library = Library.objects.create(name="music")
    document = Document.objects.create(title="readme")
    first = jobs.add.using(ref=library).enqueue(1, 2)
    second = jobs.add.using(ref=library).enqueue(3, 4)
    on_document = jobs.add.using(ref=document).enqueue(5, 6)
    jobs.add.enqueue(7, 8)
    assert list(Job.objects.for_object(library)) == [second, first]
    assert list(Job.objects.for_object(document)) == [on_document]
    assert Job.objects.get(pk=on_document.pk).ref == document


# A transaction test: MySQL's ANALYZE TABLE commits implicitly.
@pytest.mark.django_db(transaction=True)
def test_for_object_reads_the_ref_index_on_a_big_table():
    library = Library.objects.create(name="films")
    bigtable.fill(20_000, state=Job.State.DONE)
    jobs.add.using(ref=library).enqueue(1, 2)
    with connection.cursor() as cursor:
        analyze = {"sqlite": "ANALYZE", "postgresql": "ANALYZE", "mysql": "ANALYZE TABLE vellum_jobs_job"}
        cursor.execute(analyze[connection.vendor])
        if connection.vendor == "mysql":
            cursor.fetchall()
    plan = Job.objects.for_object(library).explain()
    assert "vellum_job_ref" in plan, plan
    Job.objects.all().delete()


def test_enqueue_many_returns_the_jobs_as_the_database_has_them():
    library = Library.objects.create(name="maps")
    returned = jobs.add.using(ref=library, priority=3).enqueue_many([(1, 2), (3, 4)])
    stored = list(Job.objects.filter(pk__in=[job.pk for job in returned]).order_by("pk"))
    fields = [f.attname for f in Job._meta.concrete_fields]
    for mine, theirs in zip(returned, stored, strict=True):
        assert [getattr(mine, f) for f in fields] == [getattr(theirs, f) for f in fields]
        assert mine.ref == library
        assert not mine._state.adding
    returned[0].priority = 7
    returned[0].save(update_fields=["priority"])
    assert Job.objects.get(pk=returned[0].pk).priority == 7


def test_enqueue_many_stores_each_call_s_arguments_as_given():
    # Positional and keyword calls mixed, text beyond ASCII, nesting, numbers past a double's
    # precision and empty ones: each row holds its own call's arguments, as the database reads them.
    values = [
        {"naïve": ["ü", "日本", "\u2028"], "n": 2**63 - 1, "f": 0.1, "none": None, "yes": True},
        [[], {}, [[1, [2, [3]]]]],
        "",
        -(2**53) - 1,
    ]
    calls = [(value,) if i % 2 else {"value": value} for i, value in enumerate(values)]
    returned = jobs.record.enqueue_many(calls)
    stored = dict(Job.objects.values_list("pk", "args"))
    stored_kwargs = dict(Job.objects.values_list("pk", "kwargs"))
    assert [(stored[job.pk], stored_kwargs[job.pk]) for job in returned] == [
        ([value], {}) if i % 2 else ([], {"value": value}) for i, value in enumerate(values)
    ]
    assert [(job.args, job.kwargs) for job in returned] == [
        (stored[job.pk], stored_kwargs[job.pk]) for job in returned
    ]


def test_enqueue_returns_the_job_as_the_database_has_it():
    library = Library.objects.create(name="atlas")
    returned = jobs.add.using(ref=library, priority=3, delay=60, queue="slow").enqueue(1, b=2)
    stored = Job.objects.get(pk=returned.pk)
    fields = [f.attname for f in Job._meta.concrete_fields]
    assert [getattr(returned, f) for f in fields] == [getattr(stored, f) for f in fields]
    assert returned.ref == library
    assert not returned._state.adding
    assert returned._state.db == "default"


def test_enqueue_sends_post_init_when_something_listens():
    seen: list[Job] = []

    def receiver(sender: type[Job], instance: Job, **kwargs: object) -> None:
        seen.append(instance)

    signals.post_init.connect(receiver, sender=Job)
    try:
        returned = jobs.add.enqueue(1, 2)
    finally:
        signals.post_init.disconnect(receiver, sender=Job)
    assert seen == [returned]
    assert seen[0].args == [1, 2]


def test_an_enqueue_after_an_error_in_an_atomic_block_is_refused_as_any_query_is():
    with transaction.atomic():
        transaction.set_rollback(True)  # what an error caught inside the block leaves
        with pytest.raises(TransactionManagementError, match="until the end of the 'atomic' block"):
            jobs.add.enqueue(1, 2)
    assert Job.objects.count() == 0


def test_an_enqueue_from_async_code_is_refused_as_any_query_is():
    async def enqueue_in_the_event_loop() -> None:
        jobs.add.enqueue(1, 2)

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(enqueue_in_the_event_loop())
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_after_the_connection_was_closed_reconnects():
    jobs.add.enqueue(1, 2)
    connection.close()
    job = jobs.add.enqueue(3, 4)
    assert Job.objects.get(pk=job.pk).args == [3, 4]


def test_an_enqueue_that_an_execute_wrapper_runs_inside_another_gets_its_own_row():
    inner: list[Job] = []
    started: list[bool] = []

    def enqueue_another(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not started:
            started.append(True)
            inner.append(jobs.add.enqueue(5, 6))
        return result

    with connection.execute_wrapper(enqueue_another):
        outer = jobs.add.enqueue(1, 2)
    assert outer.pk != inner[0].pk
    assert Job.objects.get(pk=outer.pk).args == [1, 2]
    assert Job.objects.get(pk=inner[0].pk).args == [5, 6]


def test_an_enqueue_is_logged_while_django_logs_queries(measured_clock):
    with override_settings(DEBUG=True):
        connection.queries_log.clear()
        jobs.add.enqueue(1, 2)
        (query,) = connection.queries
    assert query["sql"].startswith(f"INSERT INTO {connection.ops.quote_name(Job._meta.db_table)}")


def test_enqueue_many_sends_post_init_when_something_listens():
    seen: list[Job] = []

    def receiver(sender: type[Job], instance: Job, **kwargs: object) -> None:
        seen.append(instance)

    signals.post_init.connect(receiver, sender=Job)
    try:
        returned = jobs.add.enqueue_many([(1, 2), (3, 4)])
    finally:
        signals.post_init.disconnect(receiver, sender=Job)
    assert seen == returned
    assert [job.args for job in seen] == [[1, 2], [3, 4]]


# -- the payload limit: '["' + 94 characters + '"]' and '{}' are exactly 100 bytes as JSON

SMALL_LIMIT = override_settings(VELLUM_JOBS={"MAX_PAYLOAD_BYTES": 100})
FITS, TOO_BIG = "x" * 94, "x" * 95


@SMALL_LIMIT
def test_arguments_up_to_max_payload_bytes_are_stored():
    job = jobs.record.enqueue(FITS)
    assert Job.objects.get(pk=job.pk).args == [FITS]


@SMALL_LIMIT
@pytest.mark.parametrize(
    "call",
    [
        lambda: jobs.record.enqueue(TOO_BIG),
        lambda: jobs.record.enqueue(value="x" * 87),  # [] and {"value":"..."}: 87 + 14 bytes
        lambda: enqueue("test.record", TOO_BIG),
        lambda: jobs.record.using(queue="slow", priority=5).enqueue(TOO_BIG),
        lambda: jobs.scan.enqueue(1, note=TOO_BIG),  # unique jobs are inserted one by one
    ],
)
def test_arguments_over_max_payload_bytes_are_refused_naming_job_size_and_limit(call):
    with pytest.raises(
        ValueError, match=r"arguments of job 'test\.(record|scan)' are 1\d\d bytes as JSON"
    ) as raised:
        call()
    assert "over the limit of 100 bytes (VELLUM_JOBS['MAX_PAYLOAD_BYTES'])" in str(raised.value)
    assert Job.objects.count() == 0


@SMALL_LIMIT
def test_one_call_over_max_payload_bytes_in_enqueue_many_writes_none_of_them():
    jobs.record.enqueue("before")
    with pytest.raises(ValueError, match=r"job 'test\.record' \(call 2 of 4\) are 101 bytes"):
        jobs.record.enqueue_many([(FITS,), ("b",), (TOO_BIG,), ("d",)])
    with pytest.raises(ValueError, match=r"\(call 1 of 2\)"), transaction.atomic():
        jobs.record.enqueue("inside")
        jobs.record.enqueue_many([("e",), {"value": TOO_BIG}])
    assert list(Job.objects.values_list("args", flat=True)) == [["before"]]


@SMALL_LIMIT
def test_the_limit_is_per_job_not_per_enqueue_many():
    created = jobs.record.enqueue_many([(FITS,), (FITS,), (FITS,)])
    assert Job.objects.filter(pk__in=[job.pk for job in created]).count() == 3


@SMALL_LIMIT
def test_the_limit_counts_bytes_of_utf8_not_characters():
    # é is two bytes in UTF-8 (six if it were escaped as \u00e9)
    with pytest.raises(ValueError, match="101 bytes"):
        jobs.record.enqueue("é" * 47 + "x")
    assert Job.objects.get(pk=jobs.record.enqueue("é" * 47).pk).args == ["é" * 47]


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is new in Django 6.0")
@SMALL_LIMIT
def test_a_django_task_over_max_payload_bytes_is_refused_too():
    from tests.testapp import tasks

    with pytest.raises(ValueError, match=r"send_mail' are 101 bytes as JSON, over the limit of 100 bytes"):
        tasks.send_mail.enqueue(TOO_BIG)
    assert Job.objects.count() == 0


# -- the wakeup: on PostgreSQL the enqueue's own statement sends the NOTIFY

on_postgresql = pytest.mark.skipif(
    os.environ.get("VELLUM_TEST_DB") != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's"
)


@pytest.fixture
def listener() -> Iterator[Any]:
    """A connection of its own that LISTENs on the channel idle workers listen on."""
    raw = connection.get_new_connection(connection.get_connection_params())
    raw.autocommit = True
    raw.execute(f'LISTEN "{channel()}"')
    yield raw
    raw.close()


def notified(listener: Any, wait: float = 0.5) -> list[str]:
    """The payloads (queue names) of the notifications that arrive within ``wait`` seconds."""
    return [n.payload for n in listener.notifies(timeout=wait, stop_after=1)]


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_an_enqueue_on_its_own_notifies_listening_workers(listener):
    jobs.add.using(queue="media").enqueue(1, 2)
    assert notified(listener) == ["media"]


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_an_enqueue_in_a_transaction_notifies_when_it_commits_and_not_before(listener):
    with transaction.atomic():
        jobs.add.using(queue="media").enqueue(1, 2)
        assert notified(listener) == []  # the job is not visible yet: a woken worker would find nothing
    assert notified(listener) == ["media"]


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_an_enqueue_rolled_back_notifies_nobody(listener):
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        jobs.add.using(queue="media").enqueue(1, 2)
        raise Abort
    assert notified(listener) == []


@on_postgresql
@pytest.mark.django_db(transaction=True)
def test_enqueue_many_notifies_once(listener):
    jobs.add.using(queue="media").enqueue_many([(i, i) for i in range(5)])
    assert [n.payload for n in listener.notifies(timeout=0.5)] == ["media"]
