"""The health view: who may see it, when it answers 503, and where it is served."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import OperationalError
from django.test import override_settings
from django.urls import include, path, reverse
from django.utils import timezone

from tests.support.admin_pages import staff_user
from vellum_jobs import queues
from vellum_jobs.core.models import Job, Worker
from vellum_jobs.observe import figures

pytestmark = pytest.mark.django_db

URL = "/jobs/health/"
LENIENT = {"MAX_QUEUED_AGE": None, "REQUIRE_WORKER": False}


def settings(**health):
    return override_settings(VELLUM_JOBS={"LEASE": 60, "HEARTBEAT": 10, "HEALTH": health})


def live_worker() -> Worker:
    return Worker.objects.create(id=uuid.uuid4(), host="a", pid=1, threads=4, last_heartbeat=timezone.now())


def waiting_job(seconds: float) -> Job:
    return Job.objects.create(name="test.add", run_after=timezone.now() - timedelta(seconds=seconds))


def test_anonymous_callers_are_refused_unless_public(client):
    live_worker()
    with settings(**LENIENT):
        response = client.get(URL)
    assert response.status_code == 403
    assert "PUBLIC" in response.json()["detail"]
    assert "states" not in response.json()


def test_a_logged_in_user_who_is_not_staff_is_refused(client):
    visitor = User.objects.create_user("visitor")
    visitor.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(visitor)
    with settings(**LENIENT):
        assert client.get(URL).status_code == 403


def test_staff_without_the_view_job_permission_are_refused(client):
    live_worker()
    client.force_login(staff_user("view_worker", "view_queue"))
    with settings(**LENIENT):
        response = client.get(URL)
    assert response.status_code == 403
    assert "vellum_jobs.view_job" in response.json()["detail"]
    assert "states" not in response.json()


@pytest.mark.parametrize("codename", ["view_job", "change_job"])
def test_staff_who_may_see_the_job_list_in_the_admin_may_see_it(client, codename):
    live_worker()
    client.force_login(staff_user(codename))
    with settings(**LENIENT):
        assert client.get(URL).status_code == 200


def test_a_superuser_may_see_it(client):
    live_worker()
    client.force_login(User.objects.create_superuser("root"))
    with settings(**LENIENT):
        assert client.get(URL).status_code == 200


def test_an_inactive_staff_user_is_refused(client):
    user = staff_user("view_job")
    client.force_login(user)
    User.objects.filter(pk=user.pk).update(is_active=False)
    with settings(**LENIENT):
        assert client.get(URL).status_code == 403


def test_staff_get_the_figures_of_jobstats_and_healthy_true(staff):
    live_worker()
    waiting_job(5)
    with settings():
        response = staff.get(URL)
        collected = figures.collect()
    assert response.status_code == 200
    body = response.json()
    keys = ["healthy", "problems", "warnings", "states", "names", "oldest_queued_age", "workers"]
    assert list(body) == keys
    assert (body["healthy"], body["problems"]) == (True, [])
    assert body["states"] == collected["states"] and body["names"] == collected["names"]
    assert body["workers"] == {"alive": 1, "stale": 0, "clocks_off": []}
    assert 5 <= body["oldest_queued_age"] < 30


def test_public_lets_anyone_see_it(client):
    live_worker()
    with settings(PUBLIC=True):
        response = client.get(URL)
    assert response.status_code == 200
    assert response.json()["healthy"] is True


def test_no_live_worker_is_503_while_require_worker_is_on(staff):
    Worker.objects.create(
        id=uuid.uuid4(), host="a", pid=1, threads=4, last_heartbeat=timezone.now() - timedelta(minutes=5)
    )
    with settings():
        response = staff.get(URL)
    assert response.status_code == 503
    assert response.json()["healthy"] is False
    assert response.json()["problems"] == ["no live worker (1 stale); REQUIRE_WORKER is on"]
    with settings(REQUIRE_WORKER=False):
        assert staff.get(URL).status_code == 200


def test_a_due_job_waiting_longer_than_max_queued_age_is_503_and_named_with_its_queue(staff):
    live_worker()
    waiting_job(200)
    oldest = Job.objects.create(
        name="mail.send", queue="mail", run_after=timezone.now() - timedelta(seconds=400)
    )
    with settings():  # the default MAX_QUEUED_AGE, 5m
        response = staff.get(URL)
    assert response.status_code == 503
    (problem,) = response.json()["problems"]
    assert problem.startswith(f"queue mail: job #{oldest.pk} mail.send has waited 6m 4"), problem
    assert problem.endswith("(limit 5m, MAX_QUEUED_AGE)"), problem
    with settings(MAX_QUEUED_AGE="10m"):
        assert staff.get(URL).status_code == 200
    with settings(MAX_QUEUED_AGE=None):
        assert staff.get(URL).status_code == 200


def test_a_paused_queue_s_jobs_wait_on_purpose_and_are_no_problem(staff):
    live_worker()
    Job.objects.create(name="mail.send", queue="mail", run_after=timezone.now() - timedelta(hours=2))
    waiting_job(30)
    queues.pause("mail")
    with settings(MAX_QUEUED_AGE="1m"):
        response = staff.get(URL)
    assert response.status_code == 200, response.json()["problems"]
    assert 30 <= response.json()["oldest_queued_age"] < 60
    queues.resume("mail")
    with settings(MAX_QUEUED_AGE="1m"):
        response = staff.get(URL)
    assert response.status_code == 503
    assert response.json()["problems"][0].startswith("queue mail: job #")


def test_a_delayed_job_is_not_waiting(staff):
    live_worker()
    Job.objects.create(name="test.add", run_after=timezone.now() + timedelta(hours=1))
    with settings(MAX_QUEUED_AGE="1s"):
        assert staff.get(URL).status_code == 200


def test_both_problems_are_reported_together(staff):
    waiting_job(120)
    with settings(MAX_QUEUED_AGE="1m"):
        response = staff.get(URL)
    assert response.status_code == 503
    assert len(response.json()["problems"]) == 2


def test_a_database_error_is_503_without_the_error_s_details(staff, monkeypatch):
    def unreachable(*args, **kwargs):
        raise OperationalError('could not connect to server "db.internal" as user "secret"')

    monkeypatch.setattr(figures, "collect", unreachable)
    with settings(PUBLIC=True):
        response = staff.get(URL)
    assert response.status_code == 503
    assert response.json() == {
        "healthy": False,
        "problems": ["the jobs database did not answer (OperationalError)"],
    }
    assert "secret" not in response.content.decode()


def test_only_get_and_head_are_allowed_and_nothing_is_cached(staff):
    live_worker()
    with settings():
        assert staff.post(URL).status_code == 405
        assert staff.head(URL).status_code == 200
        response = staff.get(URL)
    assert "no-cache" in response["Cache-Control"] and "max-age=0" in response["Cache-Control"]


urlpatterns = [path("ops/queue/", include("vellum_jobs.urls"))]


@override_settings(ROOT_URLCONF=__name__)
def test_the_urls_can_be_included_under_any_prefix(client):
    assert reverse("vellum_jobs:health") == "/ops/queue/health/"
    live_worker()
    with settings(PUBLIC=True):
        assert client.get("/ops/queue/health/").status_code == 200
