"""``manage.py jobstats``: the table for people, the JSON for monitoring, --watch, and its errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from tests.support.processes import ROOT, wait_for
from tests.testapp import jobs
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.management.commands.jobstats import CLEAR_BELOW, CLEAR_LINE, HOME, duration, frame, redraw

pytestmark = pytest.mark.django_db


def jobstats(*args: str) -> str:
    out = StringIO()
    call_command("jobstats", *args, stdout=out)
    return out.getvalue()


def a_busy_queue() -> None:
    now = timezone.now()
    jobs.add.using(run_after=now - timedelta(minutes=5)).enqueue(1, 2)
    jobs.add.enqueue(3, 4)
    Job.objects.create(name="test.record", state=Job.State.DONE, finished_at=now)
    Job.objects.create(name="test.record", state=Job.State.FAILED, finished_at=now)
    Worker.objects.create(
        id=uuid.uuid4(), host="a", pid=1, threads=4, connections=7, queues=["media"], last_heartbeat=now
    )
    Worker.objects.create(
        id=uuid.uuid4(), host="b", pid=2, threads=4, last_heartbeat=now - timedelta(hours=1)
    )


def test_json_has_exactly_the_documented_keys_and_shapes():
    a_busy_queue()
    figures = json.loads(jobstats("--json"))
    assert list(figures) == ["states", "names", "oldest_queued_age", "workers", "schedules"]
    assert figures["states"] == {
        "waiting": 0,
        "queued": 2,
        "running": 0,
        "done": 1,
        "failed": 1,
        "cancelled": 0,
    }
    assert figures["names"] == {
        "test.add": {"waiting": 0, "queued": 2, "running": 0, "done": 0, "failed": 0, "cancelled": 0},
        "test.record": {"waiting": 0, "queued": 0, "running": 0, "done": 1, "failed": 1, "cancelled": 0},
    }
    assert 300 <= figures["oldest_queued_age"] < 330
    assert figures["workers"] == {"alive": 1, "stale": 1, "clocks_off": []}


def test_json_of_an_empty_queue_has_zeros_and_null():
    assert json.loads(jobstats("--json")) == {
        "states": {"waiting": 0, "queued": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0},
        "names": {},
        "oldest_queued_age": None,
        "workers": {"alive": 0, "stale": 0, "clocks_off": []},
        "schedules": {},
    }


def test_the_table_shows_counts_by_state_and_name_the_oldest_wait_and_workers():
    a_busy_queue()
    lines = jobstats().splitlines()
    assert lines[0].split() == ["name", "waiting", "queued", "running", "done", "failed", "cancelled"]
    assert lines[1].split() == ["(all)", "0", "2", "0", "1", "1", "0"]
    assert lines[2].split() == ["test.add", "0", "2", "0", "0", "0", "0"]
    assert lines[3].split() == ["test.record", "0", "0", "0", "1", "1", "0"]
    assert lines[5].startswith("oldest due job waiting: 5m ")
    assert lines[6] == "workers: 1 alive, 1 stale"
    assert lines[7].split()[:9] == [
        "a:1",
        "alive",
        "threads",
        "4",
        "connections",
        "7",
        "queues",
        "media",
        "last",
    ]
    assert lines[8].split()[:8] == ["b:2", "stale", "threads", "4", "connections", "0", "queues", "all"]
    assert lines[8].endswith("last heartbeat 1h 0m ago")
    assert len(lines) == 9


def test_waiting_jobs_have_their_column_and_key_apart_from_queued_ones():
    jobs.add.enqueue(1, 2)
    Job.objects.create(name="test.add", state=Job.State.WAITING)
    lines = jobstats().splitlines()
    assert lines[0].split()[:3] == ["name", "waiting", "queued"]
    assert lines[1].split()[:3] == ["(all)", "1", "1"]
    figures = json.loads(jobstats("--json"))
    assert (figures["states"]["waiting"], figures["states"]["queued"]) == (1, 1)
    assert figures["names"]["test.add"]["waiting"] == 1


def test_the_table_says_none_when_no_job_is_waiting():
    assert "oldest due job waiting: none" in jobstats()


def test_database_option_reads_that_alias_and_rejects_unknown_ones():
    jobs.add.enqueue(1, 2)
    assert json.loads(jobstats("--json", "--database", "default"))["states"]["queued"] == 1
    with pytest.raises(CommandError, match="--database 'nope' is not in DATABASES"):
        jobstats("--database", "nope")


def test_an_unknown_option_is_a_command_error():
    with pytest.raises(CommandError, match="unrecognized arguments: --yaml"):
        jobstats("--yaml")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.04, "0.0s"), (4.25, "4.2s"), (42, "42s"), (200, "3m 20s"), (7300, "2h 1m"), (90000, "1d 1h")],
)
def test_waits_read_the_way_a_person_says_them(seconds, shown):
    assert duration(seconds) == shown


def test_json_and_table_include_each_schedule_with_its_last_and_next_run(settings):
    from vellum_jobs.maintenance import schedules

    settings.VELLUM_JOBS = {
        "SCHEDULES": {"nightly": {"job": "test.add", "cron": "0 3 * * *", "args": [1, 2], "timezone": "UTC"}}
    }
    now = timezone.now()
    schedules.tick("default", now - timedelta(days=2))
    [job] = schedules.tick("default", now)  # the missed run of last night, caught up
    figures = json.loads(jobstats("--json"))
    last = job.scheduled_for
    assert figures["schedules"] == {
        "nightly": {
            "job": "test.add",
            "cron": "0 3 * * *",
            "timezone": "UTC",
            "last_run": last.isoformat(),
            "last_job_id": job.pk,
            "next_run": (last + timedelta(days=1)).isoformat(),
        }
    }
    lines = jobstats().splitlines()
    assert lines[-2] == "schedules: 1"
    assert lines[-1].split() == [
        "nightly", "0", "3", "*", "*", "*", "(UTC)", "job", "test.add",
        "last", "run", last.isoformat(), "next", "run", (last + timedelta(days=1)).isoformat(),
    ]  # fmt: skip


# -- --watch ------------------------------------------------------------------


def test_a_frame_is_a_header_with_the_time_then_what_jobstats_prints():
    a_busy_queue()
    now = timezone.now()
    lines = frame("default", now, 0.5)
    assert lines[0] == f"jobstats  {now:%Y-%m-%d %H:%M:%S} UTC  every 0.5s  Ctrl-C to stop"
    assert lines[1] == ""
    assert lines[2:4] == jobstats().splitlines()[:2]


@override_settings(USE_TZ=False)  # with TIME_ZONE "UTC", as check E019 requires
def test_a_frame_with_use_tz_false_reads_the_naive_time_as_the_time_zone_s():
    a_busy_queue()
    now = timezone.now()
    lines = frame("default", now, 0.5)
    assert lines[0] == f"jobstats  {now:%Y-%m-%d %H:%M:%S} UTC  every 0.5s  Ctrl-C to stop"
    assert lines[2:4] == jobstats().splitlines()[:2]


def test_on_a_terminal_a_frame_overwrites_the_last_and_is_cut_to_the_screen():
    screen = os.terminal_size((8, 3))
    text = redraw(["header", "", "a line longer than the screen", "below the screen"], screen)
    assert text == f"{HOME}header{CLEAR_LINE}\n{CLEAR_LINE}\n{CLEAR_BELOW}"
    assert redraw(["0123456789"], os.terminal_size((8, 3))) == f"{HOME}01234567{CLEAR_LINE}\n{CLEAR_BELOW}"


def test_elsewhere_frames_follow_each_other_without_escapes():
    assert redraw(["header", "", "table"], None) == "header\n\ntable\n\n"


@pytest.mark.parametrize("interval", ["0", "-1", "abc", "inf", "nan"])
def test_an_interval_that_is_not_a_positive_number_of_seconds_is_refused(interval):
    message = f"argument --interval: must be a number of seconds above 0, got '{interval}'"
    with pytest.raises(CommandError, match=re.escape(message)):
        jobstats("--watch", "--interval", interval)


def test_an_interval_without_watch_is_refused():
    with pytest.raises(CommandError, match="--interval is the pace of --watch: add --watch"):
        jobstats("--interval", "2")


@pytest.fixture
def watching() -> Iterator[list[subprocess.Popen[str]]]:
    """Starts ``jobstats`` processes on the test database (see ``watch``); kills those left at the end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def watch(started: list[subprocess.Popen[str]], *args: str) -> tuple[subprocess.Popen[str], Output]:
    """A ``manage.py jobstats --watch`` process, its stdout and stderr in files."""
    output = Output()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "VELLUM_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "PYTHONUNBUFFERED": "1",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "jobstats", "--watch", *args],
        cwd=ROOT,
        env=env,
        stdout=output.out,
        stderr=output.err,
        text=True,
        # A shell without job control starts background commands with SIGINT
        # ignored, and Python then never turns it into KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    started.append(process)
    return process, output


class Output:
    """A process's stdout and stderr, in files: a full pipe would block it."""

    def __init__(self) -> None:
        self.out = tempfile.TemporaryFile("w+")
        self.err = tempfile.TemporaryFile("w+")

    def text(self, stream: str = "out") -> str:
        file = self.out if stream == "out" else self.err
        file.seek(0)
        return file.read()


def queued_in_each_frame(text: str) -> list[int]:
    """The "(all)" row's queued count of each frame written so far; a line still being written is left out."""
    # Its columns: waiting, then queued.
    return [int(n) for n in re.findall(r"^\(all\) +\d+ +(\d+) ", text, flags=re.MULTILINE)]


def stop_with_ctrl_c(process: subprocess.Popen[str], output: Output) -> None:
    process.send_signal(signal.SIGINT)
    assert process.wait(15) == 0, output.text("err")
    assert "Traceback" not in output.text("err") and "KeyboardInterrupt" not in output.text("err")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_watch_redraws_the_figures_until_ctrl_c_which_exits_0(watching):
    process, output = watch(watching, "--interval", "0.2")
    first = wait_for(lambda: queued_in_each_frame(output.text()), what="the first frame")
    assert first[0] == 0
    jobs.add.enqueue(1, 2)

    def frames_up_to_one_with_the_job() -> list[int] | None:
        found = queued_in_each_frame(output.text())
        return found if found[-1] == 1 else None

    counts = wait_for(frames_up_to_one_with_the_job, what="a frame with the job")
    assert counts[0] == 0 and len(counts) >= 2
    text = output.text()
    assert text.count("Ctrl-C to stop") >= 2
    assert "\x1b" not in text  # not a terminal: frames follow each other
    stop_with_ctrl_c(process, output)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_watch_with_json_prints_one_document_per_line(watching):
    jobs.add.enqueue(1, 2)
    process, output = watch(watching, "--json", "--interval", "0.2")

    def two_whole_lines() -> list[str] | None:
        lines = [line for line in output.text().splitlines(keepends=True) if line.endswith("\n")]
        return lines[:2] if len(lines) >= 2 else None

    for line in wait_for(two_whole_lines, what="two lines"):
        document = json.loads(line)
        assert list(document) == ["states", "names", "oldest_queued_age", "workers", "schedules"]
        assert document["states"]["queued"] == 1
    stop_with_ctrl_c(process, output)
