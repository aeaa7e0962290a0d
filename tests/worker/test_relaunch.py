"""The command line ``runjobs --processes`` starts its children with."""

from __future__ import annotations

import sys

import pytest

from vellum_jobs.worker import command_line


@pytest.mark.parametrize(
    ("args", "kept"),
    [
        (["runjobs", "--processes", "2", "--workers", "3"], ["runjobs", "--workers", "3"]),
        (["runjobs", "--workers", "3", "--processes=2"], ["runjobs", "--workers", "3"]),
        (["runjobs", "--proc", "2", "--burst"], ["runjobs", "--burst"]),
        (["runjobs", "--", "--burst"], ["runjobs", "--", "--burst"]),
        (["runjobs", "--pythonpath", "x", "-v", "2"], ["runjobs", "--pythonpath", "x", "-v", "2"]),
    ],
)
def test_an_option_is_left_out_in_any_spelling_argparse_takes(args, kept):
    assert command_line.without_option(args, "--processes") == kept


@pytest.mark.parametrize(
    ("orig_argv", "argv", "command"),
    [
        (
            ["python3", "-X", "dev", "-m", "django", "runjobs", "--processes", "2"],
            ["/lib/django/__main__.py", "runjobs", "--processes", "2"],
            ["-X", "dev", "-m", "django", "runjobs"],
        ),
        (
            ["python3", "manage.py", "runjobs", "--processes=2", "-v", "2"],
            ["manage.py", "runjobs", "--processes=2", "-v", "2"],
            ["manage.py", "runjobs", "-v", "2"],
        ),
        # A manage.py that rewrote sys.argv: its script, with the arguments Django was given.
        (
            ["python3", "manage.py", "runjobs", "--processes", "2"],
            ["manage.py", "runjobs", "--processes", "2", "--settings", "x"],
            ["manage.py", "runjobs", "--settings", "x"],
        ),
    ],
)
def test_the_command_is_this_interpreter_started_the_same_way(monkeypatch, orig_argv, argv, command):
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    monkeypatch.setattr(sys, "argv", argv)
    assert command_line.command(argv, without="--processes") == [sys.executable, *command]
