"""The queue and schedule lists: a new queue name confirmed before it is made; schedules run now,
disabled and enabled, with their last run's outcome."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.admin_pages import make, messages_of, staff_user
from vellum_jobs import queues
from vellum_jobs.core.models import Job, Queue, Schedule
from vellum_jobs.maintenance import schedules

pytestmark = pytest.mark.django_db

ADD_QUEUE = reverse("admin:vellum_jobs_queue_add")
SCHEDULES = reverse("admin:vellum_jobs_schedule_changelist")
NIGHTLY = {"job": "test.add", "cron": "0 3 * * *", "args": [1, 2], "timezone": "UTC"}
REPORTS = {"job": "test.record", "cron": "30 6 * * 1-5", "timezone": "Europe/Paris", "missed": "skip"}


@pytest.fixture
def declared(settings):
    settings.VELLUM_JOBS = {**settings.VELLUM_JOBS, "SCHEDULES": {"nightly": NIGHTLY, "reports": REPORTS}}


def schedule_rows(html: str) -> dict[str, str]:
    """The schedule list's rows by schedule name."""
    found = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", html, re.S):
        match = re.search(r'<td class="field-name">([^<]+)</td>', row)
        if match:
            found[match[1]] = row
    return found


def act(client, action: str, *names: str):
    return client.post(
        SCHEDULES, {"action": action, "_selected_action": list(names), "index": 0}, follow=True
    )


# -- queues ------------------------------------------------------------------------


def test_pausing_a_queue_nobody_named_asks_for_confirmation_and_writes_nothing_until_given(admin_client):
    response = admin_client.post(ADD_QUEUE, {"name": "emials"})
    assert response.status_code == 200  # the form again, with the question
    assert "No job, worker or pause has ever named queue &#x27;emials&#x27;" in response.content.decode()
    assert not Queue.objects.filter(name="emials").exists()
    assert not queues.ever_used("emials")

    admin_client.post(ADD_QUEUE, {"name": "emials", "create": "on"}, follow=True)
    queue = Queue.objects.get(name="emials")
    assert queue.is_paused and queue.paused_by == "admin: admin"


def test_pausing_a_queue_that_jobs_name_needs_no_confirmation(admin_client):
    make(queue="media")
    response = admin_client.post(ADD_QUEUE, {"name": "media"}, follow=True)
    assert response.redirect_chain  # saved, back to the list
    assert queues.is_paused("media")


def test_the_add_form_offers_the_create_box(admin_client):
    html = admin_client.get(ADD_QUEUE).content.decode()
    assert 'name="create"' in html and "most likely a typo" in html


# -- schedules ---------------------------------------------------------------------


def test_run_now_enqueues_one_run_that_becomes_the_last_run_and_leaves_the_instants_alone(
    admin_client, declared
):
    now = timezone.now()
    schedules.tick("default", now - timedelta(days=2))
    [ticked] = [j for j in schedules.tick("default", now) if j.schedule == "nightly"]
    instant = Schedule.objects.get(name="nightly").last_instant
    response = act(admin_client, "run_now", "nightly")
    [job] = Job.objects.filter(schedule="nightly").exclude(pk=ticked.pk)
    assert messages_of(response) == [
        f"Enqueued 1 run now: nightly (#{job.pk}). Their scheduled instants are unchanged."
    ]
    assert (job.name, job.args, job.state, job.scheduled_for) == ("test.add", [1, 2], Job.State.QUEUED, None)
    state = Schedule.objects.get(name="nightly")
    assert (state.last_job_id, state.last_instant) == (job.pk, instant)
    row = schedule_rows(admin_client.get(SCHEDULES).content.decode())["nightly"]
    assert f">#{job.pk}</a>" in row and "vellum-badge-queued" in row


def test_disable_and_enable_from_the_list(admin_client, declared):
    act(admin_client, "run_now", "nightly")  # the rows exist once the list was shown
    response = act(admin_client, "disable", "nightly")
    assert messages_of(response) == ["Disabled 1: nightly. No worker enqueues their instants until enabled."]
    state = Schedule.objects.get(name="nightly")
    assert state.disabled_at is not None and state.disabled_by == "admin: admin"
    rows = schedule_rows(response.content.decode())
    assert "vellum-badge-paused" in rows["nightly"] and "by admin: admin" in rows["nightly"]
    assert '<td class="field-next_run">disabled</td>' in rows["nightly"]
    assert "vellum-badge-alive" in rows["reports"]  # enabled

    assert messages_of(act(admin_client, "disable", "nightly"))[0].startswith("Disabled 0: -.")
    response = act(admin_client, "enable", "nightly")
    assert messages_of(response)[0].startswith("Enabled 1: nightly. Each runs from its next instant")
    assert Schedule.objects.get(name="nightly").disabled_at is None


def test_the_list_shows_the_last_runs_outcome_linked_with_a_failures_last_error_line(admin_client, declared):
    assert admin_client.get(SCHEDULES).status_code == 200  # creates the rows
    failed = make(Job.State.FAILED, error="Traceback (most recent call last):\n  ...\nValueError: no paper\n")
    done = make(Job.State.DONE)
    Schedule.objects.filter(name="nightly").update(last_run_at=timezone.now(), last_job_id=failed.pk)
    Schedule.objects.filter(name="reports").update(last_run_at=timezone.now(), last_job_id=done.pk)
    rows = schedule_rows(admin_client.get(SCHEDULES).content.decode())
    failed_page = reverse("admin:vellum_jobs_job_change", args=[failed.pk])
    assert (
        f'<a href="{failed_page}"><span class="vellum-badge vellum-badge-failed">failed</span></a>'
        in rows["nightly"]
    )
    assert '<span class="vellum-error">ValueError: no paper</span>' in rows["nightly"]
    assert "vellum-badge-done" in rows["reports"] and "vellum-error" not in rows["reports"]
    done.delete()  # pruned
    assert "deleted (pruned)" in schedule_rows(admin_client.get(SCHEDULES).content.decode())["reports"]


def test_running_disabling_and_enabling_need_the_change_schedule_permission(client, declared):
    client.force_login(staff_user("view_schedule"))
    html = client.get(SCHEDULES).content.decode()
    assert 'value="run_now"' not in html and 'value="disable"' not in html
    act(client, "disable", "nightly")
    assert Schedule.objects.get(name="nightly").disabled_at is None
    client.force_login(staff_user("view_schedule", "change_schedule"))
    assert 'value="run_now"' in client.get(SCHEDULES).content.decode()
