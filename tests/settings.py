"""Test settings: the database comes from VELLUM_TEST_DB (sqlite, postgresql or mariadb).

Worker subprocesses started by the tests import these settings too, with
VELLUM_TEST_DB_NAME naming the test database the test run created.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import django

BASE_DIR = Path(__file__).resolve().parent.parent
VENDOR = os.environ.get("VELLUM_TEST_DB", "sqlite")
# Separate names per Python and Django so tox environments can share a server.
# VELLUM_TEST_RUN keeps two checkouts' runs apart on one server.
SUFFIX = f"py{sys.version_info[0]}{sys.version_info[1]}_dj{django.VERSION[0]}{django.VERSION[1]}"
if os.environ.get("VELLUM_TEST_RUN"):
    SUFFIX += f"_{os.environ['VELLUM_TEST_RUN']}"
RUN_NAME = os.environ.get("VELLUM_TEST_DB_NAME")

if VENDOR == "sqlite":
    sqlite_path = str(BASE_DIR / ".test-dbs" / f"vellum_{SUFFIX}.sqlite3")
    Path(sqlite_path).parent.mkdir(exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": RUN_NAME or sqlite_path,
            # A file, not the shared in-memory database: worker threads and
            # processes must see one database.
            "TEST": {"NAME": sqlite_path},
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
            "NAME": RUN_NAME or "test",
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            # A dead link surfaces as an error in bounded time rather than a
            # hang, on both ends: the README's options ("Databases"), with
            # times shortened for the tests' 3 s LEASE. test_partition runs a
            # worker through a proxy.
            "OPTIONS": {
                "connect_timeout": 2,
                "keepalives": 1,
                "keepalives_idle": 1,
                "keepalives_interval": 1,
                "keepalives_count": 2,
                "tcp_user_timeout": 2000,
                "options": "-c tcp_keepalives_idle=1 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=2",
            },
            "TEST": {"NAME": f"test_vellum_{SUFFIX}"},
        }
    }
    postgresql_options: dict[str, object] = DATABASES["default"]["OPTIONS"]  # type: ignore[assignment]
    # Names a runjobs subprocess's connections in pg_stat_activity (test_connections_held).
    if os.environ.get("VELLUM_TEST_APPLICATION_NAME"):
        postgresql_options["application_name"] = os.environ["VELLUM_TEST_APPLICATION_NAME"]
    # More psycopg options, as JSON (test_pgbouncer: server-side binding).
    postgresql_options.update(json.loads(os.environ.get("VELLUM_TEST_PG_OPTIONS", "{}")))
    # A second alias on the same database, straight to the server when the
    # default one goes through PgBouncer (test_pgbouncer's LISTEN_DATABASE).
    if os.environ.get("VELLUM_TEST_DIRECT_PORT"):
        DATABASES["direct"] = {**DATABASES["default"], "PORT": os.environ["VELLUM_TEST_DIRECT_PORT"]}
elif VENDOR == "mariadb":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": RUN_NAME or "test",
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {"NAME": f"test_vellum_{SUFFIX}", "CHARSET": "utf8mb4"},
        }
    }
else:
    raise RuntimeError(f"VELLUM_TEST_DB must be sqlite, postgresql or mariadb, not {VENDOR!r}")

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # Lets the live server of the browser test serve the admin's CSS.
    "django.contrib.staticfiles",
    "vellum_jobs",
    "tests.testapp",
    "example_project.library",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Many tests make a user; the default hasher spends a fraction of a second on each, on purpose.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STATIC_URL = "/static/"

# A worker in the test process itself holds its jobs for a minute: on a loaded
# machine a heartbeat can be seconds late, and a test that is not about leases
# must not see one lapse (its jobs would come back with a backoff a burst
# worker does not wait for). runjobs subprocesses get 3 s
# (tests/support/processes.py), so that a killed worker's jobs are recovered
# within a test; an in-process test about leases asks for ``short_lease``.
VELLUM_JOBS = {
    "LEASE": os.environ.get("VELLUM_TEST_LEASE", "60s"),
    "HEARTBEAT": os.environ.get("VELLUM_TEST_HEARTBEAT", "0.5s"),
    "POLL_INTERVAL": os.environ.get("VELLUM_TEST_POLL", "0.5s"),
    "BACKOFF_BASE": os.environ.get("VELLUM_TEST_BACKOFF", "30s"),
    # Schedules for runjobs subprocesses, as JSON (test_schedules).
    "SCHEDULES": json.loads(os.environ.get("VELLUM_TEST_SCHEDULES", "{}")),
}
# How long a worker's own database call may go unanswered before it exits (status 5). A
# loaded machine can hold a statement up for seconds, and an in-process worker's exit would
# end the test run: five minutes (past REAL_LEASE in tests/support/processes.py too), unless a test
# (test_silent_link, test_partition) says otherwise.
VELLUM_JOBS["MAX_DATABASE_WAIT"] = os.environ.get("VELLUM_TEST_MAX_DATABASE_WAIT", "5m")
# The alias runjobs subprocesses LISTEN on, as JSON: "direct", or false to poll (test_pgbouncer).
if os.environ.get("VELLUM_TEST_LISTEN_DATABASE"):
    VELLUM_JOBS["LISTEN_DATABASE"] = json.loads(os.environ["VELLUM_TEST_LISTEN_DATABASE"])

# Django's Tasks framework on vellum-jobs (only Django 6 reads TASKS). Few
# attempts and no backoff, so retries happen within a test.
TASKS = {
    "default": {
        "BACKEND": "vellum_jobs.backends.VellumTaskBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"MAX_ATTEMPTS": 3, "BACKOFF_BASE": 0},
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {
        "vellum_jobs": {"handlers": ["stderr"], "level": os.environ.get("VELLUM_LOG_LEVEL", "WARNING")}
    },
}

# Persistent connections for runjobs subprocesses that test them
# (VELLUM_TEST_CONN_MAX_AGE: seconds, or "none" for no limit).
if os.environ.get("VELLUM_TEST_CONN_MAX_AGE"):
    max_age = os.environ["VELLUM_TEST_CONN_MAX_AGE"]
    persistent: dict[str, object] = {
        "CONN_MAX_AGE": None if max_age == "none" else int(max_age),
        "CONN_HEALTH_CHECKS": True,
    }
    DATABASES["default"].update(persistent)  # type: ignore[arg-type]
