"""The queue's figures that ``jobstats`` and the health view share."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from tests.testapp import jobs
from vellum_jobs import queues
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.observe import figures

pytestmark = pytest.mark.django_db

ZEROS = {"waiting": 0, "queued": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0}


def worker(last_heartbeat) -> Worker:
    return Worker.objects.create(
        id=uuid.uuid4(), host="web-1", pid=1, threads=4, last_heartbeat=last_heartbeat
    )


def test_an_empty_queue_has_every_figure_zero_or_none():
    assert figures.collect() == {
        "states": ZEROS,
        "names": {},
        "oldest_queued_age": None,
        "workers": {"alive": 0, "stale": 0, "clocks_off": []},
    }


def test_counts_by_name_have_every_state_and_sorted_names_in_one_query(django_assert_num_queries):
    jobs.add.enqueue_many([(1, 2)] * 3)
    Job.objects.create(name="test.add", state=Job.State.FAILED)
    Job.objects.create(name="a.first", state=Job.State.DONE)
    Job.objects.create(name="test.record", state=Job.State.RUNNING)
    with django_assert_num_queries(1):
        names = figures.counts_by_name()
    assert names == {
        "a.first": {**ZEROS, "done": 1},
        "test.add": {**ZEROS, "queued": 3, "failed": 1},
        "test.record": {**ZEROS, "running": 1},
    }
    assert list(names) == sorted(names)


def test_the_oldest_queued_age_counts_only_due_queued_jobs():
    now = timezone.now()
    Job.objects.create(name="test.add", run_after=now - timedelta(seconds=30))
    Job.objects.create(name="test.add", run_after=now - timedelta(seconds=10))
    Job.objects.create(name="test.add", run_after=now + timedelta(hours=1))  # delayed: not waiting yet
    Job.objects.create(name="test.add", state=Job.State.RUNNING, run_after=now - timedelta(hours=1))
    Job.objects.create(name="test.add", state=Job.State.FAILED, run_after=now - timedelta(hours=2))
    assert figures.oldest_queued_age(None, now) == 30.0


def test_no_due_job_means_no_oldest_queued_age():
    now = timezone.now()
    Job.objects.create(name="test.add", run_after=now + timedelta(seconds=1))
    assert figures.oldest_queued_age(None, now) is None


@override_settings(VELLUM_JOBS={"LEASE": 60, "HEARTBEAT": 10})
def test_workers_are_alive_within_a_lease_of_their_heartbeat_as_worker_is_alive_says():
    now = timezone.now()
    for age in (0, 59, 61, 3600):
        worker(now - timedelta(seconds=age))
    assert figures.workers(None, now) == {"alive": 2, "stale": 2, "clocks_off": []}
    assert sum(w.is_alive for w in Worker.objects.all()) == 2


def test_collecting_every_figure_takes_four_queries(django_assert_num_queries):
    jobs.add.enqueue_many([(1, 2)] * 3)
    worker(timezone.now())
    with django_assert_num_queries(4):
        collected = figures.collect()
    assert collected["states"] == {**ZEROS, "queued": 3}
    assert collected["names"] == {"test.add": {**ZEROS, "queued": 3}}
    assert collected["oldest_queued_age"] is not None and collected["oldest_queued_age"] >= 0
    assert collected["workers"] == {"alive": 1, "stale": 0, "clocks_off": []}


def test_a_paused_queue_s_due_jobs_are_left_out_of_the_oldest_queued_age():
    now = timezone.now()
    Job.objects.create(name="mail.send", queue="mail", run_after=now - timedelta(hours=1))
    Job.objects.create(name="test.add", run_after=now - timedelta(seconds=30))
    queues.pause("mail")
    assert figures.oldest_queued_age(None, now) == 30.0
    queues.pause("default")
    assert figures.oldest_queued_age(None, now) is None


def test_the_oldest_due_job_is_named_with_its_queue_paused_queues_left_out():
    now = timezone.now()
    Job.objects.create(name="test.add", run_after=now - timedelta(seconds=30))
    mail = Job.objects.create(name="mail.send", queue="mail", run_after=now - timedelta(seconds=90))
    Job.objects.create(name="mail.send", queue="mail", run_after=now - timedelta(seconds=60))
    Job.objects.create(name="media.resize", queue="media", run_after=now - timedelta(hours=1))
    queues.pause("media")
    oldest = figures.oldest_due_job(None, now)
    assert oldest == figures.OldestDue("mail", mail.pk, "mail.send", 90.0)
    assert str(oldest) == f"queue mail: job #{mail.pk} mail.send has waited 1m 30s"
    queues.pause("mail")
    queues.pause("default")
    assert figures.oldest_due_job(None, now) is None


def test_waiting_jobs_are_counted_as_their_own_state_not_as_queued():
    jobs.add.enqueue(1, 2)
    Job.objects.create(name="test.add", state=Job.State.WAITING)
    Job.objects.create(name="merge", state=Job.State.WAITING)
    collected = figures.collect()
    assert collected["states"] == {**ZEROS, "waiting": 2, "queued": 1}
    assert collected["names"] == {
        "merge": {**ZEROS, "waiting": 1},
        "test.add": {**ZEROS, "waiting": 1, "queued": 1},
    }
    assert [(c.state, c.count) for c in figures.by_state(Job.objects.all())][:2] == [
        ("waiting", 2),
        ("queued", 1),
    ]
