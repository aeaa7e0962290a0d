from __future__ import annotations

from django.apps import AppConfig


class LibraryConfig(AppConfig):
    name = "example_project.library"
    label = "library"
    default_auto_field = "django.db.models.BigAutoField"
