"""The worker list: who is running jobs, on which queues, and whether they are still alive.

A worker is alive while its heartbeat is younger than ``LEASE``, the same
test the lease recovery uses: a stale row is a process that died or froze,
and its jobs come back to the queue when their leases lapse.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from vellum_jobs.admin import display
from vellum_jobs.conf import conf
from vellum_jobs.core import clock
from vellum_jobs.core.models import Job, Worker

if TYPE_CHECKING:
    WorkerAdminBase = admin.ModelAdmin[Worker]
else:
    WorkerAdminBase = admin.ModelAdmin


class LivenessFilter(admin.SimpleListFilter):
    title = "liveness"
    parameter_name = "liveness"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("alive", "alive"), ("stale", "stale")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        since = clock.of(queryset.db) - timedelta(seconds=conf.lease)
        if self.value() == "alive":
            return queryset.filter(last_heartbeat__gte=since)
        if self.value() == "stale":
            return queryset.filter(last_heartbeat__lt=since)
        return queryset


@admin.register(Worker)
class WorkerAdmin(WorkerAdminBase):
    list_display = (
        "host",
        "pid",
        "queue_list",
        "threads",
        "async_in_use",
        "connections",
        "prefetched_count",
        "started_at",
        "last_heartbeat",
        "liveness",
        "clock",
        "trouble",
        "running_jobs",
    )
    list_filter = (LivenessFilter,)
    search_fields = ("host", "=pid")
    fields = (
        "id",
        "host",
        "pid",
        "queue_list",
        "threads",
        "async_workers",
        "async_running",
        "connections",
        "prefetched_count",
        "names",
        "task_backends",
        "unknown_tasks",
        "started_at",
        "last_heartbeat",
        "liveness",
        "clock",
        "trouble",
        "running_jobs",
    )
    readonly_fields = fields

    class Media:
        css = {"all": ("vellum_jobs/admin.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Worker | None = None) -> bool:
        # Workers write their own rows; the page only shows them.
        if obj is not None:
            return False
        return super().has_change_permission(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Worker]:
        running = (
            Job.objects.running()
            .filter(worker_id=OuterRef("pk"))
            .order_by()
            .values("worker_id")
            .annotate(n=Count("*"))
            .values("n")
        )
        return (
            super()
            .get_queryset(request)
            .annotate(running_count=Coalesce(Subquery(running, output_field=IntegerField()), Value(0)))
        )

    @admin.display(description="async")
    def async_in_use(self, worker: Worker) -> str:
        """Coroutine jobs running on its event loop at the last heartbeat, of how many it runs at once."""
        if not worker.async_workers:
            return "off"
        return f"{worker.async_running} / {worker.async_workers}"

    @admin.display(description="prefetched")
    def prefetched_count(self, worker: Worker) -> int:
        """Jobs claimed ahead, waiting for a thread, at the last heartbeat."""
        return len(worker.prefetched or [])

    @admin.display(description="queues")
    def queue_list(self, worker: Worker) -> str:
        return ", ".join(worker.queues) if worker.queues else "all"

    @admin.display(description="liveness")
    def liveness(self, worker: Worker) -> SafeString:
        if worker.is_alive:
            return display.badge("alive", "alive")
        silent = display.duration(timezone.now() - worker.last_heartbeat)
        return format_html("{} silent for {}", display.badge("stale", "stale"), silent)

    @admin.display(description="clock")
    def clock(self, worker: Worker) -> SafeString | str:
        """The host's clock against the database's, flagged past the bound (empty on SQLite)."""
        if worker.clock_offset is None:
            return display.EMPTY
        if worker.clock_warning:
            return format_html("{} {}", display.badge("stale", "off"), worker.clock_warning)
        return f"{worker.clock_offset:+.2f}s"

    @admin.display(description="running jobs")
    def running_jobs(self, worker: Worker) -> SafeString | str:
        count = int(getattr(worker, "running_count", 0))
        try:
            url = reverse(f"{self.admin_site.name}:vellum_jobs_job_changelist")
        except NoReverseMatch:
            return str(count)
        query = urlencode({"state__exact": Job.State.RUNNING, "worker_id": str(worker.pk)})
        return format_html('<a href="{}?{}">{}</a>', url, query, count)
