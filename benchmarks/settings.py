"""Django settings for benchmark runs: the database comes from VELLUM_BENCH_DB and VELLUM_BENCH_NAME.

SQLite uses the settings the README recommends (WAL, synchronous=NORMAL,
IMMEDIATE transactions); PostgreSQL and MariaDB their server defaults
(fsync on, synchronous_commit on).
"""

from __future__ import annotations

import os

from benchmarks.database import django_databases

VENDOR = os.environ.get("VELLUM_BENCH_DB", "sqlite")
NAME = os.environ.get("VELLUM_BENCH_NAME", "vellum_bench")
DATABASES = django_databases(VENDOR, NAME)
# Kept connections, as the production checklist advises (``rate_drain`` sets it: a job with
# limits queries the database before it starts); Django's default, 0, elsewhere.
DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ.get("VELLUM_BENCH_CONN_MAX_AGE", "0"))

SECRET_KEY = "benchmarks-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django.contrib.contenttypes", "vellum_jobs", "benchmarks.app"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
VELLUM_JOBS: dict[str, object] = {}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"vellum_jobs": {"handlers": ["stderr"], "level": "WARNING"}},
}

# The drain figures count the statements a worker sends (``benchmarks.statements``).
if os.environ.get("VELLUM_BENCH_STATEMENTS"):
    from benchmarks import statements

    statements.install(os.environ["VELLUM_BENCH_STATEMENTS"])
