"""The job list's name, queue and handler filters, whose choices cost no scan of the job table.

Django's ``list_filter = ["name"]`` finds its choices with ``SELECT DISTINCT``
over every row, on every page. The names a worker can run are in the
registry, and the queues in the registered options and the live workers'
rows, so the choices come from there. A value that is not among them (a job
of a name no longer registered, a queue chosen with ``using(queue=...)``)
still filters when it is in the URL, and then shows as a choice.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from vellum_jobs.admin import failures
from vellum_jobs.core import registry
from vellum_jobs.core.models import Job, Worker


class _ColumnFilter(admin.SimpleListFilter):
    """Filters on one column by exact value, through that column's index."""

    def known(self) -> Iterable[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = set(self.known())
        if self.value():
            values.add(str(self.value()))
        return [(value, value) for value in sorted(values)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() is None:
            return queryset
        return queryset.filter(**{str(self.parameter_name): self.value()})


class NameFilter(_ColumnFilter):
    title = "name"
    parameter_name = "name"

    def known(self) -> Iterable[str]:
        return registry.names()


class QueueFilter(_ColumnFilter):
    title = "queue"
    parameter_name = "queue"

    def known(self) -> Iterable[str]:
        queues = {Job._meta.get_field("queue").default}
        queues.update(registry.get(name).options.queue for name in registry.names())
        for worker_queues in Worker.objects.values_list("queues", flat=True):
            queues.update(q for q in worker_queues or () if isinstance(q, str))
        return queues


class HandlerFilter(admin.SimpleListFilter):
    """Async (``async def``, run on the worker's event loop) or sync jobs.

    No index leads with ``is_async`` (the claim's holds queued jobs only), so
    alone it walks the id index backwards until a page is found: quick while
    both kinds are common, a longer walk for the rarer kind on a big table.
    """

    title = "handler"
    parameter_name = "handler"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("async", "async"), ("sync", "sync")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in ("async", "sync"):
            return queryset.filter(is_async=self.value() == "async")
        return queryset


class RetryingFilter(admin.SimpleListFilter):
    """Queued jobs whose last attempt failed, waiting to retry (``failures.retrying``).

    It walks the state index's queued entries newest first, reading each row
    for its attempts and error: quick while retries are common among queued
    jobs, a longer walk behind a large backlog of fresh ones.
    """

    title = "retries"
    parameter_name = "retrying"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "waiting to retry")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return failures.retrying(queryset)
        return queryset


class ErrorFilter(admin.SimpleListFilter):
    """Jobs whose error contains a text: what a group of failures links to; shown only while set.

    No index serves it: it reads the rows the other filters (state, name)
    select, newest first, until it has a page.
    """

    title = "error"
    parameter_name = "error"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(str(value), str(value))] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value():
            return queryset.filter(error__contains=self.value())
        return queryset


class WorkflowFilter(admin.SimpleListFilter):
    """The jobs of one workflow or batch: what its page links to; shown only while set.

    It reads the ``vellum_job_workflow`` index (workflow, state), with the state filter too.
    """

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(str(value), f"#{value}")] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = str(self.value() or "")
        if not value:
            return queryset
        if not value.isdecimal() or len(value) > 19:  # no workflow has it: no job either
            return queryset.none()
        return queryset.filter(workflow_id=int(value))
