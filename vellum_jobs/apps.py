"""The app config: registers system checks and imports every app's ``jobs`` module."""

from __future__ import annotations

from django.apps import AppConfig


class VellumJobsConfig(AppConfig):
    name = "vellum_jobs"
    label = "vellum_jobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from vellum_jobs import checks, registry

        checks.register()
        registry.autodiscover()
