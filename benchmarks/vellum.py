"""vellum-jobs' own figures on one database: ``python -m benchmarks.vellum --db sqlite``.

Prints one JSON object per figure and round on stdout. Workers are real
``manage.py runjobs`` processes; throughput is measured from the jobs'
own timestamps (first start to last finish), so process start-up is not
counted; latency is a job's ``started_at`` minus its ``created_at``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def setup(vendor: str, name: str) -> None:
    from benchmarks.database import recreate

    os.environ["VELLUM_BENCH_DB"] = vendor
    os.environ["VELLUM_BENCH_NAME"] = recreate(vendor, name)
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def reset() -> None:
    from vellum_jobs.models import Job, Worker

    Job.objects.all()._raw_delete(Job.objects.db)
    Worker.objects.all().delete()


def runjobs(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "django", "runjobs", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
    )


def span_rate(count: int) -> float:
    """Jobs per second between the first start and the last finish."""
    from django.db.models import Max, Min

    from vellum_jobs.models import Job

    span = Job.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return float(count / (span["last"] - span["first"]).total_seconds())


def drain(processes: int, threads: int, count: int) -> dict[str, Any]:
    from benchmarks.app.jobs import noop
    from vellum_jobs.models import Job

    reset()
    noop.enqueue_many([(i,) for i in range(count)])
    workers = [runjobs("--burst", "--workers", str(threads)) for _ in range(processes)]
    for worker in workers:
        worker.wait(600)
    done = Job.objects.filter(state=Job.State.DONE).count()
    assert done == count, f"{done} of {count} jobs done"
    return {"value": span_rate(count), "unit": "jobs/s"}


def latency(samples: int) -> dict[str, Any]:
    from benchmarks.app.jobs import noop
    from vellum_jobs.models import Job, Worker

    reset()
    worker = runjobs("--workers", "4")
    try:
        _until(lambda: Worker.objects.exists(), 30)
        time.sleep(1.0)  # let it settle into its idle wait
        delays = []
        for i in range(samples):
            job = noop.enqueue(i)
            done = Job.objects.filter(pk=job.pk, state=Job.State.DONE)
            _until(done.exists, 10)
            job.refresh_from_db()
            assert job.started_at is not None
            delays.append((job.started_at - job.created_at).total_seconds() * 1000)
            time.sleep(0.1)
    finally:
        worker.terminate()
        worker.wait(60)
    delays.sort()
    return {
        "value": delays[len(delays) // 2],
        "p95": delays[int(len(delays) * 0.95) - 1],
        "unit": "ms",
        "samples": samples,
    }


def enqueue_one(count: int) -> dict[str, Any]:
    from benchmarks.app.jobs import noop

    reset()
    started = time.perf_counter()
    for i in range(count):
        noop.enqueue(i)
    return {"value": count / (time.perf_counter() - started), "unit": "jobs/s"}


def enqueue_many(count: int) -> dict[str, Any]:
    from benchmarks.app.jobs import noop

    reset()
    started = time.perf_counter()
    noop.enqueue_many([(i,) for i in range(count)])
    return {"value": count / (time.perf_counter() - started), "unit": "jobs/s"}


def claim_cost(count: int, finished_rows: int) -> dict[str, Any]:
    """How much a million finished jobs in the table slow the claim + record loop down."""
    from django.db import connection

    reset()
    _claim_loop(count)  # warm-up: first-use costs (statement caches, imports) are not the table's
    empty = _claim_loop(count)
    _fill_finished(finished_rows)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE" if connection.vendor != "mysql" else "ANALYZE TABLE vellum_jobs_job")
    full = _claim_loop(count)
    return {
        "value": full / empty,
        "unit": "x",
        "empty_us_per_job": empty * 1e6,
        "full_us_per_job": full * 1e6,
        "finished_rows": finished_rows,
    }


def _claim_loop(count: int) -> float:
    """Seconds per job to claim (4 at a time) and record ``count`` no-op jobs in one thread."""
    from django.db import connection
    from django.utils import timezone

    from benchmarks.app.jobs import noop
    from vellum_jobs import db
    from vellum_jobs.claim import ClaimRequest, claim
    from vellum_jobs.executor import Outcomes, run

    noop.enqueue_many([(i,) for i in range(count)])
    worker_id = uuid.uuid4()
    started = time.perf_counter()
    finished: list[Any] = []
    while True:
        now = timezone.now()
        request = ClaimRequest(worker_id=worker_id, limit=4, now=now, lease_until=now + timedelta(seconds=60))
        outcomes = Outcomes(worker_id, finished)
        with db.short_transaction(connection):
            outcomes.write()
            jobs = claim(connection, request)
        if not jobs:
            break
        finished = [(job, run(job, worker_id)) for job in jobs]
    return (time.perf_counter() - started) / count


def _fill_finished(rows: int) -> None:
    """Insert ``rows`` finished jobs with set-based SQL (seconds, not minutes)."""
    from django.db import connection

    vendor = connection.vendor
    columns = (
        "name, queue, priority, args, kwargs, state, attempts, max_attempts, run_after, created_at, "
        "started_at, finished_at, error, progress_message, ref_id"
    )
    values = "'bench.noop', 'default', 0, '[]', '{}', 'done', 1, 5, {now}, {now}, {now}, {now}, '', '', ''"
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(
                f"INSERT INTO vellum_jobs_job ({columns}) SELECT "
                f"{values.replace('{now}', 'now()')} FROM generate_series(1, %s)",
                [rows],
            )
        elif vendor == "sqlite":
            now = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"  # %% for the driver's paramstyle
            cursor.execute(
                f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %s) "
                f"INSERT INTO vellum_jobs_job ({columns}) SELECT {values.replace('{now}', now)} FROM n",
                [rows],
            )
        else:
            cursor.execute("SET SESSION cte_max_recursion_depth = %s", [rows + 1])
            cursor.execute(
                f"INSERT INTO vellum_jobs_job ({columns}) WITH RECURSIVE n(i) AS "
                f"(SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %s) "
                f"SELECT {values.replace('{now}', 'NOW(6)')} FROM n",
                [rows],
            )


def idle(seconds: float) -> dict[str, Any]:
    """CPU share and resident memory of a ``runjobs`` process with nothing to do."""
    from vellum_jobs.models import Worker

    reset()
    worker = runjobs("--workers", "4")
    try:
        _until(lambda: Worker.objects.exists(), 30)
        time.sleep(3)
        ticks = os.sysconf("SC_CLK_TCK")
        before = _cpu_ticks(worker.pid)
        time.sleep(seconds)
        cpu = (_cpu_ticks(worker.pid) - before) / ticks / seconds * 100
        rss = _rss_mb(worker.pid)
    finally:
        worker.terminate()
        worker.wait(60)
    return {"value": cpu, "unit": "% of a core", "rss_mb": rss}


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(0.002)


FIGURES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "drain_1x4": lambda a: drain(1, 4, a.jobs),
    "drain_2x4": lambda a: drain(2, 4, a.jobs),
    "latency": lambda a: latency(a.samples),
    "enqueue_one": lambda a: enqueue_one(a.jobs // 10),
    "enqueue_many": lambda a: enqueue_many(a.jobs * 2),
    "claim_cost_1m": lambda a: claim_cost(2000, a.finished_rows),
    "idle": lambda a: idle(10),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", default="sqlite", choices=["sqlite", "postgresql", "mariadb"])
    parser.add_argument("--figures", default=",".join(FIGURES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--finished-rows", type=int, default=1_000_000)
    args = parser.parse_args()
    setup(args.db, "vellum_bench")
    for figure in args.figures.split(","):
        for round_ in range(args.rounds):
            result = FIGURES[figure](args)
            print(
                json.dumps(
                    {"system": "vellum-jobs", "db": args.db, "figure": figure, "round": round_, **result}
                )
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
