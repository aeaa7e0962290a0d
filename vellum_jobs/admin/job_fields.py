"""The job list's columns and the job page's fields, each a method the ``JobAdmin`` names.

The list's columns keep to one line each: what can be long is wrapped in
``display.cut``, which the stylesheet cuts with an ellipsis.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.contrib.admin import AdminSite
from django.contrib.admin.utils import quote
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from vellum_jobs.admin import display, explanations, failures, references
from vellum_jobs.core import clock
from vellum_jobs.core.models import Job, Worker


class JobFields:
    admin_site: AdminSite

    @admin.display(description="name", ordering="name")
    def name_and_handler(self, job: Job) -> SafeString | str:
        if job.is_async:
            return format_html("{} {}", display.badge("async", "async"), display.cut(job.name))
        return display.cut(job.name)

    @admin.display(description="handler")
    def handler(self, job: Job) -> SafeString | str:
        if job.is_async:
            return format_html("{} async def, on the worker's event loop", display.badge("async", "async"))
        return "sync, on a worker thread"

    @admin.display(description="state, tries")
    def state_badge(self, job: Job) -> SafeString:
        return format_html(
            '{} <span class="vellum-quiet" title="attempt {} of {}">{}/{}</span>',
            display.badge(job.state, job.get_state_display()),
            job.attempts,
            job.max_attempts,
            job.attempts,
            job.max_attempts,
        )

    @admin.display(description="queue")
    def queue_and_priority(self, job: Job) -> SafeString:
        if not job.priority:
            return display.cut(job.queue)
        return format_html(
            '<span class="vellum-cut" title="queue {}, priority {}">{} ({})</span>',
            job.queue,
            job.priority,
            job.queue,
            job.priority,
        )

    @admin.display(description="progress, reason or error")
    def detail(self, job: Job) -> SafeString | str:
        """What matters of the job now: its progress, why it waits, or its error's last line."""
        if job.state == Job.State.RUNNING:
            bar = display.progress_bar(job.progress_done, job.progress_total, job.progress_message)
            if job.cancel_requested_at is not None:
                return format_html('<span class="vellum-cut">asked to stop; {}</span>', bar)
            return bar
        if job.state == Job.State.WAITING:
            return explanations.short(job)
        line = failures.line_of(job)
        if job.state == Job.State.QUEUED:
            first = explanations.reasons_of(job)[0]
            if line and first.code in ("backoff", "delayed", "ready"):
                return display.cut(line, "vellum-error-line")
            if first.code == "delayed":
                return display.cut("not due yet", "vellum-quiet")
            return explanations.short(job)
        return display.cut(line, "vellum-error-line")

    @admin.display(description="why it waits")
    def reasons(self, job: Job) -> SafeString:
        return explanations.full(job)

    @admin.display(description="concurrency key")
    def concurrency(self, job: Job) -> str:
        if not job.concurrency_key:
            return display.EMPTY
        return f"{job.concurrency_key} (at most {job.concurrency_limit} at once)"

    @admin.display(description="attempts")
    def attempts_of_max(self, job: Job) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="when")
    def when(self, job: Job) -> SafeString:
        if job.state == Job.State.QUEUED:
            wait = (job.run_after - timezone.now()).total_seconds()
            later = f"in {display.duration(timedelta(seconds=round(wait)))}" if wait >= 1 else ""
            return display.when("due", job.run_after, later)
        if job.state == Job.State.RUNNING:
            return display.when("started", job.started_at)
        return display.when("finished", job.finished_at)

    @admin.display(description="took")
    def duration_text(self, job: Job) -> SafeString | str:
        if job.state == Job.State.RUNNING and job.started_at:
            so_far = display.duration(timezone.now() - job.started_at)
            return format_html('<span title="running for {} so far">{}</span>', so_far, so_far)
        return display.duration(job.duration)

    @admin.display(description="last progress")
    def last_progress(self, job: Job) -> SafeString:
        return display.progress_bar(job.progress_done, job.progress_total, job.progress_message)

    @admin.display(description="about")
    def reference(self, job: Job) -> SafeString | str:
        found = references.of(job)
        if found is None:
            return display.EMPTY
        if found.url is None:
            return display.cut(found.label)
        return format_html(
            '<a class="vellum-cut" href="{}" title="{}">{}</a>', found.url, found.label, found.label
        )

    # The job page's times, to the second, with how long ago (or ahead) each is.

    @admin.display(description="created")
    def created(self, job: Job) -> SafeString:
        return display.moment_and_age(job.created_at, clock.of(job._state.db or "default"))

    @admin.display(description="due (run after)")
    def due(self, job: Job) -> SafeString:
        return display.moment_and_age(job.run_after, clock.of(job._state.db or "default"))

    @admin.display(description="started")
    def started(self, job: Job) -> SafeString:
        return display.moment_and_age(job.started_at, clock.of(job._state.db or "default"))

    @admin.display(description="finished")
    def finished(self, job: Job) -> SafeString:
        return display.moment_and_age(job.finished_at, clock.of(job._state.db or "default"))

    @admin.display(description="cancellation requested")
    def cancel_requested(self, job: Job) -> SafeString:
        return display.moment_and_age(job.cancel_requested_at, clock.of(job._state.db or "default"))

    @admin.display(description="lease expires")
    def lease_expires(self, job: Job) -> SafeString:
        return display.moment_and_age(job.lease_expires_at, clock.of(job._state.db or "default"))

    @admin.display(description="args")
    def args_json(self, job: Job) -> SafeString:
        return display.pretty_json(job.args)

    @admin.display(description="kwargs")
    def kwargs_json(self, job: Job) -> SafeString:
        return display.pretty_json(job.kwargs)

    @admin.display(description="attempts")
    def attempt_table(self, job: Job) -> SafeString:
        return display.attempt_table(job.attempt_errors)

    @admin.display(description="worker")
    def worker(self, job: Job) -> SafeString | str:
        if job.worker_id is None:
            return display.EMPTY
        row = Worker.objects.filter(pk=job.worker_id).first()
        if row is None:
            return f"{job.worker_id} (no longer running)"
        try:
            url = reverse(f"{self.admin_site.name}:vellum_jobs_worker_change", args=[quote(row.pk)])
        except NoReverseMatch:
            return str(row)
        return format_html('<a href="{}">{}</a>', url, row)
