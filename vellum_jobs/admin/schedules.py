"""The schedule list: every declared schedule, its cron, and its last and next run.

Schedules are declared in code and settings; the ``Schedule`` rows only
record their runs. The list shows the rows of declared schedules, creating
the row of one no worker has seen yet, and reads the cron, the job and the
next run from the declaration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from vellum_jobs.admin import display
from vellum_jobs.core.models import Schedule
from vellum_jobs.maintenance import schedules

if TYPE_CHECKING:
    ScheduleAdminBase = admin.ModelAdmin[Schedule]
else:
    ScheduleAdminBase = admin.ModelAdmin


@admin.register(Schedule)
class ScheduleAdmin(ScheduleAdminBase):
    list_display = ("name", "job", "cron", "time_zone", "missed", "last_run", "next_run")
    fields = ("name", "job", "cron", "time_zone", "missed", "first_seen", "last_run", "next_run")
    readonly_fields = fields
    list_display_links = None

    class Media:
        css = {"all": ("vellum_jobs/admin.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return False

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
        return format_html("<code>{}</code>", self._definition(schedule).cron)

    @admin.display(description="time zone")
    def time_zone(self, schedule: Schedule) -> str:
        return self._definition(schedule).timezone

    @admin.display(description="missed runs")
    def missed(self, schedule: Schedule) -> str:
        return {"run_once": "run once", "skip": "skip"}[self._definition(schedule).missed]

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

    @admin.display(description="next run")
    def next_run(self, schedule: Schedule) -> str:
        return display.moment(self._definition(schedule).next(timezone.now()))
