"""The queue dashboard through Django's test client: its figures, its charts, who may see it."""

from __future__ import annotations

import re
from datetime import timedelta

import django
import pytest
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from tests.support.admin_pages import staff_user
from tests.testapp import jobs
from vellum_jobs.admin import charts
from vellum_jobs.core.models import Job, Queue, Worker
from vellum_jobs.store import name_rollup, rollup

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin:vellum_jobs_job_dashboard")


@pytest.fixture(autouse=True)
def empty_tally():
    rollup.TALLY.take()
    name_rollup.TALLY.take()
    yield
    rollup.TALLY.take()
    name_rollup.TALLY.take()


def section(html: str, element_id: str, tag: str = "table") -> str:
    found = re.search(rf'<{tag}[^>]* id="{element_id}"[^>]*>(.*?)</{tag}>', html, re.S)
    assert found, f"no {tag} #{element_id}"
    return found[1]


def name_rows(html: str) -> list[tuple[str, dict[str, str]]]:
    """The job names' table: each row's name and cells by class."""
    rows = re.findall(r'<tr data-name="([^"]+)">(.*?)</tr>', section(html, "vellum-names"), re.S)
    cells = r'<td class="vellum-([\w-]+)"[^>]*>(.*?)</td>'
    return [
        (name, {k: re.sub(r"<[^>]+>", "", v).strip() for k, v in re.findall(cells, row, re.S)})
        for name, row in rows
    ]


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


def test_the_headline_names_the_oldest_due_job_and_leaves_paused_queues_out(admin_client):
    now = timezone.now()
    mail = Job.objects.create(name="mail.send", queue="mail", run_after=now - timedelta(minutes=7))
    Job.objects.create(name="media.resize", queue="media", run_after=now - timedelta(hours=3))
    Queue.objects.create(name="media", paused_at=now, paused_by="ops")
    html = admin_client.get(DASHBOARD).content.decode()
    headline = re.search(r'<p class="vellum-dashboard-summary">(.*?)</p>', html, re.S)[1]
    assert re.search(r'id="vellum-oldest-due">7 min \d+ s<', headline), headline
    job_link = reverse("admin:vellum_jobs_job_change", args=[mail.pk])
    assert f'<a href="{job_link}">job #{mail.pk} mail.send</a>' in headline
    assert "Paused queues left out: media." in headline
    assert queue_row(html, "media")["oldest"].startswith("3 h 0 min")  # still shown in its own row
    Queue.objects.filter(name="media").update(paused_at=None)
    html = admin_client.get(DASHBOARD).content.decode()
    assert re.search(r'id="vellum-oldest-due">3 h 0 min<', html)


def test_the_headline_counts_jobs_waiting_for_other_jobs_apart_from_queued_ones(admin_client):
    now = timezone.now()
    jobs.add.using(run_after=now - timedelta(minutes=1)).enqueue(1, 1)
    for _ in range(2):
        Job.objects.create(name="test.add", state=Job.State.WAITING)
    html = admin_client.get(DASHBOARD).content.decode()
    waiting = re.search(r'<a href="([^"]+)" id="vellum-waiting" data-count="(\d+)"[^>]*>([^<]*)</a>', html)
    assert waiting is not None
    assert (waiting[1], waiting[2], waiting[3]) == ("/admin/vellum_jobs/job/?state__exact=waiting", "2", "2")
    assert re.search(r'id="vellum-state-waiting" data-count="2"', html)
    assert re.search(r'id="vellum-state-queued" data-count="1"', html)
    assert queue_row(html, "default")["due"] == "1"  # the waiting ones are not due


def test_snoozes_are_a_series_of_their_own_not_retried(admin_client):
    now = timezone.now()
    rollup.count(now - timedelta(minutes=4), "default", rollup.SNOOZED, 6)
    rollup.count(now - timedelta(minutes=4), "default", rollup.RETRIED, 2)
    rollup.flush("default", now)
    html = admin_client.get(DASHBOARD).content.decode()
    hour = section(html, "vellum-chart-hour", "figure")
    titles = dict(re.findall(r'data-outcome="(\w+)"[^>]*><title>[\d:]+ \w+: (\d+)</title>', hour))
    assert titles == {"snoozed": "6", "retried": "2"}
    assert f'<span style="background:{charts.COLOURS["snoozed"]}"></span>snoozed' in html  # in the legend


def test_the_charts_label_gridlines_from_zero_past_the_top_and_the_clock_times():
    start = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(minutes=59)
    buckets = [
        rollup.Bucket(
            start + timedelta(minutes=i), {**dict.fromkeys(rollup.OUTCOMES, 0), "done": 37 if i == 30 else 3}
        )
        for i in range(60)
    ]
    chart = charts.bars(buckets, "t", ("a", "b"))
    ticks = re.findall(r'<text class="vellum-tick"[^>]*>([^<]+)</text>', chart)
    assert ticks == ["0", "10", "20", "30", "40"]  # more than 0 and the top, the top above the largest
    times = re.findall(r'<text class="vellum-time"[^>]*>([^<]+)</text>', chart)
    assert 4 <= len(times) <= 7 and all(t.endswith("0") for t in times), times
    ages = [rollup.Bucket(b.start, b.counts, 200.0) for b in buckets]
    line_ticks = re.findall(
        r'<text class="vellum-tick"[^>]*>([^<]+)</text>', charts.line(ages, "t", ("a", "b"))
    )
    assert line_ticks == ["0s", "1m", "2m", "3m", "4m"]
    assert charts.scale(0, charts.COUNT_STEPS) == [0.0, 1.0]
    assert charts.scale(7, charts.COUNT_STEPS) == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert charts.scale(1200, charts.COUNT_STEPS) == [0.0, 500.0, 1000.0, 1500.0]


def test_a_day_of_ten_minute_steps_that_start_off_the_hour_still_labels_round_clock_times():
    # The day chart's steps start at whatever minute it is: 14:03, 14:13, ...
    start = timezone.now().replace(minute=3, second=0, microsecond=0) - timedelta(hours=24)
    buckets = [
        rollup.Bucket(start + timedelta(minutes=10 * i), {**dict.fromkeys(rollup.OUTCOMES, 0), "done": 5})
        for i in range(145)
    ]
    times = re.findall(
        r'<text class="vellum-time"[^>]*>([^<]+)</text>', charts.bars(buckets, "t", ("a", "b"))
    )
    assert 4 <= len(times) <= 7 and all(t.endswith(":00") for t in times), times


def test_breadcrumbs_use_the_markup_of_the_admin_s_own_pages_which_its_styles_expect(admin_client):
    """Django 6 styles ``ol.breadcrumbs`` (a list), 5.2 ``div.breadcrumbs``."""
    job_list = admin_client.get(reverse("admin:vellum_jobs_job_changelist")).content.decode()
    (admin_s,) = re.findall(r'<(ol|div) class="breadcrumbs">', job_list)
    assert admin_s == ("ol" if django.VERSION >= (6, 0) else "div")
    html = admin_client.get(DASHBOARD).content.decode()
    assert re.findall(r'<(ol|div) class="breadcrumbs">', html) == [admin_s]
    if admin_s == "ol":
        assert '<li aria-current="page">Dashboard</li>' in html


def test_each_job_name_s_last_hour_with_its_failure_rate_and_percentiles(admin_client):
    now = timezone.now()
    rollup.count(now - timedelta(minutes=5), "mail", rollup.DONE, 8, name="mail.send", duration=0.3, wait=2.0)
    rollup.count(
        now - timedelta(minutes=5), "mail", rollup.RETRIED, 2, name="mail.send", duration=0.3, wait=2.0
    )
    rollup.count(
        now - timedelta(minutes=2), "mail", rollup.SNOOZED, 5, name="mail.send", duration=0.3, wait=2.0
    )
    rollup.count(
        now - timedelta(minutes=2), "default", rollup.DONE, 4, name="reports.build", duration=40, wait=0
    )
    rollup.count(
        now - timedelta(hours=2), "default", rollup.FAILED, 50, name="reports.build"
    )  # not this hour
    rollup.flush("default", now)
    html = admin_client.get(DASHBOARD).content.decode()
    rows = dict(name_rows(html))
    assert list(rows) == ["mail.send", "reports.build"]  # most failing first
    mail = rows["mail.send"]
    assert (mail["done"], mail["failures"], mail["snoozed"], mail["rate"]) == (
        "8",
        "2 (0 for good)",
        "5",
        "20%",
    )
    # Interpolated within the buckets, as Prometheus does: 0.3 s in (0.25 s, 0.5 s], 2 s in (1 s, 2.5 s].
    assert (mail["duration"], mail["wait"]) == ("375 ms · 488 ms", "1.8 s · 2.4 s")
    assert (rows["reports.build"]["rate"], rows["reports.build"]["duration"]) == ("0%", "45.0 s · 58.5 s")
    spark = re.search(r'<tr data-name="mail.send">.*?</tr>', html, re.S)[0]
    assert {"done", "retried", "snoozed"} == set(re.findall(r'<rect data-outcome="(\w+)"', spark))


def test_the_job_names_sort_by_most_failing_or_slowest_and_the_refresh_keeps_the_order(admin_client):
    now = timezone.now()
    rollup.count(now, "default", rollup.DONE, 10, name="a.fast", duration=0.01, wait=0)
    rollup.count(now, "default", rollup.FAILED, 1, name="a.fast", duration=0.01, wait=0)
    rollup.count(now, "default", rollup.DONE, 10, name="b.slow", duration=100, wait=0)
    rollup.count(now, "default", rollup.RETRIED, 5, name="c.flaky", duration=1, wait=0)
    rollup.flush("default", now)

    def order(**query: str) -> list[str]:
        return [name for name, _ in name_rows(admin_client.get(DASHBOARD, query).content.decode())]

    assert order() == ["c.flaky", "a.fast", "b.slow"]
    assert order(sort="slowest") == ["b.slow", "c.flaky", "a.fast"]
    assert order(sort="name") == ["a.fast", "b.slow", "c.flaky"]
    assert order(sort="slowest", body="1") == ["b.slow", "c.flaky", "a.fast"]
    page = admin_client.get(DASHBOARD, {"sort": "slowest"}).content.decode()
    assert 'data-url="?body=1&amp;sort=slowest"' in page
    assert '<strong aria-current="true">slowest</strong>' in page and 'href="?sort=failing"' in page


def test_workers_alive_and_stale_with_their_busy_slots(admin_client):
    now = timezone.now()
    alive = Worker.objects.create(
        id="00000000-0000-0000-0000-000000000001", host="web1", pid=10, threads=4, async_workers=100
    )
    Worker.objects.create(
        id="00000000-0000-0000-0000-000000000002",
        host="web2",
        pid=11,
        threads=2,
        last_heartbeat=now - timedelta(hours=1),
    )
    Job.objects.create(name="test.add", state=Job.State.RUNNING, worker_id=alive.pk, started_at=now)
    Job.objects.create(
        name="test.add", state=Job.State.RUNNING, worker_id=alive.pk, started_at=now, is_async=True
    )
    html = admin_client.get(DASHBOARD).content.decode()
    table = re.search(r'<table class="vellum-dashboard-table" id="vellum-workers">(.*?)</table>', html, re.S)[
        1
    ]
    assert "web1:10" in table and "web2:11" in table
    assert re.search(r'<td class="vellum-threads">1 / 4</td>', table)
    assert re.search(r'<td class="vellum-async">1 / 100</td>', table)  # apart from the threads
    assert re.search(
        r'<td class="vellum-threads">0 / 2</td>\s*<td class="vellum-async"><span[^>]*>none</span>', table
    )
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
