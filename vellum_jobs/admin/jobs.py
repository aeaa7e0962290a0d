"""The job list and the read-only job page.

The list is built to stay fast on millions of rows: it is ordered by id and
filtered through indexes (``vellum_job_state``, ``_name``, ``_queue``), it
counts a few pages ahead instead of the whole table (``pagination``), the
counts above it read at most ten thousand index entries per state
(``observe.figures``), filter choices come from the registry (``filters``), and a
number typed in the search box that can be an id looks up that id alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.utils import flatten_fieldsets, quote
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import smart_split, unescape_string_literal

from vellum_jobs.admin import actions, dashboard, display, explanations, references
from vellum_jobs.admin.changelist import JobChangeList
from vellum_jobs.admin.filters import HandlerFilter, NameFilter, QueueFilter
from vellum_jobs.admin.pagination import CappedPaginator, page_asked
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.observe import figures

if TYPE_CHECKING:
    JobAdminBase = admin.ModelAdmin[Job]
else:
    JobAdminBase = admin.ModelAdmin

MAX_ID = 2**63 - 1
MAX_ID_DIGITS = len(str(MAX_ID))


@admin.register(Job)
class JobAdmin(JobAdminBase):
    list_display = (
        "id",
        "name_and_handler",
        "state_badge",
        "queue",
        "priority",
        "attempts_of_max",
        "when",
        "duration_text",
        "progress_bar",
        "why_waiting",
        "reference",
    )
    list_display_links = ("id", "name_and_handler")
    list_filter = ("state", NameFilter, QueueFilter, HandlerFilter)
    # get_search_results decides how each is searched; these show the box.
    search_fields = ("=id", "name", "error")
    search_help_text = "A number finds the job with that id; other words match names and error text."
    ordering = ("-id",)
    # Only the id has an index to sort by in every filter; the filters do the rest.
    sortable_by = ("id",)
    list_per_page = 100
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = (actions.retry, actions.cancel, actions.run_now, actions.pause_queues, actions.resume_queues)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "name",
                    "handler",
                    "state_badge",
                    "queue",
                    "priority",
                    "attempts_of_max",
                    "reference",
                )
            },
        ),
        ("Waiting", {"fields": ("reasons", "concurrency", "cancel_requested_at")}),
        ("Progress", {"fields": ("last_progress", "progress_message")}),
        ("Arguments and result", {"fields": ("args_json", "kwargs_json", "result_json")}),
        ("Error", {"fields": ("error_text",)}),
        ("Attempts that did not succeed", {"fields": ("attempt_table",)}),
        ("Times", {"fields": ("created_at", "run_after", "started_at", "finished_at", "duration_text")}),
        ("Worker and lease", {"fields": ("worker", "lease_expires_at")}),
    )
    readonly_fields = flatten_fieldsets(fieldsets)

    class Media:
        css = {"all": ("vellum_jobs/admin.css",)}

    # -- permissions: Django's model permissions; the job page is read-only for everyone

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        # A saved form would write every column over what a worker is doing.
        # Changing a job is what the actions do, one guarded UPDATE each, and
        # they need the model's change permission.
        if obj is not None:
            return False
        return super().has_change_permission(request)

    # -- the dashboard: needs what the list needs, the view permission

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.dashboard_view)
        return [path("dashboard/", view, name="vellum_jobs_job_dashboard"), *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        context = {**self.admin_site.each_context(request), "opts": self.opts}
        return dashboard.view(request, context, self.get_queryset(request).db)

    # -- the list

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[JobChangeList]:
        return JobChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[Job],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> CappedPaginator:
        return CappedPaginator(
            queryset, per_page, orphans, allow_empty_first_page, page=page_asked(request.GET)
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        number = term.removeprefix("#")
        # isdecimal, not isdigit: "²" is a digit that int() refuses. The length
        # first: int() refuses more than 4,300 digits (sys.get_int_max_str_digits()).
        if number.isdecimal() and len(number.lstrip("0")) <= MAX_ID_DIGITS and int(number) <= MAX_ID:
            # One primary-key lookup; OR-ing in the text columns would scan the table.
            return queryset.filter(pk=int(number)), False
        # Anything else, a number no id can be included, is looked for in the text.
        for word in smart_split(term):
            if word[:1] in "\"'" and word[-1:] == word[:1]:
                word = unescape_string_literal(word)
            queryset = queryset.filter(Q(name__icontains=word) | Q(error__icontains=word))
        return queryset, False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {
            "state_counts": figures.by_state(self.get_queryset(request)),
            "state_selected": request.GET.get("state__exact", ""),
            **(extra_context or {}),
        }
        response = super().changelist_view(request, context)
        if isinstance(response, TemplateResponse) and response.context_data:
            cl = response.context_data.get("cl")
            if isinstance(cl, JobChangeList) and cl.count_capped:
                response.context_data["selection_note_all"] = "All matching jobs selected"
        return response

    # -- columns of the list and fields of the job page

    @admin.display(description="name", ordering="name")
    def name_and_handler(self, job: Job) -> SafeString | str:
        if job.is_async:
            return format_html("{} {}", job.name, display.badge("async", "async"))
        return job.name

    @admin.display(description="handler")
    def handler(self, job: Job) -> SafeString | str:
        if job.is_async:
            return format_html("{} async def, on the worker's event loop", display.badge("async", "async"))
        return "sync, on a worker thread"

    @admin.display(description="state")
    def state_badge(self, job: Job) -> SafeString:
        return display.badge(job.state, job.get_state_display())

    @admin.display(description="waiting because")
    def why_waiting(self, job: Job) -> SafeString | str:
        return explanations.short(job)

    @admin.display(description="why it waits")
    def reasons(self, job: Job) -> SafeString:
        return explanations.full(job)

    @admin.display(description="concurrency key")
    def concurrency(self, job: Job) -> str:
        if not job.concurrency_key:
            return display.EMPTY
        return f"{job.concurrency_key} (at most {job.concurrency_limit} at once)"

    @admin.display(description="attempts")
    def attempts_of_max(self, job: Job) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="due / finished")
    def when(self, job: Job) -> SafeString:
        if job.state == Job.State.QUEUED:
            wait = job.run_after - timezone.now()
            later = f" (in {display.duration(wait)})" if wait.total_seconds() >= 1 else ""
            return display.when("due", job.run_after, later)
        if job.state == Job.State.RUNNING:
            return display.when("started", job.started_at)
        return display.when("finished", job.finished_at)

    @admin.display(description="duration")
    def duration_text(self, job: Job) -> str:
        if job.state == Job.State.RUNNING and job.started_at:
            return f"{display.duration(timezone.now() - job.started_at)} so far"
        return display.duration(job.duration)

    @admin.display(description="progress")
    def progress_bar(self, job: Job) -> SafeString:
        if job.state != Job.State.RUNNING:
            return display.progress_bar(None, None)
        return display.progress_bar(job.progress_done, job.progress_total, job.progress_message)

    @admin.display(description="last progress")
    def last_progress(self, job: Job) -> SafeString:
        return display.progress_bar(job.progress_done, job.progress_total, job.progress_message)

    @admin.display(description="about")
    def reference(self, job: Job) -> SafeString | str:
        found = references.of(job)
        if found is None:
            return display.EMPTY
        if found.url is None:
            return found.label
        return format_html('<a href="{}">{}</a>', found.url, found.label)

    @admin.display(description="args")
    def args_json(self, job: Job) -> SafeString:
        return display.pretty_json(job.args)

    @admin.display(description="kwargs")
    def kwargs_json(self, job: Job) -> SafeString:
        return display.pretty_json(job.kwargs)

    @admin.display(description="result")
    def result_json(self, job: Job) -> SafeString:
        return display.pretty_json(job.result)

    @admin.display(description="error")
    def error_text(self, job: Job) -> SafeString:
        return display.preformatted(job.error)

    @admin.display(description="attempts")
    def attempt_table(self, job: Job) -> SafeString:
        return display.attempt_table(job.attempt_errors)

    @admin.display(description="worker")
    def worker(self, job: Job) -> SafeString | str:
        if job.worker_id is None:
            return display.EMPTY
        row = Worker.objects.filter(pk=job.worker_id).first()
        if row is None:
            return f"{job.worker_id} (no longer running)"
        try:
            url = reverse(f"{self.admin_site.name}:vellum_jobs_worker_change", args=[quote(row.pk)])
        except NoReverseMatch:
            return str(row)
        return format_html('<a href="{}">{}</a>', url, row)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Job | None:
        job = super().get_object(request, object_id, from_field)
        if job is not None:
            references.attach([job], self.admin_site, request)
        return job
