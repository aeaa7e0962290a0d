"""The job list and the read-only job page.

The list is built to stay fast on millions of rows: it is ordered by id and
filtered through indexes (``vellum_job_state``, ``_name``, ``_queue``), it
counts a few pages ahead instead of the whole table (``pagination``), the
counts above it read at most ten thousand index entries per state
(``observe.figures``), filter choices come from the registry (``filters``), and a
number typed in the search box that can be an id looks up that id alone.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.utils import flatten_fieldsets, quote
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import smart_split, unescape_string_literal

from vellum_jobs.admin import (
    actions,
    dashboard,
    display,
    explanations,
    failures,
    progress,
    references,
    summary,
)
from vellum_jobs.admin.changelist import JobChangeList
from vellum_jobs.admin.filters import ErrorFilter, HandlerFilter, NameFilter, QueueFilter, RetryingFilter
from vellum_jobs.admin.pagination import CappedPaginator, page_asked
from vellum_jobs.core import clock
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
    # Eight columns that fit a laptop beside the nav sidebar: attempts ride with
    # the state, the priority with the queue, and one column says what matters
    # of each job now (a running job's progress, why a queued one waits, how a
    # failed one failed). Each cell keeps to one line (jobs.css).
    list_display = (
        "id",
        "name_and_handler",
        "state_badge",
        "queue_and_priority",
        "when",
        "duration_text",
        "detail",
        "reference",
    )
    list_display_links = ("id", "name_and_handler")
    list_filter = ("state", RetryingFilter, NameFilter, QueueFilter, HandlerFilter, ErrorFilter)
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
    # delete_selected replaces Django's own of that name, which would delete running jobs too.
    actions = (
        actions.delete_selected,
        actions.retry,
        actions.cancel,
        actions.run_now,
        actions.pause_queues,
        actions.resume_queues,
    )
    # The job page shows its state, outcome and buttons first (summary.html); these follow.
    fieldsets = (
        (
            None,
            {"fields": ("id", "name", "handler", "queue", "priority", "attempts_of_max", "reference")},
        ),
        ("Arguments", {"fields": ("args_json", "kwargs_json")}),
        ("Attempts that did not succeed", {"fields": ("attempt_table",)}),
        (
            "Times",
            {"fields": ("created", "due", "started", "finished", "duration_text", "cancel_requested")},
        ),
        ("Progress", {"fields": ("last_progress", "progress_message")}),
        ("Concurrency, worker and lease", {"fields": ("concurrency", "worker", "lease_expires")}),
    )
    readonly_fields = flatten_fieldsets(fieldsets)

    class Media:
        css = {"all": ("vellum_jobs/admin.css", "vellum_jobs/jobs.css")}
        js = ("vellum_jobs/jobs.js",)

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

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        # Deleting a running job's row does not stop its handler: it would run
        # on for minutes with nothing left to show for it. Cancel it first.
        if obj is not None and obj.state == Job.State.RUNNING:
            return False
        return super().has_delete_permission(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        # A job claimed since the confirmation page is left alone.
        queryset.exclude(state=Job.State.RUNNING).delete()

    def delete_model(self, request: HttpRequest, obj: Job) -> None:
        Job.objects.using(obj._state.db).filter(pk=obj.pk).exclude(state=Job.State.RUNNING).delete()

    # -- pages of their own: the dashboard, failures by error, a job's progress and buttons

    def get_urls(self) -> list[URLPattern]:
        site = self.admin_site
        return [
            path("dashboard/", site.admin_view(self.dashboard_view), name="vellum_jobs_job_dashboard"),
            path("failures/", site.admin_view(self.failures_view), name="vellum_jobs_job_failures"),
            path(
                "<path:object_id>/progress/",
                site.admin_view(self.progress_view),
                name="vellum_jobs_job_progress",
            ),
            path("<path:object_id>/act/", site.admin_view(self.act_view), name="vellum_jobs_job_act"),
            *super().get_urls(),
        ]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        context = {**self.admin_site.each_context(request), "opts": self.opts}
        return dashboard.view(request, context, self.get_queryset(request).db)

    def failures_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        kind = request.GET.get("of", "failed")
        if kind not in failures.KINDS:
            kind = "failed"
        rows = self.get_queryset(request)
        params = {key: request.GET[key] for key in ("queue",) if request.GET.get(key)}
        if params:
            rows = rows.filter(**params)
        list_url = reverse(f"{self.admin_site.name}:vellum_jobs_job_changelist")
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Failures by job and error",
            "grouping": failures.group(rows, kind, list_url, params, limit=failures.GROUP_LIMIT),
            "kinds": failures.KINDS,
            "queue": params.get("queue", ""),
            "list_url": list_url,
        }
        return TemplateResponse(request, "admin/vellum_jobs/job/failures.html", context)

    def progress_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        try:
            job_id = int(object_id)
        except ValueError:
            raise Http404("no such job") from None
        return progress.response(job_id, self.get_queryset(request))

    def act_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The job page's buttons: one of the list's actions on this job, then back to its page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        job = self.get_object(request, object_id)
        if job is None:
            raise Http404("no such job")
        name = request.POST.get("action", "")
        if name not in actions.ON_ONE:
            return HttpResponseBadRequest("unknown action")
        actions.on_one(self, request, job, name)
        return HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:vellum_jobs_job_change", args=[quote(job.pk)])
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        job = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if job is not None and request.method == "GET":
            site = self.admin_site.name
            context.update(
                summary=summary.context(job, self.has_change_permission(request)),
                act_url=reverse(f"{site}:vellum_jobs_job_act", args=[quote(job.pk)]),
                progress_url=reverse(f"{site}:vellum_jobs_job_progress", args=[quote(job.pk)]),
            )
        return super().change_view(request, object_id, form_url, context)

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
        state = request.GET.get("state__exact", "")
        kind = "failed" if state == Job.State.FAILED else "retrying" if request.GET.get("retrying") else ""
        grouped = ""
        if kind:
            query = {"of": kind, **{key: request.GET[key] for key in ("queue",) if request.GET.get(key)}}
            grouped = f"{reverse(f'{self.admin_site.name}:vellum_jobs_job_failures')}?{urlencode(query)}"
        context = {
            "state_counts": figures.by_state(self.get_queryset(request)),
            "state_selected": state,
            "retrying_selected": bool(request.GET.get("retrying")),
            "failures_url": grouped,
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
            return format_html("{} {}", display.badge("async", "async"), display.cut(job.name))
        return display.cut(job.name)

    @admin.display(description="handler")
    def handler(self, job: Job) -> SafeString | str:
        if job.is_async:
            return format_html("{} async def, on the worker's event loop", display.badge("async", "async"))
        return "sync, on a worker thread"

    @admin.display(description="state, tries")
    def state_badge(self, job: Job) -> SafeString:
        return format_html(
            '{} <span class="vellum-quiet" title="attempt {} of {}">{}/{}</span>',
            display.badge(job.state, job.get_state_display()),
            job.attempts,
            job.max_attempts,
            job.attempts,
            job.max_attempts,
        )

    @admin.display(description="queue")
    def queue_and_priority(self, job: Job) -> SafeString:
        if not job.priority:
            return display.cut(job.queue)
        return format_html(
            '<span class="vellum-cut" title="queue {}, priority {}">{} ({})</span>',
            job.queue,
            job.priority,
            job.queue,
            job.priority,
        )

    @admin.display(description="progress, reason or error")
    def detail(self, job: Job) -> SafeString | str:
        """What matters of the job now: its progress, why it waits, or its error's last line."""
        if job.state == Job.State.RUNNING:
            bar = display.progress_bar(job.progress_done, job.progress_total, job.progress_message)
            if job.cancel_requested_at is not None:
                return format_html('<span class="vellum-cut">asked to stop; {}</span>', bar)
            return bar
        line = failures.line_of(job)
        if job.state == Job.State.QUEUED:
            first = explanations.reasons_of(job)[0]
            if line and first.code in ("backoff", "delayed", "ready"):
                return display.cut(line, "vellum-error-line")
            if first.code == "delayed":
                return display.cut("not due yet", "vellum-quiet")
            return explanations.short(job)
        return display.cut(line, "vellum-error-line")

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

    @admin.display(description="when")
    def when(self, job: Job) -> SafeString:
        if job.state == Job.State.QUEUED:
            wait = (job.run_after - timezone.now()).total_seconds()
            later = f"in {display.duration(timedelta(seconds=round(wait)))}" if wait >= 1 else ""
            return display.when("due", job.run_after, later)
        if job.state == Job.State.RUNNING:
            return display.when("started", job.started_at)
        return display.when("finished", job.finished_at)

    @admin.display(description="took")
    def duration_text(self, job: Job) -> SafeString | str:
        if job.state == Job.State.RUNNING and job.started_at:
            so_far = display.duration(timezone.now() - job.started_at)
            return format_html('<span title="running for {} so far">{}</span>', so_far, so_far)
        return display.duration(job.duration)

    @admin.display(description="last progress")
    def last_progress(self, job: Job) -> SafeString:
        return display.progress_bar(job.progress_done, job.progress_total, job.progress_message)

    @admin.display(description="about")
    def reference(self, job: Job) -> SafeString | str:
        found = references.of(job)
        if found is None:
            return display.EMPTY
        if found.url is None:
            return display.cut(found.label)
        return format_html(
            '<a class="vellum-cut" href="{}" title="{}">{}</a>', found.url, found.label, found.label
        )

    # The job page's times, to the second, with how long ago (or ahead) each is.

    @admin.display(description="created")
    def created(self, job: Job) -> SafeString:
        return display.moment_and_age(job.created_at, clock.of(job._state.db or "default"))

    @admin.display(description="due (run after)")
    def due(self, job: Job) -> SafeString:
        return display.moment_and_age(job.run_after, clock.of(job._state.db or "default"))

    @admin.display(description="started")
    def started(self, job: Job) -> SafeString:
        return display.moment_and_age(job.started_at, clock.of(job._state.db or "default"))

    @admin.display(description="finished")
    def finished(self, job: Job) -> SafeString:
        return display.moment_and_age(job.finished_at, clock.of(job._state.db or "default"))

    @admin.display(description="cancellation requested")
    def cancel_requested(self, job: Job) -> SafeString:
        return display.moment_and_age(job.cancel_requested_at, clock.of(job._state.db or "default"))

    @admin.display(description="lease expires")
    def lease_expires(self, job: Job) -> SafeString:
        return display.moment_and_age(job.lease_expires_at, clock.of(job._state.db or "default"))

    @admin.display(description="args")
    def args_json(self, job: Job) -> SafeString:
        return display.pretty_json(job.args)

    @admin.display(description="kwargs")
    def kwargs_json(self, job: Job) -> SafeString:
        return display.pretty_json(job.kwargs)

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
