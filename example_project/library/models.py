"""A media library: folders on disk (``Library``) and the files found in them (``Item``)."""

from __future__ import annotations

from django.db import models


class Library(models.Model):
    name = models.CharField(max_length=100)
    path = models.CharField(max_length=500)
    scanned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "libraries"

    def __str__(self) -> str:
        return self.name


class Item(models.Model):
    """A file of a library, found by a scan and filled in by the per-item jobs."""

    class Kind(models.TextChoices):
        AUDIO = "audio"
        IMAGE = "image"
        TEXT = "text"
        OTHER = "other"

    library = models.ForeignKey(Library, on_delete=models.CASCADE, related_name="items")
    path = models.CharField(max_length=500, help_text="relative to the library's folder")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.OTHER)
    size = models.BigIntegerField(default=0)
    checksum = models.CharField(max_length=64, blank=True, default="", help_text="SHA-256 of the file")
    details = models.JSONField(
        default=dict, blank=True, help_text="what indexing learned: lines, words, pixels"
    )
    artwork = models.CharField(max_length=200, blank=True, default="")
    indexed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["library", "path"], name="library_item_path")]
        ordering = ["library", "path"]

    def __str__(self) -> str:
        return self.path
