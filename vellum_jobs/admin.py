"""The Django admin for jobs and workers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin

from vellum_jobs.models import Job, Worker

if TYPE_CHECKING:
    JobAdminBase = admin.ModelAdmin[Job]
    WorkerAdminBase = admin.ModelAdmin[Worker]
else:
    JobAdminBase = WorkerAdminBase = admin.ModelAdmin


@admin.register(Job)
class JobAdmin(JobAdminBase):
    list_display = (
        "id",
        "name",
        "state",
        "queue",
        "priority",
        "attempts",
        "max_attempts",
        "run_after",
        "finished_at",
    )
    list_filter = ("state", "queue")
    search_fields = ("=id", "name")

    def has_add_permission(self, request: object) -> bool:
        return False


@admin.register(Worker)
class WorkerAdmin(WorkerAdminBase):
    list_display = ("host", "pid", "threads", "started_at", "last_heartbeat")

    def has_add_permission(self, request: object) -> bool:
        return False
