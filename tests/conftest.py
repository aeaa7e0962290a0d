"""Shared fixtures, hypothesis profiles, and an unreachable database: a loud skip, or under CI an error."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from django.core.management.color import no_style
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import TransactionTestCase
from hypothesis import HealthCheck, settings

from tests.support.docs_examples import DocumentExamples
from tests.support.serverlock import ServerLock, restarts_server

# Every example runs against the real database, so a few by default, many
# under `make stress` (VELLUM_HYPOTHESIS_PROFILE=stress). No deadline: a
# database's pauses are not the code's slowness.
settings.register_profile(
    "tests",
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("stress", settings.get_profile("tests"), max_examples=1000, stateful_step_count=50)
HYPOTHESIS_PROFILE = os.environ.get("VELLUM_HYPOTHESIS_PROFILE", "tests")
settings.load_profile(HYPOTHESIS_PROFILE)


# The modules that test an optional extra, by the package they need. The bare
# install's cell (tox.ini) has none of them; every other cell has them all.
NEEDS = {
    "execution/test_tracing.py": "opentelemetry",
    "support/spanfile.py": "opentelemetry",
    "observe/test_metrics.py": "prometheus_client",
    "observe/test_limit_metrics.py": "prometheus_client",
    "worker/test_pgbouncer.py": "psycopg",
}
collect_ignore = [module for module, package in NEEDS.items() if importlib.util.find_spec(package) is None]
_missing = [module for module in NEEDS if not (Path(__file__).parent / module).exists()]
assert not _missing, f"tests/conftest.py NEEDS names modules that are not there: {_missing}"


# After each transactional test Django empties every table with `flush`, then
# sends post_migrate, which recreates the content types and permissions it
# has just deleted: a few dozen statements per test, most of a PostgreSQL or
# MariaDB cell's time. Those two tables hold only what the migrations put
# there, so they are kept, and nothing needs recreating. Of the others only
# the ones a test wrote to are emptied: PostgreSQL's TRUNCATE makes new files
# for each table it empties, 90 ms for all twenty, where asking which have a
# row takes one statement.
KEPT_TABLES = {"django_content_type", "auth_permission"}


def _empty_tables(self: TransactionTestCase) -> None:
    for alias in self._databases_names(include_mirrors=False):  # type: ignore[attr-defined]
        db = connections[alias]
        tables = db.introspection.django_table_names(only_existing=True, include_views=False)
        written = _with_rows(db, [table for table in tables if table not in KEPT_TABLES])
        if written:
            db.ops.execute_sql_flush(db.ops.sql_flush(no_style(), written, allow_cascade=True))


def _with_rows(db: BaseDatabaseWrapper, tables: list[str]) -> list[str]:
    """Those of ``tables`` that hold a row, asked in one statement."""
    if not tables:
        return []
    exists = ", ".join(f"EXISTS (SELECT 1 FROM {db.ops.quote_name(table)})" for table in tables)
    with db.cursor() as cursor:
        cursor.execute(f"SELECT {exists}")
        found = cursor.fetchone()
    return [table for table, has_rows in zip(tables, found, strict=True) if has_rows]


TransactionTestCase._fixture_teardown = _empty_tables  # type: ignore[attr-defined]


# The slow tests (marked `slow`: real processes waiting out leases and faults,
# the lifecycle model's many examples, the whole-system run) test the queue's
# timing, not the interpreter's or Django's, and the ones marked `runjobs`
# test a runjobs process's life (its signals, exit codes, output and waits)
# through code that the in-process tests run in every cell. So `make test`
# runs each of them once per database, sharing them between its two Python x
# Django pairs by directory (or module) so that both pairs' cells take about
# as long: tox sets VELLUM_SLOW_SHARE to "oldest" or "newest". Unset, a run
# has them all.
SLOW_IN_OLDEST_PAIR = {
    "core",
    "enqueueing",
    "execution/test_async.py",  # not test_tracing.py: the oldest SQLite cell has no OpenTelemetry
    "maintenance",
    "observe",
    "store",
    "system",
    "worker/test_partition.py",
    "worker/test_runjobs.py",
}
SHARED_MARKERS = ("slow", "runjobs")
SLOW_SHARE = os.environ.get("VELLUM_SLOW_SHARE", "")
assert SLOW_SHARE in {"", "oldest", "newest"}, f"VELLUM_SLOW_SHARE={SLOW_SHARE!r}: oldest, newest or unset"
_absent = [name for name in SLOW_IN_OLDEST_PAIR if not (Path(__file__).parent / name).exists()]
assert not _absent, f"tests/conftest.py SLOW_IN_OLDEST_PAIR names paths that are not there: {_absent}"


def _in_this_share(item: pytest.Item) -> bool:
    if not SLOW_SHARE or not any(item.get_closest_marker(name) for name in SHARED_MARKERS):
        return True
    path = item.path.relative_to(Path(__file__).parent).as_posix()
    oldest = any(path == name or path.startswith(f"{name}/") for name in SLOW_IN_OLDEST_PAIR)
    return oldest == (SLOW_SHARE == "oldest")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept: list[pytest.Item] = []
    left: list[pytest.Item] = []
    for item in items:
        (kept if _in_this_share(item) else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


def pytest_report_header() -> list[str]:
    lines = [
        f"vellum-jobs test database: {os.environ.get('VELLUM_TEST_DB', 'sqlite')}",
        f"hypothesis profile: {HYPOTHESIS_PROFILE}",
    ]
    if SLOW_SHARE:
        lines.append(f"slow tests: the {SLOW_SHARE} pair's share (VELLUM_SLOW_SHARE)")
    if collect_ignore:
        lines.append(f"not installed, so not collected: {', '.join(collect_ignore)}")
    return lines


@pytest.fixture(scope="session", autouse=True)
def database_reachable(django_db_blocker):
    """Runs before the test database is created: is the server there at all?"""
    with django_db_blocker.unblock():
        try:
            connection.ensure_connection()
        except Exception as exc:  # noqa: BLE001 - any failure to connect means the server is not there
            settings = connection.settings_dict
            host = settings.get("HOST") or settings["NAME"]
            where = f"{connection.vendor} at {host}:{settings.get('PORT', '')}"
            banner = f"\n{'!' * 72}\n  DATABASE UNREACHABLE: {where}\n  {exc}\n{'!' * 72}\n"
            sys.__stderr__.write(banner)
            if os.environ.get("CI") == "true":
                pytest.exit(
                    f"CI=true: an unreachable database ({where}) is a failure, not a skip", returncode=3
                )
            pytest.exit(f"SKIPPED every {connection.vendor} test: {where} is unreachable", returncode=0)
        finally:
            connection.close()


SERVER_LOCK = ServerLock()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Each test, setup to teardown, under its database server's lock (see tests/support/serverlock.py)."""
    SERVER_LOCK.hold(exclusive=restarts_server(item))
    try:
        return (yield)
    finally:
        SERVER_LOCK.after(item, nextitem)


@pytest.fixture
def vendor() -> str:
    return connection.vendor


@pytest.fixture(autouse=True)
def own_clock():
    """Each test starts on the process's own clock: a worker started in-process measures its offset."""
    from vellum_jobs.core import clock

    clock.forget()
    yield
    clock.forget()


@pytest.fixture
def measured_clock() -> None:
    """This process measured the database's clock within the minute, as a busy one has (``clock.of``):
    for tests that count the statements of an enqueue or a page."""
    from vellum_jobs.core import clock

    clock.of(connection.alias)


@pytest.fixture(autouse=True)
def background_workers_stop():
    """A worker a failed test started in a thread of this process stops with the test."""
    from tests.support.workers import stop_leftovers

    yield
    stop_leftovers()


@pytest.fixture
def short_lease(settings) -> None:
    """The runjobs subprocesses' 3 s lease for a worker in the test process, for a test about
    leases that lapse in real time (the test process's own default is a minute: tests/settings.py)."""
    from tests.support.processes import SHORT_LEASE

    settings.VELLUM_JOBS = {**settings.VELLUM_JOBS, "LEASE": f"{SHORT_LEASE}s"}


@pytest.fixture
def staff(client):
    """The test client, logged in as staff with the *view job* permission (the health and metrics views')."""
    from tests.support.admin_pages import staff_user

    client.force_login(staff_user("view_job"))
    return client


def pytest_pycollect_makeitem(collector: pytest.Module | pytest.Class, name: str, obj: object):
    """A test module's ``DocumentExamples`` becomes one test per Python block of its documents."""
    if isinstance(obj, DocumentExamples):
        return obj.collect(collector)
    return None
