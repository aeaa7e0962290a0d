"""Sustained load on PostgreSQL: a producer at a steady rate, workers draining it, sampled every minute.

``python -m benchmarks.sustained --minutes 60 --rate 1000000 --processes 2 --workers 8``

A producer process enqueues ``bench.sustained`` jobs at ``--rate`` jobs an
hour, paced by the clock: every 50 ms it enqueues what the rate owes so far,
in one ``enqueue_many`` of at most 50 jobs and one ``enqueue``. Each job
sleeps 1-50 ms and 1 % raise on their first attempt and are retried (as
``benchmarks.app.jobs.sustained_fate`` dictates from the job's number).
``--processes`` ``runjobs --workers N`` processes drain them, and prune
finished jobs as ``RETENTION`` asks (``benchmarks/sustained_settings.py``).
Every ``--sample`` seconds the run records, for the minute just ended: jobs
enqueued, finished (the drain rate) and started, the time from due to start
(p50, p95, p99), the due backlog, the rows by state, the sizes of the jobs
table and its indexes, its dead tuples and HOT updates, autovacuum and
autoanalyze runs, the load average and the CPU of the producer, the workers
and the server. Samples go to ``--out`` (JSON, rewritten at each sample) and
a Markdown table is printed at the end, with these checks:

- rate: the run drained at least 90 % of ``--rate``;
- steady drain: the last ten minutes' drain within 10 % of the first ten's;
- steady claim: the last ten minutes' claim p95 at most 10 % above the
  first ten's (or ``--p95-grace-ms`` above it, the resolution on a shared host);
- bounded: the jobs table's largest total size in the last ten minutes at
  most 10 % above its largest in the ten before them, and its rows below
  what retention allows;
- keeping up: the due backlog at the end under ten seconds of the rate.

A run shorter than 20 minutes compares its halves. It exits 1 if a check
fails. Autovacuum must be on (``SHOW autovacuum``): the run refuses a
server with it off. ``--fillfactor`` and ``--vacuum-threshold`` set the
jobs table's storage parameters before the run (``ALTER TABLE ... SET``);
``--prefill N`` first inserts N finished jobs that retention keeps for the
whole run, the table of a longer retention (their rows are left out of the
row counts' bound).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import database

ROOT = Path(__file__).resolve().parent.parent
NAME = "vellum_sustained_bench"
TABLE = "vellum_jobs_job"
SETTINGS = "benchmarks.sustained_settings"
TICK = 0.05  # the producer's pace: it catches up with the rate this often
BATCH = 50  # the most jobs one enqueue_many call takes
MIB = 1024 * 1024
# Retention rests this long between runs (vellum_jobs.maintenance.retention.INTERVAL).
RETENTION_REST = 300.0


# -- setup -------------------------------------------------------------------


def setup(args: argparse.Namespace) -> dict[str, Any]:
    """A new scratch database, migrated, the table's storage parameters set; the server's settings."""
    os.environ["VELLUM_BENCH_DB"] = "postgresql"
    os.environ["VELLUM_BENCH_NAME"] = database.recreate("postgresql", NAME)
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()
    call_command("migrate", verbosity=0)
    if args.prefill:
        prefill(args.prefill)
    options = storage_options(args)
    with connection.cursor() as cursor:
        if options:
            cursor.execute(f"ALTER TABLE {TABLE} SET ({', '.join(options)})")
        names = (
            "server_version",
            "autovacuum",
            "autovacuum_naptime",
            "autovacuum_vacuum_scale_factor",
            "autovacuum_vacuum_threshold",
            "autovacuum_vacuum_insert_scale_factor",
            "autovacuum_analyze_scale_factor",
            "autovacuum_vacuum_cost_limit",
            "autovacuum_vacuum_cost_delay",
            "shared_buffers",
            "fsync",
            "synchronous_commit",
        )
        server = {}
        for name in names:
            cursor.execute(f"SHOW {name}")
            server[name] = cursor.fetchone()[0]
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [TABLE])
        server["reloptions"] = cursor.fetchone()[0] or []
    if server["autovacuum"] != "on":
        sys.exit(
            f"autovacuum is {server['autovacuum']} on {database.pg_params(NAME)['host']}:"
            f"{database.pg_params(NAME)['port']}: this run measures the table under autovacuum. "
            "Point PGHOST/PGPORT at a server with autovacuum on (see benchmarks/README.md)."
        )
    return server


def storage_options(args: argparse.Namespace) -> list[str]:
    """The jobs table's storage parameters the arguments ask for (docs/howto/volume.md)."""
    options = [f"fillfactor = {args.fillfactor}"] if args.fillfactor else []
    if args.vacuum_threshold:
        options += [
            "autovacuum_vacuum_scale_factor = 0",
            f"autovacuum_vacuum_threshold = {args.vacuum_threshold}",
            "autovacuum_analyze_scale_factor = 0",
            f"autovacuum_analyze_threshold = {5 * args.vacuum_threshold}",
            "autovacuum_vacuum_cost_delay = 0",
        ]
    return options


def prefill(count: int) -> None:
    """``count`` finished jobs that retention keeps all run long, as a longer retention would keep
    them: copies of one job, done, finished a day ahead (so past no cutoff). Then VACUUM ANALYZE,
    as autovacuum would have left a table that old."""
    from django.db import connection

    from benchmarks.app.jobs import sustained

    template = sustained.enqueue(-1).pk
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = %s AND column_name <> 'id'",
            [TABLE],
        )
        columns = [name for (name,) in cursor.fetchall()]
        values = {
            "state": "'done'",
            "args": "jsonb_build_array(-g)",
            "attempts": "1",
            "claims": "1",
            "created_at": "now() - interval '1 hour'",
            "run_after": "now() - interval '1 hour'",
            "started_at": "now() - interval '1 hour'",
            "finished_at": "now() + interval '1 day'",
        }
        selected = ", ".join(values.get(name, name) for name in columns)
        for start in range(0, count, 200_000):
            cursor.execute(
                f"INSERT INTO {TABLE} ({', '.join(columns)}) SELECT {selected} "
                f"FROM {TABLE}, generate_series(%s, %s) AS g WHERE id = %s",
                [start + 1, min(start + 200_000, count), template],
            )
        cursor.execute(f"DELETE FROM {TABLE} WHERE id = %s", [template])
        cursor.execute(f"VACUUM ANALYZE {TABLE}")


# -- the producer ------------------------------------------------------------


def produce(rate: float, seconds: float, sent: Any, loaded: Any, go: Any) -> None:
    """Enqueue ``rate`` jobs an hour for ``seconds``, paced by the clock (a process of its own)."""
    import django

    django.setup()
    from benchmarks.app.jobs import sustained

    per_second = rate / 3600
    loaded.set()
    go.wait()
    started = time.monotonic()
    n = 0
    while (now := time.monotonic()) < started + seconds:
        owed = int(per_second * (now - started)) - n
        if owed > 1:
            count = min(owed - 1, BATCH)
            sustained.enqueue_many([(i,) for i in range(n, n + count)])
            n += count
        if owed > 0:
            sustained.enqueue(n)
            n += 1
        sent.value = n
        time.sleep(max(0.0, TICK - (time.monotonic() - now)))


# -- the workers -------------------------------------------------------------


def start_workers(args: argparse.Namespace, outdir: Path) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    processes = []
    for i in range(args.processes):
        with open(outdir / f"worker{i}.log", "wb") as out:  # the child keeps its own copy
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "django", "runjobs", "--workers", str(args.workers)],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    return processes


def wait_registered(processes: list[subprocess.Popen[bytes]]) -> None:
    from vellum_jobs.core.models import Worker

    pids = {p.pid for p in processes}
    deadline = time.monotonic() + 120
    while not pids <= set(Worker.objects.values_list("pid", flat=True)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            sys.exit("the workers did not start: see their logs")
        time.sleep(0.2)


def stop_workers(processes: list[subprocess.Popen[bytes]]) -> list[int]:
    for process in processes:
        process.send_signal(signal.SIGTERM)
    return [process.wait(120) for process in processes]


# -- CPU ---------------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """utime + stime of ``pid`` (and of its children it has waited for), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / TICKS


def server_cpu(postmaster: int | None) -> float:
    """The PostgreSQL server's CPU seconds: the postmaster, its live children, and its exited ones."""
    if postmaster is None:
        return 0.0
    total = cpu_seconds(postmaster, children=True)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def postmaster_pid() -> int | None:
    """The server's postmaster, where it runs on this host and its data directory is readable."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        directory = Path(cursor.fetchone()[0])
    try:
        return int((directory / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError):
        return None


# -- sampling ----------------------------------------------------------------


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def sample_database(start: float, end: float) -> dict[str, Any]:
    """What the database says of the window [start, end) (epoch seconds) and of its tables now."""
    from django.db import connection

    window = [_utc(start), _utc(end)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'failed') "
            f"FROM {TABLE} WHERE state IN ('done', 'failed', 'cancelled') "
            "AND finished_at >= %s AND finished_at < %s",
            window,
        )
        done, failed = cursor.fetchone()
        cursor.execute(
            "SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP "
            "(ORDER BY extract(epoch FROM started_at - run_after)), "
            f"max(extract(epoch FROM started_at - run_after)) FROM {TABLE} "
            "WHERE started_at >= %s AND started_at < %s",
            window,
        )
        started, quantiles, worst = cursor.fetchone()
        cursor.execute(f"SELECT state, count(*) FROM {TABLE} GROUP BY state")
        rows = dict(cursor.fetchall())
        cursor.execute(
            f"SELECT count(*) FROM {TABLE} WHERE state = 'queued' AND run_after <= clock_timestamp()"
        )
        (due,) = cursor.fetchone()
        cursor.execute(
            "SELECT pg_relation_size(%s), pg_indexes_size(%s), pg_total_relation_size(%s)",
            [TABLE, TABLE, TABLE],
        )
        heap, indexes, total = cursor.fetchone()
        cursor.execute(
            "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes "
            "WHERE relname = %s ORDER BY 1",
            [TABLE],
        )
        index_sizes = dict(cursor.fetchall())
        cursor.execute(
            "SELECT relname, n_live_tup, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, "
            "autovacuum_count, autoanalyze_count, vacuum_count, "
            "extract(epoch FROM last_autovacuum), extract(epoch FROM last_autoanalyze), "
            "pg_total_relation_size(relid) "
            "FROM pg_stat_user_tables WHERE relname LIKE 'vellum%%' ORDER BY relname"
        )
        keys = (
            "live", "dead", "inserted", "updated", "hot_updated", "deleted", "autovacuums",
            "autoanalyzes", "vacuums", "last_autovacuum", "last_autoanalyze", "total_bytes",
        )  # fmt: skip
        tables = {
            name: {
                key: (float(v) if v is not None and key.startswith("last") else v)
                for key, v in zip(keys, values, strict=True)
            }
            for name, *values in cursor.fetchall()
        }
    quantiles = quantiles or [None, None, None]
    return {
        "done": done,
        "failed": failed,
        "started": started,
        "claim_p50_ms": None if quantiles[0] is None else quantiles[0] * 1000,
        "claim_p95_ms": None if quantiles[1] is None else quantiles[1] * 1000,
        "claim_p99_ms": None if quantiles[2] is None else quantiles[2] * 1000,
        "claim_max_ms": None if worst is None else float(worst) * 1000,
        "due_backlog": due,
        "rows": rows,
        "heap_bytes": heap,
        "indexes_bytes": indexes,
        "total_bytes": total,
        "index_bytes": index_sizes,
        "tables": tables,
    }


class Sampler:
    """Takes a sample at each period's end; keeps the CPU counters between samples."""

    def __init__(self, period: float, producer: int, workers: list[int], postmaster: int | None) -> None:
        self.period = period
        self.producer = producer
        self.workers = workers
        self.postmaster = postmaster
        self.samples: list[dict[str, Any]] = []
        self.sent = 0
        self.cpu = self._cpu()

    def _cpu(self) -> dict[str, float]:
        return {
            "producer": cpu_seconds(self.producer),
            "workers": sum(cpu_seconds(pid, children=True) for pid in self.workers),
            "server": server_cpu(self.postmaster),
            "sampler": time.process_time(),
        }

    def take(self, minute: int, start: float, end: float, sent: int) -> dict[str, Any]:
        cpu = self._cpu()
        sample = sample_database(start, end)
        elapsed = end - start
        now = sample["tables"].get(TABLE, {})
        before = self.samples[-1]["tables"].get(TABLE, {}) if self.samples else {}
        updated = now.get("updated", 0) - before.get("updated", 0)
        hot = now.get("hot_updated", 0) - before.get("hot_updated", 0)
        sample.update(
            minute=minute,
            at=end,
            seconds=elapsed,
            enqueued=sent - self.sent,
            enqueue_rate=(sent - self.sent) / elapsed,
            drain_rate=(sample["done"] + sample["failed"]) / elapsed,
            updates=updated,
            hot_share=hot / updated if updated else None,
            load=os.getloadavg(),
            cpu_share={k: (cpu[k] - self.cpu[k]) / elapsed for k in cpu},
        )
        self.sent = sent
        self.cpu = cpu
        self.samples.append(sample)
        return sample


# -- the checks --------------------------------------------------------------


def windows(samples: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first and last ten minutes' samples (halves of a run shorter than 20 minutes)."""
    size = min(10, len(samples) // 2)
    return samples[:size], samples[-size:]


def mean(values: list[float | None]) -> float:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else float("nan")


def checks(
    args: argparse.Namespace, samples: list[dict[str, Any]], kept: float
) -> list[tuple[str, bool, str]]:
    """(name, passed, what it compared) for each check."""
    first, last = windows(samples)
    per_second = args.rate / 3600
    results = []
    drained = mean([s["drain_rate"] for s in samples])
    results.append(
        ("rate", drained >= 0.9 * per_second,
         f"drained {drained:,.1f} jobs/s over the run, target {per_second:,.1f} (at least 90 %)")
    )  # fmt: skip
    a, b = mean([s["drain_rate"] for s in first]), mean([s["drain_rate"] for s in last])
    results.append(
        ("steady drain", abs(b - a) <= 0.1 * a,
         f"last {len(last)} min {b:,.1f} jobs/s vs first {len(first)} min {a:,.1f} "
         f"({b / a - 1:+.1%}; within 10 %)")
    )  # fmt: skip
    a, b = mean([s["claim_p95_ms"] for s in first]), mean([s["claim_p95_ms"] for s in last])
    results.append(
        ("steady claim", b <= 1.1 * a or b - a <= args.p95_grace_ms,
         f"claim p95 (mean of the minutes') last {b:.1f} ms vs first {a:.1f} ms ({b / a - 1:+.1%}; "
         f"at most +10 % or +{args.p95_grace_ms:g} ms)")
    )  # fmt: skip
    # Not growing at the end: the last ten minutes against the ten before them.
    before = samples[-2 * len(last) : -len(last)]
    a, b = max(s["total_bytes"] for s in before), max(s["total_bytes"] for s in last)
    rows = max(sum(s["rows"].values()) for s in last)
    allowed = args.prefill + per_second * (kept + RETENTION_REST + 120)
    results.append(
        ("bounded", b <= 1.1 * a and rows <= allowed,
         f"largest total size last {len(last)} min {b / MIB:,.1f} MiB vs the {len(before)} min before "
         f"{a / MIB:,.1f} MiB ({b / a - 1:+.1%}; at most +10 %); most rows in the last {len(last)} min "
         f"{rows:,} (retention allows {allowed:,.0f})")
    )  # fmt: skip
    backlog = samples[-1]["due_backlog"]
    results.append(
        ("keeping up", backlog < 10 * per_second,
         f"due backlog at the end {backlog:,} jobs (under 10 s of the rate: {10 * per_second:,.0f})")
    )  # fmt: skip
    return results


# -- output ------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def markdown(samples: list[dict[str, Any]]) -> str:
    lines = [
        "| min | enqueued/s | drained/s | claim p50 / p95 / p99 ms | due backlog | rows | heap MiB | "
        "indexes MiB | total MiB | dead tuples | HOT % | autovacuum / autoanalyze | load 1m | "
        "CPU % workers / server / producer |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for s in samples:
        table = s["tables"].get(TABLE, {})
        hot = "-" if s["hot_share"] is None else f"{s['hot_share']:.0%}"
        cpu = s["cpu_share"]
        cells = [
            str(s["minute"]),
            f"{s['enqueue_rate']:,.1f}",
            f"{s['drain_rate']:,.1f}",
            f"{_ms(s['claim_p50_ms'])} / {_ms(s['claim_p95_ms'])} / {_ms(s['claim_p99_ms'])}",
            f"{s['due_backlog']:,}",
            f"{sum(s['rows'].values()):,}",
            f"{s['heap_bytes'] / MIB:,.1f}",
            f"{s['indexes_bytes'] / MIB:,.1f}",
            f"{s['total_bytes'] / MIB:,.1f}",
            f"{table.get('dead', 0):,}",
            hot,
            f"{table.get('autovacuums', 0)} / {table.get('autoanalyzes', 0)}",
            f"{s['load'][0]:.2f}",
            f"{cpu['workers']:.0%} / {cpu['server']:.0%} / {cpu['producer']:.0%}",
        ]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def write(out: Path, report: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_suffix(".tmp")
    temporary.write_text(json.dumps(report, indent=1, default=str))
    temporary.replace(out)


# -- the run -----------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    server = setup(args)
    from benchmarks.sustained_settings import RETENTION
    from vellum_jobs.conf import parse_duration

    outdir = args.out.parent / f"{args.out.stem}_logs"
    outdir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "arguments": {k: str(v) for k, v in vars(args).items()},
        "started": datetime.now(UTC).isoformat(),
        "cores": os.cpu_count(),
        "load_at_start": os.getloadavg(),
        "server": server,
        "retention": RETENTION,
        "samples": [],
    }
    print(f"server: {server}", flush=True)
    workers = start_workers(args, outdir)
    wait_registered(workers)
    seconds = args.minutes * 60
    context = multiprocessing.get_context("spawn")
    sent, loaded, go = context.Value("q", 0), context.Event(), context.Event()
    producer = context.Process(target=produce, args=(args.rate, seconds, sent, loaded, go), daemon=True)
    producer.start()
    if not loaded.wait(120):
        sys.exit("the producer did not start")
    assert producer.pid is not None
    sampler = Sampler(args.sample, producer.pid, [w.pid for w in workers], postmaster_pid())
    go.set()
    start = time.time()
    try:
        for minute in range(1, int(seconds // args.sample) + 1):
            end = start + minute * args.sample
            time.sleep(max(0.0, end - time.time()))
            sample = sampler.take(minute, end - args.sample, end, sent.value)
            print(
                f"{minute:4d} min  enqueued {sample['enqueue_rate']:6.1f}/s  "
                f"drained {sample['drain_rate']:6.1f}/s  "
                f"claim p95 {_ms(sample['claim_p95_ms'])} ms  backlog {sample['due_backlog']}  "
                f"rows {sum(sample['rows'].values()):,}  total {sample['total_bytes'] / MIB:.1f} MiB  "
                f"dead {sample['tables'].get(TABLE, {}).get('dead', 0):,}  load {sample['load'][0]:.2f}",
                flush=True,
            )
            report["samples"] = sampler.samples
            write(args.out, report)
    finally:
        producer.join(30)
        if producer.is_alive():
            producer.terminate()
        codes = stop_workers(workers)
    kept = max(parse_duration(age) for age in RETENTION.values())
    results = checks(args, sampler.samples, kept)
    report.update(
        finished=datetime.now(UTC).isoformat(),
        worker_exit_codes=codes,
        checks=[{"name": n, "passed": p, "detail": d} for n, p, d in results],
    )
    write(args.out, report)
    print()
    print(markdown(sampler.samples))
    print()
    for name, passed, detail in results:
        print(f"{'PASS' if passed else 'FAIL'}  {name}: {detail}")
    print(f"samples: {args.out}; worker output: {outdir}/")
    return 0 if all(passed for _, passed, _ in results) else 1


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--rate", type=float, default=1_000_000, help="jobs an hour (default 1,000,000)")
    parser.add_argument("--processes", type=int, default=2, help="runjobs processes")
    parser.add_argument("--workers", type=int, default=8, help="threads per runjobs process")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    parser.add_argument(
        "--fillfactor", type=int, default=0, help="the jobs table's fillfactor (default: 100)"
    )
    parser.add_argument(
        "--vacuum-threshold", type=int, default=0,
        help="vacuum the jobs table after this many dead rows (scale factor 0), analyze after five "
        "times as many changed, no cost delay (default: the server's settings)",
    )  # fmt: skip
    parser.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="finished jobs in the table before the run that retention keeps (a longer retention's table)",
    )
    parser.add_argument("--p95-grace-ms", type=float, default=5.0)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/sustained/sustained_postgresql.json"
    )
    args = parser.parse_args()
    sys.exit(run(args))


if __name__ == "__main__":
    main()
