"""Rate and concurrency limits on the services jobs call: ``LimitSlot``, one slot of a limit's key,
and ``LimitHold``, a key a handler said to leave alone for a while (``Throttled``).

A job's limits (``Job.limits``, from ``@job(rate=..., concurrency={...})``)
are checked when a worker's thread is about to start it, not when it is
claimed: a job claimed ahead counts only once it starts
(``vellum_jobs.store.limit_gate``). A key of a limit of N has at most N
slots, made as they are first needed. A rate slot records when it last let
a job start; it may let another start ``period`` (plus a small guard) later,
so no window of ``period`` ever sees more than N starts. A concurrency slot
records the job that holds it, and is free once that job no longer runs
under the same claim.
"""

from __future__ import annotations

from django.db import models

RATE = "rate"
CONCURRENCY = "concurrency"


class LimitSlot(models.Model):
    """One of the at most N slots of a rate or concurrency limit's key."""

    key = models.CharField(max_length=255)
    kind = models.CharField(max_length=16, choices=[(RATE, RATE), (CONCURRENCY, CONCURRENCY)])
    # A rate limit's period in seconds (two rates on one key are two sets of
    # slots); 0 for a concurrency limit.
    period = models.FloatField(default=0)
    slot = models.PositiveIntegerField()
    # When it last let a job start (by the database's clock as the worker reckons it).
    taken_at = models.DateTimeField(null=True, blank=True)
    # A rate slot: the time the job held back last was told to come back
    # (its ``run_after``), or its last start if later; the next job held back
    # is told this plus a period.
    next_at = models.DateTimeField(null=True, blank=True)
    # The job it let start, and that job's claim (its ``claims`` then): a
    # concurrency slot is held while that job runs under that claim.
    job_id = models.BigIntegerField(null=True, blank=True)
    claim = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            # Also the gate's probe for a key's highest slot.
            models.UniqueConstraint(fields=["key", "kind", "period", "slot"], name="vellum_limit_slot"),
        ]
        indexes = [
            # The gate's probes: a key's longest-rested slot, and the one whose next time comes first.
            models.Index(fields=["key", "kind", "period", "taken_at"], name="vellum_limit_rested"),
            models.Index(fields=["key", "kind", "period", "next_at"], name="vellum_limit_next"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.key} slot {self.slot}"


class LimitHold(models.Model):
    """A key no job starts under until ``until``: a handler raised ``Throttled`` for it."""

    key = models.CharField(primary_key=True, max_length=255)
    until = models.DateTimeField()
    reason = models.TextField(blank=True, default="")
    set_at = models.DateTimeField()
    job_id = models.BigIntegerField(null=True, blank=True, help_text="the job whose handler asked")

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return f"{self.key} held until {self.until:%Y-%m-%d %H:%M:%S}"
