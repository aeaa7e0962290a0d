"""The job list and the read-only job page.

The list is built to stay fast on millions of rows: it is ordered by id and
filtered through indexes (``vellum_job_state``, ``_name``, ``_queue``), it
counts a few pages ahead instead of the whole table (``pagination``), the
counts above it read at most ten thousand index entries per state
(``observe.figures``), filter choices come from the registry (``filters``), and a
number typed in the search box that can be an id looks up that id alone.

Pages of its own: the dashboard, failures grouped by job and error
(``failures``), the limits in use (``limits``), a job's progress as JSON
for its page to poll (``progress``), and the address its buttons post to
(``summary``, ``actions.on_one``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import django
from django.contrib import admin
from django.contrib.admin.utils import flatten_fieldsets, quote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.formats import number_format

from vellum_jobs.admin import (
    actions,
    dashboard,
    failures,
    limits,
    progress,
    references,
    search,
    summary,
)
from vellum_jobs.admin.changelist import JobChangeList
from vellum_jobs.admin.filters import (
    ErrorFilter,
    HandlerFilter,
    NameFilter,
    QueueFilter,
    RetryingFilter,
    WorkflowFilter,
)
from vellum_jobs.admin.job_fields import JobFields
from vellum_jobs.admin.pagination import CappedPaginator, page_asked
from vellum_jobs.core.models import Job
from vellum_jobs.observe import figures

if TYPE_CHECKING:
    JobAdminBase = admin.ModelAdmin[Job]
else:
    JobAdminBase = admin.ModelAdmin


@admin.register(Job)
class JobAdmin(JobFields, JobAdminBase):
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
    list_filter = (
        "state",
        RetryingFilter,
        NameFilter,
        QueueFilter,
        HandlerFilter,
        ErrorFilter,
        WorkflowFilter,
    )
    # get_search_results decides how each is searched; these show the box.
    search_fields = ("=id", "name", "error")
    search_help_text = "A number finds the job with that id; other words match names and error text."
    # Jobs (the newest ids) a words search reads unless asked for all: no index serves it.
    search_window = 100_000
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

    # -- pages of their own: the dashboard, failures by error, limits, a job's progress and buttons

    def get_urls(self) -> list[URLPattern]:
        site = self.admin_site
        return [
            path("dashboard/", site.admin_view(self.dashboard_view), name="vellum_jobs_job_dashboard"),
            path("failures/", site.admin_view(self.failures_view), name="vellum_jobs_job_failures"),
            path("limits/", site.admin_view(self.limits_view), name="vellum_jobs_job_limits"),
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

    def limits_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        context = {**self.admin_site.each_context(request), "opts": self.opts}
        return limits.view(request, context, self.get_queryset(request).db, self.admin_site.name)

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
            "breadcrumbs_as_list": django.VERSION >= (6, 0),
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

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Job | None = None,
    ) -> HttpResponse:
        if obj is not None:
            site = self.admin_site.name
            context.update(
                summary=summary.context(obj, self.has_change_permission(request), site),
                act_url=reverse(f"{site}:vellum_jobs_job_act", args=[quote(obj.pk)]),
                progress_url=reverse(f"{site}:vellum_jobs_job_progress", args=[quote(obj.pk)]),
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

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
        job_id = search.as_id(search_term)
        if job_id is not None:
            # One primary-key lookup; OR-ing in the text columns would scan the table.
            return queryset.filter(pk=job_id), False
        # Anything else, a number no id can be included, is looked for in the text.
        scope = search.scope_for(request, search_term, self.search_window, queryset.db)
        if scope is not None:
            queryset = queryset.filter(id__gt=scope.above)
        return search.matching(queryset, search_term), False

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
            scope = search.kept(request)
            if isinstance(cl, JobChangeList) and scope is not None:
                response.context_data["search_scope"] = number_format(scope.window, force_grouping=True)
                response.context_data["search_all_url"] = cl.get_query_string({search.SEARCH_ALL: "1"})
        return response

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Job | None:
        job = super().get_object(request, object_id, from_field)
        if job is not None:
            references.attach([job], self.admin_site, request)
        return job
