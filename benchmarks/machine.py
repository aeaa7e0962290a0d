"""What a benchmark ran on: machine, interpreter, libraries, and each database's version and durability."""

from __future__ import annotations

import os
import platform
import sqlite3
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks import database

PACKAGES = (
    "Django",
    "vellum-jobs",
    "huey",
    "django-tasks-db",
    "django-q2",
    "procrastinate",
    "oban",
    "pgqueuer",
    "psycopg",
    "mysqlclient",
)


def describe(vendors: list[str]) -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gb": _memory_gb(),
        "load_average": os.getloadavg(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "packages": {name: _version(name) for name in PACKAGES},
        "databases": {vendor: _database(vendor) for vendor in vendors},
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _database(vendor: str) -> dict[str, Any]:
    """The server's version and the settings that decide what a commit costs; ``error`` if unreachable."""
    try:
        if vendor == "sqlite":
            return {"version": sqlite3.sqlite_version, "journal_mode": "wal", "synchronous": "NORMAL"}
        if vendor == "postgresql":
            return _settings(
                vendor, "postgres", ["server_version", "fsync", "synchronous_commit", "shared_buffers"]
            )
        return _settings(vendor, "", ["version", "innodb_flush_log_at_trx_commit", "sync_binlog", "log_bin"])
    except Exception as error:  # noqa: BLE001 - any driver error means "cannot run here", with its text
        return {"error": f"{type(error).__name__}: {error}".strip()}


def _settings(vendor: str, dbname: str, names: list[str]) -> dict[str, Any]:
    connection = database.connect(vendor, dbname)
    try:
        cursor = connection.cursor()
        found = {}
        for name in names:
            cursor.execute(f"SHOW {name}" if vendor == "postgresql" else f"SELECT @@{name}")
            found[name] = str(cursor.fetchone()[0])
        return found
    finally:
        connection.close()
