"""procrastinate on PostgreSQL: ``python -m benchmarks.peers.procrastinate_peer --db postgresql``.

The worker runs in a subprocess (``--work``) with concurrency 4 and
LISTEN/NOTIFY; the no-op task is a plain function (procrastinate runs it in a
thread), like the other systems' handlers. The I/O-bound figure's task is an
``async def`` awaiting ``asyncio.sleep(0.1)``, run by a worker with
concurrency 200 on its event loop. Throughput and latency come from
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
from benchmarks.peers.procrastinate_app import NAME, app, noop, pause_async

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


def work(wait: bool, concurrency: int) -> None:
    app.run_worker(concurrency=concurrency, wait=wait, install_signal_handlers=True)


def worker(wait: bool, concurrency: int = 4) -> subprocess.Popen[bytes]:
    flag = "--work-forever" if wait else "--work"
    module = __spec__.name if __spec__ else __name__
    return subprocess.Popen([sys.executable, "-m", module, flag, "--concurrency", str(concurrency)], cwd=ROOT)


def drain(count: int) -> dict[str, Any]:
    with fresh():
        noop.batch_defer(*({"i": i} for i in range(count)))
    return _burst(count, concurrency=4)


def io_bound(count: int, concurrency: int) -> dict[str, Any]:
    """One worker runs ``count`` async tasks that each wait 100 ms, ``concurrency`` at once."""
    with fresh():
        pause_async.batch_defer(*({"seconds": 0.1} for _ in range(count)))
    return {**_burst(count, concurrency), "concurrency": concurrency}


def _burst(count: int, concurrency: int) -> dict[str, Any]:
    """A worker that stops once the queue is empty runs the ``count`` deferred jobs: jobs/s."""
    if worker(wait=False, concurrency=concurrency).wait(600) != 0:
        raise RuntimeError("the worker failed")
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
    # Fewer jobs than vellum-jobs' async variant: at about 200 jobs/s here, 2,000 take 10 s.
    "io_async200": lambda a: io_bound(2000, concurrency=200),
}


def main() -> None:
    parser = common.parser(__doc__, FIGURES)
    parser.add_argument("--work", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work-forever", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.work or args.work_forever:
        work(wait=args.work_forever, concurrency=args.concurrency)
        return
    if args.db != "postgresql":
        common.unavailable(SYSTEM, args, "procrastinate runs on PostgreSQL only")
        return
    common.run_figures(SYSTEM, args, FIGURES)


if __name__ == "__main__":
    main()
