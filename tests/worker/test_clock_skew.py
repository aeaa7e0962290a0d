"""Hosts whose clocks disagree: real ``runjobs`` processes on clocks shifted by libfaketime.

A worker whose clock runs an hour ahead must not take a live worker's job,
nor have one taken from it when its clock runs an hour behind; on
PostgreSQL and MariaDB due times are the database's, and each worker row
records how far its host's clock is off, which the admin, ``jobstats`` and
the health view warn of.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from tests.support import faketime
from tests.support.admin_pages import staff_user
from tests.support.processes import ROOT, SHORT_LEASE, Runjobs, beats, wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.conf import conf
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.observe import figures

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

faketime.require()

HOUR = 3600


def watched_past_a_lease() -> int:
    """Heartbeats enough for recovery to have watched a lease for a whole lease, twice over."""
    return 2 * round((SHORT_LEASE + 2 * conf.heartbeat) / conf.heartbeat)


@pytest.mark.parametrize(
    "owner_shift, rescuer_shift", [(0, HOUR), (-HOUR, 0)], ids=["rescuer-ahead", "owner-behind"]
)
def test_no_live_job_is_taken_by_a_worker_whose_clock_disagrees(tmp_path, owner_shift, rescuer_shift):
    release = tmp_path / "release"
    # Due two hours ago, so that a worker an hour behind claims it too (on SQLite due times are its own).
    job = jobs.sleep.using(run_after=timezone.now() - timedelta(hours=2)).enqueue(
        120, release_file=str(release)
    )
    owner = Runjobs("--workers", "1", env=faketime.shifted(owner_shift))
    rescuer = None
    try:
        wait_for(lambda: Execution.objects.filter(job_id=job.pk).exists(), what="the owner starts the job")
        holder = Job.objects.get(pk=job.pk).worker_id
        rescuer = Runjobs("--workers", "1", env=faketime.shifted(rescuer_shift))
        beats(rescuer, watched_past_a_lease())
        row = Job.objects.get(pk=job.pk)
        assert (row.state, row.worker_id, row.claims) == (Job.State.RUNNING, holder, 1)
        release.touch()
        wait_for(lambda: Job.objects.get(pk=job.pk).state == Job.State.DONE, what="the owner finishes")
    finally:
        release.touch()  # whoever runs it finishes, and both processes can stop
        for process in (owner, rescuer):
            if process is not None:
                process.signal(signal.SIGTERM)
        for process in (owner, rescuer):
            if process is not None:
                assert process.wait() == 0, process.output()[1][-3000:]
    assert Execution.objects.filter(job_id=job.pk).count() == 1
    assert Job.objects.get(pk=job.pk).attempts == 1


@pytest.fixture
def server_clock():
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no clock of its own: due times there are each process's")


def test_a_worker_whose_clock_runs_ahead_judges_due_times_by_the_database_s_clock(server_clock):
    delayed = jobs.add.using(delay=HOUR / 2).enqueue(1, 2)
    ahead = Runjobs("--workers", "1", env=faketime.shifted(HOUR))
    try:
        due_now = jobs.add.enqueue(2, 3)
        wait_for(lambda: Job.objects.get(pk=due_now.pk).state == Job.State.DONE, what="the due job runs")
        beats(ahead, 4)  # four claims' worth of polling more
        row = Job.objects.get(pk=delayed.pk)
        assert (row.state, row.attempts) == (Job.State.QUEUED, 0)
        offset = Worker.objects.get(pid=ahead.pid).clock_offset
        assert offset is not None and abs(offset + HOUR) < 60, offset
    finally:
        ahead.signal(signal.SIGTERM)
        assert ahead.wait() == 0


def test_a_host_whose_clock_is_off_is_named_by_the_admin_jobstats_and_the_health_view(server_clock, client):
    behind = Runjobs("--workers", "1", env=faketime.shifted(-HOUR))
    try:
        wait_for(lambda: Worker.objects.filter(pid=behind.pid, clock_offset__isnull=False).exists())
        (warning,) = figures.collect()["workers"]["clocks_off"]
        assert f":{behind.pid}: clock 3600" in warning and "behind the database" in warning

        out = io.StringIO()
        call_command("jobstats", stdout=out)
        assert f"warning: {warning}" in out.getvalue()

        client.force_login(staff_user("view_job", "view_worker"))
        body = client.get(reverse("vellum_jobs:health")).json()
        assert body["healthy"] is True, body  # jobs still run: a warning, not a failed condition
        (said,) = body["warnings"]
        assert warning in said and "more than 2s" in said
        page = client.get(reverse("admin:vellum_jobs_worker_changelist")).content.decode()
        assert "behind the database" in page
    finally:
        behind.signal(signal.SIGTERM)
        assert behind.wait() == 0


def test_a_host_whose_clock_agrees_is_not_flagged(server_clock):
    worker = Runjobs("--workers", "1")
    try:
        wait_for(lambda: Worker.objects.filter(pid=worker.pid, clock_offset__isnull=False).exists())
        offset = Worker.objects.get(pid=worker.pid).clock_offset
        assert offset is not None and abs(offset) < 1
        assert Worker.objects.get(pid=worker.pid).clock_warning == ""
        assert figures.collect()["workers"]["clocks_off"] == []
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0


# What a web process on a shifted clock does: enqueue a job due now and one
# due in a minute, retry a failed job, make a delayed one due now.
WEB_PROCESS = """
import json
from tests.testapp import jobs
from vellum_jobs.core.models import Job
failed, delayed = Job.objects.get(pk={failed}), Job.objects.get(pk={delayed})
print(json.dumps({{
    "now": jobs.add.enqueue(1, 2).pk,
    "in_a_minute": jobs.add.using(delay=60).enqueue(1, 2).pk,
    "retried": failed.retry(),
    "run_now": delayed.run_now(),
}}))
"""


def as_web_process_shifted_by(seconds: float, code: str) -> dict[str, object]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "VELLUM_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        **faketime.shifted(seconds),
    }
    command = [sys.executable, "-m", "django", "shell", "-c", code]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("shift", [HOUR, -HOUR], ids=["ahead", "behind"])
def test_a_process_that_is_not_a_worker_stamps_due_times_by_the_database_s_clock(server_clock, shift):
    failed = jobs.add.enqueue(0, 0)
    Job.objects.filter(pk=failed.pk).update(state=Job.State.FAILED, error="boom", finished_at=timezone.now())
    delayed = jobs.add.using(delay=HOUR / 2).enqueue(0, 0)
    said = as_web_process_shifted_by(shift, WEB_PROCESS.format(failed=failed.pk, delayed=delayed.pk))
    assert said["retried"] is True and said["run_now"] is True
    now = timezone.now()  # this process's clock is the database's, on one machine
    due = {
        "now": Job.objects.get(pk=said["now"]).run_after,
        "in a minute": Job.objects.get(pk=said["in_a_minute"]).run_after,
        "retried": Job.objects.get(pk=failed.pk).run_after,
        "run now": Job.objects.get(pk=delayed.pk).run_after,
    }
    expected = {"now": now, "in a minute": now + timedelta(minutes=1), "retried": now, "run now": now}
    off = {what: (due[what] - expected[what]).total_seconds() for what in due}
    # Within a minute (a loaded machine's start-up), where the host's own clock would be an hour out.
    assert all(abs(seconds) < 60 for seconds in off.values()), off
