from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from vellum_jobs import registry
from vellum_jobs.checks import (
    check_autovacuum,
    check_isolation_level,
    check_schedules,
    check_settings,
    check_sqlite_options,
    check_time_zone,
    isolation_warnings,
    sqlite_warnings,
)
from vellum_jobs.conf import conf


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_default_settings_pass():
    with override_settings(VELLUM_JOBS={}):
        assert check_settings() == []


@pytest.mark.parametrize(
    ("value", "check_id", "words"),
    [
        ([("WORKERS", 4)], "vellum_jobs.E001", "must be a dict"),
        ({"WORKER": 4}, "vellum_jobs.E002", "unknown key 'WORKER'"),
        ({"WORKERS": 0}, "vellum_jobs.E003", "VELLUM_JOBS['WORKERS'] is 0"),
        ({"MAX_ATTEMPTS": "3"}, "vellum_jobs.E003", "VELLUM_JOBS['MAX_ATTEMPTS'] is '3'"),
        (
            {"ASYNC_WORKERS": -1},
            "vellum_jobs.E003",
            "'ASYNC_WORKERS'] is -1; it must be an integer from 0 to 10000",
        ),
        ({"ASYNC_WORKERS": 20_000}, "vellum_jobs.E003", "VELLUM_JOBS['ASYNC_WORKERS'] is 20000"),
        ({"ASYNC_BLOCKED_WARNING": "soon"}, "vellum_jobs.E004", "ASYNC_BLOCKED_WARNING"),
        ({"LEASE": "1 minute"}, "vellum_jobs.E004", "VELLUM_JOBS['LEASE'] is invalid: '1 minute'"),
        ({"POLL_INTERVAL": 0}, "vellum_jobs.E004", "longer than zero"),
        ({"PROBE_INTERVAL": "soon"}, "vellum_jobs.E004", "VELLUM_JOBS['PROBE_INTERVAL'] is invalid"),
        ({"UNKNOWN_NAME_TIMEOUT": "an hour"}, "vellum_jobs.E004", "['UNKNOWN_NAME_TIMEOUT'] is invalid"),
        ({"UNKNOWN_NAME_TIMEOUT": 0}, "vellum_jobs.E004", "['UNKNOWN_NAME_TIMEOUT'] is 0"),
        ({"RETENTION": {"running": "1d"}}, "vellum_jobs.E005", "'running'"),
        ({"RETENTION": {"done": "soon"}}, "vellum_jobs.E004", "RETENTION']['done'] is invalid"),
        ({"HEALTH": {"PUBLIC": "yes"}}, "vellum_jobs.E006", "'PUBLIC'] is 'yes'"),
        ({"HEALTH": {"MAX_AGE": "5m"}}, "vellum_jobs.E006", "unknown key 'MAX_AGE'"),
        ({"LEASE": 10, "HEARTBEAT": 6}, "vellum_jobs.E007", "at most half of LEASE"),
    ],
)
def test_bad_settings_are_errors_naming_the_key_and_value(value, check_id, words):
    with override_settings(VELLUM_JOBS=value):
        errors = check_settings()
    assert check_id in ids(errors)
    assert any(words in e.msg for e in errors), [e.msg for e in errors]


@pytest.mark.parametrize(
    ("value", "check_id", "words", "accepted"),
    [
        ("4", "vellum_jobs.E001", "got str: '4'", "'WORKERS': 4"),
        ({"RETENTON": {}}, "vellum_jobs.E002", "'RETENTON'", "did you mean 'RETENTION'?"),
        ({"workers": 4}, "vellum_jobs.E002", "'workers'", "did you mean 'WORKERS'?"),
        ({"WORKERS": True}, "vellum_jobs.E003", "VELLUM_JOBS['WORKERS'] is True", "integer >= 1"),
        ({"HEARTBEAT": "5sec"}, "vellum_jobs.E004", "VELLUM_JOBS['HEARTBEAT'] is invalid: '5sec'", '"90s"'),
        ({"RETENTION": ["done", "7d"]}, "vellum_jobs.E005", "got ['done', '7d']", "{'done': '7d'}"),
        ({"RETENTION": {"Done": "7d"}}, "vellum_jobs.E005", "has 'Done'", "did you mean 'done'?"),
        ({"RETENTION": {"queued": "7d"}}, "vellum_jobs.E005", "has 'queued'", "never pruned"),
        ({"RETENTION": {"failed": 0}}, "vellum_jobs.E004", "['failed'] is 0", "longer than zero"),
        ({"HEALTH": True}, "vellum_jobs.E006", "got True", "'MAX_QUEUED_AGE': '5m'"),
        ({"HEALTH": {"PUBLIK": True}}, "vellum_jobs.E006", "'PUBLIK'", "did you mean 'PUBLIC'?"),
        ({"HEALTH": {"REQUIRE_WORKER": 1}}, "vellum_jobs.E006", "['REQUIRE_WORKER'] is 1", "True or False"),
        ({"HEALTH": {"MAX_QUEUED_AGE": "1 hour"}}, "vellum_jobs.E004", "'1 hour' is not a duration", '"15m"'),
        ({"LEASE": "4s"}, "vellum_jobs.E007", "HEARTBEAT (10s)", "LEASE (4s)"),
        ({"MAX_DATABASE_WAIT": "an hour"}, "vellum_jobs.E004", "['MAX_DATABASE_WAIT'] is invalid", '"15m"'),
        ({"MAX_DATABASE_WAIT": 0}, "vellum_jobs.E004", "['MAX_DATABASE_WAIT'] is 0", "longer than zero"),
        (
            {"MAX_DATABASE_WAIT": "60s"},
            "vellum_jobs.E021",
            "MAX_DATABASE_WAIT (60s)",
            "plus one HEARTBEAT (70s)",
        ),
        (
            {"MAX_DATABASE_WAIT": "2m", "LEASE": "2m", "HEARTBEAT": "30s"},
            "vellum_jobs.E021",
            "MAX_DATABASE_WAIT (120s)",
            "None waits LEASE plus two HEARTBEATs",
        ),
    ],
)
def test_errors_name_the_key_the_bad_value_and_the_accepted_form(value, check_id, words, accepted):
    with override_settings(VELLUM_JOBS=value):
        errors = [e for e in check_settings() if e.id == check_id]
    assert errors, f"no {check_id}"
    text = " ".join(f"{e.msg} {e.hint or ''}" for e in errors)
    assert words in text and accepted in text, text


@pytest.mark.parametrize(
    "value",
    [
        {"RETENTION": None},
        {"RETENTION": {}},
        {"RETENTION": {"done": "7d", "failed": 30 * 86400, "cancelled": "12h"}},
        {"HEALTH": {"PUBLIC": True}},
        {"HEALTH": {"MAX_QUEUED_AGE": None, "REQUIRE_WORKER": False}},
        {"HEALTH": {"MAX_QUEUED_AGE": 90}},
        {"MAX_DATABASE_WAIT": None},
        {"MAX_DATABASE_WAIT": "70s"},
        {"MAX_DATABASE_WAIT": "1d", "LEASE": "5m", "HEARTBEAT": "1m"},
    ],
)
def test_retention_health_and_max_database_wait_in_their_accepted_forms_pass(value):
    with override_settings(VELLUM_JOBS=value):
        assert check_settings() == []


def test_keys_of_mixed_types_are_reported_not_crashed_on():
    with override_settings(VELLUM_JOBS={1: "x", "NOPE": 2}):
        assert ids(check_settings()) == ["vellum_jobs.E002", "vellum_jobs.E002"]


@pytest.mark.parametrize("value", [0, -1, "1MB", 1.5, True, None, 2.0])
def test_max_payload_bytes_that_is_not_a_positive_integer_is_e018(value):
    with override_settings(VELLUM_JOBS={"MAX_PAYLOAD_BYTES": value}):
        errors = check_settings()
    assert ids(errors) == ["vellum_jobs.E018"]
    assert f"VELLUM_JOBS['MAX_PAYLOAD_BYTES'] is {value!r}; it must be a positive integer" in errors[0].msg
    assert "1048576" in errors[0].hint


@pytest.mark.parametrize("value", [1, 1048576, 64 * 1024 * 1024])
def test_max_payload_bytes_of_any_positive_integer_passes(value):
    with override_settings(VELLUM_JOBS={"MAX_PAYLOAD_BYTES": value}):
        assert check_settings() == []


@pytest.mark.parametrize("key", ["BACKOFF_BASE", "PROBE_INTERVAL"])
def test_backoff_base_and_probe_interval_may_be_zero(key):
    with override_settings(VELLUM_JOBS={key: 0}):
        assert check_settings() == []


SQLITE = {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"}


def test_sqlite_without_the_recommended_options_gets_w001_with_the_fix():
    (warning,) = sqlite_warnings({"default": SQLITE})
    assert warning.id == "vellum_jobs.W001"
    assert "transaction_mode" in warning.msg and "timeout" in warning.msg and "WAL" in warning.msg
    assert "'transaction_mode': 'IMMEDIATE'" in warning.hint


RECOMMENDED = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}


def test_sqlite_with_the_recommended_options_passes():
    assert sqlite_warnings({"default": {**SQLITE, "OPTIONS": RECOMMENDED}}) == []


def test_other_databases_are_not_sqlite_s_business():
    assert sqlite_warnings({"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}}) == []


@pytest.mark.django_db
def test_checks_run_with_manage_py_check():
    with (
        override_settings(VELLUM_JOBS={"NOPE": 1}),
        pytest.raises(SystemCheckError, match=r"vellum_jobs\.E002"),
    ):
        call_command("check")


@pytest.mark.parametrize("zone", ["Europe/Paris", "America/New_York", "Asia/Tokyo"])
def test_naive_local_time_other_than_utc_is_e019(zone):
    with override_settings(USE_TZ=False, TIME_ZONE=zone):
        errors = check_time_zone()
    assert ids(errors) == ["vellum_jobs.E019"]
    assert f"USE_TZ is False and TIME_ZONE is {zone!r}" in errors[0].msg
    assert "every lease expires at once" in errors[0].msg
    assert "USE_TZ = True" in errors[0].hint and "TIME_ZONE = 'UTC'" in errors[0].hint


@pytest.mark.parametrize(
    ("use_tz", "zone"),
    [(False, "UTC"), (False, "Etc/UTC"), (False, "GMT"), (True, "Europe/Paris"), (True, "UTC")],
)
def test_aware_times_or_naive_utc_pass_e019(use_tz, zone):
    with override_settings(USE_TZ=use_tz, TIME_ZONE=zone):
        assert check_time_zone() == []


def test_e019_runs_with_manage_py_check():
    with (
        override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"),
        pytest.raises(SystemCheckError, match=r"vellum_jobs\.E019"),
    ):
        call_command("check")


GOOD_SCHEDULE = {"job": "test.add", "cron": "30 6 * * 1-5", "args": [1, 2], "timezone": "Europe/Paris"}


@pytest.mark.parametrize(
    ("entry", "check_id", "words"),
    [
        ("30 6 * * *", "vellum_jobs.E010", "schedule 'nightly' must be a dict"),
        ({**GOOD_SCHEDULE, "kwarg": {}}, "vellum_jobs.E010", "schedule 'nightly' has an unknown key 'kwarg'"),
        ({"job": "test.add", "args": [1, 2]}, "vellum_jobs.E010", "schedule 'nightly' has no 'cron'"),
        ({**GOOD_SCHEDULE, "priority": 500}, "vellum_jobs.E010", "schedule 'nightly': priority must be"),
        (
            {**GOOD_SCHEDULE, "cron": "30 25 * * *"},
            "vellum_jobs.E011",
            "schedule 'nightly' has an invalid cron",
        ),
        ({**GOOD_SCHEDULE, "cron": "daily"}, "vellum_jobs.E011", "invalid cron expression 'daily'"),
        (
            {**GOOD_SCHEDULE, "job": "reprot"},
            "vellum_jobs.E012",
            "schedule 'nightly' runs an unknown job 'reprot'",
        ),
        (
            {**GOOD_SCHEDULE, "timezone": "Europe/Pariss"},
            "vellum_jobs.E013",
            "unknown time zone 'Europe/Pariss'",
        ),
        ({**GOOD_SCHEDULE, "missed": "all"}, "vellum_jobs.E014", "schedule 'nightly' has missed='all'"),
        ({**GOOD_SCHEDULE, "args": [1]}, "vellum_jobs.E015", "schedule 'nightly' cannot call 'test.add'"),
        ({**GOOD_SCHEDULE, "kwargs": {"a": {1, 2}}}, "vellum_jobs.E015", "schedule 'nightly' cannot call"),
    ],
)
def test_bad_schedules_are_errors_naming_the_schedule(entry, check_id, words):
    with override_settings(VELLUM_JOBS={"SCHEDULES": {"nightly": entry}}):
        errors = check_schedules()
    assert check_id in ids(errors), [e.msg for e in errors]
    assert any(words in e.msg for e in errors), [e.msg for e in errors]


def test_good_schedules_pass():
    with override_settings(VELLUM_JOBS={"SCHEDULES": {"nightly": GOOD_SCHEDULE}}):
        assert check_schedules() == []
        assert check_settings() == []


def test_a_bad_decorator_schedule_is_an_error_naming_it():
    registry.register("test.nightly", lambda: None, schedule="every night")
    try:
        errors = check_schedules()
    finally:
        registry.unregister("test.nightly")
    assert ids(errors) == ["vellum_jobs.E011"]
    assert "schedule 'test.nightly' has an invalid cron expression 'every night'" in errors[0].msg


def test_a_schedule_declared_by_a_decorator_and_in_settings_is_an_error():
    registry.register("test.nightly", lambda: None, schedule="0 3 * * *")
    try:
        with override_settings(
            VELLUM_JOBS={"SCHEDULES": {"test.nightly": {"job": "test.add", "cron": "0 3 * * *"}}}
        ):
            errors = check_schedules()
    finally:
        registry.unregister("test.nightly")
    assert "vellum_jobs.E016" in ids(errors)


@pytest.mark.parametrize(
    ("value", "check_id", "words"),
    [
        ({"SCHEDULES": ["nightly"]}, "vellum_jobs.E010", "VELLUM_JOBS['SCHEDULES'] must be a dict"),
        ({"RUN_INLINE": "yes"}, "vellum_jobs.E017", "VELLUM_JOBS['RUN_INLINE'] is 'yes'"),
    ],
)
def test_bad_schedules_and_run_inline_settings_are_errors(value, check_id, words):
    with override_settings(VELLUM_JOBS=value):
        errors = check_settings()
    assert check_id in ids(errors)
    assert any(words in e.msg for e in errors)


@pytest.mark.parametrize(
    ("engine", "level", "named"),
    [
        ("django.db.backends.mysql", "repeatable read", "REPEATABLE READ"),
        ("django.db.backends.mysql", "serializable", "SERIALIZABLE"),
        ("django.db.backends.postgresql", "SERIALIZABLE", "SERIALIZABLE"),
        ("django.db.backends.postgresql", "REPEATABLE_READ", "REPEATABLE READ"),
    ],
)
def test_an_isolation_level_other_than_read_committed_gets_w002(engine, level, named):
    if engine.endswith("postgresql"):
        # The level is psycopg's own value; the bare install has no psycopg to name one.
        pytest.importorskip("psycopg")
        from django.db.backends.postgresql.psycopg_any import IsolationLevel

        level = IsolationLevel[level]
    (warning,) = isolation_warnings({"jobs": {"ENGINE": engine, "OPTIONS": {"isolation_level": level}}})
    assert warning.id == "vellum_jobs.W002"
    assert f"'jobs' runs transactions at isolation level {named}" in warning.msg
    assert "concurrency limits may be exceeded" in warning.msg


@pytest.mark.parametrize(
    "config",
    [
        {"ENGINE": "django.db.backends.mysql"},
        {"ENGINE": "django.db.backends.mysql", "OPTIONS": {"isolation_level": "read committed"}},
        {"ENGINE": "django.db.backends.postgresql"},
        SQLITE,
    ],
)
def test_read_committed_and_the_defaults_pass_w002(config):
    assert isolation_warnings({"default": config}) == []


@pytest.mark.parametrize(
    ("config", "check_id"),
    [
        (SQLITE, "vellum_jobs.W001"),
        (
            {"ENGINE": "django.db.backends.mysql", "OPTIONS": {"isolation_level": "repeatable read"}},
            "vellum_jobs.W002",
        ),
    ],
)
def test_the_database_options_checks_run_with_a_plain_manage_py_check(monkeypatch, config, check_id):
    """They read DATABASES, not the database: `check` needs no `--database` to run them."""
    monkeypatch.setattr(conf, "databases", lambda: {"default": config})
    with pytest.raises(SystemCheckError, match=rf"{check_id}"):
        call_command("check", fail_level="WARNING")


def test_the_test_settings_pass_a_plain_manage_py_check_at_the_warning_level():
    call_command("check", fail_level="WARNING")


def test_w001_looks_at_every_database_unless_some_are_named(monkeypatch):
    monkeypatch.setattr(
        conf, "databases", lambda: {"default": {**SQLITE, "OPTIONS": RECOMMENDED}, "logs": SQLITE}
    )
    assert [w.msg.split(" is not")[0] for w in check_sqlite_options()] == ["SQLite database 'logs'"]
    assert check_sqlite_options(databases=["default"]) == []


def test_w002_looks_only_at_the_databases_being_checked(monkeypatch):
    databases = {
        "default": SQLITE,
        "reports": {"ENGINE": "django.db.backends.mysql", "OPTIONS": {"isolation_level": "repeatable read"}},
    }
    monkeypatch.setattr(conf, "databases", lambda: databases)
    assert check_isolation_level(databases=["default"]) == []
    assert ids(check_isolation_level(databases=["reports"])) == ["vellum_jobs.W002"]


# -- LISTEN_DATABASE

LISTEN_DATABASES = {
    "default": {"ENGINE": "django.db.backends.postgresql", "NAME": "app", "PORT": "6432"},
    "direct": {"ENGINE": "django.db.backends.postgresql", "NAME": "app", "PORT": "5432"},
    "reports": {"ENGINE": "django.db.backends.sqlite3", "NAME": "reports.sqlite3"},
}


@pytest.mark.parametrize(
    ("value", "words", "hint"),
    [
        ("dierct", "'dierct', which is not in DATABASES", "DATABASES has 'default', 'direct', 'reports'"),
        ("reports", "'reports', a sqlite database: only PostgreSQL has LISTEN/NOTIFY", "reaches PostgreSQL"),
        (True, "is True; it must be a database alias or False", "False to poll"),
        (["direct"], "is ['direct']; it must be a database alias or False", "False to poll"),
    ],
)
def test_a_listen_database_that_is_not_a_postgresql_alias_is_e020(monkeypatch, value, words, hint):
    monkeypatch.setattr(conf, "databases", lambda: LISTEN_DATABASES)
    with override_settings(VELLUM_JOBS={"LISTEN_DATABASE": value}):
        errors = check_settings()
    assert ids(errors) == ["vellum_jobs.E020"]
    assert words in errors[0].msg and hint in (errors[0].hint or ""), (errors[0].msg, errors[0].hint)


@pytest.mark.parametrize("value", ["direct", "default", False, None])
def test_a_postgresql_alias_or_false_passes_as_listen_database(monkeypatch, value):
    monkeypatch.setattr(conf, "databases", lambda: LISTEN_DATABASES)
    with override_settings(VELLUM_JOBS={"LISTEN_DATABASE": value}):
        assert check_settings() == []


def test_a_listen_database_with_an_engine_django_cannot_load_is_left_to_django(monkeypatch):
    monkeypatch.setattr(conf, "databases", lambda: {**LISTEN_DATABASES, "odd": {"ENGINE": "no.such.backend"}})
    with override_settings(VELLUM_JOBS={"LISTEN_DATABASE": "odd"}):
        assert check_settings() == []


@pytest.mark.django_db
def test_w003_warns_of_a_postgresql_server_with_autovacuum_off_as_the_server_says():
    from django.core import checks
    from django.db import connection

    deploy = checks.run_checks(databases=["default"], include_deployment_checks=True, tags=["vellum_jobs"])
    plain = checks.run_checks(databases=["default"], tags=["vellum_jobs"])
    assert "vellum_jobs.W003" not in ids(plain)  # a deploy check
    if connection.vendor != "postgresql":
        assert check_autovacuum(databases=["default"]) == []
        return
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        (setting,) = cursor.fetchone()
    # The test server's own setting decides which way it goes (CI's has it off).
    assert ("vellum_jobs.W003" in ids(deploy)) == (setting != "on")
    assert check_autovacuum(databases=None) == []  # no database named: the server is not asked
