"""Recurring jobs: declaring schedules, one job per instant across processes, missed instants."""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, OperationalError, transaction
from django.test import override_settings
from django.utils import timezone

from tests.support.processes import Runjobs, wait_for
from tests.testapp.models import Execution
from vellum_jobs import registry
from vellum_jobs.core.models import Job, Schedule
from vellum_jobs.maintenance import schedules
from vellum_jobs.worker.schedule_timer import ScheduleTimer
from vellum_jobs.worker.silence import Calls

pytestmark = pytest.mark.django_db

DAILY = {"job": "test.add", "cron": "0 3 * * *", "args": [1, 2], "timezone": "UTC"}


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def settings_with(**entries):
    return override_settings(VELLUM_JOBS={"SCHEDULES": entries})


def test_a_new_schedule_does_not_run_instants_from_before_it_was_first_seen():
    with settings_with(daily=DAILY):
        assert schedules.tick("default", at("2026-01-05T12:00:00")) == []
        assert Schedule.objects.get(name="daily").first_seen == at("2026-01-05T12:00:00")
        [job] = schedules.tick("default", at("2026-01-06T03:00:00.2"))
    assert (job.name, job.args, job.schedule, job.scheduled_for) == (
        "test.add",
        [1, 2],
        "daily",
        at("2026-01-06T03:00:00"),
    )


def test_each_instant_is_enqueued_once_however_often_it_is_ticked():
    with settings_with(daily=DAILY):
        schedules.tick("default", at("2026-01-05T12:00:00"))
        first = schedules.tick("default", at("2026-01-06T03:00:01"))
        again = schedules.tick("default", at("2026-01-06T03:00:02"))
    assert len(first) == 1
    assert again == []
    state = Schedule.objects.get(name="daily")
    assert (state.last_run_at, state.last_job_id) == (at("2026-01-06T03:00:00"), first[0].pk)


def test_the_unique_key_on_schedule_and_instant_stops_a_second_job_when_the_state_row_lags():
    """What a process that read the schedule's row just before another enqueued sees."""
    with settings_with(daily=DAILY):
        schedules.tick("default", at("2026-01-05T12:00:00"))
        schedules.tick("default", at("2026-01-06T03:00:01"))
        Schedule.objects.filter(name="daily").update(last_instant=None)
        assert schedules.tick("default", at("2026-01-06T03:00:02")) == []
    assert Job.objects.filter(schedule="daily").count() == 1


def test_the_database_refuses_a_second_job_for_one_schedule_and_instant():
    instant = at("2026-01-06T03:00:00")
    Job.objects.create(name="test.add", schedule="daily", scheduled_for=instant)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(name="test.add", schedule="daily", scheduled_for=instant)


def test_missed_instants_run_once_by_default_for_the_latest_one_only():
    Schedule.objects.create(name="daily", first_seen=at("2026-01-01T00:00:00"))
    with settings_with(daily=DAILY):
        enqueued = schedules.tick("default", at("2026-01-05T12:00:00"))
        assert schedules.tick("default", at("2026-01-05T12:00:05")) == []
    assert [job.scheduled_for for job in enqueued] == [at("2026-01-05T03:00:00")]
    assert Job.objects.count() == 1


def test_missed_instants_can_be_skipped_until_the_next_one():
    Schedule.objects.create(name="daily", first_seen=at("2026-01-01T00:00:00"))
    with settings_with(daily={**DAILY, "missed": "skip"}):
        assert schedules.tick("default", at("2026-01-05T12:00:00")) == []
        assert Schedule.objects.get(name="daily").last_instant == at("2026-01-05T03:00:00")
        [job] = schedules.tick("default", at("2026-01-06T03:00:10"))
    assert job.scheduled_for == at("2026-01-06T03:00:00")


def test_an_instant_a_few_seconds_late_is_on_time_even_when_skipping():
    Schedule.objects.create(
        name="daily", first_seen=at("2026-01-01T00:00:00"), last_instant=at("2026-01-05T03:00:00")
    )
    with settings_with(daily={**DAILY, "missed": "skip"}):
        assert len(schedules.tick("default", at("2026-01-06T03:00:30"))) == 1


def test_cron_is_read_in_the_schedule_s_time_zone():
    entry = {"job": "test.add", "cron": "30 6 * * 1-5", "args": [1, 2], "timezone": "Europe/Paris"}
    with settings_with(report=entry):
        definition = schedules.definitions()[0]
        # Friday 9 January 2026, 12:00 UTC: the last run was that morning, 06:30 Paris = 05:30 UTC.
        assert definition.previous(at("2026-01-09T12:00:00")) == at("2026-01-09T05:30:00")
        # The next is on Monday, not Saturday.
        assert definition.next(at("2026-01-09T12:00:00")) == at("2026-01-12T05:30:00")
        # Summer time: 06:30 Paris is 04:30 UTC.
        assert definition.next(at("2026-07-01T00:00:00")) == at("2026-07-01T04:30:00")


def test_a_decorator_schedule_is_named_after_its_job_and_uses_time_zone():
    function = registry.register("test.nightly", lambda: None, schedule="0 3 * * *")
    try:
        definition = {d.name: d for d in schedules.definitions()}["test.nightly"]
        assert (definition.job, definition.cron, definition.timezone) == ("test.nightly", "0 3 * * *", "UTC")
        assert function.schedule == "0 3 * * *"
    finally:
        registry.unregister("test.nightly")


def test_a_decorator_schedule_may_be_a_dict_of_options():
    registry.register("test.nightly", lambda: None, schedule={"cron": "0 3 * * *", "missed": "skip"})
    try:
        definition = {d.name: d for d in schedules.definitions()}["test.nightly"]
        assert definition.missed == "skip"
    finally:
        registry.unregister("test.nightly")


def test_queue_and_priority_of_a_schedule_apply_to_its_jobs():
    with settings_with(daily={**DAILY, "queue": "slow", "priority": 7}):
        schedules.tick("default", at("2026-01-05T12:00:00"))
        [job] = schedules.tick("default", at("2026-01-06T03:00:00"))
    assert (job.queue, job.priority) == ("slow", 7)


def test_overview_lists_each_schedule_with_its_last_and_next_run():
    with settings_with(daily=DAILY, hourly={"job": "test.add", "cron": "0 * * * *", "args": [3, 4]}):
        schedules.tick("default", at("2026-01-05T12:00:00"))
        enqueued = schedules.tick("default", at("2026-01-06T03:00:00"))
        rows = schedules.overview(now=at("2026-01-06T03:10:00"))
    [job] = [job for job in enqueued if job.schedule == "daily"]
    assert [row["name"] for row in rows] == ["daily", "hourly"]
    assert rows[0]["last_run"] == at("2026-01-06T03:00:00")
    assert rows[0]["last_job_id"] == job.pk
    assert rows[0]["next_run"] == at("2026-01-07T03:00:00")
    assert rows[1]["next_run"] == at("2026-01-06T04:00:00")


# -- runjobs processes


EVERY_SECOND = {"ticker": {"job": "test.add", "cron": "* * * * * *", "args": [1, 1], "timezone": "UTC"}}


@pytest.mark.parametrize(
    "error, level, traceback",
    [
        (OperationalError("database is locked"), logging.WARNING, False),
        (ValueError("a bug"), logging.ERROR, True),
    ],
    ids=["locked", "bug"],
)
def test_a_tick_that_fails_leaves_the_worker_running_and_a_traceback_only_for_a_bug(
    monkeypatch, caplog, error, level, traceback
):
    def failing(alias):
        raise error

    monkeypatch.setattr(schedules, "tick", failing)
    timer = ScheduleTimer("default", Calls(), threading.Event(), threading.Event())
    with settings_with(daily=DAILY), caplog.at_level(logging.WARNING, logger="vellum_jobs"):
        assert timer.tick() is True
    (record,) = [r for r in caplog.records if r.getMessage().startswith("schedule tick failed")]
    assert record.levelno == level
    assert (record.exc_info is not None) == traceback


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_three_runjobs_processes_enqueue_each_instant_exactly_once():
    env = {"VELLUM_TEST_SCHEDULES": json.dumps(EVERY_SECOND)}
    workers = [Runjobs("--workers", "1", env=env) for _ in range(3)]
    try:
        wait_for(lambda: Job.objects.filter(schedule="ticker").count() >= 5, what="5 ticks")
    finally:
        for worker in workers:
            worker.signal(signal.SIGTERM)
        codes = [worker.wait() for worker in workers]
    assert codes == [0, 0, 0], [worker.output()[1] for worker in workers]
    instants = list(Job.objects.filter(schedule="ticker").values_list("scheduled_for", flat=True))
    assert set(Counter(instants).values()) == {1}
    assert all(instant.microsecond == 0 for instant in instants)
    for worker in workers:
        assert "Traceback" not in worker.output()[1], worker.output()[1]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_back_after_downtime_runs_one_catch_up_job():
    daily = {"daily": {"job": "test.record", "cron": "0 3 * * *", "timezone": "UTC"}}
    Schedule.objects.create(name="daily", first_seen=timezone.now() - timedelta(days=5))
    worker = Runjobs("--burst", env={"VELLUM_TEST_SCHEDULES": json.dumps(daily)})
    assert worker.wait() == 0, worker.output()
    [job] = Job.objects.filter(schedule="daily")
    assert job.state == Job.State.DONE
    # The latest missed instant, not the first nor all five.
    assert (job.scheduled_for.hour, job.scheduled_for.minute) == (3, 0)
    assert timezone.now() - job.scheduled_for < timedelta(days=1)
    assert Execution.objects.filter(job_id=job.pk).count() == 1


# -- operated from the admin: disabled, enabled, run by hand


def test_a_disabled_schedules_instants_are_dealt_with_without_a_job():
    with settings_with(daily=DAILY):
        schedules.tick("default", at("2026-01-05T12:00:00"))
        assert schedules.disable("default", "daily", by="admin: ann", now=at("2026-01-05T13:00:00"))
        assert not schedules.disable("default", "daily", by="admin: bob")  # disabled already
        assert schedules.tick("default", at("2026-01-06T03:00:01")) == []
        assert schedules.tick("default", at("2026-01-07T03:00:01")) == []
    state = Schedule.objects.get(name="daily")
    assert (state.disabled_by, state.last_instant, state.last_job_id) == (
        "admin: ann",
        at("2026-01-07T03:00:00"),
        None,
    )
    assert not Job.objects.exists()


@pytest.mark.parametrize("ticked_while_disabled", [True, False], ids=["ticked", "no-worker"])
def test_enabling_a_schedule_fires_no_missed_instant_and_resumes_at_its_next(ticked_while_disabled):
    catch_up = {**DAILY, "missed": "run_once"}
    with settings_with(daily=catch_up):
        schedules.tick("default", at("2026-01-05T12:00:00"))
        schedules.disable("default", "daily")
        if ticked_while_disabled:
            schedules.tick("default", at("2026-01-06T03:00:01"))
        [definition] = schedules.definitions()
        assert schedules.enable("default", definition, at("2026-01-08T12:00:00"))
        assert not schedules.enable("default", definition)  # enabled already
        assert schedules.tick("default", at("2026-01-08T12:00:01")) == []  # 03:00 that day was missed
        [job] = schedules.tick("default", at("2026-01-09T03:00:01"))
    assert job.scheduled_for == at("2026-01-09T03:00:00")
    assert Schedule.objects.get(name="daily").disabled_at is None


def test_run_now_enqueues_a_run_for_no_instant_and_the_due_instant_still_runs():
    with settings_with(daily=DAILY):
        schedules.tick("default", at("2026-01-05T12:00:00"))
        [definition] = schedules.definitions()
        by_hand = schedules.run_now("default", definition)
        again = schedules.run_now("default", definition)  # runs by hand are never one another's duplicates
        state = Schedule.objects.get(name="daily")
        assert (state.last_job_id, state.last_instant) == (again.pk, None)
        [ticked] = schedules.tick("default", at("2026-01-06T03:00:01"))
    assert (by_hand.name, by_hand.args, by_hand.schedule, by_hand.scheduled_for) == (
        "test.add",
        [1, 2],
        "daily",
        None,
    )
    assert again.pk != by_hand.pk
    assert ticked.scheduled_for == at("2026-01-06T03:00:00")
    assert Schedule.objects.get(name="daily").last_job_id == ticked.pk


def test_a_schedule_is_found_by_name():
    with settings_with(daily=DAILY):
        found = schedules.find("daily")
        assert found is not None and found.cron == DAILY["cron"]
        assert schedules.find("weekly") is None
