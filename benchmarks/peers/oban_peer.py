"""Oban for Python on PostgreSQL: ``python -m benchmarks.peers.oban_peer --db postgresql``.

The worker is Oban's own CLI, which its docs recommend for production:
``python -m oban start --queues default:N`` with its defaults otherwise (a
pool of 1-10 connections, a structured log line per job at INFO, the stager
and pruner running). The job is a no-op ``async def process``. Oban has no
burst mode, so the run waits until every job is ``completed`` and then stops
the worker with SIGTERM. Throughput and latency come from Oban's own columns
(``inserted_at``, ``attempted_at``, ``completed_at``: the database's clock).
Enqueueing goes through a client-mode ``Oban`` on its pool: ``enqueue()`` per
job, each its own transaction, and ``enqueue_many()`` for the bulk figure
(one transaction; the open-source Oban runs one ``INSERT`` per job in it).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from oban import Oban
from oban.schema import install_sql

from benchmarks import common, database
from benchmarks.peers.oban_app import NAME, QUEUE, noop

SYSTEM = "Oban"
ROOT = Path(__file__).resolve().parents[2]
# The limit every queue in Oban's docs is given ("default = 10"); the other peers run 4 workers.
DOCS_LIMIT = 10
LIMIT = 4


def dsn() -> str:
    pg = database.pg_params(NAME)
    return f"postgresql://{pg['user']}@{pg['host']}:{pg['port']}/{pg['dbname']}"


def sql(query: str) -> list[tuple[Any, ...]]:
    with database.connect("postgresql", NAME) as connection:
        return list(connection.execute(query).fetchall())


def fresh() -> None:
    """A new database with Oban's schema (its ``oban install`` SQL)."""
    database.recreate("postgresql", NAME)
    with database.connect("postgresql", NAME) as connection:
        connection.execute(install_sql())


@asynccontextmanager
async def client() -> AsyncIterator[Any]:
    """A client-mode Oban (no queues: it enqueues only) on its own pool."""
    pool = await Oban.create_pool(dsn())
    try:
        yield Oban(pool=pool)
    finally:
        await pool.close()


def log_path() -> Path:
    return database.SCRATCH / f"{database.scratch(NAME)}_worker.log"


def worker(limit: int) -> subprocess.Popen[bytes]:
    """``oban start`` on the scratch database, its one queue at ``limit``; its log to a file."""
    command = [
        sys.executable, "-m", "oban", "start", "--dsn", dsn(), "--queues", f"{QUEUE}:{limit}",
        "--cron-modules", "benchmarks.peers.oban_app",  # otherwise it greps the checkout for cron workers
    ]  # fmt: skip
    with log_path().open("wb") as log:
        return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    if process.returncode not in (0, -signal.SIGTERM):
        tail = log_path().read_text(errors="replace").strip().splitlines()[-1:]
        raise RuntimeError(f"the worker exited {process.returncode}: {''.join(tail)}")


def completed(count: int) -> bool:
    return int(sql("SELECT count(*) FROM oban_jobs WHERE state = 'completed'")[0][0]) >= count


def drain(count: int, limit: int) -> dict[str, Any]:
    fresh()
    asyncio.run(_enqueue_many(count))
    process = worker(limit)
    try:
        common.until(lambda: completed(count) or process.poll() is not None, 600, "every job completed", 0.2)
    finally:
        stop(process)
    done, span = sql(
        "SELECT count(*), extract(epoch FROM max(completed_at) - min(attempted_at)) "
        "FROM oban_jobs WHERE state = 'completed'"
    )[0]
    if done != count:
        raise RuntimeError(f"{done} of {count} jobs completed")
    return {**common.rate(count, float(span)), "limit": limit}


def latency(samples: int) -> dict[str, Any]:
    fresh()
    process = worker(DOCS_LIMIT)
    try:
        common.until(_producing, 30, "the worker's queue started", 0.05)
        asyncio.run(_samples(samples, process))
    finally:
        stop(process)
    delays = sql("SELECT extract(epoch FROM attempted_at - inserted_at) * 1000 FROM oban_jobs")
    return common.latency([float(row[0]) for row in delays])


def _producing() -> bool:
    return bool(sql("SELECT 1 FROM oban_producers"))


async def _samples(samples: int, process: subprocess.Popen[bytes]) -> None:
    async with client() as oban:
        for i in range(samples):
            job = await noop.enqueue({"i": i})
            deadline = time.monotonic() + 30
            while (await oban.get_job(job.id)).state != "completed":
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"job {job.id} not done within 30 s (worker exit code {process.poll()})"
                    )
                await asyncio.sleep(0.005)
            common.gap()


def enqueue_one(count: int) -> dict[str, Any]:
    fresh()
    return asyncio.run(_enqueue_one(count))


async def _enqueue_one(count: int) -> dict[str, Any]:
    async with client():
        started = time.perf_counter()
        for i in range(count):
            await noop.enqueue({"i": i})
        return common.rate(count, time.perf_counter() - started)


def enqueue_many(count: int) -> dict[str, Any]:
    fresh()
    return asyncio.run(_enqueue_many(count))


async def _enqueue_many(count: int) -> dict[str, Any]:
    async with client() as oban:
        started = time.perf_counter()
        await oban.enqueue_many([noop.new({"i": i}) for i in range(count)])
        return common.rate(count, time.perf_counter() - started)


FIGURES: dict[str, common.Figure] = {
    "drain": lambda a: drain(a.jobs, DOCS_LIMIT),
    "drain_limit4": lambda a: drain(a.jobs, LIMIT),
    "latency": lambda a: latency(a.samples),
    "enqueue_one": lambda a: enqueue_one(max(a.jobs // 10, 100)),
    "enqueue_many": lambda a: enqueue_many(a.jobs * 2),
}


def main() -> None:
    args = common.parser(__doc__, FIGURES).parse_args()
    if args.db != "postgresql":
        common.unavailable(SYSTEM, args, "Oban for Python runs on PostgreSQL only")
        return
    common.run_figures(SYSTEM, args, FIGURES)


if __name__ == "__main__":
    main()
