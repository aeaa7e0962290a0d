"""How fast the job admin answers on a million jobs (or ten): the list, each filter, search, a far
page, the dashboard, and a scrape of the metrics view.

    .venv/bin/python benchmarks/admin_changelist.py --database sqlite
    .venv/bin/python benchmarks/admin_changelist.py --database postgresql --rows 10000000
    .venv/bin/python benchmarks/admin_changelist.py --database mariadb --rows 200000

The first run fills a scratch database of its own (``vellum_bench_admin`` on
the server, ``benchmarks/results/vellum_bench_admin.sqlite3`` for SQLite) with
bulk inserts, and later runs reuse it while it holds ``--rows`` jobs. Each
page is requested through Django's test client as a logged-in superuser, so
the figure includes the queries, the template and the middleware: a warm-up,
then the median and the slowest of ``--repeat`` requests, and the median
time spent in SQL (the rest is Python: the view and the template). A table goes to
stdout and JSON to ``benchmarks/results/admin_<database>.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NAME = "vellum_bench_admin"
BUDGET = 0.5  # seconds a page may take
# The dashboard refreshes itself every few seconds: it must answer sooner.
BUDGETS = {"dashboard": 0.3, "dashboard figures (its refresh)": 0.3, "Prometheus metrics": 0.5}

# The jobs of a media library that has been busy for a while: mostly done,
# a few percent failed or cancelled, a backlog queued (part of it delayed),
# a few running with progress; one rare name and one rare queue.
NAMES = ["scan", "index_item", "fetch_artwork", "thumbnail", "transcode", "send_report", "sync", "cleanup"]
QUEUES = ["default", "media", "media", "default"]
RARE_NAME, RARE_QUEUE = "rebuild_index", "slow"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/vellum_jobs/executor.py", line 88, in run\n'
    "    value = function(*job.args, **job.kwargs)\n"
    '  File "/srv/app/library/jobs.py", line 61, in fetch_artwork\n'
    "    raise TimeoutError(f'cover art server did not answer for {item.path}')\n"
    "TimeoutError: cover art server did not answer for /music/album-{n}/track.flac\n"
)


def configure(database: str) -> None:
    from django.conf import settings

    if database == "sqlite":
        RESULTS.mkdir(parents=True, exist_ok=True)
        db = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(RESULTS / f"{NAME}.sqlite3"),
            "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"},
        }
    elif database == "postgresql":
        db = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": NAME,
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
        }
    else:
        db = {
            "ENGINE": "django.db.backends.mysql",
            "NAME": NAME,
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
        }
    settings.configure(
        DATABASES={"default": db},
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "vellum_jobs",
            "example_project.library",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        ROOT_URLCONF="tests.urls",
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        SECRET_KEY="benchmark",
        USE_TZ=True,
        ALLOWED_HOSTS=["testserver"],
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        STATIC_URL="/static/",
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
    )


def create_database(database: str) -> None:
    """Create the scratch database on the server if it is not there yet."""
    if database == "postgresql":
        import psycopg

        with psycopg.connect(
            dbname="postgres",
            user=os.environ.get("PGUSER", "postgres"),
            host=os.environ.get("PGHOST", "127.0.0.1"),
            port=int(os.environ.get("PGPORT", "5432")),
            autocommit=True,
        ) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [NAME]).fetchone():
                conn.execute(f'CREATE DATABASE "{NAME}"')
    elif database == "mariadb":
        import MySQLdb

        conn = MySQLdb.connect(
            host=os.environ.get("MYSQL_HOST", "127.0.0.1"),
            port=int(os.environ.get("MYSQL_PORT", "3306")),
            user=os.environ.get("MYSQL_USER", "root"),
            password=os.environ.get("MYSQL_PASSWORD", ""),
        )
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{NAME}` CHARACTER SET utf8mb4")
        conn.close()


def fill(rows: int, batch: int = 20_000) -> None:
    """Replace the job table's rows with ``rows`` generated jobs, in bulk inserts of ``batch``.

    The rows are written as plain tuples (``COPY`` on PostgreSQL, ``executemany``
    elsewhere) rather than through ``Job`` instances and ``bulk_create``: ten
    million jobs then take minutes, not hours.
    """
    from django.contrib.contenttypes.models import ContentType
    from django.core.management.color import no_style
    from django.db import connection, transaction
    from django.utils import timezone

    from example_project.library.models import Library
    from vellum_jobs.core.models import Job

    with connection.cursor() as cursor:  # a DELETE of ten million rows would take longer than the fill
        for sql in connection.ops.sql_flush(no_style(), [Job._meta.db_table], allow_cascade=True):
            cursor.execute(sql)
    Library.objects.all().delete()
    libraries = Library.objects.bulk_create(
        Library(name=f"Library {i}", path=f"/srv/media/{i}") for i in range(200)
    )
    library_type = ContentType.objects.get_for_model(Library).pk
    columns, rows_of = _row_maker(connection)
    generated = _jobs(rows, timezone.now(), [library.pk for library in libraries], library_type)
    started = time.monotonic()
    done = 0
    while chunk := list(itertools.islice(generated, batch)):
        with transaction.atomic():
            _insert(connection, columns, [rows_of(values) for values in chunk])
        done += len(chunk)
        if done % 500_000 == 0 or done == rows:
            print(f"  {done:>10,} rows  {time.monotonic() - started:6.1f} s", flush=True)
    # Statistics for the planner, as autovacuum or a nightly ANALYZE would keep them.
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {Job._meta.db_table}")
            cursor.fetchall()
        else:
            cursor.execute(f"ANALYZE {Job._meta.db_table}")
        if connection.vendor == "postgresql":
            cursor.execute(f"VACUUM {Job._meta.db_table}")


def _jobs(rows: int, now: datetime, libraries: list[int], library_type: int) -> Iterator[dict[str, Any]]:
    """The columns of each generated job that are not the model's defaults, oldest first."""
    rng = random.Random(7)
    start = now - timedelta(days=30)
    step = timedelta(days=30) / rows
    recent = rows - min(20_000, rows // 50)
    for i in range(rows):
        created = start + step * i
        library = libraries[i % len(libraries)]
        roll = rng.random()
        if i >= recent and roll < 0.5:
            state = "queued"
        elif i >= rows - 60 and roll < 0.9:
            state = "running"
        elif roll < 0.02:
            state = "failed"
        elif roll < 0.03:
            state = "cancelled"
        else:
            state = "done"
        job: dict[str, Any] = {
            "name": RARE_NAME if i % 200_000 == 100 else NAMES[i % len(NAMES)],
            "queue": RARE_QUEUE if i % 10_000 == 5 else QUEUES[i % len(QUEUES)],
            "priority": rng.choice((0, 0, 0, 5, -5)),
            "args": [i],
            "kwargs": {"library_id": library},
            "state": state,
            "attempts": 1,
            "max_attempts": 5,
            "created_at": created,
            "run_after": created,
            "ref_id": str(library) if i % 2 else "",
            "ref_type_id": library_type if i % 2 else None,
        }
        if state == "queued":
            job["attempts"] = 0
            if roll < 0.25:
                job["run_after"] = now + timedelta(minutes=rng.randint(1, 600))
        elif state == "running":
            job["started_at"] = now - timedelta(seconds=rng.randint(1, 300))
            job["progress_done"], job["progress_total"] = rng.randint(0, 100), 100
            job["progress_message"] = f"scanned folder {i}"
        else:
            job["started_at"] = created + timedelta(seconds=1)
            job["finished_at"] = created + timedelta(seconds=1 + rng.random() * 30)
            if state == "done":
                job["result"] = {"files": i % 500, "bytes": i * 1024}
            elif state == "failed":
                job["attempts"] = 5
                job["error"] = TRACEBACK.replace("{n}", str(i))
        yield job


def _row_maker(connection: Any) -> tuple[list[str], Callable[[dict[str, Any]], tuple[Any, ...]]]:
    """The job table's columns (but the id), and a function from a generated job to its row of
    database values: the model's default, prepared once, wherever the job leaves a column out."""
    from vellum_jobs.core.models import Job

    fields = [field for field in Job._meta.concrete_fields if not field.primary_key]
    defaults = [field.get_db_prep_save(field.get_default(), connection) for field in fields]
    adapt_datetime = connection.ops.adapt_datetimefield_value
    json_columns = {"args", "kwargs", "result"}
    time_columns = {"created_at", "run_after", "started_at", "finished_at"}

    def row(job: dict[str, Any]) -> tuple[Any, ...]:
        values = []
        for field, default in zip(fields, defaults, strict=True):
            name = field.attname
            if name not in job:
                values.append(default)
            elif name in json_columns:
                values.append(json.dumps(job[name]))
            elif name in time_columns:
                values.append(adapt_datetime(job[name]))
            else:
                values.append(job[name])
        return tuple(values)

    return [str(field.column) for field in fields], row


def _insert(connection: Any, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
    from vellum_jobs.core.models import Job

    table, quoted = Job._meta.db_table, ", ".join(connection.ops.quote_name(c) for c in columns)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.copy(f"COPY {table} ({quoted}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            placeholders = ", ".join(["%s"] * len(columns))
            cursor.executemany(f"INSERT INTO {table} ({quoted}) VALUES ({placeholders})", rows)


def fill_minutes() -> None:
    """A day of per-minute figures for each queue and each name, up to now, as busy workers' heartbeats
    leave them."""
    from django.utils import timezone

    from vellum_jobs.core.models import QueueMinute
    from vellum_jobs.store import rollup

    QueueMinute.objects.all().delete()
    now = rollup.minute_of(timezone.now())
    rng = random.Random(11)
    QueueMinute.objects.bulk_create(
        QueueMinute(
            minute=now - timedelta(minutes=m),
            queue=queue,
            done=rng.randint(200, 900),
            failed=rng.randint(0, 12),
            retried=rng.randint(0, 30),
            oldest_due_age=rng.random() * 40,
        )
        for m in range(24 * 60 + 1)
        for queue in (*sorted(set(QUEUES)), RARE_QUEUE)
    )
    fill_name_minutes(now, rng)


def fill_name_minutes(now: datetime, rng: random.Random) -> None:
    """A day of per-minute figures for each job name, with both histograms, as the heartbeats leave them."""
    from vellum_jobs.core.models import NameMinute
    from vellum_jobs.store import name_rollup

    NameMinute.objects.all().delete()
    rows = []
    for m in range(24 * 60 + 1):
        for name in (*NAMES, RARE_NAME):
            done = rng.randint(50, 300)
            minute = now - timedelta(minutes=m)
            row = NameMinute(minute=minute, name=name, done=done, failed=rng.randint(0, 3))
            for field in (*name_rollup.DURATIONS[:8], *name_rollup.WAITS[:6]):
                setattr(row, field, rng.randint(0, done // 4))
            row.duration_sum, row.wait_sum = done * 0.4, done * 0.1
            rows.append(row)
    NameMinute.objects.bulk_create(rows, batch_size=2000)


def cases() -> list[tuple[str, str, dict[str, str]]]:
    """(label, path, query) of every page measured."""
    from django.db.models import Max, Min

    from vellum_jobs.core.models import Job

    ids = Job.objects.aggregate(first=Min("id"), last=Max("id"))
    newest, middle = ids["last"], (ids["first"] + ids["last"]) // 2
    jobs, workers = "/admin/vellum_jobs/job/", "/admin/vellum_jobs/worker/"
    return [
        ("list, newest first", jobs, {}),
        ("filter state=queued", jobs, {"state__exact": "queued"}),
        ("filter state=running", jobs, {"state__exact": "running"}),
        ("filter state=done", jobs, {"state__exact": "done"}),
        ("filter state=failed", jobs, {"state__exact": "failed"}),
        ("filter state=cancelled", jobs, {"state__exact": "cancelled"}),
        ("filter name=scan", jobs, {"name": "scan"}),
        (f"filter name={RARE_NAME} (5 rows)", jobs, {"name": RARE_NAME}),
        ("filter queue=media", jobs, {"queue": "media"}),
        (f"filter queue={RARE_QUEUE} (100 rows)", jobs, {"queue": RARE_QUEUE}),
        (
            "filter state=failed + name=fetch_artwork",
            jobs,
            {"state__exact": "failed", "name": "fetch_artwork"},
        ),
        ("waiting to retry", jobs, {"retrying": "yes"}),
        ("failures grouped by error", f"{jobs}failures/", {"of": "failed"}),
        ("search by id", jobs, {"q": str(middle)}),
        ("search text 'TimeoutError'", jobs, {"q": "TimeoutError"}),
        (f"search text '{RARE_NAME}' (the newest 100,000)", jobs, {"q": RARE_NAME}),
        (f"search all jobs for '{RARE_NAME}' (scans all)", jobs, {"q": RARE_NAME, "search_all": "1"}),
        ("page 50", jobs, {"p": "50"}),
        ("page 1000 (row 100,000)", jobs, {"p": "1000"}),
        ("job page", f"{jobs}{newest}/change/", {}),
        ("job page's progress (its refresh)", f"{jobs}{newest}/progress/", {}),
        ("worker list", workers, {}),
        ("dashboard", f"{jobs}dashboard/", {}),
        ("dashboard figures (its refresh)", f"{jobs}dashboard/", {"body": "1"}),
        ("Prometheus metrics", "/jobs/metrics/", {}),
    ]


def measure(repeat: int) -> list[dict[str, object]]:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", password="bench"
    )
    client = Client()
    client.force_login(user)
    figures = []
    for label, path, query in cases():
        client.get(path, query)  # warm-up: connection, templates, the database's cache
        times, sql = [], []
        for _ in range(repeat):
            with CaptureQueriesContext(connection) as captured:
                started = time.perf_counter()
                response = client.get(path, query)
                times.append(time.perf_counter() - started)
            sql.append(sum(float(q["time"]) for q in captured.captured_queries))
            assert response.status_code == 200, (label, response.status_code)
        median, slowest, median_sql = statistics.median(times), max(times), statistics.median(sql)
        figures.append(
            {
                "page": label,
                "query": query,
                "median_s": round(median, 4),
                "max_s": round(slowest, 4),
                "sql_median_s": round(median_sql, 4),
                "queries": len(captured),
            }
        )
        print(
            f"  {label:<44} {median * 1000:8.1f} ms  max {slowest * 1000:8.1f} ms  "
            f"SQL {median_sql * 1000:7.1f} ms  {len(captured):3d} queries",
            flush=True,
        )
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database", choices=["sqlite", "postgresql", "mariadb"], default="sqlite")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rebuild", action="store_true", help="refill the table even if it has --rows jobs")
    options = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    create_database(options.database)
    configure(options.database)
    import django
    from django.core.management import call_command

    django.setup()
    from django.db import connection

    from vellum_jobs.core.models import Job

    call_command("migrate", verbosity=0)
    if options.rebuild or Job.objects.count() != options.rows:
        print(f"filling {options.database} with {options.rows:,} jobs")
        fill(options.rows)
    print(
        f"{options.database} ({connection.display_name}), {options.rows:,} jobs, "
        f"Django {django.get_version()}, median of {options.repeat}:"
    )
    started = time.perf_counter()
    states = Job.objects.stats()
    print(
        f"  Job.objects.stats() (exact, every row): {(time.perf_counter() - started) * 1000:.0f} ms {states}"
    )
    fill_minutes()
    figures = measure(options.repeat)
    slow = [
        str(f["page"])
        for f in figures
        if float(str(f["median_s"])) > BUDGETS.get(str(f["page"]), BUDGET) and "scans" not in str(f["page"])
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {
        "database": options.database,
        "rows": options.rows,
        "django": django.get_version(),
        "pages": figures,
    }
    (RESULTS / f"admin_{options.database}.json").write_text(json.dumps(report, indent=2))
    if slow:
        print(f"over budget: {', '.join(slow)}")
        return 1
    dashboard = BUDGETS["dashboard"]
    print(f"every page but a search of all jobs under {BUDGET} s, the dashboard under {dashboard} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
