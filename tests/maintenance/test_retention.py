"""Pruning finished jobs in batches, and the automatic retention ``runjobs`` applies."""

from __future__ import annotations

import re
import signal
import threading
import time
import uuid
from datetime import datetime, timedelta

import pytest
from django.db import OperationalError, connection, connections
from django.db.models import signals
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.support.processes import REAL_LEASE, Runjobs, wait_for
from tests.testapp import jobs
from vellum_jobs import batch, chain
from vellum_jobs.conf import RETENTION_STATES
from vellum_jobs.core.models import Job, JobQuerySet, MaintenanceLock
from vellum_jobs.core.workflow_models import Dependency, Workflow
from vellum_jobs.execution.inline import run_due
from vellum_jobs.maintenance import retention, workflow_pruning
from vellum_jobs.store import locks
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

ALIAS = "default"
DAY = timedelta(days=1)


def finished_jobs(count: int, state: str = "done", ago: timedelta = 2 * DAY) -> list[int]:
    at = timezone.now() - ago
    Job.objects.bulk_create(Job(name="test.add", state=state, finished_at=at) for _ in range(count))
    return list(Job.objects.filter(state=state, finished_at=at).values_list("pk", flat=True))


def cutoffs(*states: str, age: timedelta = DAY) -> dict[str, datetime]:
    return dict.fromkeys(states, timezone.now() - age)


@pytest.mark.django_db
def test_prune_deletes_in_batches_of_the_batch_size():
    finished_jobs(7)
    with CaptureQueriesContext(connection) as queries:
        pruned = retention.prune(ALIAS, cutoffs("done"), batch_size=3)
    assert (pruned.counts, pruned.complete) == ({"done": 7}, True)
    deletes = [q["sql"] for q in queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_each_batch_commits_on_its_own(monkeypatch):
    finished_jobs(7)
    seen_by_another_connection = []

    def count_from_another_thread():
        # A thread has its own connection: it sees only committed rows.
        def count():
            seen_by_another_connection.append(Job.objects.count())
            connections.close_all()

        thread = threading.Thread(target=count)
        thread.start()
        thread.join()

    original = retention._delete_batch

    def delete_then_look(rows, batch_size):
        result = original(rows, batch_size)
        count_from_another_thread()
        return result

    monkeypatch.setattr(retention, "_delete_batch", delete_then_look)
    retention.prune(ALIAS, cutoffs("done"), batch_size=3)
    assert seen_by_another_connection == [4, 1, 0]


@pytest.mark.django_db
def test_prune_keeps_jobs_younger_than_their_state_s_cutoff():
    old_done = finished_jobs(2, "done", ago=10 * DAY)
    young_done = finished_jobs(2, "done", ago=3 * DAY)
    old_failed = finished_jobs(2, "failed", ago=10 * DAY)
    cancelled = finished_jobs(2, "cancelled", ago=10 * DAY)
    now = timezone.now()
    pruned = retention.prune(ALIAS, {"done": now - 7 * DAY, "failed": now - 30 * DAY})
    assert pruned.counts == {"done": 2, "failed": 0}
    remaining = set(Job.objects.values_list("pk", flat=True))
    assert remaining == {*young_done, *old_failed, *cancelled}
    assert not remaining & set(old_done)


@pytest.mark.django_db
def test_a_dry_run_counts_without_deleting():
    finished_jobs(5, "failed")
    pruned = retention.prune(ALIAS, cutoffs("failed", "done"), dry_run=True)
    assert pruned.counts == {"failed": 5, "done": 0}
    assert Job.objects.count() == 5


@pytest.mark.django_db
def test_a_passed_deadline_stops_after_one_batch_and_reports_rows_left():
    finished_jobs(5)
    pruned = retention.prune(ALIAS, cutoffs("done", "failed"), batch_size=2, deadline=0)
    assert (pruned.counts, pruned.complete) == ({"done": 2, "failed": 0}, False)
    assert Job.objects.count() == 3


@pytest.mark.django_db
def test_a_deadline_that_passes_on_the_last_batch_still_reports_complete():
    finished_jobs(2)
    pruned = retention.prune(ALIAS, cutoffs("done"), batch_size=2, deadline=0)
    assert (pruned.counts, pruned.complete) == ({"done": 2}, True)


def test_the_states_retention_prunes_are_the_finished_ones():
    assert RETENTION_STATES == Job.FINISHED_STATES


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["queued", "running", "nope"])
def test_prune_refuses_states_that_are_not_finished(state):
    finished_jobs(1, state)
    with pytest.raises(ValueError, match=f"'{state}' jobs cannot be pruned"):
        retention.prune(ALIAS, cutoffs(state))
    assert Job.objects.count() == 1


@pytest.fixture
def delete_receivers():
    """pre_delete and post_delete receivers for Job, as a project may connect: Django then
    deletes by loading the rows, not with one filtered DELETE. The ids each one saw."""
    seen: dict[str, list[int]] = {"pre_delete": [], "post_delete": []}

    def pre(sender, instance, **kwargs):
        seen["pre_delete"].append(instance.pk)

    def post(sender, instance, **kwargs):
        seen["post_delete"].append(instance.pk)

    signals.pre_delete.connect(pre, sender=Job, weak=False)
    signals.post_delete.connect(post, sender=Job, weak=False)
    yield seen
    signals.pre_delete.disconnect(pre, sender=Job)
    signals.post_delete.disconnect(post, sender=Job)


@pytest.mark.django_db
@pytest.mark.parametrize("receivers", [False, True], ids=["filtered_delete", "delete_receivers"])
def test_a_job_retried_between_finding_and_deleting_it_is_not_deleted(receivers, monkeypatch, request):
    seen = request.getfixturevalue("delete_receivers") if receivers else None
    ids = finished_jobs(3, "failed")
    retried = ids[1]
    original = JobQuerySet.delete

    def retry_first(self):
        # Another process retries a job after prune picked its id.
        Job.objects.get(pk=retried).retry()
        return original(self)

    monkeypatch.setattr(JobQuerySet, "delete", retry_first)
    pruned = retention.prune(ALIAS, cutoffs("failed"))
    assert pruned.counts == {"failed": 2}
    assert list(Job.objects.values_list("pk", "state")) == [(retried, "queued")]
    if seen is not None:
        kept = sorted(pk for pk in ids if pk != retried)
        assert {signal: sorted(pks) for signal, pks in seen.items()} == {
            "pre_delete": kept,
            "post_delete": kept,
        }


@pytest.mark.django_db(transaction=True)
def test_a_retry_from_another_connection_while_delete_loads_the_rows_is_never_lost(delete_receivers):
    """Django's delete, with receivers, loads the rows (where ``post_init`` fires) and
    then deletes them by id. A retry that another connection makes in between either
    waits for the batch and finds its job gone (retry() is False), or is made first and
    keeps its job: never True with the job deleted while queued."""
    ids = finished_jobs(3, "failed")
    retried = ids[1]
    # Loaded before the prune: the retrying thread, however late a loaded machine starts it,
    # retries a job it had seen, as an admin page does.
    job = Job.objects.get(pk=retried)
    applied: list[bool] = []
    waited: list[float] = []

    def retry_elsewhere():
        try:
            applied.append(job.retry())
        except Job.DoesNotExist:  # retry() looks the job up again when its UPDATE found none
            applied.append(False)
        finally:
            connections.close_all()

    def while_loading(sender, instance, **kwargs):
        # Once, in this thread: the retrying thread loads the job too.
        if instance.pk != retried or threads or threading.current_thread() is not main:
            return
        threads.append(threading.Thread(target=retry_elsewhere))
        started = time.monotonic()
        threads[0].start()
        # A retry that the batch does not hold off is done well within this. One that starts
        # later (a loaded machine) comes after the batch: either way the job is not lost.
        threads[0].join(0.5)
        waited.append(time.monotonic() - started)

    main = threading.current_thread()
    threads: list[threading.Thread] = []
    signals.post_init.connect(while_loading, sender=Job, weak=False)
    try:
        pruned = retention.prune(ALIAS, cutoffs("failed"))
    finally:
        signals.post_init.disconnect(while_loading, sender=Job)
        for thread in threads:
            thread.join(30)
    assert waited, "the rows were never loaded: Django deleted with one filtered DELETE"
    survivors = list(Job.objects.values_list("pk", "state"))
    assert applied == [survivors == [(retried, "queued")]], survivors
    deleted = sorted(pk for pk in ids if (pk, "queued") not in survivors)
    assert pruned.counts == {"failed": len(deleted)}
    assert {signal: sorted(pks) for signal, pks in delete_receivers.items()} == {
        "pre_delete": deleted,
        "post_delete": deleted,
    }


# What each vendor's plan says when pruning's scan walks the finished index in
# finished_at order (no sort step, no full scan).
PLAN = {
    "sqlite": (r"SEARCH vellum_jobs_job USING (COVERING )?INDEX vellum_job_finished", "TEMP B-TREE"),
    "postgresql": (r"Index (Only )?Scan using vellum_job_finished", "Sort"),
    "mysql": (r"vellum_job_finished \d+ ", "filesort"),  # the chosen key and its length
}


# A transaction test: MySQL's ANALYZE TABLE commits implicitly. The plan is the database's, so
# `slow`: once per database.
@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_pruning_s_scan_uses_the_finished_index_on_a_big_table():
    now = timezone.now()
    Job.objects.bulk_create(
        Job(name="test.add", state=state, finished_at=now - timedelta(minutes=i))
        for i in range(6000)
        for state in ("done", "failed")
    )
    Job.objects.bulk_create(Job(name="test.add") for _ in range(2000))
    with connection.cursor() as cursor:
        cursor.execute(
            {"sqlite": "ANALYZE", "postgresql": "ANALYZE", "mysql": "ANALYZE TABLE vellum_jobs_job"}[
                connection.vendor
            ]
        )
        if connection.vendor == "mysql":
            cursor.fetchall()
        rows = retention.expired(ALIAS, "failed", now - timedelta(days=3))
        sql, params = rows.order_by("finished_at").values_list("pk", flat=True)[:500].query.sql_with_params()
        explain = "EXPLAIN QUERY PLAN" if connection.vendor == "sqlite" else "EXPLAIN"
        cursor.execute(f"{explain} {sql}", params)
        plan = "\n".join(" ".join(str(c) for c in row) for row in cursor.fetchall())
    uses_index, sort_step = PLAN[connection.vendor]
    assert re.search(uses_index, plan), plan
    assert sort_step not in plan, plan


# -- automatic retention ---------------------------------------------------

RETENTION = {"LEASE": 60, "HEARTBEAT": 10, "RETENTION": {"done": "1d", "failed": "7d"}}


def holder() -> str:
    return str(uuid.uuid4())


@pytest.mark.django_db
def test_retention_is_off_when_unset():
    finished_jobs(3, ago=100 * DAY)
    with override_settings(VELLUM_JOBS={}):
        assert retention.run_if_due(ALIAS, holder(), timezone.now()) is None
    assert Job.objects.count() == 3
    assert not MaintenanceLock.objects.exists()


@pytest.mark.django_db
@override_settings(VELLUM_JOBS=RETENTION)
def test_retention_prunes_each_state_by_its_own_age_and_leaves_the_rest():
    old_done = finished_jobs(2, "done", ago=2 * DAY)
    young_done = finished_jobs(2, "done", ago=DAY / 2)
    young_failed = finished_jobs(2, "failed", ago=2 * DAY)
    old_failed = finished_jobs(2, "failed", ago=8 * DAY)
    cancelled = finished_jobs(2, "cancelled", ago=100 * DAY)  # no age given: kept
    queued = jobs.add.enqueue(1, 2)
    pruned = retention.run_if_due(ALIAS, holder(), timezone.now())
    assert pruned is not None and pruned.counts == {"done": 2, "failed": 2}
    remaining = set(Job.objects.values_list("pk", flat=True))
    assert remaining == {*young_done, *young_failed, *cancelled, queued.pk}
    assert not remaining & {*old_done, *old_failed}


@pytest.mark.django_db
@override_settings(VELLUM_JOBS=RETENTION)
def test_after_a_complete_run_nobody_prunes_again_for_the_interval():
    first, second = holder(), holder()
    now = timezone.now()
    assert retention.run_if_due(ALIAS, first, now) is not None
    lock = MaintenanceLock.objects.get(name=retention.LOCK)
    assert (lock.holder, lock.locked_until) == (first, now + retention.INTERVAL)
    finished_jobs(1, ago=2 * DAY)
    soon = now + retention.INTERVAL - timedelta(seconds=1)
    assert retention.run_if_due(ALIAS, first, soon) is None
    assert retention.run_if_due(ALIAS, second, soon) is None
    assert Job.objects.count() == 1
    later = now + retention.INTERVAL
    assert retention.run_if_due(ALIAS, second, later).counts == {"done": 1, "failed": 0}


@pytest.mark.django_db
@override_settings(VELLUM_JOBS=RETENTION)
def test_a_process_that_found_the_lock_taken_asks_again_only_when_it_is_free(monkeypatch):
    first, second = holder(), holder()
    now = timezone.now()
    retention.run_if_due(ALIAS, first, now)
    asked = []
    monkeypatch.setattr(locks, "acquire", lambda *args: asked.append(args) or False)
    assert retention.run_if_due(ALIAS, second, now) is None
    assert retention.run_if_due(ALIAS, second, now + timedelta(minutes=1)) is None
    assert len(asked) == 1
    retention.run_if_due(ALIAS, second, now + retention.INTERVAL)
    assert len(asked) == 2


@pytest.fixture
def one_batch_per_beat(monkeypatch):
    """Two jobs per batch, one batch per beat: five expired jobs take three beats."""
    monkeypatch.setattr(retention, "BATCH_SIZE", 2)
    monkeypatch.setattr(retention, "SLICE_SHARE", 0)


@pytest.mark.django_db
@override_settings(VELLUM_JOBS=RETENTION)
def test_a_backlog_is_pruned_a_slice_per_beat_while_the_lock_stays_with_its_holder(one_batch_per_beat):
    finished_jobs(5, ago=2 * DAY)
    first, second = holder(), holder()
    now = timezone.now()
    beats = []
    for beat in range(4):
        at = now + timedelta(seconds=10 * beat)
        beats.append(retention.run_if_due(ALIAS, first, at))
        assert retention.run_if_due(ALIAS, second, at) is None  # never its turn meanwhile
    assert [(p.counts["done"], p.complete) for p in beats[:3]] == [(2, False), (2, False), (1, True)]
    assert beats[3] is None  # resting
    assert not Job.objects.exists()


@pytest.mark.django_db
@override_settings(VELLUM_JOBS=RETENTION)
def test_the_lock_of_a_holder_that_died_mid_backlog_is_taken_over_after_a_lease(one_batch_per_beat):
    finished_jobs(5, ago=2 * DAY)
    dead, survivor = holder(), holder()
    now = timezone.now()
    assert retention.run_if_due(ALIAS, dead, now).complete is False
    assert retention.run_if_due(ALIAS, survivor, now + timedelta(seconds=59)) is None
    taken_over = retention.run_if_due(ALIAS, survivor, now + timedelta(seconds=60))
    assert taken_over is not None and taken_over.counts == {"done": 2, "failed": 0}
    assert MaintenanceLock.objects.get(name=retention.LOCK).holder == survivor


@pytest.mark.django_db
@override_settings(VELLUM_JOBS=RETENTION)
def test_a_holder_that_stops_mid_backlog_lets_the_lock_go_at_once(one_batch_per_beat):
    finished_jobs(5, ago=2 * DAY)
    stopping, other = holder(), holder()
    now = timezone.now()
    assert retention.run_if_due(ALIAS, stopping, now).complete is False
    retention.let_go(ALIAS, stopping, now + timedelta(seconds=1))
    taken_over = retention.run_if_due(ALIAS, other, now + timedelta(seconds=1))  # not a lease later
    assert taken_over is not None and taken_over.counts == {"done": 2, "failed": 0}


@pytest.mark.django_db
@override_settings(VELLUM_JOBS=RETENTION)
def test_letting_go_after_a_complete_run_keeps_the_lock_resting():
    finished_jobs(1, ago=2 * DAY)
    stopping, other = holder(), holder()
    now = timezone.now()
    assert retention.run_if_due(ALIAS, stopping, now).complete is True
    retention.let_go(ALIAS, stopping, now + timedelta(seconds=1))
    finished_jobs(1, ago=2 * DAY)
    assert retention.run_if_due(ALIAS, other, now + timedelta(seconds=1)) is None
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_stops_mid_backlog_frees_the_retention_lock(one_batch_per_beat):
    finished_jobs(5, ago=2 * DAY)
    with override_settings(VELLUM_JOBS={**RETENTION, "HEARTBEAT": 0.5}):
        worker = WorkerProcess(WorkerOptions(threads=1))
        try:
            worker.heartbeat.beat(timezone.now())
            assert MaintenanceLock.objects.get(name=retention.LOCK).locked_until > timezone.now()
            worker._unregister()
        finally:
            connections.close_all()
    assert MaintenanceLock.objects.get(name=retention.LOCK).locked_until <= timezone.now()


@pytest.mark.django_db
@override_settings(VELLUM_JOBS=RETENTION)
def test_a_failure_is_logged_never_raised_and_tried_again_after_a_lease(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise OperationalError("disk I/O error")

    monkeypatch.setattr(retention, "prune", broken)
    me, now = holder(), timezone.now()
    assert retention.run_if_due(ALIAS, me, now) is None
    assert "retention failed" in caplog.text and "disk I/O error" in caplog.text
    monkeypatch.undo()
    finished_jobs(1, ago=2 * DAY)
    assert retention.run_if_due(ALIAS, me, now + timedelta(seconds=59)) is None
    assert retention.run_if_due(ALIAS, me, now + timedelta(seconds=60)).counts["done"] == 1


@pytest.mark.django_db(transaction=True)
def test_the_worker_s_heartbeat_applies_retention():
    old = finished_jobs(3, ago=2 * DAY)
    young = finished_jobs(1, ago=DAY / 2)
    with override_settings(VELLUM_JOBS={**RETENTION, "HEARTBEAT": 0.5}):
        worker = WorkerProcess(WorkerOptions(threads=1))
        try:
            worker.heartbeat.beat(timezone.now())
        finally:
            connections.close_all()
    assert set(Job.objects.values_list("pk", flat=True)) == set(young)
    assert not set(old) & set(Job.objects.values_list("pk", flat=True))
    assert MaintenanceLock.objects.get(name=retention.LOCK).holder == str(worker.id)


PRUNED_LINE = re.compile(r"retention pruned \d+ finished jobs holder=(\S+) deleted=(\d+)")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_of_two_runjobs_processes_only_one_prunes_and_the_other_skips():
    old = finished_jobs(3_000, "done", ago=timedelta(hours=2))  # six batches of BATCH_SIZE
    young = finished_jobs(1, "done", ago=timedelta(minutes=10))
    kept_failed = finished_jobs(1, "failed", ago=timedelta(hours=2))  # no RETENTION age for failed
    # The lock is held like a lease: with the tests' 3 s one, a pruner that a loaded host
    # starves for a few seconds between beats loses it to the other process, as it should.
    # A real lease keeps this test to the turn-taking it is about.
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings_retention", "VELLUM_LOG_LEVEL": "DEBUG", **REAL_LEASE}
    workers = [Runjobs("--workers", "1", env=env) for _ in range(2)]
    try:
        expired = Job.objects.filter(state="done", finished_at__lt=timezone.now() - timedelta(hours=1))
        wait_for(lambda: not expired.exists(), timeout=90, what="old jobs pruned")
        wait_for(
            lambda: all(
                "retention skipped" in w.output()[1] or PRUNED_LINE.search(w.output()[1]) for w in workers
            ),
            what="both processes' retention decisions",
        )
    finally:
        for worker in workers:
            worker.signal(signal.SIGTERM)
        assert [w.wait() for w in workers] == [0, 0]
    logs = [w.output()[1] for w in workers]
    pruners = [i for i, log in enumerate(logs) if PRUNED_LINE.search(log)]
    skippers = [i for i, log in enumerate(logs) if "retention skipped" in log]
    assert len(pruners) == 1, logs
    assert skippers == [1 - pruners[0]], logs
    slices = PRUNED_LINE.findall(logs[pruners[0]])
    assert sum(int(deleted) for _, deleted in slices) == len(old)
    assert {holder for holder, _ in slices} == {MaintenanceLock.objects.get(name=retention.LOCK).holder}
    assert set(Job.objects.values_list("pk", flat=True)) == {*young, *kept_failed}


# -- workflows: their jobs go together ----------------------------------------


def ended_long_ago(flow: Workflow, ago: timedelta = 10 * DAY, **by_state: timedelta) -> None:
    """Age ``flow`` and its ended jobs (the jobs of ``by_state``'s states by their own age)."""
    now = timezone.now()
    Workflow.objects.filter(pk=flow.pk).update(created_at=now - ago - DAY)
    flow.steps().filter(state__in=Job.FINISHED_STATES).update(finished_at=now - ago)
    for state, age in by_state.items():
        flow.steps().filter(state=state).update(finished_at=now - age)


def prune_all(**ages: timedelta) -> retention.Pruned:
    now = timezone.now()
    ages = ages or {state: DAY for state in Job.FINISHED_STATES}
    return retention.prune(ALIAS, {state: now - age for state, age in ages.items()})


@pytest.mark.django_db
@pytest.mark.parametrize("unended", ["waiting", "queued", "running"])
def test_a_workflow_with_an_unended_job_keeps_its_old_ended_steps(unended):
    flow = chain(jobs.add.s(1, 2), jobs.double.s(), jobs.double.s()).enqueue()
    first, second, _ = flow.steps()
    Job.objects.filter(pk=first.pk).update(state="done", finished_at=timezone.now())
    Job.objects.filter(pk=second.pk).update(state=unended)
    ended_long_ago(flow)
    before = set(flow.steps().values_list("pk", flat=True))
    edges = Dependency.objects.count()
    assert prune_all().total == 0
    assert set(flow.steps().values_list("pk", flat=True)) == before
    assert Dependency.objects.count() == edges == 2
    assert Workflow.objects.filter(pk=flow.pk).exists()


@pytest.mark.django_db
def test_a_finished_workflow_goes_whole_jobs_edges_and_row_while_a_plain_job_goes_as_before():
    flow = chain(jobs.add.s(1, 2), jobs.double.s(), jobs.fail_now.s()).enqueue()
    other = chain(jobs.add.s(1, 1), jobs.double.s()).enqueue()  # young: kept
    run_due()
    assert list(flow.steps().values_list("state", flat=True)) == ["done", "done", "failed"]
    ended_long_ago(flow)
    plain = finished_jobs(2, "done", ago=2 * DAY)
    pruned = prune_all()
    assert pruned.counts == {"done": 4, "failed": 1, "cancelled": 0}
    assert not Job.objects.filter(pk__in=plain).exists()
    assert not Job.objects.filter(workflow_id=flow.pk).exists()
    assert not Workflow.objects.filter(pk=flow.pk).exists()
    assert set(Dependency.objects.values_list("job__workflow_id", "upstream__workflow_id")) == {
        (other.pk, other.pk)
    }
    assert list(Workflow.objects.values_list("pk", flat=True)) == [other.pk]


@pytest.mark.django_db
def test_a_workflow_waits_for_the_longest_retention_of_its_states_from_its_newest_end():
    flow = chain(jobs.fail_now.s(), jobs.add.s(1, 1)).enqueue()
    run_due()
    assert list(flow.steps().values_list("state", flat=True)) == ["failed", "cancelled"]
    Job.objects.filter(pk=flow.steps().last().pk).update(state="done")
    ages = {"done": DAY, "failed": 7 * DAY, "cancelled": DAY}
    # Its failed step ended ten days ago, but its newest end (three days) is within the failed's 7 days.
    ended_long_ago(flow, failed=10 * DAY, done=3 * DAY)
    assert prune_all(**ages).total == 0
    ended_long_ago(flow, failed=10 * DAY, done=8 * DAY)
    assert prune_all(**ages).counts == {"done": 1, "failed": 1, "cancelled": 0}
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_a_workflow_with_a_job_in_a_state_kept_forever_is_kept():
    flow = chain(jobs.fail_now.s(), jobs.add.s(1, 1)).enqueue()
    run_due()
    ended_long_ago(flow)
    assert prune_all(done=DAY, failed=DAY).total == 0  # its cancelled step is kept forever
    assert flow.steps().count() == 2


@pytest.mark.django_db
def test_a_workflow_whose_job_an_unended_job_elsewhere_waits_for_is_kept():
    old = chain(jobs.add.s(1, 1), jobs.double.s()).enqueue()
    run_due()
    ended_long_ago(old)
    young = chain(jobs.add.s(5, 5)).enqueue().steps().get()  # queued, not run
    # Joins its first upstream job's (young) workflow, and waits for a step of the old one too.
    waiting = jobs.add.using(after=[young, old.steps().last()]).enqueue(1, 2)
    assert waiting.workflow_id == young.workflow_id != old.pk
    assert prune_all().total == 0
    assert old.steps().count() == 2
    Job.objects.filter(pk__in=[young.pk, waiting.pk]).update(state="cancelled", finished_at=timezone.now())
    assert prune_all().counts["done"] == 2  # nothing waits for it any more
    assert not Dependency.objects.filter(upstream__workflow_id=old.pk).exists()
    assert Dependency.objects.filter(job=waiting).count() == 1  # its edge to the pruned step is gone


@pytest.mark.django_db
def test_a_step_retried_after_its_workflow_was_found_keeps_the_workflow(monkeypatch):
    flow = chain(jobs.fail_now.s(), jobs.add.s(1, 1)).enqueue()
    run_due()
    ended_long_ago(flow)
    found = workflow_pruning._ended

    def then_retry(*args):
        ended = found(*args)
        flow.retry()  # another process, between finding and deleting
        return ended

    monkeypatch.setattr(workflow_pruning, "_ended", then_retry)
    assert prune_all().total == 0
    assert list(flow.steps().values_list("state", flat=True)) == ["queued", "waiting"]
    assert Dependency.objects.count() == 1 and Workflow.objects.filter(pk=flow.pk).exists()


@pytest.mark.django_db
def test_workflows_go_in_batches_small_ones_together_a_large_one_over_several():
    with batch(on_done=jobs.counts.s()) as big:
        jobs.add.enqueue_many([[i, i] for i in range(7)])
    small = [chain(jobs.add.s(1, 1), jobs.double.s()).enqueue() for _ in range(3)]
    run_due()
    for flow in (big, *small):
        ended_long_ago(flow)
    with CaptureQueriesContext(connection) as queries:
        pruned = retention.prune(ALIAS, cutoffs(*Job.FINISHED_STATES), batch_size=4)
    assert pruned.counts == {"done": 8 + 6, "failed": 0, "cancelled": 0}
    assert not Job.objects.exists() and not Dependency.objects.exists() and not Workflow.objects.exists()
    job_delete = re.compile(r"DELETE FROM [`\"]?vellum_jobs_job[`\"]? ")
    job_deletes = [q["sql"] for q in queries if job_delete.match(q["sql"])]
    # The batch's 8 jobs (7 and its callback) in two; two chains of two in one, the third in another.
    assert len(job_deletes) == 4


@pytest.mark.django_db
def test_a_dry_run_counts_a_finished_workflow_s_jobs():
    flow = chain(jobs.add.s(1, 1), jobs.double.s()).enqueue()
    run_due()
    ended_long_ago(flow)
    assert retention.prune(ALIAS, cutoffs("done"), dry_run=True).counts == {"done": 2}
    assert flow.steps().count() == 2
