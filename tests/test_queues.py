"""Pausing and resuming queues: the API, ``manage.py jobs``, and real ``runjobs`` processes."""

from __future__ import annotations

import os
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from tests.support.processes import Runjobs, wait_for
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs import queues
from vellum_jobs.core.models import Job, Queue, QueueMinute, Worker


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


@pytest.mark.django_db
def test_pause_and_resume_report_whether_they_changed_anything():
    assert queues.paused() == []
    assert queues.pause("media", by="ops") is True
    assert queues.pause("media") is False
    assert queues.is_paused("media") and not queues.is_paused("mail")
    assert Queue.objects.get(name="media").paused_by == "ops"
    assert queues.paused() == ["media"]
    assert queues.resume("media") is True
    assert queues.resume("media") is False
    assert queues.resume("never-seen") is False
    assert queues.paused() == []
    with pytest.raises(ValueError, match="non-empty string"):
        queues.pause("")


@pytest.mark.django_db
def test_a_queue_is_known_once_a_job_a_pause_a_worker_a_figure_or_a_registered_job_names_it():
    assert queues.ever_used("default")  # the queue of registered jobs that name none
    for name in ("by-job", "by-pause", "by-worker", "by-figure"):
        assert not queues.ever_used(name)
    jobs.record.using(queue="by-job").enqueue("x")
    queues.pause("by-pause")
    Worker.objects.create(id=uuid.uuid4(), host="h", pid=1, threads=1, queues=["other", "by-worker"])
    QueueMinute.objects.create(minute=timezone.now(), queue="by-figure")
    for name in ("by-job", "by-pause", "by-worker", "by-figure"):
        assert queues.ever_used(name), name
    assert not queues.ever_used("by-jbo")


@pytest.mark.django_db
def test_the_jobs_command_pauses_lists_and_resumes_queues():
    def run(*args: str) -> str:
        out = StringIO()
        call_command("jobs", *args, stdout=out)
        return out.getvalue()

    assert run("pause", "--create", "media", "mail") == "Paused queue 'media'.\nPaused queue 'mail'.\n"
    assert run("pause", "media") == "Queue 'media' was already paused.\n"
    listing = run("queues")
    assert "mail  paused since " in listing and "media  paused since " in listing
    assert "by manage.py jobs pause" in listing
    assert run("resume", "media", "mail") == "Resumed queue 'media'.\nResumed queue 'mail'.\n"
    assert run("resume", "media") == "Queue 'media' was not paused.\n"
    assert run("queues") == "No queue is paused.\n"


@pytest.mark.django_db
def test_the_jobs_command_refuses_to_pause_a_queue_nobody_used_unless_told_to_create_it():
    jobs.record.using(queue="media").enqueue("x")
    with pytest.raises(CommandError) as refused:
        call_command("jobs", "pause", "media", "meida", stdout=StringIO())
    message = str(refused.value)
    assert "'meida'" in message and "'media'" not in message
    assert "Nothing was paused" in message and "manage.py jobs pause --create meida" in message
    # Refused as a whole: not even the known queue was paused.
    assert not Queue.objects.exists()
    out = StringIO()
    call_command("jobs", "pause", "media", stdout=out)
    assert out.getvalue() == "Paused queue 'media'.\n"
    call_command("jobs", "pause", "--create", "meida", stdout=StringIO())
    assert queues.paused() == ["media", "meida"]


@pytest.mark.django_db
def test_the_jobs_command_cancels_and_explains_jobs():
    queued, running = jobs.add.enqueue(1, 1), jobs.add.enqueue(2, 2)
    Job.objects.filter(pk=running.pk).update(state=Job.State.RUNNING)
    out = StringIO()
    call_command("jobs", "cancel", str(queued.pk), str(running.pk), stdout=out)
    assert out.getvalue().splitlines() == [
        f"Cancelled job #{queued.pk}.",
        f"Asked running job #{running.pk} to stop (its handler sees should_stop()).",
    ]
    later = jobs.add.using(delay=600).enqueue(3, 3)
    out = StringIO()
    call_command("jobs", "explain", str(later.pk), stdout=out)
    assert out.getvalue().startswith(f"#{later.pk} test.add (queued):\n  - due in ")


# With the poll far away, only a wakeup makes a resumed queue start at once.
POLL = {"sqlite": "10s", "postgresql": "10s", "mysql": "0.5s"}


@pytest.mark.runjobs
@pytest.mark.django_db(transaction=True)
def test_a_paused_queue_is_not_claimed_its_running_jobs_finish_and_resuming_wakes_workers(tmp_path):
    release = tmp_path / "release"
    running = jobs.sleep.using(queue="media").enqueue(60, "finished", str(release))
    worker = Runjobs("--workers", "3", env={"VELLUM_TEST_POLL": POLL[connection.vendor]})
    try:
        wait_for(lambda: Execution.objects.filter(job_id=running.pk).exists(), what="the media job to start")
        queues.pause("media")
        held = jobs.record.using(queue="media").enqueue("held")
        other = jobs.record.using(queue="mail").enqueue("other")
        # The enqueues woke the worker: it claims the mail job, never the media one.
        wait_for(lambda: state(other) == Job.State.DONE, what="the mail job")
        assert state(held) == Job.State.QUEUED
        release.touch()
        wait_for(lambda: state(running) == Job.State.DONE, what="the running media job to finish")
        assert Job.objects.get(pk=running.pk).result == "finished"
        # A claim after the running job finished still leaves the paused queue alone.
        after = jobs.record.using(queue="mail").enqueue("after")
        wait_for(lambda: state(after) == Job.State.DONE, what="another mail job")
        assert state(held) == Job.State.QUEUED
        assert not Execution.objects.filter(job_id=held.pk).exists()
        queues.resume("media")
        wait_for(lambda: state(held) == Job.State.DONE, what="the resumed queue's job")
    finally:
        worker.signal(15)
        assert worker.wait(30) == 0, worker.output()
    assert os.path.exists(release)
