"""procrastinate on PostgreSQL: ``python -m benchmarks.peers.procrastinate_peer --db postgresql``.

The worker runs in a subprocess (``--work``) with concurrency 4 and
LISTEN/NOTIFY; the no-op task is a plain function (procrastinate runs it in a
thread), like the other systems' handlers. Throughput and latency come from
procrastinate's own event rows (deferred, started, succeeded).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import common, database
from benchmarks.peers.procrastinate_app import NAME, app, noop

SYSTEM = "procrastinate"
ROOT = Path(__file__).resolve().parents[2]


def sql(query: str) -> list[tuple[Any, ...]]:
    with database.connect("postgresql", NAME) as connection:
        return list(connection.execute(query).fetchall())


@contextmanager
def fresh() -> Iterator[None]:
    """A new database with procrastinate's schema, and the app's connections open on it."""
    database.recreate("postgresql", NAME)
    with app.open():
        app.schema_manager.apply_schema()
        yield


def work(wait: bool) -> None:
    app.run_worker(concurrency=4, wait=wait, install_signal_handlers=True)


def worker(wait: bool) -> subprocess.Popen[bytes]:
    flag = "--work-forever" if wait else "--work"
    return subprocess.Popen([sys.executable, "-m", __spec__.name if __spec__ else __name__, flag], cwd=ROOT)


def drain(count: int) -> dict[str, Any]:
    with fresh():
        noop.batch_defer(*({"i": i} for i in range(count)))
    worker(wait=False).wait(600)
    done = sql("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")[0][0]
    if done != count:
        raise RuntimeError(f"{done} of {count} jobs succeeded")
    span = sql(
        "SELECT extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded') "
        "- min(at) FILTER (WHERE type = 'started')) FROM procrastinate_events"
    )
    return common.rate(count, float(span[0][0]))


def latency(samples: int) -> dict[str, Any]:
    with fresh():
        process = worker(wait=True)
        try:
            time.sleep(3)  # start-up
            for i in range(samples):
                job = noop.defer(i=i)
                common.until(partial(_succeeded, job), 30, "the job done", pause=0.005)
                common.gap()
        finally:
            process.terminate()
            process.wait(30)
    delays = sql(
        "SELECT extract(epoch FROM s.at - d.at) * 1000 FROM procrastinate_events d "
        "JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'started' WHERE d.type = 'deferred'"
    )
    return common.latency([float(row[0]) for row in delays])


def _succeeded(job: int) -> bool:
    return bool(sql(f"SELECT 1 FROM procrastinate_jobs WHERE id = {int(job)} AND status = 'succeeded'"))


def enqueue_one(count: int) -> dict[str, Any]:
    with fresh():
        return common.enqueue_rate(lambda i: noop.defer(i=i), count)


def enqueue_many(count: int) -> dict[str, Any]:
    with fresh():
        started = time.perf_counter()
        noop.batch_defer(*({"i": i} for i in range(count)))
        return common.rate(count, time.perf_counter() - started)


FIGURES: dict[str, common.Figure] = {
    "drain": lambda a: drain(a.jobs),
    "latency": lambda a: latency(a.samples),
    "enqueue_one": lambda a: enqueue_one(max(a.jobs // 10, 100)),
    "enqueue_many": lambda a: enqueue_many(a.jobs * 2),
}


def main() -> None:
    parser = common.parser(__doc__, FIGURES)
    parser.add_argument("--work", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work-forever", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.work or args.work_forever:
        work(wait=args.work_forever)
        return
    if args.db != "postgresql":
        common.unavailable(SYSTEM, args, "procrastinate runs on PostgreSQL only")
        return
    common.run_figures(SYSTEM, args, FIGURES)


if __name__ == "__main__":
    main()
