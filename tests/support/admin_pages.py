"""The admin's pages through Django's test client: their addresses, rows, actions, and staff users."""

from __future__ import annotations

import re
import uuid

from django.contrib.auth.models import Permission, User
from django.urls import reverse

from vellum_jobs.core.models import Job

JOBS = reverse("admin:vellum_jobs_job_changelist")
WORKERS = reverse("admin:vellum_jobs_worker_changelist")


def job_page(job: Job) -> str:
    return reverse("admin:vellum_jobs_job_change", args=[job.pk])


def make(state: str = Job.State.QUEUED, **fields) -> Job:
    fields.setdefault("name", "test.add")
    return Job.objects.create(state=state, **fields)


def rows(html: str) -> dict[int, str]:
    """The list's table rows by job id."""
    found = {}
    for row in re.findall(r"<tr>(.*?)</tr>", html, re.S):
        match = re.search(r'<th class="field-id"><a href="/admin/vellum_jobs/job/(\d+)/change/', row)
        if match:
            found[int(match[1])] = row
    return found


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def post_action(client, action: str, jobs: list[Job], **extra):
    data = {"action": action, "_selected_action": [j.pk for j in jobs], "index": 0, **extra}
    return client.post(JOBS, data, follow=True)


def staff_user(*permissions: str):
    """An active staff user with these permissions: ``"view_job"`` or, for other apps,
    ``"library.view_library"``."""
    user = User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", is_staff=True)
    for permission in permissions:
        app_label, _, codename = permission.rpartition(".")
        user.user_permissions.add(
            Permission.objects.get(codename=codename, content_type__app_label=app_label or "vellum_jobs")
        )
    return user
