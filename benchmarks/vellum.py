"""vellum-jobs' own figures on one database: ``python -m benchmarks.vellum --db sqlite``.

Prints one JSON object per figure and round on stdout. Workers are real
``manage.py runjobs`` processes; throughput is measured from the jobs'
own timestamps (first start to last finish), so process start-up is not
counted; latency is a job's ``started_at`` minus its ``created_at``.
"""

from __future__ import annotations

import itertools
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks import common, statements
from benchmarks.baseline import DEFAULT_REF as BASELINE

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
    """An empty jobs table (and no workflows or edges), as the peers' rounds get from a new database.

    On PostgreSQL and MariaDB a TRUNCATE: a DELETE there leaves the previous
    rounds' dead rows for later rounds' claims to step over until a vacuum
    or purge runs, a cost the peers' fresh databases never pay.
    """
    from django.db import connection

    from vellum_jobs.core.models import Job, Worker
    from vellum_jobs.core.workflow_models import Dependency, Workflow

    for model in (Job, Dependency, Workflow):
        if connection.vendor == "sqlite":
            model.objects.all()._raw_delete(model.objects.db)
        else:
            with connection.cursor() as cursor:
                cursor.execute(f"TRUNCATE TABLE {connection.ops.quote_name(model._meta.db_table)}")
    Worker.objects.all().delete()


def runjobs(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "django", "runjobs", *args],
        cwd=_code(),
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.DEVNULL,
    )


def _code() -> Path:
    """The directory this process took ``vellum_jobs`` from: a worker runs the same code (an older
    commit's, in ``baseline_drain``'s subprocess; it finds ``benchmarks`` on ``PYTHONPATH`` there)."""
    import vellum_jobs

    return Path(vellum_jobs.__file__).resolve().parent.parent


def span_seconds() -> float:
    """Seconds between the first start and the last finish (of a batch: its callback's finish)."""
    from django.db.models import Max, Min

    from vellum_jobs.core.models import Job

    span = Job.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return float((span["last"] - span["first"]).total_seconds())


def drain(processes: int, threads: int, count: int, supervised: bool = False) -> dict[str, Any]:
    """``processes`` runjobs processes drain ``count`` jobs; ``supervised``: one ``runjobs --processes``."""
    from benchmarks.app.jobs import noop

    reset()
    noop.enqueue_many([(i,) for i in range(count)])
    options = ["--burst", "--workers", str(threads)]
    commands = [[*options, "--processes", str(processes)]] if supervised else [options] * processes
    return {**_burst(commands, count), "processes": processes, "threads": threads}


# What each job of the I/O-bound figure waits for: a reply that takes 100 ms.
IO_SECONDS = 0.1


def io_bound(count: int, threads: int, async_workers: int = 0) -> dict[str, Any]:
    """One ``runjobs --burst`` process drains ``count`` jobs that each wait 100 ms on I/O.

    With ``async_workers`` the jobs are ``async def`` handlers awaiting
    ``asyncio.sleep`` on the process's event loop, that many at once; without,
    sync handlers in ``time.sleep``, one per thread.
    """
    from benchmarks.app import jobs

    reset()
    options = ["--burst", "--workers", str(threads)]
    if async_workers:
        jobs.pause_async.enqueue_many([(IO_SECONDS,)] * count)
        options += ["--async-workers", str(async_workers)]
    else:
        jobs.pause.enqueue_many([(IO_SECONDS,)] * count)
    return {**_burst([options], count), "threads": threads, "async_workers": async_workers}


# Which of the two drains a batch round runs first: they take turns, so the
# machine's drift during a run favours neither.
_batch_rounds = itertools.count()


def batch_drain(count: int) -> dict[str, Any]:
    """The same ``count`` no-op jobs drained plain and as one batch with an ``on_done`` callback, by
    one ``runjobs --burst --workers 4`` each; the batch's jobs/s over the plain drain's.

    The batch's span ends with its callback's finish: the batch is drained when
    its callback has run. The callback must have run exactly once, handed the
    counts of ``count`` jobs done.
    """
    first_batch = next(_batch_rounds) % 2 == 1
    plain = batched = None
    for batched_now in (first_batch, not first_batch):
        if batched_now:
            batched = _batch_drain(count)
        else:
            plain = drain(1, 4, count)
    assert plain is not None and batched is not None
    return {
        "value": batched["value"] / plain["value"],
        "unit": "x",
        "plain_jobs_s": plain["value"],
        "batch_jobs_s": batched["value"],
        "plain_cpu_us_per_job": plain["cpu_us_per_job"],
        "batch_cpu_us_per_job": batched["cpu_us_per_job"],
        "callback_gap_ms": batched["callback_gap_ms"],
        "jobs": count,
    }


def _batch_drain(count: int) -> dict[str, Any]:
    """One ``runjobs --burst --workers 4`` drains a batch of ``count`` no-op jobs and its callback."""
    from django.db.models import Max

    from benchmarks.app.jobs import batch_report, noop
    from vellum_jobs import batch
    from vellum_jobs.core.models import Job

    reset()
    with batch(on_done=batch_report.s(), name="bench") as workflow:
        noop.enqueue_many([(i,) for i in range(count)])
    result = _burst([["--burst", "--workers", "4"]], count + 1)
    callbacks = Job.objects.filter(workflow=workflow, name="bench.batch_report")
    runs = list(callbacks.values_list("state", "attempts", "result"))
    expected = {"total": count, "done": count, "failed": 0, "cancelled": 0}
    if runs != [("done", 1, expected)]:
        raise RuntimeError(f"the batch's callback should have run once with {expected}: {runs}")
    # How long the callback took to start after the last job of the batch finished.
    last = Job.objects.exclude(name="bench.batch_report").aggregate(last=Max("finished_at"))["last"]
    (started,) = callbacks.values_list("started_at", flat=True)
    # The batch's jobs per second: the callback is in the span, not in the count.
    return {
        **result,
        **common.rate(count, span_seconds()),
        "callback_gap_ms": (started - last).total_seconds() * 1000,
    }


# The older commit's drains (``benchmarks.baseline``), started by the first round.
_baseline: Any = None
_baseline_rounds = itertools.count()


def baseline_drain(count: int, ref: str) -> dict[str, Any]:
    """This code's no-op drain (jobs without limits) over the same drain by commit ``ref``'s code,
    in the same run: one ``runjobs --burst --workers 4`` each, in turn first.

    The older code drains in a subprocess of its own, on a database of its own
    built by its own migrations (``benchmarks.baseline``).
    """
    from benchmarks.baseline import Baseline

    global _baseline
    if _baseline is None:
        _baseline = Baseline(os.environ["VELLUM_BENCH_DB"], ref)
    base_first = next(_baseline_rounds) % 2 == 1
    current = base = None
    for base_now in (base_first, not base_first):
        if base_now:
            base = _baseline.drain(count)
        else:
            current = drain(1, 4, count)
    assert current is not None and base is not None
    return {
        "value": current["value"] / base["value"],
        "unit": "x",
        "current_jobs_s": current["value"],
        "baseline_jobs_s": base["value"],
        "cpu_ratio": current["cpu_us_per_job"] / base["cpu_us_per_job"],
        "current_cpu_us_per_job": current["cpu_us_per_job"],
        "baseline_cpu_us_per_job": base["cpu_us_per_job"],
        "baseline": _baseline.commit,
        "jobs": count,
    }


# The limit of ``rate_drain``: starts per second of one key.
RATE = 1000


def rate_drain(count: int, threads: int = 4) -> dict[str, Any]:
    """``count`` no-op jobs under ``rate=("1000/s", "bench")``, drained by one ``runjobs --workers 4``:
    the starts per second once the first second's allowance is spent, by the handlers' own records.

    A limit of N a second may let its first N jobs start at once; the rate
    is that of the jobs after them: (starts - N) over the seconds from the
    N-th start to the last. Each handler notes when it started (``stamped``),
    so the figure is the handlers' starts, not the claims' times; so is the
    most starts in any second (sliding), which the limit keeps at N. Not
    ``--burst``: a job held back by the limit is not due, and a burst worker
    would stop. A round that takes three times as long as the limit allows
    (and 30 s) is cut short and measured on the jobs that started.
    """
    from benchmarks.app.jobs import stamped
    from vellum_jobs.core.models import Job

    reset()
    _reset_limits()
    notes = Path(tempfile.mkdtemp()) / "starts"
    notes.touch()
    stamped.using(rate=(f"{RATE}/s", "bench")).enqueue_many([(i,) for i in range(count)])
    done = Job.objects.filter(state=Job.State.DONE)
    cpu_before = _children_cpu()
    # Each start queries the database (the limits' gate): connections kept between jobs, as
    # the production checklist advises, not one opened per job.
    env = {"VELLUM_BENCH_CONN_MAX_AGE": "600", "VELLUM_BENCH_STARTS": str(notes)}
    worker = runjobs("--workers", str(threads), env=env)
    try:
        common.until(lambda: done.count() == count, 3 * count / RATE + 30, pause=0.2, what="every job done")
    except TimeoutError:
        pass  # measured on the jobs that started
    finally:
        worker.terminate()
        worker.wait(60)
    cpu = _children_cpu() - cpu_before
    starts = sorted(float(line) for line in notes.read_text().split())
    if len(starts) <= RATE:
        raise RuntimeError(
            f"only {len(starts)} of {count} jobs ran: too few to measure past the first {RATE}"
        )
    value = (len(starts) - RATE) / (starts[-1] - starts[RATE - 1])
    return {
        "value": value,
        "unit": "starts/s",
        "share": value / RATE,
        "limit": RATE,
        "first_allowance_s": starts[RATE - 1] - starts[0],
        "max_in_1s": _most_in_window(starts, 1.0),
        "claims_per_start": _claims() / len(starts),
        "cpu_us_per_job": cpu / len(starts) * 1e6,
        "started": len(starts),
        "jobs": count,
    }


def _reset_limits() -> None:
    """No rate slots or holds left from an earlier round."""
    from vellum_jobs.core.limit_models import LimitHold, LimitSlot

    LimitSlot.objects.all().delete()
    LimitHold.objects.all().delete()


def _most_in_window(starts: list[float], seconds: float) -> int:
    """The most of ``starts`` (sorted, in seconds) in any window of ``seconds``."""
    most, first = 0, 0
    for last, moment in enumerate(starts):
        while moment - starts[first] >= seconds:
            first += 1
        most = max(most, last - first + 1)
    return most


def _claims() -> int:
    """Claims of every job so far: a job held back by its limit, or prefetched and put back, is
    claimed again."""
    from django.db.models import Sum

    from vellum_jobs.core.models import Job

    return int(Job.objects.aggregate(claims=Sum("claims"))["claims"] or 0)


def batch_enqueue(count: int) -> dict[str, Any]:
    """``enqueue_many`` of ``count`` jobs in a batch with a callback (its edges: one INSERT ... SELECT)
    over the same call without one: the batch's jobs/s over the plain call's."""
    from benchmarks.app.jobs import batch_report, noop
    from vellum_jobs import batch

    rates = {}
    for batched in (False, True):
        reset()
        calls = [(i,) for i in range(count)]
        started = time.perf_counter()
        if batched:
            with batch(on_done=batch_report.s()):
                noop.enqueue_many(calls)
        else:
            noop.enqueue_many(calls)
        rates[batched] = count / (time.perf_counter() - started)
    return {
        "value": rates[True] / rates[False],
        "unit": "x",
        "plain_jobs_s": rates[False],
        "batch_jobs_s": rates[True],
        "jobs": count,
    }


def _burst(commands: list[list[str]], count: int) -> dict[str, Any]:
    """A ``runjobs`` process per command line drains the ``count`` queued jobs: jobs/s and CPU per job."""
    from vellum_jobs.core.models import Job

    cpu_before = _children_cpu()
    with tempfile.TemporaryDirectory() as counts:
        env = {"VELLUM_BENCH_STATEMENTS": counts}
        workers = [runjobs(*options, env=env) for options in commands]
        for worker in workers:
            if worker.wait(600) != 0:
                raise RuntimeError(f"runjobs exited {worker.returncode}")
        sent = statements.total(Path(counts))
    cpu = _children_cpu() - cpu_before
    done = Job.objects.filter(state=Job.State.DONE).count()
    if done != count:
        raise RuntimeError(f"{done} of {count} jobs done")
    return {
        **common.rate(count, span_seconds()),
        # The workers' whole CPU time (start-up included) per job.
        "cpu_us_per_job": cpu / count * 1e6,
        # Every statement the workers sent (start-up, heartbeats and duties included) per job.
        "statements_per_job": sent / count,
    }


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fairness(count: int) -> dict[str, Any]:
    """Two ``runjobs`` processes drain one backlog: the larger share one of them ran (0.5 is fair).

    The backlog waits in a paused queue until both processes are up, then
    the queue is resumed: at 15,000 jobs a second the process that finished
    starting first would otherwise drain much of it alone, and the figure
    would measure start-up, not how two running processes share.
    """
    from django.db.models import Count

    from benchmarks.app.jobs import noop
    from vellum_jobs import queues
    from vellum_jobs.core.models import Job, Worker

    reset()
    queue = noop.options.queue
    queues.pause(queue)
    noop.enqueue_many([(i,) for i in range(count)])
    workers = [runjobs("--workers", "4") for _ in range(2)]
    try:
        common.until(lambda: Worker.objects.count() == 2, timeout=60, what="both workers registered")
        time.sleep(1)  # past registration: the wakeup watchers and slot threads start
        queues.resume(queue)
        common.until(
            lambda: not Job.objects.exclude(state=Job.State.DONE).exists(), timeout=600, what="the backlog"
        )
    finally:
        queues.resume(queue)  # for the figures after this one, should this one fail
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(60)
    shares = Job.objects.filter(state=Job.State.DONE).values("worker_id").annotate(n=Count("id"))
    ran = sorted((row["n"] for row in shares), reverse=True)
    if sum(ran) != count:
        raise RuntimeError(f"{sum(ran)} of {count} jobs done")
    return {"value": ran[0] / count, "unit": "share", "jobs": count, "processes": len(ran)}


def priority_jump(backlog: int) -> dict[str, Any]:
    """How soon an urgent job starts in a busy worker: jobs started between its enqueue and its start.

    ``value`` is that count in dispatcher cycles: claims of up to the idle
    threads plus the default prefetch (4 threads + 64), so 1 means it started
    with the next claim.
    """
    from benchmarks.app.jobs import noop, pause
    from vellum_jobs.core.models import Job
    from vellum_jobs.worker.process import default_prefetch

    reset()
    pause.enqueue_many([(0.005,) for _ in range(backlog)])
    worker = runjobs("--workers", "4")
    try:
        common.until(
            lambda: Job.objects.filter(state=Job.State.DONE).count() > backlog // 10, 60, "a busy worker"
        )
        urgent = noop.using(priority=100).enqueue(-1)
        common.until(
            lambda: Job.objects.filter(pk=urgent.pk, state=Job.State.DONE).exists(), 30, "the urgent job"
        )
        urgent.refresh_from_db()
        before = Job.objects.filter(name="bench.pause", started_at__gt=urgent.created_at)
        overtaken = before.filter(started_at__lt=urgent.started_at).count()
    finally:
        worker.terminate()
        worker.wait(60)
    cycle = 4 + default_prefetch(4)
    return {"value": overtaken / cycle, "unit": "cycles", "overtaken": overtaken, "backlog": backlog}


def latency(samples: int) -> dict[str, Any]:
    from benchmarks.app.jobs import noop
    from vellum_jobs.core.models import Job, Worker

    reset()
    worker = runjobs("--workers", "4")
    try:
        common.until(Worker.objects.exists, 30, "a live worker")
        time.sleep(1.0)  # let it settle into its idle wait
        delays = []
        for i in range(samples):
            job = noop.enqueue(i)
            done = Job.objects.filter(pk=job.pk, state=Job.State.DONE)
            common.until(done.exists, 10, "the job done")
            job.refresh_from_db()
            assert job.started_at is not None  # for the type checker: a done job has started
            delays.append((job.started_at - job.created_at).total_seconds() * 1000)
            common.gap()
    finally:
        worker.terminate()
        worker.wait(60)
    return common.latency(delays)


def enqueue_one(count: int) -> dict[str, Any]:
    from benchmarks.app.jobs import noop

    reset()
    return common.enqueue_rate(noop.enqueue, count)


def enqueue_many(count: int) -> dict[str, Any]:
    from benchmarks.app.jobs import noop

    reset()
    started = time.perf_counter()
    noop.enqueue_many([(i,) for i in range(count)])
    return common.rate(count, time.perf_counter() - started)


def claim_cost(count: int, finished_rows: int, loops: int = 3) -> dict[str, Any]:
    """How much ``finished_rows`` finished jobs in the table slow the claim + record loop down.

    The full table's loops sit between two sets of the empty table's (emptied
    again after), so a host that slows down or speeds up over the minutes of
    the fill moves both sides alike; each side is its fastest loop.
    """
    from django.db import connection

    reset()
    _claim_loop(count)  # warm-up: first-use costs (statement caches, imports) are not the table's
    empty = [_claim_loop(count) for _ in range(loops)]
    filling = time.perf_counter()
    _fill_finished(finished_rows)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE" if connection.vendor != "mysql" else "ANALYZE TABLE vellum_jobs_job")
    fill_s = time.perf_counter() - filling
    full = min(_claim_loop(count) for _ in range(loops))
    reset()
    empty += [_claim_loop(count) for _ in range(loops)]
    return {
        "value": full / min(empty),
        "unit": "x",
        "empty_us_per_job": min(empty) * 1e6,
        "full_us_per_job": full * 1e6,
        "finished_rows": finished_rows,
        "fill_s": fill_s,
    }


def _claim_loop(count: int) -> float:
    """Seconds per job to claim (4 at a time) and record ``count`` no-op jobs in one thread."""
    from django.db import connection
    from django.utils import timezone

    from benchmarks.app.jobs import noop
    from vellum_jobs.core.attempts import Attempt
    from vellum_jobs.execution.handler_run import run
    from vellum_jobs.execution.outcome_writes import OutcomeWrites
    from vellum_jobs.store import transactions
    from vellum_jobs.store.claim import ClaimRequest, claim

    noop.enqueue_many([(i,) for i in range(count)])
    worker_id = uuid.uuid4()
    started = time.perf_counter()
    finished: list[Any] = []
    while True:
        now = timezone.now()
        request = ClaimRequest(
            worker_id=worker_id, limit=4, now=now, lease_until=now + timedelta(seconds=60), is_async=False
        )
        outcomes = OutcomeWrites(finished)
        with transactions.short_transaction(connection):
            outcomes.write()
            jobs = claim(connection, request)
        if not jobs:
            break
        attempts = [Attempt(job, worker_id) for job in jobs]
        finished = [(attempt, run(attempt)) for attempt in attempts]
    return (time.perf_counter() - started) / count


def _fill_finished(rows: int) -> None:
    """Insert ``rows`` finished jobs with one set-based statement (seconds, not minutes)."""
    from django.db import connection

    vendor = connection.vendor
    now = {
        "postgresql": "now()",
        "sqlite": "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')",  # %% for the driver's paramstyle
        "mysql": "NOW(6)",
    }[vendor]
    columns, values, params = _finished_row(connection, now)
    select = f"SELECT {', '.join(values)}"
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(
                f"INSERT INTO vellum_jobs_job ({columns}) {select} FROM generate_series(1, %s)",
                [*params, rows],
            )
            return
        if vendor == "mysql":
            cursor.execute("SET SESSION max_recursive_iterations = %s", [rows + 1])
        series = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %s)"
        if vendor == "sqlite":
            cursor.execute(
                f"{series} INSERT INTO vellum_jobs_job ({columns}) {select} FROM n", [rows, *params]
            )
        else:
            cursor.execute(
                f"INSERT INTO vellum_jobs_job ({columns}) {series} {select} FROM n", [rows, *params]
            )


def _finished_row(connection: Any, now: str) -> tuple[str, list[str], list[Any]]:
    """Columns and values of a done job: the model's own defaults, so new columns need no change here."""
    from vellum_jobs.core.models import Job

    fixed = {"name": "'bench.noop'", "state": "'done'", "attempts": "1"}
    columns, values, params = [], [], []
    for field in Job._meta.concrete_fields:
        if field.primary_key or (field.null and field.column not in ("started_at", "finished_at")):
            continue
        columns.append(connection.ops.quote_name(field.column))
        if field.column in fixed:
            values.append(fixed[field.column])
        elif field.column in ("run_after", "created_at", "started_at", "finished_at"):
            values.append(now)
        else:
            values.append("%s")
            params.append(field.get_db_prep_save(field.get_default(), connection))
    return ", ".join(columns), values, params


def idle(seconds: float) -> dict[str, Any]:
    """CPU share and memory (resident, and proportional: shared pages split among their users)
    of a ``runjobs`` process with nothing to do.

    Also, where the database server runs on this machine, the CPU share of
    the server threads (MariaDB) or processes (PostgreSQL) that serve the
    worker's connections: what an idle worker costs the database.
    """
    from vellum_jobs.core.models import Worker

    reset()
    worker = runjobs("--workers", "4")
    try:
        common.until(Worker.objects.exists, 30, "a live worker")
        time.sleep(3)
        ticks = os.sysconf("SC_CLK_TCK")
        servers = _server_tasks()
        before, server_before = _cpu_ticks(worker.pid), _server_ns(servers)
        time.sleep(seconds)
        cpu = (_cpu_ticks(worker.pid) - before) / ticks / seconds * 100
        server_after = _server_ns(servers)
        rss, pss = _rss_mb(worker.pid), _pss_mb(worker.pid)
    finally:
        worker.terminate()
        worker.wait(60)
    result = {"value": cpu, "unit": "% of a core", "rss_mb": rss, "pss_mb": pss}
    if servers:
        used = sum(server_after[t] - server_before[t] for t in server_before if t in server_after)
        result["server_cpu"] = used / 1e9 / seconds * 100
    return result


def footprint(count: int) -> dict[str, Any]:
    """The most memory (proportional and resident) a ``runjobs --burst --workers 4`` process holds
    while it drains ``count`` no-op jobs: its ``/proc`` figures sampled every 50 ms from a thread."""
    from benchmarks.app.jobs import noop

    reset()
    noop.enqueue_many([(i,) for i in range(count)])
    cpu_before = _children_cpu()
    worker = runjobs("--burst", "--workers", "4")
    peak = _Peak(worker.pid)
    peak.start()
    try:
        if worker.wait(600) != 0:
            raise RuntimeError(f"runjobs exited {worker.returncode}")
    finally:
        peak.stop()
    cpu = _children_cpu() - cpu_before
    return {
        "value": peak.pss_mb,
        "unit": "MiB PSS",
        "rss_mb": peak.rss_mb,
        "samples": peak.samples,
        "jobs_s": common.rate(count, span_seconds())["value"],
        "cpu_us_per_job": cpu / count * 1e6,
        "jobs": count,
    }


class _Peak:
    """The largest PSS and RSS of process ``pid`` seen by a thread that reads them every 50 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.pss_mb = self.rss_mb = 0.0
        self.samples = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stopped.is_set():
            try:
                pss, rss = _pss_mb(self.pid), _rss_mb(self.pid)
            except (OSError, ValueError):
                return  # the process has exited (or is a zombie with no memory left to read)
            if pss == pss and rss == rss:  # not NaN: a zombie's files have no figures
                self.pss_mb, self.rss_mb = max(self.pss_mb, pss), max(self.rss_mb, rss)
                self.samples += 1
            self._stopped.wait(0.05)


def _server_tasks() -> list[int]:
    """Linux thread or process ids of the server tasks serving the worker's connections, if local."""
    from django.db import connection

    if connection.vendor == "mysql":
        # MariaDB only: MySQL's processlist has no TID.
        sql = "SELECT tid FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()"
    elif connection.vendor == "postgresql":
        sql = (
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    else:
        return []  # SQLite: the worker's own process does the database's work
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            tasks = [int(row[0]) for row in cursor.fetchall()]
    except Exception:  # noqa: BLE001 - a figure left out, not a failed run
        return []
    return [task for task in tasks if Path(f"/proc/{task}/schedstat").exists()]


def _server_ns(tasks: list[int]) -> dict[int, int]:
    """Nanoseconds on a CPU so far, per task (tasks that ended are left out)."""
    used = {}
    for task in tasks:
        try:
            used[task] = int(Path(f"/proc/{task}/schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue
    return used


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return float("nan")


FIGURES: dict[str, common.Figure] = {
    "drain_1x4": lambda a: drain(1, 4, a.jobs),
    "drain_2x4": lambda a: drain(2, 4, a.jobs),
    "drain_procs2": lambda a: drain(2, 4, a.jobs, supervised=True),
    "fairness": lambda a: fairness(a.jobs),
    "priority_jump": lambda a: priority_jump(max(a.jobs // 10, 500)),
    "latency": lambda a: latency(a.samples),
    "enqueue_one": lambda a: enqueue_one(max(a.jobs // 10, 100)),
    "enqueue_many": lambda a: enqueue_many(a.jobs * 2),
    "batch_drain": lambda a: batch_drain(a.jobs),
    "batch_enqueue": lambda a: batch_enqueue(a.jobs),
    "baseline_drain": lambda a: baseline_drain(a.jobs, a.baseline),
    # 10,000 jobs: about ten seconds at the limit (3,000 in a quick run).
    "rate_drain": lambda a: rate_drain(max(a.jobs // 2, 3 * RATE)),
    "claim_cost_1m": lambda a: claim_cost(a.claim_jobs, a.finished_rows),
    # Ten times the rows (ten million; 500,000 in a quick run), and five times the jobs per loop
    # for a ratio fine enough to judge a 10% target. Opt-in (benchmarks.run): minutes a round.
    "claim_cost_10m": lambda a: claim_cost(a.claim_jobs * 5, a.finished_rows * 10),
    "idle": lambda a: idle(a.idle_seconds),
    "footprint": lambda a: footprint(a.jobs),
    # Sized so each takes about 5 s at 100 ms a job, in a quick run too: a tenth
    # would be a few rounds of waits, too short a span to time.
    "io_threads4": lambda a: io_bound(200, threads=4),
    "io_threads32": lambda a: io_bound(1600, threads=32),
    "io_async200": lambda a: io_bound(4000, threads=2, async_workers=200),
}


def main() -> None:
    parser = common.parser(__doc__, FIGURES)
    parser.add_argument("--finished-rows", type=int, default=1_000_000)
    parser.add_argument("--claim-jobs", type=int, default=2000, help="jobs per claim-cost loop")
    parser.add_argument("--idle-seconds", type=float, default=10)
    parser.add_argument(
        "--baseline",
        default=BASELINE,
        metavar="REF",
        help=f"the commit baseline_drain compares the drain with (default {BASELINE}: before limits)",
    )
    args = parser.parse_args()
    setup(args.db, "vellum_bench")
    common.run_figures("vellum-jobs", args, FIGURES)


if __name__ == "__main__":
    main()
