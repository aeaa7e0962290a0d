"""Django settings for benchmark runs: the database comes from VELLUM_BENCH_DB and VELLUM_BENCH_NAME.

SQLite uses the settings the README recommends (WAL, synchronous=NORMAL,
IMMEDIATE transactions); PostgreSQL and MariaDB their server defaults
(fsync on, synchronous_commit on).
"""

from __future__ import annotations

import os
from pathlib import Path

VENDOR = os.environ.get("VELLUM_BENCH_DB", "sqlite")
NAME = os.environ.get("VELLUM_BENCH_NAME", "vellum_bench")

if VENDOR == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": NAME if NAME.endswith(".sqlite3") else str(Path("/tmp") / f"{NAME}.sqlite3"),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
elif VENDOR == "postgresql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": NAME,
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": NAME,
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
        }
    }

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
