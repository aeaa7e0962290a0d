"""Fresh scratch databases for benchmark runs, made with the drivers directly (before Django starts)."""

from __future__ import annotations

import os
from pathlib import Path


def recreate(vendor: str, name: str) -> str:
    """Drop and create the scratch database ``name``; returns what to put in VELLUM_BENCH_NAME."""
    if vendor == "sqlite":
        path = Path("/tmp") / f"{name}.sqlite3"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return str(path)
    if vendor == "postgresql":
        import psycopg

        with psycopg.connect(
            host=os.environ.get("PGHOST", "127.0.0.1"),
            port=os.environ.get("PGPORT", "5432"),
            user=os.environ.get("PGUSER", "postgres"),
            dbname="postgres",
            autocommit=True,
        ) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            connection.execute(f'CREATE DATABASE "{name}"')
        return name
    import MySQLdb

    connection = MySQLdb.connect(
        host=os.environ.get("MYSQL_HOST", "127.0.0.1"),
        port=int(os.environ.get("MYSQL_PORT", "3306")),
        user=os.environ.get("MYSQL_USER", "root"),
        password=os.environ.get("MYSQL_PASSWORD", ""),
    )
    try:
        cursor = connection.cursor()
        cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        connection.close()
    return name
