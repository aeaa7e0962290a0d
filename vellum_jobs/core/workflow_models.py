"""Workflows and batches: the ``Workflow`` row that groups their jobs, and ``Dependency``, one edge
from a job that waits to a job it waits for.

A job with upstream jobs is inserted ``waiting`` and is never claimed as such;
``vellum_jobs.store.release`` moves it to ``queued`` (or ``cancelled``) once its
edges say its upstream jobs have ended. Each edge carries its upstream job's
end state, written by whoever finished that job, so deciding whether a job
may run reads its own edges through an index and never counts a whole
batch, and no row is written by every finishing job of a batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models
from django.utils import timezone

from vellum_jobs.core import clock
from vellum_jobs.core.transitions import FINISHED_STATES, reopenable

if TYPE_CHECKING:
    from vellum_jobs.core.models import JobQuerySet


class Workflow(models.Model):
    """The jobs of one ``chain``/``group``/``workflow`` or one ``batch``, enqueued together."""

    class Kind(models.TextChoices):
        WORKFLOW = "workflow", "workflow"
        BATCH = "batch", "batch"

    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.WORKFLOW)
    name = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    cancelled_at = models.DateTimeField(null=True, blank=True, help_text="when cancel() was asked for")

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk}" + (f" {self.name}" if self.name else "")

    def steps(self) -> JobQuerySet:
        """Its jobs, callbacks included, in the order they were enqueued."""
        from vellum_jobs.core.models import Job  # it imports this module

        return Job.objects.using(self._state.db).filter(workflow_id=self.pk).order_by("pk")

    def progress(self) -> tuple[int, int]:
        """(ended, total): how many of its jobs have ended, of how many."""
        counts = self.steps().stats()
        total = sum(counts.values())
        return sum(counts[state] for state in FINISHED_STATES), total

    def cancel(self) -> int:
        """Cancel every job of it that has not ended (a running one is asked to stop); how many."""
        if self.cancelled_at is None:
            self.cancelled_at = clock.of(self._state.db or "default")
            type(self).objects.using(self._state.db).filter(pk=self.pk).update(cancelled_at=self.cancelled_at)
        return self.steps().cancel()

    def retry(self) -> int:
        """Queue its failed and cancelled jobs again; those their end had cancelled wait again.
        Returns how many were queued again."""
        return self.steps().exclude(reopenable()).retry()


class Dependency(models.Model):
    """``job`` waits for ``upstream``; ``upstream_state`` is the state ``upstream`` ended in ('' until then).

    Neither key is a database constraint: retention deletes jobs in bulk, and a
    deleted upstream job counts as cancelled (``vellum_jobs.store.release``).
    """

    job = models.ForeignKey(
        "vellum_jobs.Job",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="upstream_links",
    )
    upstream = models.ForeignKey(
        "vellum_jobs.Job",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="downstream_links",
    )
    position = models.PositiveIntegerField(default=0, help_text="the upstream result's place in the list")
    upstream_state = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "upstream"], name="vellum_dependency_edge")]
        indexes = [
            # Who waits for the jobs that just finished.
            models.Index(fields=["upstream"], name="vellum_dependency_upstream"),
            # Whether a job still waits for any upstream job: one index probe.
            models.Index(fields=["job", "upstream_state"], name="vellum_dependency_waits"),
        ]

    def __str__(self) -> str:
        return f"#{self.job_id} after #{self.upstream_id}"
