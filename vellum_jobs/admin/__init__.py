"""The Django admin for jobs, queues and workers, registered when the admin site autodiscovers apps.

``jobs`` holds the job list and page, ``queues`` the queue list, ``workers``
the worker list (with ``running_jobs``), ``schedules`` the schedule list,
``workflows`` the list of workflows and batches and each one's page (with
``workflow_page``, ``workflow_graph`` and ``workflow_actions``); the other
modules are the parts the job list and page are built from.
"""

from __future__ import annotations

from vellum_jobs.admin.jobs import JobAdmin
from vellum_jobs.admin.queues import QueueAdmin
from vellum_jobs.admin.schedules import ScheduleAdmin
from vellum_jobs.admin.workers import WorkerAdmin
from vellum_jobs.admin.workflows import WorkflowAdmin

__all__ = ["JobAdmin", "QueueAdmin", "ScheduleAdmin", "WorkerAdmin", "WorkflowAdmin"]
