"""Rolling deploys: old and new code side by side.

A worker claims only the names it knows, so a worker of older code leaves a
new kind of job queued for the workers that have it. A job whose name no
live worker knows is failed, with the reason, only once none has known the
name for ``UNKNOWN_NAME_TIMEOUT``, counted while some worker is alive: the
tests of that drive the clock themselves (``now`` passed in).
"""

from __future__ import annotations

import math
import signal
import uuid
from datetime import datetime, timedelta

import django
import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from tests.support.processes import REAL_LEASE, Runjobs, beats, wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.conf import conf
from vellum_jobs.core import clock, registry
from vellum_jobs.core.models import Job, QueueMinute, UnknownName, Worker
from vellum_jobs.maintenance import unknown_names
from vellum_jobs.observe.explain import explain
from vellum_jobs.store import rollup
from vellum_jobs.worker import heartbeat
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

pytestmark = pytest.mark.django_db

# A runjobs of the code before ``test.new_kind`` was added (tests/testapp/jobs.py).
OLD_CODE = {"VELLUM_TEST_OLD_CODE": "1"}

# -- old and new workers side by side: real runjobs processes ------------------


def stop(worker: Runjobs) -> None:
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_of_old_code_leaves_a_new_kind_of_job_queued_and_a_worker_of_new_code_runs_it():
    new = jobs.new_kind.enqueue("new")
    old_worker = Runjobs("--workers", "1", env={**OLD_CODE, **REAL_LEASE})
    try:
        # It claims and runs the kinds it knows...
        known = jobs.record.enqueue("old")
        wait_for(lambda: Job.objects.get(pk=known.pk).state == Job.State.DONE, what="the old worker's job")
        # ...and, over many claim cycles (it claims at each poll, as often as it beats), not the new one.
        beats(old_worker, 20)
        waiting = Job.objects.get(pk=new.pk)
        assert (waiting.state, waiting.claims, waiting.attempts, waiting.error) == ("queued", 0, 0, "")
        assert "test.new_kind" not in Worker.objects.get(pid=old_worker.pid).names
        (reason,) = waiting.explain()
        assert reason.code == "no_handler"
        waits = "no live worker knows 'test.new_kind', and unless one that does starts, it fails at about"
        assert waits in str(reason)
        new_worker = Runjobs("--workers", "1", env=REAL_LEASE)
        try:
            wait_for(lambda: Job.objects.get(pk=new.pk).state == Job.State.DONE, what="the new kind to run")
        finally:
            stop(new_worker)
    finally:
        stop(old_worker)
    ran = Job.objects.get(pk=new.pk)
    assert (ran.attempts, ran.result, ran.error) == (1, "new", "")
    assert list(Execution.objects.filter(job_id=new.pk).values_list("pid", flat=True)) == [new_worker.pid]


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is new in Django 6.0")
@pytest.mark.django_db(transaction=True)
def test_a_worker_that_cannot_import_a_task_hands_its_job_back_unstarted_and_says_so_in_its_row(
    monkeypatch,
):
    monkeypatch.setattr(registry, "_unresolved", set())
    task = Job.objects.create(name="vanished_module.gone", task_backend="default")
    before = timezone.now()
    assert WorkerProcess(WorkerOptions(threads=1, burst=True)).run() == 0
    job = Job.objects.get(pk=task.pk)
    assert (job.state, job.attempts, job.claims) == ("queued", 0, 1)
    assert job.run_after >= before + timedelta(seconds=conf.heartbeat)
    assert "cannot run 'vanished_module.gone': the task does not import here" in job.error
    assert "No module named 'vanished_module'" in job.error
    assert job.attempt_errors[-1]["outcome"] == "handed back"
    # Its row says so at every heartbeat, so the unknown-name duty counts it as not knowing the task.
    worker = WorkerProcess(WorkerOptions(threads=1))
    heartbeat.register(connection.alias, worker.row)
    worker.heartbeat.beat(clock.now())
    row = Worker.objects.get(pk=worker.id)
    assert row.unknown_tasks == ["vanished_module.gone"]
    assert not row.knows("vanished_module.gone", "default")
    assert row.knows("tests.testapp.tasks.add", "default")


# -- the timeout: one process, a clock the test drives -------------------------

GONE = "gone.kind"  # a name no worker of the test's fleet registers
QUEUE = "rolling"  # the test jobs' own queue, so that their figures are theirs
STEP = unknown_names.INTERVAL


def with_timeout(value: str):
    return override_settings(VELLUM_JOBS={**settings.VELLUM_JOBS, "UNKNOWN_NAME_TIMEOUT": value})


def live_worker(now: datetime, names: list[str] | None = None, **fields) -> Worker:
    return Worker.objects.create(
        id=uuid.uuid4(),
        host="test",
        pid=1,
        threads=1,
        names=registry.names() if names is None else names,
        last_heartbeat=now,
        **fields,
    )


def beat(worker: Worker, now: datetime) -> None:
    """``worker`` is alive at ``now``: its heartbeat."""
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat=now)


class Checks:
    """The duty run by one process on its heartbeat, one ``INTERVAL`` apart: the test's clock."""

    def __init__(self, start: datetime) -> None:
        self.holder = uuid.uuid4()
        self.now = start - STEP  # the first check is at ``start``

    def run(self, worker: Worker, count: int = 1) -> list[int] | None:
        """``count`` checks, ``worker`` beating before each; what the last one failed."""
        failed = None
        for _ in range(count):
            self.now += STEP
            beat(worker, self.now)
            failed = unknown_names.run_if_due(connection.alias, self.holder, self.now)
        return failed


def state(job: Job) -> str:
    return str(Job.objects.get(pk=job.pk).state)


@pytest.fixture
def t0() -> datetime:
    return timezone.now().replace(microsecond=0)


@with_timeout("10m")
def test_a_job_whose_name_no_live_worker_knows_waits_out_the_timeout_then_fails_with_the_reason(t0):
    worker = live_worker(t0)
    job = Job.objects.create(name=GONE, queue=QUEUE, run_after=t0)
    clock = Checks(t0)
    clock.run(worker, 10)  # 9 intervals: 9 minutes unknown
    assert state(job) == "queued"
    assert UnknownName.objects.get(name=GONE).unknown_for == 9 * 60
    rollup.TALLY.take()  # this process's figures so far are not this test's
    assert clock.run(worker) == [job.pk]
    failed = Job.objects.get(pk=job.pk)
    assert (failed.state, failed.attempts, failed.finished_at) == ("failed", 0, clock.now)
    assert failed.error.startswith(
        "no handler registered for 'gone.kind': no live worker has known this name for 10m, "
        "past VELLUM_JOBS['UNKNOWN_NAME_TIMEOUT'] (10m)"
    )
    (entry,) = failed.attempt_errors
    assert (entry["outcome"], entry["attempt"], entry["started_at"]) == ("failed", 0, None)
    assert entry["error"].startswith("no handler registered for 'gone.kind'")
    rollup.flush(connection.alias, clock.now)
    assert QueueMinute.objects.get(queue=QUEUE, minute=rollup.minute_of(clock.now)).failed == 1


@with_timeout("10m")
def test_a_name_that_a_live_worker_knows_is_never_failed_even_if_it_serves_another_queue(t0):
    worker = live_worker(t0, names=[*registry.names(), GONE], queues=["elsewhere"])
    job = Job.objects.create(name=GONE, queue=QUEUE, run_after=t0)
    Checks(t0).run(worker, 120)
    assert state(job) == "queued"
    assert not UnknownName.objects.exists()


@with_timeout("10m")
def test_hours_without_a_live_worker_count_as_at_most_a_few_minutes(t0):
    job = Job.objects.create(name=GONE, queue=QUEUE, run_after=t0)
    worker = live_worker(t0)
    clock = Checks(t0)
    clock.run(worker, 2)
    # The whole fleet is down for five hours; then a worker of old code starts.
    clock.now += timedelta(hours=5)
    clock.run(worker)
    assert state(job) == "queued"
    counted = UnknownName.objects.get(name=GONE).unknown_for
    assert counted == 60 + unknown_names.max_gap() < 10 * 60
    # From then on the time counts again: failed once it reaches the timeout.
    left = math.ceil((10 * 60 - counted) / 60) - 1  # the checks that keep it under
    clock.run(worker, left)
    assert state(job) == "queued"
    clock.run(worker)
    assert state(job) == "failed"


@with_timeout("10m")
def test_the_count_starts_again_when_a_live_worker_knows_the_name(t0):
    job = Job.objects.create(name=GONE, queue=QUEUE, run_after=t0)
    old = live_worker(t0)
    clock = Checks(t0)
    clock.run(old, 9)
    # A worker of new code comes and goes (killed): while it was alive the name was known.
    new = live_worker(clock.now + STEP, names=[GONE])
    clock.run(old)
    assert not UnknownName.objects.exists()
    new.delete()
    clock.run(old, 10)  # 9 minutes unknown again
    assert state(job) == "queued"
    clock.run(old)
    assert state(job) == "failed"


@with_timeout("10m")
def test_a_delayed_job_of_an_unknown_name_is_failed_only_once_it_is_due(t0):
    worker = live_worker(t0)
    due_now = Job.objects.create(name=GONE, queue=QUEUE, run_after=t0)
    later = Job.objects.create(name=GONE, queue=QUEUE, run_after=t0 + timedelta(minutes=15))
    clock = Checks(t0)
    clock.run(worker, 11)
    assert (state(due_now), state(later)) == ("failed", "queued")
    clock.run(worker, 5)
    assert state(later) == "failed"


@with_timeout("10m")
def test_a_django_task_no_live_worker_can_import_is_failed_after_the_timeout(t0):
    imports_it = live_worker(t0, task_backends=["default"], unknown_tasks=[])
    cannot = live_worker(t0, task_backends=["default"], unknown_tasks=["vanished.gone"])
    other_alias = live_worker(t0, task_backends=["other"])
    task = Job.objects.create(name="vanished.gone", task_backend="default", queue=QUEUE, run_after=t0)
    clock = Checks(t0)
    for _ in range(12):
        for worker in (imports_it, other_alias):
            beat(worker, clock.now + STEP)
        clock.run(cannot)
    assert state(task) == "queued"
    assert not UnknownName.objects.exists()
    # The worker that could import it is gone: none of those left can run it.
    imports_it.delete()
    for _ in range(11):
        beat(other_alias, clock.now + STEP)
        clock.run(cannot)
    assert state(task) == "failed"
    assert "no handler registered for 'vanished.gone'" in Job.objects.get(pk=task.pk).error


def test_no_worker_alive_counts_nothing(t0):
    job = Job.objects.create(name=GONE, queue=QUEUE, run_after=t0)
    live_worker(t0 - timedelta(hours=1))  # stale
    assert unknown_names.check(connection.alias, t0) == []
    assert state(job) == "queued"
    assert not UnknownName.objects.exists()


def test_one_process_at_a_time_checks_once_per_interval(t0):
    live_worker(t0)
    Job.objects.create(name=GONE, queue=QUEUE, run_after=t0)
    holder = uuid.uuid4()
    assert unknown_names.run_if_due(connection.alias, holder, t0) == []
    # Another process at the same moment, and this one again before the interval is up: no check.
    assert unknown_names.run_if_due(connection.alias, uuid.uuid4(), t0 + timedelta(seconds=30)) is None
    assert unknown_names.run_if_due(connection.alias, holder, t0 + timedelta(seconds=30)) is None
    assert UnknownName.objects.get(name=GONE).checked_at == t0


@with_timeout("10m")
def test_explain_says_when_a_job_whose_name_no_live_worker_knows_will_fail(t0):
    worker = live_worker(t0)
    job = Job.objects.create(name=GONE, queue=QUEUE, run_after=t0 - timedelta(seconds=1))
    clock = Checks(t0)
    clock.run(worker, 5)  # 4 minutes counted: 6 to go
    (reason,) = explain([Job.objects.get(pk=job.pk)], now=clock.now)[job.pk]
    fails_at = timezone.localtime(clock.now + timedelta(minutes=6)).strftime("%Y-%m-%d %H:%M:%S")
    assert reason.code == "no_handler"
    assert str(reason) == (
        "no live worker serving queue 'rolling' has 'gone.kind' registered (is the code that defines it "
        "deployed to the workers?); no live worker knows 'gone.kind', and unless one that does starts, "
        f"it fails at about {fails_at} (once no live worker has known it for UNKNOWN_NAME_TIMEOUT, 10m)"
    )
