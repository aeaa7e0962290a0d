"""The generated reference covers the code: every setting, command option and system check, described.

These tests read the Markdown the documentation's extension renders
(``docs/_ext/reference/``), so a setting, an option or a check id
added to the code without a line in the reference fails here as it fails
``make docs``.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import django
import pytest
from django.test import override_settings

from docs._ext.reference import Incomplete, actions, checks, commands, fields, settings, states
from docs._ext.reference.markdown import code
from vellum_jobs import admin
from vellum_jobs.checks import check_schedules, check_settings
from vellum_jobs.conf import DEFAULTS
from vellum_jobs.core import transitions
from vellum_jobs.core.models import Job
from vellum_jobs.maintenance import schedules

# The reference reads code, not the database: one cell of the matrix runs
# these, the one with Django 6, whose Tasks backend the reference documents.
pytestmark = pytest.mark.skipif(
    os.environ.get("VELLUM_TEST_DB", "sqlite") != "sqlite" or django.VERSION < (6, 0),
    reason="the reference is checked once, on SQLite with Django 6",
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# A schedule that passes the checks, for trying one bad key at a time.
SCHEDULE = {"job": "test.add", "cron": "30 6 * * *", "args": [1, 2]}


def ids(messages) -> set[str]:
    return {message.id for message in messages}


def refused(table) -> list[tuple[str, str, object]]:
    """(key, check id, a value of the key that check refuses) for each check the table names."""
    return [(key, check_id, value) for key, s in table.items() for check_id, value in s.rejected.items()]


def test_every_setting_has_a_description_and_a_type():
    assert set(settings.SETTINGS) == set(DEFAULTS)
    assert set(settings.HEALTH) == set(DEFAULTS["HEALTH"])
    assert set(settings.SCHEDULE_KEYS) == set(schedules.KEYS)
    for key, setting in settings.SETTINGS.items():
        assert settings.setting_description(key, setting).strip(), key
        assert settings.setting_type(key, setting), key
    for table in (settings.HEALTH, settings.SCHEDULE_KEYS):
        for key, setting in table.items():
            assert setting.description and setting.type, key


def test_a_setting_without_a_description_is_incomplete():
    with pytest.raises(Incomplete, match=r"\['NEW_SETTING'\] has no description"):
        settings.setting_description("NEW_SETTING", settings.Setting(None))


def test_the_settings_page_shows_every_setting_with_its_default():
    text = settings.settings_markdown()
    for key, default in DEFAULTS.items():
        assert f"## `{key}`\n" in text
        assert code(repr(default)) in text, key
    for key in DEFAULTS["HEALTH"]:
        assert f"`HEALTH[{key!r}]`" in text
    for key in schedules.KEYS:
        assert f"`SCHEDULES[name][{key!r}]`" in text


@pytest.mark.parametrize(
    ("key", "check_id", "value"),
    refused(settings.SETTINGS),
)
def test_each_setting_is_refused_by_the_checks_its_reference_names(key, check_id, value):
    with override_settings(VELLUM_JOBS={key: value}):
        assert check_id in ids(check_settings())


@pytest.mark.parametrize(
    ("key", "check_id", "value"),
    refused(settings.HEALTH),
)
def test_each_health_key_is_refused_by_the_checks_its_reference_names(key, check_id, value):
    with override_settings(VELLUM_JOBS={"HEALTH": {key: value}}):
        assert check_id in ids(check_settings())


@pytest.mark.parametrize(
    ("key", "check_id", "value"),
    refused(settings.SCHEDULE_KEYS),
)
def test_each_schedule_key_is_refused_by_the_checks_its_reference_names(key, check_id, value):
    with override_settings(VELLUM_JOBS={"SCHEDULES": {"nightly": {**SCHEDULE, key: value}}}):
        assert check_id in ids(check_schedules())


def _arguments(parser: argparse.ArgumentParser, prog: str):
    """Every argument of ``parser`` and of its subcommands, with the command line it belongs to."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield prog, f"{name} subcommand", name
                yield from _arguments(subparser, f"{prog} {name}")
        elif action.option_strings:
            for option in action.option_strings:
                yield prog, option, option
        else:
            yield prog, action.dest, commands.invocation(action)


def test_the_commands_page_shows_every_option_of_every_command():
    names = commands.command_names()
    assert {"runjobs", "jobstats", "prunejobs", "jobs"} <= set(names)
    for name in names:
        text = commands.command_markdown(name)
        for prog, what, shown in _arguments(commands.parser_of(name), name):
            assert re.search(rf"(?<![\w-]){re.escape(shown)}(?![\w-])", text), f"{prog}: {what}"


def test_every_option_of_the_commands_has_a_help_text():
    for name in commands.command_names():
        for action in commands.own_actions(commands.parser_of(name)):
            if action.option_strings:
                assert action.help, f"{name} {action.option_strings[0]}"


def test_the_checks_page_describes_every_check_id_in_the_code():
    found = checks.check_messages()
    assert set(found) == set(checks.CHECKS)
    text = checks.checks_markdown()
    for check_id, messages in found.items():
        assert f"## `{check_id}`\n" in text
        assert any(message.text != "…" for message in messages), check_id


def test_the_check_ids_read_from_the_code_are_the_ones_the_tests_assert():
    asserted = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        if path.name != Path(__file__).name:
            asserted |= set(re.findall(r"vellum_jobs\.[EW]\d{3}", path.read_text()))
    assert asserted == set(checks.check_messages())


def test_the_states_page_shows_every_state_and_transition():
    text = states.states_markdown()
    for state in transitions.State:
        assert f"| `{state.value}` |" in text
    for transition in transitions.TRANSITIONS:
        assert f"── {transition.name}" in text and f"| {transition.name} |" in text


def test_the_job_fields_table_lists_every_column():
    text = fields.fields_markdown(Job)
    for field in Job._meta.concrete_fields:
        assert f"| `{field.name}` |" in text


def test_the_admin_actions_table_lists_every_action():
    text = actions.admin_actions_markdown()
    for name in admin.__all__:
        for action in getattr(admin, name).actions:
            assert f"`{action.__name__}`" in text


def test_the_tasks_backend_describes_each_of_its_options():
    from vellum_jobs.backends.backend import OPTIONS, VellumTaskBackend

    for option in OPTIONS:
        assert f"``{option}``" in (VellumTaskBackend.__doc__ or "")


@pytest.mark.parametrize(
    ("page", "directive"),
    [
        ("reference/settings.md", "vellum-settings"),
        ("reference/commands.md", "vellum-commands"),
        ("reference/checks.md", "vellum-checks"),
        ("reference/states.md", "vellum-states"),
        ("reference/admin.md", "vellum-admin-actions"),
        ("reference/api.md", "vellum-model-fields"),
    ],
)
def test_the_reference_pages_render_the_generated_parts(page, directive):
    assert f"```{{{directive}}}" in (DOCS / page).read_text()


def test_the_upgrading_page_names_every_migration_and_setting():
    text = (DOCS / "upgrading.md").read_text()
    for path in sorted((ROOT / "vellum_jobs" / "migrations").glob("0*.py")):
        assert f"`{path.stem}`" in text
    for key in DEFAULTS:
        assert f"`{key}`" in text
