"""huey on its SQLite and PostgreSQL storages: ``python -m benchmarks.peers.huey_peer --db sqlite``.

The consumer runs in a subprocess (``consume``) with 4 worker threads and
huey's default polling (0.1 s, backing off to 10 s; PostgreSQL storage
blocks on LISTEN). It times the drain itself, from the first task starting
to the last finishing, through huey's signals. huey removes a task from the
queue before running it (at most once), and stores no result for ``None``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from huey import PostgresHuey, SqliteHuey
from huey.signals import SIGNAL_COMPLETE, SIGNAL_EXECUTING
from huey.storage import SqliteStorage

from benchmarks import common, database

SYSTEM = "huey"
NAME = "huey_bench"
ROOT = Path(__file__).resolve().parents[2]


class NormalSqliteStorage(SqliteStorage):  # type: ignore[misc]
    """huey's SQLite storage with the run's SQLite durability (WAL, synchronous=NORMAL)."""

    def _create_connection(self) -> Any:
        connection = super()._create_connection()
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection


class NormalSqliteHuey(SqliteHuey):  # type: ignore[misc]
    storage_class = NormalSqliteStorage


class Bench:
    """A huey instance on one database and the two tasks the figures use."""

    def __init__(self, vendor: str) -> None:
        self.vendor = vendor
        if vendor == "sqlite":
            self.huey = NormalSqliteHuey("bench", filename=str(database.sqlite_path(NAME)))
        else:
            pg = database.pg_params(NAME)
            self.huey = PostgresHuey(
                "bench", host=pg["host"], port=pg["port"], user=pg["user"], dbname=pg["dbname"]
            )
        self.noop = self.huey.task(name="noop")(noop)
        self.stamp = self.huey.task(name="stamp")(stamp)


def noop(i: int = 0) -> None:
    return None


def stamp() -> float:
    """When a worker started it: the pickup latency is this minus the enqueue time."""
    return time.time()


def consume(bench: Bench, expect: int) -> None:
    """Run a 4-thread consumer; with ``expect``, print the drain's span once that many tasks finished."""
    span: dict[str, float] = {}
    lock = threading.Lock()
    finished = 0

    @bench.huey.signal(SIGNAL_EXECUTING)
    def executing(signal: str, task: Any, *args: Any) -> None:
        span.setdefault("first", time.perf_counter())

    @bench.huey.signal(SIGNAL_COMPLETE)
    def complete(signal: str, task: Any, *args: Any) -> None:
        nonlocal finished
        with lock:
            finished += 1
            if finished == expect:
                print(json.dumps({"seconds": time.perf_counter() - span["first"]}), flush=True)
                os._exit(0)  # every task is done; nothing is left to shut down cleanly

    bench.huey.create_consumer(workers=4, worker_type="thread", periodic=False).run()


def consumer(bench: Bench, expect: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            __spec__.name if __spec__ else __name__,
            "--db",
            bench.vendor,
            "--consume",
            str(expect),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def fresh(bench: Bench) -> None:
    """An empty queue: huey's tables in a new database (huey has no "delete everything")."""
    bench.huey.storage.close()
    database.recreate(bench.vendor, NAME)
    bench.huey.storage.initialize_schema()


def drain(bench: Bench, count: int) -> dict[str, Any]:
    fresh(bench)
    for i in range(count):
        bench.noop(i)
    process = consumer(bench, count)
    out, _ = process.communicate(timeout=600)
    if process.returncode != 0:
        raise RuntimeError(f"consumer exited {process.returncode}")
    return common.rate(count, json.loads(out)["seconds"])


def latency(bench: Bench, samples: int) -> dict[str, Any]:
    fresh(bench)
    process = consumer(bench)
    try:
        time.sleep(3)  # start-up, then settle into the idle poll
        delays = []
        for _ in range(samples):
            enqueued = time.time()
            started = bench.stamp().get(blocking=True, timeout=30)
            delays.append((started - enqueued) * 1000)
            common.gap()
    finally:
        process.kill()
        process.wait()
    return common.latency(delays)


def enqueue_one(bench: Bench, count: int) -> dict[str, Any]:
    fresh(bench)
    return common.enqueue_rate(bench.noop, count)


def figures(bench: Bench) -> dict[str, common.Figure]:
    return {
        "drain": lambda a: drain(bench, a.jobs),
        "latency": lambda a: latency(bench, a.samples),
        "enqueue_one": lambda a: enqueue_one(bench, max(a.jobs // 10, 100)),
    }


LACKS = {"enqueue_many": "no bulk enqueue (task.map enqueues one at a time)"}


def main() -> None:
    parser = common.parser(__doc__, ["drain", "latency", "enqueue_one"])
    parser.add_argument("--consume", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.db == "mariadb":
        common.unavailable(SYSTEM, args, "huey has no MariaDB/MySQL storage")
    elif args.consume is not None:
        consume(Bench(args.db), args.consume)
    else:
        database.recreate(args.db, NAME)  # huey's storage connects as soon as it is made
        common.run_figures(SYSTEM, args, figures(Bench(args.db)), LACKS)


if __name__ == "__main__":
    main()
