"""Workers behind a real PgBouncer in transaction pooling mode (PostgreSQL only).

Each test's ``runjobs`` processes reach the database through a PgBouncer
this module starts from the OS package, on a free port, with few server
connections handed out round robin: a statement that relied on session
state (a prepared statement, a ``SET``, a session lock, a LISTEN) would
meet another client's server connection and fail, or wait forever.
Without the ``pgbouncer`` binary the module is skipped, except under
``CI=true``, where that is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.support.processes import ROOT, Runjobs, wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.core.models import Job, Worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PgBouncer pools PostgreSQL connections"),
]

INI = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {directory}/userlist.txt
pool_mode = transaction
; A few server connections (all opened by the fixture), each transaction
; handed the next in turn: a statement that leaned on its session would
; meet another one.
default_pool_size = {pool_size}
server_round_robin = 1
max_client_conn = 200
; The test settings send server-side keepalive options, which PgBouncer
; cannot pass on in a startup packet.
ignore_startup_parameters = options
"""

POOL_SIZE = 4


def backend_pid(client: psycopg.Connection) -> int:
    row = client.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")
    if found:
        return found
    message = "no pgbouncer binary: install the OS package (make sysdeps installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {message}", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgBouncer:
    """A PgBouncer process of the test's own, in transaction pooling mode, in front of the test server."""

    def __init__(self, binary: str) -> None:
        settings = connection.settings_dict
        self.port = free_port()
        # Readable by the unprivileged user PgBouncer switches to when started as root.
        self.directory = Path(tempfile.mkdtemp(prefix="vellum-pgbouncer-"))
        self.directory.chmod(0o755)
        ini = self.directory / "pgbouncer.ini"
        ini.write_text(
            INI.format(
                host=settings["HOST"],
                port=settings["PORT"],
                listen_port=self.port,
                pool_size=POOL_SIZE,
                directory=self.directory,
            )
        )
        (self.directory / "userlist.txt").write_text(f'"{settings["USER"]}" ""\n')
        for path in self.directory.iterdir():
            path.chmod(0o644)
        # PgBouncer refuses to run as root; -u drops to a user that can read the files.
        user = ["-u", "nobody"] if os.geteuid() == 0 else []
        self.log = (self.directory / "pgbouncer.log").open("w+")
        self.process = subprocess.Popen([binary, *user, str(ini)], stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self.accepts_connections, what=f"PgBouncer on port {self.port}")
        self.fill_pool()

    def accepts_connections(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"PgBouncer exited with {self.process.returncode}:\n{self.output()}")
        try:
            with self.connect() as client:
                client.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    def fill_pool(self) -> None:
        """Open every server connection of the pool now, so that round robin has them all to turn through."""
        clients = [self.connect() for _ in range(POOL_SIZE)]
        try:
            # Each client in a transaction holds a server connection of its own.
            for client in clients:
                client.execute("BEGIN")
            backends = {backend_pid(client) for client in clients}
            assert len(backends) == POOL_SIZE, backends
            # Committed: a client that leaves in a transaction takes its server connection along.
            for client in clients:
                client.execute("COMMIT")
        finally:
            for client in clients:
                client.close()

    def connect(self) -> psycopg.Connection:
        settings = connection.settings_dict
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            dbname=settings["NAME"],
            user=settings["USER"],
            connect_timeout=2,
            autocommit=True,
        )

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-4000:]

    def env(self, **more: str) -> dict[str, str]:
        """The environment of a process whose ``default`` database goes through this PgBouncer."""
        return {"PGPORT": str(self.port), **more}

    def stop(self) -> None:
        # SIGINT: PgBouncer's safe shutdown waits for clients; SIGTERM does not.
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="module")
def pgbouncer(django_db_setup: None) -> Iterator[PgBouncer]:
    """A PgBouncer in front of the test database (which must exist by then, for its pool)."""
    bouncer = PgBouncer(pgbouncer_binary())
    yield bouncer
    bouncer.stop()


def enqueue_through(bouncer: PgBouncer, code: str, **env: str) -> None:
    """Run ``code`` (Django set up, ``jobs`` imported) in a process whose database is behind ``bouncer``."""
    program = f"from tests.testapp import jobs\n{code}"
    completed = subprocess.run(
        [sys.executable, "-m", "django", "shell", "-c", program],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "VELLUM_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
            **bouncer.env(**env),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


def stop(*workers: Runjobs) -> None:
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.output()[1][-3000:]


def no_errors(*workers: Runjobs) -> None:
    """Nothing a worker logged says a statement failed (the settings log warnings and up)."""
    for worker in workers:
        err = worker.output()[1]
        assert "Error" not in err and "error=" not in err, err[-3000:]


# -- the queue through the pooler -----------------------------------------------------


@pytest.mark.runjobs
def test_a_backlog_enqueued_through_pgbouncer_drains_exactly_once_with_two_processes(pgbouncer):
    env = pgbouncer.env(VELLUM_TEST_LISTEN_DATABASE="false")
    workers = [Runjobs("--workers", "2", env=env) for _ in range(2)]
    try:
        wait_for(lambda: Worker.objects.count() == 2, what="both workers registered")
        # One enqueue per job, and a claim per job or two: each statement runs
        # far more often than psycopg's threshold for preparing it on the server.
        enqueue_through(pgbouncer, "for i in range(60):\n    jobs.sleep.enqueue(0.05, result=str(i))")
        wait_for(lambda: Job.objects.stats()["done"] == 60, timeout=60, what="the backlog drained")
    finally:
        stop(*workers)
    no_errors(*workers)
    runs = list(Execution.objects.values_list("job_id", flat=True))
    assert sorted(runs) == sorted(Job.objects.values_list("pk", flat=True))
    assert set(Execution.objects.values_list("pid", flat=True)) == {w.pid for w in workers}


@pytest.mark.runjobs
def test_a_job_longer_than_its_lease_keeps_it_and_records_its_outcome_once(pgbouncer):
    # A runjobs process's LEASE is 3 s here: only renewals through the pooler keep
    # the job; had one failed, the heartbeat would requeue it as lost.
    job = jobs.sleep.enqueue(5, result="outlived its lease")
    worker = Runjobs("--workers", "1", "--burst", env=pgbouncer.env(VELLUM_TEST_LISTEN_DATABASE="false"))
    assert worker.wait(60) == 0, worker.output()[1][-3000:]
    no_errors(worker)
    job.refresh_from_db()
    assert (job.state, job.result, job.attempts) == (Job.State.DONE, "outlived its lease", 1)
    assert job.finished_at - job.started_at > timedelta(seconds=5)
    assert Execution.objects.filter(job_id=job.pk).count() == 1


@pytest.mark.runjobs
def test_the_job_of_a_killed_worker_is_recovered_and_run_by_another(pgbouncer, tmp_path):
    release = tmp_path / "release"
    job = jobs.sleep.enqueue(60, release_file=str(release))
    env = pgbouncer.env(VELLUM_TEST_LISTEN_DATABASE="false")
    lost = Runjobs("--workers", "1", env=env)
    wait_for(lambda: Execution.objects.filter(job_id=job.pk).exists(), what="the first run")
    lost.kill()
    release.touch()
    rescuer = Runjobs("--workers", "1", env=env)
    try:
        wait_for(lambda: Job.objects.get(pk=job.pk).state == Job.State.DONE, what="the rerun")
    finally:
        stop(rescuer)
    job.refresh_from_db()
    assert (job.attempts, job.result) == (2, "slept")
    assert [e.pid for e in Execution.objects.filter(job_id=job.pk).order_by("pk")] == [lost.pid, rescuer.pid]


def test_server_side_binding_works_through_pgbouncer_as_django_leaves_prepared_statements_off(pgbouncer):
    # Django connects with psycopg's prepare_threshold=None unless OPTIONS
    # sets one; with server-side binding too, no statement is prepared.
    options = json.dumps({"server_side_binding": True})
    enqueue_through(
        pgbouncer, "for i in range(30):\n    jobs.record.enqueue(i)", VELLUM_TEST_PG_OPTIONS=options
    )
    env = pgbouncer.env(VELLUM_TEST_LISTEN_DATABASE="false", VELLUM_TEST_PG_OPTIONS=options)
    worker = Runjobs("--workers", "2", "--burst", env=env)
    assert worker.wait(120) == 0, worker.output()[1][-3000:]
    no_errors(worker)
    assert Job.objects.stats()["done"] == 30


def test_this_pgbouncer_breaks_what_leans_on_a_session(pgbouncer):
    """The proof that the tests above would catch it: a prepared statement meets another server connection."""
    with pgbouncer.connect() as client:
        client.execute("PREPARE probe AS SELECT 1")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            for _ in range(POOL_SIZE):
                client.execute("EXECUTE probe")


# -- wakeups ---------------------------------------------------------------------------


def listening(application_name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND query LIKE 'LISTEN%%'",
            [application_name],
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.runjobs
def test_with_a_direct_listen_database_a_new_job_is_picked_up_long_before_the_poll(pgbouncer):
    name = f"vellum-listen-{uuid.uuid4().hex[:12]}"
    env = pgbouncer.env(
        VELLUM_TEST_DIRECT_PORT=str(connection.settings_dict["PORT"]),
        VELLUM_TEST_LISTEN_DATABASE='"direct"',
        VELLUM_TEST_POLL="60s",
        VELLUM_TEST_APPLICATION_NAME=name,
        VELLUM_LOG_LEVEL="INFO",
    )
    worker = Runjobs("--workers", "1", env=env)
    try:
        wait_for(lambda: "wakeup=LISTEN/NOTIFY on 'direct'" in worker.output()[1], what="the worker started")
        wait_for(lambda: listening(name), what="the worker's LISTEN")
        enqueue_through(pgbouncer, "jobs.record.enqueue('now')")
        job = wait_for(lambda: Job.objects.filter(state=Job.State.DONE).first(), what="the job done")
    finally:
        stop(worker)
    no_errors(worker)
    assert job.started_at - job.created_at < timedelta(seconds=5)


@pytest.mark.runjobs
def test_with_listen_database_false_workers_poll_and_jobs_still_run(pgbouncer):
    env = pgbouncer.env(VELLUM_TEST_LISTEN_DATABASE="false", VELLUM_TEST_POLL="0.5s", VELLUM_LOG_LEVEL="INFO")
    worker = Runjobs("--workers", "1", env=env)
    try:
        wait_for(lambda: "wakeup=polling" in worker.output()[1], what="the worker to start polling")
        enqueue_through(pgbouncer, "jobs.record.enqueue('polled')")
        wait_for(lambda: Job.objects.filter(state=Job.State.DONE).exists(), what="the job done")
    finally:
        stop(worker)
    assert Job.objects.get().result == "polled"
