"""Settings for django-tasks-db: Django's Tasks on its ORM backend, on the databases vellum-jobs uses."""

from __future__ import annotations

import os

from benchmarks.database import django_databases

DATABASES = django_databases(os.environ.get("VELLUM_BENCH_DB", "sqlite"), os.environ["VELLUM_BENCH_NAME"])
SECRET_KEY = "benchmarks-only"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django_tasks_db"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
