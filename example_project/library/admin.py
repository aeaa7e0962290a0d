from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin

from example_project.library.models import Library

if TYPE_CHECKING:
    LibraryAdminBase = admin.ModelAdmin[Library]
else:
    LibraryAdminBase = admin.ModelAdmin


@admin.register(Library)
class LibraryAdmin(LibraryAdminBase):
    list_display = ("name", "path")
