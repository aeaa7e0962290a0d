"""PgQueuer on PostgreSQL: ``python -m benchmarks.peers.pgqueuer_peer --db postgresql``.

The worker runs in a subprocess (``--work``) through ``pgqueuer.run()``, the
call ``pgq run`` makes with the same options (its CLI fails at start on the
typer the pinned versions bring; see benchmarks/README.md), on uvloop as the
CLI is, with ``mode=drain`` (it exits once the queue is empty) and one asyncpg
connection, as its performance guide advises for a ``QueueManager``. The
schema is its ``install`` plus its ``autovac`` settings, as its checklist
asks. The job is a no-op ``async def`` entrypoint. Its two ways to bound
concurrency, each with the default batch of 10 jobs a dequeue:

- ``drain``: a cap on the worker, ``max_concurrent_tasks=20``, the smallest
  PgQueuer accepts with that batch (at least twice the batch);
- ``drain_limit4``: the entrypoint's ``concurrency_limit=4``, as the other
  peers run 4 at once. The limit is enforced in SQL across all workers by
  counting picked rows, and a finished job stays picked until its status is
  written, in a batch of 10 or after 0.1 s: with 4 at once that is every
  0.1 s, about 40 jobs a second whatever the machine.

Throughput and latency come from PgQueuer's own log table (a row per job at
``queued``, ``picked`` and ``successful``, stamped by the database).
Enqueueing is ``Queries.enqueue`` on an asyncpg connection, as in its quick
start: one call per job, and one call with lists for the bulk figure (one
``INSERT ... SELECT FROM unnest(...)``).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg
import pgqueuer
import uvloop
from pgqueuer import PgQueuer
from pgqueuer.core import logconfig
from pgqueuer.db import AsyncpgDriver
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

from benchmarks import common, database

SYSTEM = "PgQueuer"
NAME = "pgqueuer_bench"
ENTRYPOINT = "noop"
ROOT = Path(__file__).resolve().parents[2]
# The default batch with the smallest worker cap it allows, or with an entrypoint limit of 4.
CAPPED = {"batch_size": 10, "max_concurrent_tasks": 20}
LIMITED = {"batch_size": 10, "concurrency_limit": 4}


def sql(query: str) -> list[tuple[Any, ...]]:
    with database.connect("postgresql", NAME) as connection:
        return list(connection.execute(query).fetchall())


async def connect() -> Any:
    pg = database.pg_params(NAME)
    return await asyncpg.connect(host=pg["host"], port=pg["port"], user=pg["user"], database=pg["dbname"])


@asynccontextmanager
async def queries() -> AsyncIterator[Any]:
    connection = await connect()
    try:
        yield Queries(AsyncpgDriver(connection))
    finally:
        await connection.close()


def fresh() -> None:
    """A new database with PgQueuer's schema and its recommended autovacuum settings."""
    database.recreate("postgresql", NAME)
    asyncio.run(_install())


async def _install() -> None:
    async with queries() as q:
        await q.install()
        await q.optimize_autovacuum()


@asynccontextmanager
async def consumer(concurrency_limit: int) -> AsyncIterator[Any]:
    """The worker's factory: a PgQueuer on one asyncpg connection with the no-op entrypoint."""
    connection = await connect()
    pgq = PgQueuer.from_asyncpg_connection(connection)

    @pgq.entrypoint(ENTRYPOINT, concurrency_limit=concurrency_limit)
    async def noop(job: Any) -> None:
        return None

    try:
        yield pgq
    finally:
        await connection.close()


def work(args: argparse.Namespace) -> None:
    """What ``pgq run`` does with these options (its CLI, on typer 0.29, fails on its log-level option)."""
    logconfig.setup_fancy_logger(logconfig.LogLevel.INFO)
    runner = pgqueuer.run(
        partial(consumer, args.concurrency_limit),
        mode=QueueExecutionMode[args.work],
        batch_size=args.batch_size,
        max_concurrent_tasks=args.max_concurrent_tasks,
    )
    uvloop.run(runner)


def worker(
    mode: str, batch_size: int, max_concurrent_tasks: int = 0, concurrency_limit: int = 0
) -> subprocess.Popen[bytes]:
    module = __spec__.name if __spec__ else __name__
    options = {
        "--batch-size": batch_size,
        "--max-concurrent-tasks": max_concurrent_tasks,
        "--concurrency-limit": concurrency_limit,
    }
    command = [sys.executable, "-m", module, "--work", mode, *(f"{k}={v}" for k, v in options.items())]
    return subprocess.Popen(command, cwd=ROOT)


def drain(count: int, **settings: int) -> dict[str, Any]:
    fresh()
    asyncio.run(_enqueue_many(count))
    if worker("drain", **settings).wait(600) != 0:
        raise RuntimeError("the worker failed")
    done, span = sql(
        "SELECT count(*) FILTER (WHERE status = 'successful'), extract(epoch FROM "
        "max(created) FILTER (WHERE status = 'successful') - min(created) FILTER (WHERE status = 'picked')) "
        "FROM pgqueuer_log"
    )[0]
    if done != count:
        raise RuntimeError(f"{done} of {count} jobs successful")
    return common.rate(count, float(span))


def latency(samples: int) -> dict[str, Any]:
    fresh()
    process = worker("continuous", **CAPPED)
    try:
        time.sleep(3)  # start-up
        asyncio.run(_samples(samples, process))
    finally:
        process.terminate()
        process.wait(30)
    delays = sql(
        "SELECT extract(epoch FROM p.created - q.created) * 1000 FROM pgqueuer_log q "
        "JOIN pgqueuer_log p ON p.job_id = q.job_id AND p.status = 'picked' WHERE q.status = 'queued'"
    )
    return common.latency([float(row[0]) for row in delays])


async def _samples(samples: int, process: subprocess.Popen[bytes]) -> None:
    async with queries() as q:
        for i in range(samples):
            (job,) = await q.enqueue(ENTRYPOINT, str(i).encode())
            deadline = time.monotonic() + 30
            while not await q.driver.fetch(
                "SELECT 1 FROM pgqueuer_log WHERE job_id = $1 AND status = 'successful'", job
            ):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"job {job} not done within 30 s (worker exit code {process.poll()})")
                await asyncio.sleep(0.005)
            common.gap()


def enqueue_one(count: int) -> dict[str, Any]:
    fresh()
    return asyncio.run(_enqueue_one(count))


async def _enqueue_one(count: int) -> dict[str, Any]:
    async with queries() as q:
        started = time.perf_counter()
        for i in range(count):
            await q.enqueue(ENTRYPOINT, str(i).encode())
        return common.rate(count, time.perf_counter() - started)


def enqueue_many(count: int) -> dict[str, Any]:
    fresh()
    return asyncio.run(_enqueue_many(count))


async def _enqueue_many(count: int) -> dict[str, Any]:
    async with queries() as q:
        started = time.perf_counter()
        await q.enqueue([ENTRYPOINT] * count, [str(i).encode() for i in range(count)], [0] * count)
        return common.rate(count, time.perf_counter() - started)


FIGURES: dict[str, common.Figure] = {
    "drain": lambda a: drain(a.jobs, **CAPPED),
    # At about 40 jobs/s a tenth of the jobs still takes seconds.
    "drain_limit4": lambda a: drain(max(a.jobs // 10, 50), **LIMITED),
    "latency": lambda a: latency(a.samples),
    "enqueue_one": lambda a: enqueue_one(max(a.jobs // 10, 100)),
    "enqueue_many": lambda a: enqueue_many(a.jobs * 2),
}


def main() -> None:
    parser = common.parser(__doc__, FIGURES)
    parser.add_argument("--work", choices=[mode.name for mode in QueueExecutionMode], help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--max-concurrent-tasks", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency-limit", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.work:
        work(args)
        return
    if args.db != "postgresql":
        common.unavailable(SYSTEM, args, "PgQueuer runs on PostgreSQL only")
        return
    common.run_figures(SYSTEM, args, FIGURES)


if __name__ == "__main__":
    main()
