"""The app config: registers system checks and imports every app's ``jobs`` module."""

from __future__ import annotations

import django
from django.apps import AppConfig


class VellumJobsConfig(AppConfig):
    name = "vellum_jobs"
    label = "vellum_jobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from vellum_jobs import checks
        from vellum_jobs.enqueueing import job_function

        checks.register()
        job_function.autodiscover()
        if django.VERSION >= (6, 0):
            # Workers run Django tasks by module path, so they need the
            # resolver even if nothing in the process imported the backend.
            from vellum_jobs.backends import hooks

            hooks.install()
