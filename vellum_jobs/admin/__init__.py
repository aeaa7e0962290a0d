"""The Django admin for jobs, queues and workers, registered when the admin site autodiscovers apps.

``jobs`` holds the job list and page, ``queues`` the queue list, ``workers``
the worker list (with ``running_jobs``), ``schedules`` the schedule list;
the other modules are the parts the job list is built from.
"""

from __future__ import annotations

from vellum_jobs.admin.jobs import JobAdmin
from vellum_jobs.admin.queues import QueueAdmin
from vellum_jobs.admin.schedules import ScheduleAdmin
from vellum_jobs.admin.workers import WorkerAdmin

__all__ = ["JobAdmin", "QueueAdmin", "ScheduleAdmin", "WorkerAdmin"]
