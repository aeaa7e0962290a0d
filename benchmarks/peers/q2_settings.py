"""Settings for django-q2 with its ORM broker, on the databases vellum-jobs uses."""

from __future__ import annotations

import os

from benchmarks.database import django_databases

DATABASES = django_databases(os.environ.get("VELLUM_BENCH_DB", "sqlite"), os.environ["VELLUM_BENCH_NAME"])
SECRET_KEY = "benchmarks-only"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django_q"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Four worker processes and the ORM broker's defaults (it polls every 0.2 s);
# every success is kept (save_limit 0) so the benchmark can count and time them.
Q_CLUSTER = {
    "name": "bench",
    "orm": "default",
    "workers": 4,
    "save_limit": 0,
    "timeout": 60,
    "retry": 120,
    "log_level": "WARNING",
}
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
