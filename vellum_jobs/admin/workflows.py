"""The list of workflows and batches, and each one's page (``workflow_page``) with its buttons
(``workflow_actions``).

A workflow is a group of jobs, so its pages follow the job permissions:
*view job* (or *change job*) to see them, *change job* for cancel and retry;
the Workflow model's own permissions grant the same. Nobody adds, edits or
deletes a workflow here: its row is written at enqueue, and retention
prunes its jobs together once it has finished.

The list's progress and states come from one grouped query for the page's
workflows (``observe.workflows.progress``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import django
from django.contrib import admin
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
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
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from vellum_jobs.admin import display, workflow_actions, workflow_page
from vellum_jobs.core.workflow_models import Workflow
from vellum_jobs.observe import workflows

if TYPE_CHECKING:
    WorkflowAdminBase = admin.ModelAdmin[Workflow]
else:
    WorkflowAdminBase = admin.ModelAdmin

# Where ``WorkflowChangeList`` leaves each listed workflow's progress.
_PROGRESS = "_vellum_progress"


def _may(request: HttpRequest, *actions: str) -> bool:
    """Whether the user has one of the job permissions named by ``actions`` ("view", "change")."""
    user = request.user
    return any(user.has_perm(f"vellum_jobs.{action}_job") for action in actions)


def progress_of(workflow: Workflow) -> workflows.Progress:
    found: workflows.Progress | None = getattr(workflow, _PROGRESS, None)
    if found is None:
        found = workflows.progress([workflow.pk], workflow._state.db)[workflow.pk]
        setattr(workflow, _PROGRESS, found)
    return found


class WorkflowChangeList(ChangeList):
    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        found = workflows.progress([w.pk for w in self.result_list], self.queryset.db)
        for workflow in self.result_list:
            setattr(workflow, _PROGRESS, found[workflow.pk])


@admin.register(Workflow)
class WorkflowAdmin(WorkflowAdminBase):
    list_display = ("id", "kind", "title", "created", "progress", "states")
    list_display_links = ("id", "title")
    list_filter = ("kind",)
    search_fields = ("=id", "name")
    search_help_text = "A number finds the workflow with that id; words match names."
    ordering = ("-id",)
    sortable_by = ("id", "created_at")
    # Each row's progress walks its jobs' index entries: a page of big batches is a lot of them.
    list_per_page = 50
    show_facets = admin.ShowFacets.NEVER

    class Media:
        css = {"all": ("vellum_jobs/admin.css", "vellum_jobs/jobs.css")}

    # -- permissions: the jobs', or the model's own

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        return super().has_view_permission(request, obj) or _may(request, "view", "change")

    def has_change_permission(self, request: HttpRequest, obj: Workflow | None = None) -> bool:
        # No form saves a workflow: changing one is what its buttons do to its jobs.
        return super().has_change_permission(request, obj) or _may(request, "change")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[WorkflowChangeList]:
        return WorkflowChangeList

    # -- columns

    @admin.display(description="name", ordering="name")
    def title(self, workflow: Workflow) -> str:
        return workflow.name or display.EMPTY

    @admin.display(description="progress")
    def progress(self, workflow: Workflow) -> SafeString:
        found = progress_of(workflow)
        return format_html(
            '<span class="vellum-progress" title="{}"><progress max="{}" value="{}"></progress> {}</span>',
            found.text,
            max(found.total, 1),
            found.finished,
            found.text,
        )

    @admin.display(description="jobs by state")
    def states(self, workflow: Workflow) -> SafeString | str:
        present = progress_of(workflow).present
        if not present:
            return "no jobs"
        return format_html(
            '<span class="vellum-states">{}</span>',
            format_html_join(" ", "{}", ((display.badge(state, f"{n:,} {state}"),) for state, n in present)),
        )

    @admin.display(description="created", ordering="created_at")
    def created(self, workflow: Workflow) -> SafeString:
        shown = display.when("created", workflow.created_at)
        if workflow.cancelled_at is None:
            return shown
        return format_html("{} {}", shown, display.badge("cancelled", "cancel asked"))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return super().changelist_view(request, {"title": "Workflows and batches", **(extra_context or {})})

    # -- the page and its buttons

    def get_urls(self) -> list[URLPattern]:
        site = self.admin_site
        return [
            path("<path:object_id>/act/", site.admin_view(self.act_view), name="vellum_jobs_workflow_act"),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The workflow's page: progress, states, graph and buttons; read-only (its buttons post to act)."""
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        workflow = self.get_object(request, unquote(object_id))
        if workflow is None:
            raise Http404("no such workflow")
        if not self.has_view_or_change_permission(request, workflow):
            raise PermissionDenied
        site = self.admin_site.name
        can_act = self.has_change_permission(request, workflow)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": str(workflow),
            "original": workflow,
            "list_url": reverse(f"{site}:vellum_jobs_workflow_changelist"),
            "breadcrumbs_as_list": django.VERSION >= (6, 0),
            **workflow_page.context(workflow, site, can_act),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/vellum_jobs/workflow/page.html", context)

    def act_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The page's buttons: cancel or retry, then back to the page with a message saying how many."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        workflow = self.get_object(request, unquote(object_id))
        if workflow is None:
            raise Http404("no such workflow")
        if not self.has_change_permission(request, workflow):
            raise PermissionDenied
        action = workflow_actions.ACTIONS.get(request.POST.get("action", ""))
        if action is None:
            return HttpResponseBadRequest("unknown action")
        for level, text in action(workflow):
            self.message_user(request, text, level)
        return HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:vellum_jobs_workflow_change", args=[quote(workflow.pk)])
        )
