"""The raw-SQL limit: what a bare Python loop of claim + mark-done statements reaches on the same database.

``python -m benchmarks.peers.limit_peer --db sqlite``. No framework, no
leases, no payload decoding: the ceiling a database-backed queue can approach
from Python. Four threads, each with its own connection, claim jobs (one at a
time, or ten at a time) and mark them done in a second statement.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from benchmarks import common, database

SYSTEM = "raw-SQL limit"
NAME = "limit_bench"
THREADS = 4

SCHEMA = {
    "sqlite": [
        "CREATE TABLE limit_job (id INTEGER PRIMARY KEY, state TEXT NOT NULL, payload TEXT NOT NULL)",
        "CREATE INDEX limit_job_queued ON limit_job (id) WHERE state = 'queued'",
    ],
    "postgresql": [
        "CREATE TABLE limit_job (id bigserial PRIMARY KEY, state text NOT NULL, payload text NOT NULL)",
        "CREATE INDEX limit_job_queued ON limit_job (id) WHERE state = 'queued'",
    ],
    "mariadb": [
        "CREATE TABLE limit_job (id bigint AUTO_INCREMENT PRIMARY KEY, state varchar(10) NOT NULL, "
        "payload text NOT NULL, INDEX limit_job_queued (state, id)) ENGINE=InnoDB",
    ],
}

# One statement claims on SQLite and PostgreSQL; MariaDB has no UPDATE ... RETURNING,
# so it claims with SELECT ... FOR UPDATE SKIP LOCKED and an UPDATE in one transaction.
CLAIM = {
    "sqlite": "UPDATE limit_job SET state = 'running' WHERE id IN "
    "(SELECT id FROM limit_job WHERE state = 'queued' ORDER BY id LIMIT {n}) RETURNING id, payload",
    "postgresql": "UPDATE limit_job SET state = 'running' WHERE id IN "
    "(SELECT id FROM limit_job WHERE state = 'queued' ORDER BY id LIMIT {n} FOR UPDATE SKIP LOCKED) "
    "RETURNING id, payload",
    "mariadb": "SELECT id, payload FROM limit_job WHERE state = 'queued' "
    "ORDER BY id LIMIT {n} FOR UPDATE SKIP LOCKED",
}


def mark(vendor: str, sql: str) -> str:
    """The driver's placeholder: sqlite3 takes ``?``, psycopg and MySQLdb ``%s``."""
    return sql.replace("%s", "?") if vendor == "sqlite" else sql


def create(vendor: str) -> None:
    database.recreate(vendor, NAME)
    connection = database.connect(vendor, NAME)
    cursor = connection.cursor()
    for statement in SCHEMA[vendor]:
        cursor.execute(statement)
    connection.close()


def claim(vendor: str, connection: Any, size: int) -> list[tuple[Any, ...]]:
    cursor = connection.cursor()
    if vendor != "mariadb":
        cursor.execute(CLAIM[vendor].format(n=size))
        return list(cursor.fetchall())
    connection.begin()
    cursor.execute(CLAIM[vendor].format(n=size))
    rows = list(cursor.fetchall())
    if rows:
        cursor.execute(f"UPDATE limit_job SET state = 'running' WHERE id IN ({_ids(rows)})")
    connection.commit()
    return rows


def _ids(rows: list[tuple[Any, ...]]) -> str:
    return ",".join(str(int(row[0])) for row in rows)


def worker(vendor: str, size: int) -> None:
    connection = database.connect(vendor, NAME)
    cursor = connection.cursor()
    while rows := claim(vendor, connection, size):
        cursor.execute(f"UPDATE limit_job SET state = 'done' WHERE id IN ({_ids(rows)})")
    connection.close()


def insert_many(vendor: str, count: int) -> None:
    connection = database.connect(vendor, NAME)
    cursor = connection.cursor()
    cursor.execute("BEGIN")
    cursor.executemany(
        mark(vendor, "INSERT INTO limit_job (state, payload) VALUES ('queued', %s)"),
        [(f"[{i}]",) for i in range(count)],
    )
    cursor.execute("COMMIT")
    connection.close()


def drain(vendor: str, count: int, size: int) -> dict[str, Any]:
    create(vendor)
    insert_many(vendor, count)
    threads = [threading.Thread(target=worker, args=(vendor, size)) for _ in range(THREADS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    connection = database.connect(vendor, NAME)
    cursor = connection.cursor()
    cursor.execute("SELECT count(*) FROM limit_job WHERE state = 'done'")
    done = cursor.fetchone()[0]
    connection.close()
    if done != count:
        raise RuntimeError(f"{done} of {count} rows done")
    return common.rate(count, elapsed)


def enqueue_one(vendor: str, count: int) -> dict[str, Any]:
    create(vendor)
    connection = database.connect(vendor, NAME)
    cursor = connection.cursor()
    sql = mark(vendor, "INSERT INTO limit_job (state, payload) VALUES ('queued', %s)")
    started = time.perf_counter()
    for i in range(count):
        cursor.execute(sql, (f"[{i}]",))
    elapsed = time.perf_counter() - started
    connection.close()
    return common.rate(count, elapsed)


def enqueue_many(vendor: str, count: int) -> dict[str, Any]:
    create(vendor)
    started = time.perf_counter()
    insert_many(vendor, count)
    return common.rate(count, time.perf_counter() - started)


FIGURES: dict[str, common.Figure] = {
    "drain": lambda a: drain(a.db, a.jobs, 1),
    "drain_batch10": lambda a: drain(a.db, a.jobs, 10),
    "enqueue_one": lambda a: enqueue_one(a.db, max(a.jobs // 10, 100)),
    "enqueue_many": lambda a: enqueue_many(a.db, a.jobs * 2),
}


# A bare loop has no wakeup: its pickup latency is whatever interval it polls at.
LACKS = {"latency": "a bare loop has no wakeup"}


def main() -> None:
    args = common.parser(__doc__, FIGURES).parse_args()
    common.run_figures(SYSTEM, args, FIGURES, LACKS)


if __name__ == "__main__":
    main()
