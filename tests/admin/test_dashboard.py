"""The queue dashboard through Django's test client: its figures, its charts, who may see it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from tests.support.admin_pages import staff_user
from tests.testapp import jobs
from vellum_jobs.admin import charts
from vellum_jobs.core.models import Job, Queue, Worker
from vellum_jobs.store import rollup

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin:vellum_jobs_job_dashboard")


@pytest.fixture(autouse=True)
def empty_tally():
    rollup.TALLY.take()
    yield
    rollup.TALLY.take()


def queue_row(html: str, queue: str) -> dict[str, str]:
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', html, re.S)
    assert row, f"no row for queue {queue}"
    cells = dict(re.findall(r'<td class="vellum-(\w+)"[^>]*>(.*?)</td>', row[1], re.S))
    return {name: value.strip() for name, value in cells.items()}


def test_each_queue_s_backlog_running_failures_and_oldest_wait(admin_client):
    now = timezone.now()
    jobs.add.using(run_after=now - timedelta(minutes=3)).enqueue_many([(1, 1)] * 3)
    jobs.add.using(run_after=now + timedelta(hours=1)).enqueue(1, 1)
    jobs.add.using(queue="media").enqueue(1, 1)
    Job.objects.create(name="test.add", queue="media", state=Job.State.RUNNING, started_at=now)
    Queue.objects.create(name="media", paused_at=now, paused_by="ops")
    rollup.count(now - timedelta(minutes=20), "default", rollup.FAILED, 4)
    rollup.count(now - timedelta(hours=3), "default", rollup.FAILED, 9)  # not in the last hour
    rollup.flush("default", now)

    html = admin_client.get(DASHBOARD).content.decode()

    default = queue_row(html, "default")
    assert (default["due"], default["delayed"], default["running"], default["failed"]) == ("3", "1", "0", "4")
    assert default["oldest"].startswith("3 min"), default["oldest"]
    media = queue_row(html, "media")
    assert (media["due"], media["running"]) == ("1", "1")
    assert 'data-queue="media"' in html and "vellum-badge-paused" in html.split('data-queue="media"')[1]


def test_the_charts_draw_the_rollup_s_minutes_as_svg(admin_client):
    now = timezone.now()
    rollup.count(now - timedelta(minutes=5), "default", rollup.DONE, 40)
    rollup.count(now - timedelta(minutes=5), "default", rollup.FAILED, 10)
    rollup.count(now - timedelta(minutes=2), "default", rollup.RETRIED, 5)
    rollup.flush("default", now)
    jobs.add.using(run_after=now - timedelta(seconds=30)).enqueue(1, 1)
    rollup.record_oldest_due("default", now)
    html = admin_client.get(DASHBOARD).content.decode()
    hour = re.search(r'<figure id="vellum-chart-hour">(.*?)</figure>', html, re.S)[1]
    assert hour.startswith("<svg") and "no data yet" not in hour
    bars = re.findall(r'<rect class="vellum-bar" data-outcome="(\w+)"[^>]*height="([\d.]+)"', hour)
    heights = {outcome: float(h) for outcome, h in bars}
    assert set(heights) == {"done", "failed", "retried"}
    assert heights["done"] == pytest.approx(4 * heights["failed"], rel=0.01)  # one scale for the stack
    assert "60 in the last hour" not in html and "55 in the last hour" in html
    age = re.search(r'<figure id="vellum-age-hour">(.*?)</figure>', html, re.S)[1]
    assert "<polyline" in age and "30s" in age  # one sample: a point, the scale's top
    assert "<script" not in html.split('<div id="vellum-dashboard"')[1]  # drawn on the server


@override_settings(USE_TZ=False)  # with TIME_ZONE "UTC", as check E019 requires
def test_the_dashboard_answers_with_use_tz_false_and_its_charts_read_naive_times(admin_client):
    now = timezone.now()
    assert timezone.is_naive(now)
    jobs.add.using(run_after=now - timedelta(minutes=3)).enqueue(1, 1)
    rollup.count(now - timedelta(minutes=20), "default", rollup.FAILED, 4)
    rollup.flush("default", now)
    response = admin_client.get(DASHBOARD)
    assert response.status_code == 200
    html = response.content.decode()
    assert (queue_row(html, "default")["due"], queue_row(html, "default")["failed"]) == ("1", "4")
    hour = re.search(r'<figure id="vellum-chart-hour">(.*?)</figure>', html, re.S)[1]
    assert f"{rollup.minute_of(now - timedelta(minutes=20)):%H:%M}" in hour


def test_a_chart_with_no_minutes_says_so_and_a_line_breaks_where_no_sample_is():
    start = timezone.now()
    empty = [rollup.Bucket(start + timedelta(minutes=i), dict.fromkeys(rollup.OUTCOMES, 0)) for i in range(3)]
    assert "no data yet" in charts.bars(empty, "t", ("a", "b"))
    sampled = [
        rollup.Bucket(start, dict.fromkeys(rollup.OUTCOMES, 0), 10.0),
        rollup.Bucket(start, dict.fromkeys(rollup.OUTCOMES, 0), None),
        rollup.Bucket(start, dict.fromkeys(rollup.OUTCOMES, 0), 20.0),
        rollup.Bucket(start, dict.fromkeys(rollup.OUTCOMES, 0), 5.0),
    ]
    assert charts.line(sampled, "t", ("a", "b")).count("<polyline") == 2


def test_workers_alive_and_stale_with_their_busy_slots(admin_client):
    now = timezone.now()
    alive = Worker.objects.create(id="00000000-0000-0000-0000-000000000001", host="web1", pid=10, threads=4)
    Worker.objects.create(
        id="00000000-0000-0000-0000-000000000002",
        host="web2",
        pid=11,
        threads=2,
        last_heartbeat=now - timedelta(hours=1),
    )
    Job.objects.create(name="test.add", state=Job.State.RUNNING, worker_id=alive.pk, started_at=now)
    html = admin_client.get(DASHBOARD).content.decode()
    table = re.search(r'<table class="vellum-dashboard-table" id="vellum-workers">(.*?)</table>', html, re.S)[
        1
    ]
    assert "web1:10" in table and "web2:11" in table
    assert f"1 / {4 + alive.async_workers}" in table
    assert re.search(r'id="vellum-workers-alive">1<', html) and re.search(
        r'id="vellum-workers-stale">1<', html
    )


def test_the_body_alone_is_what_the_page_s_script_swaps_in(admin_client):
    jobs.add.enqueue(1, 1)
    body = admin_client.get(DASHBOARD, {"body": "1"}).content.decode()
    assert body.lstrip().startswith('<p class="vellum-dashboard-summary">')
    assert "<html" not in body and 'data-queue="default"' in body
    page = admin_client.get(DASHBOARD).content.decode()
    assert 'src="/static/vellum_jobs/dashboard.js"' in page
    assert '<noscript><meta http-equiv="refresh"' in page


def test_view_job_is_enough_and_anyone_else_is_sent_away(client):
    client.force_login(staff_user())
    assert client.get(DASHBOARD).status_code == 403
    client.force_login(staff_user("view_job"))
    assert client.get(DASHBOARD).status_code == 200
    assert client.get(DASHBOARD, {"body": "1"}).status_code == 200
    client.force_login(staff_user("change_job"))
    assert client.get(DASHBOARD).status_code == 200
    client.logout()
    response = client.get(DASHBOARD)
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_job_list_and_the_app_index_link_to_it(admin_client, client):
    assert DASHBOARD in admin_client.get(reverse("admin:vellum_jobs_job_changelist")).content.decode()
    assert DASHBOARD in admin_client.get(reverse("admin:app_list", args=["vellum_jobs"])).content.decode()
    client.force_login(staff_user("view_worker"))
    assert DASHBOARD not in client.get(reverse("admin:app_list", args=["vellum_jobs"])).content.decode()


def test_its_queries_do_not_grow_with_the_jobs(admin_client):
    from django.db import connection

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(DASHBOARD).status_code == 200
        return len(captured)

    jobs.add.enqueue(1, 1)
    few = queries()
    jobs.add.enqueue_many([(i, i) for i in range(200)])
    jobs.add.using(queue="media").enqueue_many([(i, i) for i in range(50)])
    assert queries() <= few + 2  # a queue's row: its due and delayed counts
