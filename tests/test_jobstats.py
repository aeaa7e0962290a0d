"""``manage.py jobstats``: the table for people, the JSON for monitoring, and its errors."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from tests.testapp import jobs
from vellum_jobs.management.commands.jobstats import duration
from vellum_jobs.models import Job, Worker

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
    assert figures["states"] == {"queued": 2, "running": 0, "done": 1, "failed": 1, "cancelled": 0}
    assert figures["names"] == {
        "test.add": {"queued": 2, "running": 0, "done": 0, "failed": 0, "cancelled": 0},
        "test.record": {"queued": 0, "running": 0, "done": 1, "failed": 1, "cancelled": 0},
    }
    assert 300 <= figures["oldest_queued_age"] < 330
    assert figures["workers"] == {"alive": 1, "stale": 1}


def test_json_of_an_empty_queue_has_zeros_and_null():
    assert json.loads(jobstats("--json")) == {
        "states": {"queued": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0},
        "names": {},
        "oldest_queued_age": None,
        "workers": {"alive": 0, "stale": 0},
        "schedules": {},
    }


def test_the_table_shows_counts_by_state_and_name_the_oldest_wait_and_workers():
    a_busy_queue()
    lines = jobstats().splitlines()
    assert lines[0].split() == ["name", "queued", "running", "done", "failed", "cancelled"]
    assert lines[1].split() == ["(all)", "2", "0", "1", "1", "0"]
    assert lines[2].split() == ["test.add", "2", "0", "0", "0", "0"]
    assert lines[3].split() == ["test.record", "0", "0", "1", "1", "0"]
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
    from vellum_jobs import schedules

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
