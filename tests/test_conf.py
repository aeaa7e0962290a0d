from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

import pytest
from django.test import override_settings

from vellum_jobs.conf import MAX_DURATION, Health, conf, describe_duration, parse_duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (5, 5.0),
        (2.5, 2.5),
        ("90s", 90),
        ("15m", 900),
        ("12h", 43200),
        ("7d", 604800),
        ("250ms", 0.25),
        (" 1.5h ", 5400),
        (timedelta(minutes=2), 120),
    ],
)
def test_durations_in_seconds_or_with_a_unit(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["7 days", "7w", "", "-5s", -1, True, None, [5]])
def test_bad_durations_name_the_value_and_the_accepted_forms(value):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (math.nan, "nan is not a duration: it is not a number"),
        (math.inf, "inf is not a duration: it is longer than 100 years"),
        (1e12, "1000000000000.0 is not a duration: it is longer than 100 years"),
        ("36526d", "'36526d' is not a duration: it is longer than 100 years"),
        (timedelta.max, "is not a duration: it is longer than 100 years"),
    ],
)
def test_durations_that_are_not_a_number_or_longer_than_the_bound_are_refused_naming_them(value, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_duration(value)


def test_the_longest_duration_keeps_now_plus_it_a_valid_datetime_with_room_to_spare():
    assert parse_duration(MAX_DURATION) == MAX_DURATION.total_seconds() == parse_duration("36525d")
    assert datetime.max - datetime.now() > 50 * MAX_DURATION


def test_defaults_apply_for_missing_keys():
    with override_settings(VELLUM_JOBS={}):
        assert (conf.workers, conf.max_attempts, conf.poll_interval) == (4, 5, 1.0)
        assert (conf.backoff_base, conf.backoff_max, conf.lease, conf.heartbeat) == (30, 3600, 60, 10)


def test_settings_are_read_on_every_access():
    with override_settings(VELLUM_JOBS={"LEASE": "2m", "WORKERS": 9}):
        assert (conf.lease, conf.workers) == (120, 9)
    with override_settings(VELLUM_JOBS={"LEASE": 30}):
        assert conf.lease == 30


def test_a_job_whose_name_no_live_worker_knows_waits_an_hour_unless_set():
    with override_settings(VELLUM_JOBS={}):
        assert conf.unknown_name_timeout == 3600
    with override_settings(VELLUM_JOBS={"UNKNOWN_NAME_TIMEOUT": "1d"}):
        assert conf.unknown_name_timeout == 86400


@pytest.mark.parametrize(
    "seconds, words", [(0, "0s"), (45, "45s"), (600, "10m"), (5400, "1h 30m"), (90061, "1d 1h 1m 1s")]
)
def test_a_duration_is_described_in_the_units_it_is_written_in(seconds, words):
    assert describe_duration(seconds) == words
    assert sum(parse_duration(part) for part in words.split()) == seconds


def test_the_tasks_aliases_a_worker_runs_are_those_of_vellum_jobs_backend():
    tasks = {
        "default": {"BACKEND": "vellum_jobs.backends.VellumTaskBackend"},
        "emails": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
        "bulk": {"BACKEND": "vellum_jobs.backends.VellumTaskBackend"},
    }
    with override_settings(TASKS=tasks):
        assert conf.task_backends() == ["bulk", "default"]
    with override_settings(TASKS={}):
        assert conf.task_backends() == []


def test_retention_is_off_until_set_and_then_in_seconds_by_state():
    with override_settings(VELLUM_JOBS={}):
        assert conf.retention == {}
    with override_settings(VELLUM_JOBS={"RETENTION": None}):
        assert conf.retention == {}
    with override_settings(VELLUM_JOBS={"RETENTION": {"done": "7d", "failed": 3600}}):
        assert conf.retention == {"done": 604800, "failed": 3600}


def test_health_defaults_and_a_partial_dict_keeps_the_other_defaults():
    with override_settings(VELLUM_JOBS={}):
        assert conf.health == Health(max_queued_age=300, require_worker=True, public=False)
    with override_settings(VELLUM_JOBS={"HEALTH": {"PUBLIC": True}}):
        assert conf.health == Health(max_queued_age=300, require_worker=True, public=True)
    with override_settings(VELLUM_JOBS={"HEALTH": {"MAX_QUEUED_AGE": None, "REQUIRE_WORKER": False}}):
        assert conf.health == Health(max_queued_age=None, require_worker=False, public=False)


def test_max_payload_bytes_is_one_mib_unless_set():
    with override_settings(VELLUM_JOBS={}):
        assert conf.max_payload_bytes == 1048576
    with override_settings(VELLUM_JOBS={"MAX_PAYLOAD_BYTES": 5000}):
        assert conf.max_payload_bytes == 5000


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ({}, 80.0),
        ({"MAX_DATABASE_WAIT": None}, 80.0),
        ({"LEASE": "5m", "HEARTBEAT": "1m"}, 420.0),
        ({"MAX_DATABASE_WAIT": "3m"}, 180.0),
    ],
)
def test_max_database_wait_is_lease_plus_two_heartbeats_unless_set(given, seconds):
    with override_settings(VELLUM_JOBS=given):
        assert conf.max_database_wait == seconds


@pytest.mark.parametrize(
    ("given", "listens_on"),
    [
        ({}, "jobs"),
        ({"LISTEN_DATABASE": None}, "jobs"),
        ({"LISTEN_DATABASE": "direct"}, "direct"),
        ({"LISTEN_DATABASE": False}, None),
    ],
)
def test_listen_database_is_the_queue_s_alias_unless_set_and_false_means_poll(given, listens_on):
    with override_settings(VELLUM_JOBS=given):
        assert conf.listen_database("jobs") == listens_on
