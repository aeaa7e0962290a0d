"""A media library: a folder on disk whose files a job scans."""

from __future__ import annotations

from django.db import models


class Library(models.Model):
    name = models.CharField(max_length=100)
    path = models.CharField(max_length=500)

    class Meta:
        verbose_name_plural = "libraries"

    def __str__(self) -> str:
        return self.name
