"""The per-minute figures: what workers tally and heartbeats add, the oldest due ages, folding old minutes."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone

from tests.support.processes import REAL_LEASE, Runjobs
from tests.testapp import jobs
from vellum_jobs.core.models import Job, NameMinute, QueueMinute
from vellum_jobs.store import name_rollup, rollup
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

ALIAS = "default"


@pytest.fixture(autouse=True)
def empty_tally():
    rollup.TALLY.take()  # what in-process runs of other tests counted
    name_rollup.TALLY.take()
    yield
    rollup.TALLY.take()
    name_rollup.TALLY.take()


def figures(queue: str = "default") -> dict[str, int]:
    return rollup.totals(ALIAS).get(queue, dict.fromkeys(rollup.OUTCOMES, 0))


@pytest.mark.django_db
def test_flushes_add_to_the_minute_s_row_and_an_empty_tally_writes_nothing():
    now = timezone.now()
    rollup.count(now, "default", rollup.DONE, 3)
    rollup.count(now, "default", rollup.FAILED)
    rollup.count(now, "media", rollup.RETRIED, 2)
    rollup.flush(ALIAS, now)
    rollup.count(now, "default", rollup.DONE, 2)
    rollup.flush(ALIAS, now)
    rollup.flush(ALIAS, now)
    row = QueueMinute.objects.get(queue="default")
    assert row.minute == rollup.minute_of(now)
    assert (row.done, row.failed, row.retried) == (5, 1, 0)
    assert figures("media")[rollup.RETRIED] == 2
    assert QueueMinute.objects.count() == 2


@pytest.mark.django_db
def test_counts_past_32_bits_are_added_folded_and_read_back():
    """The all-time row outgrows 32 bits in days at the drain rates the README gives."""
    now = timezone.now()
    big = 3 * 2**31  # past a signed and an unsigned 32-bit column
    for outcome in rollup.OUTCOMES:
        rollup.count(now - timedelta(hours=30), "default", outcome, big)
    rollup.flush(ALIAS, now)
    rollup.add(ALIAS, Counter({(rollup.minute_of(now), "default", rollup.DONE): big}))
    rollup.fold_old(ALIAS, now)
    rollup.count(now - timedelta(hours=30), "default", rollup.DONE, big)
    rollup.add(ALIAS, rollup.TALLY.take())
    rollup.fold_old(ALIAS, now)
    assert figures() == {**dict.fromkeys(rollup.OUTCOMES, big), "done": 3 * big}
    assert QueueMinute.objects.get(minute=rollup.BEGINNING).done == 2 * big


@pytest.mark.django_db
def test_a_failed_flush_keeps_the_tally_for_the_next_beat():
    now = timezone.now()
    rollup.count(now, "x" * 300, rollup.DONE)  # longer than the column: MariaDB and PostgreSQL refuse it
    rollup.count(now, "default", rollup.DONE)
    if connection.vendor == "sqlite":
        pytest.skip("SQLite stores a text longer than its column")
    with pytest.raises(Exception):  # noqa: B017 - each vendor's own DataError
        rollup.flush(ALIAS, now)
    kept = rollup.TALLY.take()
    assert kept[(rollup.minute_of(now), "default", rollup.DONE)] == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite's writers take turns")
def test_two_processes_adding_a_minute_s_first_figures_at_once_lose_none():
    now = timezone.now()
    key = (rollup.minute_of(now), "default", rollup.DONE)
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def add(n: int) -> None:
        try:
            start.wait(5)
            rollup.add(ALIAS, Counter({key: n}))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=add, args=(n,)) for n in (3, 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert QueueMinute.objects.get().done == 7


@pytest.mark.django_db
def test_the_oldest_due_age_keeps_the_largest_sample_of_the_minute():
    now = timezone.now()
    jobs.add.using(run_after=now - timedelta(seconds=90)).enqueue(1, 1)
    jobs.add.using(queue="media", run_after=now - timedelta(seconds=5)).enqueue(1, 1)
    jobs.add.using(queue="later", run_after=now + timedelta(hours=1)).enqueue(1, 1)
    rollup.record_oldest_due(ALIAS, now)
    rollup.record_oldest_due(ALIAS, now - timedelta(seconds=30))  # a smaller age, sampled by another process
    ages = dict(QueueMinute.objects.values_list("queue", "oldest_due_age"))
    assert ages == {"default": pytest.approx(90, abs=0.01), "media": pytest.approx(5, abs=0.01)}


@pytest.mark.django_db
def test_old_minutes_fold_into_the_totals_so_they_only_grow():
    now = timezone.now()
    rollup.count(now - timedelta(hours=30), "default", rollup.DONE, 5)
    rollup.count(now - timedelta(hours=26), "default", rollup.LOST, 1)
    rollup.count(now, "default", rollup.DONE, 2)
    rollup.add(ALIAS, rollup.TALLY.take())
    before = figures()
    rollup.fold_old(ALIAS, now)
    rollup.fold_old(ALIAS, now)
    assert figures() == before == {**dict.fromkeys(rollup.OUTCOMES, 0), "done": 7, "lost": 1}
    assert sorted(QueueMinute.objects.values_list("minute", flat=True)) == [
        rollup.BEGINNING,
        rollup.minute_of(now),
    ]
    day = rollup.series(ALIAS, now - timedelta(hours=24), now, timedelta(hours=1))
    assert sum(bucket.counts["done"] for bucket in day) == 2


@pytest.mark.django_db
@override_settings(USE_TZ=False)  # with TIME_ZONE "UTC", as check E019 requires
def test_old_minutes_fold_into_the_totals_with_use_tz_false():
    now = timezone.now()
    assert timezone.is_naive(now)
    rollup.count(now - timedelta(hours=30), "default", rollup.DONE, 5)
    rollup.count(now, "default", rollup.DONE, 2)
    rollup.add(ALIAS, rollup.TALLY.take())
    rollup.fold_old(ALIAS, now)
    rollup.fold_old(ALIAS, now)
    assert figures() == {**dict.fromkeys(rollup.OUTCOMES, 0), "done": 7}
    assert QueueMinute.objects.count() == 2
    day = rollup.series(ALIAS, now - timedelta(hours=24), now, timedelta(hours=1))
    assert sum(bucket.counts["done"] for bucket in day) == 2


@pytest.mark.django_db(transaction=True)
@override_settings(USE_TZ=False)
def test_a_sampling_heartbeat_records_and_folds_the_figures_with_use_tz_false(monkeypatch):
    monkeypatch.setattr(rollup, "SAMPLE_EVERY", 0)  # every beat samples the oldest due jobs
    now = timezone.now()
    rollup.count(now - timedelta(hours=30), "default", rollup.DONE, 5)
    rollup.add(ALIAS, rollup.TALLY.take())
    jobs.add.using(run_after=now - timedelta(seconds=90)).enqueue(1, 1)
    rollup.count(now, "default", rollup.RETRIED, 1)
    worker = WorkerProcess(WorkerOptions(threads=1))
    try:
        worker.heartbeat.beat(now)
    finally:
        connections.close_all()
    assert worker.heartbeat.last_error == ""
    assert figures() == {**dict.fromkeys(rollup.OUTCOMES, 0), "done": 5, "retried": 1}
    this_minute = QueueMinute.objects.get(minute=rollup.minute_of(now))
    assert (this_minute.retried, this_minute.oldest_due_age) == (1, pytest.approx(90, abs=1))
    assert QueueMinute.objects.count() == 2  # the old minute folded away


@pytest.mark.django_db
def test_a_series_has_every_step_with_each_outcome_and_the_largest_age():
    now = timezone.now().replace(minute=30)
    rollup.count(now - timedelta(minutes=10), "default", rollup.DONE, 4)
    rollup.count(now - timedelta(minutes=10), "media", rollup.DONE, 1)
    rollup.count(now - timedelta(minutes=3), "default", rollup.FAILED, 2)
    rollup.add(ALIAS, rollup.TALLY.take())
    QueueMinute.objects.filter(queue="media").update(oldest_due_age=12.5)
    hour = rollup.series(ALIAS, now - timedelta(minutes=59), now, timedelta(minutes=1))
    assert len(hour) == 60 and hour[-1].start == rollup.minute_of(now)
    by_start = {bucket.start: bucket for bucket in hour}
    ten_ago = by_start[rollup.minute_of(now - timedelta(minutes=10))]
    assert ten_ago.counts["done"] == 5 and ten_ago.oldest_due_age == 12.5
    assert by_start[rollup.minute_of(now - timedelta(minutes=3))].counts["failed"] == 2
    assert sum(b.counts["done"] for b in hour) == 5


def test_a_tally_that_is_never_flushed_stays_small(monkeypatch):
    # Scaled down (100 keys, an hour kept) from 10,000 keys and 25 hours, whose three days of
    # minutes take a loaded machine over 20 s.
    monkeypatch.setattr(rollup, "MAX_KEYS", 100)
    monkeypatch.setattr(rollup, "KEEP", timedelta(hours=1))
    start = timezone.now()
    for minute in range(3 * 3 * 60):
        rollup.count(start + timedelta(minutes=minute), "default", rollup.DONE)
    kept = rollup.TALLY.take()
    assert len(kept) <= 100 + 60
    assert max(k[0] for k in kept) == rollup.minute_of(start + timedelta(minutes=3 * 3 * 60 - 1))


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_worker_counts_each_attempt_s_end_by_queue_and_by_name_with_its_duration_and_wait():
    jobs.add.enqueue_many([(i, i) for i in range(4)])
    jobs.add.using(run_after=timezone.now() - timedelta(seconds=45)).enqueue(1, 1)
    jobs.add.using(queue="media").enqueue(1, 2)
    jobs.raise_error.enqueue()  # fails twice, retried without backoff, then fails for good
    jobs.retry_me.enqueue(3600)  # asks to run again in an hour: snoozed, not a failure
    jobs.sleep.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1)  # not due: not counted
    worker = Runjobs("--burst", "--workers", "2", env=REAL_LEASE)
    assert worker.wait() == 0, worker.output()[1]
    zeros = dict.fromkeys(rollup.OUTCOMES, 0)
    assert figures() == {**zeros, "done": 5, "retried": 2, "failed": 1, "snoozed": 1}
    assert figures("media") == {**zeros, "done": 1}
    assert Job.objects.filter(state=Job.State.QUEUED).count() == 2
    by_name = name_rollup.totals(ALIAS)
    assert sorted(by_name) == ["test.add", "test.raise", "test.retry"]
    added = by_name["test.add"]
    assert added.outcomes == {**zeros, "done": 6}
    assert sum(added.durations) == 6 and added.duration(0.5) is not None and added.duration(0.5) < 10
    assert sum(added.waits) == 6 and sum(added.waits[name_rollup.bucket_of(30.001) :]) == 1
    assert 45 <= added.wait_sum < 45 + 6 * 30
    assert by_name["test.raise"].outcomes == {**zeros, "retried": 2, "failed": 1}
    assert by_name["test.retry"].outcomes == {**zeros, "snoozed": 1}
    assert by_name["test.retry"].failure_rate is None


def test_a_handler_s_retry_counts_as_snoozed_and_a_failed_attempt_as_retried():
    assert rollup.outcome_of("queued", started=True) == rollup.RETRIED
    assert rollup.outcome_of("queued", started=True, refunded=True) == rollup.SNOOZED
    assert rollup.outcome_of("failed", started=True, refunded=False) == rollup.FAILED
    assert rollup.outcome_of("queued", started=False, refunded=True) is None


# -- by job name ------------------------------------------------------------


@pytest.mark.django_db
def test_a_flush_adds_each_name_s_outcomes_and_histograms_to_its_minute():
    now = timezone.now()
    rollup.count(now, "default", rollup.DONE, 2, name="test.add", duration=0.2, wait=3.0)
    rollup.count(now, "default", rollup.FAILED, name="test.add", duration=12.0, wait=0.0)
    rollup.flush(ALIAS, now)
    rollup.count(now, "media", rollup.DONE, name="test.add", duration=0.2, wait=3.0)
    rollup.count_name(now, "test.gone", rollup.FAILED, 3)
    rollup.flush(ALIAS, now)
    row = NameMinute.objects.get(name="test.add")
    assert (row.minute, row.done, row.failed) == (rollup.minute_of(now), 3, 1)
    assert row.duration_3 == 3 and row.duration_9 == 1  # (0.1, 0.25] and (10, 30]
    assert row.wait_0 == 1 and row.wait_7 == 3  # (2.5, 5]
    assert row.duration_sum == pytest.approx(12.6) and row.wait_sum == pytest.approx(9.0)
    gone = NameMinute.objects.get(name="test.gone")
    assert (gone.failed, gone.duration_sum, sum(getattr(gone, c) for c in name_rollup.DURATIONS)) == (3, 0, 0)
    # The queue's figures are the same attempts, counted by queue.
    assert figures()[rollup.DONE] == 2 and figures("media")[rollup.DONE] == 1


@pytest.mark.django_db
def test_old_minutes_of_each_name_fold_into_its_totals_so_they_only_grow():
    now = timezone.now()
    rollup.count(now - timedelta(hours=30), "default", rollup.DONE, 5, name="test.add", duration=1, wait=1)
    rollup.count(now - timedelta(hours=26), "default", rollup.LOST, name="test.add")
    rollup.count(now, "default", rollup.DONE, 2, name="test.add", duration=100, wait=1)
    name_rollup.flush(ALIAS)
    before = name_rollup.totals(ALIAS)
    name_rollup.fold_old(ALIAS, now)
    name_rollup.fold_old(ALIAS, now)
    assert name_rollup.totals(ALIAS) == before
    assert before["test.add"].outcomes == {**dict.fromkeys(rollup.OUTCOMES, 0), "done": 7, "lost": 1}
    assert before["test.add"].duration_sum == 205
    assert sorted(NameMinute.objects.values_list("minute", flat=True)) == [
        rollup.BEGINNING,
        rollup.minute_of(now),
    ]
    (hour,) = name_rollup.last_hour(ALIAS, now)
    assert hour.total.outcomes["done"] == 2 and hour.total.duration(0.5) == pytest.approx(
        90
    )  # halfway through (60, 120]


@pytest.mark.django_db
def test_the_last_hour_of_each_name_has_sixty_minutes_of_outcomes():
    now = timezone.now().replace(minute=30)
    rollup.count(now - timedelta(minutes=10), "default", rollup.DONE, 4, name="b.job", duration=1, wait=0)
    rollup.count(now - timedelta(minutes=3), "default", rollup.FAILED, 2, name="b.job", duration=1, wait=0)
    rollup.count(now - timedelta(minutes=3), "default", rollup.SNOOZED, name="a.job", duration=1, wait=0)
    rollup.count(now - timedelta(minutes=61), "default", rollup.DONE, name="c.job", duration=1, wait=0)
    name_rollup.flush(ALIAS)
    hours = name_rollup.last_hour(ALIAS, now)
    assert [h.name for h in hours] == ["a.job", "b.job"]
    b = hours[1]
    assert len(b.minutes) == 60 and b.minutes[-1].start == rollup.minute_of(now)
    assert b.minutes[-11].counts["done"] == 4 and b.minutes[-4].counts["failed"] == 2
    assert b.total.failure_rate == pytest.approx(2 / 6)
    assert hours[0].total.failure_rate is None  # a snooze is no failure, nor a finish


def test_quantiles_are_interpolated_within_their_bucket_as_prometheus_does():
    counts = [0] * len(name_rollup.BOUNDS)
    assert name_rollup.quantile(counts, 0.5) is None
    counts[name_rollup.bucket_of(0.3)] = 10  # (0.25, 0.5]
    assert name_rollup.quantile(counts, 0.5) == pytest.approx(0.375)
    counts[-1] = 90  # past the last finite bound
    assert name_rollup.quantile(counts, 0.95) == name_rollup.BOUNDS[-2]
    assert name_rollup.bucket_of(1.0) == name_rollup.BOUNDS.index(1.0)  # a bound is "at most"
    assert name_rollup.bucket_of(-2.0) == 0  # a clock behind: no negative wait


@pytest.mark.django_db
def test_a_failed_flush_of_the_names_keeps_their_tally_for_the_next_beat():
    now = timezone.now()
    rollup.count(now, "default", rollup.DONE, name="x" * 300, duration=1, wait=1)
    rollup.count(now, "default", rollup.DONE, name="test.add", duration=1, wait=1)
    if connection.vendor == "sqlite":
        pytest.skip("SQLite stores a text longer than its column")
    with pytest.raises(Exception):  # noqa: B017 - each vendor's own DataError
        rollup.flush(ALIAS, now)
    kept = name_rollup.TALLY.take()
    assert kept[(rollup.minute_of(now), "test.add")].outcomes["done"] == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite has no row locks: its busy timeout bounds waits"
)
def test_a_flush_of_names_whose_minute_a_cut_off_session_holds_fails_after_the_bound_keeping_its_tally():
    from django.db import OperationalError
    from django.db.models import F

    from tests.maintenance.test_lock_waits import cut_off_session
    from vellum_jobs.store import lock_waits

    now = timezone.now()
    rollup.count(now, "default", rollup.DONE, name="test.add", duration=1, wait=1)
    rollup.flush(ALIAS, now)
    minute = NameMinute.objects.filter(name="test.add")
    with cut_off_session(lambda: minute.update(done=F("done") + 10)) as holding:
        rollup.count(now, "default", rollup.DONE, 2, name="test.add", duration=1, wait=1)
        with pytest.raises(OperationalError) as raised:
            rollup.flush(ALIAS, now)
        assert lock_waits.timed_out(ALIAS, raised.value)
        assert holding.is_set(), "the wait ended only when the cut-off session let go"
    rollup.flush(ALIAS, now)  # the next beat's
    assert (minute.get().done, minute.get().duration_5) == (3, 3)
