"""The Django admin for jobs and workers, registered when the admin site autodiscovers apps.

``jobs`` holds the job list and page, ``workers`` the worker list,
``schedules`` the schedule list; the other modules are the parts the job
list is built from.
"""

from __future__ import annotations

from vellum_jobs.admin.jobs import JobAdmin
from vellum_jobs.admin.schedules import ScheduleAdmin
from vellum_jobs.admin.workers import WorkerAdmin

__all__ = ["JobAdmin", "ScheduleAdmin", "WorkerAdmin"]
