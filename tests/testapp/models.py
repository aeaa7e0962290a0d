"""Models the tests use: rows jobs reference, and a log of executions."""

from __future__ import annotations

import uuid

from django.db import models


class Library(models.Model):
    name = models.CharField(max_length=100)


class Document(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    title = models.CharField(max_length=100)


class Execution(models.Model):
    """One row per handler start, written in its own autocommit statement."""

    job_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    pid = models.PositiveIntegerField()
    finished = models.BooleanField(default=False)
    note = models.CharField(max_length=100, blank=True, default="")


class Span(models.Model):
    """When a keyed job's handler ran, on the host's monotonic clock (shared by its processes)."""

    key = models.CharField(max_length=100)
    job_id = models.BigIntegerField()
    pid = models.PositiveIntegerField()
    started = models.FloatField()
    ended = models.FloatField(null=True)
    # How long after its rate slot's stamp the handler's first line came, in seconds (where noted).
    late = models.FloatField(null=True)
