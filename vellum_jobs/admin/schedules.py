"""The schedule list: each declared schedule, its last run's outcome and next run; run now, disable, enable.

Schedules are declared in code and settings; the ``Schedule`` rows only
record their runs and whether an operator disabled them. The list shows the
rows of declared schedules, creating the row of one no worker has seen yet,
and reads the cron, the job and the next run from the declaration. The last
runs' jobs of a page are read in one query.

The actions need the *change schedule* permission: "Run now" enqueues one
run outside the schedule's instants; "Disable" stops every worker from
enqueueing its instants until "Enable", which resumes from the next instant
without catching up (``maintenance.schedules``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from vellum_jobs.admin import display
from vellum_jobs.core import history
from vellum_jobs.core.models import Job, Schedule
from vellum_jobs.maintenance import schedules

if TYPE_CHECKING:
    ScheduleAdminBase = admin.ModelAdmin[Schedule]
else:
    ScheduleAdminBase = admin.ModelAdmin


class ScheduleChangeList(ChangeList):
    """The page's schedules, each with its last run's job (``last_job``, None if pruned), in one query."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        ids = [s.last_job_id for s in self.result_list if s.last_job_id is not None]
        jobs = Job.objects.only("id", "state", "error").in_bulk(ids) if ids else {}
        for schedule in self.result_list:
            schedule.last_job = jobs.get(schedule.last_job_id) if schedule.last_job_id is not None else None


def _who(request: HttpRequest) -> str:
    return f"admin: {request.user}"


def _names(queryset: QuerySet[Schedule]) -> list[str]:
    return list(queryset.order_by("name").values_list("name", flat=True))


@admin.action(permissions=["operate"], description="Run selected schedules now")
def run_now(model_admin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
    enqueued = []
    for name in _names(queryset):
        definition = schedules.find(name)
        if definition is not None:
            job = schedules.run_now(queryset.db, definition)
            enqueued.append(f"{name} (#{job.pk})")
    model_admin.message_user(
        request,
        f"Enqueued {len(enqueued)} run{'s' if len(enqueued) != 1 else ''} now: {', '.join(enqueued) or '-'}."
        " Their scheduled instants are unchanged.",
        messages.SUCCESS,
    )


@admin.action(permissions=["operate"], description="Disable selected schedules")
def disable(model_admin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
    names = [n for n in _names(queryset) if schedules.disable(queryset.db, n, by=_who(request))]
    model_admin.message_user(
        request,
        f"Disabled {len(names)}: {', '.join(names) or '-'}. No worker enqueues their instants until enabled.",
        messages.SUCCESS,
    )


@admin.action(permissions=["operate"], description="Enable selected schedules")
def enable(model_admin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
    names = []
    for name in _names(queryset):
        definition = schedules.find(name)
        if definition is not None and schedules.enable(queryset.db, definition):
            names.append(name)
    model_admin.message_user(
        request,
        f"Enabled {len(names)}: {', '.join(names) or '-'}. Each runs from its next instant;"
        " the instants while it was disabled are skipped.",
        messages.SUCCESS,
    )


@admin.register(Schedule)
class ScheduleAdmin(ScheduleAdminBase):
    list_display = ("name", "cron", "missed", "status", "last_run", "last_outcome", "next_run")
    fields = (
        "name",
        "job",
        "cron",
        "time_zone",
        "missed",
        "status",
        "first_seen",
        "last_run",
        "last_outcome",
        "next_run",
    )
    readonly_fields = fields
    list_display_links = None
    actions = (run_now, disable, enable)

    class Media:
        css = {"all": ("vellum_jobs/admin.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Running, disabling and enabling schedules: Django's *change schedule* permission."""
        return super().has_change_permission(request)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ScheduleChangeList

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        declared = [d.name for d in schedules.definitions()]
        missing = set(declared) - set(
            Schedule.objects.filter(name__in=declared).values_list("name", flat=True)
        )
        if missing:
            now = timezone.now()
            rows = [Schedule(name=name, first_seen=now) for name in sorted(missing)]
            Schedule.objects.bulk_create(rows, ignore_conflicts=True)
        return super().changelist_view(request, extra_context)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        declared = [d.name for d in schedules.definitions()]
        return super().get_queryset(request).filter(name__in=declared)

    def _definition(self, schedule: Schedule) -> schedules.Definition:
        # Declarations are cheap to read, and reading them each time keeps
        # this admin, shared by every request, free of state.
        return {d.name: d for d in schedules.definitions()}[schedule.name]

    @admin.display(description="job")
    def job(self, schedule: Schedule) -> str:
        return self._definition(schedule).job

    @admin.display(description="cron")
    def cron(self, schedule: Schedule) -> SafeString:
        definition = self._definition(schedule)
        return format_html("<code>{}</code> <small>{}</small>", definition.cron, definition.timezone)

    @admin.display(description="time zone")
    def time_zone(self, schedule: Schedule) -> str:
        return self._definition(schedule).timezone

    @admin.display(description="missed runs")
    def missed(self, schedule: Schedule) -> str:
        return {"run_once": "run once", "skip": "skip"}[self._definition(schedule).missed]

    @admin.display(description="status")
    def status(self, schedule: Schedule) -> SafeString:
        if schedule.disabled_at is None:
            return display.badge("alive", "enabled")
        return format_html(
            "{} since {} by {}",
            display.badge("paused", "disabled"),
            display.when("since", schedule.disabled_at),
            schedule.disabled_by or "someone",
        )

    @admin.display(description="last run")
    def last_run(self, schedule: Schedule) -> SafeString | str:
        if schedule.last_run_at is None:
            return display.EMPTY
        when = display.moment(schedule.last_run_at)
        if schedule.last_job_id is None:
            return when
        try:
            url = reverse(f"{self.admin_site.name}:vellum_jobs_job_change", args=[schedule.last_job_id])
        except NoReverseMatch:
            return when
        return format_html('{} (<a href="{}">#{}</a>)', when, url, schedule.last_job_id)

    @admin.display(description="last outcome")
    def last_outcome(self, schedule: Schedule) -> SafeString | str:
        """The state of the last run's job, and the last line of its error if it failed."""
        if schedule.last_job_id is None:
            return display.EMPTY
        if hasattr(schedule, "last_job"):
            job = schedule.last_job
        else:  # the schedule's own page
            job = Job.objects.only("id", "state", "error").filter(pk=schedule.last_job_id).first()
        if job is None:
            return "deleted (pruned)"
        try:
            url = reverse(f"{self.admin_site.name}:vellum_jobs_job_change", args=[job.pk])
            badge = format_html('<a href="{}">{}</a>', url, display.badge(job.state, job.state))
        except NoReverseMatch:
            badge = display.badge(job.state, job.state)
        if job.state == Job.State.FAILED and job.error:
            return format_html('{} <span class="vellum-error">{}</span>', badge, history.summary(job.error))
        return badge

    @admin.display(description="next run")
    def next_run(self, schedule: Schedule) -> str:
        if schedule.disabled_at is not None:
            return "disabled"
        return display.moment(self._definition(schedule).next(timezone.now()))
