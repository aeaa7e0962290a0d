"""The worker list: who is running jobs, whether each is still alive, and a graceful stop.

A worker is alive while its heartbeat is younger than ``LEASE``, the same
test the lease recovery uses: a stale row is a process that died or froze,
and its jobs come back to the queue when their leases lapse.

The list fits a laptop's width with the nav sidebar open: per worker its
liveness and last beat to the second, uptime, busy threads and coroutine
slots, attempts finished, memory, and its running jobs with their progress
(``running_jobs``: read for the whole page in one query). The rest (connections, jobs
claimed ahead, the clock) is on the worker's page, and there is no filter
panel, which would take a quarter of that width: a stale worker's row says
so, and sorting by liveness puts the longest silent last.

"Stop gracefully" (an action, and a button on the worker's page) records
the request in the row; the worker sees it at its next heartbeat and stops
as on SIGTERM (``worker.stop_request``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.defaultfilters import filesizeformat
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.formats import number_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from vellum_jobs.admin import display, running_jobs
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.worker import stop_request

if TYPE_CHECKING:
    WorkerAdminBase = admin.ModelAdmin[Worker]
else:
    WorkerAdminBase = admin.ModelAdmin


@admin.action(permissions=["change"], description="Stop selected workers gracefully")
def stop_gracefully(model_admin: WorkerAdmin, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
    asked = stop_request.ask(queryset.values_list("pk", flat=True), by=_who(request), using=queryset.db)
    model_admin.message_user(request, _asked_message(asked, queryset.count()), messages.SUCCESS)


def _who(request: HttpRequest) -> str:
    return f"admin: {request.user}"


def _asked_message(asked: int, selected: int) -> str:
    text = (
        f"Asked {asked} worker{'s' if asked != 1 else ''} to stop: each stops claiming at its next heartbeat,"
        " lets running jobs finish within its --grace, hands back the rest and exits 0"
        " (under runjobs --processes, with its supervisor's other processes)."
    )
    if selected > asked:
        text += f" {selected - asked} had been asked already."
    return text


@admin.register(Worker)
class WorkerAdmin(WorkerAdminBase):
    list_display = (
        "worker",
        "liveness",
        "uptime",
        "threads_busy",
        "async_in_use",
        "jobs_run_count",
        "memory_held",
        "running_jobs",
    )
    list_display_links = ("worker",)
    search_fields = ("host", "=pid")
    actions = (stop_gracefully,)
    fields = (
        "id",
        "host",
        "pid",
        "queue_list",
        "liveness",
        "stop_asked",
        "started_at",
        "uptime",
        "last_heartbeat",
        "threads",
        "async_workers",
        "async_running",
        "jobs_run_count",
        "memory_held",
        "connections",
        "prefetched_count",
        "names",
        "task_backends",
        "unknown_tasks",
        "clock",
        "trouble",
        "running_jobs",
    )
    readonly_fields = fields

    class Media:
        css = {"all": ("vellum_jobs/admin.css", "vellum_jobs/workers.css")}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Worker | None = None) -> bool:
        # Workers write their own rows; the page only shows them (and the stop action asks).
        if obj is not None:
            return False
        return super().has_change_permission(request)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return running_jobs.WorkerChangeList

    def get_urls(self) -> list[URLPattern]:
        stop = self.admin_site.admin_view(require_POST(self.stop_view))
        return [path("<path:object_id>/stop/", stop, name="vellum_jobs_worker_stop"), *super().get_urls()]

    def stop_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The worker page's "Stop gracefully" button."""
        if not super().has_change_permission(request):
            raise PermissionDenied
        worker = self.get_object(request, object_id)
        if worker is None:
            raise Http404("no such worker: it may have stopped already")
        asked = stop_request.ask([worker.pk], by=_who(request), using=worker._state.db)
        self.message_user(request, _asked_message(asked, 1), messages.SUCCESS)
        return HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:vellum_jobs_worker_change", args=[worker.pk])
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {**(extra_context or {}), "can_stop": super().has_change_permission(request)}
        return super().change_view(request, object_id, form_url, context)

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Worker | None:
        worker = super().get_object(request, object_id, from_field)
        if worker is not None:
            running_jobs.attach([worker], worker._state.db)
        return worker

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

    # -- columns ---------------------------------------------------------

    @admin.display(description="worker", ordering="host")
    def worker(self, worker: Worker) -> SafeString:
        """``host:pid``, and the queues it serves beneath."""
        return format_html(
            '{}:{}<div class="vellum-worker-queues">queues: {}</div>',
            worker.host,
            worker.pid,
            self.queue_list(worker),
        )

    @admin.display(description="async")
    def async_in_use(self, worker: Worker) -> str:
        """Coroutine jobs running on its event loop at the last heartbeat, of how many it runs at once."""
        if not worker.async_workers:
            return "off"
        return f"{worker.async_running} / {worker.async_workers}"

    @admin.display(description="threads")
    def threads_busy(self, worker: Worker) -> SafeString:
        """Threads running a job, of its threads (a job claimed ahead waits for one: not counted)."""
        running = running_jobs.of(worker)
        in_threads = sum(1 for job in running if not job.is_async) - len(worker.prefetched or [])
        busy = max(0, min(worker.threads, in_threads))
        return format_html(
            '<span title="threads running a job, of its threads">{} / {}</span>', busy, worker.threads
        )

    @admin.display(description="jobs run", ordering="jobs_run")
    def jobs_run_count(self, worker: Worker) -> str:
        """Attempts it finished since it started, at its last heartbeat."""
        return number_format(worker.jobs_run, force_grouping=True)

    @admin.display(description="memory", ordering="memory")
    def memory_held(self, worker: Worker) -> str:
        """Its resident set size at the last heartbeat."""
        return display.EMPTY if worker.memory is None else str(filesizeformat(worker.memory))

    @admin.display(description="uptime", ordering="started_at")
    def uptime(self, worker: Worker) -> SafeString:
        return format_html(
            '<span title="started {}">{}</span>',
            display.moment(worker.started_at),
            _seconds(timezone.now() - worker.started_at),
        )

    @admin.display(description="prefetched")
    def prefetched_count(self, worker: Worker) -> int:
        """Jobs claimed ahead, waiting for a thread, at the last heartbeat."""
        return len(worker.prefetched or [])

    @admin.display(description="queues")
    def queue_list(self, worker: Worker) -> str:
        return ", ".join(worker.queues) if worker.queues else "all"

    @admin.display(description="liveness", ordering="-last_heartbeat")
    def liveness(self, worker: Worker) -> SafeString:
        """Alive or stale, its last beat to the second, a stop asked for, its trouble and clock."""
        ago = _seconds(timezone.now() - worker.last_heartbeat)
        beat = display.when("beat", worker.last_heartbeat)
        if worker.is_alive:
            parts: list[SafeString | str] = [
                format_html("{} beat {} ({} ago)", display.badge("alive", "alive"), beat, ago)
            ]
        else:
            parts = [format_html("{} silent for {} ({})", display.badge("stale", "stale"), ago, beat)]
        if worker.stop_requested_at is not None:
            parts.append(self.stop_asked(worker))
        if worker.trouble:
            parts.append(format_html('<div class="vellum-worker-trouble">{}</div>', worker.trouble))
        if worker.clock_warning:
            parts.append(
                format_html('<div class="vellum-worker-trouble">clock: {}</div>', worker.clock_warning)
            )
        return format_html_join("", "{}", ((part,) for part in parts))

    @admin.display(description="stop requested")
    def stop_asked(self, worker: Worker) -> SafeString | str:
        if worker.stop_requested_at is None:
            return display.EMPTY
        return format_html(
            "<div>{} asked {} by {}</div>",
            display.badge("stopping", "stopping"),
            display.when("asked", worker.stop_requested_at),
            worker.stop_requested_by or "someone",
        )

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
        """How many, linked to the job list, and the first few with their progress, each linked."""
        return running_jobs.cell(worker, self.admin_site.name)


def _seconds(value: timedelta) -> str:
    """A duration in whole seconds: ``0 s``, ``42 s``, then as ``display.duration``: ``4 min 5 s``."""
    seconds = max(0, int(value.total_seconds()))
    return f"{seconds} s" if seconds < 60 else display.duration(timedelta(seconds=seconds))
