"""Scratch databases for benchmark runs: created with the drivers directly (before Django starts).

Every benchmark database name contains ``bench``, so a run never touches a
test suite's databases; ``VELLUM_BENCH_SUFFIX`` is appended to each name, so
two checkouts can run benchmarks at once without dropping each other's
databases. Server addresses come from the usual PG*/MYSQL_* environment
variables.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

SCRATCH = Path(os.environ.get("VELLUM_BENCH_DIR", "/tmp"))

# The durability settings every SQLite system in a run gets (the ones the README
# recommends for vellum-jobs): WAL, fsync at checkpoints only.
SQLITE_PRAGMAS = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"


SUFFIX = os.environ.get("VELLUM_BENCH_SUFFIX", "")


def scratch(name: str) -> str:
    """The real name of scratch database ``name`` (idempotent: a real name stays as it is)."""
    return name if not SUFFIX or name.endswith(SUFFIX) else f"{name}{SUFFIX}"


def sqlite_path(name: str) -> Path:
    return Path(name) if name.endswith(".sqlite3") else SCRATCH / f"{scratch(name)}.sqlite3"


def pg_params(dbname: str) -> dict[str, Any]:
    return {
        "host": os.environ.get("PGHOST", "127.0.0.1"),
        "port": os.environ.get("PGPORT", "5432"),
        "user": os.environ.get("PGUSER", "postgres"),
        "dbname": dbname if dbname == "postgres" else scratch(dbname),
    }


def mysql_params(dbname: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {
        "host": os.environ.get("MYSQL_HOST", "127.0.0.1"),
        "port": int(os.environ.get("MYSQL_PORT", "3306")),
        "user": os.environ.get("MYSQL_USER", "root"),
        "password": os.environ.get("MYSQL_PASSWORD", ""),
    }
    if dbname:
        params["database"] = scratch(dbname)
    return params


def recreate(vendor: str, name: str) -> str:
    """Drop and create the scratch database ``name``; returns what to put in VELLUM_BENCH_NAME."""
    if vendor == "sqlite":
        path = sqlite_path(name)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return str(path)
    name = scratch(name)
    if vendor == "postgresql":
        import psycopg

        with psycopg.connect(**pg_params("postgres"), autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            connection.execute(f'CREATE DATABASE "{name}"')
        return name
    import MySQLdb

    connection = MySQLdb.connect(**mysql_params())
    try:
        cursor = connection.cursor()
        cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        connection.close()
    return name


def connect(vendor: str, name: str) -> Any:
    """A DB-API connection in autocommit mode, for the systems that bypass Django."""
    if vendor == "sqlite":
        connection = sqlite3.connect(
            sqlite_path(name), timeout=20, isolation_level=None, check_same_thread=False
        )
        connection.executescript(SQLITE_PRAGMAS)
        return connection
    if vendor == "postgresql":
        import psycopg

        return psycopg.connect(**pg_params(name), autocommit=True)
    import MySQLdb

    connection = MySQLdb.connect(**mysql_params(name))
    connection.autocommit(True)
    return connection


def django_databases(vendor: str, name: str) -> dict[str, dict[str, Any]]:
    """Django's DATABASES for ``name``: SQLite as the README recommends, servers as configured."""
    if vendor == "sqlite":
        options: dict[str, Any] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": SQLITE_PRAGMAS,
        }
        return {
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(sqlite_path(name)),
                "OPTIONS": options,
            }
        }
    if vendor == "postgresql":
        pg = pg_params(name)
        return {
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": pg["dbname"],
                "USER": pg["user"],
                "HOST": pg["host"],
                "PORT": pg["port"],
            }
        }
    my = mysql_params()
    return {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": scratch(name),
            "USER": my["user"],
            "PASSWORD": my["password"],
            "HOST": my["host"],
            "PORT": str(my["port"]),
            "OPTIONS": {"charset": "utf8mb4"},
        }
    }
