"""Spans of enqueues and attempts through the OpenTelemetry API, when it is installed.

``enabled`` says whether the API can be imported, asked once without
importing it; callers check it first, so without the API an enqueue or an
attempt costs one boolean. The API is imported on first use. The project
brings the SDK: while it has set no tracer provider, ``tracer()`` is None
and callers skip the rest, storing "" as the trace context (the API's
stand-in tracer would make spans that record nothing and carry no context).
To know that cheaply, ``tracer()`` reads the API's private global provider
after its first look (see ``_provider``). Nor is the API imported while
nothing else in the process has imported its ``opentelemetry.trace``: only
that module sets a provider (or, when the environment names one, loads it),
so until then there is none, and a worker whose project traces nothing
never loads the API (with typing_extensions, 0.7 MiB of a worker's memory
loaded from bytecode, 8 MiB compiled from source).

An enqueue's span is a PRODUCER span in the caller's trace; its W3C trace
context (``traceparent``, ``tracestate``, baggage) is stored with the jobs
as compact JSON, so the jobs of one ``enqueue_many`` share it. Each attempt
runs in a CONSUMER span that is a child of that context, not a link: a job
is one message handled by one consumer at a time, so one trace reads from
the request that enqueued it to every attempt that ran it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider
    from opentelemetry.util.types import AttributeValue

    from vellum_jobs.core.models import Job


def _installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry") is not None
    except ImportError:  # a finder that refuses the name: as good as absent
        return False


enabled = _installed()

SYSTEM = "vellum_jobs"
# Outcomes of an attempt (its span's ``vellum_jobs.attempt.outcome``) whose span has status ERROR.
ERRORS = frozenset({"failed", "timed out"})

# The API's module that holds the global tracer provider: no provider is set before it is imported.
TRACE_API = "opentelemetry.trace"
# Whether the environment names a provider the API loads on its first look: read once, at start,
# as a process's environment is set (a lookup in os.environ costs microseconds, at every enqueue).
_named_by_environment = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ

# The tracer of the provider it came from: a provider's get_tracer() builds a new one each call.
_cached: tuple[TracerProvider, Tracer] | None = None
_asked = False
# Held while the spans' modules are imported on the first look at a provider: threads that
# import them for the first time at once can fail with Python's import deadlock error.
_first_use = threading.Lock()


def prepare() -> None:
    """Import the API's modules the spans use, ahead of the first span, if a provider can be set: on
    an event loop, an import (the propagators load entry points) would hold up every coroutine job."""
    if _may_trace():
        _import_span_modules()
        tracer()


def _may_trace() -> bool:
    """Whether a tracer provider may be set: the API is installed, and something imported its trace
    module, or the environment names a provider for it to load."""
    return enabled and (TRACE_API in sys.modules or _named_by_environment)


def _import_span_modules() -> None:
    with _first_use:
        importlib.import_module("opentelemetry.propagate")


def tracer() -> Tracer | None:
    """The package's tracer, or None while no tracer provider is set: the API's stand-in records nothing.

    Asked at every enqueue and attempt, since a provider may be set after the first.
    """
    global _cached
    provider = _provider()
    if provider is None:
        return None
    if _cached is None or _cached[0] is not provider:
        _import_span_modules()  # a provider set after prepare(): its first spans may start in threads at once
        _cached = (provider, provider.get_tracer(SYSTEM))
    return _cached[1]


def _provider() -> TracerProvider | None:
    """The global tracer provider, None while none is set.

    Until one is set, ``get_tracer_provider()`` looks up an environment
    variable at every call (a KeyError raised and caught inside
    ``os.environ``: 2 us, a tenth of an enqueue's own work on SQLite), so
    after its first call, which loads a provider the environment names, the
    API's global is read instead, while it is there.
    """
    global _asked
    if not _asked and not _may_trace():
        return None  # nothing can have set one: the API stays unimported
    from opentelemetry import trace

    if _asked and hasattr(trace, "_TRACER_PROVIDER"):
        found = trace._TRACER_PROVIDER
    else:
        _asked = True
        found = trace.get_tracer_provider()
    return None if found is None or isinstance(found, trace.ProxyTracerProvider) else found


@contextmanager
def enqueueing(tracer: Tracer, name: str, queue: str, count: int) -> Iterator[Span]:
    """The span of one enqueue call of ``count`` jobs, current within the block."""
    from opentelemetry.trace import SpanKind

    attributes: dict[str, AttributeValue] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.destination.name": queue,
        "vellum_jobs.job.name": name,
        "vellum_jobs.queue": queue,
    }
    if count > 1:
        attributes["messaging.batch.message_count"] = count
    title = f"vellum_jobs enqueue {name}"
    with tracer.start_as_current_span(title, kind=SpanKind.PRODUCER, attributes=attributes) as span:
        yield span


def injected() -> str:
    """The current context as the propagators write it, in compact JSON; "" when they write nothing."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return json.dumps(carrier, separators=(",", ":")) if carrier else ""


def enqueued(span: Span, jobs: Sequence[Job]) -> None:
    """Note the new job's id on its enqueue's span (one job: a batch's ids would be a long list)."""
    if len(jobs) == 1:
        span.set_attributes(_ids(jobs[0].pk))


@contextmanager
def attempt(tracer: Tracer, job: Job) -> Iterator[Span]:
    """The span of one attempt of ``job``, current within the block: a child of its enqueue's span.

    A job stored without a context (enqueued untraced) gets a root span.
    """
    from opentelemetry.trace import SpanKind

    attributes: dict[str, AttributeValue] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": job.queue,
        "vellum_jobs.job.name": job.name,
        "vellum_jobs.queue": job.queue,
        "vellum_jobs.attempt": job.attempts,
        "vellum_jobs.max_attempts": job.max_attempts,
        **_ids(job.pk),
    }
    title = f"vellum_jobs run {job.name}"
    parent = _extracted(job.trace_context)
    with tracer.start_as_current_span(
        title, context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span


def ended(span: Span, outcome: str, state: str, error: str) -> None:
    """Note on an attempt's span how it ended; ERROR, with the error's last line, if the attempt failed."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attributes({"vellum_jobs.attempt.outcome": outcome, "vellum_jobs.job.state": state})
    if outcome in ERRORS:
        span.set_status(Status(StatusCode.ERROR, error))


def record_exception(exc: BaseException) -> None:
    """Record what a handler raised on the current span: its attempt's, or a no-op one."""
    if TRACE_API not in sys.modules:
        return  # no span can be current: nothing imported the API that makes them
    from opentelemetry import trace

    trace.get_current_span().record_exception(exc)


def _ids(job_id: int) -> dict[str, AttributeValue]:
    return {"vellum_jobs.job.id": job_id, "messaging.message.id": str(job_id)}


def _extracted(text: str) -> Context:
    """The context stored with a job; an empty one (a root span follows) if there is none or it is unreadable.

    Never the caller's current context: an attempt run inline belongs to its job's trace.
    """
    from opentelemetry import propagate
    from opentelemetry.context import Context

    if not text:
        return Context()
    try:
        carrier = json.loads(text)
    except ValueError:
        return Context()
    if not isinstance(carrier, dict):
        return Context()
    return propagate.extract(carrier, context=Context())
