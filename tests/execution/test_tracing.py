"""Traces of enqueues and attempts: one trace from the span that enqueues a job to every attempt that runs it.

In this process with the SDK's in-memory exporter, across a real ``runjobs``
process that writes its spans to a file, and nothing at all without the
SDK or without the API.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import pytest
from django.db import connection
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.support import spanfile
from tests.support.leases import claim_for
from tests.support.processes import ROOT, Runjobs, wait_for
from tests.support.workers import burst
from tests.testapp import jobs
from vellum_jobs import testing
from vellum_jobs.core.models import Job
from vellum_jobs.execution import tracing

pytestmark = pytest.mark.django_db

ERROR, UNSET = StatusCode.ERROR, StatusCode.UNSET


@pytest.fixture
def exporter(monkeypatch) -> InMemorySpanExporter:
    """An SDK tracer provider for this test alone, its finished spans kept in memory.

    The API lets a process set its global provider once; the test's takes
    its place and leaves with the test, so other tests run untraced.
    """
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    return exporter


def request_span():
    """The span a view would be in (a web framework's instrumentation makes it)."""
    return trace.get_tracer("tests").start_as_current_span("GET /libraries/3/scan", kind=SpanKind.SERVER)


def spans(exporter: InMemorySpanExporter, kind: SpanKind) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.kind == kind]


def attributes(span_or_event) -> dict[str, Any]:
    return dict(span_or_event.attributes or {})


def stored_context(job: Job) -> str:
    return Job.objects.get(pk=job.pk).trace_context


def test_an_enqueue_and_its_attempt_join_the_trace_of_the_span_that_enqueued(exporter):
    with request_span() as request:
        job = jobs.add.enqueue(2, 3)
    testing.run_jobs()
    (enqueue,) = spans(exporter, SpanKind.PRODUCER)
    (attempt,) = spans(exporter, SpanKind.CONSUMER)
    trace_id = request.get_span_context().trace_id
    assert enqueue.context.trace_id == attempt.context.trace_id == trace_id
    assert enqueue.parent is not None and enqueue.parent.span_id == request.get_span_context().span_id
    assert attempt.parent is not None and attempt.parent.span_id == enqueue.context.span_id
    assert (enqueue.name, attempt.name) == ("vellum_jobs enqueue test.add", "vellum_jobs run test.add")
    assert attributes(enqueue) == {
        "messaging.system": "vellum_jobs",
        "messaging.operation.type": "send",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job.pk),
        "vellum_jobs.job.name": "test.add",
        "vellum_jobs.queue": "default",
        "vellum_jobs.job.id": job.pk,
    }
    assert attributes(attempt) == {
        "messaging.system": "vellum_jobs",
        "messaging.operation.type": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job.pk),
        "vellum_jobs.job.name": "test.add",
        "vellum_jobs.queue": "default",
        "vellum_jobs.job.id": job.pk,
        "vellum_jobs.attempt": 1,
        "vellum_jobs.max_attempts": 5,
        "vellum_jobs.attempt.outcome": "done",
        "vellum_jobs.job.state": "done",
    }
    assert attempt.status.status_code == UNSET
    traceparent = f"00-{trace_id:032x}-{enqueue.context.span_id:016x}-{enqueue.context.trace_flags:02x}"
    assert json.loads(stored_context(job)) == {"traceparent": traceparent}


# What each ending looks like on its attempt's span: outcome, the job's state
# after it, status and its description, and the exception recorded.
ENDINGS = [
    (jobs.add, (1, 2), "done", "done", UNSET, None, None),
    (jobs.fail_now, (), "failed", "failed", ERROR, "vellum_jobs.exceptions.Fail: bad input", "Fail"),
    (jobs.boom, (), "failed", "queued", ERROR, "RuntimeError: boom", "RuntimeError"),
    (jobs.retry_me, (60,), "retry requested", "queued", UNSET, None, None),
]


@pytest.mark.parametrize(("function", "args", "outcome", "state", "status", "description", "raised"), ENDINGS)
def test_an_attempt_span_says_how_the_attempt_ended(
    exporter, function, args, outcome, state, status, description, raised
):
    function.enqueue(*args)
    testing.run_jobs()
    (attempt,) = spans(exporter, SpanKind.CONSUMER)
    assert attributes(attempt)["vellum_jobs.attempt.outcome"] == outcome
    assert attributes(attempt)["vellum_jobs.job.state"] == state
    assert (attempt.status.status_code, attempt.status.description) == (status, description)
    recorded = [attributes(event)["exception.type"] for event in attempt.events if event.name == "exception"]
    assert [name.rsplit(".", 1)[-1] for name in recorded] == ([raised] if raised else [])


def test_every_attempt_of_a_retried_job_is_a_child_of_its_one_enqueue(exporter):
    with request_span():
        jobs.raise_error.enqueue("again")  # three attempts, no backoff
    testing.run_jobs()
    (enqueue,) = spans(exporter, SpanKind.PRODUCER)
    attempts = spans(exporter, SpanKind.CONSUMER)
    assert [attributes(a)["vellum_jobs.attempt"] for a in attempts] == [1, 2, 3]
    assert [attributes(a)["vellum_jobs.job.state"] for a in attempts] == ["queued", "queued", "failed"]
    assert {a.parent.span_id for a in attempts if a.parent} == {enqueue.context.span_id}
    assert all(a.status.description == "ValueError: again" for a in attempts)


def test_the_jobs_of_one_enqueue_many_share_its_span(exporter):
    with request_span():
        many = jobs.add.enqueue_many([(1, 2), (3, 4), (5, 6)])
    assert len({stored_context(job) for job in many}) == 1
    testing.run_jobs()
    (enqueue,) = spans(exporter, SpanKind.PRODUCER)
    assert attributes(enqueue)["messaging.batch.message_count"] == 3
    assert "vellum_jobs.job.id" not in attributes(enqueue)
    attempts = spans(exporter, SpanKind.CONSUMER)
    assert sorted(attributes(a)["vellum_jobs.job.id"] for a in attempts) == [job.pk for job in many]
    assert {a.parent.span_id for a in attempts if a.parent} == {enqueue.context.span_id}


def test_a_job_stored_without_a_context_runs_in_a_root_span(exporter):
    job = jobs.boom.enqueue()
    Job.objects.filter(pk=job.pk).update(trace_context="")  # enqueued untraced
    with request_span():  # run inline from inside a span: still not that span's child
        testing.run_jobs()
    (attempt,) = spans(exporter, SpanKind.CONSUMER)
    assert attempt.parent is None
    assert (attempt.status.status_code, attempt.status.description) == (ERROR, "RuntimeError: boom")


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_each_attempt_in_its_span_on_its_threads_and_on_its_event_loop(exporter):
    with request_span() as request:
        jobs.add.enqueue(1, 2)  # a slot thread's
        jobs.async_add.enqueue(3, 4)  # the event loop's, as are the next two
        jobs.async_slow_first.enqueue()  # attempt 1 is cancelled at its timeout; attempt 2 returns
        jobs.async_fail.enqueue("fail")
    burst(threads=1, async_workers=5)
    enqueues = {attributes(s)["vellum_jobs.job.name"]: s for s in spans(exporter, SpanKind.PRODUCER)}
    attempts = spans(exporter, SpanKind.CONSUMER)
    endings = {
        (attributes(a)["vellum_jobs.job.name"], attributes(a)["vellum_jobs.attempt"]): (
            attributes(a)["vellum_jobs.attempt.outcome"],
            a.status.status_code,
        )
        for a in attempts
    }
    assert endings == {
        ("test.add", 1): ("done", UNSET),
        ("test.async_add", 1): ("done", UNSET),
        ("test.async_slow_first", 1): ("timed out", ERROR),
        ("test.async_slow_first", 2): ("done", UNSET),
        ("test.async_fail", 1): ("failed", ERROR),
    }
    for attempt in attempts:
        enqueue = enqueues[attributes(attempt)["vellum_jobs.job.name"]]
        assert attempt.context.trace_id == request.get_span_context().trace_id
        assert attempt.parent is not None and attempt.parent.span_id == enqueue.context.span_id
    (failed,) = [a for a in attempts if attributes(a)["vellum_jobs.job.name"] == "test.async_fail"]
    assert [(e.name, attributes(e)["exception.message"]) for e in failed.events] == [("exception", "told to")]


@pytest.mark.django_db(transaction=True)
def test_a_thread_whose_handler_ran_past_its_timeout_ends_its_span_timed_out(exporter):
    jobs.stubborn.using(timeout=0.2).enqueue(seconds=0.6)  # one attempt, which ignores its timeout
    burst(threads=1)
    (attempt,) = wait_for(lambda: spans(exporter, SpanKind.CONSUMER), what="the handler to come back")
    assert attributes(attempt)["vellum_jobs.attempt.outcome"] == "timed out"
    assert attributes(attempt)["vellum_jobs.job.state"] == "failed"  # its one attempt used
    assert attempt.status.status_code == ERROR


def test_a_claim_reads_the_trace_context_with_the_job(exporter):
    with request_span():
        job = jobs.add.enqueue(1, 2)
    (claimed,) = claim_for(uuid.uuid4())
    assert "trace_context" not in claimed.get_deferred_fields()  # an attempt's span costs no query
    assert claimed.trace_context == stored_context(job) != ""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_runjobs_process_runs_the_attempts_in_the_trace_that_enqueued_them(exporter, tmp_path):
    path = tmp_path / "spans.jsonl"
    worker = Runjobs("--workers", "1", env={"VELLUM_TEST_SPANS": str(path)})
    try:
        with request_span() as request:
            enqueued = [jobs.add.enqueue(2, 3), jobs.async_add.enqueue(4, 5)]
        enqueues = {attributes(s)["vellum_jobs.job.id"]: s for s in spans(exporter, SpanKind.PRODUCER)}

        def attempts() -> dict[int, dict] | None:
            found = {
                s["attributes"]["vellum_jobs.job.id"]: s
                for s in spanfile.read(path)
                if s["name"].startswith("vellum_jobs run ")
            }
            return found if len(found) == len(enqueued) else None

        ran = wait_for(attempts, what="the runjobs process's attempt spans")
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
    for job in enqueued:
        attempt = ran[job.pk]
        assert attempt["context"]["trace_id"] == f"0x{request.get_span_context().trace_id:032x}"
        assert attempt["parent_id"] == f"0x{enqueues[job.pk].context.span_id:016x}"
        assert attempt["kind"] == "SpanKind.CONSUMER"
        assert attempt["attributes"]["vellum_jobs.attempt.outcome"] == "done"


def test_without_a_tracer_provider_jobs_store_no_context_and_run():
    assert tracing.enabled  # the API is installed; the project set no SDK provider
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    with trace.get_tracer("tests").start_as_current_span("GET /"):  # the API's stand-in records nothing
        enqueued = [jobs.add.enqueue(2, 3), *jobs.add.enqueue_many([(1, 1), (2, 2)])]
    assert [job.trace_context for job in enqueued] == ["", "", ""]
    testing.run_jobs()
    rows = Job.objects.filter(pk__in=[job.pk for job in enqueued]).order_by("pk")
    assert [(row.state, row.result, row.trace_context) for row in rows] == [
        ("done", 5, ""),
        ("done", 2, ""),
        ("done", 4, ""),
    ]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_without_the_api_jobs_enqueue_and_run_and_nothing_imports_it():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "VELLUM_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
    }
    env.pop("VELLUM_TEST_SPANS", None)
    command = [sys.executable, "-m", "tests.support.untraced"]
    process = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert process.returncode == 0, process.stderr
    report = json.loads(process.stdout.splitlines()[-1])
    assert report["enabled"] is False
    assert report["imported"] == []
    assert report["jobs"] == [
        ["test.add", "done", 5, ""],
        ["test.add", "done", 2, ""],
        ["test.add", "done", 4, ""],
        ["test.async_add", "done", 9, ""],
        ["test.boom", "queued", None, ""],
    ]
