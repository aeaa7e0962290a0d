"""Claiming ahead: prefetched jobs start in claim order, never wait long, and go back unspent.

A worker claims more jobs than it has free threads only while its handlers
are short; those jobs wait in its buffer, held under lease like running
ones. One that waits too long, or is still waiting at shutdown, goes back
to the queue as if it had never been claimed: its attempt is not counted.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from tests.support.processes import wait_for
from tests.support.workers import Background
from tests.testapp import jobs
from tests.testapp.models import Execution
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.worker import dispatcher
from vellum_jobs.worker.slots import Slots

pytestmark = pytest.mark.django_db(transaction=True)


def prefetched(sleepers: list[Job]) -> list[Job]:
    """Of ``sleepers``, those claimed (running) that no thread started yet."""
    started = set(Execution.objects.values_list("job_id", flat=True))
    return [
        job
        for job in Job.objects.filter(pk__in=[j.pk for j in sleepers], state="running")
        if job.pk not in started
    ]


def stop(tmp_path, background: Background) -> None:
    """Let the sleeper its thread runs finish, then stop: the test is over, its 30 s need not pass."""
    (tmp_path / "release").touch()
    background.stop()


def claim_ahead(tmp_path, **options) -> tuple[Background, list[Job]]:
    """A one-thread worker that learnt its jobs are short, then claimed sleepers ahead of its thread."""
    release = tmp_path / "release"
    quick = jobs.add.using(priority=10).enqueue(1, 1)
    sleepers = [jobs.sleep.enqueue(30, release_file=str(release)) for _ in range(6)]
    background = Background(threads=1, prefetch=4, **options)
    wait_for(lambda: Job.objects.get(pk=quick.pk).state == "done", what="the quick job")
    wait_for(lambda: Execution.objects.filter(job_id__in=[j.pk for j in sleepers]).exists(), what="a sleeper")
    return background, sleepers


def claims_four_ahead(monkeypatch) -> None:
    """However long a loaded machine makes the quick job seem, the worker claims its four ahead
    (the window times the handlers' pace, 50 ms, which a thread descheduled mid-job can use up),
    and they wait for its thread as long as the test needs."""
    monkeypatch.setattr(dispatcher, "PREFETCH_WINDOW", 60.0)
    monkeypatch.setattr(dispatcher, "PREFETCH_MAX_WAIT", 60.0)


def test_shutdown_puts_prefetched_jobs_back_at_once_without_spending_an_attempt(tmp_path, monkeypatch):
    claims_four_ahead(monkeypatch)
    background, sleepers = claim_ahead(tmp_path, grace=0.5)
    waiting = prefetched(sleepers)
    assert len(waiting) == 4, "the worker claimed four jobs beyond its one thread"
    started = time.monotonic()
    background.stop()
    assert time.monotonic() - started < 5
    for job in Job.objects.filter(pk__in=[j.pk for j in waiting]):
        assert (job.state, job.attempts, job.worker_id, job.lease_expires_at) == ("queued", 0, None, None)
        assert job.claims == 1 and not job.error
    assert not Execution.objects.filter(job_id__in=[j.pk for j in waiting]).exists()


def test_explain_and_the_admin_say_which_jobs_a_worker_claimed_ahead(tmp_path, monkeypatch, admin_client):
    claims_four_ahead(monkeypatch)
    background, sleepers = claim_ahead(tmp_path)
    waiting = prefetched(sleepers)
    row = Worker.objects.filter(pk=background.worker.id)
    wait_for(lambda: sorted(row.get().prefetched or []) == sorted(j.pk for j in waiting), what="a heartbeat")
    (reason,) = Job.objects.get(pk=waiting[0].pk).explain()
    assert reason.code == "prefetched"
    assert f"claimed ahead by worker {row.get()}" in reason.text
    running = next(j for j in sleepers if Execution.objects.filter(job_id=j.pk).exists())
    assert Job.objects.get(pk=running.pk).explain()[0].code == "running"
    page = admin_client.get(f"/admin/vellum_jobs/worker/{background.worker.id}/change/").content.decode()
    assert re.search(r'field-prefetched_count\b.*?<div class="readonly">4</div>', page, re.S)
    stop(tmp_path, background)


def test_a_prefetched_job_that_waits_too_long_goes_back_and_is_not_claimed_again_meanwhile(tmp_path):
    background, sleepers = claim_ahead(tmp_path)
    waiting = prefetched(sleepers)
    assert waiting, "the worker claimed ahead"
    ids = [job.pk for job in waiting]
    back = Job.objects.filter(pk__in=ids, state="queued", attempts=0, worker_id=None)
    wait_for(lambda: back.count() == len(ids), what="prefetched jobs back in the queue")
    # Its thread is still busy: the worker has learnt the jobs are long now, and
    # leaves them to other workers (two dispatcher cycles at the poll interval).
    time.sleep(2.5)
    assert back.count() == len(ids)
    assert set(Job.objects.filter(pk__in=ids).values_list("claims", flat=True)) == {1}
    stop(tmp_path, background)


def test_a_worker_whose_jobs_are_long_claims_nothing_ahead(tmp_path):
    release = tmp_path / "release"
    sleepers = [jobs.sleep.enqueue(30, release_file=str(release)) for _ in range(4)]
    background = Background(threads=2, prefetch=8)
    wait_for(lambda: Execution.objects.count() == 2, what="two sleepers started")
    time.sleep(1.5)  # a few dispatcher cycles
    assert Job.objects.filter(pk__in=[j.pk for j in sleepers], state="running").count() == 2
    release.touch()
    wait_for(lambda: Job.objects.filter(state="done").count() == 4, what="all done")
    background.stop()


def test_waiting_attempts_start_in_claim_order_a_later_claim_s_urgent_job_first():
    now = timezone.now()

    def job(pk: int, priority: int) -> Job:
        return Job(pk=pk, name="test.add", priority=priority, run_after=now - timedelta(seconds=pk), claims=1)

    slots = Slots(1, uuid.uuid4(), threading.Event(), on_finish=lambda: None)
    slots.submit([job(1, 0), job(2, 0)])
    slots.submit([job(3, 100)])
    order = [slots._next()[0].job.pk for _ in range(3)]
    # Same priority: the earlier run_after first (job 2 became due before job 1).
    assert order == [3, 2, 1]


def test_runjobs_refuses_a_negative_prefetch():
    with pytest.raises(CommandError, match="--prefetch must not be negative, got -1"):
        call_command("runjobs", "--prefetch", "-1")
