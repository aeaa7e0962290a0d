"""The example's admin: libraries and items, each with the jobs that are about it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.db import models
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from example_project.library.models import Item, Library
from vellum_jobs.core.models import Job

if TYPE_CHECKING:
    LibraryAdminBase = admin.ModelAdmin[Library]
    ItemAdminBase = admin.ModelAdmin[Item]
else:
    LibraryAdminBase = ItemAdminBase = admin.ModelAdmin


def recent_jobs(obj: models.Model) -> SafeString:
    """Links to the latest jobs that reference ``obj``, newest first."""
    jobs = Job.objects.for_object(obj)[:10]
    if not jobs:
        return format_html("{}", "-")
    return format_html_join(
        format_html("<br>"),
        '<a href="{}">{} #{}</a> {}',
        ((reverse("admin:vellum_jobs_job_change", args=[j.pk]), j.name, j.pk, j.state) for j in jobs),
    )


@admin.register(Library)
class LibraryAdmin(LibraryAdminBase):
    list_display = ("name", "path", "scanned_at", "item_count")
    readonly_fields = ("scanned_at", "jobs")

    def get_queryset(self, request: HttpRequest) -> models.QuerySet[Library]:
        return super().get_queryset(request).annotate(item_total=models.Count("items"))

    @admin.display(description="items")
    def item_count(self, library: Library) -> int:
        return int(getattr(library, "item_total", 0))

    @admin.display(description="jobs")
    def jobs(self, library: Library) -> SafeString:
        return recent_jobs(library)


@admin.register(Item)
class ItemAdmin(ItemAdminBase):
    list_display = ("path", "library", "kind", "size", "short_checksum", "artwork", "indexed_at")
    list_filter = ("library", "kind")
    search_fields = ("path",)
    readonly_fields = ("checksum", "details", "artwork", "indexed_at", "jobs")

    @admin.display(description="SHA-256")
    def short_checksum(self, item: Item) -> str:
        return item.checksum[:12]

    @admin.display(description="jobs")
    def jobs(self, item: Item) -> SafeString:
        return recent_jobs(item)
