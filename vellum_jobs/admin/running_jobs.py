"""The worker list's running jobs: read for a whole page of workers in one query, shown as a short list.

Each worker gets its running jobs (``of``), the few columns the list shows;
the cell shows how many (linked to the job list, filtered to the worker)
and the first ``SHOWN``, each linked, with how long it has run and its
progress bar.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from vellum_jobs.admin import display
from vellum_jobs.core.models import Job, Worker

# Running jobs listed per worker; the count links to all of them.
SHOWN = 5
# The columns they are read with.
COLUMNS = (
    "id",
    "name",
    "worker_id",
    "is_async",
    "started_at",
    "progress_done",
    "progress_total",
    "progress_message",
)
_ATTRIBUTE = "_vellum_running_jobs"


class WorkerChangeList(ChangeList):
    """The worker list, each worker of the page with its running jobs."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        attach(self.result_list, self.queryset.db)


def attach(workers: Sequence[Worker], alias: str | None) -> None:
    """Read the running jobs of ``workers`` in one query, for ``of``."""
    by_worker: dict[Any, list[Job]] = defaultdict(list)
    if workers:
        jobs = Job.objects.using(alias).running().filter(worker_id__in=[w.pk for w in workers])
        for job in jobs.only(*COLUMNS).order_by("id"):
            by_worker[job.worker_id].append(job)
    for worker in workers:
        setattr(worker, _ATTRIBUTE, by_worker.get(worker.pk, []))


def of(worker: Worker) -> list[Job]:
    """The running jobs ``attach`` read for ``worker``, in id order."""
    jobs: list[Job] = getattr(worker, _ATTRIBUTE, [])
    return jobs


def cell(worker: Worker, site: str) -> SafeString | str:
    """How many jobs ``worker`` runs, linked to the job list, and the first few with their progress."""
    running = of(worker)
    count = int(getattr(worker, "running_count", len(running)))
    try:
        url = reverse(f"{site}:vellum_jobs_job_changelist")
    except NoReverseMatch:
        return str(count)
    query = urlencode({"state__exact": Job.State.RUNNING, "worker_id": str(worker.pk)})
    total = format_html('<a href="{}?{}">{}</a>', url, query, count)
    shown = running[:SHOWN]
    if not shown:
        return total
    items = format_html_join("", "<li>{}</li>", ((_line(job, site),) for job in shown))
    more = format_html("<li>and {} more</li>", count - len(shown)) if count > len(shown) else ""
    return format_html('{} <ul class="vellum-worker-jobs">{}{}</ul>', total, items, more)


def _line(job: Job, site: str) -> SafeString:
    try:
        url = reverse(f"{site}:vellum_jobs_job_change", args=[job.pk])
        link = format_html('<a href="{}">#{} {}</a>', url, job.pk, job.name)
    except NoReverseMatch:
        link = format_html("#{} {}", job.pk, job.name)
    ran = display.EMPTY
    if job.started_at is not None:
        seconds = max(0, int((timezone.now() - job.started_at).total_seconds()))
        ran = f"{seconds} s" if seconds < 60 else display.duration(timedelta(seconds=seconds))
    progress = (
        display.progress_bar(job.progress_done, job.progress_total, job.progress_message)
        if job.progress_done is not None
        else ""
    )
    return format_html('{} <span class="vellum-worker-ran">{}</span> {}', link, ran, progress)
