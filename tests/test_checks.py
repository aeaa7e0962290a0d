from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from vellum_jobs.checks import check_settings, sqlite_warnings


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
        ({"LEASE": "1 minute"}, "vellum_jobs.E004", "VELLUM_JOBS['LEASE'] is invalid: '1 minute'"),
        ({"POLL_INTERVAL": 0}, "vellum_jobs.E004", "longer than zero"),
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


def test_backoff_base_may_be_zero():
    with override_settings(VELLUM_JOBS={"BACKOFF_BASE": 0}):
        assert check_settings() == []


SQLITE = {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"}


def test_sqlite_without_the_recommended_options_gets_w001_with_the_fix():
    (warning,) = sqlite_warnings({"default": SQLITE})
    assert warning.id == "vellum_jobs.W001"
    assert "transaction_mode" in warning.msg and "timeout" in warning.msg and "WAL" in warning.msg
    assert "'transaction_mode': 'IMMEDIATE'" in warning.hint


def test_sqlite_with_the_recommended_options_passes():
    options = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    assert sqlite_warnings({"default": {**SQLITE, "OPTIONS": options}}) == []


def test_other_databases_are_not_sqlite_s_business():
    assert sqlite_warnings({"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}}) == []


@pytest.mark.django_db
def test_checks_run_with_manage_py_check():
    with (
        override_settings(VELLUM_JOBS={"NOPE": 1}),
        pytest.raises(SystemCheckError, match=r"vellum_jobs\.E002"),
    ):
        call_command("check")
